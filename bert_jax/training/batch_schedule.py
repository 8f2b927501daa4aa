"""Batch-size warmup (ModernBERT's recipe): the global batch grows from
`train.batch_warmup_min_size` to `train.global_batch_size` over `train.batch_warmup_steps`.

The shape follows ModernBERT's `BatchSizeWarmupScheduler` (AnswerDotAI/ModernBERT,
src/sequence_packer.py): the batch grows one increment at a time (there one micro-batch) from
the minimum to one increment below the full batch, each size held for an equal share of the
warmup, then the full batch. ModernBERT measures the warmup in tokens, with thresholds
proportional to the running sum of the sizes, so at a fixed row length each size lasts the
same number of steps; here the warmup is counted in steps, so the size is a pure function of
the step (`batch_size_at`) and a resumed run needs only its step to know it.

Determinism: the reader yields micro-batches of one increment (`unit`) of global rows, divided
over the processes, and step s trains on the next `micro_batches_at(s)` of them concatenated.
The reader's global record stream does not depend on the grouping, so a warmup run trains on
the no-warmup stream cut into other batches, 1 or 2 processes get the same global rows at
every step (the reader's `training_records`), and the reader's checkpointed position is exact
at every step. Without warmup the unit is the whole global batch: one reader batch a step, as
before. Each distinct size compiles the (jitted) train step once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
from absl import logging


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
  """Global rows per step. `warmup_steps=0`: always `global_batch_size`."""
  global_batch_size: int
  warmup_steps: int = 0
  min_size: int = 0  # global rows of the first steps
  increment: int = 0  # global rows the batch grows by: the reader's micro-batch

  @property
  def unit(self) -> int:
    """Global rows of one reader batch."""
    return self.increment if self.warmup_steps else self.global_batch_size

  def batch_size_at(self, step: int) -> int:
    """Global rows of the batch that takes the state from `step` to `step + 1`."""
    if step >= self.warmup_steps:
      return self.global_batch_size
    ramp = (self.global_batch_size - self.min_size) // self.increment  # sizes below the full
    return self.min_size + (step * ramp // self.warmup_steps) * self.increment

  def micro_batches_at(self, step: int) -> int:
    return self.batch_size_at(step) // self.unit

  def sizes(self) -> list[int]:
    """Every size the run trains on, in order (each compiles the step once)."""
    return sorted({self.batch_size_at(s) for s in range(self.warmup_steps + 1)})

  def local_batch(self, micro_batches: Iterator[dict[str, np.ndarray]], step: int,
                  process_count: int) -> dict[str, np.ndarray]:
    """This process's rows of step `step`'s batch: its next micro-batches, concatenated in
    reading order."""
    rows = self.unit // process_count
    parts = [next(micro_batches) for _ in range(self.micro_batches_at(step))]
    for part in parts:
      got = len(next(iter(part.values())))
      if got != rows:
        raise ValueError(
            f'the reader gave a batch of {got} rows, expected {rows} ({self.unit} global rows '
            f'of train.global_batch_size / train.batch_warmup_increment over {process_count} '
            'processes): was the data position restored from a run with other batch settings? '
            'Resume with the settings that wrote the checkpoint.')
    if len(parts) == 1:
      return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def from_config(train, process_count: int = 1, batch_shards: int = 1) -> BatchSchedule:
  """The schedule of a config's `train` block, checked against the run: every size must split
  evenly over the processes, the mesh's batch shards and `train.accum_steps`."""
  batch = train.global_batch_size
  steps = train.batch_warmup_steps
  min_size = train.batch_warmup_min_size
  increment = train.batch_warmup_increment or min_size
  accum_steps = train.accum_steps
  if steps < 0:
    raise ValueError(f'train.batch_warmup_steps={steps}: must be >= 0 (0 = no warmup)')
  if not steps:
    if min_size:
      logging.log_first_n(logging.WARNING, 'train.batch_warmup_min_size=%d has no effect: '
                          'train.batch_warmup_steps=0 (no batch-size warmup)', 1, min_size)
    return BatchSchedule(batch)
  if not 0 < min_size <= batch:
    raise ValueError(
        f'train.batch_warmup_steps={steps} needs train.batch_warmup_min_size in 1..'
        f'{batch} (train.global_batch_size), got {min_size}: set the first global batch size')
  if increment <= 0 or min_size % increment or batch % increment:
    raise ValueError(
        f'train.batch_warmup_increment={increment} must divide both '
        f'train.batch_warmup_min_size={min_size} and train.global_batch_size={batch}; '
        'set it to a common divisor (0 = the min size)')
  need = math.lcm(process_count, batch_shards, accum_steps)
  if increment % need:
    raise ValueError(
        f'train.batch_warmup_increment={increment} (0 = train.batch_warmup_min_size) must be '
        f'a multiple of {need}, so that every warmup batch splits evenly over the '
        f'{process_count} processes, the {batch_shards} batch shards of the mesh (data x fsdp)'
        f' and train.accum_steps={accum_steps} micro-batches; raise it, or set '
        'train.batch_warmup_steps=0')
  return BatchSchedule(batch, steps, min_size, increment)
