r"""Tokenizer throughput (tokens/s, one core) on the real corpus, against the reference's.

  python benchmarks/real_corpus.py && python benchmarks/data_creation.py   # corpus, reference
  python benchmarks/tokenizer.py [--lines 50000]
  python benchmarks/tokenizer.py --corpus=CORPUS.txt --lines=500   # smoke (any text file)

Compares, on the same lines and pinned to one core: google-research/bert's `FullTokenizer`
(pure Python, the one its create_pretraining_data.py uses), transformers' `BertTokenizerFast`,
our `WordPieceTokenizer` (the same Rust WordPiece, ids identical; batch calls), and our
`SentencePieceTokenizer` (unigram, 30k pieces, trained here on the corpus).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import harness

VOCAB = os.path.join(harness.ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')


def rate(name, fn, lines, repeats=3):
  """Tokens/s of `fn(lines)` (which returns the token count), the best of `repeats` calls."""
  timing = harness.timed(lambda _: fn(lines), steps=repeats, warmup=0, sync=lambda n: n)
  best, tokens = timing.lo, timing.results[-1]
  print(f'| {name} | {tokens:,} | {best:.2f} | {tokens / best:,.0f} |', flush=True)
  return tokens / best


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--corpus', default='/tmp/bench_corpus/real_1m.txt')
  parser.add_argument('--reference_dir', default=os.path.expanduser('~/.cache/bert_jax/reference'))
  parser.add_argument('--lines', type=int, default=50_000)
  args = parser.parse_args()
  os.sched_setaffinity(0, {0})
  os.environ['RAYON_NUM_THREADS'] = '1'
  with open(args.corpus, encoding='utf-8') as f:
    lines = [l.strip() for l in f if l.strip()][:args.lines]

  from input_pipeline.tokenizer import SentencePieceTokenizer, WordPieceTokenizer  # noqa: E402
  tokenization = harness.module_from_file(  # google-research/bert's, a checkout of its own
      'bert_tokenization', os.path.join(args.reference_dir, 'bert', 'tokenization.py'))
  from transformers import BertTokenizerFast  # pylint: disable=g-import-not-at-top

  print(harness.machine())
  print(f'{len(lines):,} lines, {sum(len(l.split()) for l in lines):,} words, one core\n')
  print('| tokenizer | tokens | seconds (best of 3) | tokens/s |')
  print('| --- | ---: | ---: | ---: |')
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.FLAGS(['tokenizer_benchmark'])  # the reference's tokenizer reads an absl flag
  reference = tokenization.FullTokenizer(VOCAB, do_lower_case=True)
  ref = rate('reference FullTokenizer (Python)',
             lambda ls: sum(len(reference.tokenize(l)) for l in ls), lines, repeats=1)
  hf = BertTokenizerFast(vocab=VOCAB, do_lower_case=True)
  rate('transformers BertTokenizerFast (batch)',
       lambda ls: sum(map(len, hf(ls, add_special_tokens=False)['input_ids'])), lines)
  ours = WordPieceTokenizer(VOCAB, do_lower_case=True)
  wp = rate('ours WordPiece (batch)', lambda ls: sum(map(len, ours.encode_batch(ls))), lines)
  with tempfile.TemporaryDirectory() as tmp:
    spm = SentencePieceTokenizer.train(lines, 30_000, os.path.join(tmp, 'spm'))
    sp = rate('ours SentencePiece unigram 30k (batch)',
              lambda ls: sum(map(len, spm.encode_batch(ls))), lines)
  print(f'\nours WordPiece / reference: {wp / ref:.1f}x; SentencePiece / reference: '
        f'{sp / ref:.1f}x')


if __name__ == '__main__':
  main()
