r"""Our train step against HuggingFace's BertForPreTraining (PyTorch) and FlaxBertForPreTraining.

  python benchmarks/peers.py --setup_flax_venv ~/.cache/bert_jax/hf_flax   # once
  python benchmarks/peers.py [--sizes tiny,mini,small,base] [--rounds 3]

The peer benchmark of the performance issue: configs tiny/mini/small at batch 32, base at
batch 8; vocab 30522, seq 128, ~10% padding at the end of each row, 20 MLM labels per row,
random NSP labels (`bert_jax.pretrain.synthetic.random_batch`, the same numpy seed for every side, so
identical data), dropout 0.1 in training mode, AdamW lr 1e-4 wd 0.01, float32; 3 warm-up
steps, then the median of 10 steps. Each side runs in its own fresh process (HF Flax needs
transformers 4.57.6, the last release with Flax, in its own virtual environment), and the
sides are interleaved round by round: ours, HF Flax, HF PyTorch, ours, ... the figure is the
median over rounds. tokens/s = batch x 128 / step time. MFU = the issue's useful-work FLOPs
(MLM head on the 20 labelled positions: `bert_jax.model.flops`) / step time / the float32 matmul
peak JAX measures in our process (each process's own peak is printed as well). Both HF models
compute the MLM head on all 128 positions, as their pre-training code does. Ours runs with
unrolled layers (`model.scan_layers=False`), 5-8% faster on this CPU than scanned ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import BATCH, bench  # noqa: E402  (the benchmark's batch per size)
SEQ, PREDS, VOCAB, WARMUP, STEPS = 128, 20, 30522, 3, 10


def data(batch: int):
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain.synthetic import random_batch  # pylint: disable=g-import-not-at-top
  return random_batch(np.random.default_rng(0), batch, SEQ, PREDS, VOCAB)


def timed_steps(step) -> float:
  times = []
  for _ in range(WARMUP + STEPS):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
  return statistics.median(times[WARMUP:])


def full_labels(b):
  """[B, S] MLM labels (-100 where unlabelled), as HF's pre-training models take them."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  labels = np.full(b['input_ids'].shape, -100, np.int64)
  rows = np.arange(len(labels))[:, None]
  labels[rows, b['masked_lm_positions']] = b['masked_lm_ids']
  return labels


