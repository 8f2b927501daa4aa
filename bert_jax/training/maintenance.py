"""Cloud maintenance and spot preemption, read from the metadata server, as preemption notices.

Compute Engine tells a VM of what is about to end it through its metadata server:
`instance/maintenance-event` (`NONE`, `MIGRATE_ON_HOST_MAINTENANCE`,
`TERMINATE_ON_HOST_MAINTENANCE`; TensorFlow's `PreemptionCheckpointHandler` polls it:
tensorflow/python/distribute/failure_handling/gce_util.py) and, on spot VMs,
`instance/preempted` (`TRUE` once preemption has begun). `MaintenanceWatcher` polls both on a
daemon thread and turns a terminating event into the same notice a SIGTERM gives. With several
processes that is a SIGTERM to this process, since JAX's preemption sync manager (which
agrees on one step for every host) learns of notices only through that signal: whenever that
manager runs, which `jax.distributed.initialize` starts for one process too (a single-host TPU
slice launched with --tpu). Without it, the notice is a flag `run_control.PreemptionFlag`
reads, so no handler needs to be installed at the moment the event arrives.

Best effort on Cloud TPU: Compute Engine documents `maintenance-event` for VMs that migrate or
carry GPUs, and Cloud TPU VMs announce maintenance through the TPU API's
`upcomingMaintenance` instead, so on a TPU VM the SIGTERM that precedes a preemption stays
the notice that always comes; this watcher adds whatever the metadata server says earlier.

The server is found as Google's client libraries find it (google-auth's
compute_engine/_metadata.py): `GCE_METADATA_HOST`, else its old name `GCE_METADATA_ROOT`,
else `GCE_METADATA_IP` (TensorFlow's), else metadata.google.internal.
"""

from __future__ import annotations

import os
import signal
import threading
import urllib.error
import urllib.request

from absl import logging

EVENT_PATH = '/computeMetadata/v1/instance/maintenance-event'
PREEMPTED_PATH = '/computeMetadata/v1/instance/preempted'
TERMINATE = 'TERMINATE_ON_HOST_MAINTENANCE'
HOST_VARIABLES = ('GCE_METADATA_HOST', 'GCE_METADATA_ROOT', 'GCE_METADATA_IP')
DEFAULT_HOST = 'metadata.google.internal'

_notice = threading.Event()  # a terminating event was seen (read by PreemptionFlag)


def _named_host() -> str | None:
  return next((os.environ[v] for v in HOST_VARIABLES if os.environ.get(v)), None)


def metadata_host() -> str:
  return _named_host() or DEFAULT_HOST


def should_watch(on_tpu: bool) -> bool:
  """On Cloud TPU, or wherever a metadata server is named explicitly (a test, a GCE VM)."""
  return on_tpu or _named_host() is not None


def notice_pending() -> bool:
  """Whether a terminating maintenance event was seen by this process's watcher."""
  return _notice.is_set()


def read_value(host: str, path: str = EVENT_PATH, timeout: float = 10.0) -> str:
  """One metadata value (the maintenance event: `NONE` when there is none)."""
  request = urllib.request.Request(f'http://{host}{path}', headers={'Metadata-Flavor': 'Google'})
  with urllib.request.urlopen(request, timeout=timeout) as response:
    return response.read().decode().strip()


def terminating(path: str, value: str) -> bool:
  return value == (TERMINATE if path == EVENT_PATH else 'TRUE')


class MaintenanceWatcher:
  """Polls the maintenance event every `interval` seconds until a terminating one is seen."""

  def __init__(self, host: str, interval: float, via_sigterm: bool):
    self.host, self.interval, self.via_sigterm = host, interval, via_sigterm
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, name='maintenance-watcher', daemon=True)

  def start(self) -> 'MaintenanceWatcher':
    logging.info('watching http://%s for maintenance events and spot preemption every %.1f s',
                 self.host, self.interval)
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()

  def _watch(self) -> None:
    paths = [EVENT_PATH, PREEMPTED_PATH]
    failures = 0
    while not self._stop.is_set() and paths:
      for path in list(paths):
        try:
          value = read_value(self.host, path)
          failures = 0
        except urllib.error.HTTPError as e:
          if e.code == 404:  # not on this kind of VM: stop asking for it
            paths.remove(path)
            continue
          value, failures = '', failures + 1
        except Exception as e:  # pylint: disable=broad-except
          # A server that restarts, DNS, a cut-off reply: the watcher must outlive them all.
          value, failures = '', failures + 1
          if failures in (1, 10, 100):
            logging.warning('maintenance events: %s unreachable (%s); still trying', self.host,
                            e)
        if terminating(path, value):
          self._notify(path, value)
          return
      self._stop.wait(self.interval)

  def _notify(self, path: str, value: str) -> None:
    logging.warning('metadata server: %s is %s; saving at the next agreed step and exiting',
                    path.rsplit('/', 1)[-1], value)
    _notice.set()
    if self.via_sigterm:
      os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier listens to SIGTERM only
