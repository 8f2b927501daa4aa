"""What stops a training loop early: a preemption notice (save, then return) and a non-finite
loss (stop without saving, so the last checkpoint stays the last good one); and what must not
stop one: a stdout or stderr whose reader has gone away.

Shared by pre-training (train.py) and fine-tuning (finetune.py); kept apart from both so the
fine-tuning entry point does not import the pre-training input pipeline (and TensorFlow).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import os
import signal
import sys

from absl import app, flags, logging

from bert_jax.training import maintenance


class NonFiniteError(RuntimeError):
  pass


FINITE_METRICS = ('loss', 'grad_norm', 'param_norm')


def check_finite(metrics: dict[str, float], where: str, last_checkpoint: int | None) -> None:
  """The one non-finite rule of every training loop (pre-training and fine-tuning): a step
  whose loss, gradient norm or parameter norm is not finite stops the run before anything
  is saved, so the last checkpoint stays the last good one. A NaN gradient can leave the
  loss finite for a step while the parameters are already ruined."""
  if all(math.isfinite(metrics[k]) for k in FINITE_METRICS if k in metrics):
    return
  values = ' '.join(f'{k}={metrics[k]}' for k in FINITE_METRICS if k in metrics)
  kept = ('no checkpoint yet' if last_checkpoint is None else
          f'the last good checkpoint is step {last_checkpoint}')
  raise NonFiniteError(f'{where}: {values} is not finite; stopped without saving ({kept}). '
                       'Lower --config.optimizer.learning_rate or check the data.')


def preemption_sync_running() -> bool:
  """Whether JAX's preemption sync manager runs in this process: after
  `jax.distributed.initialize`, with one process as with many (a single-host TPU slice
  started with --tpu). It then owns SIGTERM, and a notice must reach it as one."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return (distributed.global_state.client is not None and
          distributed.global_state.preemption_sync_manager is not None)


_SYNC_POINT_CALLS = itertools.count(1)  # PreemptionFlag.reached calls in this process


class PreemptionFlag:
  """A preemption notice (SIGTERM, or a Cloud maintenance event) that every process acts on at
  the same point of the job.

  Loops call `reached()` at the points where they could stop (after every step; before an
  eval, a test prediction or an export), on every process the same number of times, and save
  then return when it is True. One process: our own SIGTERM handler or the maintenance
  watcher (bert_jax/training/maintenance.py) sets a flag. Several processes: a notice may reach one
  host only, or the hosts at different points; a host that stopped alone would leave the
  others waiting in the next collective forever. JAX's preemption sync manager (started by
  `jax.distributed.initialize`, which installs its own SIGTERM handler, so ours must not
  replace it) spreads the notice through the coordination service and names the point all
  hosts stop at: the largest counter any host has reached, plus one. JAX requires that
  counter to be one monotonic sequence from a common start, so it is the process's count of
  `reached()` calls (every flag of the process continues it: a notebook that fine-tunes twice
  in one job too), not a training step, which restarts with every fine-tuning seed.
  """

  def __init__(self):
    self._synced = preemption_sync_running()
    self._requested = False
    self._previous = None if self._synced else signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self._requested = True

  def reached(self) -> bool:
    """True at the point every process stops at; call at the same points everywhere."""
    calls = next(_SYNC_POINT_CALLS)
    if self._synced:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      self._requested = multihost_utils.reached_preemption_sync_point(calls)
    elif maintenance.notice_pending():
      self._requested = True
    return self._requested

  @property
  def requested(self) -> bool:
    """Whether the last `reached` said stop."""
    return self._requested

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def __enter__(self) -> 'PreemptionFlag':
    return self

  def __exit__(self, *exc) -> None:
    """SIGTERM gets its previous handler back however the run ends."""
    self.restore()


def define_process_flags() -> None:
  """The flags that join a multi-process job, shared by every entry point that trains."""
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (multi-host, not TPU).')
  flags.DEFINE_integer('num_processes', None, 'Processes in the job (multi-host, not TPU).')
  flags.DEFINE_integer('process_id', None, 'This process (multi-host, not TPU).')
  flags.DEFINE_bool('tpu', False, 'Call jax.distributed.initialize() (Cloud TPU pods).')
  flags.DEFINE_float('maintenance_poll_seconds', 5.0, 'How often to read the metadata '
                     "server's maintenance event (on Cloud TPU, or when GCE_METADATA_HOST is "
                     'set); a terminating event is a preemption notice. 0 disables.')


