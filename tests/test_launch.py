"""launch/tpu_pod.sh --dry-run prints the whole pod lifecycle; bad arguments fail clearly."""

import os
import shlex
import shutil
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tpu_pod(*args):
  return subprocess.run(['bash', 'launch/tpu_pod.sh', *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=60)


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
  train = [shlex.split(l[2:]) for l in lines if 'run_worker.sh' in l]
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


def test_run_worker_keeps_each_workers_log_in_the_workdir(tmp_path):
  workdir = tmp_path / 'run'
  env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS='cpu')
  out = subprocess.run(['bash', 'launch/run_worker.sh', '--config=configs/bert_tiny.py',
                        f'--workdir={workdir}', f'--config.data.train_files={tmp_path}/no-*'],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1  # bert_jax.main's own status comes back
  log = (workdir / 'logs' / f'{socket.gethostname()}.log').read_text()
  assert 'no such file' in log and 'create_pretraining_data' in log
