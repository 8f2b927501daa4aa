"""The pod launcher: --dry-run prints the whole lifecycle; Cloud TPU's states (played by
tests/fake_gcloud.py) lead to the right gcloud commands; a run started detached outlives its
launcher; a closed stdout never stops training; bad arguments fail clearly."""

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from cpu_env import cpu_env, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The launcher refuses a checkout with uncommitted changes (the workers get git HEAD); the
# tests run it from this checkout, edits under way included, so they pass --allow-dirty, but
# test_a_dirty_checkout_is_refused_and_the_deployed_commit_named.
ALLOW_DIRTY = '--allow-dirty'


def tpu_pod(*args):
  return subprocess.run(['bash', 'launch/tpu_pod.sh', ALLOW_DIRTY, *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)


def test_dry_run_prints_create_copy_install_train_and_delete():
  out = tpu_pod('--dry-run', '--tpu', 'bert', '--accelerator', 'v4-64', '--zone',
                'us-central2-b', '--project', 'p', '--spot', '--',
                '--config=configs/bert_base.py:phase1', '--workdir=gs://b/p1',
                '--config.data.train_files=gs://b/wiki/train-*')
  assert out.returncode == 0, out.stderr
  lines = [l for l in out.stdout.splitlines() if l.startswith('+ ')]
  assert lines[0].startswith('+ gcloud compute tpus tpu-vm create bert --accelerator-type=v4-64')
  assert '--spot' in lines[0] and '--project=p' in lines[0]
  assert any(' scp ' in l and '--worker=all' in l for l in lines)
  train = [shlex.split(l[2:]) for l in lines if '--detach' in l]
  assert len(train) == 1 and '--worker=all' in train[0]
  remote = [a for a in train[0] if a.startswith('--command=')][0][len('--command='):]
  # The remote shell receives the flags intact, the glob unexpanded.
  assert shlex.split(remote)[-4:] == ['--tpu', '--config=configs/bert_base.py:phase1',
                                      '--workdir=gs://b/p1',
                                      '--config.data.train_files=gs://b/wiki/train-*']
  install = [l for l in lines if 'launch/setup_worker.sh' in l]
  assert len(install) == 1 and '--worker=all' in install[0]
  assert lines[-1].startswith('+ gcloud compute tpus tpu-vm delete bert')


def test_queued_and_keep():
  out = tpu_pod('--dry-run', '--queued', '--keep', '--tpu', 't', '--accelerator', 'v5litepod-256',
                '--zone', 'z', '--', '--config=configs/bert_large.py:phase2', '--workdir=gs://b/w')
  assert out.returncode == 0, out.stderr
  assert '+ gcloud compute tpus queued-resources create t-qr --node-id=t' in out.stdout
  assert 'delete' not in out.stdout


def test_missing_arguments_fail_with_usage():
  out = tpu_pod('--tpu', 'x')
  assert out.returncode == 2
  assert '--tpu, --accelerator and --zone are required' in out.stderr
  out = tpu_pod('--tpu', 'x', '--accelerator', 'v4-8', '--zone', 'z')
  assert out.returncode == 2 and 'give the bert_jax.main flags after --' in out.stderr
  assert tpu_pod('--bogus').returncode == 2


def test_local_pod_needs_a_process_count_and_workdir():
  out = subprocess.run(['bash', 'launch/local_pod.sh', 'two'], cwd=ROOT, capture_output=True,
                       text=True, timeout=30)
  assert out.returncode == 2 and 'usage' in out.stderr
  out = subprocess.run(['bash', 'launch/local_pod.sh', '2', '--config=configs/bert_tiny.py'],
                       cwd=ROOT, capture_output=True, text=True, timeout=30)
  assert out.returncode == 2 and '--workdir=... is required' in out.stderr


# Ubuntu 22.04's python3 is 3.10; Debian 12 (this machine) has no 3.10 to run, so a stand-in
# answers the one question setup_worker.sh asks an interpreter (its version) as 3.10 would.
PYTHON_310 = '''#!/bin/sh
case "$*" in
  --version) echo "Python 3.10.12" ;;
  *) exit 1 ;;  # "is it >= 3.11?" -> no; "-m pip ..." -> no pip, as on a bare image
esac
'''


def _bin_dir(tmp_path, with_311):
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'python3').write_text(PYTHON_310)
  (bin_dir / 'python3').chmod(0o755)
  for tool in ('sed', 'rm', 'mktemp', 'hostname', 'cat', 'tee', 'sleep'):
    os.symlink(shutil.which(tool), bin_dir / tool)
  if with_311:
    os.symlink(sys.executable, bin_dir / 'python3.11')
  return str(bin_dir)


