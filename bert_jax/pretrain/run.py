"""The pre-training run: setup (bert_jax/training/run_setup.py), resume, eval, checkpoints, around
the shared loop (bert_jax/training/loop.py).

Resumes from the latest checkpoint in `workdir` automatically (state and data position), so a
preempted or killed run continues exactly where it stopped. A SIGTERM (a TPU preemption
notice) or a Cloud maintenance event (bert_jax/training/maintenance.py) reaching any process makes
every process save the same step, before any eval that step would run, and return normally. A
non-finite loss, gradient or parameter norm stops the run naming the step, without saving: the
last checkpoint stays the last good one. The loop dispatches steps back to back.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.convert import start_points
from bert_jax.convert.workdir import load_run_config
from bert_jax.model import flops
from bert_jax.training import batch_schedule, checkpointing, run_setup, session
from bert_jax.training import sharding as shd
from bert_jax.training.loop import Hooks
from bert_jax.training.run_control import PreemptionFlag
from bert_jax.pretrain import rtd, step as ts
from input_pipeline import fs
from input_pipeline.pretrain import dataset as data_lib
from input_pipeline.pretrain.dataset import reader_config
from input_pipeline.tokenizer_files import data_tokenizer, data_tokenizer_field


def per_process_batch(global_batch: int) -> int:
  if global_batch % jax.process_count():
    raise ValueError(f'train.global_batch_size={global_batch} is not divisible by the '
                     f'{jax.process_count()} processes')
  return global_batch // jax.process_count()


def evaluate(eval_step, params, setup: run_setup.RunSetup, batch_size: int) -> dict[str, float]:
  """Held-out MLM/NSP loss and accuracy over `train.eval_steps` batches (or the whole set).

  Every process runs the same number of (collective) eval steps: hosts agree before each batch
  whether any of them still has data, and a host whose share has ended feeds all-padding
  batches that add nothing to the sums. Without that, eval files that split unevenly leave one
  host calling the step alone, and the run hangs."""
  config = setup.config
  cfg = reader_config(config, config.data.eval_files, batch_size, config.seed)
  ds = data_lib.make_dataset(cfg, training=False, process_index=jax.process_index(),
                             process_count=jax.process_count())
  batches = data_lib.DataIterator(ds, config.data.eval_files)
  padding = setup.layout.zeros(batch_size)
  totals = None
  for _ in range(config.train.eval_steps):
    local = next(batches, None)
    if not _any_process(local is not None):
      break
    sums = eval_step(params, shd.global_batch(padding if local is None else local, setup.mesh))
    totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
  if totals is None:
    raise ValueError(f'data.eval_files={config.data.eval_files!r} yielded no batch')
  return {k: float(v) for k, v in jax.device_get(setup.objective.summarize(totals)).items()}


def evaluate_workdir(config, workdir: str) -> dict:
  """Held-out metrics of a workdir's latest checkpoint (`bert_jax.main --mode=eval`)."""
  if not config.data.eval_files:
    raise ValueError('--config.data.eval_files is empty')
  step, params = checkpointing.restore_params(workdir)
  setup = ts.setup(config)
  batch = per_process_batch(config.train.global_batch_size)
  return {'step': step, **evaluate(setup.eval_step(), setup.place_params(params), setup, batch)}


def _any_process(flag: bool) -> bool:
  """Whether `flag` holds on any process (a small host collective when there are several)."""
  if jax.process_count() == 1:
    return flag
  return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


