"""Ahead-of-time compilation for a TPU topology: pre-training and fine-tuning steps, through
`python -m bert_jax.aot` as a user runs it, with libtpu from .venv/libtpu (requirements-aot.txt,
installed by scripts/setup_env.sh apart from the trainer's packages)."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax import aot
from bert_jax.convert import hf
from bert_jax.model.encoder import BertConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBTPU = os.path.join(ROOT, '.venv', 'libtpu')


def aot_process(*args: str) -> subprocess.CompletedProcess:
  """`python -m bert_jax.aot ARGS` with libtpu importable; several may compile at once."""
  if not os.path.isdir(os.path.join(LIBTPU, 'libtpu')):
    pytest.fail(f'{LIBTPU}: no libtpu; run bash scripts/setup_env.sh (requirements-aot.txt)')
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([LIBTPU, ROOT]), XLA_FLAGS='',
             TPU_WORKER_HOSTNAMES='localhost', TPU_ACCELERATOR_TYPE='v4-8',
             ALLOW_MULTIPLE_LIBTPU_LOAD='1')
  return subprocess.run([sys.executable, '-m', 'bert_jax.aot', *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


def run_aot(*args: str) -> dict:
  out = aot_process(*args)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout[out.stdout.index('{'):])


def test_tiny_pretraining_step_compiles_for_a_small_v4_slice_and_fits():
  result = run_aot('--config=configs/bert_tiny.py', '--topology=v4:2x2x1')
  assert result['device_kind'].startswith('TPU v4') and result['chips'] == 4
  assert result['objective'] == 'pretraining (nsp)' and result['mesh']['data'] == 4
  assert result['fits'] and 0 < result['per_chip_gib'] < 1


@pytest.mark.parametrize('task,objective', [('mnli', 'fine-tuning (classification)'),
                                            ('squad', 'fine-tuning (span)')])
def test_fine_tuning_step_compiles_for_v4_from_the_start_points_config_alone(
    tmp_path, task, objective):
  """Only the start point's config.json exists: the shapes come from it, no weights are
  read; the task's head and loss come from configs/finetune.py:<task>."""
  cfg = BertConfig.from_preset('tiny', vocab_size=1000)
  (tmp_path / 'config.json').write_text(json.dumps(hf.config_to_hf(cfg)))
  result = run_aot(f'--config=configs/finetune.py:{task}', f'--config.init={tmp_path}',
                   '--topology=v4:2x2x1')
  assert result['objective'] == objective and result['chips'] == 4
  assert result['global_batch'] == 32 and result['seq_len'] == (384 if task == 'squad' else 128)
  assert result['fits'] and 0 < result['per_chip_gib'] < 1


def test_fine_tuning_without_a_start_point_says_what_to_pass():
  out = aot_process('--config=configs/finetune.py:mrpc', '--topology=v4:2x2x1')
  assert out.returncode != 0 and '--config.init=<start point>' in out.stderr


def test_hbm_table():
  assert aot.hbm_bytes('TPU v5 lite') == 16 << 30
  assert aot.hbm_bytes('TPU v4') == 32 << 30
  assert aot.hbm_bytes('cpu') is None


def test_modern_base_at_8192_tokens_compiles_for_v4_and_reports_its_memory():
  """ModernBERT-base's phase 2 (8,192-token rows, one per chip) fits a v4 chip."""
  result = run_aot('--config=configs/modern.py:base,phase2', '--topology=v4:2x2x1',
                   '--config.train.global_batch_size=4')
  assert result['objective'] == 'pretraining (none)' and result['seq_len'] == 8192
  assert result['fits'] and 5 < result['per_chip_gib'] < 32, result


def test_a_step_that_cannot_fit_is_reported_not_a_traceback():
  result = run_aot('--config=configs/modern.py:tiny,phase2', '--topology=v4:2x2x1',
                   '--config.train.global_batch_size=2048')
  assert result['fits'] is False and result['temporaries_gib'] > 32, result
  assert 'RESOURCE_EXHAUSTED' in result['error'] and 'remat_policy' in result['hint']
