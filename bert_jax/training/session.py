"""What every run opens around the shared loop, in one place: its checkpoint manager, metric
writer and progress bar, closed in order however the run ends (the last checkpoint written
out before the manager closes). Pre-training (bert_jax/pretrain/run.py) and every seed of a
fine-tuning run (bert_jax/finetune/run.py) open one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

from bert_jax.training import checkpointing, progress
from bert_jax.training.loop import Hooks, Loop
from bert_jax.training.metric_writer import MetricWriter
from bert_jax.training.run_control import PreemptionFlag


class RunSession:
  """A run's outputs in `directory`; the bar opens once the resumed step is known."""

  def __init__(self, directory: str, manager, writer: MetricWriter):
    self.directory, self.manager, self.writer = directory, manager, writer
    self.bar = None

  def progress(self, total: int, step: int, desc: str):
    """The progress bar (the chief's only), starting at the resumed `step`."""
    self.bar = progress.progress_bar(total, step, desc=desc, unit='step',
                                     disable=jax.process_index() != 0)
    return self.bar

  def loop(self, train_step, hooks: Hooks, preemption: PreemptionFlag, log_every: int,
           **options) -> Loop:
    """The shared loop writing to this run's writer and bar; a non-finite step names the
    manager's latest checkpoint."""
    return Loop(train_step, hooks, preemption, self.writer, self.bar, log_every,
                latest_checkpoint=self.manager.latest_step, **options)


@contextlib.contextmanager
def open_run(directory: str, *, max_to_keep: int, keep_period: int | None = None,
             async_save: bool = False) -> Iterator[RunSession]:
  manager = checkpointing.make_manager(directory, max_to_keep=max_to_keep,
                                       keep_period=keep_period, async_save=async_save)
  session = RunSession(directory, manager, MetricWriter(directory))
  try:
    yield session
  finally:
    if session.bar is not None:
      session.bar.close()
    session.writer.close()
    manager.wait_until_finished()
    manager.close()
