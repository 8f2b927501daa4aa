"""Ahead-of-time compilation for a TPU topology: pre-training and fine-tuning steps, with libtpu
from .venv/libtpu (requirements-aot.txt, installed by scripts/setup_env.sh apart from the
trainer's packages).

Each libtpu process costs seconds of imports and TPU set-up before its first compile, so one
process (`compiled`, run by this file's __main__) compiles every step the tests below check:
the pre-training step through `bert_jax.aot`'s command-line entry point exactly as
`python -m bert_jax.aot ARGS --fit` runs it (its flags, its JSON and override line on stdout), then the fine-tuning
steps and the one that cannot fit through `aot_compile.compile_for`, the library function that
command calls with the parsed config."""

import contextlib
import copy
import io
import json
import os
import runpy
import subprocess
import sys

import pytest

from bert_jax import aot_compile
from bert_jax.convert import hf
from bert_jax.model.encoder import BertConfig
from configs import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBTPU = os.path.join(ROOT, '.venv', 'libtpu')

# The pre-training step as a user compiles it. A libtpu compile here costs ~10 s at one layer
# and 8 rows of 32 tokens, ~25 s at BERT-tiny's 32 rows of 128: one layer, small rows.
SMALL_ROWS = {'train.global_batch_size': 8, 'data.max_seq_length': 32}
CLI_ARGS = ('--config=configs/bert_tiny.py', '--topology=v5e:2x2', '--fit',
            '--config.model.num_layers=1', '--config.data.max_predictions_per_seq=5',
            *(f'--config.{k}={v}' for k, v in SMALL_ROWS.items()))
# The fine-tuning kinds whose batch schemas differ most from pre-training's (start/end
# positions; a [B, 4, S] choice axis; per-token labels and weights [B, S]); classification
# compiles by the same path. Each from the start point's config.json alone.
FINE_TUNING = ('squad', 'swag', 'conll')


def aot_env() -> dict:
  if not os.path.isdir(os.path.join(LIBTPU, 'libtpu')):
    pytest.fail(f'{LIBTPU}: no libtpu; run bash scripts/setup_env.sh (requirements-aot.txt)')
  return dict(os.environ, PYTHONPATH=os.pathsep.join([LIBTPU, ROOT]), XLA_FLAGS='',
              TPU_WORKER_HOSTNAMES='localhost', TPU_ACCELERATOR_TYPE='v4-8',
              ALLOW_MULTIPLE_LIBTPU_LOAD='1')


def aot_process(*args: str) -> subprocess.CompletedProcess:
  """`python -m bert_jax.aot ARGS` with libtpu importable."""
  return subprocess.run([sys.executable, '-m', 'bert_jax.aot', *args], cwd=ROOT, env=aot_env(),
                        capture_output=True, text=True, timeout=300)


def compile_all(start_point: str) -> dict:
  """(In the libtpu process.) The CLI's report for CLI_ARGS, then compile_for's for each
  fine-tuning task from `start_point` and for a ModernBERT step too large for a v4 chip."""
  out = io.StringIO()
  sys.argv = ['bert_jax.aot', *CLI_ARGS]
  with contextlib.redirect_stdout(out):
    try:
      runpy.run_module('bert_jax.aot', run_name='__main__', alter_sys=True)
    except SystemExit as e:  # absl's app.run exits; 0 (or None) when main returned
      assert not e.code, e.code
  stdout = out.getvalue()
  results = {'cli': json.loads(stdout[stdout.index('{'):stdout.rindex('}') + 1]),
             'cli_last_line': stdout.splitlines()[-1]}
  # pylint: disable=g-import-not-at-top
  from configs import electra, finetune, modern
  devices = aot_compile.topology_devices('v4:2x2x1')
  for task in FINE_TUNING:
    config = finetune.get_config(task)
    config.init = start_point
    config.update_from_flattened_dict(SMALL_ROWS)
    results[task] = aot_compile.compile_for(config, devices)
  config = electra.get_config('small')  # the paper's widths: 128-wide tables, generator 1/4
  config.update_from_flattened_dict({**SMALL_ROWS, 'data.max_predictions_per_seq': 5,
                                     'model.num_layers': 1})  # as the start point: 1 layer
  results['rtd'] = aot_compile.compile_for(config, devices)
  config = modern.get_config('tiny,phase2')
  config.train.global_batch_size = 2048  # (refused before the expensive passes: ~6 s)
  results['too_large'] = aot_compile.compile_for(config, devices)
  from configs import bert_tiny  # pylint: disable=g-import-not-at-top
  config = bert_tiny.get_config()  # 1 row a chip, almost all of its HBM held back
  config.update_from_flattened_dict({**SMALL_ROWS, 'data.max_predictions_per_seq': 5,
                                     'model.num_layers': 1, 'train.global_batch_size': 4})
  results['no_fit'] = aot_compile.fit(config, aot_compile.topology_devices('v5e:2x2'),
                                      reserve=0.99999, log=lambda _: None)
  return results


