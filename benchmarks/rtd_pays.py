r"""Does replaced-token detection pay sooner than masked LM? Both pre-train the demo's tiny
encoder on the demo's records at equal training FLOPs; each, and random init, is fine-tuned
on MR with the same recipe and seeds.

  .venv/bin/python -m benchmarks.rtd_pays [--budgets=1,4] [--seeds=3] \
      [--output_dir=runs/rtd_pays]

Budget 1 is the demo's pre-training (configs/demo.py:pretraining: BERT-tiny, MLM + NSP on
packed 128-token rows, batch 32, 2,500 steps, lr 5e-4, poly_warmup); budget k is k times its
steps. The RTD arm is the same recipe with `train.objective=rtd` on the same records:
configs/electra.py:tiny's discriminator (BERT-tiny's shape as an ELECTRA encoder) beside a
generator half as wide, sharing the token tables (ELECTRA's recipe), loss = generator MLM + 50
x discriminator BCE, for as many steps as the MLM arm's FLOPs buy
(`flops.rtd_train_flops_per_step`, which charges the generator, as the paper does). Random
init is each pre-trained arm's model drawn afresh per seed (`random:<workdir>`): BERT-tiny
and ELECTRA-tiny, whose classification heads differ (BERT's tanh pooler, ELECTRA's
dense-GELU head), so each pre-trained arm has its own control.

MR: configs/demo.py:mr (`harness.demo_mr`): 80/10/10 split, 64 tokens, batch 32, lr 1e-4,
3 epochs, test accuracy at the best dev epoch, seeds 0..N-1. Prints per-seed accuracies,
medians and ranges, and each arm against its random control and MLM against RTD. Runs and
`rtd_pays.json` go to --output_dir; re-running reuses finished pre-training and fine-tuning.
Measured figures: benchmarks/RESULTS.md, "Replaced-token detection vs masked LM (MR)".
"""

from __future__ import annotations

if __name__ == '__main__':  # CPU malloc tuned, as the CLIs do
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import json
import os
import time

from absl import app, flags, logging

from input_pipeline import fs

FLAGS = flags.FLAGS
flags.DEFINE_string('budgets', '1,4', 'Pre-training budgets, in multiples of the demo\'s steps.')
flags.DEFINE_integer('seeds', 3, 'MR fine-tuning seeds per arm (0 .. N-1).')
flags.DEFINE_string('output_dir', 'runs/rtd_pays', 'Data, runs and results go here.')


def configs(paths: dict, budget: int) -> dict:
  """{'mlm': config, 'rtd': config} at `budget` times the demo's steps, equal training FLOPs."""
  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain import step as pretrain_step
  from configs import demo as recipes, electra
  mlm = recipes.pretraining(paths['train'] + '*', paths['eval'], paths['vocab'])
  mlm.train.num_steps *= budget
  mlm.train.log_every = 100
  mlm.train.eval_every = mlm.train.num_steps  # one held-out eval, at the end
  rtd = mlm.copy_and_resolve_references()
  tiny = electra.get_config('tiny')
  rtd.train.objective = 'rtd'
  rtd.model.arch = tiny.model.arch
  rtd.rtd = tiny.rtd
  rows = mlm.train.global_batch_size, mlm.data.max_seq_length, mlm.data.max_predictions_per_seq
  per_step = {name: pretrain_step.objective(c).train_flops(*rows)
              for name, c in (('mlm', mlm), ('rtd', rtd))}
  rtd.train.num_steps = round(mlm.train.num_steps * per_step['mlm'] / per_step['rtd'])
  return {name: (c, per_step[name] * c.train.num_steps) for name, c in
          (('mlm', mlm), ('rtd', rtd))}


def pretrain(config, workdir: str) -> dict:
  """The run's final held-out metrics (a finished run in `workdir` is evaluated, not rerun:
  its train_and_evaluate has no new eval to return)."""
  from bert_jax.pretrain import run as train  # pylint: disable=g-import-not-at-top
  held_out = train.train_to_the_end(config, workdir).get('eval')
  if not held_out:
    held_out = {k: v for k, v in train.evaluate_workdir(config, workdir).items() if k != 'step'}
  return held_out


