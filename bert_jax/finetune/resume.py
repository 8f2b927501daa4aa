"""What a fine-tuning seed's checkpoint holds beside the train state, and how a seed resumes.

The progress item (`SeedProgress`): the scored epochs, the loss of the epoch in progress, the
prediction files written, and the geometry that says what a step means (training rows, batch,
steps over all epochs): a resumed run must agree, or its batches and learning rates would not
be the interrupted run's. An epoch end re-scored at an already saved step (a notice cut its
scoring short; Orbax keeps one checkpoint per step) is kept beside it in `rescored.json`.
"""

from __future__ import annotations

import dataclasses
import json

import jax
from absl import logging

from bert_jax.convert import start_points
from bert_jax.finetune.results import strict_json
from bert_jax.training import checkpointing
from input_pipeline import fs

# A checkpoint's progress item: 2 = every score on a 0-1 scale (SQuAD's were percentages).
# A kind's `scores_version` is the first version its scores compare with today's.
SCORES_VERSION = 2


@dataclasses.dataclass
class SeedProgress:
  """A seed's scores and files so far, as checkpointed with its state."""
  geometry: dict
  history: list = dataclasses.field(default_factory=list)
  epoch_loss: list = dataclasses.field(default_factory=lambda: [0.0, 0])  # sum, steps
  prediction_files: list = dataclasses.field(default_factory=list)

  def item(self) -> dict:
    return {'history': self.history, 'epoch_loss': self.epoch_loss,
            'prediction_files': self.prediction_files, 'geometry': self.geometry,
            'scores_version': SCORES_VERSION}


def geometry(task, program) -> dict:
  return {'num_train': task.num_train, 'batch_size': program.batch,
          'total_steps': program.total_steps}


class SeedCheckpoints:
  """A seed's directory: its checkpoints (through `manager`) and `rescored.json`."""

  def __init__(self, directory: str, manager, progress: SeedProgress):
    self.dir, self.manager, self.progress = directory, manager, progress
    self.is_chief = jax.process_index() == 0

  @property
  def _rescored_path(self) -> str:
    return fs.join(self.dir, 'rescored.json')

  def write_rescored(self, step: int) -> None:
    """The scores of an epoch end re-done at an already saved step, so later runs do not
    score it again."""
    if self.is_chief:
      fs.write_text(self._rescored_path,
                    json.dumps({'step': step, 'progress': strict_json(self.progress.item())}))

  def _read_rescored(self, step: int) -> dict | None:
    if not fs.exists(self._rescored_path):
      return None
    saved = json.loads(fs.read_text(self._rescored_path))
    return saved['progress'] if saved['step'] == step else None

  def save(self, state, step: int) -> None:
    checkpointing.save(self.manager, step, state, progress=self.progress.item(), force=True)
    self.manager.wait_until_finished()

  def _check_geometry(self, saved: dict) -> None:
    ours = self.progress.geometry
    if saved == ours:
      return
    raise ValueError(
        f'{self.dir}: its checkpoint was written by a run with {saved} (training rows, batch '
        f'size, steps over all epochs), this config gives {ours}; resume with the '
        'same data, train.global_batch_size and train.num_epochs (train.stop_after_epoch ends '
        'a run early without changing it), or use a fresh --workdir')

  def initial_state(self, setup, task, start, seed: int, fresh_head: bool):
    """The latest checkpoint (state and scores so far), else the start point plus a head."""
    latest = self.manager.latest_step()
    if latest is not None:
      state, progress_item = checkpointing.restore(
          self.manager, latest, setup.abstract_state(), with_progress=True,
          what_to_do='Resume with the model.scan_layers (and task) the run was started with '
          '(its config.json: older fine-tuning runs were scanned, '
          '--config.model.scan_layers=True), or fine-tune into a new workdir.')
      saved = self._read_rescored(latest) or progress_item
      self._check_geometry(saved['geometry'])
      if saved.get('scores_version', 1) < task.kind.scores_version and saved['history']:
        raise ValueError(
            f'{self.dir}: its checkpoint was written when {task.kind.name} scores were on '
            'another scale (SQuAD scores were percentages; they are 0-1 now, like every '
            'task\'s), so its best epoch could not be compared with new ones; fine-tune into a '
            'new --workdir')
      p = self.progress
      p.history, p.epoch_loss = saved['history'], list(saved['epoch_loss'])
      p.prediction_files = list(saved['prediction_files'])
      logging.info('seed %d: resumed from step %d (%d epochs done)', seed, latest,
                   len(p.history))
      return state
    if start.kind == start_points.RANDOM:  # random:<...>: every seed its own random encoder
      start = start_points.randomized(start, jax.random.fold_in(jax.random.key(seed), 1))
    _, params = start_points.init_head_params(start, task.head, rng=jax.random.key(seed),
                                              fresh_head=fresh_head)
    return setup.state_from_params(params, seed)
