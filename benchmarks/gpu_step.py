r"""BERT-base and BERT-large pre-training steps on one GPU in bfloat16: ours against HF PyTorch.

  python benchmarks/gpu_step.py [--configs base:128:256,base:512:64,large:128:128,large:512:8]
  python benchmarks/gpu_step.py --configs=tiny:128:8 --steps=2 --warmup=1 --sides=ours  # smoke

Ours is the configured run's step (configs/benchmarks.py's recipe of the size, built by the run
setup of benchmarks/harness.py: adamw_bert with the BERT schedule and clipping to norm 1.0, the
default sharding rules) with `model.dtype=bfloat16` and its layers unrolled
(`model.scan_layers=False`, what GPU runs should use; `--scanned` for the default layout).
Per config (size:seq:batch), in this order, each in this one process: ours as a bare step (the
compiled train step on a batch already on the device, back to back, one sync at the end),
ours host-fed (a fresh numpy batch copied to the device every step and the step's metrics read
one step behind: the transfer and metric pattern of bert_jax.pretrain.run's loop, without its
tf.data reader, which the GPU image lacks), and HuggingFace PyTorch `BertForPreTraining` (bf16
autocast over float32 weights, fused AdamW with gradients clipped to norm 1.0 as HF's Trainer
does by default, SDPA attention, the same numpy batch). All sides: mixed precision (float32
weights and optimizer, bfloat16 matmuls), lr 1e-4, weight decay 0.01, dropout 0.1, 20 masked
predictions per 128 tokens (80 per 512), no padding. Step time = wall time of `--steps` steps
after `--warmup`, divided by the steps (harness.timed, back to back). MFU = the model FLOPs of
`bert_jax.model.flops.train_flops_per_step` (MLM head on the masked positions) / step time /
the GPU's bf16 dense peak (`flops.KNOWN_PEAKS`; H100 989 TFLOP/s).
"""

from __future__ import annotations

import argparse
import json
import re

import harness
import jax
import numpy as np

from bert_jax.model import flops
from bert_jax.model.encoder import BertConfig
from bert_jax.training import sharding as shd
from peers import full_labels  # HF's [B, S] MLM labels of our batch


