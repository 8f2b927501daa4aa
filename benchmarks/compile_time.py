r"""Train-step compile seconds against depth, scanned vs unrolled layers.

  .venv/bin/python benchmarks/compile_time.py [--sizes=tiny,mini,medium,base,large] [--batch=8]
  .venv/bin/python benchmarks/compile_time.py --sizes=tiny   # smoke

Lowers and compiles the configured run's train step (configs/benchmarks.py's recipe of each
size: adamw_bert, the default rules, float32; batch 8 x 128, one device) on CPU, through the
run setup (benchmarks/harness.py), with `model.scan_layers` True and False; nothing is
allocated or run. Scanned layers compile in time independent of depth; unrolled layers grow
linearly. The config sets depth only through `model.size` (2, 4, 8, 12, 24 layers at widths
128 to 1024), so the sweep is over sizes; XLA's compile time follows the op count, which
depth sets, far more than the widths.
"""

import argparse

import harness
import jax

from bert_jax.model.encoder import PRESETS


def compile_seconds(size: str, scan: bool, batch: int) -> float:
  setup = harness.configured_setup('benchmarks', size, jax.devices()[:1],
                                   **{'model.scan_layers': scan,
                                      'train.global_batch_size': batch})
  return harness.compile_train_step(setup)[1]


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--sizes', default='tiny,mini,medium,base,large')
  p.add_argument('--batch', type=int, default=8)
  args = p.parse_args()
  print(f'{harness.machine()}\ntrain-step compile seconds, batch {args.batch} x 128, '
        f'jax {jax.__version__}')
  print(f'{"size":6} {"layers":>6} {"width":>5} {"scan":>7} {"unrolled":>9}')
  for size in args.sizes.split(','):
    scan = compile_seconds(size, True, args.batch)
    unrolled = compile_seconds(size, False, args.batch)
    shape = PRESETS[size]
    print(f'{size:6} {shape["num_layers"]:6d} {shape["hidden_size"]:5d} {scan:7.1f} '
          f'{unrolled:9.1f}', flush=True)


if __name__ == '__main__':
  main()
