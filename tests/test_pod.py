"""A pod rehearsed with launch/local_pod.sh 2 (2 processes x 2 devices): every host agrees.

A SIGTERM that reaches one process, or both at different times, makes both save the same step
and exit 0, and the resumed run's losses equal an uninterrupted run's bit for bit. Another
process count on resume is refused with what to do, or, when allowed, carries the state over
with a warning. Eval shares of unequal size end together, with exact metrics."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax.training import maintenance
from input_pipeline import tfrecord
from input_pipeline.pretrain import dataset as data_lib
from metadata_server import MetadataServer
from test_maintenance import eval_steps
from test_train import ROOT, logged_losses, main_command, overrides, run_main
from cpu_env import cpu_env

STEPS = 30
UNINTERRUPTED_DIR = []  # the uninterrupted run's workdir, for the eval test


def _values(data):
  # No dropout and no shuffle buffer: both draw per row position, and one process must give
  # the same losses as two. What a resume must restore exactly is still all there: params,
  # optimizer moments, step, every process's record streams.
  return overrides(data, steps=STEPS, **{
      'data.eval_files': '', 'train.checkpoint_every': 1000, 'data.shuffle_buffer': 1,
      'model.hidden_dropout': 0.0, 'model.attention_dropout': 0.0})


def _free_port() -> int:
  """A port no other pod uses: xdist may run this module's fixtures in two workers at once."""
  with socket.socket() as sock:
    sock.bind(('localhost', 0))
    return sock.getsockname()[1]


def _pod(workdir, values, port=None, env=None, extra_flags=()):
  port = port or _free_port()
  values = dict(values)
  mode = values.pop('mode', 'train')
  flags = main_command(str(workdir), values)[3:] + [f'--mode={mode}', *extra_flags]
  env = dict(env or os.environ, DEVICES='2', PYTHON=sys.executable, PORT=str(port),
             JAX_PLATFORMS='cpu')
  return subprocess.Popen(['bash', 'launch/local_pod.sh', '2', *flags], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)


def _finish(pod, timeout=300):
  out, _ = pod.communicate(timeout=timeout)
  return pod.returncode, out


def _process_pid(workdir, index):
  """The pid of `bert_jax.main --process_id=index` for this workdir (local_pod's child)."""
  want = {f'--workdir={workdir}', f'--process_id={index}', 'bert_jax.main'}
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        args = set(f.read().decode(errors='replace').split('\0'))
    except OSError:
      continue
    if want <= args:
      return int(pid)
  raise AssertionError(f'process {index} of {workdir} not found')


def _wait_for_step(workdir, step, pod, timeout=300):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if os.path.exists(workdir / 'metrics.jsonl') and max(logged_losses(str(workdir)),
                                                         default=0) >= step:
      return
    assert pod.poll() is None, pod.stdout.read()[-3000:]
    time.sleep(0.05)
  raise AssertionError(f'step {step} not reached')


def _saved_steps(workdir):
  return sorted(int(p) for p in os.listdir(workdir / 'checkpoints') if p.isdigit())


@pytest.fixture(scope='module')
def uninterrupted(data, tmp_path_factory):
  workdir = tmp_path_factory.mktemp('uninterrupted')
  UNINTERRUPTED_DIR.append(workdir)
  rc, out = _finish(_pod(workdir, _values(data)))
  assert rc == 0, out[-3000:]
  return logged_losses(str(workdir))


def test_two_processes_give_the_same_losses_as_one(data, uninterrupted, tmp_path):
  # The reader deals chunks to 8 record streams whatever the process count; process i reads
  # global records i, i+2, ... (dataset.training_records), so each global batch holds the same
  # rows as one process's, permuted: equal to float32 round-off (the sums run in other orders).
  single = subprocess.run(main_command(str(tmp_path / 'one'), _values(data)), cwd=ROOT,
                          timeout=300, capture_output=True, text=True,
                          env=cpu_env(4))
  assert single.returncode == 0, single.stderr[-3000:]
  one = logged_losses(str(tmp_path / 'one'))
  assert sorted(one) == sorted(uninterrupted) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([uninterrupted[s] for s in range(1, 9)],
                             [one[s] for s in range(1, 9)], rtol=3e-6, atol=0)  # losses ~8