@pytest.fixture(scope='module')
def compiled(tmp_path_factory) -> dict:
  """Every step's report, from one libtpu process. The start point: BERT-tiny at one layer
  (a TPU compile costs ~8 s a layer here) with BERT's vocabulary, so what a chip holds stays
  above the report's 0.01 GiB resolution; only its config.json exists."""
  start = tmp_path_factory.mktemp('start_point')
  cfg = BertConfig.from_preset('tiny', num_layers=1)
  (start / 'config.json').write_text(json.dumps(hf.config_to_hf(cfg)))
  out = subprocess.run([sys.executable, os.path.abspath(__file__), str(start)], cwd=ROOT,
                       env=aot_env(), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.splitlines()[-1])


def test_tiny_pretraining_step_compiles_for_a_small_v5e_slice_and_fits(compiled):
  """Through the command's own entry point and flags (`python -m bert_jax.aot --fit`): the
  report is the chosen setting's compile."""
  result = compiled['cli']
  assert result['topology'] == 'v5e:2x2'
  assert result['device_kind'].startswith('TPU v5') and result['chips'] == 4
  assert result['objective'] == 'pretraining (nsp)' and result['mesh']['data'] == 4
  assert result['global_batch'] == 8 and result['seq_len'] == 32  # the overrides took
  assert result['fits'] and 0 < result['per_chip_gib'] < 1


@pytest.mark.parametrize('task,objective,batch,length', [
    ('squad', 'fine-tuning (span)', 32, 384), ('swag', 'fine-tuning (multiple_choice)', 16, 128),
    ('conll', 'fine-tuning (tagging)', 32, 128)])
def test_fine_tuning_step_compiles_for_v4_from_the_start_points_config_alone(
    compiled, task, objective, batch, length):
  """Only the start point's config.json exists: the shapes come from it, no weights are
  read; the task's head, loss and batch schema (start/end positions for SQuAD, [B, 4, S]
  choices for SWAG, per-token labels and weights [B, S] for CoNLL tagging) come from its
  kind. Compiled at SMALL_ROWS (the report gives the compiled config's batch and length); the
  task's own batch and row length are its config's."""
  from configs import finetune  # pylint: disable=g-import-not-at-top
  defaults = finetune.get_config(task)
  assert (defaults.train.global_batch_size, defaults.data.max_seq_length) == (batch, length)
  result = compiled[task]
  assert result['objective'] == objective and result['chips'] == 4
  assert result['global_batch'] == 8 and result['seq_len'] == 32
  assert result['fits'] and 0 < result['per_chip_gib'] < 1


def test_electra_small_rtd_step_compiles_for_v4_and_fits(compiled):
  """configs/electra.py:small's replaced-token detection step (the discriminator, its MLM
  generator and the shared embedding tables in one step) through `compile_for`, at SMALL_ROWS
  and one layer (each layer adds compile time, not a different program)."""
  result = compiled['rtd']
  assert result['objective'] == 'replaced-token detection (tied)', result
  assert result['chips'] == 4 and result['mesh']['data'] == 4
  assert result['global_batch'] == 8 and result['seq_len'] == 32
  assert result['fits'] and 0 < result['per_chip_gib'] < 1 and result['model_tflops_per_step'] > 0