def start_processes() -> None:
  """Join a multi-process job as the flags of `define_process_flags` say: an explicit
  coordinator (local processes, GPU clusters), or Cloud TPU's own discovery; a single process
  needs neither."""
  import jax  # pylint: disable=g-import-not-at-top
  tolerate_closed_output()
  fewer_collections()
  f = flags.FLAGS
  if f.coordinator_address:
    jax.distributed.initialize(f.coordinator_address, f.num_processes, f.process_id)
  elif f.tpu:
    jax.distributed.initialize()
  if f.maintenance_poll_seconds > 0 and maintenance.should_watch(f.tpu):
    maintenance.MaintenanceWatcher(maintenance.metadata_host(), f.maintenance_poll_seconds,
                                   via_sigterm=preemption_sync_running()).start()


# The collector's first generation runs every 10,000 net allocations instead of Python's 700.
GEN0_THRESHOLD = 10_000


def fewer_collections() -> None:
  """At a CLI's start: tracing and lowering the steps allocate millions of short-lived
  objects, so Python's default collects every 700 allocations, and with every tenth and
  hundredth of those collections walks the older generations too (TensorFlow's, JAX's and
  Flax's modules): a tiny pre-training run's ~1,100 collections cost 0.9-1.1 of its 7-8
  CPU-seconds, 72 at this threshold 0.25-0.35. The older generations keep their ratios to
  it, so cycles are still freed within a few million allocations."""
  gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])


def skip_exit_collection() -> None:
  """At the end of a CLI's main: everything alive is about to go, so the collector's last full
  pass over it (TensorFlow's, JAX's and Flax's millions of objects) is wasted: a tiny
  pre-training run's exit after its result took 1.2 s with it and 0.25 s without. The exit
  handlers (checkpoint commits, the coordinator's shutdown) still run."""
  gc.freeze()


@contextlib.contextmanager
def user_errors():
  """Our own errors say what is wrong and what to do: print them as one line and exit 1; a
  traceback adds nothing for users."""
  try:
    yield
  except (OSError, ValueError, NonFiniteError) as e:
    logging.error('%s', e)
    raise SystemExit(f'error: {e}') from None


class ClosedReaderTolerant:
  """stdout or stderr whose reader may go away (a closed laptop, a dropped ssh, `| head`).

  Python ignores SIGPIPE, so a write to a pipe nobody reads raises BrokenPipeError: from a
  progress line, a log line or the final result that ended a days-long run without a
  checkpoint. On the first one this stream points its file descriptor at /dev/null, so later
  writes (ours, C++ logging on the same descriptor, the interpreter's flush at exit) succeed,
  and training goes on; metrics.jsonl, checkpoints and a log file written by the launcher
  (launch/run_worker.sh sends the output to a file, not a pipe) are not affected.
  """

  def __init__(self, stream):
    self._stream = stream
    self._dropped = False

  def write(self, text):
    if not self._dropped:
      try:
        return self._stream.write(text)
      except BrokenPipeError:
        self._drop()
    return len(text)

  def writelines(self, lines):
    for line in lines:
      self.write(line)

  def flush(self):
    if not self._dropped:
      try:
        self._stream.flush()
      except BrokenPipeError:
        self._drop()

  def _drop(self):
    try:
      devnull = os.open(os.devnull, os.O_WRONLY)
      try:
        os.dup2(devnull, self._stream.fileno())
      finally:
        os.close(devnull)
      self._stream.flush()  # what the pipe refused goes to /dev/null, not into the next write
    except (OSError, ValueError):  # no descriptor (a test's in-memory stream): drop writes here
      self._dropped = True

  def __getattr__(self, name):
    return getattr(self._stream, name)


def tolerate_closed_output() -> None:
  """Wraps sys.stdout and sys.stderr in `ClosedReaderTolerant`, once; absl's log handler, which
  kept the stderr it found at import, writes through the wrapper too."""
  handler = logging.get_absl_handler().python_handler
  for name in ('stdout', 'stderr'):
    stream = getattr(sys, name)
    if stream is None or isinstance(stream, ClosedReaderTolerant):
      continue
    wrapped = ClosedReaderTolerant(stream)
    setattr(sys, name, wrapped)
    if handler.stream is stream:
      handler.stream = wrapped


def finetune_config(argv, flag_values):
  """The start of the programs that take a fine-tuning config and a start point (python -m
  bert_jax.finetune, .mine, .beir_eval): no stray arguments, library INFO logs quiet, and
  `--init` (when given) written into `config.init`. Returns the config."""
  from bert_jax.training import log_filters  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  log_filters.quiet_library_info()
  config = flag_values.config
  if flag_values.init:
    config.init = flag_values.init
  return config