def main(argv):
  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  from configs import demo as recipes  # pylint: disable=g-import-not-at-top
  from input_pipeline.pretrain import demo_corpus  # pylint: disable=g-import-not-at-top
  del argv
  logging.set_verbosity(logging.WARNING)
  work = fs.absolute(FLAGS.output_dir)
  start = time.time()
  data = recipes.data()
  paths = demo_corpus.prepare_data(work, data, data.dupe_factor, data.corpus, pack=data.pack)
  print(harness.machine(), flush=True)
  results = {'seeds': FLAGS.seeds, 'budgets': {}}
  controls = {}  # random init does not depend on the budget: fine-tuned once per model
  for budget in (int(b) for b in FLAGS.budgets.split(',')):
    arms = {}
    for name, (config, train_flops) in configs(paths, budget).items():
      run_dir = fs.join(work, f'x{budget}', name)
      t = time.time()
      held_out = pretrain(config, run_dir)
      minutes = round((time.time() - t) / 60, 2)
      print(f'[rtd_pays] x{budget} {name}: {config.train.num_steps} steps, '
            f'{train_flops / 1e15:.2f} PFLOP, held-out {json.dumps(held_out)} ({minutes} min)',
            flush=True)
      r = harness.demo_mr(run_dir, fs.join(work, f'x{budget}', 'mr', name), FLAGS.seeds)
      arms[name] = {**r, 'steps': config.train.num_steps, 'train_pflop': train_flops / 1e15,
                    'held_out': held_out, 'pretrain_minutes': minutes}
      if name not in controls:
        controls[name] = harness.demo_mr(f'random:{run_dir}', fs.join(work, 'mr', f'random_{name}'),
                                         FLAGS.seeds)
      arms[f'random_{name}'] = controls[name]
      for arm in (name, f'random_{name}'):
        print(f'[rtd_pays] x{budget} {arm}: MR test {arms[arm]["values"]} median '
              f'{arms[arm]["median"]:.4f} ({(time.time() - start) / 60:.1f} min)', flush=True)
    for arm, base in (('mlm', 'random_mlm'), ('rtd', 'random_rtd'), ('rtd', 'mlm')):
      arms[f'{arm}_vs_{base}'] = harness.compare_arms(arms[arm], arms[base], arm)
    results['budgets'][str(budget)] = arms
  results['minutes'] = round((time.time() - start) / 60, 2)
  fs.write_text(fs.join(work, 'rtd_pays.json'), json.dumps(results, indent=2))
  print('| budget | arm | pre-training steps | PFLOP | ' +
        ' | '.join(f'seed {s}' for s in range(FLAGS.seeds)) + ' | median | min-max |')
  print('|---' * (FLAGS.seeds + 6) + '|')
  for budget, arms in results['budgets'].items():
    for arm in ('mlm', 'rtd', 'random_mlm', 'random_rtd'):
      a = arms[arm]
      steps = f'{a["steps"]:,}' if not arm.startswith('random') else '0'
      pflop = f'{a["train_pflop"]:.2f}' if not arm.startswith('random') else '0'
      print(f'| x{budget} | {arm} | {steps} | {pflop} | ' +
            ' | '.join(f'{v:.4f}' for v in a['values']) +
            f' | {a["median"]:.4f} | {a["min"]:.4f}-{a["max"]:.4f} |')
    for key in ('mlm_vs_random_mlm', 'rtd_vs_random_rtd', 'rtd_vs_mlm'):
      c = arms[key]
      print(f'[rtd_pays] x{budget} {key}: gap {c["gap"]:+.4f}, margin {c["margin"]:+.4f}: '
            f'{c["verdict"]}')
  print(f'[rtd_pays] {results["minutes"]} minutes', flush=True)


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
