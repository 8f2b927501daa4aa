"""What every seed of a fine-tuning run shares (`Program`): the step geometry, the run setup
(bert_jax/training/run_setup.py) of the task's objective, and prediction over a whole split.

Batches come from input_pipeline/finetune/batching.py: rows of an epoch's permutation, cut to a
length bucket where the kind allows it, this process's share sent to the devices.
"""

from __future__ import annotations

import collections

import jax
import numpy as np
from jax.experimental import multihost_utils

from bert_jax.finetune import step as fst
from bert_jax.finetune.kinds import MODEL_INPUTS
from bert_jax.training import run_setup
from bert_jax.training import sharding as shd
from input_pipeline.finetune import batching


def local_rows(rows):
  """This process's contiguous share of a global batch's rows."""
  return rows.reshape(jax.process_count(), -1)[jax.process_index()]


NO_TOKEN_SCORE = -1e30  # logits at positions past a cut batch's length


def predict_all(predict, params, arrays: dict, batch: int, mesh, buckets: int = 1,
                token_outputs: bool = False) -> dict:
  """Outputs for every row of `arrays`, in order (padding rows dropped). Batches are cut to
  their `bucket_length`; `token_outputs` (tagging and span logits, [batch, tokens, ...]) are
  padded back to max_seq_length with a score no real token reaches."""
  n, full = len(arrays['input_ids']), arrays['input_ids'].shape[-1]
  outs = []
  for first in range(0, n, batch):
    rows = np.arange(first, first + batch)
    rows[rows >= n] = -1
    length = batching.bucket_length(arrays, rows, buckets)
    local = batching.take(arrays, local_rows(rows), MODEL_INPUTS, length)
    out = jax.device_get(predict(params, shd.global_batch(local, mesh)))
    if token_outputs and length < full:
      out = {k: np.pad(v, [(0, 0), (0, full - length)] + [(0, 0)] * (v.ndim - 2),
                       constant_values=NO_TOKEN_SCORE) for k, v in out.items()}
    outs.append(out)
  return {k: np.concatenate([o[k] for o in outs])[:n] for k in outs[0]}


def host_tree(tree):
  """A sharded tree as host numpy on every process (export)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


_SETUPS: collections.OrderedDict = collections.OrderedDict()


def setup_for(config, start_cfg, head, kind, total_steps: int,
              devices=None) -> run_setup.RunSetup:
  """The run setup (bert_jax/training/run_setup.py) of a task's objective over `devices` (default
  all; AOT passes a TPU topology's), one per distinct (model, head, optimizer, run length,
  mesh) in this process: seeds, a resumed call and repeated runs in one process (a notebook,
  the tests, the demo's arms) compile once."""
  key = (start_cfg, head, kind, config.optimizer.to_json(), total_steps, tuple(config.mesh),
         repr(config.sharding_rules), config.data.max_seq_length,
         None if devices is None else tuple(devices))
  if key not in _SETUPS:
    objective = fst.objective(start_cfg, head, kind, config.data.max_seq_length)
    _SETUPS[key] = run_setup.build(config, objective, total_steps, devices)
    while len(_SETUPS) > 4:
      _SETUPS.popitem(last=False)
  _SETUPS.move_to_end(key)
  return _SETUPS[key]


class Program:
  """What every seed of a run shares: the step geometry and the run setup."""

  def __init__(self, config, task, start, eval_batch: int):
    t = config.train
    self.eval_batch = eval_batch
    self.batch = t.global_batch_size
    self.steps_per_epoch = -(-task.num_train // self.batch)
    self.total_steps = self.steps_per_epoch * t.num_epochs
    self.stop_step = min(t.stop_after_epoch or t.num_epochs, t.num_epochs) * self.steps_per_epoch
    self.setup = setup_for(config, start.cfg, task.head, task.kind, self.total_steps)
    self.mesh = self.setup.mesh
    self.length_buckets = config.data.length_buckets
    self.token_outputs = task.kind.token_outputs
    self.train_buckets = self.length_buckets if task.kind.cut_training_rows else 1
    self.schema = task.kind.schema()

  def train_batch(self, arrays: dict, rows):
    """The rows of a training batch (-1: padding) cut to their length bucket, this process's
    share on the devices."""
    length = batching.bucket_length(arrays, rows, self.train_buckets)
    local = batching.take(arrays, local_rows(rows), self.schema.names, length,
                          self.schema.token_axis)
    return shd.global_batch(local, self.mesh)

  def train_step(self, state, batch):
    return self.setup.train_step()(state, batch)

  def predict(self, params, arrays: dict) -> dict:
    return predict_all(self.setup.eval_step(), params, arrays, self.eval_batch, self.mesh,
                       self.length_buckets, token_outputs=self.token_outputs)
