r"""The data tool on Beam's DirectRunner against the local tool: speed, memory, identity.

  .venv/bin/python -m pip install -r requirements-beam.txt   # once
  python benchmarks/beam_data_creation.py [--mb 60] [--rounds 2] [--corpus 'DIR/*.txt']
  python benchmarks/beam_data_creation.py --memory 5,20 --files 4 --window_chars 100000

One corpus of at least 50 MB (default: the embedded standard-library corpus written over and
over into 16 files, or `--corpus`), both contenders as the user's command on it, interleaved
round by round on the same machine: `create_pretraining_data --num_workers=2` (the local tool,
2 processes) and the same command plus `--runner=DirectRunner` (2 SDK worker processes,
multi_processing). Both use all cores (2 here); per core = tokens / wall seconds / cores.
`--dupe_factor=1` (as for dynamic masking), so the tokens written are the corpus's tokens.

Reported: tokens/s per core both ways and their ratio, peak RSS of the largest local worker
and of the largest Beam SDK worker (VmHWM of each process of the run's tree, sampled from
/proc every 0.2 s; the driver apart: on DirectRunner both grow with the corpus, since it
hands each worker half of a stage's input as one bundle and keeps stage outputs in the runner
process), whether every shard and the stats JSON (timings aside)
are byte-identical, and a projection of the wall time for 100B tokens on N worker cores from
the Beam per-core figure: a projection (linear scaling, the local disk here; a fleet adds the
shuffle over the network and object-store I/O, and saves the start-up).

`--memory 5,20`: Beam alone at each corpus size (4x apart), the same files, window and shards:
peak RSS of the runner process, of the largest SDK worker and of all together. The pipeline
holds one window per worker and sends at most two windows' documents per unit through the
runner, so with units larger than `--window_chars` (real corpus files are) the figures should
stay flat while the corpus grows.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import harness

ROOT = harness.ROOT
VOCAB = os.path.join(ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')
TOOL = 'input_pipeline.pretrain.create_pretraining_data'


def make_corpus(directory: str, mb: float, files: int = 16) -> str:
  """The embedded corpus, repeated to `mb` MB over `files` files; its glob."""
  from input_pipeline.pretrain import corpus  # pylint: disable=g-import-not-at-top
  docs = list(corpus.embedded_documents())
  text = ''.join('\n'.join(d) + '\n\n' for d in docs).encode()
  os.makedirs(directory, exist_ok=True)
  per_file = int(mb * 1e6 / files) + 1
  for i in range(files):
    with open(os.path.join(directory, f'part-{i:03d}.txt'), 'wb') as f:
      written = 0
      while written < per_file:
        f.write(text)
        written += len(text)
  return os.path.join(directory, '*.txt')


def _hwm(pid: int) -> tuple[float, str]:
  try:
    with open(f'/proc/{pid}/status') as f:
      kb = next(int(l.split()[1]) for l in f if l.startswith('VmHWM:'))
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      cmd = f.read().replace(b'\0', b' ').decode(errors='replace')
    return kb / 1024, cmd
  except (OSError, StopIteration):
    return 0.0, ''


def _children(pid: int) -> list[int]:
  """Every descendant of `pid` (from /proc/*/stat: any thread may have started them)."""
  parents = {}
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          parents[int(entry)] = int(f.read().rsplit(')', 1)[1].split()[1])
      except (OSError, IndexError, ValueError):
        pass
  out, todo = [], [pid]
  while todo:
    p = todo.pop()
    kids = [c for c, parent in parents.items() if parent == p]
    out.extend(kids)
    todo.extend(kids)
  return out


def run_tool(args: list[str], output_file: str) -> dict:
  """The command to completion: seconds, its stats JSON, peak RSS (MiB) of driver and workers."""
  import subprocess  # pylint: disable=g-import-not-at-top
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', JAX_PLATFORMS='cpu')
  start = time.perf_counter()
  proc = subprocess.Popen([sys.executable, '-m', TOOL, *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  peaks: dict[int, tuple[float, str]] = {}
  done = threading.Event()

  def sample():
    while not done.is_set():
      for p in [proc.pid] + _children(proc.pid):
        mib, cmd = _hwm(p)
        if mib and mib >= peaks.get(p, (0,))[0]:
          peaks[p] = (mib, cmd)
      time.sleep(0.2)

  sampler = threading.Thread(target=sample)
  sampler.start()
  out, err = proc.communicate()
  seconds = time.perf_counter() - start
  done.set()
  sampler.join()
  if proc.returncode:
    raise RuntimeError(f'{TOOL} {" ".join(args)} exited {proc.returncode}:\n'
                       f'{err.decode(errors="replace")[-3000:]}')
  with open(output_file + '.stats.json') as f:
    stats = json.load(f)
  workers = [m for p, (m, cmd) in peaks.items() if p != proc.pid and 'python' in cmd]
  return {'seconds': seconds, 'stats': stats, 'driver_mib': peaks.get(proc.pid, (0.0,))[0],
          'worker_mib': max(workers, default=0.0), 'workers': len(workers),
          'total_mib': peaks.get(proc.pid, (0.0,))[0] + sum(workers)}


def digest(paths: list[str]) -> list[str]:
  out = []
  for p in paths:
    h = hashlib.sha256()
    with open(p, 'rb') as f:
      for chunk in iter(lambda: f.read(1 << 20), b''):
        h.update(chunk)
    out.append(h.hexdigest())
  return out


def memory_against_size(sizes_mb: list[float], args) -> None:
  """Beam on DirectRunner alone at each corpus size (same files, window, shards): peak RSS of
  the runner (the launching process) and of each SDK worker; bounded memory means the figures
  stay flat as the corpus grows."""
  rows = []
  for mb in sizes_mb:
    work = tempfile.mkdtemp(prefix='beam_mem_')
    try:
      pattern = make_corpus(os.path.join(work, 'corpus'), mb, args.files)
      out = os.path.join(work, 'out', 'train')
      res = run_tool([f'--input_file={pattern}', f'--output_file={out}', f'--vocab_file={VOCAB}',
                      f'--max_seq_length={args.seq}', '--max_predictions_per_seq=20',
                      '--dupe_factor=1', f'--num_shards={args.shards}',
                      f'--num_workers={args.workers}', f'--window_chars={args.window_chars}',
                      '--runner=DirectRunner', '--direct_running_mode=multi_processing'], out)
      corpus_mb = sum(os.path.getsize(p) for p in glob.glob(pattern)) / 1e6
      shard_mb = max(os.path.getsize(f) for f in res['stats']['files']) / 1e6
      rows.append({'corpus_mb': round(corpus_mb, 1), 'tokens': res['stats']['tokens'],
                   'largest_shard_mb': round(shard_mb, 1), 'seconds': round(res['seconds'], 1),
                   'runner_peak_mib': round(res['driver_mib']),
                   'worker_peak_mib': round(res['worker_mib']),
                   'runner_plus_workers_peak_mib': round(res['total_mib'])})
      print(json.dumps(rows[-1]), flush=True)
    finally:
      shutil.rmtree(work, ignore_errors=True)
  print(json.dumps({'machine': harness.machine(), 'files': args.files,
                    'window_chars': args.window_chars, 'shards': args.shards,
                    'workers': args.workers, 'runs': rows}, indent=2))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--mb', type=float, default=60)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--corpus', default=None, help='glob of reference-format text files')
  parser.add_argument('--shards', type=int, default=8)
  parser.add_argument('--workers', type=int, default=2)
  parser.add_argument('--seq', type=int, default=128)
  parser.add_argument('--files', type=int, default=16)
  parser.add_argument('--window_chars', type=int, default=1_000_000)
  parser.add_argument('--memory', default=None, help='comma-separated corpus sizes in MB: '
                      'only Beam, one run each, peak RSS against corpus size')
  args = parser.parse_args()
  if args.memory:
    memory_against_size([float(mb) for mb in args.memory.split(',')], args)
    return
  work = tempfile.mkdtemp(prefix='beam_bench_')
  try:
    pattern = args.corpus or make_corpus(os.path.join(work, 'corpus'), args.mb, args.files)
    corpus_mb = sum(os.path.getsize(p) for p in glob.glob(pattern)) / 1e6
    cores = os.cpu_count()
    common = [f'--input_file={pattern}', f'--vocab_file={VOCAB}', f'--max_seq_length={args.seq}',
              '--max_predictions_per_seq=20', '--dupe_factor=1', f'--num_shards={args.shards}',
              f'--num_workers={args.workers}', f'--window_chars={args.window_chars}']
    contenders = {
        'local': [],
        'beam': ['--runner=DirectRunner', '--direct_running_mode=multi_processing'],
    }
    results = {k: [] for k in contenders}
    identical = True
    for r in range(args.rounds):
      outs = {}
      for name, extra in contenders.items():
        out = os.path.join(work, f'{name}{r}', 'train')
        res = run_tool([f'--output_file={out}', *common, *extra], out)
        res['tokens_per_s_core'] = res['stats']['tokens'] / res['seconds'] / cores
        results[name].append(res)
        outs[name] = res['stats']
        print(f'round {r} {name}: {res["seconds"]:.1f} s, {res["stats"]["tokens"]:,} tokens, '
              f'{res["tokens_per_s_core"]:,.0f} tokens/s/core, driver {res["driver_mib"]:.0f} '
              f'MiB, largest of {res["workers"]} workers {res["worker_mib"]:.0f} MiB', flush=True)
      same_shards = digest(outs['local']['files']) == digest(outs['beam']['files'])
      strip = lambda s: {k: v for k, v in s.items()
                         if k not in ('seconds', 'instances_per_second', 'files')}
      same_stats = strip(outs['local']) == strip(outs['beam'])
      identical &= same_shards and same_stats
      print(f'round {r}: {len(outs["beam"]["files"])} shards byte-identical: {same_shards}; '
            f'stats equal: {same_stats}', flush=True)
      for name in contenders:
        shutil.rmtree(os.path.join(work, f'{name}{r}'))
    best = {k: max(v, key=lambda x: x['tokens_per_s_core']) for k, v in results.items()}
    beam_rate = best['beam']['tokens_per_s_core']
    summary = {
        'machine': harness.machine(), 'corpus_mb': round(corpus_mb, 1), 'cores': cores,
        'tokens': best['local']['stats']['tokens'],
        'local_tokens_per_s_core': round(best['local']['tokens_per_s_core']),
        'beam_tokens_per_s_core': round(beam_rate),
        'beam_over_local': round(beam_rate / best['local']['tokens_per_s_core'], 3),
        'local_seconds': [round(x['seconds'], 1) for x in results['local']],
        'beam_seconds': [round(x['seconds'], 1) for x in results['beam']],
        'local_worker_peak_mib': round(max(x['worker_mib'] for x in results['local'])),
        'beam_worker_peak_mib': round(max(x['worker_mib'] for x in results['beam'])),
        'beam_driver_peak_mib': round(max(x['driver_mib'] for x in results['beam'])),
        'byte_identical_all_rounds': identical,
        'projection_hours_100B_tokens': {
            n: round(100e9 / (beam_rate * n) / 3600, 1) for n in (64, 256, 1024)},
    }
    print(json.dumps(summary, indent=2))
  finally:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
  main()
