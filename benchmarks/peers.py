r"""Our train step against HuggingFace's BertForPreTraining (PyTorch) and FlaxBertForPreTraining.

  python benchmarks/peers.py --setup_flax_venv ~/.cache/bert_jax/hf_flax   # once
  python benchmarks/peers.py [--sizes tiny,mini,small,base] [--rounds 3] [--sides ...]
  python benchmarks/peers.py --sizes=tiny --rounds=1 --sides=ours,hf_torch --steps=2  # smoke

The peer benchmark of the performance issue: configs/benchmarks.py's recipe of each size
(tiny/mini/small at batch 32, base at batch 8; vocab 30522, seq 128, 20 MLM labels per row),
~10% padding at the end of each row, random NSP labels (`bert_jax.pretrain.synthetic.random_batch`,
the same numpy seed for every side, so identical data), dropout 0.1 in training mode, float32;
3 warm-up steps, then the median of `--steps` (10) steps. Ours is the configured run's step
(benchmarks/train_step.py's, built by the run setup: adamw_bert, lr from the BERT schedule,
weight decay 0.01, gradients clipped to norm 1.0) with unrolled layers
(`model.scan_layers=False`, 5-8% faster on this CPU than scanned ones) and the allocator
settings bert_jax.main runs with (bert_jax/training/host_malloc.py); both HF sides run AdamW
lr 1e-4, weight decay 0.01, with the same clipping (HF Trainer's default max_grad_norm 1.0).
Each side runs in its own fresh process (HF Flax needs transformers 4.57.6, the last release
with Flax, in its own virtual environment), and the sides are interleaved round by round
(harness.interleave): ours, HF Flax, HF PyTorch, ours, ... the figure is the median over
rounds. tokens/s = batch x 128 / step time. MFU = the issue's useful-work FLOPs (MLM head on
the 20 labelled positions: `bert_jax.model.flops`) / step time / the float32 matmul peak JAX
measures in our process (each process's own peak is printed as well). Both HF models compute
the MLM head on all 128 positions, as their pre-training code does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import harness

WARMUP = 3
SIDES = ('ours', 'hf_flax', 'hf_torch')


def geometry(size: str) -> dict:
  """Rows, length, predictions and vocab of configs/benchmarks.py's recipe of `size`: what
  every side trains on (a worker gets it on its command line: the Flax venv has no
  ml_collections)."""
  c = harness.config('benchmarks', size)
  return {'size': size, 'batch': c.train.global_batch_size, 'seq': c.data.max_seq_length,
          'preds': c.data.max_predictions_per_seq, 'vocab': c.model.vocab_size}


def data(g: dict):
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain.synthetic import random_batch  # pylint: disable=g-import-not-at-top
  return random_batch(np.random.default_rng(0), g['batch'], g['seq'], g['preds'], g['vocab'])


def full_labels(b):
  """[B, S] MLM labels (-100 where unlabelled), as HF's pre-training models take them."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  labels = np.full(b['input_ids'].shape, -100, np.int64)
  rows = np.arange(len(labels))[:, None]
  labels[rows, b['masked_lm_positions']] = b['masked_lm_ids']
  return labels


def hf_config(g: dict):
  """transformers.BertConfig of our preset `size`, dropout 0.1."""
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.model.encoder import BertConfig  # pylint: disable=g-import-not-at-top
  c = BertConfig.from_preset(g['size'])
  return transformers.BertConfig(
      vocab_size=g['vocab'], hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
      num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def worker_ours(g: dict, steps: int) -> dict:
  from train_step import bench  # pylint: disable=g-import-not-at-top
  r = bench(harness.config('benchmarks', g['size'], **{'model.scan_layers': False}),
            steps=steps, warmup=WARMUP)
  return {'step_s': r['step_s'], 'peak_flops': r['peak_gflops'] * 1e9,
          'compile_s': r['compile_s']}


def worker_torch(g: dict, steps: int) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(hf_config(g)).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  b = data(g)
  inputs = dict(input_ids=torch.from_numpy(b['input_ids']).long(),
                attention_mask=torch.from_numpy(b['input_mask']).long(),
                token_type_ids=torch.from_numpy(b['segment_ids']).long(),
                labels=torch.from_numpy(full_labels(b)),
                next_sentence_label=torch.from_numpy(b['next_sentence_labels'][:, 0]).long())

  def step(_):
    opt.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  host = lambda r: r  # noqa: E731  (CPU torch returns when done)
  a = torch.ones(2048, 2048)
  matmul = harness.timed(lambda _: a @ a, steps=5, warmup=0, sync=host)
  return {'step_s': harness.timed(step, steps=steps, warmup=WARMUP, sync=host).median,
          'peak_flops': 2 * 2048 ** 3 / matmul.lo, 'threads': torch.get_num_threads()}


def worker_flax(g: dict, steps: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.FlaxBertForPreTraining(hf_config(g), seed=0, dtype=jnp.float32)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4, weight_decay=0.01))
  params = model.params
  opt_state = tx.init(params)
  b = data(g)
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

  def step(_):
    p, s, rng, loss = train_step(*state)
    state[:] = [p, s, rng]
    return loss

  a = jnp.ones((2048, 2048), jnp.float32)
  mm = jax.jit(lambda x: x @ x)
  matmul = harness.timed(lambda _: mm(a), steps=5, warmup=1)
  return {'step_s': harness.timed(step, steps=steps, warmup=WARMUP).median,
          'peak_flops': 2 * 2048 ** 3 / matmul.lo,
          'transformers': transformers.__version__, 'jax': jax.__version__}


