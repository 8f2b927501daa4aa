"""The one training loop (bert_jax/training/loop.py) as users run it: a SIGTERM (preemption
notice) saves and exits 0, a `kill -9` loses only the steps since the last checkpoint, and the
resumed runs log exactly the losses of an uninterrupted run.

Run here through fine-tuning (`python -m bert_jax.finetune`, whose checkpoints also carry the
epoch's batch order). Pre-training goes through the same loop and is tested the same way on
its own paths: kill -9 then resume on a gs:// workdir (test_gcs), SIGTERM on either host of a
two-process pod then resume bit for bit (test_pod), a maintenance event (test_maintenance),
a rerun from a checkpoint under batch-size warmup (test_batch_warmup)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from test_finetune import classification_files, start_dir  # noqa: F401  (a fixture)
from cpu_env import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = cpu_env()


def fine_tuning(workdir, data, start, tmp_path):
  del data
  files = classification_files(tmp_path)  # 192 rows: 12 steps an epoch, checkpoints at ends
  return ([sys.executable, '-m', 'bert_jax.finetune', '--config=configs/finetune.py:generic',
           f'--workdir={workdir}', f'--init={start}', f'--config.data.train_file={files["train"]}',
           f'--config.data.dev_file={files["dev"]}', '--config.data.max_seq_length=32',
           '--config.train.global_batch_size=16', '--config.train.log_every=1',
           '--config.optimizer.learning_rate=5e-4', '--config.export=False'],
          os.path.join(workdir, 'seed_0', 'metrics.jsonl'), 36)


def logged_losses(metrics: str) -> dict[int, float]:
  """The last logged train loss of every step (a resumed run re-logs the steps after its
  checkpoint)."""
  out = {}
  if os.path.exists(metrics):
    with open(metrics) as f:
      for line in f:
        record = json.loads(line)
        if 'train/loss' in record:
          out[record['step']] = record['train/loss']
  return out


def run_until(cmd, metrics: str, step: int, sig: int) -> int:
  """Start `cmd`, send `sig` once it logged `step`; its exit status."""
  proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while max(logged_losses(metrics), default=0) < step:
    assert proc.poll() is None, f'ended before step {step}: {proc.stderr.read()[-3000:]}'
    assert time.time() < deadline, f'step {step} not reached in 300 s'
    time.sleep(0.05)
  proc.send_signal(sig)
  status = proc.wait(timeout=300)
  if sig == signal.SIGTERM:
    assert status == 0, proc.stderr.read()[-3000:]
  return status


@pytest.mark.parametrize('objective', [fine_tuning])
def test_sigterm_then_kill_9_then_resume_logs_the_uninterrupted_losses(
    objective, data, start_dir, tmp_path):  # noqa: F811
  whole_cmd, whole_metrics, last = objective(str(tmp_path / 'whole'), data, start_dir, tmp_path)
  done = subprocess.run(whole_cmd, cwd=ROOT, env=ENV, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  want = logged_losses(whole_metrics)
  assert sorted(want) == list(range(1, last + 1))

  cmd, metrics, _ = objective(str(tmp_path / 'cut'), data, start_dir, tmp_path)
  run_until(cmd, metrics, 6, signal.SIGTERM)
  stopped_at = max(logged_losses(metrics))
  assert stopped_at < last, 'the run finished before the notice'
  assert run_until(cmd, metrics, 20, signal.SIGKILL) == -signal.SIGKILL
  killed_at = max(logged_losses(metrics))
  assert stopped_at < killed_at < last, 'the run finished before it could be killed'
  done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  got = logged_losses(metrics)
  assert got == want  # every step's loss, bit for bit
  print(f'{objective.__name__}: SIGTERM saved step {stopped_at}, kill -9 at step {killed_at}; '
        f'the {last} losses equal the uninterrupted run\'s')
