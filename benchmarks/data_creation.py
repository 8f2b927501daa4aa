r"""Data creation against google-research/bert's create_pretraining_data.py, one run.

  sudo apt-get install -y bible-kjv && python benchmarks/real_corpus.py --repeat 4
  python benchmarks/data_creation.py [--reference_dir DIR]

The reference is google-research/bert's own code as published on PyPI (`bert-tensorflow==1.0.4`,
already written against `tensorflow.compat.v1`); it is fetched with `pip download` into
`--reference_dir` when that holds no copy, and never committed here. Both sides run as fresh
processes with the same corpus, vocab (bert-base-uncased), flags and `--dupe_factor`, pinned to
one core (`taskset -c 0`) for the per-core figures; wall time includes start-up and imports.
Peak RSS is the largest resident set of any process of the run (`wait4` rusage).
Then: the statistics of both outputs side by side, 1 worker on 1 core vs 2 workers on 2 cores
(2.5M words), memory at 1M vs 10M words, and
padding at 512 before and after packing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import zipfile

import harness

ROOT = harness.ROOT
VOCAB = os.path.join(ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')


def fetch_reference(directory: str) -> str:
  if not os.path.exists(os.path.join(directory, 'bert', 'create_pretraining_data.py')):
    os.makedirs(directory, exist_ok=True)
    harness.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '-q',
                 'bert-tensorflow==1.0.4', '-d', directory])
    with zipfile.ZipFile(glob.glob(os.path.join(directory, 'bert_tensorflow-*.whl'))[0]) as z:
      z.extractall(directory)
  return directory


def timed(cmd: list[str], env: dict | None = None, pin: bool = True) -> dict:
  """Run to completion (harness.run): wall seconds and peak RSS (MiB) of the process tree's
  largest member; pinned to core 0 with `pin`."""
  r = harness.run((['taskset', '-c', '0'] if pin else []) + cmd,
                  env={'TF_CPP_MIN_LOG_LEVEL': '3', **(env or {})})
  return {'seconds': r.seconds, 'peak_rss_mib': r.peak_rss_mib, 'log': r.stdout + r.stderr}


def reference_run(ref_dir, corpus, out, seq, preds, dupe):
  r = timed([sys.executable, '-m', 'bert.create_pretraining_data', f'--input_file={corpus}',
             f'--output_file={out}', f'--vocab_file={VOCAB}', '--do_lower_case',
             f'--max_seq_length={seq}', f'--max_predictions_per_seq={preds}',
             f'--dupe_factor={dupe}', '--random_seed=12345'],
            env={'PYTHONPATH': ref_dir, 'CUDA_VISIBLE_DEVICES': ''})
  r['instances'] = count_records(out)
  return r


def count_records(path: str) -> int:
  """TFRecord framing walked without TensorFlow: importing it here would bloat this process,
  and every child forked from it starts with (and reports) that memory."""
  n = 0
  with open(path, 'rb') as f:
    while header := f.read(12):
      f.seek(int.from_bytes(header[:8], 'little') + 4, os.SEEK_CUR)
      n += 1
  return n


def our_run(corpus, out, seq, preds, dupe, workers=1, extra=()):
  shards = 4 if workers > 1 else 1
  r = timed([sys.executable, '-m', 'input_pipeline.pretrain.create_pretraining_data',
             f'--input_file={corpus}', f'--output_file={out}', f'--vocab_file={VOCAB}',
             '--do_lower_case', f'--max_seq_length={seq}', f'--max_predictions_per_seq={preds}',
             f'--dupe_factor={dupe}', '--random_seed=12345', f'--num_workers={workers}',
             f'--num_shards={shards}', *extra],
            env={'PYTHONPATH': ROOT}, pin=workers == 1)
  r['stats'] = json.load(open(out + '.stats.json'))
  r['instances'] = r['stats']['instances']
  return r


def _records(pattern):
  from input_pipeline.tf_data import tf  # pylint: disable=g-import-not-at-top
  for path in sorted(glob.glob(pattern)):
    for raw in tf.data.TFRecordDataset(path):
      yield tf.train.Example.FromString(raw.numpy()).features.feature


def record_stats(pattern: str, seq: int) -> dict:
  """The stats JSON's fields, measured from any BERT TFRecords (the reference's too)."""
  n = tokens = masked = mask = kept = rand = nsp = 0
  for f in _records(pattern):
    ids = f['input_ids'].int64_list.value
    length = sum(f['input_mask'].int64_list.value)
    w = f['masked_lm_weights'].float_list.value
    pos = f['masked_lm_positions'].int64_list.value
    lab = f['masked_lm_ids'].int64_list.value
    for p, l, weight in zip(pos, lab, w):
      if weight > 0:
        masked += 1
        mask += ids[p] == 103
        kept += ids[p] == l
        rand += ids[p] not in (103, l)
    n, tokens = n + 1, tokens + length
    nsp += f['next_sentence_labels'].int64_list.value[0]
  return {'instances': n, 'masked_fraction': masked / tokens,
          'mask': mask / masked, 'random': rand / masked, 'kept': kept / masked,
          'nsp_random_next_fraction': nsp / n, 'padding_fraction': 1 - tokens / (n * seq),
          'tokens_per_instance': tokens / n}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--corpus_dir', default='/tmp/bench_corpus')
  parser.add_argument('--reference_dir', default=os.path.expanduser('~/.cache/bert_jax/reference'))
  parser.add_argument('--out', default='/tmp/bench_data_creation')
  parser.add_argument('--dupe_factor', type=int, default=10)
  args = parser.parse_args()
  ref_dir = fetch_reference(args.reference_dir)
  os.makedirs(args.out, exist_ok=True)
  small = os.path.join(args.corpus_dir, 'real_1m.txt')
  whole = os.path.join(args.corpus_dir, 'real.txt')
  big = os.path.join(args.corpus_dir, 'real_x4.txt')
  o = lambda name: os.path.join(args.out, name)  # noqa: E731
  results = {}
  print(harness.machine())
  print('| run | instances | seconds | instances/s | peak RSS MiB |')
  print('| --- | ---: | ---: | ---: | ---: |')

  def show(name, r):
    results[name] = {k: v for k, v in r.items() if k != 'log'}
    print(f'| {name} | {r["instances"]:,} | {r["seconds"]:.1f} | '
          f'{r["instances"] / r["seconds"]:,.0f} | {r["peak_rss_mib"]:,.0f} |', flush=True)

  for seq, preds in ((128, 20), (512, 80)):
    show(f'reference {seq}, 1 core', reference_run(ref_dir, small, o(f'ref_{seq}'), seq, preds,
                                                   args.dupe_factor))
    show(f'ours {seq}, 1 worker, 1 core', our_run(small, o(f'ours_{seq}'), seq, preds,
                                                  args.dupe_factor))
    show(f'ours {seq}, 2.5M words, 1 worker', our_run(whole, o(f'oursw1_{seq}'), seq, preds,
                                                      args.dupe_factor, workers=1))
    show(f'ours {seq}, 2.5M words, 2 workers', our_run(whole, o(f'oursw2_{seq}'), seq, preds,
                                                       args.dupe_factor, workers=2))
  show('ours 128, 10M words, 1 core', our_run(big, o('ours_big'), 128, 20, args.dupe_factor))
  show('ours 512 packed, 1 core', our_run(small, o('ours_packed_512'), 512, 80,
                                          args.dupe_factor, extra=['--pack']))

  for seq in (128, 512):
    ref = results[f'reference {seq}, 1 core']
    r = ref['instances'] / ref['seconds']
    u = (results[f'ours {seq}, 1 worker, 1 core']['instances']
         / results[f'ours {seq}, 1 worker, 1 core']['seconds'])
    w1 = results[f'ours {seq}, 2.5M words, 1 worker']
    w2 = results[f'ours {seq}, 2.5M words, 2 workers']
    print(f'seq {seq}: ours / reference per core {u / r:.2f}x; 2 workers / 1 worker '
          f'{w1["seconds"] / w2["seconds"]:.2f}x')

  print('\n| statistic (seq 128) | reference | ours |')
  print('| --- | ---: | ---: |')
  ref, ours = record_stats(o('ref_128'), 128), record_stats(o('ours_128'), 128)
  results['stats_128'] = {'reference': ref, 'ours': ours}
  for key in ref:
    print(f'| {key} | {ref[key]:.4f} | {ours[key]:.4f} |')
  packed = results['ours 512 packed, 1 core']['stats']
  print(f'\nseq 512 padding: unpacked {packed["padding_fraction_unpacked"]:.4f}, packed '
        f'{packed["padding_fraction"]:.4f} (K={packed["max_instances_per_row"]}, '
        f'{packed["instances"]:,} instances in {packed["rows"]:,} rows)')
  with open(o('results.json'), 'w') as f:
    json.dump(results, f, indent=2, default=str)


if __name__ == '__main__':
  main()
