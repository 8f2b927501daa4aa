"""What stops a training loop early: a preemption notice (save, then return) and a non-finite
loss (stop without saving, so the last checkpoint stays the last good one).

Shared by pre-training (train.py) and fine-tuning (finetune.py); kept apart from both so the
fine-tuning entry point does not import the pre-training input pipeline (and TensorFlow).
"""

from __future__ import annotations

import signal


class NonFiniteError(RuntimeError):
  pass


class PreemptionFlag:
  """Set by SIGTERM; the loop saves at the next step boundary and returns."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)
