"""The training system end to end on CPU: learning, resume identity, preemption, export."""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from bert_jax.pretrain import run as train
from bert_jax.pretrain import step as pretrain_step
from bert_jax.training import checkpointing, run_control, run_setup
from configs import bert_tiny, common, upgrade
from input_pipeline import fs
from input_pipeline.tokenizer import WordPieceTokenizer
from cpu_env import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def overrides(data, steps=30, **extra):
  values = {
      'model.vocab_size': 2000, 'data.train_files': str(data / 'train-*'),
      'data.eval_files': str(data / 'eval'), 'data.vocab_file': str(data / 'vocab.txt'),
      'data.max_seq_length': 64, 'data.max_predictions_per_seq': 10, 'data.shuffle_buffer': 200,
      'train.num_steps': steps, 'train.global_batch_size': 16, 'train.log_every': 1,
      'train.eval_every': 1000, 'train.eval_steps': 4, 'train.checkpoint_every': 5,
      'optimizer.learning_rate': 1e-3, 'optimizer.warmup_steps': 5,
  }
  values.update(extra)
  return values


def config_with(values):
  return common.override(bert_tiny.get_config(), values)


def logged_losses(workdir):
  """Last logged train loss per step (a resumed run re-logs steps after its checkpoint), from
  a local or gs:// workdir."""
  out = {}
  for line in fs.read_text(f'{workdir}/metrics.jsonl').splitlines():
    r = json.loads(line)
    if 'train/loss' in r:
      out[r['step']] = r['train/loss']
  return out


def main_command(workdir, values):
  cmd = [sys.executable, '-m', 'bert_jax.main', '--config=configs/bert_tiny.py',
         f'--workdir={workdir}']
  return cmd + [f'--config.{k}={v}' for k, v in values.items()]


def run_main(workdir, values, timeout=300, mode='train'):
  env = cpu_env()
  return subprocess.run(main_command(workdir, values) + [f'--mode={mode}'], cwd=ROOT, env=env,
                        timeout=timeout, capture_output=True, text=True)


