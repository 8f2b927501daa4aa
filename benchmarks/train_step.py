r"""One training step (forward, backward, AdamW update) at seq 128 on this machine.

  .venv/bin/python benchmarks/train_step.py [--sizes tiny,mini,small,base] [--dtype float32]

Per size: compile seconds, median step time of 10 steps after 3 warm-up steps, tokens/s
(batch x 128 / step time) and MFU against a float32 (or bf16) matmul peak measured in the same
process. Batch 32 for tiny/mini/small, 8 for base (the peer benchmark's definition), vocab
30522 (`--vocab_size`), 20 MLM labels per row, ~10% padding, dropout 0.1.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.training import host_malloc  # noqa: E402  (re-executes with CPU malloc tuned, as the CLIs do)
if __name__ == '__main__':
  host_malloc.reexec_with_tuned_malloc()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.model import flops  # noqa: E402
from bert_jax.pretrain import step as ts, synthetic
from bert_jax.training import optim, sharding as shd
from bert_jax.model.encoder import BertConfig  # noqa: E402

BATCH = {'tiny': 32, 'mini': 32, 'small': 32, 'medium': 32, 'base': 8, 'large': 8}


def bench(size: str, dtype: str, seq: int = 128, preds: int = 20, steps: int = 10,
          warmup: int = 3, scan: bool = True, batch: int | None = None,
          vocab_size: int = 30522) -> dict:
  cfg = BertConfig.from_preset(size, dtype=dtype, scan_layers=scan, vocab_size=vocab_size)
  batch = batch or BATCH[size]
  mesh = shd.make_mesh((1, 1, 1), jax.devices()[:1])
  schedule = optim.learning_rate_schedule('constant', 1e-4, 0, 1000)
  tx = optim.make_optimizer('adamw', schedule)
  shardings = ts.state_shardings(cfg, tx, mesh, shd.DEFAULT_RULES)
  state = ts.create_train_state(cfg, tx, 0, shardings)
  step = ts.jit_train_step(cfg, tx, schedule, shardings, mesh, shd.DEFAULT_RULES)
  rng = np.random.default_rng(0)
  batches = [shd.global_batch(synthetic.random_batch(rng, batch, seq, preds, cfg.vocab_size), mesh)
             for _ in range(2)]
  t = time.perf_counter()
  with shd.activate(mesh, shd.DEFAULT_RULES):
    compiled = step.jitted.lower(state, batches[0]).compile()
  compile_s = time.perf_counter() - t
  times = []
  for i in range(warmup + steps):
    t = time.perf_counter()
    state, metrics = compiled(state, batches[i % 2])
    jax.block_until_ready(metrics['loss'])
    times.append(time.perf_counter() - t)
  median = statistics.median(times[warmup:])
  peak = flops.measured_matmul_peak(dtype=dtype)
  model_flops = flops.train_flops_per_step(cfg, batch, seq, preds)
  return dict(size=size, batch=batch, dtype=dtype, compile_s=compile_s, step_s=median,
              tokens_per_s=batch * seq / median, mfu=model_flops / median / peak,
              peak_gflops=peak / 1e9)


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--sizes', default='tiny,mini,small,base')
  p.add_argument('--dtype', default='float32')
  p.add_argument('--unrolled', action='store_true', help='layers unrolled instead of scanned')
  p.add_argument('--vocab_size', type=int, default=30522, help='8192: the CPU demo\'s')
  args = p.parse_args()
  print(f'jax {jax.__version__} on {jax.devices()[0].device_kind}, {os.cpu_count()} cores')
  print(f'{"size":6} {"batch":>5} {"compile s":>9} {"step ms":>8} {"tokens/s":>9} {"MFU":>6}')
  for size in args.sizes.split(','):
    r = bench(size, args.dtype, scan=not args.unrolled, vocab_size=args.vocab_size)
    print(f'{r["size"]:6} {r["batch"]:5d} {r["compile_s"]:9.1f} {1e3 * r["step_s"]:8.1f} '
          f'{r["tokens_per_s"]:9.0f} {r["mfu"]:6.1%}   (peak {r["peak_gflops"]:.0f} GFLOP/s)',
          flush=True)


if __name__ == '__main__':
  main()
