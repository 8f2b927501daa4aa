"""Orbax checkpoints: train state + each host's data-iterator position, in one step directory.

A step directory `workdir/checkpoints/<step>/` holds the `state` item (params, optimizer
state, step, dropout rng; saved asynchronously, sharded) and the `data` item (every process's
tf.data iterator, `process_<i>/`). Orbax writes into a temporary directory and renames it when
complete, so a save killed half-way never becomes the latest step. Restoring takes the target
shardings, so a checkpoint written on one mesh restores onto any other.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from input_pipeline import fs


class DataIteratorHandler(ocp.CheckpointHandler):
  """Saves/restores `input_pipeline.dataset.DataIterator` of every process."""

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


def make_manager(workdir: str, *, max_to_keep: int = 3, keep_period: int | None = None,
                 async_save: bool = True) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, keep_period=keep_period or None, create=True,
      enable_async_checkpointing=async_save)
  return ocp.CheckpointManager(
      checkpoint_dir(workdir), options=options,
      item_handlers={'state': ocp.StandardCheckpointHandler(), 'data': DataIteratorHandler()})


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator=None,
         force: bool = False) -> bool:
  items = {'state': ocp.args.StandardSave(state)}
  if data_iterator is not None:
    items['data'] = DataIteratorSave(data_iterator)
  return manager.save(step, args=ocp.args.Composite(**items), force=force)


def restore(manager: ocp.CheckpointManager, step: int, abstract_state, data_iterator=None):
  """State onto the shardings carried by `abstract_state` (any mesh), iterator in place."""
  items = {'state': ocp.args.StandardRestore(abstract_state)}
  if data_iterator is not None:
    items['data'] = DataIteratorRestore(data_iterator)
  return manager.restore(step, args=ocp.args.Composite(**items))['state']


def abstract_like(shardings, shapes) -> Any:
  """ShapeDtypeStructs with target shardings: what `restore` reshards onto."""
  return jax.tree_util.tree_map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


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
