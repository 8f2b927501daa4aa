"""Orbax checkpoints of pre-training and fine-tuning: one manager factory, one save, one restore.

A step directory `workdir/checkpoints/<step>/` holds the `state` item (params, optimizer
state, step, dropout rng; saved asynchronously, sharded), in pre-training the `data` item
(every process's tf.data iterator, `process_<i>/`) and in fine-tuning the `progress` item
(JSON: the scores of the epochs so far). Orbax writes into a temporary directory and renames it when
complete, so a save killed half-way never becomes the latest step. Restoring takes the target
shardings, so a checkpoint written on one mesh restores onto any other.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src.metadata import array_metadata_store

from input_pipeline import fs


class DataIteratorHandler(ocp.CheckpointHandler):
  """Saves/restores `input_pipeline.pretrain.dataset.DataIterator` of every process."""

  def save(self, directory: epath.Path, args: 'DataIteratorSave'):
    args.iterator.save(_process_dir(directory))

  def restore(self, directory: epath.Path, args: 'DataIteratorRestore'):
    path = _process_dir(directory)
    if not fs.exists(fs.join(path, 'it.index')):
      raise FileNotFoundError(f'{path}: no data-iterator state for process '
                              f'{jax.process_index()}; was the checkpoint written with fewer '
                              'processes? Restore with the same process count.')
    args.iterator.restore(path)
    return args.iterator


def _process_dir(directory: epath.Path) -> str:
  return fs.join(os.fspath(directory), f'process_{jax.process_index()}')


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
  iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
  iterator: Any


def checkpoint_dir(workdir: str) -> str:
  return fs.join(fs.absolute(workdir), 'checkpoints')


def data_process_count(workdir: str, step: int) -> int | None:
  """How many processes saved their data position in `step` (None: no data item)."""
  directory = fs.join(checkpoint_dir(workdir), str(step), 'data')
  if not fs.isdir(directory):
    return None
  return sum(1 for p in fs.listdir(directory) if fs.basename(p).startswith('process_'))


class _Manager(ocp.CheckpointManager):
  """Orbax's manager without its own preemption check.

  `CheckpointManager.save` asks `reached_preemption(step)` on every save, even a forced one,
  only to log it. That calls JAX's `reached_preemption_sync_point` with the training step,
  but JAX keeps one call counter per process, and run_control.PreemptionFlag feeds it a
  job-wide count of its own. A save's step in that sequence can move the agreed stop point
  below where every host's count already is. Fine-tuning with epoch-end saves then ignored a
  notice on a non-chief host (tests/test_finetune.py, the notice at the end of a seed).
  Our loops decide when to stop and save; this manager never consults the sync point."""

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


@functools.cache  # a process-wide orbax registration: once
def _replica_parallel_only_where_it_parallelizes() -> None:
  """Orbax splits the writing of an array that several devices hold among those replicas (its
  default, off only on GPUs). One process's CPU devices share one memory and one writer, so
  there the split only copies the array in slices, compiling a slicing program per leaf shape
  and device: 204 programs for BERT-tiny's train state on 8 CPU devices, ~7 CPU-s a run. Off
  there; on a pod (several processes) each process still writes its share."""
  if jax.default_backend() == 'cpu' and jax.process_count() == 1:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(
            use_replica_parallel=False,
            # the metadata store orbax's default jax.Array handler writes with (not exported)
            array_metadata_store=array_metadata_store.Store()), override=True)


def make_manager(workdir: str, *, max_to_keep: int = 3, keep_period: int | None = None,
                 async_save: bool = True) -> ocp.CheckpointManager:
  """The checkpoint manager of a run (pre-training) or of one fine-tuning seed's directory."""
  _replica_parallel_only_where_it_parallelizes()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, keep_period=keep_period or None, create=True,
      enable_async_checkpointing=async_save)
  return _Manager(
      checkpoint_dir(workdir), options=options,
      item_handlers={'state': ocp.StandardCheckpointHandler(), 'data': DataIteratorHandler(),
                     'progress': ocp.JsonCheckpointHandler()})


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator=None,
         force: bool = False, progress: dict | None = None) -> bool:
  items = {'state': ocp.args.StandardSave(state)}
  if data_iterator is not None:
    items['data'] = DataIteratorSave(data_iterator)
  if progress is not None:
    items['progress'] = ocp.args.JsonSave(progress)
  return manager.save(step, args=ocp.args.Composite(**items), force=force)


RESUME_HINT = ('Resume with the model.size, model.* shapes, model.scan_layers and optimizer.name '
               'the run was started with (its config.json), or start a new workdir from it with '
               '--config.train.init_from=<that workdir> (which takes the parameters in either '
               'layer layout).')


def restore(manager: ocp.CheckpointManager, step: int, abstract_state, data_iterator=None,
            *, with_progress: bool = False, what_to_do: str = RESUME_HINT):
  """State onto the shardings carried by `abstract_state` (any mesh), iterator in place;
  `(state, progress)` with `with_progress`.

  Raises ValueError, naming the leaves, when the checkpoint holds another state layout than
  `abstract_state` (another model size, `model.scan_layers` or optimizer): Orbax's own
  error for that names neither the cause nor the fix."""
  check_same_layout(manager, step, abstract_state, what_to_do)
  items = {'state': ocp.args.StandardRestore(abstract_state)}
  if data_iterator is not None:
    items['data'] = DataIteratorRestore(data_iterator)
  if with_progress:
    items['progress'] = ocp.args.JsonRestore()
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  return (restored['state'], restored['progress']) if with_progress else restored['state']


