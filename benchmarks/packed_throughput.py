r"""Training on packed 512-token rows against unpacked rows of the same real corpus.

  python benchmarks/data_creation.py      # writes ours_512 and ours_packed_512
  python benchmarks/packed_throughput.py [--sizes tiny,mini] [--batch 8]

Real batches from the reader (seq 512, 80 predictions, batch 8 rows); the same train step
(forward, backward, AdamW) on unpacked rows and on packed rows (K = 3, block-diagonal
attention, positions restarting per instance); median over 10 batches after 3 warm-up.
The figure of merit is non-padding tokens per second: the tokens that carry training signal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from bert_jax.training import optim, sharding as shd  # noqa: E402
from bert_jax.pretrain import step as ts
from bert_jax.model.encoder import BertConfig  # noqa: E402
from input_pipeline.pretraining import dataset as data_lib  # noqa: E402


def run(size: str, files: str, packed: bool, batch: int, steps: int = 10, warmup: int = 3):
  cfg = BertConfig.from_preset(size, vocab_size=30522)
  mesh = shd.make_mesh((1, 1, 1), jax.devices()[:1])
  schedule = optim.learning_rate_schedule('constant', 1e-4, 0, 1000)
  tx = optim.make_optimizer('adamw', schedule)
  shardings = ts.state_shardings(cfg, tx, mesh, shd.DEFAULT_RULES)
  state = ts.create_train_state(cfg, tx, 0, shardings)
  step = ts.jit_train_step(cfg, tx, schedule, shardings, mesh, shd.DEFAULT_RULES)
  reader = data_lib.ReaderConfig(files=files, batch_size=batch, max_seq_length=512,
                                 max_predictions_per_seq=80, packed=packed, seed=0)
  it = data_lib.DataIterator(data_lib.make_dataset(reader, training=True))
  batches = [next(it) for _ in range(warmup + steps)]
  times, tokens = [], []
  for i, b in enumerate(batches):
    device_batch = shd.global_batch(b, mesh)
    start = time.perf_counter()
    state, metrics = step(state, device_batch)
    jax.block_until_ready(metrics['loss'])
    if i >= warmup:
      times.append(time.perf_counter() - start)
      tokens.append(int(b['input_mask'].sum()))
  seconds = statistics.median(times)
  return {'step_s': seconds, 'tokens_per_s': statistics.mean(tokens) / seconds,
          'padding': 1 - statistics.mean(tokens) / (batch * 512)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='tiny,mini')
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--data', default='/tmp/bench_data_creation')
  args = parser.parse_args()
  print('| size (batch 8 x 512) | unpacked: padding, step ms, real tokens/s | packed: padding, '
        'step ms, real tokens/s | packed / unpacked |')
  print('| --- | --- | --- | ---: |')
  for size in args.sizes.split(','):
    plain = run(size, os.path.join(args.data, 'ours_512'), False, args.batch)
    packed = run(size, os.path.join(args.data, 'ours_packed_512'), True, args.batch)
    print(f'| {size} | {plain["padding"]:.1%}, {plain["step_s"] * 1e3:.0f}, '
          f'{plain["tokens_per_s"]:,.0f} | {packed["padding"]:.1%}, {packed["step_s"] * 1e3:.0f}, '
          f'{packed["tokens_per_s"]:,.0f} | '
          f'{packed["tokens_per_s"] / plain["tokens_per_s"]:.2f}x |',
          flush=True)


if __name__ == '__main__':
  main()
