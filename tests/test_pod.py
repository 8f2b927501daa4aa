"""A pod rehearsed with launch/local_pod.sh 2 (2 processes x 2 devices): every host agrees.

A SIGTERM that reaches one process, or both at different times, or a maintenance event both
hosts' metadata servers announce, makes both save the same step and exit 0, and the resumed
run's losses equal an uninterrupted run's bit for bit. Another
process count on resume is refused with what to do, or, when allowed, carries the state over
with a warning. Eval shares of unequal size end together, with exact metrics.

The uninterrupted run keeps its workdir and data.vocab_file on gs:// (docs/pods.md's pod recipe;
the records stay local), on a real GCS server (fake-gcs-server, tests/gcs_server.py): both
processes share that one directory, and it is a start point like a local one."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax.pretrain import run as train
from bert_jax.training import maintenance
from input_pipeline import fs, tfrecord
from input_pipeline.pretrain import dataset as data_lib
from cpu_env import free_port
from metadata_server import MetadataServer
from test_gcs import BUCKET, gcs  # pylint: disable=unused-import
from test_maintenance import eval_steps
from test_train import ROOT, config_with, logged_losses, main_command, overrides

STEPS = 20
LONG = 500  # the interrupted sessions' num_steps: a stop never meets the end
UNINTERRUPTED_DIR = f'{BUCKET}/pod/uninterrupted'  # read or copied by several tests
GS_VOCAB = f'{BUCKET}/pod/vocab.txt'


@pytest.fixture(scope='module')
def values(data, tmp_path_factory):
  """Every run's settings. The held-out file has 3 chunks (dataset.chunks: 4 KiB each at this
  size), so that the 2-process runs' eval at the end splits unevenly."""
  records = tfrecord.read_all(str(data / 'eval'))
  sizes = np.cumsum([len(tfrecord.frame(r)) for r in records])
  n = int(np.searchsorted(sizes, 3 * 4096 - 500))
  assert 2 * 4096 < sizes[n - 1] <= 3 * 4096
  eval3 = tmp_path_factory.mktemp('eval3') / 'eval3'
  writer = tfrecord.TFRecordWriter(str(eval3))
  writer.write_many(records[:n])
  writer.close()
  # No dropout and no shuffle buffer: both draw per row position, and one process must give
  # the same losses as two. What a resume must restore exactly is still all there: params,
  # optimizer moments, step, every process's record streams. A constant learning rate, so that
  # train.num_steps is not part of the compiled step: the longer runs here (the maintenance
  # run, the continuation with another process count) reuse it from the compilation cache.
  # 12 rows per host: one host's share of the held-out file fits one batch, the other's not.
  return overrides(data, steps=STEPS, **{
      'data.eval_files': str(eval3), 'train.eval_steps': 1000, 'train.checkpoint_every': 1000,
      'train.global_batch_size': 24, 'data.shuffle_buffer': 1, 'model.hidden_dropout': 0.0,
      'model.attention_dropout': 0.0, 'optimizer.schedule': 'constant'})


def _pod(workdir, values, port=None, env=None, extra_flags=()):
  port = port or free_port()
  values = dict(values)
  mode = values.pop('mode', 'train')
  flags = main_command(str(workdir), values)[3:] + [f'--mode={mode}', *extra_flags]
  # JAX_EXPLAIN_CACHE_MISSES: each process logs the programs it did not find in the
  # compilation cache (`interrupted` checks process 1's).
  env = dict(env or os.environ, DEVICES='2', PYTHON=sys.executable, PORT=str(port),
             JAX_PLATFORMS='cpu', JAX_EXPLAIN_CACHE_MISSES='1')
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
def uninterrupted(values, gcs, data):
  """2 processes from step 0 to STEPS, and the eval at the end, in a gs:// workdir with a gs://
  vocabulary: its losses."""
  fs.write_text(GS_VOCAB, (data / 'vocab.txt').read_text())
  rc, out = _finish(_pod(UNINTERRUPTED_DIR, dict(values, **{'data.vocab_file': GS_VOCAB})))
  assert rc == 0, out[-3000:]
  return logged_losses(UNINTERRUPTED_DIR)


def test_two_processes_give_the_same_losses_as_one(values, uninterrupted, tmp_path):
  # The reader deals chunks to 8 record streams whatever the process count; process i reads
  # global records i, i+2, ... (dataset.training_records), so each global batch holds the same
  # rows as one process's, permuted: equal to float32 round-off (the sums run in other orders,
  # here over this worker's devices in one process).
  train.train_and_evaluate(config_with(values), str(tmp_path / 'one'))
  one = logged_losses(str(tmp_path / 'one'))
  assert sorted(one) == sorted(uninterrupted) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([uninterrupted[s] for s in range(1, 9)],
                             [one[s] for s in range(1, 9)], rtol=3e-6, atol=0)  # losses ~8


