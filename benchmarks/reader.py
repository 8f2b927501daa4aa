r"""tf.data reader throughput (examples/s) against what the tiny model's train step consumes.

  python benchmarks/data_creation.py          # writes the records read here
  python benchmarks/reader.py [--data /tmp/bench_data_creation]

Reads the real-corpus records (seq 128 unpacked, seq 512 unpacked and stored-packed) through
`make_dataset` in training mode: plain, with dynamic masking, with on-the-fly packing, with both,
batch 32, after a warm-up of 20 batches, for --seconds each. The tiny model's step (batch 32,
seq 128, float32) is timed in the same process for the consumption figure; the reader runs
with all cores here, and with `threads=1` (what it gets when XLA holds the other core).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from input_pipeline.pretraining import dataset as data_lib  # noqa: E402

VOCAB = os.path.join(ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')


def examples_per_second(cfg: data_lib.ReaderConfig, seconds: float) -> float:
  it = data_lib.DataIterator(data_lib.make_dataset(cfg, training=True))
  for _ in range(20):
    next(it)
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    batch = next(it)
    if 'next_sentence_weights' in batch:  # packed: count instances, not rows
      n += int(batch['next_sentence_weights'].sum())
    else:
      n += int(batch['input_mask'].any(axis=1).sum())
  return n / (time.perf_counter() - start)


def tiny_step_examples_per_second() -> float:
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from train_step import bench  # pylint: disable=g-import-not-at-top
  r = bench('tiny', 'float32')
  return r['batch'] / r['step_s']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data', default='/tmp/bench_data_creation')
  parser.add_argument('--seconds', type=float, default=5.0)
  args = parser.parse_args()
  d = lambda name: os.path.join(args.data, name)  # noqa: E731
  base128 = dict(files=d('ours_128'), batch_size=32, vocab_file=VOCAB)
  base512 = dict(files=d('ours_512'), batch_size=32, max_seq_length=512,
                 max_predictions_per_seq=80, vocab_file=VOCAB)
  runs = [
      ('128 plain', base128),
      ('128 dynamic masking', {**base128, 'dynamic_masking': True}),
      ('128 dynamic whole-word masking', {**base128, 'dynamic_masking': True,
                                          'whole_word_masking': True}),
      ('128 packing on the fly', {**base128, 'pack': True}),
      ('128 dynamic masking + packing', {**base128, 'dynamic_masking': True, 'pack': True}),
      ('512 plain', base512),
      ('512 dynamic masking + packing', {**base512, 'dynamic_masking': True, 'pack': True}),
      ('512 stored packed rows', {**base512, 'files': d('ours_packed_512'), 'packed': True}),
  ]
  step = tiny_step_examples_per_second()
  print(f'tiny train step (batch 32, seq 128, f32) consumes {step:,.0f} examples/s\n')
  print('| reader (batch 32) | all cores: examples/s | x tiny step | 1 thread: examples/s | '
        'x tiny step |')
  print('| --- | ---: | ---: | ---: | ---: |')
  for name, kw in runs:
    many = examples_per_second(data_lib.ReaderConfig(**kw), args.seconds)
    one = examples_per_second(data_lib.ReaderConfig(**kw, threads=1), args.seconds)
    print(f'| {name} | {many:,.0f} | {many / step:.0f}x | {one:,.0f} | {one / step:.0f}x |',
          flush=True)
  print('\n(examples = instances; a packed row holds several)')


if __name__ == '__main__':
  main()
