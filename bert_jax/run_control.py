"""What stops a training loop early: a preemption notice (save, then return) and a non-finite
loss (stop without saving, so the last checkpoint stays the last good one).

Shared by pre-training (train.py) and fine-tuning (finetune.py); kept apart from both so the
fine-tuning entry point does not import the pre-training input pipeline (and TensorFlow).
"""

from __future__ import annotations

import contextlib
import signal

from absl import logging


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


def start_processes(coordinator_address: str | None, num_processes: int | None,
                    process_id: int | None, tpu: bool) -> None:
  """Join a multi-process job: an explicit coordinator (local processes, GPU clusters), or Cloud
  TPU's own discovery; a single process needs neither."""
  import jax  # pylint: disable=g-import-not-at-top
  if coordinator_address:
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
  elif tpu:
    jax.distributed.initialize()


@contextlib.contextmanager
def user_errors():
  """Our own errors say what is wrong and what to do: print them as one line and exit 1; a
  traceback adds nothing for users."""
  try:
    yield
  except (OSError, ValueError, NonFiniteError) as e:
    logging.error('%s', e)
    raise SystemExit(f'error: {e}') from None
