r"""Attention kernels on one GPU in bfloat16: ours with `model.attention_impl=xla` and `=cudnn`
against HF PyTorch with sdpa, for ModernBERT-base at 1,024 tokens and BERT-large at 512, after
a parity check of the cuDNN kernel against the xla cores (benchmarks/cudnn_parity.py).

  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 590 python3 benchmarks/gpu_attention.py \
      [--configs=modern-base:1024:32,bert-large:512:32] [--impls=cudnn,xla] [--out=r.json]
  python benchmarks/gpu_attention.py --configs=bert-tiny:128:2,modern-tiny:512:2 --impls=xla \
      --steps=2 --warmup=1 --parity=off   # smoke, on CPU (HF on the CPU too)

What the GPU image lacks (python 3.12, no network), carried in `.whl/` (an ignored folder,
~150 KB): `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
manylinux2014_x86_64 ml_collections==1.1.0 google-crc32c==1.9.0 torch-optimi==0.2.1 -d .whl`,
unpacked there onto the path (wheels are zip files; no pip needed):
  python3 -c "import glob, zipfile; [zipfile.ZipFile(w).extractall('/tmp/whl') for w in \
      glob.glob('.whl/*.whl')]" && PYTHONPATH=$PWD:/tmp/whl ... python3 benchmarks/gpu_attention.py
TensorFlow is not needed: the run setup imports input_pipeline.pretrain.dataset for the batch
layout only, and where tensorflow is missing an empty module stands in for that import
(`without_tensorflow`, said on stdout); no tf.data reader runs here.

One process; per config (family-size:seq:batch) HF first (its memory is handed back before
JAX's pool grows), then ours once per implementation, all on the same numpy batches (no
padding). Each side's step and timing are benchmarks/gpu_step.py's: ours is the configured
run's step in bf16 with unrolled layers, timed bare (on-device batches back to back) and
host-fed; HF is timed back to back (`gpu_step.torch_timed`), bf16 autocast over float32
weights, attn_implementation='sdpa'. Compiles go to a persistent cache
(JAX_COMPILATION_CACHE_DIR, default /tmp/bert_jax_gpu_cache): a second run on the same machine
skips them.
- bert: configs/benchmarks.py's run (gpu_step.gpu_config) and `BertForPreTraining`
  (gpu_step.hf_step), hidden dropout 0.1 and attention dropout 0 on both sides: cuDNN's fused
  attention has no dropout, so with the default 0.1 the cudnn run would take the xla core.
- modern: configs/modern.py's phase-1 run of the size (StableAdamW, wsd schedule, no dropout,
  30% of the tokens predicted, batch warmup off) and `ModernBertForMaskedLM` with optimi's
  StableAdamW and sparse prediction (modern_peers.hf_step).
What each implementation ran is read off the compiled step (gpu_step.fused_attention: cuDNN
fused-attention calls forward and backward; with cudnn every layer should hold one of each:
24 for BERT-large, 22 for ModernBERT-base, its 14 local layers by chunks) and what
bert_jax/model/attention.py said while the side was set up and compiled (`attention_said`:
its fallbacks and how cuDNN was fed, INFO lines included).
tokens/s = rows x length / step; MFU = `flops.train_flops_per_step` (local layers count their
window, MLM head on the predicted positions) / step / the device's bf16 dense peak
(`flops.KNOWN_PEAKS`), the same model FLOPs for every side.

On one H200 (2026-11-27, benchmarks/RESULTS.md), before cuDNN took key lengths and local
chunks: ModernBERT-base alone took 3.6 minutes (compiles 36 s xla, 27 s cudnn); BERT-large's
HF and xla sides 2.9 minutes (xla compile 55 s), and its cudnn step (then a dense mask) had
not finished compiling and timing 126 s later. Hence the order: the parity check, ModernBERT,
then BERT-large with cudnn before xla; the JSON is written after every side.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
import types

import cudnn_parity
import gpu_step
import harness
import jax
import jaxlib
import modern_peers

from bert_jax.convert import hf_modern
from bert_jax.model import attention as attention_lib
from bert_jax.model import flops
from bert_jax.model.encoder import BertConfig
from configs import modern as modern_recipe

FAMILIES = ('bert', 'modern')


def parse(spec: str) -> tuple[str, str, int, int]:
  """'modern-base:1024:32' -> ('modern', 'base', 1024, 32); a usage error otherwise."""
  try:
    name, seq, batch = spec.split(':')
    family, size = name.split('-', 1)
    if family == 'bert':
      BertConfig.from_preset(size)
    elif family != 'modern' or size not in modern_recipe.SIZES:
      raise ValueError(f'family-size: bert-PRESET or modern-{"|".join(modern_recipe.SIZES)}')
    return family, size, int(seq), int(batch)
  except ValueError as e:
    raise SystemExit(f'--configs: {spec!r} is not family-size:seq:batch, e.g. '
                     f'bert-large:512:32 or modern-base:1024:32 ({e})') from e


def run_config(family: str, size: str, seq: int, batch: int, impl: str):
  """The config each side's step is built from: ours with attention implementation `impl`."""
  if family == 'bert':
    return gpu_step.gpu_config(size, seq, batch, attention_dropout=0.0, attention_impl=impl)
  return harness.config('modern', f'{size},phase1', **{
      'model.dtype': 'bfloat16', 'model.scan_layers': False, 'model.attention_impl': impl,
      'train.global_batch_size': batch, 'data.max_seq_length': seq,
      'data.max_predictions_per_seq': modern_recipe.max_predictions(seq),
      'train.batch_warmup_steps': 0})