def _initial_state(setup: run_setup.RunSetup):
  """Fresh, or from `train.init_from`'s params, optionally with its optimizer moments and fresh
  step counts (`train.init_opt_state_from`: NVIDIA's LAMB phase 2)."""
  t = setup.config.train
  with_moments = t.init_opt_state_from
  if with_moments and not t.init_from:
    raise ValueError('train.init_opt_state_from=True needs train.init_from=<phase-1 workdir>; '
                     'set it, or set train.init_opt_state_from=False')
  if not t.init_from:
    return setup.fresh_state()
  # Our workdir, an HF directory or a Google TF checkpoint (continued pre-training): relaid
  # out to this run's layers, its shapes, vocabulary and casing checked against this run's.
  if t.objective == 'rtd':  # a generator / discriminator pair, or an RTD workdir
    step, params = rtd.start_params(setup.config, rtd.rtd_config(setup.config, setup.model_cfg),
                                    jax.device_get(setup.fresh_state().params))
  else:
    step, params = start_points.pretraining_params(
        t.init_from, setup.model_cfg, data=setup.config.data,
        allow_vocab_change=t.init_from_allow_vocab_change)
  logging.info('initialising params%s from %s step %d (fresh step count and schedule)',
               ' and optimizer moments' if with_moments else '', t.init_from, step)
  state = setup.state_from_params(params)
  if with_moments:
    opt_state = checkpointing.restore_opt_moments(t.init_from, setup.tx, state.opt_state, step)
    state = state.replace(opt_state=jax.device_put(opt_state, setup.shardings.opt_state))
  return state


def _train_iterator(config, seed: int) -> data_lib.DataIterator:
  """Reader batches of one `batch_schedule` unit of global rows (the whole global batch
  without batch-size warmup), divided over the processes."""
  unit = batch_schedule.from_config(config.train, jax.process_count()).unit
  batch_size = per_process_batch(unit)
  ds = data_lib.make_dataset(
      reader_config(config, config.data.train_files, batch_size, seed), training=True,
      process_index=jax.process_index(), process_count=jax.process_count())
  return data_lib.DataIterator(ds, config.data.train_files)


def _check_reader_batch(config, workdir: str, step: int) -> None:
  """A data position restores only into a reader of the batch size that saved it (tf.data
  fails on its saved prefetched batches with a shape error): compared with the config the
  workdir's last run wrote."""
  path = fs.join(workdir, 'config.json')
  if not fs.exists(path):
    return
  saved = load_run_config(workdir).train
  before, now = (batch_schedule.from_config(t, jax.process_count()).unit
                 for t in (saved, config.train))
  if before != now:
    raise ValueError(
        f'{checkpointing.checkpoint_dir(workdir)}/{step}: its data position was saved reading '
        f'batches of {before} global rows, this run reads {now} (train.global_batch_size, or '
        'train.batch_warmup_increment / batch_warmup_min_size while batch_warmup_steps > 0); '
        f'the position cannot carry over. Resume with the train settings in {path}.')


def _resume(setup: run_setup.RunSetup, manager, workdir: str):
  """(state, data iterator) from the latest checkpoint, or (None, fresh iterator).

  The data position is per process, so it carries over only to the same process count.
  Another count is refused at start with what to do, or, with
  `train.allow_process_count_change`, the state is resharded onto the new mesh and the data
  restarts from a new shuffle (seed + step) with a warning: the order differs from an
  uninterrupted run and records may repeat within the epoch."""
  config = setup.config
  latest = manager.latest_step()
  if latest is None:
    return None, _train_iterator(config, config.seed)
  saved = checkpointing.data_process_count(workdir, latest)
  if saved in (None, jax.process_count()):
    _check_reader_batch(config, workdir, latest)
    train_iter = _train_iterator(config, config.seed)
    state = checkpointing.restore(manager, latest, setup.abstract_state(), train_iter)
    logging.info('resumed from %s step %d', workdir, latest)
    return state, train_iter
  if not config.train.allow_process_count_change:
    raise ValueError(
        f'{checkpointing.checkpoint_dir(workdir)}/{latest}: written by {saved} processes, this '
        f'run has {jax.process_count()}; each process\'s data position cannot carry over. '
        f'Resume with {saved} processes, or set --config.train.allow_process_count_change=True '
        'to keep the model and optimizer state and restart the data in a new order.')
  logging.warning('resuming step %d of a %d-process run with %d processes: model and optimizer '
                  'state resharded; the data restarts in a new order (seed %d + step), so it '
                  'differs from an uninterrupted run', latest, saved, jax.process_count(),
                  config.seed)
  state = checkpointing.restore(manager, latest, setup.abstract_state())
  return state, _train_iterator(config, config.seed + latest)


