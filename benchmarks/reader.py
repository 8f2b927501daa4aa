r"""tf.data reader throughput (examples/s) against what the tiny model's train step consumes.

  python benchmarks/data_creation.py          # writes the records read here
  python benchmarks/reader.py [--data /tmp/bench_data_creation] [--seconds 5]
  python benchmarks/reader.py --seconds=0.5   # smoke

Reads the real-corpus records (seq 128 unpacked, seq 512 unpacked and stored-packed) through
the run's own reader (`input_pipeline.pretrain.dataset.reader_config` of
configs/benchmarks.py's tiny run with the `data.*` fields of each row set) in training mode:
plain, with dynamic masking, with on-the-fly packing, with both, batch 32, after a warm-up of
20 batches, for --seconds each (harness.timed). The tiny model's configured step (benchmarks/train_step.py: batch 32,
seq 128, float32) is timed in the same process for the consumption figure; the reader runs
with all cores here, and with `data.threads=1` (what it gets when XLA holds the other core).
"""

from __future__ import annotations

import argparse
import os

import harness

if __name__ == '__main__':
  harness.tuned_malloc()

VOCAB = os.path.join(harness.ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')


def examples_per_second(config, files: str, seconds: float) -> float:
  batches = harness.reader(config, files)

  def examples(_):
    batch = next(batches)
    if 'next_sentence_weights' in batch:  # packed: count instances, not rows
      return int(batch['next_sentence_weights'].sum())
    return int(batch['input_mask'].any(axis=1).sum())

  timing = harness.timed(examples, seconds=seconds, warmup=20, sync=lambda n: n)
  return sum(timing.results) / sum(timing.values)


def tiny_step_examples_per_second() -> float:
  from train_step import bench  # pylint: disable=g-import-not-at-top
  r = bench(harness.config('benchmarks', 'tiny'))
  return r['batch'] / r['step_s']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data', default='/tmp/bench_data_creation')
  parser.add_argument('--seconds', type=float, default=5.0)
  args = parser.parse_args()
  d = lambda name: os.path.join(args.data, name)  # noqa: E731
  seq512 = {'data.max_seq_length': 512, 'data.max_predictions_per_seq': 80}
  masking, packing = {'data.dynamic_masking': True}, {'data.pack': True}
  runs = [  # (name, files, data fields)
      ('128 plain', d('ours_128'), {}),
      ('128 dynamic masking', d('ours_128'), masking),
      ('128 dynamic whole-word masking', d('ours_128'),
       {**masking, 'data.whole_word_masking': True}),
      ('128 packing on the fly', d('ours_128'), packing),
      ('128 dynamic masking + packing', d('ours_128'), {**masking, **packing}),
      ('512 plain', d('ours_512'), seq512),
      ('512 dynamic masking + packing', d('ours_512'), {**seq512, **masking, **packing}),
      ('512 stored packed rows', d('ours_packed_512'), {**seq512, 'data.packed': True}),
  ]
  step = tiny_step_examples_per_second()
  print(harness.machine())
  print(f'tiny train step (batch 32, seq 128, f32) consumes {step:,.0f} examples/s\n')
  print('| reader (batch 32) | all cores: examples/s | x tiny step | 1 thread: examples/s | '
        'x tiny step |')
  print('| --- | ---: | ---: | ---: | ---: |')
  for name, files, fields in runs:
    config = lambda threads: harness.config('benchmarks', 'tiny', **{  # noqa: E731
        'data.vocab_file': VOCAB, 'data.threads': threads, **fields})
    many = examples_per_second(config(0), files, args.seconds)
    one = examples_per_second(config(1), files, args.seconds)
    print(f'| {name} | {many:,.0f} | {many / step:.0f}x | {one:,.0f} | {one / step:.0f}x |',
          flush=True)
  print('\n(examples = instances; a packed row holds several)')


if __name__ == '__main__':
  main()