def hf(family: str, size: str, setup, host: list, steps: int, warmup: int) -> dict:
  """HF PyTorch's step of the same model on `host`'s batches, timed on the GPU (the CPU where
  there is none: smoke runs)."""
  import torch  # pylint: disable=g-import-not-at-top
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  if family == 'bert':
    step, batches = gpu_step.hf_step(size, host, attention_dropout=0.0, device=device)
  else:
    g = {'hf': hf_modern.config_to_hf(setup.model_cfg)}
    step, batches, _ = modern_peers.hf_step(g, host, device, bf16=True)
  result = gpu_step.torch_timed(step, batches, steps, warmup)
  del step, batches
  if device == 'cuda':
    torch.cuda.empty_cache()  # JAX's pool grows next
  return result


def attempt(fn, *args) -> dict:
  """fn(*args), or what stopped it (out of memory, a kernel the stack lacks): one side's
  failure leaves the others' figures standing."""
  try:
    return fn(*args)
  except Exception as e:  # pylint: disable=broad-exception-caught
    return {'error': f'{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}'}


def write(path: str | None, info: dict, peak: float, args, results: list,
          parity: dict | None = None) -> None:
  if path:
    with open(path, 'w') as f:
      json.dump({'versions': info, 'peak_flops': peak, 'steps': args.steps,
                 'warmup': args.warmup, 'cudnn_parity': parity, 'results': results}, f,
                indent=1)


def without_tensorflow() -> None:
  """Where the image has no tensorflow: the run setup's modules imported with an empty
  `tensorflow` module standing in, then taken out of sys.modules again (transformers and the
  rest still see none installed). The setup imports the pretraining reader's module for its
  batch layout (input_pipeline/pretrain/dataset.py); its tf.data code never runs here."""
  if importlib.util.find_spec('tensorflow') is not None:
    return
  sys.modules['tensorflow'] = types.ModuleType('tensorflow')
  try:
    importlib.import_module('bert_jax.pretrain.step')
  finally:
    del sys.modules['tensorflow']
  print('tensorflow: not installed; an empty module stood in for the run setup\'s imports')


