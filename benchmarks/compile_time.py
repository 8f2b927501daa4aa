r"""Train-step compile seconds against depth, scanned vs unrolled layers.

  .venv/bin/python benchmarks/compile_time.py [--layers 2,12,24] [--width base]

Lowers and compiles the real sharded train step (batch 8, seq 128, AdamW) on CPU; nothing is
run. Scanned layers compile in time independent of depth; unrolled layers grow linearly.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.training import optim, sharding as shd  # noqa: E402
from bert_jax.pretrain import step as ts, synthetic
from bert_jax.model.encoder import PRESETS, BertConfig  # noqa: E402


def compile_seconds(cfg: BertConfig, batch: int = 8, seq: int = 128) -> float:
  mesh = shd.make_mesh((1, 1, 1), jax.devices()[:1])
  schedule = optim.learning_rate_schedule('constant', 1e-4, 0, 10)
  tx = optim.make_optimizer('adamw_bert', schedule)
  state = ts.abstract_train_state(cfg, tx)
  batch_np = synthetic.random_batch(np.random.default_rng(0), batch, seq, 20, cfg.vocab_size)
  batch_abs = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch_np.items()}
  step = ts.jit_train_step(cfg, tx, schedule, ts.state_shardings(cfg, tx, mesh, shd.DEFAULT_RULES),
                           mesh, shd.DEFAULT_RULES)
  t = time.perf_counter()
  with shd.activate(mesh, shd.DEFAULT_RULES):
    step.jitted.lower(state, batch_abs).compile()
  return time.perf_counter() - t


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--layers', default='2,12,24')
  p.add_argument('--width', default='base', choices=list(PRESETS))
  args = p.parse_args()
  print(f'train-step compile seconds, {args.width} width, batch 8 x 128, jax {jax.__version__}')
  print(f'{"layers":>6} {"scan":>7} {"unrolled":>9}')
  for n in (int(x) for x in args.layers.split(',')):
    scan = compile_seconds(BertConfig.from_preset(args.width, num_layers=n, scan_layers=True))
    unrolled = compile_seconds(BertConfig.from_preset(args.width, num_layers=n, scan_layers=False))
    print(f'{n:6d} {scan:7.1f} {unrolled:9.1f}', flush=True)


if __name__ == '__main__':
  main()
