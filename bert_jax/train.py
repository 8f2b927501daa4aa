"""The training loop: mesh, input pipeline, jitted step, checkpoints, metrics, in sections.

Resumes from the latest checkpoint in `workdir` automatically (state and data position), so a
preempted or killed run continues exactly where it stopped. SIGTERM (a TPU preemption notice)
saves at the next step boundary and returns normally. A non-finite loss or gradient stops the
run naming the step, without saving: the last checkpoint stays the last good one.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from typing import Any

import jax
from absl import logging

from bert_jax import checkpointing, flops, optim, progress, sharding as shd, start_points
from bert_jax.metric_writer import MetricWriter
from bert_jax.run_control import NonFiniteError, PreemptionFlag  # callers use train.NonFiniteError
from bert_jax import train_step as ts
from bert_jax.model import BertConfig
from input_pipeline import dataset as data_lib
from input_pipeline import fs


def model_config(config) -> BertConfig:
  m = config.model
  return BertConfig.from_preset(
      m.size, vocab_size=m.vocab_size, hidden_dropout=m.hidden_dropout,
      attention_dropout=m.attention_dropout, hidden_act=m.hidden_act, dtype=m.dtype,
      scan_layers=m.scan_layers, remat_policy=m.remat_policy, attention_impl=m.attention_impl)


def reader_config(config, files: str, batch_size: int, seed: int) -> data_lib.ReaderConfig:
  d = config.data
  return data_lib.ReaderConfig(
      files=files, batch_size=batch_size, max_seq_length=d.max_seq_length,
      max_predictions_per_seq=d.max_predictions_per_seq, packed=d.packed,
      max_instances_per_row=d.max_instances_per_row, shuffle_buffer=d.shuffle_buffer,
      seed=seed, dynamic_masking=d.dynamic_masking, whole_word_masking=d.whole_word_masking,
      pack=d.pack, pack_window=d.pack_window, vocab_size=config.model.vocab_size,
      threads=d.threads, vocab_file=d.vocab_file, spm_model=d.spm_model,
      do_lower_case=d.do_lower_case, sentence_objective=d.sentence_objective)


def per_process_batch(global_batch: int) -> int:
  if global_batch % jax.process_count():
    raise ValueError(f'train.global_batch_size={global_batch} is not divisible by the '
                     f'{jax.process_count()} processes')
  return global_batch // jax.process_count()


def evaluate(eval_step, params, config, batch_size: int, mesh) -> dict[str, float]:
  """Held-out MLM/NSP loss and accuracy over `train.eval_steps` batches (or the whole set)."""
  cfg = reader_config(config, config.data.eval_files, batch_size, config.seed)
  ds = data_lib.make_dataset(cfg, training=False, process_index=jax.process_index(),
                             process_count=jax.process_count())
  totals: dict[str, float] = {}
  for i, batch in enumerate(data_lib.DataIterator(ds, config.data.eval_files)):
    if i >= config.train.eval_steps:
      break
    sums = jax.device_get(eval_step(params, shd.global_batch(batch, mesh)))
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  if not totals:
    raise ValueError(f'data.eval_files={config.data.eval_files!r} yielded no batch')
  return {k: float(v) for k, v in ts.summarize(totals).items()}


def _initial_state(config, model_cfg, tx, mesh, rules):
  """Fresh, or from `train.init_from`'s params, optionally with its optimizer moments and fresh
  step counts (`train.init_opt_state_from`: NVIDIA's LAMB phase 2)."""
  with_moments = config.train.get('init_opt_state_from', False)
  if with_moments and not config.train.init_from:
    raise ValueError('train.init_opt_state_from=True needs train.init_from=<phase-1 workdir>; '
                     'set it, or set train.init_opt_state_from=False')
  if config.train.init_from:
    # Our workdir, an HF directory or a Google TF checkpoint (continued pre-training).
    step, params = start_points.pretraining_params(config.train.init_from, model_cfg)
    logging.info('initialising params%s from %s step %d (fresh step count and schedule)',
                 ' and optimizer moments' if with_moments else '', config.train.init_from, step)
    state = ts.state_from_params(params, model_cfg, tx, config.seed, mesh, rules)
    if with_moments:
      opt_state = checkpointing.restore_opt_moments(config.train.init_from, tx, state.opt_state,
                                                    step)
      state = state.replace(opt_state=jax.device_put(
          opt_state, ts.state_shardings(model_cfg, tx, mesh, rules).opt_state))
    return state
  return ts.create_train_state(model_cfg, tx, config.seed, mesh, rules)


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
  """Run (or resume) training to `train.num_steps`; returns the last train and eval metrics."""
  workdir = fs.absolute(workdir)
  if jax.process_index() == 0:  # export and eval read the run's config from here
    fs.check_writable(workdir)  # now, not after the first hours of training
    fs.write_text(fs.join(workdir, 'config.json'), config.to_json_best_effort(indent=2))
  model_cfg = model_config(config)
  rules = shd.normalize_rules(config.sharding_rules)
  t = config.train

  # --- mesh and optimizer
  mesh = shd.make_mesh(tuple(config.mesh))
  tx, schedule = optim.from_config(config.optimizer, t.num_steps)
  logging.info('mesh %s over %d devices, %d processes', dict(mesh.shape), jax.device_count(),
               jax.process_count())

  # --- input pipeline
  batch_size = per_process_batch(t.global_batch_size)
  train_ds = data_lib.make_dataset(
      reader_config(config, config.data.train_files, batch_size, config.seed), training=True,
      process_index=jax.process_index(), process_count=jax.process_count())
  train_iter = data_lib.DataIterator(train_ds, config.data.train_files)

  # --- state: resume, or fresh (optionally from a phase-1 workdir)
  manager = checkpointing.make_manager(workdir, max_to_keep=t.keep_checkpoints,
                                       keep_period=t.keep_every or None,
                                       async_save=t.async_checkpoint)
  shardings = ts.state_shardings(model_cfg, tx, mesh, rules)
  latest = manager.latest_step()
  if latest is not None:
    abstract = checkpointing.abstract_like(shardings, ts.abstract_train_state(model_cfg, tx))
    state = checkpointing.restore(manager, latest, abstract, train_iter)
    logging.info('resumed from %s step %d', workdir, latest)
  else:
    state = _initial_state(config, model_cfg, tx, mesh, rules)

  # --- update step
  objective = config.data.sentence_objective
  train_step = ts.jit_train_step(model_cfg, tx, schedule, mesh, rules, t.accum_steps, objective)
  eval_step = (ts.jit_eval_step(model_cfg, tx, mesh, rules, objective)
               if config.data.eval_files else None)
  step_flops = flops.train_flops_per_step(model_cfg, t.global_batch_size,
                                          config.data.max_seq_length,
                                          config.data.max_predictions_per_seq)
  peak = t.peak_flops_per_device or flops.peak_flops_per_device()

  # --- loop
  writer = MetricWriter(workdir)
  preemption = PreemptionFlag()
  profile = tuple(int(x) for x in t.profile_steps.split(',')) if t.profile_steps else None
  step = int(jax.device_get(state.step))
  first_step = step
  last_train: dict[str, float] = {}
  last_eval: dict[str, float] = {}
  progress = _progress_bar(step, t.num_steps)
  window_start, window_steps, window_tokens = time.time(), 0, 0
  try:
    while step < t.num_steps:
      if profile and step == profile[0]:
        profile_dir = tempfile.mkdtemp(prefix='bert_jax_profile_')
        jax.profiler.start_trace(profile_dir)
      batch = next(train_iter)
      window_tokens += int(batch['input_mask'].sum()) * jax.process_count()
      state, metrics = train_step(state, shd.global_batch(batch, mesh))
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      step += 1
      window_steps += 1
      if profile and step == profile[1]:
        jax.profiler.stop_trace()  # the profiler writes local files only: copy them over
        fs.upload_dir(profile_dir, fs.join(workdir, 'profile', f'process_{jax.process_index()}'))
        shutil.rmtree(profile_dir, ignore_errors=True)
      if not (math.isfinite(metrics['loss']) and math.isfinite(metrics['grad_norm'])):
        raise NonFiniteError(
            f'step {step}: loss={metrics["loss"]} grad_norm={metrics["grad_norm"]} is not '
            f'finite; stopped without saving, the last good checkpoint is step '
            f'{manager.latest_step()}. Lower optimizer.learning_rate or check the data.')
      progress.update(1)
      progress.set_postfix(loss=f'{metrics["loss"]:.3f}',
                           mlm_acc=f'{metrics["mlm_accuracy"]:.3f}', refresh=False)

      if step % t.log_every == 0 or step == t.num_steps:
        seconds = time.time() - window_start
        metrics['steps_per_second'] = window_steps / seconds
        metrics['tokens_per_second'] = (window_steps * t.global_batch_size *
                                        config.data.max_seq_length / seconds)
        metrics['nonpadding_tokens_per_second'] = window_tokens / seconds
        metrics['mfu'] = step_flops * window_steps / seconds / (peak * jax.device_count())
        if step - first_step <= window_steps:  # the window included compilation
          metrics.pop('mfu')
        writer.write(step, metrics, 'train/')
        last_train = metrics
        window_start, window_steps, window_tokens = time.time(), 0, 0

      if eval_step and (step % t.eval_every == 0 or step == t.num_steps):
        last_eval = evaluate(eval_step, state.params, config, batch_size, mesh)
        writer.write(step, last_eval, 'eval/')
        progress.write(f'step {step}: eval ' + ' '.join(
            f'{k}={v:.4f}' for k, v in sorted(last_eval.items())))

      if step % t.checkpoint_every == 0 or step == t.num_steps or preemption.requested:
        checkpointing.save(manager, step, state, train_iter, force=True)
      if preemption.requested:
        logging.warning('SIGTERM: saved step %d, exiting', step)
        break
  finally:
    manager.wait_until_finished()
    manager.close()
    preemption.restore()
    progress.close()
    writer.close()
  return {'step': step, 'train': last_train, 'eval': last_eval}


def _progress_bar(step: int, total: int):
  """A bar on a terminal, whole lines in logs (bert_jax.progress); process 0 only."""
  return progress.progress_bar(total, step, desc='train', unit='step',
                               disable=jax.process_index() != 0)