def start_main(workdir, values, extra_flags=()):
  env = cpu_env()
  return subprocess.Popen(main_command(workdir, values) + list(extra_flags), cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_step(workdir, step, proc, timeout=300):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if os.path.exists(os.path.join(workdir, 'metrics.jsonl')) and \
        max(logged_losses(workdir), default=0) >= step:
      return
    if proc.poll() is not None:
      raise AssertionError(f'run ended early: {proc.stderr.read()[-3000:]}')
    time.sleep(0.2)
  raise AssertionError(f'step {step} not reached in {timeout}s')


# The learning run, the mesh test and the scanned-to-unrolled init train bert_tiny's two
# unrolled layers with a constant schedule (5 warmup steps, then a constant rate: the
# schedule is no claim of theirs, and with it train.num_steps is not part of the compiled
# step, so runs of other lengths share one program): on the default 8x1x1 mesh they run one
# program, and on 2x2x2 test_sharding.py's; the suite's compilation cache serves them.
SHARED = {'optimizer.schedule': 'constant'}
# What the other resume, init and error tests train: one layer (their claims do not depend on
# the depth, and an unrolled layer less is less XLA compile). All: no held-out eval (one
# program less), unless the test's claim is about it.
ONE_LAYER = {'model.num_layers': 1, 'data.eval_files': ''}


@pytest.fixture(scope='module')
def trained(data, tmp_path_factory):
  """One 40-step pre-training run (the default optimizer, unrolled layers, steps 3-5
  profiled): (workdir, result). Besides the learning test, the tests that only read a
  finished workdir share it: export, phase-2 init_from, a refused optimizer-state init."""
  workdir = tmp_path_factory.mktemp('trained')
  values = overrides(data, steps=40, **SHARED, **{'train.profile_steps': '3,5',
                                                  'train.checkpoint_every': 40})
  return workdir, train.train_and_evaluate(config_with(values), str(workdir))


def test_tiny_learns_and_evaluates(trained):
  workdir, result = trained
  traces = [f for _, _, files in os.walk(workdir / 'profile') for f in files]
  assert any(f.endswith('.xplane.pb') for f in traces), traces
  losses = logged_losses(str(workdir))
  assert sorted(losses) == list(range(1, 41))
  first, last = np.mean([losses[s] for s in range(1, 6)]), np.mean([losses[s] for s in range(36, 41)])
  assert last < first - 0.5, (first, last)
  assert 0 <= result['eval']['mlm_accuracy'] <= 1 and math.isfinite(result['eval']['mlm_loss'])
  assert checkpointing.make_manager(str(workdir)).latest_step() == 40


@pytest.mark.multi_device
def test_restore_onto_a_different_mesh_continues_the_same_run(data, tmp_path):
  # The constant schedule: stopping at step 6 (num_steps=6) changes nothing else. Each run
  # saves only its last step (a save on 8 devices costs orbax ~100 small slicing programs).
  run = lambda steps, mesh, name: train.train_and_evaluate(config_with(overrides(
      data, steps=steps, mesh=mesh, **SHARED, **{'data.eval_files': '',
                                                 'train.checkpoint_every': 1000})),
      str(tmp_path / name))
  # The reference and the first half share a mesh (and so one compiled program); the second
  # half restores onto another one (the default, the learning run's).
  run(12, (2, 2, 2), 'ref')
  run(6, (2, 2, 2), 'moved')
  run(12, (8, 1, 1), 'moved')
  a, b = logged_losses(str(tmp_path / 'ref')), logged_losses(str(tmp_path / 'moved'))
  # Other meshes sum in other orders: equal to float32 round-off at the losses' scale.
  np.testing.assert_allclose([a[s] for s in range(7, 13)], [b[s] for s in range(7, 13)],
                             rtol=3e-6, atol=0)


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(data, tmp_path):
  # A checkpoint every step: whichever step first goes non-finite is a checkpoint step, and
  # what is saved before it must still be finite.
  config = config_with(overrides(data, steps=40, **ONE_LAYER, **{'optimizer.learning_rate': 1e12,
                                                    'optimizer.warmup_steps': 0,
                                                    'optimizer.clip_norm': 0.0,
                                                    'train.checkpoint_every': 1}))
  with pytest.raises(run_control.NonFiniteError, match=r'step \d+: loss=.* is not finite') as err:
    train.train_and_evaluate(config, str(tmp_path))
  bad_step = int(str(err.value).split(':')[0].split()[-1])
  latest = checkpointing.make_manager(str(tmp_path)).latest_step()
  assert latest is None or latest < bad_step
  if latest is not None:
    _, params = checkpointing.restore_params(str(tmp_path))
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(params))


def test_a_preempted_run_stops_what_would_use_the_finished_model(data, tmp_path):
  """train_to_the_end, the demo's and the benchmarks' way in: a SIGTERM mid-run saves its step
  and raises Preempted (exit status 0) instead of returning a partial model for them to
  evaluate, export or fine-tune (a benchmark once fine-tuned one); the same call resumes it."""
  workdir = str(tmp_path / 'run')
  config = config_with(overrides(data, steps=40, **ONE_LAYER, **{'train.checkpoint_every': 1000}))

  def notice():  # only while the run's own handler is in place: never the worker's default
    deadline = time.time() + 300
    while time.time() < deadline:
      if (os.path.exists(f'{workdir}/metrics.jsonl') and max(logged_losses(workdir),
                                                              default=0) >= 2 and
          isinstance(getattr(signal.getsignal(signal.SIGTERM), '__self__', None),
                     run_control.PreemptionFlag)):
        os.kill(os.getpid(), signal.SIGTERM)
        return
      time.sleep(0.05)
  threading.Thread(target=notice, daemon=True).start()
  with pytest.raises(train.Preempted) as stopped:
    train.train_to_the_end(config, workdir)
  assert stopped.value.code == 0
  saved = checkpointing.make_manager(workdir).latest_step()
  assert 2 <= saved < 40, saved
  assert train.train_to_the_end(config, workdir)['step'] == 40
  assert sorted(logged_losses(workdir)) == list(range(1, 41))


