r"""Our ModernBERT-class train step against HuggingFace's ModernBertForMaskedLM (PyTorch).

  python benchmarks/modern_peers.py [--sizes tiny,mini] [--rounds 3] [--sides ours,hf_torch]
      [--single_thread]
  python benchmarks/modern_peers.py --sizes=tiny --rounds=1 --steps=2   # smoke

The ModernBERT sibling of benchmarks/peers.py (same workers-in-fresh-processes design). Ours is
the configured run's step of configs/modern.py (`model.arch=modern`, stable_adamw, the wsd
schedule, scanned layers) built by the run setup (harness.configured_setup), with only the
size, rows and row length set as --config.X would set them, and batch-size warmup off
(`train.batch_warmup_steps=0`: it changes which rows a step reads, not the step). The optional
side `ours_unrolled` is the same run with `model.scan_layers=False`.

HF is transformers' ModernBertForMaskedLM of the same shapes (our config through
`bert_jax.convert.hf_modern.config_to_hf`), float32, train mode, attn_implementation='sdpa'
(transformers' default on CPU), eager (no torch.compile), with `sparse_prediction=True` as
ModernBERT's own training runs it: both sides compute the MLM head only at the labelled
positions. Its optimizer is torch-optimi's StableAdamW, the family ours implements
(bert_jax/training/optim.py): lr 1e-4 constant, betas 0.9/0.98, eps 1e-6, weight decay 1e-5
decoupled (`decouple_lr`, max_lr = lr), no decay on 1-d tensors, no clipping (configs/modern.py
has clip_norm 0).

Data: `bert_jax.pretrain.synthetic.random_batch`, 2 batches from numpy seed 0 (as
harness.synthetic_batches makes ours), alternated on both sides: ~10% padding at the end of each
row, 30% of the row's tokens labelled (configs/modern.py's max_predictions), no sentence
objective. The sides run in fresh processes interleaved round by round (harness.interleave);
figures are medians over rounds of each worker's median step of `--steps` (5: a step is seconds
at 1,024 tokens on 2 cores) after 3 warm-up steps.
tokens/s = rows x row length / step time (padding included, on both sides). MFU = the useful
FLOPs of `bert_jax.model.flops` (local layers count their window) / step / the float32 matmul
peak JAX measures in our process.

`--single_thread` runs each side on one compute thread (XLA without its Eigen pool, torch with
OMP_NUM_THREADS=1) and times a step in process CPU seconds. On a shared machine the default
wall-clock figures measure the neighbours as much as the code: with the 2-core VM at load 4-7,
torch's two OpenMP threads ran the same mini step in 1.1 s in one process and 6 s in the next,
while one torch thread ran it in a steady 2.1 s. One thread's CPU seconds do not move with the
load, so a ratio from them is what each library costs per core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import harness

WARMUP = 3
SIDES = ('ours', 'ours_unrolled', 'hf_torch')
NAMES = {'ours': 'ours', 'ours_unrolled': 'ours unrolled', 'hf_torch': 'HF PyTorch'}
# size -> (configs/modern.py size, rows, tokens per row). Layers 1 (tiny) and 1-2 (mini) are
# 128-token sliding windows, over rows 8x (4x at 512) longer than the window.
GEOMETRIES = {
    'tiny': ('tiny', 8, 1024),
    'mini': ('mini', 4, 1024),
    'mini512': ('mini', 8, 512),
}


def config(size: str, unrolled: bool = False):
  """configs/modern.py's phase-1 run of `size`'s model at its rows and row length."""
  from configs import modern  # pylint: disable=g-import-not-at-top
  name, rows, seq = GEOMETRIES[size]
  overrides = {'train.global_batch_size': rows, 'data.max_seq_length': seq,
               'data.max_predictions_per_seq': modern.max_predictions(seq),
               'train.batch_warmup_steps': 0}
  if unrolled:
    overrides['model.scan_layers'] = False
  return harness.config('modern', f'{name},phase1', **overrides)


def geometry(size: str) -> dict:
  """What every side trains: rows, length, predictions, vocab, and the HF config dict of our
  model (a worker gets it on its command line, so the torch process never imports jax)."""
  from bert_jax.convert import hf_modern  # pylint: disable=g-import-not-at-top
  from bert_jax.training.run_setup import model_config  # pylint: disable=g-import-not-at-top
  c = config(size)
  return {'size': size, 'batch': c.train.global_batch_size, 'seq': c.data.max_seq_length,
          'preds': c.data.max_predictions_per_seq, 'vocab': c.model.vocab_size,
          'hf': hf_modern.config_to_hf(model_config(c))}


def data(g: dict) -> list:
  """harness.synthetic_batches' two host batches (seed 0) for the geometry."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain.synthetic import random_batch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  return [random_batch(rng, g['batch'], g['seq'], g['preds'], g['vocab']) for _ in range(2)]