def test_fine_tuning_without_a_start_point_says_what_to_pass():
  out = aot_process('--config=configs/finetune.py:mrpc', '--topology=v4:2x2x1')
  assert out.returncode != 0 and '--config.init=<start point>' in out.stderr


def test_hbm_is_the_published_capacity_less_a_stated_reserve():
  """v4's page says 32 GiB; v5e's 16 GB, v5p's 95 GB and v6e's 32 GB, read as decimal
  gigabytes (never more than the chip has). A fit leaves 5% of it to what XLA's memory analysis
  does not count."""
  want = {'TPU v4': 32 * 2**30, 'TPU v5 lite': 16e9, 'TPU v5p': 95e9, 'TPU v6 lite': 32e9}
  for kind, capacity in want.items():
    assert aot_compile.chip(kind).hbm_bytes == capacity
    assert aot_compile.usable_bytes(kind) == int(capacity * 0.95)
    assert aot_compile.usable_bytes(kind, reserve=0.0) == capacity
  assert aot_compile.usable_bytes('cpu') is None


def test_a_step_that_cannot_fit_is_reported_not_a_traceback(compiled):
  """ModernBERT-tiny phase 2 at a global batch of 2,048 on v4:2x2x1."""
  result = compiled['too_large']
  assert result['fits'] is False and result['temporaries_gib'] > 32, result
  assert 'RESOURCE_EXHAUSTED' in result['error'] and 'remat_policy' in result['hint']


def test_chip_table_has_the_published_figures_in_one_place():
  v5e, v5p = aot_compile.chip('TPU v5 lite'), aot_compile.chip('TPU v5p')
  assert (v5e.hbm_bytes, v5e.peak_flops, v5e.hbm_bytes_per_s) == (16e9, 197e12, 819e9)
  assert (v5p.hbm_bytes, v5p.peak_flops, v5p.hbm_bytes_per_s) == (95e9, 459e12, 2765e9)
  # The roofline is the slower of compute and memory traffic: 197 TFLOP in 1 s, 819 GB in 1 s.
  assert aot_compile.roofline_ms(197e12, 1e9, v5e) == pytest.approx(1e3)
  assert aot_compile.roofline_ms(1e9, 819e9, v5e) == pytest.approx(1e3)


def test_fit_picks_bfloat16_and_the_cheapest_fitting_settings_for_v5e_chips(compiled):
  """BERT-tiny (one layer, 8 rows of 32 tokens) on 4 v5e chips, compiled by libtpu through
  `python -m bert_jax.aot --fit`: the most frugal setting at one accumulation step fits, so
  does the cheapest (no remat, the whole loss): two compiles, and the line to pass."""
  result = compiled['cli']
  assert result['fits'] and result['device_kind'].startswith('TPU v5'), result
  assert result['fit'] == {'model.dtype': 'bfloat16', 'train.accum_steps': 1,
                           'model.remat_policy': 'none', 'model.mlm_loss_chunk': 0}
  assert result['overrides'] == ('--config.model.dtype=bfloat16 --config.train.accum_steps=1 '
                                 '--config.model.remat_policy=none --config.model.mlm_loss_chunk=0')
  assert result['model_dtype'] == 'bfloat16' and result['per_chip_gib'] <= result['usable_gib']
  assert [c['model.remat_policy'] for c in result['compiles']] == ['full', 'none']
  assert compiled['cli_last_line'] == f'fits v5e:2x2: {result["overrides"]}'


def test_fit_refuses_naming_what_it_needed_when_nothing_fits(compiled):
  """`fit` with almost all of the chip held back: the most frugal setting at every
  accumulation count (here 1 row a chip: one) is compiled by libtpu and does not fit; the
  report says what it needed, of what, and what to change (the command prints it as its
  error and exits 1)."""
  result = compiled['no_fit']
  assert result['fits'] is False and len(result['compiles']) == 1, result
  assert result['error'].startswith('nothing fits: even 1 row a chip per micro-step (1 ')
  assert '--config.model.remat_policy=full' in result['error'] and 'more chips' in result['hint']