def _preempt(workdir, pod, after_step, send):
  """Wait for `after_step`, send the notice(s), and check that both processes saved one step
  (the same) and exited 0; returns that step."""
  before = set(_saved_steps(workdir)) if (workdir / 'checkpoints').exists() else set()
  _wait_for_step(workdir, after_step, pod)
  send()
  rc, out = _finish(pod)
  assert rc == 0, out[-3000:]
  new = sorted(set(_saved_steps(workdir)) - before)
  assert len(new) == 1 and after_step <= new[0] < STEPS, new  # the notice's step, not the end
  step_dir = workdir / 'checkpoints' / str(new[0]) / 'data'
  assert sorted(p for p in os.listdir(step_dir) if p.startswith('process_')) == [
      'process_0', 'process_1']
  for i in (0, 1):
    log = (workdir / 'logs' / f'process_{i}.log').read_text()
    assert f'all processes saved step {new[0]}' in log, log[-2000:]
  return new[0]


@pytest.fixture(scope='module')
def preempted_twice(data, tmp_path_factory):
  """SIGTERM to process 1 only; resume; SIGTERM to process 0 and, 0.2 s later, process 1;
  resume to the end."""
  workdir = tmp_path_factory.mktemp('preempted')

  def to_one():
    os.kill(_process_pid(workdir, 1), signal.SIGTERM)

  def to_both():
    os.kill(_process_pid(workdir, 0), signal.SIGTERM)
    time.sleep(0.2)  # the other host gets its notice some steps later (or after saving)
    try:
      os.kill(_process_pid(workdir, 1), signal.SIGTERM)
    except AssertionError:
      pass  # already saved and gone
  first = _preempt(workdir, _pod(workdir, _values(data)), 5, to_one)
  second = _preempt(workdir, _pod(workdir, _values(data)), first + 1, to_both)
  rc, out = _finish(_pod(workdir, _values(data)))
  assert rc == 0, out[-3000:]
  return workdir, first, second


def test_preemption_notices_save_one_step_on_every_host_and_resume_exactly(
    preempted_twice, uninterrupted):
  workdir, first, second = preempted_twice
  resumed = logged_losses(str(workdir))
  print(f'SIGTERM to process 1: both saved step {first}; SIGTERM to process 0 then 1: both '
        f'saved step {second}; resumed losses {json.dumps(resumed)}')
  assert sorted(resumed) == list(range(1, STEPS + 1))
  assert resumed == uninterrupted  # bit for bit, every step


def test_resuming_with_another_process_count_is_refused_or_allowed_with_a_warning(
    data, preempted_twice):
  workdir = preempted_twice[0]
  more = dict(_values(data), **{'train.num_steps': STEPS + 3})
  refused = run_main(str(workdir), more)
  assert refused.returncode == 1
  assert 'written by 2 processes, this run has 1' in refused.stderr
  assert 'allow_process_count_change=True' in refused.stderr
  allowed = run_main(str(workdir), dict(more, **{'train.allow_process_count_change': True}))
  assert allowed.returncode == 0, allowed.stderr[-3000:]
  assert 'the data restarts in a new order' in allowed.stderr
  assert _saved_steps(workdir)[-1] == STEPS + 3


def _last_json(text: str) -> dict:
  """The result `bert_jax.main` prints last (an indented JSON object)."""
  start = 0 if text.startswith('{\n') else text.rindex('\n{\n') + 1
  return json.loads(text[start:text.index('\n}', start) + 2])


