r"""Train-step compile seconds against depth, scanned vs unrolled layers.

  .venv/bin/python benchmarks/compile_time.py [--sizes=tiny,mini,medium,base,large] [--batch=8]
  .venv/bin/python benchmarks/compile_time.py --sizes=base --layers=2,12,24  # depth, fixed width
  .venv/bin/python benchmarks/compile_time.py --sizes=tiny   # smoke

Lowers and compiles the configured run's train step (configs/benchmarks.py's recipe of each
size: adamw_bert, the default rules, float32; batch 8 x 128, one device) on CPU, through the
run setup (benchmarks/harness.py), with `model.scan_layers` True and False; nothing is
allocated or run. Scanned layers compile in time independent of depth; unrolled layers grow
linearly. `--layers` sets `model.num_layers` (each size's width at those depths); without it
each size has its own depth (2, 4, 8, 12, 24 layers at widths 128 to 1024).
"""

import argparse

import harness
import jax

from bert_jax.model.encoder import PRESETS


def compile_seconds(size: str, scan: bool, batch: int, layers: int = 0) -> float:
  setup = harness.configured_setup('benchmarks', size, jax.devices()[:1],
                                   **{'model.scan_layers': scan,
                                      'model.num_layers': layers,
                                      'train.global_batch_size': batch})
  return harness.compile_train_step(setup)[1]


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--sizes', default='tiny,mini,medium,base,large')
  p.add_argument('--batch', type=int, default=8)
  p.add_argument('--layers', default='', help='comma list of depths (model.num_layers)')
  args = p.parse_args()
  print(f'{harness.machine()}\ntrain-step compile seconds, batch {args.batch} x 128, '
        f'jax {jax.__version__}')
  print(f'{"size":6} {"layers":>6} {"width":>5} {"scan":>7} {"unrolled":>9}')
  depths = [int(x) for x in args.layers.split(',')] if args.layers else [0]
  for size in args.sizes.split(','):
    for layers in depths:
      scan = compile_seconds(size, True, args.batch, layers)
      unrolled = compile_seconds(size, False, args.batch, layers)
      shape = PRESETS[size]
      print(f'{size:6} {layers or shape["num_layers"]:6d} {shape["hidden_size"]:5d} '
            f'{scan:7.1f} {unrolled:9.1f}', flush=True)


if __name__ == '__main__':
  main()