def test_aot_flags_that_contradict_or_are_out_of_range_say_so():
  both = aot_process('--config=configs/bert_tiny.py', '--topology=v5e:1x1', '--fit', '--max_rows')
  assert both.returncode != 0 and '--fit and --max_rows: pass one' in both.stderr
  bad = aot_process('--config=configs/bert_tiny.py', '--topology=v5e:1x1', '--hbm_reserve=1.5')
  assert bad.returncode != 0 and '--hbm_reserve=1.5: a share of HBM in [0, 1)' in bad.stderr


# A stand-in compiler's GiB a chip: 1 + micro-batch rows x (activations by remat policy + the
# MLM logits, whole or chunked).
ACTIVATIONS = {'none': 4.0, 'dots': 3.0, 'projections': 2.5, 'dots_no_batch': 2.0, 'full': 1.0}


def stand_in_gib(config, scale):
  rows = config.train.global_batch_size // config.train.accum_steps
  logits = 0.2 if config.model.mlm_loss_chunk else 2.0
  return 1 + scale * rows * (ACTIVATIONS[config.model.remat_policy] + logits)


@pytest.mark.parametrize('scale,want', [
    (0.1, (1, 'none', 0)), (0.3, (1, 'none', 512)), (0.6, (1, 'projections', 512)),
    (1.0, (1, 'full', 512)), (1.6, (2, 'full', 512)), (30.0, None)])
def test_fit_returns_the_first_fitting_setting_in_cost_order(monkeypatch, scale, want):
  """With a stand-in compiler on a v5e chip (14.16 GiB usable): the setting `fit` returns is
  the first of `fit_settings` that fits, found in at most one compile per accumulation count
  that cannot fit plus the settings tried where one can; when none fits, why."""
  limit = 16e9 * 0.95 / 2**30
  compiled = []

  def fake_compile(config, devices, num_labels=None, reserve=None):
    gib = stand_in_gib(config, scale)
    compiled.append(gib)
    if gib > 2 * limit:  # as libtpu refuses a step far over: the temporaries it needed
      return {'fits': False, 'temporaries_gib': round(gib - 1, 2)}
    return {'fits': gib <= limit, 'per_chip_gib': round(gib, 2)}

  monkeypatch.setattr(aot_compile, 'compile_for', fake_compile)
  devices = [type('D', (), {'device_kind': 'TPU v5 lite'})()]
  from configs import bert_base  # pylint: disable=g-import-not-at-top
  config = bert_base.get_config('phase2')  # 512 tokens, 80 predictions: chunks of 20
  config.train.global_batch_size = 8
  config.data.max_predictions_per_seq = 2048  # chunks of 512
  settings = aot_compile.fit_settings(config, devices)
  first = next((s for s in settings if stand_in_gib(common.override(
      copy.deepcopy(config), s), scale) <= limit), None)
  result = aot_compile.fit(config, devices, log=lambda _: None)
  if want is None:
    assert first is None and not result['fits']
    assert 'nothing fits: even 1 row a chip per micro-step (8 accumulation' in result['error']
    assert 'needs more than 36.0 GiB of temporaries a chip of the 14.16 GiB usable' in (
        result['error'])
    assert len(compiled) == 4  # accumulation counts 1, 2, 4, 8: one compile each
    return
  assert result['fit'] == first and result['fits']
  assert (first['train.accum_steps'], first['model.remat_policy'],
          first['model.mlm_loss_chunk']) == want
  assert all(s['model.dtype'] == 'bfloat16' for s in settings)
  level = [s for s in settings if s['train.accum_steps'] == first['train.accum_steps']]
  passed_over = [1, 2, 4, 8].index(first['train.accum_steps'])  # one compile each
  tried = level.index(first) + 1 if first is not level[-1] else len(level) - 1
  assert len(compiled) == passed_over + 1 + tried