def test_setup_worker_passes_over_a_python_310_to_a_311_venv(tmp_path):
  (tmp_path / 'req.txt').write_text('')
  env = dict(os.environ, PATH=_bin_dir(tmp_path, with_311=True), VENV=str(tmp_path / 'venv'),
             REQUIREMENTS=str(tmp_path / 'req.txt'), JAX_EXTRA='')
  env.pop('PYTHON', None)
  out = subprocess.run([shutil.which('bash'), 'launch/setup_worker.sh'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert 'ready, 3.11' in out.stdout
  version = subprocess.run([str(tmp_path / 'venv' / 'bin' / 'python'), '--version'],
                           capture_output=True, text=True).stdout
  assert version.startswith('Python 3.11')


def test_setup_worker_without_any_311_says_what_to_do(tmp_path):
  env = dict(os.environ, PATH=_bin_dir(tmp_path, with_311=False), VENV=str(tmp_path / 'venv'))
  env.pop('PYTHON', None)
  out = subprocess.run([shutil.which('bash'), 'launch/setup_worker.sh'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 1
  assert 'needs Python >= 3.11' in out.stderr and 'Python 3.10.12' in out.stderr
  assert 'apt-get install python3.11' in out.stderr and 'PYTHON=' in out.stderr
  assert not (tmp_path / 'venv').exists()


def worker_logs(workdir) -> list[str]:
  """This host's attempt logs in WORKDIR/logs (<hostname>.<UTC start>.log), oldest first."""
  logs = sorted((pathlib.Path(workdir) / 'logs').glob(f'{socket.gethostname()}.*Z.log'))
  return [p.read_text() for p in logs]


def test_run_worker_keeps_each_attempts_log_in_the_workdir(tmp_path):
  """Each attempt's log under its own name: a second run in the same workdir (a rerun on a
  reused slice) keeps the first one's log."""
  workdir = tmp_path / 'run'
  env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS='cpu',
             RUN_DIR=str(tmp_path / 'bert_jax_run'))

  def run(pattern):
    return subprocess.run(['bash', 'launch/run_worker.sh', '--config=configs/bert_tiny.py',
                           f'--workdir={workdir}', f'--config.data.train_files={pattern}'],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  first = run(f'{tmp_path}/first-*')
  assert first.returncode == 1  # bert_jax.main's own status comes back
  assert 'no such file' in first.stdout  # a foreground run prints its log as it goes
  assert (tmp_path / 'bert_jax_run' / 'exit_status').read_text().strip() == '1'
  [log] = worker_logs(workdir)
  assert 'no such file' in log and 'create_pretraining_data' in log and 'first-*' in log
  assert re.match(rf"run_worker.sh: \S+: this attempt's log is copied to {workdir}/logs/"
                  rf"{re.escape(socket.gethostname())}\.\d{{8}}T\d{{6}}Z\.log\n", log), log
  time.sleep(1.1)  # the names are the start time to the second; a real rerun is never this quick
  assert run(f'{tmp_path}/second-*').returncode == 1
  logs = worker_logs(workdir)
  assert len(logs) == 2 and logs[0] == log and 'second-*' in logs[1], logs


# --- The runtime version follows the accelerator family.

@pytest.mark.parametrize('accelerator,version', [
    ('v3-8', 'tpu-ubuntu2204-base'), ('v4-64', 'tpu-ubuntu2204-base'),
    ('v5litepod-16', 'v2-alpha-tpuv5-lite'), ('v5p-128', 'v2-alpha-tpuv5'),
    ('v6e-256', 'v2-alpha-tpuv6e')])
def test_runtime_version_follows_the_accelerator_family(accelerator, version):
  for queued, flag in ((), '--version'), (('--queued',), '--runtime-version'):
    out = tpu_pod('--dry-run', *queued, '--tpu', 't', '--accelerator', accelerator, '--zone', 'z',
                  '--', '--workdir=gs://b/w')
    assert out.returncode == 0, out.stderr
    create = [l for l in out.stdout.splitlines() if ' create ' in l]
    assert len(create) == 1 and f'{flag}={version} ' in create[0] + ' ', create


def test_runtime_version_can_be_overridden_and_an_unknown_family_says_so():
  out = tpu_pod('--dry-run', '--tpu', 't', '--accelerator', 'v5p-8', '--zone', 'z',
                '--version', 'v2-alpha-tpuv5-custom', '--', '--workdir=gs://b/w')
  assert '--version=v2-alpha-tpuv5-custom ' in out.stdout
  out = tpu_pod('--dry-run', '--tpu', 't', '--accelerator', 'v9x-8', '--zone', 'z', '--',
                '--workdir=gs://b/w')
  assert out.returncode == 2
  assert 'no default runtime version for accelerator v9x-8; pass --version' in out.stderr


# --- Cloud TPU's states, played by tests/fake_gcloud.py; the tests read the commands it got.

FINISHED = 'run_worker.sh: t1v-w-{worker}: finished, exit status 0'
STARTED = 'run_worker.sh: t1v-w-{worker}: started bert_jax.main (pid 4242)'
REPLIES = [['setup_worker.sh', 'ready, 3.11'], ['--detach', STARTED], ['--follow', FINISHED]]


class FakeCloud:
  """A directory with a `gcloud` on PATH that plays `state` (see tests/fake_gcloud.py)."""

  def __init__(self, tmp_path, **state):
    self.dir = tmp_path / 'gcloud'
    (self.dir / 'bin').mkdir(parents=True)
    gcloud = self.dir / 'bin' / 'gcloud'
    gcloud.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} '
                      f'{shlex.quote(os.path.join(ROOT, "tests", "fake_gcloud.py"))} "$@"\n')
    gcloud.chmod(0o755)
    state = {'node': [], 'qr': [], 'accelerator': 'v4-16', 'workers': 2, 'ssh': REPLIES, **state}
    (self.dir / 'state.json').write_text(json.dumps(state))
    (self.dir / 'calls.jsonl').write_text('')

  def env(self, **extra):
    return dict(os.environ, FAKE_GCLOUD=str(self.dir), POLL_SECONDS='0',
                PATH=f'{self.dir / "bin"}:{os.environ["PATH"]}', **extra)

  def run(self, *args, timeout=120, checkout=None, **extra_env):
    """tpu_pod.sh of this checkout with --allow-dirty, or of `checkout` as it is."""
    script = (['launch/tpu_pod.sh', ALLOW_DIRTY] if checkout is None else
              [os.path.join(checkout, 'launch', 'tpu_pod.sh')])
    return subprocess.run(['bash', *script, *args], cwd=ROOT, env=self.env(**extra_env),
                          capture_output=True, text=True, timeout=timeout)

  def calls(self):
    return [json.loads(l) for l in (self.dir / 'calls.jsonl').read_text().splitlines()]

  def steps(self):
    """Each call as `group verb [what]`: describe says which field, ssh which worker command."""
    out = []
    for argv in self.calls():
      words = [a for a in argv[2:] if not a.startswith('--')]
      step = ' '.join(words[:2])
      command = next((a[10:] for a in argv if a.startswith('--command=')), '')
      fmt = next((a[9:] for a in argv if a.startswith('--format=')), '')
      if fmt:
        step += ' ' + fmt
      if command:
        step += ' ' + ('setup' if 'setup_worker.sh' in command else
                       'check' if 'bert_jax_run/job.pid' in command else
                       command.split('run_worker.sh ')[1].split(' --tpu')[0])
      out.append(step)
    return out


START = ('--tpu', 'bert', '--accelerator', 'v4-16', '--zone', 'us-central2-b', '--',
         '--config=configs/bert_base.py:phase1', '--workdir=gs://b/p1')
NODE, QR = 'tpu-vm describe value(state)', 'queued-resources describe value(state.state)'
FIRST = 'tpu-vm describe value(state,acceleratorType)'  # the first look: state and type
COUNT = 'tpu-vm describe value(networkEndpoints[].ipAddress)'  # the workers, counted before
RUN = [COUNT, 'tpu-vm scp', 'tpu-vm ssh setup', 'tpu-vm ssh --detach', 'tpu-vm ssh --follow']


def test_a_ready_vm_is_reused(tmp_path):
  cloud = FakeCloud(tmp_path, node=['READY'])
  out = cloud.run(*START)
  assert out.returncode == 0, out.stderr
  assert 'reusing TPU VM bert' in out.stdout
  assert cloud.steps() == [FIRST, 'tpu-vm ssh check', *RUN, 'tpu-vm delete']
  start = cloud.calls()[5]
  assert start[:6] == ['compute', 'tpus', 'tpu-vm', 'ssh', 'bert', '--worker=all']
  assert start[-1] == ('--command=cd bert_jax && bash launch/run_worker.sh --detach --tpu '
                       '--config=configs/bert_base.py:phase1 --workdir=gs://b/p1 ')
  assert 'the run ended on all 2 workers; highest exit status 0' in out.stdout


@pytest.mark.parametrize('dead', ['PREEMPTED', 'TERMINATED', 'SUSPENDED', 'FAILED'])
def test_a_dead_vm_is_deleted_and_created_again(tmp_path, dead):
  cloud = FakeCloud(tmp_path, node=[dead], node_on_create=['CREATING', 'READY'])
  out = cloud.run(*START)
  assert out.returncode == 0, out.stderr
  assert cloud.steps() == [FIRST, 'tpu-vm delete', NODE, 'tpu-vm create', NODE, NODE, *RUN,
                           'tpu-vm delete']
  assert cloud.calls()[1] == ['compute', 'tpus', 'tpu-vm', 'delete', 'bert',
                              '--zone=us-central2-b', '--quiet']
  assert cloud.calls()[0][-1] == '--format=value(state,acceleratorType)'
  assert 'TPU VM bert: CREATING (waiting for READY)' in out.stdout


def test_a_preempted_spot_slice_with_its_suspended_queued_resource_is_replaced(tmp_path):
  # What Cloud TPU leaves after preempting a spot slice: the VM PREEMPTED, its queued resource
  # SUSPENDED. Creating the queued resource again without deleting it fails with ALREADY_EXISTS.
  cloud = FakeCloud(tmp_path, node=['PREEMPTED'], qr=['SUSPENDED'])
  out = cloud.run('--queued', '--spot', *START)
  assert out.returncode == 0, out.stderr
  assert cloud.steps() == [FIRST, QR, 'queued-resources delete', QR, NODE,
                           'queued-resources create', QR, QR, NODE, *RUN, 'queued-resources delete']
  calls = cloud.calls()
  assert calls[2] == ['compute', 'tpus', 'queued-resources', 'delete', 'bert-qr',
                      '--zone=us-central2-b', '--force', '--quiet']
  assert calls[5] == ['compute', 'tpus', 'queued-resources', 'create', 'bert-qr', '--node-id=bert',
                      '--accelerator-type=v4-16', '--runtime-version=tpu-ubuntu2204-base',
                      '--zone=us-central2-b', '--spot']
  assert 'queued resource bert-qr: WAITING_FOR_RESOURCES (waiting for ACTIVE)' in out.stdout


def test_a_leftover_failed_queued_resource_does_not_block_create(tmp_path):
  cloud = FakeCloud(tmp_path, qr=['FAILED'])
  out = cloud.run('--queued', *START)
  assert out.returncode == 0, out.stderr
  assert cloud.steps()[:6] == [FIRST, QR, 'queued-resources delete', QR, NODE,
                               'queued-resources create']
  assert 'ALREADY_EXISTS' not in out.stderr


def test_a_queued_resource_still_waiting_is_waited_for_not_created_twice(tmp_path):
  cloud = FakeCloud(tmp_path, qr=['WAITING_FOR_RESOURCES', 'PROVISIONING', 'ACTIVE'])
  out = cloud.run('--queued', *START)
  assert out.returncode == 0, out.stderr
  assert cloud.steps() == [FIRST, QR, QR, QR, NODE, *RUN, 'queued-resources delete']


@pytest.mark.parametrize('end', ['FAILED', 'SUSPENDED'])
def test_a_queued_resource_that_fails_while_waited_for_ends_the_wait(tmp_path, end):
  cloud = FakeCloud(tmp_path, qr_on_create=['ACCEPTED', 'WAITING_FOR_RESOURCES', end])
  out = cloud.run('--queued', *START)
  assert out.returncode == 1
  assert (f'queued resource bert-qr is {end}, not ACTIVE; `gcloud compute tpus queued-resources '
          'describe bert-qr --zone=us-central2-b` says why. Run this command again to delete '
          'and re-create it.') in out.stderr
  assert cloud.steps() == [FIRST, QR, 'queued-resources create', QR, QR, QR]


@pytest.mark.parametrize('end', ['PREEMPTED', 'FAILED'])
def test_a_vm_that_fails_while_waited_for_ends_the_wait(tmp_path, end):
  cloud = FakeCloud(tmp_path, node_on_create=['CREATING', end])
  out = cloud.run(*START)
  assert out.returncode == 1
  assert f'TPU VM bert is {end}, not READY' in out.stderr
  assert cloud.steps() == [FIRST, 'tpu-vm create', NODE, NODE]


def test_a_state_the_script_does_not_handle_is_a_clear_error(tmp_path):
  cloud = FakeCloud(tmp_path, node=['STOPPED'])
  out = cloud.run(*START)
  assert out.returncode == 1 and 'TPU VM bert is STOPPED' in out.stderr
  assert cloud.steps() == [FIRST]


def test_a_run_still_going_on_a_reused_vm_is_not_overwritten(tmp_path):
  cloud = FakeCloud(tmp_path, node=['READY'],
                    ssh=[['bert_jax_run/job.pid', 't1v-w-{worker}: a run is still going']])
  out = cloud.run(*START)
  assert out.returncode == 1
  assert 't1v-w-0: a run is still going' in out.stderr and '--logs' in out.stderr
  assert cloud.steps() == [FIRST, 'tpu-vm ssh check']


def test_following_that_ends_early_keeps_the_slice_and_the_run(tmp_path):
  # One of two workers reported its end, then the connection dropped; the VM is still READY.
  cloud = FakeCloud(tmp_path, workers=2,
                    ssh=REPLIES[:2] + [['--follow', [FINISHED.format(worker=0), '']]])
  out = cloud.run(*START)
  assert out.returncode == 1
  assert "following stopped before every worker's run ended" in out.stderr
  assert 'the run was not stopped' in out.stderr and '--status' in out.stderr
  assert 'delete' not in ' '.join(cloud.steps())


def test_a_preempted_slice_seen_after_following_says_run_again(tmp_path):
  # Preempted while followed: the run saved, but its workers went down before they could
  # report their end.
  cloud = FakeCloud(tmp_path, ssh=REPLIES[:2] + [
      ['--follow', ['preemption notice: saved step 300', ''], {'node': ['PREEMPTED']}]])
  out = cloud.run(*START)
  assert out.returncode == 1
  assert 'TPU VM bert is PREEMPTED: run the first command again' in out.stderr
  assert cloud.steps()[-2:] == ['tpu-vm ssh --follow', NODE]


def test_a_failed_worker_is_reported_and_the_finished_slice_deleted(tmp_path):
  cloud = FakeCloud(tmp_path, node=['READY'], workers=1,
                    ssh=REPLIES[:2] + [['--follow', FINISHED.format(worker=0)[:-1] + '1']])
  out = cloud.run(*START)
  assert out.returncode == 1
  assert 'highest exit status 1' in out.stdout
  assert cloud.steps()[-1] == 'tpu-vm delete'


def test_status_logs_and_stop_reach_every_worker(tmp_path):
  cloud = FakeCloud(tmp_path, node=['READY'], ssh=[
      ['--status', 'run_worker.sh: t1v-w-{worker}: running since today (pid 4242); last line: x'],
      ['--stop', 'run_worker.sh: t1v-w-{worker}: sent SIGTERM\n' + FINISHED]] + REPLIES)
  where = ('--tpu', 'bert', '--zone', 'z', '--project', 'p')
  out = cloud.run(*where, '--status')
  assert out.returncode == 0, out.stderr
  assert 'TPU VM bert: READY' in out.stdout and 't1v-w-1: running since' in out.stdout
  out = cloud.run(*where, '--logs')
  assert out.returncode == 0, out.stderr
  out = cloud.run(*where, '--stop')
  assert out.returncode == 0, out.stderr
  assert 'the run ended on all 2 workers' in out.stdout
  ssh = [c for c in cloud.calls() if c[3] == 'ssh']
  assert [c[-1] for c in ssh] == [
      '--command=cd bert_jax && bash launch/run_worker.sh --status',
      '--command=cd bert_jax && bash launch/run_worker.sh --follow 50',
      '--command=cd bert_jax && bash launch/run_worker.sh --stop --follow']
  assert all(c[4:8] == ['bert', '--worker=all', '--zone=z', '--project=p'] for c in ssh)
  assert 'delete' not in ' '.join(cloud.steps())  # only the launch deletes, once all ended


@pytest.mark.parametrize('node,queued,delete', [
    ('READY', (), 'tpu-vm delete bert'), ('CREATING', (), 'tpu-vm delete bert'),
    ('READY', ('--queued',), 'queued-resources delete bert-qr')])
def test_a_vm_of_another_type_is_refused_not_reused(tmp_path, node, queued, delete):
  cloud = FakeCloud(tmp_path, node=[node], qr=['ACTIVE'] if queued else [], accelerator='v4-32')
  out = cloud.run(*queued, *START)  # START asks for a v4-16
  assert out.returncode == 1
  assert f'TPU VM bert is a v4-32 ({node}), not the v4-16 asked for' in out.stderr
  assert 'another --tpu name' in out.stderr and f'gcloud compute tpus {delete}' in out.stderr
  assert cloud.steps() == ([FIRST, QR] if queued else [FIRST])


@pytest.mark.parametrize('kind,end', [
    ('node', 'STOPPED'), ('node', 'STOPPING'), ('node', 'HIDDEN'), ('node', 'HIDING'),
    ('node', 'UNHIDING'), ('node', 'UNKNOWN'), ('qr', 'DELETING')])
def test_a_wait_ends_on_any_state_that_is_not_on_its_way_up(tmp_path, kind, end):
  # Unhandled, these states were polled forever; the short timeout turns that into a failure.
  if kind == 'node':
    cloud = FakeCloud(tmp_path, node_on_create=['CREATING', end])
    out = cloud.run(*START, timeout=30)
    name, goal, last = 'TPU VM bert', 'READY', NODE
  else:
    cloud = FakeCloud(tmp_path, qr_on_create=['ACCEPTED', end])
    out = cloud.run('--queued', *START, timeout=30)
    name, goal, last = 'queued resource bert-qr', 'ACTIVE', QR
  assert out.returncode == 1
  assert f'{name} is {end}, not {goal}, and will not get there by itself' in out.stderr
  assert 'Start or delete it with gcloud, then run this command again' in out.stderr
  assert cloud.steps()[-2:] == [last, last]


@pytest.mark.parametrize('code', [255, 0])
def test_a_start_that_fails_on_a_worker_says_so_and_keeps_the_slice(tmp_path, code):
  # Worker 0's run started and waits for worker 1 in jax.distributed.initialize; worker 1 did
  # not start: gcloud gave up on its connection (255), or its command said so and gcloud's
  # exit status did not (0). Nothing may follow, and nothing may be deleted.
  cloud = FakeCloud(tmp_path, node=['READY'], ssh=[
      REPLIES[0],
      ['--detach', [STARTED.format(worker=0), 'run_worker.sh: t1v-w-1: the run did not start'],
       {'exit': code}],
      REPLIES[2]])
  out = cloud.run(*START)
  assert out.returncode == 1
  assert f"starting the run failed: gcloud's ssh exited {code} and 1 of 2 workers reported a " \
      'start (t1v-w-0)' in out.stderr
  assert 'jax.distributed.initialize' in out.stderr
  assert '--tpu bert --zone us-central2-b --status' in out.stderr and '--stop' in out.stderr
  assert 'The slice is kept (gcloud compute tpus tpu-vm delete bert' in out.stderr
  assert cloud.steps()[-1] == 'tpu-vm ssh --detach'


def git(checkout, *args):
  return subprocess.run(['git', '-C', str(checkout), '-c', 'user.name=t', '-c',
                         'user.email=t@example.com', *args], check=True, capture_output=True,
                        text=True).stdout.strip()


def test_a_dirty_checkout_is_refused_and_the_deployed_commit_named(tmp_path):
  """The workers get `git archive HEAD`: a checkout with uncommitted edits or untracked files
  is refused before any gcloud call (they would silently stay behind), unless --allow-dirty,
  which lists them; every start names the commit it deploys. A checkout of its own: this
  script (as edited now) committed in a fresh repository."""
  checkout = tmp_path / 'checkout'
  (checkout / 'launch').mkdir(parents=True)
  shutil.copy(os.path.join(ROOT, 'launch', 'tpu_pod.sh'), checkout / 'launch')
  (checkout / 'README.md').write_text('v1\n')
  git(checkout, 'init', '-q')
  git(checkout, 'add', '.')
  git(checkout, 'commit', '-q', '-m', 'the deployed commit')
  sha = git(checkout, 'rev-parse', 'HEAD')

  clean = FakeCloud(tmp_path / 'clean', node=['READY'])
  out = clean.run(*START, checkout=checkout)
  assert out.returncode == 0, out.stderr
  assert f'deploying commit {sha} (the deployed commit)' in out.stdout
  assert 'tpu-vm scp' in clean.steps() and 'uncommitted' not in out.stderr

  (checkout / 'README.md').write_text('v2\n')
  (checkout / 'new.py').write_text('')
  dirty = FakeCloud(tmp_path / 'dirty', node=['READY'])
  out = dirty.run(*START, checkout=checkout)
  assert out.returncode == 1 and dirty.calls() == []  # nothing made or touched
  assert f'has uncommitted changes, which the workers would not get (they get git HEAD, ' \
      f'{sha[:12]})' in out.stderr
  assert ' M README.md\n?? new.py\n' in out.stderr
  assert 'Commit them (git add, git commit) and run this again, or pass --allow-dirty' \
      in out.stderr

  allowed = FakeCloud(tmp_path / 'allowed', node=['READY'])
  out = allowed.run('--allow-dirty', *START, checkout=checkout)
  assert out.returncode == 0, out.stderr
  assert 'deploying HEAD without these uncommitted changes:\n M README.md\n?? new.py' in out.stderr
  assert f'deploying commit {sha}' in out.stdout and 'tpu-vm scp' in allowed.steps()


def test_a_failed_copy_names_its_step_and_keeps_the_slice(tmp_path):
  cloud = FakeCloud(tmp_path, node=['READY'], ssh=[
      ['setup_worker.sh', 'no space left on device', {'exit': 1}]] + REPLIES[1:])
  out = cloud.run(*START)
  assert out.returncode == 1
  assert 'setting up every worker (launch/setup_worker.sh) failed (exit 1); nothing was' \
      ' started. The slice is kept' in out.stderr
  assert cloud.steps()[-1] == 'tpu-vm ssh setup'


def test_a_vm_gone_when_following_ends_is_not_every_run_ending(tmp_path):
  # A spot preemption while followed: one worker's run was killed mid-step, the other worker
  # said nothing, and the VM is gone (NOT_FOUND) when the follow's ssh ends. Counted then, the
  # workers were 0, and 1 ended run passed for "every worker's run ended".
  killed = 'run_worker.sh: t1v-w-0: ended without an exit status (killed, or the worker restarted)'
  cloud = FakeCloud(tmp_path, ssh=REPLIES[:2] + [['--follow', [killed, ''], {'node': []}]])
  out = cloud.run(*START)
  assert out.returncode == 1
  assert "following stopped before every worker's run ended (1 of 2 reported)" in out.stderr
  assert "every worker's run ended," not in out.stderr
  assert 'TPU VM bert is ABSENT: run the first command again' in out.stderr
  assert cloud.steps().index(COUNT) < cloud.steps().index('tpu-vm ssh --detach')
  assert 'delete' not in ' '.join(cloud.steps())


# --- Real runs: a run that needs no reader, and no launcher.

def training_flags(data, workdir, steps, eval_every=100_000):
  """bert_jax.main's flags for a run of `steps` steps. A constant schedule, so the length is
  no part of the compiled step: the 16-step run and the 100,000-step detached ones run one
  program, which the suite's compilation cache serves (test_maintenance.py's runs too: one
  layer, as theirs). Its last flag is the warmup's."""
  values = {
      'model.vocab_size': 2000, 'model.num_layers': 1, 'data.train_files': str(data / 'train-*'),
      'data.eval_files': str(data / 'eval'), 'data.vocab_file': str(data / 'vocab.txt'),
      'train.eval_every': eval_every, 'train.eval_steps': 2,
      'data.max_seq_length': 64, 'data.max_predictions_per_seq': 10, 'data.shuffle_buffer': 200,
      'train.num_steps': steps, 'train.global_batch_size': 16, 'train.log_every': 1,
      'train.checkpoint_every': 100_000, 'optimizer.learning_rate': 1e-3,
      'optimizer.schedule': 'constant', 'optimizer.warmup_steps': 5,
  }
  return (['--config=configs/bert_tiny.py', f'--workdir={workdir}'] +
          [f'--config.{k}={v}' for k, v in values.items()])


def logged_step(workdir):
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    return max((json.loads(l)['step'] for l in f if '"train/loss"' in l), default=0)


def saved_steps(workdir):
  path = os.path.join(workdir, 'checkpoints')
  return sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []


def wait_until(condition, what, proc=None, timeout=300):
  deadline = time.time() + timeout
  while not condition():
    if proc is not None and proc.poll() is not None:
      raise AssertionError(f'{what}: the process ended first (status {proc.returncode})')
    if time.time() > deadline:
      raise AssertionError(f'{what}: not within {timeout}s')
    time.sleep(0.2)


def test_a_closed_stdout_reader_does_not_stop_training(data, tmp_path):
  # As when the terminal or ssh connection a run prints to goes away: Python ignores SIGPIPE,
  # so every later log line, eval line (step 4, 8, 12, 16) and the final result meets a broken
  # pipe. Unguarded, the first eval line ended the run with exit 1 and no checkpoint.
  workdir = str(tmp_path / 'run')
  env = cpu_env()
  proc = subprocess.Popen([sys.executable, '-m', 'bert_jax.main',
                           *training_flags(data, workdir, 16, eval_every=4)],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  proc.stdout.readline()
  assert logged_step(workdir) < 16
  proc.stdout.close()  # the reader goes away before training has ended
  assert proc.wait(timeout=300) == 0
  assert logged_step(workdir) == 16 and saved_steps(workdir) == [16]
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    assert sum('"eval/mlm_accuracy"' in l for l in f) == 4


def test_a_stream_whose_reader_is_gone_points_at_dev_null_and_goes_on():
  from bert_jax.training.run_control import ClosedReaderTolerant
  read_end, write_end = os.pipe()
  stream = ClosedReaderTolerant(open(write_end, 'w'))
  stream.write('read\n')
  stream.flush()
  assert os.read(read_end, 100) == b'read\n'
  os.close(read_end)
  for _ in range(3):
    stream.write('x' * 100_000)  # more than a pipe holds: raises unless handled
    stream.flush()
  assert os.readlink(f'/proc/self/fd/{write_end}') == os.devnull
  assert not stream.isatty()  # everything else is the wrapped stream's
  stream.close()


def one_process_cluster_env():
  """An environment in which `jax.distributed.initialize()`, which --tpu calls, finds a
  one-process job on localhost (JAX's Slurm detection, its coordinator port derived from
  the job id) instead of a TPU slice: the same code path as on a pod, on this machine."""
  while True:
    port = 61440 + int.from_bytes(os.urandom(2), 'little') % 4096
    with socket.socket() as s:
      try:
        s.bind(('localhost', port))
        break
      except OSError:
        continue
  return dict(SLURM_JOB_ID=str(port - 61440), SLURM_STEP_NODELIST='localhost', SLURM_NTASKS='1',
              SLURM_PROCID='0', SLURM_LOCALID='0', XLA_FLAGS=xla_flags(1), JAX_PLATFORMS='cpu',
              PYTHON=sys.executable)


def kill_detached_run(run_dir):
  """A failed test must not leave its 100,000-step run training: kill its process group."""
  try:
    pid = int((run_dir / 'job.pid').read_text())
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      if b'run_worker.sh' in f.read():
        os.killpg(pid, signal.SIGKILL)
  except (OSError, ValueError):
    pass  # no run, or it has ended


def test_a_detached_run_outlives_its_launcher_and_stops_on_request(data, tmp_path):
  # One worker, whose ssh commands run here in its own home (tests/fake_gcloud.py), holding
  # this checkout as ~/bert_jax; setup_worker.sh is answered, not run (it builds a venv).
  home = tmp_path / 'worker'
  home.mkdir()
  os.symlink(ROOT, home / 'bert_jax')
  cloud = FakeCloud(tmp_path, node=['READY'], accelerator='v4-8', workers=1, homes=[str(home)],
                    ssh=[['setup_worker.sh', 'ready, 3.11']])
  workdir = str(tmp_path / 'run')
  env = one_process_cluster_env()
  where = ('--tpu', 'bert', '--zone', 'z')
  try:
    with open(tmp_path / 'launcher.out', 'w') as out, open(tmp_path / 'launcher.err', 'w') as err:
      launcher = subprocess.Popen(
          ['bash', 'launch/tpu_pod.sh', ALLOW_DIRTY, *where, '--accelerator', 'v4-8', '--',
           *training_flags(data, workdir, 100_000)], cwd=ROOT, env=cloud.env(**env), stdout=out,
          stderr=err, start_new_session=True,
          # a terminal's Ctrl-C, even when the suite itself runs in the background (nohup ...
          # &), where SIGINT is ignored and bash could not trap it
          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
      try:
        # Ctrl-C while the launcher shows the run's log (its `follow`): on a loaded machine
        # the run logs step 2 before the launcher gets there, and a Ctrl-C during its earlier
        # gcloud calls ends only that call (fake gcloud exits 130, as the real one does).
        wait_until(lambda: logged_step(workdir) >= 2 and
                   'mesh {' in (tmp_path / 'launcher.out').read_text(),
                   'training started and followed', launcher)
      finally:
        os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C in the launcher's terminal
      assert launcher.wait(timeout=60) == 130
    assert 'stopped following; the run goes on on bert' in (tmp_path / 'launcher.err').read_text()
    assert 'mesh {' in (tmp_path / 'launcher.out').read_text()  # it showed the run's log
    assert not [s for s in cloud.steps() if 'delete' in s]

    interrupted_at = logged_step(workdir)
    wait_until(lambda: logged_step(workdir) >= interrupted_at + 5, 'training went on', timeout=120)
    status = cloud.run(*where, '--status', **env)
    assert status.returncode == 0, status.stderr
    assert 'TPU VM bert: READY' in status.stdout and ': running since ' in status.stdout

    stop = cloud.run(*where, '--stop', **env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    saved = saved_steps(workdir)
    assert saved and saved[-1] >= interrupted_at + 5  # the agreed step, saved
    assert f'preemption notice: saved step {saved[-1]}' in stop.stdout
    assert 'finished, exit status 0' in stop.stdout
    assert 'the run ended on all 1 workers; highest exit status 0' in stop.stdout
    assert (home / 'bert_jax_run' / 'exit_status').read_text().strip() == '0'
    [log] = worker_logs(tmp_path / 'run')
    assert f'saved step {saved[-1]}' in log
    # Nothing of the run is left behind.
    pid = (home / 'bert_jax_run' / 'job.pid').read_text().strip()
    assert not os.path.exists(f'/proc/{pid}')
  finally:
    kill_detached_run(home / 'bert_jax_run')


def test_gcloud_rerunning_a_start_finds_the_same_run_going_and_the_launch_goes_on(tmp_path):
  # gcloud runs a command again on a worker whose ssh connection dropped (exit 255), here after
  # the first --detach had started the run. The second --detach must not fail the launch. The
  # run itself is real and quick: bert_jax.main stops at its missing training files.
  home = tmp_path / 'worker'
  home.mkdir()
  os.symlink(ROOT, home / 'bert_jax')
  cloud = FakeCloud(tmp_path, node=['READY'], workers=1, homes=[str(home)],
                    ssh=[['setup_worker.sh', 'ready, 3.11']], drops=[['--detach', 1]])
  workdir = tmp_path / 'run'
  try:
    out = cloud.run('--tpu', 'bert', '--accelerator', 'v4-16', '--zone', 'z', '--',
                    '--config=configs/bert_tiny.py', f'--workdir={workdir}',
                    f'--config.data.train_files={tmp_path}/no-*', timeout=300,
                    **one_process_cluster_env())
  finally:
    kill_detached_run(home / 'bert_jax_run')
  host = socket.gethostname()
  assert f'run_worker.sh: {host}: started bert_jax.main' in out.stdout, out.stderr
  assert f'run_worker.sh: {host}: the same run is already going' in out.stdout, out.stderr
  assert 'Retrying: SSH command error' in out.stderr
  assert 'the run ended on all 1 workers; highest exit status 1' in out.stdout, out.stderr
  assert out.returncode == 1  # bert_jax.main's own status
  [log] = worker_logs(workdir)
  assert 'no such file' in log
  assert cloud.steps().count('tpu-vm ssh --detach') == 1 and cloud.steps()[-1] == 'tpu-vm delete'


def test_detach_over_a_run_with_other_arguments_refuses(data, tmp_path):
  run_dir = tmp_path / 'bert_jax_run'
  env = cpu_env(PYTHON=sys.executable, RUN_DIR=str(run_dir))
  flags = training_flags(data, tmp_path / 'run', 100_000)

  def detach(*args):
    return subprocess.run(['bash', 'launch/run_worker.sh', '--detach', *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
  try:
    assert detach(*flags).returncode == 0
    again = detach(*flags)
    assert again.returncode == 0 and 'the same run is already going' in again.stdout
    other = detach(*flags[:-1], '--config.optimizer.warmup_steps=6')
    assert other.returncode == 3
    assert 'a run is still going' in other.stderr and 'with other arguments' in other.stderr
  finally:
    kill_detached_run(run_dir)
