"""Cloud maintenance events as preemption notices.

On Cloud TPU VMs (and GCE VMs) the host is told of an impending maintenance through the
metadata server's `instance/maintenance-event` (`NONE`, `MIGRATE_ON_HOST_MAINTENANCE`,
`TERMINATE_ON_HOST_MAINTENANCE`), not only by a SIGTERM; TensorFlow's
`PreemptionCheckpointHandler` polls the same key (tensorflow/python/distribute/
failure_handling/gce_util.py, `termination_watcher_function_gce`). A `TERMINATE_...` event
ends the VM, so it is a preemption notice: `MaintenanceWatcher` polls the key on a daemon
thread and, when the event turns up, raises the same notice a SIGTERM would. With several
processes that is a SIGTERM to this process, since JAX's preemption sync manager (which
agrees on one step for every host) learns of notices only through that signal; with one
process it is a flag `run_control.PreemptionFlag` reads, so no handler needs to be installed
at the moment the event arrives.

The server is found as Google's client libraries find it (google-auth's
`_metadata.py`): `GCE_METADATA_HOST`, else `GCE_METADATA_IP`, else metadata.google.internal.
"""

from __future__ import annotations

import os
import signal
import threading
import urllib.error
import urllib.request

from absl import logging

EVENT_PATH = '/computeMetadata/v1/instance/maintenance-event'
TERMINATE = 'TERMINATE_ON_HOST_MAINTENANCE'
DEFAULT_HOST = 'metadata.google.internal'

_notice = threading.Event()  # a terminating event was seen (read by PreemptionFlag)


def metadata_host() -> str:
  return (os.environ.get('GCE_METADATA_HOST') or os.environ.get('GCE_METADATA_IP') or
          DEFAULT_HOST)


def should_watch(on_tpu: bool) -> bool:
  """On Cloud TPU, or wherever a metadata server is named explicitly (a test, a GCE VM)."""
  return on_tpu or bool(os.environ.get('GCE_METADATA_HOST') or os.environ.get('GCE_METADATA_IP'))


def notice_pending() -> bool:
  """Whether a terminating maintenance event was seen by this process's watcher."""
  return _notice.is_set()


def read_event(host: str, timeout: float = 10.0) -> str:
  """The current maintenance event (`NONE` when there is none)."""
  request = urllib.request.Request(f'http://{host}{EVENT_PATH}',
                                   headers={'Metadata-Flavor': 'Google'})
  with urllib.request.urlopen(request, timeout=timeout) as response:
    return response.read().decode().strip()


class MaintenanceWatcher:
  """Polls the maintenance event every `interval` seconds until a terminating one is seen."""

  def __init__(self, host: str, interval: float, multi_process: bool):
    self.host, self.interval, self.multi_process = host, interval, multi_process
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, name='maintenance-watcher', daemon=True)

  def start(self) -> 'MaintenanceWatcher':
    logging.info('watching http://%s%s every %.0f s for %s', self.host, EVENT_PATH,
                 self.interval, TERMINATE)
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()

  def _watch(self) -> None:
    failures = 0
    while not self._stop.is_set():
      try:
        event = read_event(self.host)
        failures = 0
      except (OSError, urllib.error.URLError) as e:  # transient: the server restarts, DNS
        failures += 1
        if failures in (1, 10, 100):
          logging.warning('maintenance events: %s unreachable (%s); still trying', self.host, e)
        event = 'NONE'
      if event == TERMINATE:
        self._notify()
        return
      self._stop.wait(self.interval)

  def _notify(self) -> None:
    logging.warning('maintenance event %s: saving at the next agreed step and exiting', TERMINATE)
    _notice.set()
    if self.multi_process:
      os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier listens to SIGTERM only