def _check_tokenizer(config) -> None:
  """The data's tokenizer (data.vocab_file, spm_model or tokenizer) against model.vocab_size,
  before the first step (`start_points.check_vocab_size`)."""
  tokenizer = data_tokenizer(config.data)
  if tokenizer is not None:
    start_points.check_vocab_size(
        tokenizer, config.model.vocab_size, 'model.vocab_size', data_tokenizer_field(config.data),
        f'Set --config.model.vocab_size={tokenizer.vocab_size} or more (a multiple of 64 runs '
        'faster), or make the data with the tokenizer the model was trained with.')


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
  """Run (or resume) training to `train.num_steps`; returns the last train and eval metrics."""
  workdir = fs.absolute(workdir)
  if jax.process_index() == 0:
    fs.check_writable(workdir)  # now, not after the first hours of training
  config = start_points.with_start_shape(config)  # model.size=init_from: the start's shape
  setup = ts.setup(config)
  _check_tokenizer(config)
  t = config.train
  logging.info('mesh %s over %d devices, %d processes', dict(setup.mesh.shape),
               jax.device_count(), jax.process_count())
  schedule = batch_schedule.from_config(t, jax.process_count(), math.prod(
      setup.mesh.shape[a] for a in shd.BATCH_AXES))
  if schedule.warmup_steps:
    logging.info('batch-size warmup over %d steps: global batches of %s rows',
                 schedule.warmup_steps, ', '.join(map(str, schedule.sizes())))
  with PreemptionFlag() as preemption, session.open_run(
      workdir, max_to_keep=t.keep_checkpoints, keep_period=t.keep_every or None,
      async_save=t.async_checkpoint) as run:
    state, train_iter = _resume(setup, run.manager, workdir)
    if jax.process_index() == 0:  # export and eval read the run's config from here; written
      # after the resume, so a config the checkpoint refuses leaves the run's own in place
      fs.write_text(fs.join(workdir, 'config.json'), config.to_json_best_effort(indent=2))
    if state is None:
      state = _initial_state(setup)
    step = int(jax.device_get(state.step))
    bar = run.progress(t.num_steps, step, desc='train')
    hooks = _PretrainingHooks(setup, workdir, run.manager, train_iter, run.writer, bar, schedule)
    loop = run.loop(  # tokens and FLOPs per step: each batch's info (next_batch)
        setup.train_step(), hooks, preemption, t.log_every,
        peak_flops=(t.peak_flops_per_device or flops.peak_flops_per_device()) * jax.device_count())
    state, step, stopped = loop.run(state, t.num_steps)
    if stopped:
      logging.warning('preemption notice: all processes saved step %d, exiting', step)
      bar.write(f'preemption notice: saved step {step}; run the same command to resume')
  return {'step': step, 'train': loop.last_train, 'eval': hooks.last_eval}


class Preempted(SystemExit):
  """A run that a preemption notice stopped, its step saved, before `train.num_steps`, raised
  by `train_to_the_end`: what follows a finished run (its held-out eval, export, fine-tuning)
  must not go on with a partial model. Exit status 0, as `bert_jax.main` after a notice."""


def train_to_the_end(config, workdir: str) -> dict[str, Any]:
  """`train_and_evaluate` for callers that go on to use the trained model (the demo, the
  benchmarks): raises Preempted, saying how to resume, when a notice stopped the run first."""
  result = train_and_evaluate(config, workdir)
  if result['step'] < config.train.num_steps:
    logging.warning('%s: stopped at step %d of %d by a preemption notice; run the same command '
                    'to resume it and what follows', workdir, result['step'],
                    config.train.num_steps)
    raise Preempted(0)
  return result


