"""What stops a training loop early: a preemption notice (save, then return) and a non-finite
loss (stop without saving, so the last checkpoint stays the last good one).

Shared by pre-training (train.py) and fine-tuning (finetune.py); kept apart from both so the
fine-tuning entry point does not import the pre-training input pipeline (and TensorFlow).
"""

from __future__ import annotations

import contextlib
import signal

from absl import flags, logging


class NonFiniteError(RuntimeError):
  pass


class PreemptionFlag:
  """A preemption notice (SIGTERM) that every process acts on at the same step.

  Loops call `reached(step)` once per step, on every process, and save then return when it is
  True. One process: our own SIGTERM handler sets a flag. Several processes: a SIGTERM may
  reach one host only, or the hosts at different steps; a host that stopped alone would leave
  the others waiting in the next step's collectives forever. JAX's preemption sync manager
  (started by `jax.distributed.initialize`, which installs its own SIGTERM handler, so ours
  must not replace it) spreads the notice through the coordination service and names the
  step all hosts save at: the largest step any host has reached, plus one.
  """

  def __init__(self):
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    self._synced = (distributed.global_state.client is not None and
                    distributed.global_state.preemption_sync_manager is not None)
    self._requested = False
    self._previous = None if self._synced else signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self._requested = True

  def reached(self, step: int) -> bool:
    """True at the step every process saves at and stops; call once per step, everywhere."""
    if self._synced:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      self._requested = multihost_utils.reached_preemption_sync_point(step)
    return self._requested

  @property
  def requested(self) -> bool:
    """Whether the last `reached` said stop."""
    return self._requested

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def define_process_flags() -> None:
  """The flags that join a multi-process job, shared by every entry point that trains."""
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (multi-host, not TPU).')
  flags.DEFINE_integer('num_processes', None, 'Processes in the job (multi-host, not TPU).')
  flags.DEFINE_integer('process_id', None, 'This process (multi-host, not TPU).')
  flags.DEFINE_bool('tpu', False, 'Call jax.distributed.initialize() (Cloud TPU pods).')


def start_processes() -> None:
  """Join a multi-process job as the flags of `define_process_flags` say: an explicit
  coordinator (local processes, GPU clusters), or Cloud TPU's own discovery; a single process
  needs neither."""
  import jax  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  if f.coordinator_address:
    jax.distributed.initialize(f.coordinator_address, f.num_processes, f.process_id)
  elif f.tpu:
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
