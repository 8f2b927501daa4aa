r"""Where the GPU time of one pre-training step goes: ours (JAX profiler) and HF PyTorch's.

  python benchmarks/gpu_profile.py --config=base:128:256 [--sides=ours,hf_torch] [--scanned]

The diagnostic behind benchmarks/gpu_step.py's gap: profiles `--steps` steps of each side on
the same batch and prints the GPU kernels grouped by kind (matmul, attention, fused
elementwise/reduction, copies, the rest) with their share of the device time, then the top
kernels by name. Ours: `jax.profiler.trace(..., create_perfetto_trace=True)` and its Chrome
trace JSON; HF: `torch.profiler`'s CUDA kernel events. Same recipe as gpu_step.py (bf16
mixed precision, AdamW, dropout 0.1, no padding).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

import harness
import jax

import gpu_step
from bert_jax.training import sharding as shd
from input_pipeline import fs

KINDS = [('matmul', re.compile(r'gemm|cutlass|matmul|sm90_xmma|sm80_xmma|ampere|hopper|nvjet',
                               re.I)),
         ('attention', re.compile(r'flash|fmha|cudnn|attention', re.I)),
         ('copy', re.compile(r'copy|memcpy|memset|transpose', re.I)),
         ('fused', re.compile(r'fusion|loop_|input_|reduce|elementwise|vectorized|triton',
                              re.I))]


def kind_of(name: str) -> str:
  for kind, pattern in KINDS:
    if pattern.search(name):
      return kind
  return 'other'


def report(side: str, kernels: dict[str, float], steps: int, step_s: float, top: int) -> None:
  total = sum(kernels.values())
  by_kind = collections.Counter()
  for name, us in kernels.items():
    by_kind[kind_of(name)] += us
  print(f'\n## {side}: {step_s * 1e3:.1f} ms/step wall, '
        f'{total / steps / 1e3:.1f} ms/step of GPU kernels, {len(kernels)} distinct kernels')
  for kind, us in by_kind.most_common():
    print(f'  {kind:10s} {us / steps / 1e3:8.2f} ms/step  {us / total:6.1%}')
  print(f'  top {top} kernels (ms/step, share):')
  for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]:
    print(f'    {us / steps / 1e3:7.2f}  {us / total:6.1%}  {name[:110]}')


def profile_ours(setup, host, steps, top, dump_hlo):
  on_device = [shd.global_batch(b, setup.mesh) for b in host[:2]]
  compiled, _ = harness.compile_train_step(setup, on_device[0])
  text = compiled.as_text()
  gemms = re.findall(r'custom_call_target="(__cublas[^"]*|__cudnn[^"]*)"', text)
  print(f'ours: {len(text.splitlines())} HLO lines, custom calls {collections.Counter(gemms)}, '
        f'while loops {text.count(" while(")}', flush=True)
  f32_dots = [l for l in text.splitlines() if '__cublas' in l and re.search(r'= \(?f32\[', l)]
  print(f'ours: cuBLAS calls with a float32 result: {len(f32_dots)}')
  for line in f32_dots[:12]:
    print('   ', line.strip()[:200])
  if dump_hlo:
    fs.write_text(dump_hlo, text)
  holder = {'state': setup.fresh_state()}

  def step(i):
    holder['state'], metrics = compiled(holder['state'], on_device[i % 2])
    return metrics

  harness.timed(step, steps=0, warmup=5)
  logdir = tempfile.mkdtemp(prefix='bert_jax_profile_')
  with jax.profiler.trace(logdir, create_perfetto_trace=True):
    step_s = harness.timed(step, steps=steps, warmup=0, back_to_back=True).median
  traces = glob.glob(os.path.join(logdir, '**', '*trace.json.gz'), recursive=True)
  if not traces:
    raise SystemExit(f'the JAX profiler wrote no *trace.json.gz under {logdir} (this jax may '
                     'lack create_perfetto_trace)')
  with gzip.open(traces[0]) as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  pids = {e['pid']: e['args'].get('name', '') for e in events
          if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  gpu_pids = {p for p, n in pids.items() if '/device:GPU' in n}
  tids = {(e['pid'], e['tid']): e['args'].get('name', '') for e in events
          if e.get('ph') == 'M' and e.get('name') == 'thread_name'}
  kernels = collections.Counter()
  for e in events:
    if e.get('ph') == 'X' and e.get('pid') in gpu_pids:
      lane = tids.get((e['pid'], e.get('tid')), '')
      if 'Stream' in lane or 'stream' in lane or not lane:
        kernels[e['name']] += float(e.get('dur', 0))
  if not kernels:
    print('ours: no GPU kernel events; process lanes:', sorted(set(pids.values()))[:20])
  report('ours', kernels, steps, step_s, top)


def profile_hf(size, host, steps, top):
  import torch  # pylint: disable=g-import-not-at-top
  from torch.profiler import ProfilerActivity, profile  # pylint: disable=g-import-not-at-top
  step_on, device_batches = gpu_step.hf_step(size, host)
  step = lambda i: step_on(device_batches[0])  # noqa: E731
  sync = lambda _: torch.cuda.synchronize()  # noqa: E731
  harness.timed(step, steps=0, warmup=5, sync=sync)
  with profile(activities=[ProfilerActivity.CUDA]) as prof:
    step_s = harness.timed(step, steps=steps, warmup=0, sync=sync, back_to_back=True).median
  kernels = collections.Counter()
  for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
      kernels[e.name] += e.device_time
  report('hf_torch', kernels, steps, step_s, top)


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--config', default='base:128:256')
  p.add_argument('--steps', type=int, default=10)
  p.add_argument('--top', type=int, default=25)
  p.add_argument('--sides', default='ours,hf_torch')
  p.add_argument('--dump_hlo', default='', help='write our optimized HLO text here (local or '
                 'gs://)')
  p.add_argument('--scanned', action='store_true', help='ours: layers under nn.scan '
                 '(default unrolled, as gpu_step.py)')
  args = p.parse_args()
  size, seq, batch = gpu_step.parse_config(args.config, '--config')
  setup, host = gpu_step.configured(gpu_step.gpu_config(size, seq, batch,
                                                        scan_layers=args.scanned))
  print(harness.machine())
  print(f'device {jax.devices()[0].device_kind}, jax {jax.__version__}, config {args.config}',
        flush=True)
  if 'ours' in args.sides:
    profile_ours(setup, host, args.steps, args.top, args.dump_hlo)
  if 'hf_torch' in args.sides:
    profile_hf(size, host, args.steps, args.top)


if __name__ == '__main__':
  main()