def check_same_layout(manager: ocp.CheckpointManager, step: int, abstract_state,
                      what_to_do: str) -> None:
  """ValueError naming a few differing leaves when checkpoint `step` does not hold the
  leaves (names and shapes) of `abstract_state`."""
  differ = leaf_differences(manager.item_metadata(step)['state'], abstract_state)
  if differ:
    raise ValueError(f'{manager.directory}/{step} holds another state layout than this run\'s '
                     f'config ({differ}). {what_to_do}')


def leaf_differences(saved_tree, wanted_tree, shown: int = 3,
                     labels: tuple[str, str] = ('saved', 'expected')) -> str:
  """'' when both trees have the same leaf names and shapes, else 'N leaves differ, e.g. ...'
  naming each leaf and both shapes (parameters first: they say it best). Shared by resume,
  `init_opt_state_from` and `start_points.check_compatible` (train.init_from)."""
  saved = {k: tuple(v.shape) for k, v in _leaves_by_name(saved_tree).items()}
  want = {k: tuple(v.shape) for k, v in _leaves_by_name(wanted_tree).items()}
  if saved == want:
    return ''
  diff = sorted((k for k in saved.keys() | want.keys() if saved.get(k) != want.get(k)),
                key=lambda k: (not k.startswith('params.'), k))
  shape = lambda v: 'absent' if v is None else v
  examples = ', '.join(f'{k}: {labels[0]} {shape(saved.get(k))} vs {labels[1]} '
                       f'{shape(want.get(k))}' for k in diff[:shown])
  return f'{len(diff)} leaves differ, e.g. {examples}'


def restore_params(workdir: str, step: int | None = None) -> tuple[int, Any]:
  """(step, params as host numpy) from a workdir's latest (or given) step: for phase-2 init
  and export, whatever optimizer or mesh wrote it."""
  directory = checkpoint_dir(workdir)
  if not fs.isdir(directory):
    raise FileNotFoundError(f'{workdir}: no checkpoints/ directory; is it a training workdir?')
  with ocp.CheckpointManager(directory, item_handlers={
      'state': ocp.PyTreeCheckpointHandler(), 'data': DataIteratorHandler()}) as manager:
    steps = manager.all_steps()
    if not steps:
      raise FileNotFoundError(f'{directory}: no complete checkpoint')
    if step is None:
      step = max(steps)
    elif step not in steps:
      raise ValueError(f'{directory}: no step {step}; available: {sorted(steps)}')
    params_meta = manager.item_metadata(step)['state'].tree['params']
    restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                          params_meta)
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item={'params': params_meta}, restore_args={'params': restore_args},
        partial_restore=True)))
  return step, restored['state']['params']


def restore_opt_moments(workdir: str, tx, fresh_opt_state, step: int | None = None) -> Any:
  """`fresh_opt_state` with its per-parameter leaves (Adam's mu and nu) taken from a workdir's
  checkpoint, as host numpy; counters (Adam's bias-correction count, the schedule's count) stay
  fresh. NVIDIA's phase 2 does this: run_pretraining.py loads phase 1's optimizer state and
  sets every 'step' to 0 before `optimizer.load_state_dict`.

  Raises ValueError when the saved optimizer state has other leaves or shapes than
  `fresh_opt_state` (another optimizer, model size or `model.scan_layers`)."""
  directory = checkpoint_dir(workdir)
  if not fs.isdir(directory):  # a URL too (gs:// workdirs)
    raise FileNotFoundError(f'{workdir}: no checkpoints/ directory; is it a training workdir?')
  with ocp.CheckpointManager(directory, item_handlers={
      'state': ocp.PyTreeCheckpointHandler(), 'data': DataIteratorHandler()}) as manager:
    step = max(manager.all_steps(), default=None) if step is None else step
    if step is None:
      raise FileNotFoundError(f'{directory}: no complete checkpoint')
    meta = manager.item_metadata(step)['state'].tree['opt_state']
    _check_same_leaves(workdir, step, meta, fresh_opt_state)
    restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    saved = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item={'opt_state': meta}, restore_args={'opt_state': restore_args},
        partial_restore=True)))['state']['opt_state']
  saved = _leaves_by_name(saved)
  is_moment = optax.tree_map_params(tx, lambda _: True, fresh_opt_state,
                                    transform_non_params=lambda _: False)
  return jax.tree_util.tree_map_with_path(
      lambda path, fresh, moment: saved[_path_name(path)] if moment else fresh,
      fresh_opt_state, is_moment)


def _path_name(path) -> str:
  """'1.mu.encoder.layers...': key paths of live optax states (attributes, indices) and of
  Orbax's saved trees (dicts, lists) spelled alike."""
  return '.'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k))))
                  for k in path)


def _leaves_by_name(tree) -> dict[str, Any]:
  return {_path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _check_same_leaves(workdir: str, step: int, saved_meta, fresh_opt_state) -> None:
  differ = leaf_differences(saved_meta, fresh_opt_state, shown=4)
  if not differ:
    return
  raise ValueError(
      f'train.init_opt_state_from=True: the optimizer state of {workdir} step {step} does not '
      f'match this run\'s ({differ}). Phase 1 must use the same '
      'optimizer.name, optimizer.weight_decay/clip_norm, model.size and model.scan_layers; '
      'otherwise set train.init_opt_state_from=False to start with fresh moments.')
