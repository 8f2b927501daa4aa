r"""What each ModernBERT piece buys, at equal training FLOPs, on this CPU.

  python benchmarks/modern_ablation.py --workdir /tmp/modern_ablation [--seeds 0,1,2]
      [--cells bert,+pre_norm,...] [--budget_steps 500]
  python benchmarks/modern_ablation.py --step_time [--rounds 3]   # each cell's step, interleaved

Cells are configs/ablation.py's: classic BERT, then ModernBERT's pieces added one at a time
(pre-norm, no biases, GeGLU, RoPE, local/global attention, no dropout, 30% masking, StableAdamW,
a warmup-stable-decay schedule with 1-sqrt decay). Each cell trains through the product's
pre-training run (`bert_jax.pretrain.run.train_and_evaluate`) for
round(budget_steps x FLOPs(classic step) / FLOPs(its step)) steps, with
`bert_jax.model.flops.train_flops_per_step(computed=True)` (local layers count the 3 x window/2
keys the chunked core scores per query, not only the window + 1 they may see), so every cell
spends the classic cell's FLOPs. Data: the embedded docstring corpus (1 in 20
documents held out), its WordPiece vocabulary of 8,192, 128-token full-sentence rows; training
rows are masked afresh at the cell's rate (dynamic masking), and every cell is scored on the
same held-out records masked at 15%, every batch of them. Reported per cell: held-out MLM loss
and accuracy (median, min and max over seeds), steps, and the median train step time of the
run (steps/s logged every 25 steps, the first window, which includes compilation, dropped).
Each (cell, seed) result is cached as JSON in the workdir, so an interrupted run resumes.

`--step_time` measures what a step of each cell costs on its own, apart from the training runs
(whose times move with whatever else the machine runs): every cell's configured step
(`harness.time_train_steps`, synthetic batches of the cell's layout, the median of 10 steps
after 3), the cells interleaved round by round, and each round's ratio to the classic cell.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import logging  # noqa: E402

import harness  # noqa: E402
from bert_jax.model import flops  # noqa: E402
from bert_jax.pretrain import baselines, run as train  # noqa: E402
from bert_jax.training import run_setup  # noqa: E402
from bert_jax.training.metric_writer import read_metrics  # noqa: E402
from configs import ablation, demo as demo_recipes  # noqa: E402
from input_pipeline.pretrain import create_pretraining_data as cpd, demo_corpus  # noqa: E402

EVAL_RATE = 0.15


def data_config():
  d = demo_recipes.data()
  d.max_seq_length = ablation.SEQ_LEN
  d.pack = False
  return d


def prepare(workdir: str) -> dict:
  """Train and eval records at 30% masking (39 slots: room for any cell's dynamic masks) and
  the common eval records at 15%."""
  d = data_config()
  paths = demo_corpus.prepare_data(workdir, d, FLAGS.dupe_factor, sentence_objective='none',
                                   masked_lm_prob=0.3)
  paths['eval15'] = os.path.join(workdir, 'data', 'eval15.tfrecord')
  if not os.path.exists(paths['eval15'] + '.stats.json'):
    cpd.run(demo_corpus.records_job(paths, 'eval', paths['eval15'], d, 1, 'none', EVAL_RATE))
  return paths


def common_eval_config(config, paths: dict):
  """`config` reading the common held-out records (15% masks, every batch of them)."""
  scored = config.copy_and_resolve_references()
  scored.data.eval_files = paths['eval15']
  scored.data.max_predictions_per_seq = demo_corpus.max_predictions(ablation.SEQ_LEN, EVAL_RATE)
  scored.data.dynamic_masking = False
  scored.train.eval_steps = 1_000_000
  return scored


def step_flops(config) -> float:
  return flops.train_flops_per_step(run_setup.model_config(config),
                                    config.train.global_batch_size,
                                    config.data.max_seq_length, config.data.max_predictions_per_seq,
                                    computed=True)


def step_seconds(run_dir: str) -> float:
  rates = [r['train/steps_per_second'] for r in read_metrics(run_dir)
           if 'train/steps_per_second' in r][1:]
  return 1.0 / statistics.median(rates) if rates else float('nan')


def run_cell(paths: dict, workdir: str, cell: str, seed: int, budget: float) -> dict:
  name = f'{cell} seed {seed}'
  result_file = os.path.join(workdir, 'results', f'{cell}_seed{seed}.json')
  if os.path.exists(result_file):
    with open(result_file) as f:
      return json.load(f)
  config = ablation.get_config(cell)
  config.seed = seed
  config.data.train_files = paths['train'] + '*'
  config.data.vocab_file = paths['vocab']
  config.train.num_steps = max(1, round(budget / step_flops(config)))
  run_dir = os.path.join(workdir, 'runs', f'{cell}_seed{seed}')
  shutil.rmtree(run_dir, ignore_errors=True)
  print(f'[modern_ablation] {name}: {config.train.num_steps} steps', flush=True)
  start = time.time()
  train.train_to_the_end(config, run_dir)
  minutes = (time.time() - start) / 60
  held_out = train.evaluate_workdir(common_eval_config(config, paths), run_dir)
  result = {'cell': cell, 'seed': seed, 'steps': config.train.num_steps,
            'flops': config.train.num_steps * step_flops(config),
            'mlm_loss': held_out['mlm_loss'], 'mlm_accuracy': held_out['mlm_accuracy'],
            'step_seconds': step_seconds(run_dir), 'minutes': round(minutes, 2)}
  os.makedirs(os.path.dirname(result_file), exist_ok=True)
  with open(result_file, 'w') as f:
    json.dump(result, f, indent=2)
  print(f'[modern_ablation] {name}: {json.dumps(result)}', flush=True)
  shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints of a finished cell: not needed
  return result


def spread(values) -> str:
  return f'{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})'


def table(results: list[dict], cells) -> str:
  rows = ['| cell | steps | train PFLOP | held-out MLM loss, median (min-max) | '
          'held-out MLM accuracy | step ms (median) | vs previous cell (loss) |',
          '| --- | ---: | ---: | ---: | ---: | ---: | ---: |']
  previous = None
  for cell in cells:
    rs = [r for r in results if r['cell'] == cell]
    if not rs:
      continue
    loss = statistics.median(r['mlm_loss'] for r in rs)
    delta = '' if previous is None else f'{loss - previous:+.4f}'
    rows.append(f"| {cell} | {rs[0]['steps']} | {rs[0]['flops'] / 1e15:.3f} | "
                f"{spread([r['mlm_loss'] for r in rs])} | "
                f"{spread([r['mlm_accuracy'] for r in rs])} | "
                f"{statistics.median(r['step_seconds'] for r in rs) * 1e3:.0f} | {delta} |")
    previous = loss
  return '\n'.join(rows)


def step_times(cells, rounds: int) -> str:
  setups = {cell: harness.configured_setup(ablation.get_config(cell)) for cell in cells}
  batches = {cell: harness.synthetic_batches(setup) for cell, setup in setups.items()}
  runs = harness.interleave(
      {cell: (lambda cell=cell: harness.time_train_steps(setups[cell], batches[cell]).timing)
       for cell in cells}, rounds,
      lambda r, cell, t: print(f'[modern_ablation] round {r} {cell}: {t.median * 1e3:.1f} ms',
                               flush=True))
  base = [t.median for t in runs[cells[0]]]
  rows = [f'| cell | step ms, median of {rounds} rounds | / {cells[0]} (min-max) |',
          '| --- | ---: | ---: |']
  for cell in cells:
    medians = [t.median for t in runs[cell]]
    ratio = harness.ratios(medians, base)
    rows.append(f'| {cell} | {statistics.median(medians) * 1e3:.1f} | '
                f'{ratio.median:.3f} ({ratio.lo:.3f}-{ratio.hi:.3f}) |')
  return '\n'.join(rows)


def main():
  logging.set_verbosity(logging.WARNING)
  if FLAGS.step_time:
    print(harness.machine(), flush=True)
    print(step_times(FLAGS.cells.split(','), FLAGS.rounds))
    return
  workdir = os.path.abspath(FLAGS.workdir)
  print(harness.machine(), flush=True)
  paths = prepare(workdir)
  classic = ablation.get_config('bert')
  budget = FLAGS.budget_steps * step_flops(classic)
  cells = FLAGS.cells.split(',')
  seeds = [int(s) for s in FLAGS.seeds.split(',')]
  results = [run_cell(paths, workdir, cell, seed, budget) for seed in seeds for cell in cells]
  held_out = common_eval_config(ablation.get_config('bert'), paths)
  print(f'held-out majority-token accuracy: {baselines.eval_baselines(held_out)["mlm"]:.4f}')
  print(table(results, cells))


if __name__ == '__main__':
  harness.tuned_malloc()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default='/tmp/modern_ablation')
  parser.add_argument('--cells', default=','.join(ablation.CELLS))
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--budget_steps', type=int, default=500,
                      help='Steps of the classic cell; the FLOPs every cell gets.')
  parser.add_argument('--dupe_factor', type=int, default=2)
  parser.add_argument('--step_time', action='store_true',
                      help='Time each cell\'s step (interleaved) instead of training.')
  parser.add_argument('--rounds', type=int, default=3)
  FLAGS = parser.parse_args()
  main()
