r"""How much of the compiled step's speed the whole training loop keeps.

  .venv/bin/python benchmarks/loop_overhead.py [--before=/path/to/older/checkout] [--steps=400]
  .venv/bin/python benchmarks/loop_overhead.py --models=micro --steps=16 --rounds=1   # smoke

Per model: steps/s of `bert_jax.main` (the whole `train_and_evaluate` loop: tf.data reading
real TFRecords, host-to-device copies, metrics, progress, the final checkpoint) divided by the
steps/s of the bare compiled step on the same config, state and a batch already on the device.
The loop's rate is the mean of its logged windows after the first (which holds compilation).
Models: `micro`, BERT-tiny at batch 4 (a step of a few milliseconds on a 2-core CPU: how short
a TPU step is) and `tiny`, BERT-tiny at batch 32 (the demo's). `--before` runs the loop of
another checkout too (e.g. a git worktree of an older commit), interleaved with ours, each
against the same bare step. One device, 128 tokens, 20 predictions, vocab 2,000.

`--device_threads=1` gives XLA one thread (`--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1`, bare step and loop alike) and so leaves the other core to the
host: the split of a TPU VM, whose device computes apart from the host CPUs that read and
copy the next batch. With the default (0) the step takes every core and the host's work
competes with it, which no accelerator run sees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import harness

if __name__ == '__main__':
  harness.tuned_malloc()


def _device_threads_from_argv() -> int:
  for arg in sys.argv[1:]:
    if arg.startswith('--device_threads='):
      return int(arg.split('=', 1)[1])
  return 0


DEVICE_THREADS = _device_threads_from_argv()
XLA_FLAGS = ('--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'
             if DEVICE_THREADS == 1 else '')
os.environ['XLA_FLAGS'] = XLA_FLAGS  # before jax is imported: the bare step's threads too

import jax  # noqa: E402

from bert_jax.training import sharding as shd  # noqa: E402
from input_pipeline.pretrain import corpus, create_pretraining_data as cpd  # noqa: E402
from input_pipeline.pretrain.instances import MaskingConfig  # noqa: E402
from input_pipeline.tokenizer import WordPieceTokenizer  # noqa: E402

MODELS = {'micro': 4, 'tiny': 32}  # name -> global batch of BERT-tiny


def make_data(directory: str) -> str:
  docs = list(corpus.embedded_documents())[:3000]
  corpus.write_text_file(docs, os.path.join(directory, 'train.txt'))
  WordPieceTokenizer.train((s for d in docs for s in d), 2000, directory)
  cpd.run(cpd.Job(output_file=os.path.join(directory, 'train'), masking=MaskingConfig(128, 20),
                  vocab_file=os.path.join(directory, 'vocab.txt'),
                  input_file=os.path.join(directory, 'train.txt'), dupe_factor=2, num_shards=2))
  return os.path.join(directory, 'train-*')


def overrides(files: str, batch: int, steps: int) -> dict:
  return {'model.vocab_size': 2000, 'data.train_files': files, 'data.eval_files': '',
          'train.global_batch_size': batch, 'train.num_steps': steps,
          'train.log_every': max(steps // 8, 1), 'train.checkpoint_every': 10 * steps,
          'data.shuffle_buffer': 1000, 'mesh': (1, 1, 1)}


def bare_steps_per_second(files: str, batch: int, steps: int) -> float:
  """The configured run's step alone, back to back on one batch of its reader already on the
  device (harness.time_train_steps)."""
  config = harness.config('bert_tiny', **overrides(files, batch, steps))
  setup = harness.configured_setup(config, devices=jax.devices()[:1])
  on_device = shd.global_batch(next(harness.reader(config, files)), setup.mesh)
  run = harness.time_train_steps(setup, [on_device], steps=steps, warmup=5, back_to_back=True)
  return 1 / run.timing.median


def loop_steps_per_second(repo: str, files: str, batch: int, steps: int) -> float:
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, '-m', 'bert_jax.main', '--config=configs/bert_tiny.py',
           f'--workdir={workdir}'] + [f'--config.{k}={v}' for k, v in
                                      overrides(files, batch, steps).items()]
    harness.run(cmd, cwd=repo, env={'XLA_FLAGS': XLA_FLAGS, 'JAX_PLATFORMS': 'cpu',
                                    'TF_CPP_MIN_LOG_LEVEL': '2'})
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      rates = [r['train/steps_per_second'] for r in map(json.loads, f) if 'train/loss' in r]
  return statistics.mean(rates[1:])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--before', default='', help='another checkout whose loop to compare')
  parser.add_argument('--steps', type=int, default=400)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--models', default='micro,tiny')
  parser.add_argument('--device_threads', type=int, default=0, choices=(0, 1),
                      help='1: XLA on one thread, the other core left to the host')
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as data_dir:
    files = make_data(data_dir)
    loops = {'ours': harness.ROOT,
             **({'before': os.path.abspath(args.before)} if args.before else {})}
    print(harness.machine(), flush=True)
    for name in args.models.split(','):
      batch = MODELS[name]
      contenders = {'bare': lambda: bare_steps_per_second(files, batch, args.steps)}
      for label, repo in loops.items():  # interleaved: bare, ours, before, bare, ours, ...
        contenders[label] = lambda repo=repo: loop_steps_per_second(repo, files, batch,
                                                                    args.steps)
      rates = harness.interleave(contenders, args.rounds)
      bare = statistics.median(rates['bare'])
      threads = 'one XLA thread' if DEVICE_THREADS == 1 else 'XLA on every core'
      line = (f'{name} (BERT-tiny, batch {batch}, {threads}): bare step {1e3 / bare:.2f} ms '
              f'({bare:.1f}/s)')
      for label in loops:
        loop = statistics.median(rates[label])
        line += f'; {label} loop {loop:.1f}/s = {loop / bare:.3f} of bare'
      print(line, json.dumps({k: [round(x, 2) for x in v] for k, v in rates.items()}),
            flush=True)


if __name__ == '__main__':
  main()