WORKERS = {'ours': worker_ours, 'hf_torch': worker_torch, 'hf_flax': worker_flax}


def run_worker(side: str, g: dict, steps: int, python: str) -> dict:
  return harness.run([python, os.path.abspath(__file__), '--worker', side,
                      f'--geometry={json.dumps(g)}', f'--steps={steps}'],
                     env={'TF_CPP_MIN_LOG_LEVEL': '3'}).last_json()


def setup_flax_venv(path: str) -> None:
  python = os.path.join(path, 'bin', 'python')
  harness.run([sys.executable, '-m', 'venv', path], echo=True)
  # transformers 4.57.6's Flax BERT runs on our own jax/flax/optax pins: same XLA both sides.
  harness.run([python, '-m', 'pip', 'install', '-q', 'transformers==4.57.6', 'jax==0.10.2',
               'flax==0.12.8', 'optax==0.2.8'], echo=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', default='tiny,mini,small,base')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--sides', default=','.join(SIDES), help='of ' + ','.join(SIDES))
  parser.add_argument('--flax_venv', default=os.path.expanduser('~/.cache/bert_jax/hf_flax'))
  parser.add_argument('--setup_flax_venv', metavar='DIR')
  parser.add_argument('--worker', choices=sorted(WORKERS))
  parser.add_argument('--geometry', help='internal: the worker\'s batch geometry (JSON)')
  args = parser.parse_args()
  if args.setup_flax_venv:
    setup_flax_venv(args.setup_flax_venv)
    return
  if args.worker:
    if args.worker == 'ours':
      harness.tuned_malloc()  # as bert_jax.main runs; HF's processes keep their allocator
    print(json.dumps(WORKERS[args.worker](json.loads(args.geometry), args.steps)))
    return

  from bert_jax.model import flops  # pylint: disable=g-import-not-at-top
  from bert_jax.model.encoder import BertConfig  # pylint: disable=g-import-not-at-top
  pythons = {'ours': sys.executable, 'hf_torch': sys.executable,
             'hf_flax': os.path.join(args.flax_venv, 'bin', 'python')}
  sides = [s for s in SIDES if s in args.sides.split(',')]
  if sides[:1] != ['ours'] or set(args.sides.split(',')) - set(SIDES):
    raise SystemExit(f'--sides={args.sides}: ours and any of hf_flax, hf_torch (the figures are '
                     'ratios to ours)')
  print(f'{harness.machine()}\n{args.rounds} interleaved rounds; median step of {args.steps} '
        f'after {WARMUP} warm-up; float32, seq 128\n')
  names = {'ours': 'ours', 'hf_flax': 'HF Flax', 'hf_torch': 'HF PyTorch'}
  print('| config (batch) | ' + ' | '.join(f'{names[s]} tokens/s' for s in sides) + ' | '
        + ' | '.join(f'ours / {names[s]}' for s in sides[1:]) + ' | '
        + ' | '.join(f'MFU {names[s]}' for s in sides) + ' |')
  print('| --- |' + ' ---: |' * (3 * len(sides) - 1))
  results = {}
  for size in args.sizes.split(','):
    g = geometry(size)
    runs = harness.interleave(
        {s: (lambda s=s: run_worker(s, g, args.steps, pythons[s])) for s in sides},
        args.rounds)
    step = {s: statistics.median(r['step_s'] for r in runs[s]) for s in sides}
    peak = statistics.median(r['peak_flops'] for r in runs[sides[0]])
    model_flops = flops.train_flops_per_step(BertConfig.from_preset(size, vocab_size=g['vocab']),
                                             g['batch'], g['seq'], g['preds'])
    tok = {s: g['batch'] * g['seq'] / step[s] for s in sides}
    mfu = {s: model_flops / step[s] / peak for s in sides}
    results[size] = {'batch': g['batch'], 'step_s': step, 'tokens_per_s': tok, 'mfu': mfu,
                     'peak_gflops': {s: statistics.median(r['peak_flops'] for r in runs[s]) / 1e9
                                     for s in sides},
                     **({'hf_flax_versions': {k: runs['hf_flax'][0][k]
                                              for k in ('transformers', 'jax')}}
                        if 'hf_flax' in sides else {})}
    print(f'| {size} ({g["batch"]}) | ' + ' | '.join(f'{tok[s]:,.0f}' for s in sides) + ' | '
          + ' | '.join(f'{tok["ours"] / tok[s]:.2f}x' for s in sides[1:]) + ' | '
          + ' | '.join(f'{mfu[s]:.1%}' for s in sides) + ' |', flush=True)
  print('\nmatmul peaks (GFLOP/s): ' + ', '.join(
      f'{s} {v:.0f}' for s, v in results[size]['peak_gflops'].items()))
  print(json.dumps(results))


if __name__ == '__main__':
  main()