def hf_config(size: str):
  """transformers.BertConfig of our preset `size`, dropout 0.1."""
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.model.encoder import BertConfig  # pylint: disable=g-import-not-at-top
  c = BertConfig.from_preset(size)
  return transformers.BertConfig(
      vocab_size=VOCAB, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
      num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def worker_ours(size: str, batch: int) -> dict:
  r = bench(size, 'float32', batch=batch, scan=False)  # unrolled layers: faster on CPU
  return {'step_s': r['step_s'], 'peak_flops': r['peak_gflops'] * 1e9,
          'compile_s': r['compile_s']}


def worker_torch(size: str, batch: int) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  cfg = hf_config(size)
  model = transformers.BertForPreTraining(cfg).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  b = data(batch)
  inputs = dict(input_ids=torch.from_numpy(b['input_ids']).long(),
                attention_mask=torch.from_numpy(b['input_mask']).long(),
                token_type_ids=torch.from_numpy(b['segment_ids']).long(),
                labels=torch.from_numpy(full_labels(b)),
                next_sentence_label=torch.from_numpy(b['next_sentence_labels'][:, 0]).long())

  def step():
    opt.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()
    opt.step()

  a = torch.ones(2048, 2048)
  best = min(_time(lambda: a @ a) for _ in range(5))
  return {'step_s': timed_steps(step), 'peak_flops': 2 * 2048 ** 3 / best,
          'threads': torch.get_num_threads()}


def _time(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def worker_flax(size: str, batch: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = hf_config(size)
  model = transformers.FlaxBertForPreTraining(cfg, seed=0, dtype=jnp.float32)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  params = model.params
  opt_state = tx.init(params)
  b = data(batch)
  labels = jnp.asarray(full_labels(b))
  batch_in = dict(input_ids=jnp.asarray(b['input_ids']),
                  attention_mask=jnp.asarray(b['input_mask']),
                  token_type_ids=jnp.asarray(b['segment_ids']))
  nsp = jnp.asarray(b['next_sentence_labels'][:, 0])

  def loss_fn(p, rng):  # as transformers' run_mlm_flax: weighted CE over all positions
    out = model(**batch_in, params=p, dropout_rng=rng, train=True)
    w = labels >= 0
    mlm = optax.softmax_cross_entropy_with_integer_labels(
        out.prediction_logits, jnp.where(w, labels, 0))
    mlm = (mlm * w).sum() / w.sum()
    nsp_loss = optax.softmax_cross_entropy_with_integer_labels(out.seq_relationship_logits,
                                                               nsp).mean()
    return mlm + nsp_loss

  @jax.jit
  def train_step(p, s, rng):
    rng, sub = jax.random.split(rng)
    loss, grads = jax.value_and_grad(loss_fn)(p, sub)
    updates, s = tx.update(grads, s, p)
    return optax.apply_updates(p, updates), s, rng, loss

  state = [params, opt_state, jax.random.PRNGKey(0)]

  def step():
    p, s, rng, loss = train_step(*state)
    loss.block_until_ready()
    state[:] = [p, s, rng]

  a = jnp.ones((2048, 2048), jnp.float32)
  mm = jax.jit(lambda x: x @ x)
  mm(a).block_until_ready()
  best = min(_time(lambda: mm(a).block_until_ready()) for _ in range(5))
  return {'step_s': timed_steps(step), 'peak_flops': 2 * 2048 ** 3 / best,
          'transformers': transformers.__version__, 'jax': jax.__version__}


WORKERS = {'ours': worker_ours, 'hf_torch': worker_torch, 'hf_flax': worker_flax}


def run_worker(side: str, size: str, python: str) -> dict:
  out = subprocess.run([python, os.path.abspath(__file__), '--worker', side, '--size', size],
                       capture_output=True, text=True,
                       env={**os.environ, 'PYTHONPATH': ROOT, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  lines = [l for l in out.stdout.splitlines() if l.startswith('{')]
  if out.returncode or not lines:
    raise RuntimeError(f'{side} {size} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}')
  return json.loads(lines[-1])


def setup_flax_venv(path: str) -> None:
  subprocess.run([sys.executable, '-m', 'venv', path], check=True)
  # transformers 4.57.6's Flax BERT runs on our own jax/flax/optax pins: same XLA both sides.
  subprocess.run([os.path.join(path, 'bin', 'pip'), 'install', '-q', 'transformers==4.57.6',
                  'jax==0.10.2', 'flax==0.12.8', 'optax==0.2.8'], check=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='tiny,mini,small,base')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--flax_venv', default=os.path.expanduser('~/.cache/bert_jax/hf_flax'))
  parser.add_argument('--setup_flax_venv', metavar='DIR')
  parser.add_argument('--worker', choices=sorted(WORKERS))
  parser.add_argument('--size')
  args = parser.parse_args()
  if args.setup_flax_venv:
    setup_flax_venv(args.setup_flax_venv)
    return
  if args.worker:
    print(json.dumps(WORKERS[args.worker](args.size, BATCH[args.size])))
    return

  from bert_jax.model import flops  # pylint: disable=g-import-not-at-top
  from bert_jax.model.encoder import BertConfig  # pylint: disable=g-import-not-at-top
  pythons = {'ours': sys.executable, 'hf_torch': sys.executable,
             'hf_flax': os.path.join(args.flax_venv, 'bin', 'python')}
  sides = ['ours', 'hf_flax', 'hf_torch']
  print(f'{os.cpu_count()} cores; {args.rounds} interleaved rounds; median step of {STEPS} after '
        f'{WARMUP} warm-up; float32, seq {SEQ}\n')
  print('| config (batch) | ours tokens/s | HF Flax tokens/s | HF PyTorch tokens/s | '
        'ours / HF Flax | ours / HF PyTorch | MFU ours | MFU HF Flax | MFU HF PyTorch |')
  print('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
  results = {}
  for size in args.sizes.split(','):
    batch = BATCH[size]
    runs = {s: [] for s in sides}
    for _ in range(args.rounds):
      for s in sides:
        runs[s].append(run_worker(s, size, pythons[s]))
    step = {s: statistics.median(r['step_s'] for r in runs[s]) for s in sides}
    peak = statistics.median(r['peak_flops'] for r in runs['ours'])
    model_flops = flops.train_flops_per_step(BertConfig.from_preset(size), batch, SEQ, PREDS)
    tok = {s: batch * SEQ / step[s] for s in sides}
    mfu = {s: model_flops / step[s] / peak for s in sides}
    results[size] = {'batch': batch, 'step_s': step, 'tokens_per_s': tok, 'mfu': mfu,
                     'jax_peak_gflops': peak / 1e9,
                     'torch_peak_gflops': statistics.median(
                         r['peak_flops'] for r in runs['hf_torch']) / 1e9,
                     'hf_flax_versions': {k: runs['hf_flax'][0][k]
                                          for k in ('transformers', 'jax')}}
    print(f'| {size} ({batch}) | {tok["ours"]:,.0f} | {tok["hf_flax"]:,.0f} | '
          f'{tok["hf_torch"]:,.0f} | {tok["ours"] / tok["hf_flax"]:.2f}x | '
          f'{tok["ours"] / tok["hf_torch"]:.2f}x | {mfu["ours"]:.1%} | {mfu["hf_flax"]:.1%} | '
          f'{mfu["hf_torch"]:.1%} |', flush=True)
  print(f'\nJAX float32 matmul peak {peak / 1e9:.0f} GFLOP/s; torch '
        f'{results[size]["torch_peak_gflops"]:.0f} GFLOP/s')
  print(json.dumps(results))


if __name__ == '__main__':
  main()
