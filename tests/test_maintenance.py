"""Cloud maintenance events (bert_jax/maintenance.py) stop a run as a SIGTERM does: the
checkpoint first, a pending eval skipped, exit 0; against a metadata server on localhost."""

import json
import os
import time

import pytest

from bert_jax import maintenance
from metadata_server import MetadataServer
from test_train import overrides, run_main, start_main, wait_for_step


def test_the_watcher_reads_the_event_with_googles_header_and_ignores_migrations():
  with MetadataServer('MIGRATE_ON_HOST_MAINTENANCE') as server:
    assert maintenance.read_event(server.host) == 'MIGRATE_ON_HOST_MAINTENANCE'
    watcher = maintenance.MaintenanceWatcher(server.host, 0.05, multi_process=False).start()
    try:
      deadline = time.time() + 10
      while server.requests < 5 and time.time() < deadline:
        time.sleep(0.02)
      assert server.requests >= 5 and not maintenance.notice_pending()  # a migration: run on
      server.event = maintenance.TERMINATE
      while not maintenance.notice_pending() and time.time() < deadline:
        time.sleep(0.02)
      assert maintenance.notice_pending()
    finally:
      watcher.stop()
      maintenance._notice.clear()  # pylint: disable=protected-access


def test_the_metadata_host_is_found_as_googles_libraries_find_it(monkeypatch):
  monkeypatch.delenv('GCE_METADATA_HOST', raising=False)
  monkeypatch.delenv('GCE_METADATA_IP', raising=False)
  assert maintenance.metadata_host() == 'metadata.google.internal'
  assert not maintenance.should_watch(on_tpu=False) and maintenance.should_watch(on_tpu=True)
  monkeypatch.setenv('GCE_METADATA_IP', '169.254.169.254')
  assert maintenance.metadata_host() == '169.254.169.254'
  monkeypatch.setenv('GCE_METADATA_HOST', 'localhost:8080')
  assert maintenance.metadata_host() == 'localhost:8080' and maintenance.should_watch(False)


def eval_steps(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r['step'] for r in map(json.loads, f) if any(k.startswith('eval/') for k in r)]


def test_a_terminate_event_saves_one_step_skips_its_eval_and_exits_0(data, tmp_path,
                                                                      monkeypatch):
  workdir = str(tmp_path / 'run')
  values = overrides(data, steps=200, **{'train.eval_every': 1, 'train.eval_steps': 1,
                                         'train.checkpoint_every': 1000})
  with MetadataServer() as server:
    monkeypatch.setenv('GCE_METADATA_HOST', server.host)
    proc = start_main(workdir, dict(values), extra_flags=['--maintenance_poll_seconds=0.1'])
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
