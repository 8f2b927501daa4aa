r"""bfloat16 against float32: train-step speed, and the loss curve of a real training run.

  python benchmarks/data_creation.py     # writes the real-corpus records trained on here
  python benchmarks/bf16.py [--sizes tiny,mini,small,base] [--steps 300]
  python benchmarks/bf16.py --sizes=tiny --timed_steps=2 --steps=0   # smoke: speed only

Speed: `benchmarks/train_step.py`'s step (configs/benchmarks.py's run of the size: seq 128;
batch 32, base 8) with `model.dtype` float32 and bfloat16 compute (params, softmax
statistics and logits stay float32), each against the matmul peak of its own dtype measured
in the same process. Loss: BERT-tiny (vocab 30522) trained from the
same seed on the same real-corpus records in float32 and in bf16 through `bert_jax.main`;
losses every 25 steps side by side and a PNG of both curves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import harness

if __name__ == '__main__':
  harness.tuned_malloc()

from train_step import bench  # noqa: E402


def speed(sizes, steps: int):
  def timed(size, dtype):
    return bench(harness.config('benchmarks', size, **{'model.dtype': dtype}), steps=steps)

  print(harness.machine())
  print('| size (batch) | f32 tokens/s | bf16 tokens/s | bf16 / f32 | f32 MFU | bf16 MFU '
        '(bf16 peak) |')
  print('| --- | ---: | ---: | ---: | ---: | ---: |')
  for size in sizes:
    f32, bf16 = timed(size, 'float32'), timed(size, 'bfloat16')
    print(f'| {size} ({f32["batch"]}) | {f32["tokens_per_s"]:,.0f} | {bf16["tokens_per_s"]:,.0f} '
          f'| {bf16["tokens_per_s"] / f32["tokens_per_s"]:.2f}x | {f32["mfu"]:.1%} | '
          f'{bf16["mfu"]:.1%} ({bf16["peak_gflops"]:.0f} GFLOP/s) |', flush=True)


def train(dtype: str, workdir: str, data: str, steps: int) -> list[dict]:
  harness.run(
      [sys.executable, '-m', 'bert_jax.main', '--config=configs/bert_tiny.py',
       f'--workdir={workdir}', f'--config.data.train_files={data}',
       '--config.model.vocab_size=30522', f'--config.model.dtype={dtype}',
       f'--config.train.num_steps={steps}', '--config.train.log_every=25',
       '--config.train.eval_every=0', f'--config.train.checkpoint_every={steps}',
       '--config.optimizer.warmup_steps=50'],
      cwd=harness.ROOT, env={'TF_CPP_MIN_LOG_LEVEL': '3'})
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r for r in map(json.loads, f) if 'train/loss' in r]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='tiny,mini,small,base')
  parser.add_argument('--steps', type=int, default=300, help='training steps of the loss '
                      'curves; 0: speed only')
  parser.add_argument('--timed_steps', type=int, default=10, help='steps timed per speed figure')
  parser.add_argument('--data', default='/tmp/bench_data_creation/ours_128')
  parser.add_argument('--out', default='/tmp/bench_bf16')
  args = parser.parse_args()
  if args.sizes:
    speed(args.sizes.split(','), args.timed_steps)
  # A finished run is not retrained: bert_jax.main resumes at its last step and exits.
  if not args.steps:
    return
  curves = {dtype: train(dtype, os.path.join(args.out, dtype), args.data, args.steps)
            for dtype in ('float32', 'bfloat16')}
  print('\n| step | f32 loss | bf16 loss | f32 MLM acc | bf16 MLM acc |')
  print('| ---: | ---: | ---: | ---: | ---: |')
  for a, b in zip(curves['float32'], curves['bfloat16']):
    print(f'| {a["step"]} | {a["train/loss"]:.4f} | {b["train/loss"]:.4f} | '
          f'{a["train/mlm_accuracy"]:.4f} | {b["train/mlm_accuracy"]:.4f} |')
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  for dtype, rows in curves.items():
    plt.plot([r['step'] for r in rows], [r['train/loss'] for r in rows], label=dtype)
  plt.xlabel('step')
  plt.ylabel('train loss (MLM + NSP)')
  plt.legend()
  plt.title('BERT-tiny, real corpus, float32 vs bf16')
  plt.savefig(os.path.join(args.out, 'bf16_loss.png'), dpi=100)
  print(f'\nplot: {os.path.join(args.out, "bf16_loss.png")}')


if __name__ == '__main__':
  main()
