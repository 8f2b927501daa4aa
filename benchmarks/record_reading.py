r"""Raw TFRecord reading: ours (byte-range chunks through input_pipeline/fs.py) vs TensorFlow's
`tf.data.TFRecordDataset`, locally and on gs:// (a GCS server on localhost), in one run.

  python benchmarks/record_reading.py [--rounds 3] [--seconds 4]
  python benchmarks/record_reading.py --rounds=1 --seconds=0.5   # smoke

Writes 128-token records of the embedded corpus (dupe factor 4) once to /tmp/bench_records,
copies them to a local fake-gcs-server, then alternates the readers for --rounds rounds and
prints the median records/s and MB/s of each. TensorFlow's reader cannot read the emulator's
gs:// at all (its GCS client has Google's endpoints compiled in), which is why ours exists; on
local files it is the peer to match. Both run through tf.data with the same parallelism.
"""

from __future__ import annotations

import argparse
import os
import statistics

import harness
from input_pipeline.tf_data import tf

from input_pipeline import fs
from input_pipeline.pretrain import corpus
from input_pipeline.pretrain import create_pretraining_data as cpd
from input_pipeline.pretrain import dataset as data_lib
from input_pipeline.pretrain.instances import MaskingConfig

gcs_server = harness.module_from_file(  # the tests' GCS server on localhost
    'gcs_server', os.path.join(harness.ROOT, 'tests', 'gcs_server.py'))

VOCAB = os.path.join(harness.ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')
DATA = '/tmp/bench_records'


def make_records() -> list[str]:
  if not fs.glob(f'{DATA}/train-*'):
    os.makedirs(DATA, exist_ok=True)
    corpus.write_text_file(corpus.embedded_documents(), f'{DATA}/corpus.txt')
    cpd.run(cpd.Job(output_file=f'{DATA}/train', masking=MaskingConfig(128, 20),
                    vocab_file=VOCAB, input_file=f'{DATA}/corpus.txt', dupe_factor=4,
                    num_shards=8, num_workers=2))
  return data_lib.list_files(f'{DATA}/train-*')


def ours(files: list[str]) -> tf.data.Dataset:
  chunks = data_lib.chunks(files, fs.sizes(files), 1 << 20)
  return data_lib.training_records(chunks, seed=0, process_index=0, process_count=1)


def theirs(files: list[str]) -> tf.data.Dataset:
  ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=0).repeat()
  return ds.interleave(tf.data.TFRecordDataset, cycle_length=8, block_length=1,
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def parsed(records: tf.data.Dataset) -> tf.data.Dataset:
  """What make_dataset does after reading (plain 128-token rows): shuffle, parse, batch 32."""
  cfg = data_lib.ReaderConfig(files='', batch_size=32)
  return records.shuffle(10_000, seed=1).map(
      data_lib._parse(cfg), tf.data.AUTOTUNE, deterministic=True).batch(32)  # pylint: disable=protected-access


def rate(ds: tf.data.Dataset, seconds: float) -> tuple[float, float]:
  """(records/s, MB/s) of a dataset of serialized records, or (rows/s, 0) of parsed batches."""
  it = iter((ds if isinstance(ds.element_spec, dict) else ds.batch(256)).prefetch(
      tf.data.AUTOTUNE))

  def one(_):  # (records, bytes) of the next batch
    batch = next(it)
    if isinstance(batch, dict):
      return len(batch['input_ids']), 0
    batch = batch.numpy()
    return len(batch), sum(map(len, batch))

  timing = harness.timed(one, seconds=seconds, warmup=5, sync=lambda r: r)
  elapsed = sum(timing.values)
  return (sum(r for r, _ in timing.results) / elapsed,
          sum(b for _, b in timing.results) / elapsed / 1e6)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--seconds', type=float, default=4.0)
  args = parser.parse_args()
  local = make_records()
  total = sum(fs.sizes(local)) / 1e6
  with gcs_server.running():
    gcs_fs, _ = fs._filesystem('gs://bench')  # pylint: disable=protected-access
    gcs_fs.mkdir('bench')
    remote = []
    for f in local:
      remote.append(f'gs://bench/records/{fs.basename(f)}')
      fs.write_bytes(remote[-1], fs.read_bytes(f))
    runs = {'TensorFlow TFRecordDataset, local': lambda: theirs(local),
            'ours, local': lambda: ours(local),
            'ours, gs:// (fake-gcs-server on localhost)': lambda: ours(remote),
            'TensorFlow + shuffle, parse, batch 32, local': lambda: parsed(theirs(local)),
            'ours + shuffle, parse, batch 32, local': lambda: parsed(ours(local))}
    results = harness.interleave(
        {name: (lambda make=make: rate(make(), args.seconds)) for name, make in runs.items()},
        args.rounds)
  print(harness.machine())
  print(f'{len(local)} files, {total:.1f} MB; median of {args.rounds} interleaved rounds of '
        f'{args.seconds:g} s\n')
  print('| reader | records/s | MB/s | vs TensorFlow, same stages |')
  print('| --- | ---: | ---: | ---: |')
  for name, values in results.items():
    peer = ('TensorFlow + shuffle, parse, batch 32, local' if 'parse' in name
            else 'TensorFlow TFRecordDataset, local')
    base = statistics.median(r for r, _ in results[peer])
    records = statistics.median(r for r, _ in values)
    mb = statistics.median(m for _, m in values)
    print(f'| {name} | {records:,.0f} | {mb:.1f} | {records / base:.2f}x |')


if __name__ == '__main__':
  main()
