r"""Training on packed 512-token rows against unpacked rows of the same real corpus.

  python benchmarks/data_creation.py      # writes ours_512 and ours_packed_512
  python benchmarks/packed_throughput.py [--sizes=tiny,mini] [--batch=8] [--steps=10]
  python benchmarks/packed_throughput.py --sizes=tiny --steps=2   # smoke

Real batches from the run's own reader (seq 512, 80 predictions, batch 8 rows); the configured
run's train step (configs/benchmarks.py's recipe of each size at 512 tokens: adamw_bert, the
default rules, float32, through the run setup of benchmarks/harness.py) on unpacked rows and
on packed rows (`data.packed`: K = 3, block-diagonal attention, positions restarting per
instance); median over `--steps` batches after 3 warm-up, each batch a new one already on the
device. The figure of merit is non-padding tokens per second: the tokens that carry training
signal.
"""

from __future__ import annotations

import argparse
import os
import statistics

import harness

if __name__ == '__main__':
  harness.tuned_malloc()

import jax  # noqa: E402

from bert_jax.training import sharding as shd  # noqa: E402


def run(size: str, files: str, packed: bool, batch: int, steps: int = 10,
        warmup: int = 3) -> dict:
  config = harness.config('benchmarks', size, **{
      'train.global_batch_size': batch, 'data.max_seq_length': 512,
      'data.max_predictions_per_seq': 80, 'data.packed': packed})
  setup = harness.configured_setup(config, devices=jax.devices()[:1])
  batches = harness.reader(config, files)
  host = [next(batches) for _ in range(warmup + steps)]
  tokens = [int(b['input_mask'].sum()) for b in host[warmup:]]
  timing = harness.time_train_steps(setup, [shd.global_batch(b, setup.mesh) for b in host],
                                    steps=steps, warmup=warmup).timing
  seconds = timing.median
  return {'step_s': seconds, 'tokens_per_s': statistics.mean(tokens) / seconds,
          'padding': 1 - statistics.mean(tokens) / (batch * 512)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='tiny,mini')
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--data', default='/tmp/bench_data_creation')
  args = parser.parse_args()
  print(harness.machine())
  print(f'| size (batch {args.batch} x 512) | unpacked: padding, step ms, real tokens/s | '
        'packed: padding, step ms, real tokens/s | packed / unpacked |')
  print('| --- | --- | --- | ---: |')
  for size in args.sizes.split(','):
    plain = run(size, os.path.join(args.data, 'ours_512'), False, args.batch, args.steps)
    packed = run(size, os.path.join(args.data, 'ours_packed_512'), True, args.batch, args.steps)
    print(f'| {size} | {plain["padding"]:.1%}, {plain["step_s"] * 1e3:.0f}, '
          f'{plain["tokens_per_s"]:,.0f} | {packed["padding"]:.1%}, {packed["step_s"] * 1e3:.0f}, '
          f'{packed["tokens_per_s"]:,.0f} | '
          f'{packed["tokens_per_s"] / plain["tokens_per_s"]:.2f}x |',
          flush=True)


if __name__ == '__main__':
  main()