@pytest.mark.parametrize('per_row,quadratic', [(0.7, 0.0), (3.0, 0.0), (0.5, 0.005), (20.0, 0)])
def test_max_rows_brackets_the_limit_in_a_few_compiles(monkeypatch, per_row, quadratic):
  """A stand-in compiler (memory 1 + per_row·n + quadratic·n² GiB on a v5e chip, 14.16 GiB
  usable): the search ends on the largest fitting n with n + 1 compiled and failing."""
  limit = 16e9 * 0.95 / 2**30

  def fake_compile(config, devices, num_labels=None, reserve=None):
    n = config.train.global_batch_size
    gib = 1 + per_row * n + quadratic * n * n
    if gib > limit:
      return {'rows_per_chip': n, 'fits': False, 'temporaries_gib': round(gib - 1, 2)}
    return {'rows_per_chip': n, 'fits': True, 'per_chip_gib': round(gib, 2),
            'arguments_gib': 1.0}

  monkeypatch.setattr(aot_compile, 'compile_for', fake_compile)
  devices = [type('D', (), {'device_kind': 'TPU v5 lite'})()]
  config = modern_config()
  result = aot_compile.max_rows(config, devices, log=lambda _: None)
  want = max(n for n in range(0, 100) if 1 + per_row * n + quadratic * n * n <= limit)
  assert result['max_rows_per_chip'] == want and result['max_rows_exact'], result
  assert len(result['compiles']) <= 6


@pytest.mark.parametrize('unit,start,cap,quadratic,fail_from', [
    (64, 4096, 32768, 8e-8, None),  # cached contrastive rows: the score matrix's square
    (16, 4096, 32768, 8e-8, None),
    (64, 4096, 8192, 8e-8, None),  # the cap fits: capped, nothing compiled above it
    (1, 256, None, 0.0, None),  # linear, the start past the limit: halved first
    (64, 4096, 32768, 8e-8, 20_000)])  # past 20,000 the compiler says nothing of its bytes
def test_max_rows_in_units_from_a_start_with_a_cap(monkeypatch, unit, start, cap, quadratic,
                                                   fail_from):
  """The search benchmarks/aot_contrastive.py runs (rows a chip in multiples of the chunk a
  chip embeds at a time; bytes growing with the square of the rows): a stand-in compiler of 4
  + 1e-5·n + quadratic·n² GiB on a v5e chip (14.16 GiB usable). The answer is a multiple of
  the unit within 1/8 of the largest that fits, the rows after it fail, every compile is a
  multiple of the unit at most `cap`, and a few compiles do it."""
  limit = 16e9 * 0.95 / 2**30
  compiled = []
  per_row = 1e-5 if quadratic else 0.05

  def fake_compile(config, devices, num_labels=None, reserve=None):
    n = config.train.global_batch_size
    compiled.append(n)
    gib = 4 + per_row * n + quadratic * n * n
    if gib > limit:
      figure = {} if fail_from and n >= fail_from else {'temporaries_gib': round(gib - 1, 2)}
      return {'rows_per_chip': n, 'fits': False, **figure}
    return {'rows_per_chip': n, 'fits': True, 'per_chip_gib': round(gib, 2),
            'arguments_gib': 1.0}

  monkeypatch.setattr(aot_compile, 'compile_for', fake_compile)
  devices = [type('D', (), {'device_kind': 'TPU v5 lite'})()]
  result = aot_compile.max_rows(modern_config(), devices, log=lambda _: None, max_compiles=10,
                                unit=unit, start=start, cap=cap, precision=0.125)
  n, most = result['max_rows_per_chip'], max(
      k for k in range(0, 200_000, unit) if 4 + per_row * k + quadratic * k * k <= limit)
  assert all(c % unit == 0 and (cap is None or c <= cap) for c in compiled), compiled
  assert n % unit == 0 and len(compiled) <= 10, (n, compiled)
  if cap is not None and most >= cap:
    assert result['capped'] and n == cap and result['first_failing'] is None
    return
  assert most * 7 / 8 <= n <= most and result['first_failing'] > most, (n, most, compiled)
  assert not result['capped'] and set(result['compiles']) == {str(c) for c in compiled}


def modern_config():
  from configs import modern  # pylint: disable=g-import-not-at-top
  return modern.get_config('tiny,phase1')


if __name__ == '__main__':  # the libtpu process of `compiled`
  print(json.dumps(compile_all(sys.argv[1])))