def _preempt(workdir, pod, after_step, send, end=STEPS):
  """Wait for `after_step`, send the notice(s), and check that both processes saved one step
  (the same, before `end`) and exited 0; returns that step."""
  before = set(_saved_steps(workdir)) if (workdir / 'checkpoints').exists() else set()
  _wait_for_step(workdir, after_step, pod)
  send()
  rc, out = _finish(pod)
  assert rc == 0, out[-3000:]
  new = sorted(set(_saved_steps(workdir)) - before)
  assert len(new) == 1 and after_step <= new[0] < end, new  # the notice's step, not the end
  step_dir = workdir / 'checkpoints' / str(new[0]) / 'data'
  assert sorted(p for p in os.listdir(step_dir) if p.startswith('process_')) == [
      'process_0', 'process_1']
  for i in (0, 1):
    log = (workdir / 'logs' / f'process_{i}.log').read_text()
    assert f'all processes saved step {new[0]}' in log, log[-2000:]
  return new[0]


@pytest.fixture(scope='module')
def interrupted(values, tmp_path_factory):
  """One run stopped three times, resumed after each: SIGTERM to process 1 only; SIGTERM to
  process 0 and, 0.2 s later, process 1; a maintenance event from the metadata server, in a
  session that evaluates every step. (workdir, the three saved steps)."""
  workdir = tmp_path_factory.mktemp('interrupted')

  def to_one():
    os.kill(_process_pid(workdir, 1), signal.SIGTERM)

  def to_both():
    os.kill(_process_pid(workdir, 0), signal.SIGTERM)
    time.sleep(0.2)  # the other host gets its notice some steps later (or after saving)
    try:
      os.kill(_process_pid(workdir, 1), signal.SIGTERM)
    except AssertionError:
      pass  # already saved and gone
  # LONG steps (the constant learning rate: the same program): the hosts take some steps to
  # agree on a notice, and a session of 20 steps once reached its end before they had.
  long = dict(values, **{'train.num_steps': LONG})
  first = _preempt(workdir, _pod(workdir, long), 5, to_one, end=LONG)
  second = _preempt(workdir, _pod(workdir, long), first + 1, to_both, end=LONG)
  # The step the first session compiled came from the cache on both hosts: process 1 reads
  # the entry process 0 wrote (tests/multihost_cache/sitecustomize.py).
  log = (workdir / 'logs' / 'process_1.log').read_text()
  assert 'TRACING CACHE MISS' in log, log[-3000:]  # the misses are logged
  assert "PERSISTENT COMPILATION CACHE MISS for 'jit_step'" not in log, log[-3000:]
  # Both hosts watch one metadata server (as a slice's workers each watch their own). With a
  # constant learning rate, LONG steps and an eval every step change nothing in the training.
  with MetadataServer() as server:
    env = dict(os.environ, GCE_METADATA_HOST=server.host)
    pod = _pod(workdir, dict(long, **{'train.eval_every': 1, 'train.eval_steps': 1}),
               env=env, extra_flags=['--maintenance_poll_seconds=0.1'])
    third = _preempt(workdir, pod, second + 3,
                     lambda: setattr(server, 'event', maintenance.TERMINATE), end=LONG)
  return workdir, (first, second, third)


def test_preemption_notices_save_one_step_on_every_host_and_resume_exactly(
    interrupted, uninterrupted):
  # Each stop is checked as it happens (_preempt); here, the two resumes after SIGTERMs.
  workdir, (first, second, third) = interrupted
  resumed = logged_losses(str(workdir))
  print(f'SIGTERM to process 1: both saved step {first}; SIGTERM to process 0 then 1: both '
        f'saved step {second}; resumed, stopped at {third}; losses {json.dumps(resumed)}')
  assert sorted(resumed) == list(range(1, third + 1)) and third > second + 2
  common = range(1, min(third, STEPS) + 1)
  assert [resumed[s] for s in common] == [uninterrupted[s] for s in common]  # bit for bit


def test_resuming_with_another_process_count_is_refused_or_allowed_with_a_warning(
    values, uninterrupted, tmp_path, caplog):
  # One process (this one) resumes a copy of the 2-process run's workdir. The refusal is the
  # ValueError that bert_jax.main prints as `error: ...` with exit status 1
  # (test_train.test_main_reports_bad_input_without_a_traceback).
  workdir = tmp_path / 'run'
  fs.download_dir(UNINTERRUPTED_DIR, str(workdir))
  assert _saved_steps(workdir)[-1] == STEPS
  more = dict(values, **{'train.num_steps': STEPS + 3})
  with pytest.raises(ValueError, match='written by 2 processes, this run has 1') as refused:
    train.train_and_evaluate(config_with(more), str(workdir))
  assert 'allow_process_count_change=True' in str(refused.value)
  train.train_and_evaluate(
      config_with(dict(more, **{'train.allow_process_count_change': True})), str(workdir))
  assert 'the data restarts in a new order' in caplog.text
  assert _saved_steps(workdir)[-1] == STEPS + 3