def test_export_from_a_workdir_loads_in_transformers_and_fills_masks(data, trained,
                                                                    tmp_path):
  import torch
  import transformers
  workdir = str(trained[0])
  out = subprocess.run([sys.executable, '-m', 'bert_jax.export', f'--workdir={workdir}',
                        f'--output={tmp_path / "hf"}'], cwd=ROOT, capture_output=True, text=True,
                       env=cpu_env(), timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  model, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path / 'hf'),
                                                                 output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys']
  fill = transformers.pipeline('fill-mask', model=str(tmp_path / 'hf'), device='cpu')
  assert len(fill('Return the [MASK] of the object.', top_k=3)) == 3
  # The exported weights are the checkpoint's.
  _, params = checkpointing.restore_params(workdir)
  np.testing.assert_array_equal(
      model.bert.embeddings.word_embeddings.weight.detach().numpy(),
      params['embeddings']['word_embeddings']['embedding'])
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
  ours = WordPieceTokenizer(str(data / 'vocab.txt'))
  assert tok('Return the value.', add_special_tokens=False)['input_ids'] == ours.encode('Return the value.')
  del torch


def test_main_reports_bad_input_without_a_traceback(data, tmp_path):
  out = run_main(str(tmp_path), overrides(data, **{'data.train_files': '/nope/train-*'}))
  assert out.returncode != 0
  assert "error: data files '/nope/train-*': no such file" in out.stderr
  assert 'Traceback' not in out.stderr
  # A bad mesh raises the same kind of error (a ValueError) in the same call that main wraps
  # (run_control.user_errors), and so reaches the CLI as the line above does: here in-process
  # (the worker's devices), which spares a ~8 s process.
  with pytest.raises(ValueError, match=rf'config.mesh=\[3, 1, 1\] has 3 slots for '
                                       rf'{jax.device_count()} devices'):
    train.train_and_evaluate(config_with(overrides(data, mesh=(3, 1, 1))), str(tmp_path / 'm'))


def test_export_errors_are_clear(tmp_path):
  with pytest.raises(FileNotFoundError, match='no checkpoints/ directory'):
    checkpointing.restore_params(str(tmp_path))


def test_phase2_init_from_takes_params_only(data, trained):
  phase1 = str(trained[0])
  values = overrides(data, steps=3, **{'train.init_from': phase1})
  config = config_with(values)
  state = train._initial_state(pretrain_step.setup(config))
  _, params = checkpointing.restore_params(phase1)
  assert int(state.step) == 0
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(state.params), params)
  mu = jax.device_get(state.opt_state[1].mu)
  assert all((x == 0).all() for x in jax.tree_util.tree_leaves(mu))


LAMB = {'optimizer.name': 'lamb', 'optimizer.schedule': 'poly_warmup',
        'optimizer.warmup_proportion': 0.3}


def _state_of(config, workdir=None):
  """The run's initial state (`_initial_state`), or a workdir's latest saved one."""
  setup = pretrain_step.setup(config)
  if workdir is None:
    return train._initial_state(setup)
  abstract = setup.abstract_state()
  with checkpointing.make_manager(workdir) as manager:
    return checkpointing.restore(manager, manager.latest_step(), abstract)


