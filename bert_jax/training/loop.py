"""The one training loop of pre-training and fine-tuning.

It owns what both need the same way: dispatching step N+1 before reading step N's metrics
(the device never waits on the host between steps), the non-finite rule (loss, gradient norm,
parameter norm: checked before any checkpoint is written, so the last one stays good), the
progress bar, the train metrics and their throughput, and preemption: a SIGTERM or a
maintenance event reaching any process is agreed on by all of them at a step
(`PreemptionFlag.reached`, one job-wide counter), and every process saves that step and
returns. What differs is a `Hooks` object: where the batches come from, which steps are
boundaries, what a boundary does (eval, epoch scoring, a profile) and what a checkpoint holds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax

from bert_jax.training import host_malloc, run_control
from bert_jax.training.metric_writer import MetricWriter


class Hooks:
  """What a run plugs into the loop. Batches are `(device_batch, info)`; `info` (real tokens,
  examples; padded tokens, FLOPs and `new_shape` where batch sizes vary by step) counts in the
  throughput and goes back to `record` with the step's metrics."""

  def next_batch(self, step: int) -> tuple[Any, dict]:
    """The batch of step `step + 1`, already on its way to the devices."""
    raise NotImplementedError

  def before_step(self, step: int) -> None:
    """Called before step `step` is dispatched (a profile's start)."""

  def is_boundary(self, step: int) -> bool:
    """Whether step `step` ends with a checkpoint or other work that must see its metrics."""
    return False

  def at_boundary(self, state, step: int, preemption: run_control.PreemptionFlag) -> bool:
    """Eval, scoring, profiles at a boundary. False when a preemption notice was agreed on
    first (`preemption.reached()` before long work): the loop then saves and stops."""
    return True

  def saves_at(self, step: int) -> bool:
    """Whether a boundary at `step` writes a checkpoint (a stop always does)."""
    return True

  def save(self, state, step: int) -> None:
    raise NotImplementedError

  def record(self, step: int, metrics: dict[str, float], info: dict) -> None:
    """A finished, finite step's metrics (host floats)."""

  def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
    """Progress-bar fields of a step."""
    return {'loss': f'{metrics["loss"]:.4f}'}


@dataclasses.dataclass
class Loop:
  """Runs `train_step` from the state's step to `until`. `label` names the run in errors
  ('step 7', 'seed 1 step 7'); `latest_checkpoint()` is named when a non-finite value stops
  it; train metrics go to `writer` every `log_every` steps with their throughput."""
  train_step: Any
  hooks: Hooks
  preemption: run_control.PreemptionFlag
  writer: MetricWriter
  progress: Any
  log_every: int
  latest_checkpoint: Any = lambda: None
  label: str = ''
  # Padded tokens and model FLOPs of a global batch (tokens_per_second, MFU), unless a batch's
  # info brings its own ('padded_tokens', 'flops': batch-size warmup changes them by step).
  tokens_per_step: int = 0
  flops_per_step: float | None = None
  peak_flops: float | None = None  # all devices

  def run(self, state, until: int):
    """(state, step, stopped): `stopped` when a preemption notice ended the run early."""
    step = self._first = int(jax.device_get(state.step))
    self._until = until
    self.last_train: dict[str, float] = {}
    self._window = _Window()
    pending = None  # (step, device metrics, info) dispatched but not yet read
    stopped = False
    if step < until:
      batch, info = self.hooks.next_batch(step)
    while step < until:
      self.hooks.before_step(step + 1)
      # A batch of a new shape compiles the step, in whichever window is open now.
      self._window.compiled |= bool(info.get('new_shape'))
      state, metrics = self.train_step(state, batch)
      step += 1
      stop = self.preemption.reached()
      boundary = stop or step == until or self.hooks.is_boundary(step)
      done = (step, metrics, info)
      if not boundary:
        batch, info = self.hooks.next_batch(step)  # read and copied while the step runs
      if pending:
        self._consume(*pending)  # the previous step: done, or the device is busy anyway
      pending = done
      if not boundary:
        continue
      self._consume(*pending)  # a checkpoint or eval sees only finite metrics
      pending = None
      stop = stop or not self.hooks.at_boundary(state, step, self.preemption)
      if stop or self.hooks.saves_at(step):
        self.hooks.save(state, step)
      if stop:
        stopped = True
        break
      if step < until:
        batch, info = self.hooks.next_batch(step)
    return state, step, stopped

  def _consume(self, step: int, metrics, info: dict) -> None:
    """Read a finished step's metrics: the non-finite check, progress, the log line."""
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    host_malloc.trim_if_over()  # a CPU process's kept memory, bounded (host_malloc says why)
    where = f'{self.label} step {step}'.strip()
    run_control.check_finite(metrics, where, self.latest_checkpoint())
    w = self._window
    w.steps += 1
    w.tokens += info.get('tokens', 0)
    w.examples += info.get('examples', 0)
    w.padded_tokens += info.get('padded_tokens', self.tokens_per_step)
    w.flops += info.get('flops', self.flops_per_step or 0.0)
    self.progress.update(1)
    self.progress.set_postfix(**self.hooks.postfix(metrics), refresh=False)
    self.hooks.record(step, metrics, info)
    if step % self.log_every and step != self._until:
      return
    seconds = max(time.time() - w.start, 1e-9)
    metrics['steps_per_second'] = w.steps / seconds
    if w.padded_tokens:
      metrics['tokens_per_second'] = w.padded_tokens / seconds
    if w.tokens:
      metrics['nonpadding_tokens_per_second'] = w.tokens / seconds
    if w.examples:
      metrics['examples_per_second'] = w.examples / seconds
    if w.flops and self.peak_flops and step - self._first > w.steps and not w.compiled:
      # the window did not include compilation
      metrics['mfu'] = w.flops / seconds / self.peak_flops
    self.writer.write(step, metrics, 'train/')
    self.last_train = metrics
    self._window = _Window()


@dataclasses.dataclass
class _Window:
  """The steps since the last log line, for their throughput."""
  start: float = dataclasses.field(default_factory=time.time)
  steps: int = 0
  tokens: int = 0  # real (non-padding)
  examples: int = 0
  padded_tokens: int = 0
  flops: float = 0.0
  compiled: bool = False  # a batch of a new shape was dispatched in it: no MFU