def test_two_processes_with_unequal_eval_shares_agree_on_the_end_and_the_metrics(
    data, uninterrupted, tmp_path):
  # An eval file of 3 chunks (dataset.chunks: 4 KiB each at this size): process 0 reads chunks
  # 0 and 2, process 1 chunk 1, so process 0 has about twice the batches. The host that runs
  # out first must keep stepping with all-padding batches until both agree the set has ended,
  # and the sums must equal one process reading everything.
  records = tfrecord.read_all(str(data / 'eval'))
  sizes = np.cumsum([len(tfrecord.frame(r)) for r in records])
  n = int(np.searchsorted(sizes, 3 * 4096 - 500))
  assert 2 * 4096 < sizes[n - 1] <= 3 * 4096
  writer = tfrecord.TFRecordWriter(str(tmp_path / 'eval3'))
  writer.write_many(records[:n])
  writer.close()
  shares = [sum(1 for _ in data_lib.make_dataset(data_lib.ReaderConfig(
      files=str(tmp_path / 'eval3'), batch_size=2, max_seq_length=64, max_predictions_per_seq=10),
      training=False, process_index=i, process_count=2).unbatch()) for i in (0, 1)]
  assert shares[0] > shares[1] + 4, shares  # real rows (+ padding) per host: unequal
  workdir = UNINTERRUPTED_DIR[0]
  values = dict(_values(data), **{'data.eval_files': str(tmp_path / 'eval3'),
                                  'train.global_batch_size': 4, 'train.eval_steps': 1000})
  one = run_main(str(workdir), values, mode='eval')
  assert one.returncode == 0, one.stderr[-3000:]
  rc, out = _finish(_pod(workdir, dict(values, mode='eval')))
  assert rc == 0, out[-3000:]
  a, b = _last_json(one.stdout), _last_json(out)
  print(f'eval of {n} records, 1 process: {a}\n2 processes: {b}')
  assert a['step'] == b['step'] == STEPS
  for k in ('mlm_loss', 'mlm_accuracy', 'nsp_loss', 'nsp_accuracy'):
    np.testing.assert_allclose(b[k], a[k], rtol=1e-5, err_msg=k)


def test_a_maintenance_event_stops_both_hosts_at_one_agreed_step_before_a_pending_eval(
    data, tmp_path):
  # Both hosts watch one metadata server (as a slice's workers each watch their own); when it
  # starts answering TERMINATE_ON_HOST_MAINTENANCE each watcher raises the notice, JAX's sync
  # manager agrees on one step, both save it and exit 0, and that step's eval is skipped.
  workdir = tmp_path / 'maintenance'
  values = dict(_values(data), **{'data.eval_files': str(data / 'eval'), 'train.eval_every': 1,
                                  'train.eval_steps': 1, 'train.num_steps': 500})
  with MetadataServer() as server:
    env = dict(os.environ, GCE_METADATA_HOST=server.host)
    pod = _pod(workdir, values, env=env, extra_flags=['--maintenance_poll_seconds=0.1'])
    _wait_for_step(workdir, 3, pod)
    server.event = maintenance.TERMINATE
    rc, out = _finish(pod)
  assert rc == 0, out[-3000:]
  saved = _saved_steps(workdir)
  assert len(saved) == 1 and 3 <= saved[0] < 500, saved
  for i in (0, 1):
    log = (workdir / 'logs' / f'process_{i}.log').read_text()
    assert f'all processes saved step {saved[0]}' in log, log[-2000:]
    assert 'TERMINATE_ON_HOST_MAINTENANCE' in log
  assert sorted(p for p in os.listdir(workdir / 'checkpoints' / str(saved[0]) / 'data')
                if p.startswith('process_')) == ['process_0', 'process_1']
  evals = eval_steps(str(workdir))
  assert saved[0] not in evals and max(evals) == saved[0] - 1, (evals, saved)
  print(f'maintenance event after step 3: both hosts saved step {saved[0]} (evals up to '
        f'{max(evals)})')