class _PretrainingHooks(Hooks):
  """Batches from the TFRecord reader, as many of its batches a step as the batch schedule
  says (batch-size warmup), whose position every checkpoint saves before the next batch is
  read (so a resumed run gets exactly the batches an uninterrupted one would);
  boundaries at checkpoints, evals and profile ends; held-out eval before the checkpoint of its
  step, unless a preemption notice is agreed on first (the checkpoint comes first then)."""

  def __init__(self, setup: run_setup.RunSetup, workdir: str, manager, train_iter, writer, bar,
               schedule: batch_schedule.BatchSchedule):
    self.setup, self.workdir, self.manager, self.train_iter = setup, workdir, manager, train_iter
    self.writer, self.progress, self.schedule = writer, bar, schedule
    self._flops: dict[int, float] = {}  # model FLOPs of a step, by global batch size
    config, t = setup.config, setup.config.train
    self.eval_step = setup.eval_step() if config.data.eval_files else None
    self.profile = tuple(int(x) for x in t.profile_steps.split(',')) if t.profile_steps else None
    self.profile_dir = None
    self.last_eval: dict[str, float] = {}

  def next_batch(self, step: int):
    """Step `step + 1`'s global batch on the devices (the copy runs asynchronously), its size
    by the schedule, and its real and padded tokens and model FLOPs, from host numpy: nothing
    here waits on a step."""
    local = self.schedule.local_batch(self.train_iter, step, jax.process_count())
    rows, d = self.schedule.batch_size_at(step), self.setup.config.data
    new_shape = rows not in self._flops
    if new_shape:
      self._flops[rows] = self.setup.objective.train_flops(
          rows, d.max_seq_length, d.max_predictions_per_seq)
    info = {'tokens': int(local['input_mask'].sum()) * jax.process_count(),
            'padded_tokens': rows * d.max_seq_length, 'flops': self._flops[rows],
            'new_shape': new_shape}
    return shd.global_batch(local, self.setup.mesh), info

  def before_step(self, step: int) -> None:
    if self.profile and step == self.profile[0] + 1:
      self.profile_dir = tempfile.mkdtemp(prefix='bert_jax_profile_')
      jax.profiler.start_trace(self.profile_dir)

  def _eval_due(self, step: int) -> bool:
    t = self.setup.config.train
    return self.eval_step is not None and (step % t.eval_every == 0 or step == t.num_steps)

  def is_boundary(self, step: int) -> bool:
    t = self.setup.config.train
    return (step % t.checkpoint_every == 0 or self._eval_due(step) or
            (self.profile is not None and step in self.profile))

  def saves_at(self, step: int) -> bool:
    t = self.setup.config.train
    return step % t.checkpoint_every == 0 or step == t.num_steps

  def at_boundary(self, state, step: int, preemption) -> bool:
    if self.profile and step == self.profile[1] and self.profile_dir:
      jax.profiler.stop_trace()  # the profiler writes local files only: copy them over
      fs.upload_dir(self.profile_dir, fs.join(self.workdir, 'profile',
                                              f'process_{jax.process_index()}'))
      shutil.rmtree(self.profile_dir, ignore_errors=True)
    if not self._eval_due(step):
      return True
    # A notice that arrived during the step is agreed on here, before an eval eats the grace
    # period: the checkpoint comes first and the eval is skipped.
    if preemption.reached():
      return False
    self.last_eval = evaluate(self.eval_step, state.params, self.setup,
                              per_process_batch(self.setup.config.train.global_batch_size))
    self.writer.write(step, self.last_eval, 'eval/')
    self.progress.write(f'step {step}: eval ' + ' '.join(
        f'{k}={v:.4f}' for k, v in sorted(self.last_eval.items())))
    return True

  def save(self, state, step: int) -> None:
    checkpointing.save(self.manager, step, state, self.train_iter, force=True)

  def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
    return {'loss': f'{metrics["loss"]:.3f}', 'mlm_acc': f'{metrics["mlm_accuracy"]:.3f}'}
