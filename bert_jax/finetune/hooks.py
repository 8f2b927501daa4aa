"""The loop hooks of one fine-tuning seed: batches from the epoch's permutation, epoch ends as
boundaries, and what an epoch end does.

An epoch's end (dev scores; then, when the epoch is the best so far, test scores, unlabelled
splits' prediction files and the export) is done whole or not at all: a preemption notice
agreed on before the dev or the test predictions or before the export makes it return False,
with nothing recorded or written; the loop saves the trained state at once and the resumed run
redoes the whole epoch end from the same state (the same scores, files and export).
"""

from __future__ import annotations

import time

import jax
from absl import logging

from bert_jax.finetune import results as results_lib, tasks as finetune_tasks
from bert_jax.finetune.program import Program, host_tree
from bert_jax.finetune.resume import SeedCheckpoints
from bert_jax.training.loop import Hooks
from input_pipeline import fs
from input_pipeline.finetune import batching


class EpochHooks(Hooks):

  def __init__(self, program: Program, task, start, seed: int, checkpoints: SeedCheckpoints,
               export_dir: str | None, writer, bar, preemption):
    self.program, self.task, self.start, self.seed = program, task, start, seed
    self.checkpoints, self.progress = checkpoints, checkpoints.progress
    self.export_dir, self.writer, self.bar, self.preemption = export_dir, writer, bar, preemption
    self.is_chief = jax.process_index() == 0
    self._timer = Throughput()  # examples per second of the epoch in progress
    self._rows = (None, None)  # (epoch, its [steps, batch] rows)

  # ------------------------------------------------------------------- the loop's calls

  def next_batch(self, step: int):
    """Step `step + 1`'s rows of the epoch's permutation (seed, epoch), cut to their length
    bucket; this process's share goes to the devices."""
    p = self.program
    epoch, b = divmod(step, p.steps_per_epoch)
    if self._rows[0] != epoch:
      self._rows = (epoch, batching.epoch_rows(self.seed, epoch, self.task.num_train, p.batch))
    rows = self._rows[1][b]
    return p.train_batch(self.task.train, rows), {'examples': int((rows >= 0).sum())}

  def is_boundary(self, step: int) -> bool:
    return step % self.program.steps_per_epoch == 0

  def at_boundary(self, state, step: int, preemption) -> bool:
    return self.end_epoch(state, step)

  def save(self, state, step: int) -> None:
    self.checkpoints.save(state, step)

  def record(self, step: int, metrics: dict[str, float], info: dict) -> None:
    loss = self.progress.epoch_loss
    self.progress.epoch_loss = [loss[0] + metrics['loss'], loss[1] + 1]
    self._timer.step(info['examples'])

  def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
    epoch = len(self.progress.history) + 1
    return {'epoch': str(epoch), 'loss': f'{metrics["loss"]:.4f}'}

  # ------------------------------------------------------------------- epoch ends

  def epoch_unscored(self, step: int) -> bool:
    """An epoch ended at `step` and its scores are not in the history yet."""
    spe = self.program.steps_per_epoch
    return step > 0 and step % spe == 0 and len(self.progress.history) < step // spe

  def end_epoch(self, state, step: int) -> bool:
    """Score the dev splits; if this epoch is the best so far, score the test splits, write
    the unlabelled ones' predictions and export. False when a notice stopped it (see the
    module docstring)."""
    if self.preemption.reached():
      return False
    loss_sum, loss_steps = self.progress.epoch_loss
    record = {'epoch': step // self.program.steps_per_epoch, 'step': step,
              'train_loss': loss_sum / max(loss_steps, 1),
              'train_examples_per_second': self._timer.rate(), 'scores': {}}
    for split in self.task.evals:
      if split.role == 'dev':
        outputs = self.program.predict(state.params, split.arrays)
        record['scores'][split.name] = self.task.score(split, outputs)
    if self.preemption.reached():
      return False
    history = self.progress.history + [record]
    best = results_lib.best_epoch_index(history, self.task.select_split.name) == len(history) - 1
    unlabelled = self._score_tests(state, record) if best else []
    # A multi-host export (every host gathers the params, the chief writes them) can outlast
    # the grace period, so a notice that came during the test predictions stops here too.
    # Every process decides `best` and `export_dir` alike, so all reach this check together.
    if best and self.export_dir and self.preemption.reached():
      return False
    self.progress.epoch_loss = [0.0, 0]
    self._timer = Throughput()
    self.progress.history = history
    if best:
      record['best'] = True
      self.progress.prediction_files = [
          self.task.write_predictions(split, outputs, self.checkpoints.dir)
          for split, outputs in unlabelled]
      if self.export_dir:
        self._export(state)
    self.writer.write(step, results_lib.flat_scores(record), 'eval/')
    self.bar.write(self.epoch_line(record))
    return True

  def _score_tests(self, state, record) -> list:
    """Predict the test splits (every process: the predictions are collective); labelled
    ones are scored into `record`, unlabelled ones come back as (split, outputs) for the
    chief to write once the epoch end is certain to finish (none on other processes)."""
    unlabelled = []
    for split in self.task.evals:
      if split.role != 'test':
        continue
      outputs = self.program.predict(state.params, split.arrays)
      if split.labelled:
        record['scores'][split.name] = self.task.score(split, outputs)
      elif self.is_chief:
        unlabelled.append((split, outputs))
    return unlabelled

  def _export(self, state) -> None:
    params = host_tree(state.params)
    if not self.is_chief:
      return
    with fs.staged_dir(self.export_dir) as local:
      self.task.kind.export(local, self.start, self.task.head, params)
    logging.info('seed %d: exported epoch %d to %s', self.seed, len(self.progress.history),
                 self.export_dir)

  def epoch_line(self, record: dict) -> str:
    """`seed 0 epoch 2: dev accuracy=0.8512 (majority-class baseline 0.5012), ...`; SQuAD's
    detail scores (EM, SQuAD 2.0's best thresholds) follow its F1's baseline."""
    parts = []
    fmt = results_lib.fmt
    for split in self.task.evals:
      scores = record['scores'].get(split.name)
      if scores is not None:
        name = self.task.headline_name(split)
        base = self.task.baseline(split)['headline']
        parts.append(f'{split.name} {name}={fmt(scores["headline"])} '
                     f'({self.task.kind.baseline_name} baseline {fmt(base)})'
                     + finetune_tasks.format_details(scores))
    rate = record['train_examples_per_second']
    speed = f', {rate:.1f} examples/s' if rate else ''
    best = ' (best so far)' if record.get('best') else ''
    return (f'seed {self.seed} epoch {record["epoch"]}: ' + ', '.join(parts) +
            f', train loss {record["train_loss"]:.4f}{speed}{best}')


class Throughput:
  """Examples per second over an epoch's steps, not counting the run's first step (which
  includes compilation)."""

  def __init__(self):
    self.start, self.examples, self.steps = None, 0, 0

  def step(self, examples: int) -> None:
    self.steps += 1
    if self.start is None:
      self.start = time.perf_counter()
      return
    self.examples += examples

  def rate(self) -> float | None:
    if self.start is None or self.steps < 2:
      return None
    return self.examples / max(time.perf_counter() - self.start, 1e-9)
