"""Fine-tune a start point on a task, evaluate every epoch, report and export the best
(`python -m bert_jax.finetune`, bert_jax/finetune/__main__.py).

`--init` is anything `start_points.load_start_point` reads: our pre-training workdir, an HF
directory (BertForPreTraining, BertModel, sentence-transformers, a fine-tuned BertFor<Task>)
or a Google TF checkpoint; its tokenizer and casing come with it. `--init=random:<any of
those>` keeps its model config and tokenizer but draws every weight afresh (per seed): the
no-pre-training baseline. Training runs on the same
mesh, sharding rules, optimizer code and Orbax checkpoints as pre-training.

Each seed trains in `<workdir>/seed_<s>/` (checkpoints/, metrics.jsonl, tensorboard/, GLUE
leaderboard files in glue_submission/, other unlabelled test splits' predictions in
predictions/). Checkpoints are written at every epoch end (and on a preemption notice, at
the next step; a notice pending at an epoch end saves before the scoring or the export,
which the resumed run redoes from the same state); the batches of an epoch are a permutation
drawn from (seed, epoch) and dropout keys from the step, so a restarted command continues
exactly where the last checkpoint left off. Every epoch is scored on the dev split(s); the
best epoch so far (first dev split's headline metric) is scored on a labelled test split and
exported at once, so nothing needs to keep old params: `<workdir>/hf_export` for one seed,
`<workdir>/hf_export/seed_<s>` for several, loadable with transformers'
`AutoModelFor<Task>.from_pretrained`. Results of all seeds (median, min, max) next to the
majority-class (mean, no-answer) baseline go to `<workdir>/results.json` and `results.md`.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any

import jax
from absl import logging

from bert_jax.convert import start_points
from bert_jax.finetune import results as results_lib, tasks as finetune_tasks
from bert_jax.finetune.hooks import EpochHooks
from bert_jax.finetune.program import Program
from bert_jax.finetune.resume import SeedCheckpoints, SeedProgress, geometry
from bert_jax.training import host_malloc, run_control, run_setup, session
from bert_jax.training import sharding as shd
from input_pipeline import fs
from input_pipeline.finetune import registry


# ----------------------------------------------------------------------------- setup


def seed_list(seeds: Any, first: int) -> list[int]:
  """`config.seeds`: a count N (seeds first .. first+N-1) or a list of seeds."""
  if isinstance(seeds, str):
    try:
      seeds = ast.literal_eval(seeds.strip())
    except (ValueError, SyntaxError):
      raise ValueError(f'config.seeds={seeds!r}: expected a count (3) or a list (0,1,7)') from None
  if isinstance(seeds, int) and not isinstance(seeds, bool):
    if seeds < 1:
      raise ValueError(f'config.seeds={seeds}: need at least one run')
    return list(range(first, first + seeds))
  if isinstance(seeds, (list, tuple)) and seeds and all(
      isinstance(s, int) and not isinstance(s, bool) for s in seeds):
    if len(set(seeds)) != len(seeds):
      raise ValueError(f'config.seeds={list(seeds)}: a seed is repeated')
    return list(seeds)
  raise ValueError(f'config.seeds={seeds!r}: expected a count (3) or a list of ints (0,1,7)')


def load_start(config):
  """The start point computing as the run's `config.model` says (dtype, dropout, attention,
  remat, layer layout: run_setup.model_config over its stored config)."""
  if not config.init:
    raise ValueError('no start point: pass --init=<our workdir | HF directory | TF checkpoint>')
  start = start_points.load_start_point(config.init, do_lower_case=config.do_lower_case)
  start = start_points.with_config(start, run_setup.model_config(config, start.cfg))
  start_points.check_max_seq_length(start.cfg, config.data.max_seq_length,
                                    'the start point\'s', 'lower --config.data.max_seq_length')
  if start.tokenizer.vocab_size > start.cfg.vocab_size:
    raise ValueError(f'{config.init}: the tokenizer has {start.tokenizer.vocab_size} tokens but '
                     f'the model embeds {start.cfg.vocab_size}; the start point\'s vocabulary '
                     'does not belong to its weights')
  return start


def batch_multiple(config) -> int:
  """Global batches must split evenly over the batch devices and the processes."""
  data, fsdp, _ = shd.mesh_shape(tuple(config.mesh), jax.device_count())
  return math.lcm(data * fsdp, jax.process_count())


def check_batch_sizes(config) -> int:
  """The eval batch, rounded up to what the mesh splits evenly; the train batch must fit."""
  multiple = batch_multiple(config)
  t = config.train
  if t.global_batch_size < 1 or t.global_batch_size % multiple:
    raise ValueError(f'train.global_batch_size={t.global_batch_size} must be a positive '
                     f'multiple of {multiple} (the mesh\'s data x fsdp devices and the '
                     'processes); change --config.train.global_batch_size or --config.mesh')
  if t.num_epochs < 1:
    raise ValueError(f'train.num_epochs={t.num_epochs}: need at least 1')
  if config.data.length_buckets < 1:
    raise ValueError(f'data.length_buckets={config.data.length_buckets}: expected 1 (every '
                     'batch max_seq_length long) or more')
  if t.stop_after_epoch < 0:
    raise ValueError(f'train.stop_after_epoch={t.stop_after_epoch}: expected 0 (all epochs) or '
                     'the epoch to stop after')
  return -(-max(t.eval_batch_size, 1) // multiple) * multiple


def build_task(config, start, records=None):
  """The task's arrays for this start point; `records` (read_task's) when already read."""
  records = records if records is not None else registry.read_task(config)
  labels = finetune_tasks.reconcile_labels(records, start.head, config.init, config.fresh_head)
  task = finetune_tasks.featurize(records, labels, start.tokenizer, config.data,
                                  classifier_dropout=config.model.classifier_dropout)
  logging.info('%s: %d training rows, eval splits %s, labels %s', task.name, task.num_train,
               [f'{s.name} ({len(s.records)})' for s in task.evals], list(task.labels))
  return task


def build_program(config, records=None) -> tuple[Any, Any, Program]:
  """(start point, task, Program) of `config`: what `run` trains every seed with, and what a
  benchmark times; `records` as for `build_task`."""
  start = load_start(config)
  task = build_task(config, start, records)
  return start, task, Program(config, task, start, check_batch_sizes(config))


# ----------------------------------------------------------------------------- one seed


def run_seed(config, workdir: str, task, start, seed: int, export_dir: str | None,
             program: Program, preemption: run_control.PreemptionFlag) -> dict:
  """Train, score and export one seed in `<workdir>/seed_<seed>`, resuming from its latest
  checkpoint; `preemption.requested` tells whether a notice stopped it. A seed saved at an
  epoch end whose scoring a notice cut short scores it first (the same state: the same
  scores)."""
  directory = fs.join(workdir, f'seed_{seed}')
  with session.open_run(directory, max_to_keep=1, async_save=False) as run:
    checkpoints = SeedCheckpoints(directory, run.manager,
                                  SeedProgress(geometry(task, program)))
    state = checkpoints.initial_state(program.setup, task, start, seed, config.fresh_head)
    step = int(state.step)
    bar = run.progress(program.total_steps, step, desc=f'seed {seed}')
    hooks = EpochHooks(program, task, start, seed, checkpoints, export_dir, run.writer, bar,
                       preemption)
    stopped = False
    if hooks.epoch_unscored(step):
      stopped = not hooks.end_epoch(state, step)
      if not stopped:
        checkpoints.write_rescored(step)
    if not stopped and step < program.stop_step:
      loop = run.loop(program.train_step, hooks, preemption, config.train.log_every,
                      label=f'seed {seed}')
      state, step, stopped = loop.run(state, program.stop_step)
  if stopped:
    logging.warning('preemption notice: seed %d saved step %d; run the same command to '
                    'resume', seed, step)
  return seed_result(seed, step, hooks, program, task, export_dir)


def seed_result(seed: int, step: int, hooks: EpochHooks, program: Program, task,
                export_dir: str | None) -> dict:
  progress = hooks.progress
  history = progress.history
  best = results_lib.best_epoch_index(history, task.select_split.name)
  out = {'seed': seed, 'epochs_done': len(history), 'step': step,
         'complete': step >= program.total_steps and not hooks.epoch_unscored(step),
         'best_epoch': None, 'scores': {}, 'history': history, 'export': None,
         'prediction_files': progress.prediction_files}
  if best is not None:
    out['best_epoch'] = history[best]['epoch']
    out['scores'] = history[best]['scores']
    out['export'] = export_dir
  return out


# ----------------------------------------------------------------------------- all seeds


def run(config, workdir: str) -> dict:
  """Fine-tune every seed of `config` (resuming each from its checkpoint), write
  results.json and results.md; returns the results."""
  workdir = fs.absolute(workdir)
  seeds = seed_list(config.seeds, config.seed)
  check_batch_sizes(config)  # bad sizes fail now, before anything is written
  if jax.process_index() == 0:
    fs.check_writable(workdir)  # now, not after the first epoch
    fs.write_text(fs.join(workdir, 'config.json'), config.to_json_best_effort(indent=2))
  records = registry.read_task(config)  # bad task data fails now, not after ~20 s of loading
  start, task, program = build_program(config, records)
  runs = []
  with run_control.PreemptionFlag() as preemption:  # one for the job: it spans every seed
    for seed in seeds:
      export = None
      if config.export:
        export = fs.join(workdir, 'hf_export', *([f'seed_{seed}'] if len(seeds) > 1 else []))
      runs.append(run_seed(config, workdir, task, start, seed, export, program, preemption))
      runs[-1]['peak_rss_mib'] = round(host_malloc.peak_resident_mib())
      logging.info('seed %d: peak resident memory of this process so far %d MiB', seed,
                   runs[-1]['peak_rss_mib'])
      if preemption.requested:
        break
  results = results_lib.summarize(config, task, seeds, runs)
  if jax.process_index() == 0:
    fs.write_text(fs.join(workdir, 'results.json'),
                  json.dumps(results_lib.strict_json(results), indent=2))
    fs.write_text(fs.join(workdir, 'results.md'), results_lib.markdown(results))
  return results


def run_or_reuse(config, workdir: str) -> dict:
  """`run`, or the results of a complete earlier run of the same seeds in `workdir` (the demo
  and the benchmarks re-run their commands to continue where they stopped)."""
  results_file = fs.join(fs.absolute(workdir), 'results.json')
  if fs.exists(results_file):
    results = json.loads(fs.read_text(results_file))
    if results.get('complete') and results.get('seeds') == seed_list(config.seeds, config.seed):
      return results
  return run(config, workdir)
