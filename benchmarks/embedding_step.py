r"""One contrastive training step against sentence-transformers', at the same batch: where the
embedding fine-tune's time goes on this CPU (benchmarks/embedding_peers.py times whole runs).

  .venv/bin/python benchmarks/embedding_step.py [--rounds=2] [--steps=3]

The batch: the first 64 training pairs (seed 0's order) of embedding_peers.py's docstring ICT
set, 128 tokens, all-MiniLM-L6-v2, MNRL at scale 20, AdamW with clipping (its RECIPE). Arms,
each its own process per round, interleaved:
- `ours`: the step `bert_jax.finetune.run` builds (its Program and run setup), with the
  allocator settings the CLI re-executes itself with (bert_jax/training/host_malloc.py);
- `ours_eigen_dots`: the same with XLA's YNNPACK dot fusions off
  (`--xla_cpu_experimental_ynn_fusion_type=`: Eigen's dots);
- `ours_glibc`: the same with glibc's default malloc (GLIBC_TUNABLES=, what embedding_peers.py
  gave our arm);
- `theirs`: sentence-transformers' `MultipleNegativesRankingLoss`, backward, clipping and torch
  AdamW on the same 64 pairs, tokenized as its collator does (padded to each column's longest).
Figures: median wall seconds a step and CPU seconds a step (user + system over the timed
steps), after 2 untimed steps; our ratio is theirs / ours (above 1: we are faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAIRS = os.path.join('runs', 'embedding_peers', 'pairs')


def _timed(step, steps: int) -> dict:
  """harness.timed's median of `steps` calls after 2 untimed, and CPU seconds a timed call."""
  import harness  # pylint: disable=g-import-not-at-top
  for _ in range(2):
    step()
  start = os.times()
  timing = harness.timed(lambda i: step(), steps=steps, warmup=0, sync=lambda r: r)
  end = os.times()
  cpu = (end.user + end.system - start.user - start.system) / steps
  return {'step_s': timing.median, 'cpu_s': cpu, 'walls': [round(w, 2) for w in timing.values]}


def ours(files: dict, steps: int) -> dict:
  # pylint: disable=g-import-not-at-top
  import jax
  from bert_jax.convert import start_points
  from bert_jax.finetune import run as finetune
  from bert_jax.training import host_malloc
  from input_pipeline.finetune import batching
  import embedding_peers
  config = embedding_peers.ours_config(files, seed=0)
  start, task, program = finetune.build_program(config)
  _, params = start_points.init_head_params(start, task.head, rng=jax.random.key(0),
                                            fresh_head=False)
  holder = {'state': program.setup.state_from_params(params, 0)}
  rows = batching.epoch_rows(0, 0, task.num_train, program.batch)[0]
  batch = program.train_batch(task.train, rows)

  def step():
    holder['state'], metrics = program.train_step(holder['state'], batch)
    jax.block_until_ready(metrics)
    host_malloc.trim_if_over()  # as the training loop does after every step

  return {**_timed(step, steps), 'tokens': list(batch['input_ids'].shape)}


def theirs(files: dict, steps: int) -> dict:
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from input_pipeline.finetune import pairs
  import embedding_peers
  model, loss_fn, optimizer = embedding_peers.their_trainer()
  train = pairs.read_pairs(files['train'])
  rows = [train[j] for j in np.random.default_rng([0, 0]).permutation(len(train))[:64]]
  features = embedding_peers.their_features(model, rows)
  model.train()
  return {**_timed(lambda: embedding_peers.their_step(model, loss_fn, optimizer, features), steps),
          'tokens': [list(f['input_ids'].shape) for f in features]}


ARMS = {  # name: (worker, extra environment)
    'ours': ('ours', {}),
    'ours_eigen_dots': ('ours', {'XLA_FLAGS': '--xla_cpu_experimental_ynn_fusion_type='}),
    'ours_glibc': ('ours', {'GLIBC_TUNABLES': ''}),
    'theirs': ('theirs', {'GLIBC_TUNABLES': ''}),
}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--rounds', type=int, default=2)
  p.add_argument('--steps', type=int, default=3)
  p.add_argument('--arms', default=','.join(ARMS))
  p.add_argument('--worker', default='', help=argparse.SUPPRESS)
  args = p.parse_args()
  unknown = set(args.arms.split(',')) - set(ARMS)
  if unknown:
    p.error(f'--arms: unknown {sorted(unknown)}; choose from {",".join(ARMS)}')
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from input_pipeline.finetune import pairs  # pylint: disable=g-import-not-at-top
  files = pairs.write_demo_pairs(PAIRS, os.path.join('runs', 'cache', 'mr'), source='docstrings')
  if args.worker:
    print(json.dumps(globals()[args.worker](files, args.steps)))
    return
  import harness  # pylint: disable=g-import-not-at-top
  from bert_jax.training import host_malloc  # pylint: disable=g-import-not-at-top
  arms = args.arms.split(',')
  base = {'JAX_PLATFORMS': 'cpu', 'TF_CPP_MIN_LOG_LEVEL': '2', 'XLA_FLAGS': '',
          'GLIBC_TUNABLES': host_malloc.TUNABLES}

  def contender(name):
    worker, extra = ARMS[name]
    return lambda: harness.run([sys.executable, os.path.abspath(__file__), f'--worker={worker}',
                                f'--steps={args.steps}'], cwd=ROOT,
                               env={**base, **extra}).last_json()

  report = lambda r, name, x: print(f'# round {r} {name}: {x["step_s"]:.2f} s/step, '
                                    f'{x["cpu_s"]:.1f} CPU-s/step {x["walls"]} {x["tokens"]}',
                                    flush=True)
  got = harness.interleave({a: contender(a) for a in arms}, args.rounds, report)
  print(harness.machine())
  print('| arm | s/step, median of rounds | CPU-s/step | theirs / ours, wall (per round) |')
  print('|---|---:|---:|---|')
  for a in arms:
    wall = statistics.median(x['step_s'] for x in got[a])
    cpu = statistics.median(x['cpu_s'] for x in got[a])
    ratio = ''
    if 'theirs' in got and a != 'theirs':
      ratio = ', '.join(f'{t["step_s"] / o["step_s"]:.2f}' for o, t in zip(got[a], got['theirs']))
    print(f'| {a} | {wall:.2f} | {cpu:.1f} | {ratio} |')


if __name__ == '__main__':
  main()