def test_lamb_phase2_carries_phase1_moments_with_a_fresh_step_count(data, tmp_path):
  # Both phases 4 steps of one schedule: phase 2 runs phase 1's compiled step.
  phase1, phase2 = str(tmp_path / 'p1'), str(tmp_path / 'p2')
  train.train_and_evaluate(config_with(overrides(data, steps=4, **LAMB, **ONE_LAYER)), phase1)
  config = config_with(overrides(data, steps=4, **LAMB, **ONE_LAYER, **{
      'train.init_from': phase1, 'train.init_opt_state_from': True}))
  state, saved = jax.device_get(_state_of(config)), jax.device_get(_state_of(config, phase1))
  adam, saved_adam = state.opt_state[1], saved.opt_state[1]
  assert (int(state.step), int(adam.count), int(state.opt_state[-1].count)) == (0, 0, 0)
  assert int(saved_adam.count) == 4 and int(saved.opt_state[-1].count) == 4
  pairs = ((adam.mu, saved_adam.mu), (adam.nu, saved_adam.nu), (state.params, saved.params))
  for ours, theirs in pairs:
    jax.tree_util.tree_map(np.testing.assert_array_equal, ours, theirs)
  assert any((x != 0).any() for x in jax.tree_util.tree_leaves(adam.nu))
  result = train.train_and_evaluate(config, phase2)  # and it trains from there
  assert result['step'] == 4 and math.isfinite(result['train']['loss'])


def test_init_opt_state_from_another_optimizer_is_a_clear_error(data, trained):
  phase1 = str(trained[0])  # adamw_bert
  config = config_with(overrides(data, steps=2, **LAMB, **{
      'train.init_from': phase1, 'train.init_opt_state_from': True}))
  with pytest.raises(ValueError, match=r'train.init_opt_state_from=True: the optimizer state of '
                                       r'.* does not match .*optimizer.name'):
    _state_of(config)
  config.train.init_from = ''
  with pytest.raises(ValueError, match=r'init_opt_state_from=True needs train.init_from'):
    _state_of(config)


def test_resuming_with_another_layer_layout_is_a_clear_error_that_keeps_the_config(
    data, scanned_phase1):
  # The refused run must leave the workdir as it was: the other tests still read it.
  workdir = scanned_phase1
  with open(os.path.join(workdir, 'config.json')) as f:
    written = f.read()
  with pytest.raises(ValueError, match=r'checkpoints/2 holds another state layout than this '
                                       r"run's config .*params.encoder.layer_0.* "
                                       r'Resume with .*model.scan_layers'):
    train.train_and_evaluate(config_with(overrides(data, steps=4, **{
        'model.scan_layers': False, 'data.eval_files': ''})), workdir)
  with open(os.path.join(workdir, 'config.json')) as f:
    assert f.read() == written  # the run's own config, not the refused one
  assert list(checkpointing.make_manager(workdir).all_steps()) == [2]


@pytest.mark.parametrize('name,phases', [('bert_tiny', ['phase1', 'phase2']),
                                         ('bert_mini', ['phase1', 'phase2']),
                                         ('bert_base', ['phase1', 'phase2']),
                                         ('bert_large', ['phase1', 'phase2', 'lamb_phase1',
                                                         'lamb_phase2'])])
def test_every_config_builds(name, phases):
  import importlib
  from bert_jax.training import optim
  module = importlib.import_module(f'configs.{name}')
  for phase in phases:
    config = module.get_config(phase)
    model_cfg = run_setup.model_config(config)
    optim.from_config(config.optimizer, config.train.num_steps)
    if 'phase2' in phase:
      assert config.data.max_seq_length == 512 and config.data.max_predictions_per_seq == 80
    else:
      assert config.data.max_seq_length == 128 and config.data.max_predictions_per_seq == 20
    assert model_cfg.hidden_size % model_cfg.num_heads == 0
  base = importlib.import_module('configs.bert_base').get_config('phase1')
  assert (base.train.global_batch_size, base.optimizer.learning_rate, base.train.num_steps,
          base.optimizer.warmup_steps, base.optimizer.weight_decay) == (256, 1e-4, 900_000, 10_000, 0.01)


