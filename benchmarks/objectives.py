r"""The three sentence objectives' rows on the embedded corpus: balance, padding, packing.

  python benchmarks/objectives.py [--dupe_factor 1]

Writes the embedded docstring corpus (no download) and runs create_pretraining_data with
--next_sentence=nsp|sop|none at 128 and 512 tokens, plain and --pack (K = 3), bert-base-uncased
vocab, one worker; prints the stats JSON figures as a markdown table for RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import harness
from input_pipeline.pretrain import corpus
from input_pipeline.pretrain import create_pretraining_data as cpd
from input_pipeline.pretrain.instances import MaskingConfig

VOCAB = os.path.join(harness.ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')


def balance(stats: dict) -> str:
  """The objective's own figure from the stats JSON."""
  if stats['sentence_objective'] == 'nsp':
    return f"random next {stats['nsp_random_next_fraction']:.4f}"
  if stats['sentence_objective'] == 'sop':
    return f"swapped {stats['sop_swapped_fraction']:.4f}"
  return (f"{stats['documents_per_row']:.3f} documents/row, "
          f"{stats['rows_crossing_documents']:.3f} of rows cross")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--dupe_factor', type=int, default=1)
  args = parser.parse_args()
  tmp = tempfile.mkdtemp()
  text = os.path.join(tmp, 'corpus.txt')
  corpus.write_text_file(corpus.embedded_documents(), text)
  print(harness.machine())
  print('| objective | seq | pack | instances | rows | padding | truncated | balance | seconds |')
  print('| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |')
  for seq, preds in ((128, 20), (512, 80)):
    for objective in ('nsp', 'sop', 'none'):
      for pack in (False, True):
        job = cpd.Job(output_file=os.path.join(tmp, f'{objective}_{seq}_{pack}'),
                      masking=MaskingConfig(seq, preds), vocab_file=VOCAB, input_file=text,
                      dupe_factor=args.dupe_factor, sentence_objective=objective, pack=pack)
        s = cpd.run(job)
        print(f"| {objective} | {seq} | {'K=3' if pack else 'no'} | {s['instances']:,} | "
              f"{s['rows']:,} | {s['padding_fraction']:.4f} | {s['truncation_rate']:.4f} | "
              f"{balance(s)} | {s['seconds']} |", flush=True)


if __name__ == '__main__':
  main()
