"""Cloud maintenance events (bert_jax/training/maintenance.py) stop a run as a SIGTERM does: the
checkpoint first, a pending eval skipped, exit 0; against a metadata server on localhost."""

import json
import os
import time

import pytest

from bert_jax.training import maintenance
from cpu_env import free_port
from metadata_server import MetadataServer
from test_train import overrides, run_main, start_main, wait_for_step


def _wait(condition, timeout=10.0):
  deadline = time.time() + timeout
  while not condition() and time.time() < deadline:
    time.sleep(0.02)
  return condition()


@pytest.mark.parametrize('spot', [False, True])
def test_the_watcher_reads_the_event_with_googles_header_and_ignores_migrations(spot):
  with MetadataServer('MIGRATE_ON_HOST_MAINTENANCE', 'FALSE' if spot else None) as server:
    assert maintenance.read_value(server.host) == 'MIGRATE_ON_HOST_MAINTENANCE'
    watcher = maintenance.MaintenanceWatcher(server.host, 0.05, via_sigterm=False).start()
    try:
      # A migration, or a spot VM not (yet) preempted: run on. Without `preempted` (404, not a
      # spot VM) the watcher keeps reading the event.
      assert _wait(lambda: server.requests >= 5) and not maintenance.notice_pending()
      if spot:
        server.preempted = 'TRUE'
      else:
        server.event = maintenance.TERMINATE
      assert _wait(maintenance.notice_pending)
    finally:
      watcher.stop()
      maintenance._notice.clear()  # pylint: disable=protected-access


def test_the_watcher_outlives_a_server_that_is_down_or_cuts_replies_off():
  with MetadataServer() as server:
    server.cut_off = True  # http.client.IncompleteRead: not an OSError
    watcher = maintenance.MaintenanceWatcher(server.host, 0.05, via_sigterm=False).start()
    try:
      assert _wait(lambda: server.requests >= 3)
      assert watcher._thread.is_alive()  # pylint: disable=protected-access
      server.cut_off = False
      server.event = maintenance.TERMINATE
      assert _wait(maintenance.notice_pending)
    finally:
      watcher.stop()
      maintenance._notice.clear()  # pylint: disable=protected-access
  watcher = maintenance.MaintenanceWatcher(server.host, 0.05, via_sigterm=False).start()
  try:  # the server is gone: connection refused, again and again
    time.sleep(0.3)
    assert watcher._thread.is_alive() and not maintenance.notice_pending()  # pylint: disable=protected-access
  finally:
    watcher.stop()


def test_the_metadata_host_is_found_as_googles_libraries_find_it(monkeypatch):
  for name in maintenance.HOST_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  assert maintenance.metadata_host() == 'metadata.google.internal'
  assert not maintenance.should_watch(on_tpu=False) and maintenance.should_watch(on_tpu=True)
  monkeypatch.setenv('GCE_METADATA_IP', '169.254.169.254')
  assert maintenance.metadata_host() == '169.254.169.254'
  monkeypatch.setenv('GCE_METADATA_ROOT', 'old-name:80')
  assert maintenance.metadata_host() == 'old-name:80'
  monkeypatch.setenv('GCE_METADATA_HOST', 'localhost:8080')
  assert maintenance.metadata_host() == 'localhost:8080' and maintenance.should_watch(False)


def eval_steps(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r['step'] for r in map(json.loads, f) if any(k.startswith('eval/') for k in r)]


@pytest.mark.parametrize('coordinated', [False, True])
def test_a_terminate_event_saves_one_step_skips_its_eval_and_exits_0(data, tmp_path,
                                                                      monkeypatch, coordinated):
  """`coordinated`: a one-process job with JAX's coordination service up, as a single-host
  TPU slice (v4-8, v5litepod-8) runs under --tpu: the notice must reach JAX's preemption sync
  manager, which owns SIGTERM there, not only a flag nobody reads."""
  workdir = str(tmp_path / 'run')
  # One layer and a constant schedule: the stop depends on neither, and the programs are
  # test_launch.py's CLI runs' and the other case's (the compilation cache serves them).
  values = overrides(data, steps=200, **{'train.eval_every': 1, 'train.eval_steps': 1,
                                         'train.checkpoint_every': 1000, 'model.num_layers': 1,
                                         'optimizer.schedule': 'constant'})
  flags = ['--maintenance_poll_seconds=0.1']
  if coordinated:
    flags += [f'--coordinator_address=127.0.0.1:{free_port()}', '--num_processes=1',
              '--process_id=0']
  with MetadataServer() as server:
    monkeypatch.setenv('GCE_METADATA_HOST', server.host)
    proc = start_main(workdir, dict(values), extra_flags=flags)
    wait_for_step(workdir, 3, proc)
    server.event = maintenance.TERMINATE
    _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  saved = sorted(int(p) for p in os.listdir(os.path.join(workdir, 'checkpoints')) if p.isdigit())
  assert len(saved) == 1 and 3 <= saved[0] < 200, saved
  assert f'saved step {saved[0]}' in err
  evals = eval_steps(workdir)
  assert evals and saved[0] not in evals and max(evals) == saved[0] - 1, (evals, saved)
  print(f'TERMINATE_ON_HOST_MAINTENANCE after step 3: saved step {saved[0]}, evals up to '
        f'{max(evals)}')
