"""Ahead-of-time compilation for a TPU topology: pre-training and fine-tuning steps, through
`python -m bert_jax.aot` as a user runs it, with libtpu from .venv/libtpu (requirements-aot.txt,
installed by scripts/setup_env.sh apart from the trainer's packages)."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax import aot_compile
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
  result = run_aot('--config=configs/bert_tiny.py', '--topology=v4:2x2x1',
                   '--config.model.num_layers=1')  # a TPU compile: ~8 s a layer
  assert result['device_kind'].startswith('TPU v4') and result['chips'] == 4
  assert result['objective'] == 'pretraining (nsp)' and result['mesh']['data'] == 4
  assert result['fits'] and 0 < result['per_chip_gib'] < 1


# The kinds whose batch schemas differ most from pre-training's (start/end positions; a
# [B, 4, S] choice axis); classification and tagging compile by the same path.
@pytest.mark.parametrize('task,objective,batch,length', [
    ('squad', 'fine-tuning (span)', 32, 384), ('swag', 'fine-tuning (multiple_choice)', 16, 128)])
def test_fine_tuning_step_compiles_for_v4_from_the_start_points_config_alone(
    tmp_path, task, objective, batch, length):
  """Only the start point's config.json exists: the shapes come from it, no weights are
  read; the task's head, loss and batch schema (per-token labels for tagging, [B, 4, S]
  choices for SWAG) come from its kind."""
  # One layer (a TPU compile costs ~8 s a layer here), BERT's vocabulary: what a chip holds
  # stays above the report's 0.01 GiB resolution.
  cfg = BertConfig.from_preset('tiny', num_layers=1)
  (tmp_path / 'config.json').write_text(json.dumps(hf.config_to_hf(cfg)))
  result = run_aot(f'--config=configs/finetune.py:{task}', f'--config.init={tmp_path}',
                   '--topology=v4:2x2x1')
  assert result['objective'] == objective and result['chips'] == 4
  assert result['global_batch'] == batch and result['seq_len'] == length
  assert result['fits'] and 0 < result['per_chip_gib'] < 1


def test_fine_tuning_without_a_start_point_says_what_to_pass():
  out = aot_process('--config=configs/finetune.py:mrpc', '--topology=v4:2x2x1')
  assert out.returncode != 0 and '--config.init=<start point>' in out.stderr


def test_hbm_table():
  assert aot_compile.hbm_bytes('TPU v5 lite') == 16 << 30
  assert aot_compile.hbm_bytes('TPU v4') == 32 << 30
  assert aot_compile.hbm_bytes('cpu') is None


def test_a_step_that_cannot_fit_is_reported_not_a_traceback():
  result = run_aot('--config=configs/modern.py:tiny,phase2', '--topology=v4:2x2x1',
                   '--config.train.global_batch_size=2048')
  assert result['fits'] is False and result['temporaries_gib'] > 32, result
  assert 'RESOURCE_EXHAUSTED' in result['error'] and 'remat_policy' in result['hint']


def test_chip_table_has_the_published_figures_in_one_place():
  v5e, v6e = aot_compile.chip('TPU v5 lite'), aot_compile.chip('TPU v6 lite')
  assert (v5e.hbm_bytes, v5e.peak_flops, v5e.hbm_bytes_per_s) == (16 << 30, 197e12, 819e9)
  assert v6e.hbm_bytes == aot_compile.hbm_bytes('TPU v6 lite') == 32 << 30
  # The roofline is the slower of compute and memory traffic: 197 TFLOP in 1 s, 819 GB in 1 s.
  assert aot_compile.roofline_ms(197e12, 1e9, v5e) == pytest.approx(1e3)
  assert aot_compile.roofline_ms(1e9, 819e9, v5e) == pytest.approx(1e3)


@pytest.mark.parametrize('per_row,quadratic', [(0.7, 0.0), (3.0, 0.0), (0.5, 0.005), (20.0, 0)])
def test_max_rows_brackets_the_limit_in_a_few_compiles(monkeypatch, per_row, quadratic):
  """A stand-in compiler (memory 1 + per_row·n + quadratic·n² GiB on a 16 GiB chip): the
  search ends on the largest fitting n with n + 1 compiled and failing."""
  def fake_compile(config, devices, num_labels=None):
    n = config.train.global_batch_size
    gib = 1 + per_row * n + quadratic * n * n
    if gib > 16:
      return {'rows_per_chip': n, 'fits': False, 'temporaries_gib': round(gib - 1, 2)}
    return {'rows_per_chip': n, 'fits': True, 'per_chip_gib': round(gib, 2),
            'arguments_gib': 1.0}

  monkeypatch.setattr(aot_compile, 'compile_for', fake_compile)
  devices = [type('D', (), {'device_kind': 'TPU v5 lite'})()]
  config = modern_config()
  result = aot_compile.max_rows(config, devices, log=lambda _: None)
  want = max(n for n in range(0, 100) if 1 + per_row * n + quadratic * n * n <= 16)
  assert result['max_rows_per_chip'] == want and result['max_rows_exact'], result
  assert len(result['compiles']) <= 6


def modern_config():
  from configs import modern  # pylint: disable=g-import-not-at-top
  return modern.get_config('tiny,phase1')


def test_token_tagging_step_compiles_for_v4_from_the_start_points_config_alone(tmp_path):
  """CoNLL tagging (configs/finetune.py:conll), the schema with per-token labels and weights
  [B, S] and a head on every position, from a start point's config.json alone, as the span
  and multiple-choice kinds above."""
  cfg = BertConfig.from_preset('tiny', vocab_size=1000, num_layers=1)  # TPU: ~8 s a layer
  (tmp_path / 'config.json').write_text(json.dumps(hf.config_to_hf(cfg)))
  result = run_aot('--config=configs/finetune.py:conll', f'--config.init={tmp_path}',
                   '--topology=v4:2x2x1')
  assert result['objective'] == 'fine-tuning (tagging)' and result['chips'] == 4
  assert result['global_batch'] == 32 and result['seq_len'] == 128
  assert result['fits'] and 0 < result['per_chip_gib'] < 1