def gpu_config(size: str, seq: int, batch: int, attention_dropout: float = 0.1,
               attention_impl: str | None = None, hidden_dropout: float = 0.1,
               scan_layers: bool = False):
  """configs/benchmarks.py's run of `size` in bf16 at `batch` x `seq` (20 predictions per 128
  tokens), with the dropouts, attention implementation and layer layout given."""
  return harness.config('benchmarks', size, **{
      'model.dtype': 'bfloat16', 'model.scan_layers': scan_layers,
      'model.attention_dropout': attention_dropout, 'model.hidden_dropout': hidden_dropout,
      'model.attention_impl': attention_impl, 'train.global_batch_size': batch,
      'data.max_seq_length': seq, 'data.max_predictions_per_seq': 20 * seq // 128})


def configured(config):
  """The config's run setup on one device and 4 random batches without padding (every side
  does the same work), on the host: (setup, host batches)."""
  setup = harness.configured_setup(config, devices=jax.devices()[:1])
  return setup, harness.synthetic_batches(setup, 4, pad_fraction=0.0, on_device=False)


def ours(setup, host: list[dict], steps: int, warmup: int) -> dict:
  """The bare step (batches already on the device, back to back, one sync at the end), then
  host-fed from where it left off (a fresh numpy batch copied to the device every step, step
  i-1's loss read after step i is dispatched: bert_jax.pretrain.run's transfer pattern)."""
  on_device = [shd.global_batch(b, setup.mesh) for b in host[:2]]
  bare = harness.time_train_steps(setup, on_device, steps=steps, warmup=warmup,
                                  back_to_back=True)
  state, previous = {'state': bare.state}, {'metrics': None}

  def fed(i):
    state['state'], metrics = bare.step(state['state'], shd.global_batch(host[i % len(host)],
                                                                         setup.mesh))
    if previous['metrics'] is not None:
      float(jax.device_get(previous['metrics']['loss']))
    previous['metrics'] = metrics
    return metrics

  fed_timing = harness.timed(fed, steps=steps, warmup=0, back_to_back=True)
  rows, seq, preds = harness.batch_geometry(setup)
  return dict(compile_s=bare.compile_s, bare_s=bare.timing.median,
              fed_s=fed_timing.median, loss=float(jax.device_get(previous['metrics']['loss'])),
              model_flops=flops.train_flops_per_step(setup.model_cfg, rows, seq, preds),
              **fused_attention(bare.step))


def fused_attention(compiled) -> dict:
  """What attention the compiled step runs: its cuDNN fused-attention calls (forward and
  backward; 0 where XLA's own core runs) and every custom-call target in its optimised HLO."""
  targets = re.findall(r'custom_call_target="([^"]+)"', compiled.as_text())
  fmha = [t for t in targets if 'fmha' in t]
  backward = sum('Backward' in t for t in fmha)
  return dict(cudnn_fmha_forward=len(fmha) - backward, cudnn_fmha_backward=backward,
              custom_calls=sorted(set(targets)))


def hf_step(size: str, host: list[dict], attention_dropout: float = 0.1,
            hidden_dropout: float = 0.1, device: str = 'cuda'):
  """HF PyTorch `BertForPreTraining` (SDPA attention, fused AdamW lr 1e-4 wd 0.01 after
  clipping to norm 1.0, bf16 autocast over float32 weights) and `host`'s first two batches on
  `device`: (step(batch) -> loss, the device batches)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers
  preset = BertConfig.from_preset(size)
  cfg = transformers.BertConfig(
      vocab_size=preset.vocab_size, hidden_size=preset.hidden_size,
      num_hidden_layers=preset.num_layers, num_attention_heads=preset.num_heads,
      intermediate_size=preset.intermediate_size, attn_implementation='sdpa',
      attention_probs_dropout_prob=attention_dropout, hidden_dropout_prob=hidden_dropout)
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(cfg).to(device).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

  def inputs(b):
    labels = full_labels(b)
    return {k: torch.from_numpy(np.asarray(v, np.int64)).to(device, non_blocking=True)
            for k, v in dict(input_ids=b['input_ids'], attention_mask=b['input_mask'],
                             token_type_ids=b['segment_ids'], labels=labels,
                             next_sentence_label=b['next_sentence_labels'][:, 0]).items()}

  def step(x):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16):
      loss = model(**x).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # HF Trainer's max_grad_norm
    opt.step()
    return loss

  return step, [inputs(b) for b in host[:2]]


def hf_torch(size: str, host: list[dict], steps: int, warmup: int,
             attention_dropout: float = 0.1, hidden_dropout: float = 0.1) -> dict:
  step, device_batches = hf_step(size, host, attention_dropout, hidden_dropout)
  return torch_timed(step, device_batches, steps, warmup)


def torch_timed(step, device_batches: list, steps: int, warmup: int) -> dict:
  """A PyTorch CUDA step timed as ours' bare step (the batches alternated, back to back, one
  sync at the end): its seconds, last loss and peak memory allocated."""
  import torch  # pylint: disable=g-import-not-at-top
  cuda = device_batches[0]['input_ids'].is_cuda  # else a CPU smoke run
  if cuda:
    torch.cuda.reset_peak_memory_stats()
  timing = harness.timed(lambda i: step(device_batches[i % len(device_batches)]), steps=steps,
                         warmup=warmup, back_to_back=True,
                         sync=lambda _: torch.cuda.synchronize() if cuda else None)
  return dict(step_s=timing.median, loss=timing.results[-1].item(),
              peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)


def parse_config(spec: str, flag: str) -> tuple[str, int, int]:
  """'base:128:256' -> ('base', 128, 256); anything else is a usage error naming `flag`."""
  try:
    size, seq, batch = spec.split(':')
    seq, batch = int(seq), int(batch)
    BertConfig.from_preset(size)
  except ValueError as e:
    raise SystemExit(f'{flag}: {spec!r} is not size:seq:batch with a known size, e.g. '
                     f'base:128:256 ({e})') from e
  return size, seq, batch


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--configs', default='base:128:256,base:512:64,large:128:128,large:512:8')
  p.add_argument('--steps', type=int, default=20)
  p.add_argument('--warmup', type=int, default=5)
  p.add_argument('--sides', default='ours,hf_torch')
  p.add_argument('--attention_dropout', type=float, default=0.1, help='both sides')
  p.add_argument('--hidden_dropout', type=float, default=0.1, help='both sides')
  p.add_argument('--scanned', action='store_true',
                 help='ours: layers under nn.scan (the CPU/TPU default; on GPUs XLA copies the '
                 'stacked activations every step: ~1.5x slower at BERT-base 128)')
  p.add_argument('--attention_impl', default=None,
                 help="ours: jax.nn.dot_product_attention's implementation, e.g. cudnn "
                 '(used only where attention dropout is 0)')
  args = p.parse_args()
  kind = jax.devices()[0].device_kind
  peak = flops.peak_flops_per_device()
  print(harness.machine())
  print(f'device {kind}, bf16 dense peak {peak / 1e12:.0f} TFLOP/s, jax {jax.__version__}, '
        f'attention dropout {args.attention_dropout}, hidden dropout {args.hidden_dropout}, '
        f'ours scan_layers {args.scanned}, attention_impl '
        f'{args.attention_impl}, PRNG {jax.config.jax_default_prng_impl}', flush=True)
  print('| model | seq | batch | ours bare step | ours host-fed / bare | HF PyTorch step | '
        'ours vs HF (tokens/s) | MFU ours | MFU HF |')
  print('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |', flush=True)
  for spec in args.configs.split(','):
    size, seq, batch = parse_config(spec, '--configs')
    setup, host = configured(gpu_config(size, seq, batch, args.attention_dropout,
                                        args.attention_impl, args.hidden_dropout, args.scanned))
    try:
      r = ours(setup, host, args.steps, args.warmup)
    except jax.errors.JaxRuntimeError as e:  # out of memory: say so, go on with the next
      print(f'| BERT-{size} | {seq} | {batch} | {str(e).splitlines()[0][:120]} |', flush=True)
      continue
    h = (hf_torch(size, host, args.steps, args.warmup, args.attention_dropout, args.hidden_dropout)
         if 'hf_torch' in args.sides else None)
    if h:
      import torch  # pylint: disable=g-import-not-at-top
      torch.cuda.empty_cache()  # the next config's JAX arrays need the memory
    mfu = lambda s: r['model_flops'] / s / peak  # noqa: E731
    hf = (f'{1e3 * h["step_s"]:.1f} ms | {h["step_s"] / r["bare_s"]:.2f}x | {mfu(r["bare_s"]):.1%}'
          f' | {mfu(h["step_s"]):.1%}') if h else 'n/a | n/a | ' + f'{mfu(r["bare_s"]):.1%} | n/a'
    print(f'| BERT-{size} | {seq} | {batch} | {1e3 * r["bare_s"]:.1f} ms | '
          f'{r["bare_s"] / r["fed_s"]:.3f} | {hf} |', flush=True)
    print(json.dumps({'config': spec, **r, **({'hf_step_s': h['step_s']} if h else {})}),
          flush=True)


if __name__ == '__main__':
  main()