def test_two_processes_with_unequal_eval_shares_agree_on_the_end_and_the_metrics(
    values, uninterrupted):
  # The uninterrupted run's eval: of the held-out file's 3 chunks process 0 reads chunks 0 and
  # 2, process 1 chunk 1, so process 0 has about twice the rows. The host that runs out first
  # must keep stepping with all-padding batches until both agree the set has ended, and the
  # sums must equal one process (this one) reading everything.
  per_host = values['train.global_batch_size'] // 2
  shares = [sum(1 for _ in data_lib.make_dataset(data_lib.ReaderConfig(
      files=values['data.eval_files'], batch_size=per_host, max_seq_length=64,
      max_predictions_per_seq=10), training=False, process_index=i, process_count=2))
      for i in (0, 1)]
  assert shares[0] > shares[1], shares  # batches per host: one host must feed a padding batch
  workdir = UNINTERRUPTED_DIR
  [pod] = [r for r in map(json.loads, fs.read_text(f'{workdir}/metrics.jsonl').splitlines())
           if 'eval/mlm_loss' in r]
  one = train.evaluate_workdir(config_with(values), workdir)
  print(f'eval of {values["data.eval_files"]}, 2 processes: {pod}\n1 process: {one}')
  assert pod['step'] == one['step'] == STEPS
  for k in ('mlm_loss', 'mlm_accuracy', 'nsp_loss', 'nsp_accuracy'):
    np.testing.assert_allclose(pod[f'eval/{k}'], one[k], rtol=1e-5, err_msg=k)


def test_a_maintenance_event_stops_both_hosts_at_one_agreed_step_before_a_pending_eval(
    interrupted):
  # When the metadata server starts answering TERMINATE_ON_HOST_MAINTENANCE each host's watcher
  # raises the notice, JAX's sync manager agrees on one step, both save it and exit 0 (checked
  # by _preempt as the session ended), and that step's eval is skipped.
  workdir, (_, second, saved) = interrupted
  for i in (0, 1):
    assert 'TERMINATE_ON_HOST_MAINTENANCE' in (workdir / 'logs' / f'process_{i}.log').read_text()
  evals = eval_steps(str(workdir))
  assert min(evals) == second + 1 and saved not in evals and max(evals) == saved - 1, (
      evals, saved)
  print(f'maintenance event after step {second + 3}: both hosts saved step {saved} (evals up '
        f'to {max(evals)})')


def test_two_processes_share_a_gs_workdir(uninterrupted):
  """A multi-host run's one shared directory: both processes write their Orbax shards and their
  data-iterator state into the same gs:// step directory, and their logs land there too."""
  assert sorted(uninterrupted) == list(range(1, STEPS + 1))
  for i in (0, 1):
    assert fs.exists(f'{UNINTERRUPTED_DIR}/checkpoints/{STEPS}/data/process_{i}/it.index'), i
  assert {'process_0.log', 'process_1.log'} <= set(fs.listdir(f'{UNINTERRUPTED_DIR}/logs'))
  assert not os.path.exists(os.path.join(ROOT, 'gs:'))


def test_gs_workdir_with_a_gs_vocabulary_is_a_start_point(uninterrupted, data):
  """Such a workdir (the uninterrupted pod's) is a fine-tuning start point (`load_start_point`)
  and a `train.init_from` one, whose vocabulary is compared by content with the run's (here a
  local copy of the same file)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import start_points  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain import step as pretrain_step  # pylint: disable=g-import-not-at-top
  from bert_jax.training import checkpointing  # pylint: disable=g-import-not-at-top
  from configs import bert_tiny, common  # pylint: disable=g-import-not-at-top
  workdir = UNINTERRUPTED_DIR
  start = start_points.load_start_point(workdir)
  step, saved = checkpointing.restore_params(workdir)
  assert (start.kind, start.step, step, start.do_lower_case) == ('workdir', STEPS, STEPS, True)
  assert start.tokenizer.vocab_file == GS_VOCAB
  assert start.tokenizer.vocab == (data / 'vocab.txt').read_text().rstrip('\n').split('\n')
  jax.tree_util.tree_map(np.testing.assert_array_equal, start.params, saved)

  phase2 = common.override(bert_tiny.get_config(), {
      'model.vocab_size': 2000, 'data.train_files': str(data / 'train-*'),
      'data.vocab_file': str(data / 'vocab.txt'), 'data.max_seq_length': 64,
      'data.max_predictions_per_seq': 10, 'train.global_batch_size': 8,
      'train.init_from': workdir,
      'model.scan_layers': True})  # and relaid out: the pod's layers were unrolled
  state = jax.device_get(train._initial_state(pretrain_step.setup(phase2)))  # pylint: disable=protected-access
  assert int(state.step) == 0
  for i in range(2):
    jax.tree_util.tree_map(lambda stacked, layer, i=i: np.testing.assert_array_equal(
        stacked[i], layer), state.params['encoder']['layers'], saved['encoder'][f'layer_{i}'])
  phase2.data.do_lower_case = False
  with pytest.raises(ValueError, match=f'train.init_from={workdir}: it is uncased'):
    train._initial_state(pretrain_step.setup(phase2))  # pylint: disable=protected-access
