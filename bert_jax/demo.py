r"""The main job on a fresh CPU: pre-train BERT-tiny on the embedded corpus, end to end.

  python -m bert_jax.demo --workdir=runs/demo

1. corpus: the standard library's docstrings, every 20th document held out for eval;
2. a WordPiece vocabulary (8,192) trained on the training documents;
3. NSP/MLM instances at 128 tokens (create_pretraining_data, 2 workers);
4. training with configs/bert_tiny.py (progress bar, TensorBoard, metrics.jsonl, checkpoints);
5. held-out MLM/NSP accuracy next to the majority-token baseline;
6. export to a HuggingFace directory and a fill-mask example through transformers;
7. a loss-curve PNG.
Re-running resumes training from the workdir's latest checkpoint.
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import time

from absl import app, flags, logging

from bert_jax.metric_writer import read_metrics
from input_pipeline import fs

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', 'runs/demo', 'Where data, checkpoints, logs and the export go.')
flags.DEFINE_integer('steps', None, 'Override train.num_steps of configs/bert_tiny.py.')
flags.DEFINE_integer('dupe_factor', 5, 'Passes over the training corpus with fresh masks.')


def _say(msg: str) -> None:
  print(f'[demo] {msg}', flush=True)


def prepare_data(workdir: str, dupe_factor: int) -> dict[str, str]:
  from input_pipeline import corpus  # pylint: disable=g-import-not-at-top
  from input_pipeline import create_pretraining_data as cpd
  from input_pipeline.tokenizer import WordPieceTokenizer
  data = fs.join(workdir, 'data')
  paths = {'train_text': fs.join(data, 'train.txt'), 'eval_text': fs.join(data, 'eval.txt'),
           'vocab': fs.join(data, 'vocab.txt'), 'train': fs.join(data, 'train.tfrecord'),
           'eval': fs.join(data, 'eval.tfrecord')}
  if all(fs.exists(paths[k] + '.stats.json') for k in ('train', 'eval')):
    _say(f'data already in {data}')
    return paths
  fs.makedirs(data)
  docs = list(corpus.embedded_documents())
  corpus.write_text_file((d for i, d in enumerate(docs) if i % 20), paths['train_text'])
  corpus.write_text_file((d for i, d in enumerate(docs) if i % 20 == 0), paths['eval_text'])
  words = sum(len(s.split()) for d in docs for s in d)
  _say(f'embedded corpus: {len(docs)} documents, {words:,} words (1 in 20 held out)')
  WordPieceTokenizer.train((s for i, d in enumerate(docs) if i % 20 for s in d), 8192, data)
  for split in ('train', 'eval'):
    stats = cpd.run(records_job(paths, split, paths[split], dupe_factor))
    _say(f'{split}: {stats["instances"]:,} instances in {stats["seconds"]}s '
         f'(masked {stats["masked_fraction"]:.3f}, random-next {stats["nsp_random_next_fraction"]:.3f}, '
         f'padding {stats["padding_fraction"]:.3f})')
  return paths


def records_job(paths: dict[str, str], split: str, output_file: str, dupe_factor: int,
                sentence_objective: str = 'nsp', masked_lm_prob: float = 0.15):
  """The demo's data-creation job for `split` ('train' or 'eval') of `prepare_data`'s text and
  vocab: 128-token rows, 2 shards and workers for train, 1 for eval. A function so that
  benchmarks/ablation.py writes its other objectives and masking rates exactly as the demo
  writes its NSP records; the prediction cap grows with the rate (the reference's 20 is
  128 x 0.15 rounded up), else a higher rate would be clipped back to ~0.16."""
  from input_pipeline import create_pretraining_data as cpd  # pylint: disable=g-import-not-at-top
  from input_pipeline.instances import MaskingConfig  # pylint: disable=g-import-not-at-top
  predictions = max(20, math.ceil(128 * masked_lm_prob))
  masking = MaskingConfig(max_seq_length=128, max_predictions_per_seq=predictions,
                          masked_lm_prob=masked_lm_prob)
  shards = 2 if split == 'train' else 1
  return cpd.Job(output_file=output_file, masking=masking, vocab_file=paths['vocab'],
                 input_file=paths[f'{split}_text'], dupe_factor=dupe_factor if split == 'train'
                 else 1, num_shards=shards, num_workers=shards, window_chars=400_000,
                 sentence_objective=sentence_objective)


def majority_baseline(eval_files: str, sentence_objective: str = 'nsp') -> float:
  """Accuracy of always predicting the most frequent masked token of the eval set."""
  from input_pipeline import dataset as data_lib  # pylint: disable=g-import-not-at-top
  counts: collections.Counter = collections.Counter()
  cfg = data_lib.ReaderConfig(files=eval_files, batch_size=256,
                              sentence_objective=sentence_objective)
  for batch in data_lib.DataIterator(data_lib.make_dataset(cfg, training=False)):
    ids, w = batch['masked_lm_ids'], batch['masked_lm_weights']
    counts.update(ids[w > 0].tolist())
  return counts.most_common(1)[0][1] / sum(counts.values())


def plot_losses(workdir: str) -> str:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  train, evals = [], []
  for r in read_metrics(workdir):
    if 'train/loss' in r:
      train.append((r['step'], r['train/mlm_loss'], r['train/nsp_loss']))
    if 'eval/loss' in r:
      evals.append((r['step'], r['eval/mlm_loss'], r['eval/nsp_loss']))
  fig, ax = plt.subplots(figsize=(7, 4))
  for rows, style, name in ((train, '-', 'train'), (evals, 'o--', 'eval')):
    if rows:
      s, mlm, nsp = zip(*sorted(rows))
      ax.plot(s, mlm, style, label=f'{name} MLM loss')
      ax.plot(s, nsp, style, label=f'{name} NSP loss')
  ax.set_xlabel('step')
  ax.set_ylabel('loss')
  ax.set_title('BERT-tiny on the embedded corpus')
  ax.legend()
  ax.grid(alpha=0.3)
  path = fs.join(workdir, 'loss_curve.png')
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)
  fs.write_bytes(path, png.getvalue())
  return path


def fill_mask_example(export_dir: str) -> list[tuple[str, float]]:
  import transformers  # pylint: disable=g-import-not-at-top
  fill = transformers.pipeline('fill-mask', model=export_dir, device='cpu')
  text = 'Return a new [MASK] containing the items of the iterable.'
  return text, [(r['token_str'], round(r['score'], 3)) for r in fill(text, top_k=5)]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO
  start = time.time()
  workdir = fs.absolute(FLAGS.workdir)
  paths = prepare_data(workdir, FLAGS.dupe_factor)

  from bert_jax import export, train  # pylint: disable=g-import-not-at-top
  from configs import bert_tiny
  config = bert_tiny.get_config()
  config.data.train_files = paths['train'] + '*'
  config.data.eval_files = paths['eval']
  config.data.vocab_file = paths['vocab']
  if FLAGS.steps:
    config.train.num_steps = FLAGS.steps
  run_dir = fs.join(workdir, 'train')
  _say(f'training BERT-tiny for {config.train.num_steps} steps of batch '
       f'{config.train.global_batch_size} in {run_dir}')
  result = train.train_and_evaluate(config, run_dir)
  ev = result['eval'] or export.evaluate_workdir(config, run_dir)
  baseline = majority_baseline(paths['eval'])
  _say(f'held-out MLM accuracy {ev["mlm_accuracy"]:.4f} vs majority-token baseline '
       f'{baseline:.4f} ({ev["mlm_accuracy"] / baseline:.2f}x); NSP accuracy '
       f'{ev["nsp_accuracy"]:.4f} (chance 0.5)')

  export_dir = export.export_workdir(run_dir, fs.join(workdir, 'hf_export'), config=config)
  _say(f'exported to {export_dir} (BertForPreTraining + tokenizer)')
  text, top = fill_mask_example(export_dir)
  _say(f'fill-mask through transformers: {text!r} -> {top}')
  _say(f'loss curve: {plot_losses(run_dir)}')
  _say(f'TensorBoard: tensorboard --logdir {fs.join(run_dir, "tensorboard")}')
  summary = {'mlm_accuracy': ev['mlm_accuracy'], 'majority_baseline': baseline,
             'nsp_accuracy': ev['nsp_accuracy'], 'steps': result['step'],
             'minutes': round((time.time() - start) / 60, 2), 'export': export_dir}
  fs.write_text(fs.join(workdir, 'demo_summary.json'), json.dumps(summary, indent=2))
  _say(f'done in {summary["minutes"]} minutes: {json.dumps(summary)}')


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