def full_labels(b):
  """[B, S] MLM labels (-100 where unlabelled), as HF's masked-LM models take them."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  labels = np.full(b['input_ids'].shape, -100, np.int64)
  rows = np.arange(len(labels))[:, None]
  labels[rows, b['masked_lm_positions']] = b['masked_lm_ids']
  return labels


def timed_with_cpu(fn, steps: int, sync) -> tuple[harness.Timing, list[float]]:
  """harness.timed of `fn`, and the process CPU seconds of each timed call (sync to sync): on
  one thread, what the step costs however loaded the machine is."""
  marks = []

  def mark(result):
    result = sync(result)
    marks.append(time.process_time())
    return result

  timing = harness.timed(fn, steps=steps, warmup=WARMUP, sync=mark)
  return timing, [b - a for a, b in zip(marks[WARMUP - 1:], marks[WARMUP:])]


def worker_ours(g: dict, steps: int, unrolled: bool = False) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.model import flops  # pylint: disable=g-import-not-at-top
  setup = harness.configured_setup(config(g['size'], unrolled), devices=jax.devices()[:1])
  if harness.batch_geometry(setup) != (g['batch'], g['seq'], g['preds']):
    raise RuntimeError(f'setup geometry {harness.batch_geometry(setup)} != {g}')
  # harness.time_train_steps' loop, with the CPU time of each step as well.
  batches = harness.synthetic_batches(setup)
  compiled, compile_s = harness.compile_train_step(setup, batches[0])
  holder = {'state': setup.fresh_state()}

  def one(i):
    holder['state'], metrics = compiled(holder['state'], batches[i % len(batches)])
    return metrics

  timing, cpu = timed_with_cpu(one, steps, jax.block_until_ready)
  return {'step_s': timing.median, 'steps_s': timing.values, 'cpu_s': statistics.median(cpu),
          'compile_s': compile_s, 'peak_flops': flops.measured_matmul_peak(),
          'model_flops': flops.train_flops_per_step(setup.model_cfg, g['batch'], g['seq'],
                                                    g['preds']),
          'optimizer': setup.config.optimizer.name, 'scan': setup.model_cfg.scan_layers,
          'loss': float(timing.results[-1]['loss'])}


def worker_ours_unrolled(g: dict, steps: int) -> dict:
  return worker_ours(g, steps, unrolled=True)


def hf_step(g: dict, host: list, device: str = 'cpu', bf16: bool = False):
  """HF ModernBertForMaskedLM of `g`'s shapes (float32 weights, sdpa, sparse prediction) with
  optimi's StableAdamW as above, and `host`'s batches on `device`: (step(batch) -> loss
  tensor, device batches, model). `bf16`: the forward under bfloat16 autocast (GPU runs)."""
  import optimi  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  hf = {k: v for k, v in g['hf'].items() if k not in ('architectures', 'model_type')}
  cfg = transformers.ModernBertConfig(**hf, sparse_prediction=True, attn_implementation='sdpa')
  model = transformers.ModernBertForMaskedLM(cfg).float().to(device).train()
  params = [p for p in model.parameters() if p.requires_grad]  # the tied decoder once
  groups = [{'params': [p for p in params if p.ndim > 1]},
            {'params': [p for p in params if p.ndim <= 1], 'weight_decay': 0.0}]
  lr = 1e-4
  opt = optimi.StableAdamW(groups, lr=lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=1e-5,
                           decouple_lr=True, max_lr=lr)
  batches = [{k: torch.from_numpy(v).long().to(device) for k, v in
              dict(input_ids=b['input_ids'], attention_mask=b['input_mask'],
                   labels=full_labels(b)).items()} for b in host]

  def step(x):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
      loss = model(**x).loss
    loss.backward()
    opt.step()
    return loss

  return step, batches, model


def worker_torch(g: dict, steps: int) -> dict:
  import optimi  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  one, batches, model = hf_step(g, data(g))
  step = lambda i: one(batches[i % len(batches)]).item()  # noqa: E731
  host = lambda r: r  # noqa: E731  (CPU torch returns when done)
  timing, cpu = timed_with_cpu(step, steps, host)
  a = torch.ones(2048, 2048)
  matmul = harness.timed(lambda _: a @ a, steps=5, warmup=0, sync=host)
  attn = model.config._attn_implementation  # pylint: disable=protected-access
  return {'step_s': timing.median, 'steps_s': timing.values, 'cpu_s': statistics.median(cpu),
          'peak_flops': 2 * 2048 ** 3 / matmul.lo,
          'threads': torch.get_num_threads(), 'attn': attn,
          'torch': torch.__version__, 'transformers': transformers.__version__,
          'optimizer': f'optimi {optimi.__version__} StableAdamW', 'loss': timing.results[-1]}


WORKERS = {'ours': worker_ours, 'ours_unrolled': worker_ours_unrolled, 'hf_torch': worker_torch}


def worker_env(single_thread: bool) -> dict[str, str]:
  """A worker's environment: each library's own threading, or one compute thread on each
  side (XLA's CPU client, torch's OpenMP and MKL)."""
  env = {'TF_CPP_MIN_LOG_LEVEL': '3'}
  if single_thread:
    env.update(OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', XLA_FLAGS=(
        os.environ.get('XLA_FLAGS', '') + ' --xla_cpu_multi_thread_eigen=false').strip())
  return env


def run_worker(side: str, g: dict, steps: int, single_thread: bool = False) -> dict:
  """One side in a fresh process; with `single_thread`, pinned to one core as well: XLA's CPU
  runtime runs independent thunks on its own pool whatever Eigen's setting (unpinned, ours
  took 2.2 CPU-s for a 1.2 s step on 2 cores), so CPU seconds alone did not make it one core."""
  pin = ['taskset', '-c', '0'] if single_thread else []
  ran = harness.run([*pin, sys.executable, os.path.abspath(__file__), '--worker', side,
                     f'--geometry={json.dumps(g)}', f'--steps={steps}'],
                    env=worker_env(single_thread))
  return {**ran.last_json(), 'peak_rss_mib': ran.peak_rss_mib}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='tiny,mini', help='of ' + ','.join(GEOMETRIES))
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=5)  # 3 rounds of tiny,mini: ~5 min
  parser.add_argument('--sides', default='ours,hf_torch', help='ours and any of '
                      + ','.join(SIDES[1:]))
  parser.add_argument('--single_thread', action='store_true', help='one compute thread a '
                      'side, timed in CPU seconds: figures that hold on a loaded machine')
  parser.add_argument('--worker', choices=sorted(WORKERS))
  parser.add_argument('--geometry', help='internal: the worker\'s batch geometry (JSON)')
  args = parser.parse_args()
  if args.worker:
    if args.worker.startswith('ours'):
      harness.tuned_malloc()  # as bert_jax.main runs; HF's process keeps its allocator
    print(json.dumps(WORKERS[args.worker](json.loads(args.geometry), args.steps)))
    return

  sides = [s for s in SIDES if s in args.sides.split(',')]
  if sides[:1] != ['ours'] or len(sides) < 2 or set(args.sides.split(',')) - set(SIDES):
    raise SystemExit(f'--sides={args.sides}: ours and any of {", ".join(SIDES[1:])} (the '
                     'figures are ratios to ours)')
  sizes = args.sizes.split(',')
  if set(sizes) - set(GEOMETRIES):
    raise SystemExit(f'--sizes={args.sizes}: each of {", ".join(GEOMETRIES)}')
  # One thread a side: a step's CPU seconds are its cost whatever the neighbours do.
  clock = 'cpu_s' if args.single_thread else 'step_s'
  print(f'{harness.machine()}\n{args.rounds} interleaved rounds; median step of {args.steps} '
        f'after {WARMUP} warm-up; float32; MLM head at the labelled positions on every side; '
        + ('one compute thread a side, tokens per CPU-second' if args.single_thread else
           'each library\'s own threads, tokens per wall second') + '\n')
  print('| config (rows x length) | ' + ' | '.join(f'{NAMES[s]} tokens/s' for s in sides)
        + ' | ' + ' | '.join(f'ours / {NAMES[s]} (range)' for s in sides[1:]) + ' | '
        + ' | '.join(f'MFU {NAMES[s]}' for s in sides) + ' |')
  print('| --- |' + ' ---: |' * (3 * len(sides) - 1))
  results = {}
  for size in sizes:
    g = geometry(size)
    runs = harness.interleave(
        {s: (lambda s=s: run_worker(s, g, args.steps, args.single_thread)) for s in sides},
        args.rounds)
    tokens = g['batch'] * g['seq']
    per_round = {s: [tokens / r[clock] for r in runs[s]] for s in sides}
    tok = {s: statistics.median(v) for s, v in per_round.items()}
    ratio = {s: harness.ratios(per_round['ours'], per_round[s]) for s in sides[1:]}
    peak = statistics.median(r['peak_flops'] for r in runs['ours'])
    model_flops = runs['ours'][0]['model_flops']
    mfu = {s: model_flops * tok[s] / tokens / peak for s in sides}
    hf = runs.get('hf_torch', [{}])[0]
    results[size] = {
        'model': config(size).model.size, 'batch': g['batch'], 'seq': g['seq'],
        'preds': g['preds'], 'vocab': g['vocab'], 'single_thread': args.single_thread,
        'clock': clock, 'tokens_per_s': tok, 'tokens_per_s_by_round': per_round,
        'ratio': {s: {'median': r.median, 'lo': r.lo, 'hi': r.hi} for s, r in ratio.items()},
        'mfu': mfu, 'step_s': {s: [r['step_s'] for r in runs[s]] for s in sides},
        'cpu_s': {s: [r['cpu_s'] for r in runs[s]] for s in sides},
        'compile_s': {s: statistics.median(r['compile_s'] for r in runs[s])
                      for s in sides if s.startswith('ours')},
        'peak_rss_mib': {s: max(r['peak_rss_mib'] for r in runs[s]) for s in sides},
        'peak_gflops': {s: statistics.median(r['peak_flops'] for r in runs[s]) / 1e9
                        for s in sides},
        'loss_last_step': {s: runs[s][-1]['loss'] for s in sides},
        **({'hf': {k: hf[k] for k in ('attn', 'threads', 'torch', 'transformers', 'optimizer')}}
           if hf else {})}
    print(f'| {size} {g["batch"]} x {g["seq"]} | ' + ' | '.join(f'{tok[s]:,.0f}' for s in sides)
          + ' | ' + ' | '.join(f'{ratio[s].median:.2f}x ({ratio[s].lo:.2f}-{ratio[s].hi:.2f})'
                               for s in sides[1:]) + ' | '
          + ' | '.join(f'{mfu[s]:.1%}' for s in sides) + ' |', flush=True)
  last = results[sizes[-1]]
  print('\nmatmul peaks (GFLOP/s): ' + ', '.join(f'{s} {v:.0f}'
                                                  for s, v in last['peak_gflops'].items()))
  if 'hf' in last:
    print('HF: ' + ', '.join(f'{k} {v}' for k, v in last['hf'].items()))
  print(f'load average after: {" ".join(f"{x:.2f}" for x in os.getloadavg())}')
  print(json.dumps(results))


if __name__ == '__main__':
  main()