def versions() -> dict:
  import flax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  return {'python': platform.python_version(), 'jax': jax.__version__,
          'jaxlib': jaxlib.__version__, 'flax': flax.__version__, 'optax': optax.__version__,
          'torch': torch.__version__, 'cuda (torch)': torch.version.cuda,
          'cudnn (torch)': torch.backends.cudnn.version(),
          'transformers': transformers.__version__, 'device': jax.devices()[0].device_kind}


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--configs', default='modern-base:1024:32,bert-large:512:32')
  p.add_argument('--impls', default='cudnn,xla', help='ours: model.attention_impl values')
  p.add_argument('--sides', default='ours,hf_torch')
  p.add_argument('--steps', type=int, default=8)
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--parity', default='on', choices=('on', 'off'),
                 help='first check cuDNN against the xla cores (benchmarks/cudnn_parity.py)')
  p.add_argument('--out', help='write every figure here as JSON')
  args = p.parse_args()
  start = time.perf_counter()
  elapsed = lambda: f'[{time.perf_counter() - start:.0f} s]'  # noqa: E731
  without_tensorflow()
  jax.config.update('jax_compilation_cache_dir', os.environ.get(
      'JAX_COMPILATION_CACHE_DIR', '/tmp/bert_jax_gpu_cache'))
  specs = [parse(s) for s in args.configs.split(',')]
  impls = args.impls.split(',')
  peak = flops.peak_flops_per_device()
  info = versions()
  print(harness.machine())
  print(json.dumps(info))
  print(f'bf16 dense peak {peak / 1e12:.0f} TFLOP/s; {args.steps} steps after {args.warmup}',
        flush=True)
  parity = cudnn_parity.run_all() if args.parity == 'on' else None
  if parity is not None:
    print(f'{elapsed()} cudnn parity: ' + ', '.join(
        f'{name} {"ok" if r["ok"] else "FAILED"}' for name, r in parity.items()), flush=True)
  results = []
  for spec, (family, size, seq, batch) in zip(args.configs.split(','), specs):
    r = {'config': spec, 'ours': {}}
    for impl in impls:
      setup, host = gpu_step.configured(run_config(family, size, seq, batch, impl))
      r['model_flops'] = flops.train_flops_per_step(setup.model_cfg,
                                                    *harness.batch_geometry(setup))
      if 'hf_torch' in args.sides and 'hf' not in r:
        r['hf'] = attempt(hf, family, size, setup, host, args.steps, args.warmup)
        print(elapsed(), json.dumps({'config': spec, 'hf': r['hf']}), flush=True)
      attention_lib._logged.clear()  # what this side's attention said, INFO lines included
      r['ours'][impl] = attempt(gpu_step.ours, setup, host, args.steps, args.warmup)
      r['ours'][impl]['attention_said'] = sorted(attention_lib._logged)
      print(elapsed(), json.dumps({'config': spec, 'impl': impl, **r['ours'][impl]}), flush=True)
      # a process killed later keeps these
      write(args.out, info, peak, args, results + [r], parity)
    results.append(r)

  print('\n| config | side | step ms | tokens/s | MFU | speed / ours xla | attention that ran |')
  print('| --- | --- | ---: | ---: | ---: | ---: | --- |')
  for r, (_, _, seq, batch) in zip(results, specs):
    sides = [(f'ours {impl}', o, o.get('bare_s'), 'cuDNN fmha calls: {} fwd, {} bwd'.format(
        o.get('cudnn_fmha_forward'), o.get('cudnn_fmha_backward'))) for impl, o in
             r['ours'].items()]
    if 'hf' in r:
      sides.append(('HF PyTorch', r['hf'], r['hf'].get('step_s'), 'sdpa'))
    base = r['ours'].get('xla', {}).get('bare_s')
    for side, o, step_s, ran in sides:
      if 'error' in o:
        print(f'| {r["config"]} | {side} | {o["error"]} |')
        continue
      print(f'| {r["config"]} | {side} | {1e3 * step_s:.1f} | {seq * batch / step_s:,.0f} | '
            f'{r["model_flops"] / step_s / peak:.1%} | '
            f'{f"{base / step_s:.2f}x" if base else "n/a"} | {ran} |')


if __name__ == '__main__':
  main()
