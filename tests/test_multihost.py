"""Two CPU processes x 4 devices (launch/local_pod.sh) train exactly like one process x 8."""

import os
import subprocess
import sys

import numpy as np

from test_train import ROOT, data, logged_losses, main_command, overrides  # noqa: F401


def test_two_processes_give_the_same_losses_as_one(data, tmp_path):  # noqa: F811
  # The reader deals chunks to 8 record streams whatever the process count; process i reads
  # global records i, i+2, ... (dataset.training_records), so each global batch holds the same
  # rows as the single process's, permuted. No shuffle buffer and no dropout, which would draw
  # per row position; the rest must agree to float32 round-off.
  values = overrides(data, steps=8, **{
      'data.train_files': str(data / 'train-00000-of-00003'), 'data.eval_files': '',
      'data.shuffle_buffer': 1, 'model.hidden_dropout': 0.0, 'model.attention_dropout': 0.0,
      'train.checkpoint_every': 4})
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  single = subprocess.run(main_command(str(tmp_path / 'one'), values), cwd=ROOT, timeout=300,
                          env=dict(env, XLA_FLAGS='--xla_force_host_platform_device_count=8'),
                          capture_output=True, text=True)
  assert single.returncode == 0, single.stderr[-3000:]
  flags = main_command(str(tmp_path / 'two'), values)[3:]
  pod = subprocess.run(['bash', 'launch/local_pod.sh', '2', *flags], cwd=ROOT, timeout=300,
                       env=dict(env, DEVICES='4', PYTHON=sys.executable, PORT='12461'),
                       capture_output=True, text=True)
  assert pod.returncode == 0, pod.stdout[-3000:] + pod.stderr[-3000:]
  a, b = logged_losses(str(tmp_path / 'one')), logged_losses(str(tmp_path / 'two'))
  assert sorted(a) == sorted(b) == list(range(1, 9))
  np.testing.assert_allclose([a[s] for s in a], [b[s] for s in a], rtol=3e-6, atol=0)  # ~8
  # Both processes saved their data-iterator position into the same step directory.
  step_dir = tmp_path / 'two' / 'checkpoints' / '8' / 'data'
  assert {p.name for p in step_dir.iterdir() if p.name.startswith('process_')} == {
      'process_0', 'process_1'}