def test_model_num_layers_changes_only_the_depth():
  """`model.num_layers` (0 = the size's) keeps the size's width: compile-time and ablation
  sweeps over depth; a config.json written before the field existed reads as the size's."""
  config = bert_tiny.get_config()
  assert run_setup.model_config(config).num_layers == 2
  config.model.num_layers = 5
  deep = run_setup.model_config(config)
  assert (deep.num_layers, deep.hidden_size, deep.num_heads) == (5, 128, 2)
  del config.model['num_layers']
  assert run_setup.model_config(upgrade.upgrade_config(config)).num_layers == 2



@pytest.mark.parametrize('objective', ['nsp', 'sop', 'none'])
def test_each_sentence_objective_from_the_flag_to_eval_metrics(data, tmp_path, objective):
  """--next_sentence -> records -> packed, dynamically masked training -> eval: the sentence
  head trains and reports under its objective's name, and not at all for none, whose export
  (NSP head untrained) is still a whole BertForPreTraining. sop's records come from the CLI
  and its --next_sentence flag; nsp's and none's from the function the CLI calls (`run` of
  the Job that `job_from_flags` builds), which spares two ~10 s processes."""
  out = tmp_path / 'data' / 'rows'
  if objective == 'sop':
    done = subprocess.run(
        [sys.executable, '-m', 'input_pipeline.pretrain.create_pretraining_data',
         f'--input_file={data / "train.txt"}', f'--output_file={out}',
         f'--vocab_file={data / "vocab.txt"}', '--max_seq_length=64',
         '--max_predictions_per_seq=10', '--dupe_factor=1', '--num_shards=2',
         '--window_chars=30000', f'--next_sentence={objective}'],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
  else:
    from input_pipeline.pretrain import create_pretraining_data as cpd
    from input_pipeline.pretrain.instances import MaskingConfig
    out.parent.mkdir()
    cpd.run(cpd.Job(output_file=str(out), masking=MaskingConfig(64, 10),
                    vocab_file=str(data / 'vocab.txt'), input_file=str(data / 'train.txt'),
                    dupe_factor=1, num_shards=2, window_chars=30_000,
                    sentence_objective=objective))
  stats = json.load(open(f'{out}.stats.json'))
  assert stats['sentence_objective'] == objective
  values = overrides(data, steps=3, **{
      'model.num_layers': 1,  # the heads are the claim, not the depth
      'data.train_files': f'{out}-00000-of-00002', 'data.eval_files': f'{out}-00001-of-00002',
      'data.sentence_objective': objective, 'data.dynamic_masking': True, 'data.pack': True,
      'data.pack_window': 64})
  wrong = {'nsp': 'none', 'sop': 'nsp', 'none': 'sop'}[objective]
  with pytest.raises(ValueError, match=f"hold {objective} records .* but "
                     f"data.sentence_objective='{wrong}'"):
    train.train_and_evaluate(config_with({**values, 'data.sentence_objective': wrong}),
                             str(tmp_path / 'wrong'))
  workdir = str(tmp_path / 'run')
  result = train.train_and_evaluate(config_with(values), workdir)
  head = {objective} - {'none'}
  for metrics in (result['train'], result['eval']):
    assert {k.split('_')[0] for k in metrics if k.endswith(('_loss', '_accuracy'))} == {
        'mlm', *head}
    assert all(math.isfinite(v) for v in metrics.values())
  logged = {k for line in open(os.path.join(workdir, 'metrics.jsonl')) for k in json.loads(line)}
  assert any(k.split('/')[-1].startswith(('nsp', 'sop')) for k in logged) == bool(head)
  if objective == 'none':
    assert result['train']['loss'] == result['train']['mlm_loss']
    assert result['eval']['loss'] == result['eval']['mlm_loss']
    import transformers
    from bert_jax.convert.run_export import export_workdir
    path = export_workdir(workdir, str(tmp_path / 'hf'))
    _, info = transformers.BertForPreTraining.from_pretrained(path, output_loading_info=True)
    assert not info['missing_keys'] and not info['unexpected_keys']


# ----------------------------------------------------------------------------- init_from checks


@pytest.fixture(scope='module')
def scanned_phase1(data, tmp_path_factory):
  """A real 2-step pre-training run with scanned layers (the default on TPU pods), no eval.
  Its tests only read it, or (the layer layout test) are refused before writing."""
  workdir = str(tmp_path_factory.mktemp('scanned') / 'p1')
  train.train_and_evaluate(config_with(overrides(data, steps=2, **{
      'model.scan_layers': True, 'data.eval_files': ''})), workdir)
  return workdir


def test_init_from_a_scanned_workdir_into_an_unrolled_run(data, scanned_phase1, tmp_path):
  """Phase 1 scanned, phase 2 with model.scan_layers=False (the GPU advice): each unrolled
  layer_i is slice i of the stacked layers, everything else equal; then it trains."""
  config = config_with(overrides(data, steps=2, **SHARED, **{  # the learning run's program
      'model.scan_layers': False, 'data.eval_files': '', 'train.init_from': scanned_phase1}))
  state = jax.device_get(train._initial_state(pretrain_step.setup(config)))
  step, saved = checkpointing.restore_params(scanned_phase1)
  assert step == 2 and int(state.step) == 0
  layers = saved['encoder']['layers']
  num_layers = jax.tree_util.tree_leaves(layers)[0].shape[0]
  assert set(state.params['encoder']) == {f'layer_{i}' for i in range(num_layers)}
  for i in range(num_layers):
    jax.tree_util.tree_map(lambda stacked, got, i=i: np.testing.assert_array_equal(
        got, stacked[i]), layers, state.params['encoder'][f'layer_{i}'])
  rest = lambda p: {k: v for k, v in p.items() if k != 'encoder'}
  jax.tree_util.tree_map(np.testing.assert_array_equal, rest(state.params), rest(saved))
  result = train.train_and_evaluate(config, str(tmp_path / 'p2'))
  assert result['step'] == 2 and math.isfinite(result['train']['loss'])


def test_init_from_another_model_size_is_a_clear_error_at_start(data, scanned_phase1, tmp_path):
  workdir = str(tmp_path / 'p2')
  config = config_with(overrides(data, steps=2, **{'model.size': 'mini',
                                                   'train.init_from': scanned_phase1}))
  with pytest.raises(ValueError, match=r'train.init_from=.*: hidden_size is 128, but the run\'s '
                                       r'model has 256 \(\d+ leaves differ, e\.g\. embeddings\.'
                                       r'\S+: start point \(128,\) vs run \(256,\).*'
                                       r'--config\.model\.size'):
    train.train_and_evaluate(config, workdir)
  assert not os.path.exists(os.path.join(workdir, 'metrics.jsonl'))  # no step ran
  assert not checkpointing.make_manager(workdir).all_steps()


def test_init_from_another_casing_or_vocabulary_is_a_clear_error(data, scanned_phase1, tmp_path):
  def initial_state(**values):
    return train._initial_state(pretrain_step.setup(config_with(overrides(data, steps=2, **{
        'train.init_from': scanned_phase1, **values}))))

  flag = r'--config\.train\.init_from_allow_vocab_change=True'
  with pytest.raises(ValueError, match=r'it is uncased \(do_lower_case=True\) but the run has '
                                       r'data\.do_lower_case=False; set --config\.data\.'
                                       rf'do_lower_case=True .*{flag}'):
    initial_state(**{'data.do_lower_case': False})
  tokens = (data / 'vocab.txt').read_text().split('\n')
  tokens[100], tokens[101] = tokens[101], tokens[100]  # same words, two ids swapped
  other = tmp_path / 'vocab.txt'
  other.write_text('\n'.join(tokens))
  with pytest.raises(ValueError, match=rf'its vocabulary {data}/vocab\.txt \(sha256 \w+\) is not '
                                       rf'the run\'s data\.vocab_file={other} .*{flag}'):
    initial_state(**{'data.vocab_file': str(other)})
  state = initial_state(**{'data.vocab_file': str(other),  # a deliberate change
                           'train.init_from_allow_vocab_change': True})
  assert int(state.step) == 0
