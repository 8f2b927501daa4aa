"""launch/tpu_pod.sh --dry-run prints the whole pod lifecycle; bad arguments fail clearly."""

import os
import shlex
import subprocess

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
  train = [shlex.split(l[2:]) for l in lines if 'bert_jax.main' in l]
  assert len(train) == 1 and '--worker=all' in train[0]
  remote = [a for a in train[0] if a.startswith('--command=')][0][len('--command='):]
  # The remote shell receives the flags intact, the glob unexpanded.
  assert shlex.split(remote)[-4:] == ['--tpu', '--config=configs/bert_base.py:phase1',
                                      '--workdir=gs://b/p1',
                                      '--config.data.train_files=gs://b/wiki/train-*']
  install = [' '.join(shlex.split(l[2:])) for l in lines if 'requirements.txt' in l]
  assert len(install) == 1 and "'jax[tpu]==0.10.2'" in install[0]
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
