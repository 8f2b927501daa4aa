"""A ModernBERT-class model through the whole system: full-sentence records masked at 30% ->
phase-1 pre-training with configs/modern.py -> export that transformers loads -> phase 2 at
longer rows from phase 1 with a new global RoPE theta -> the fine-tuning command -> a
ModernBertFor<Task> export."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf_modern, start_points
from bert_jax.convert.run_export import export_workdir
from bert_jax.finetune import run as finetune
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig, BertForPreTraining
from bert_jax.pretrain import run as train, step as pretrain_step
from bert_jax.training import checkpointing, run_setup
from configs import common, modern
from input_pipeline.pretrain import create_pretraining_data as cpd
from input_pipeline.pretrain.instances import MaskingConfig
from input_pipeline.tokenizer import WordPieceTokenizer
from tests import test_finetune
from tests.tolerance import assert_trees_close
from cpu_env import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Phase 2's rows here: longer than phase 1's and than a local window (32), as 8,192 are on a
# pod; longer rows cost a 2-core CPU minutes and prove nothing more here.
LONG = 512


@pytest.fixture(scope='module')
def records(data, tmp_path_factory):
  """RoBERTa full-sentence rows of 128 and LONG tokens, 30% masked."""
  d = tmp_path_factory.mktemp('modern_records')
  out = {}
  for length in (128, LONG):
    masking = MaskingConfig(max_seq_length=length,
                            max_predictions_per_seq=modern.max_predictions(length),
                            masked_lm_prob=modern.MASKED_LM_PROB)
    for split in ('train', 'eval'):
      path = str(d / f'{split}{length}')
      cpd.run(cpd.Job(output_file=path, masking=masking, vocab_file=str(data / 'vocab.txt'),
                      input_file=str(data / f'{split}.txt'), dupe_factor=1, num_shards=1,
                      window_chars=400_000, sentence_objective='none'))
      out[split, length] = path
  return out


def config(data, records, phase, length, **extra):
  values = {
      'model.vocab_size': 2000, 'model.num_layers': 3, 'model.local_window': 32,
      'data.train_files': records['train', length], 'data.eval_files': records['eval', length],
      'data.vocab_file': str(data / 'vocab.txt'), 'data.max_seq_length': length,
      'data.max_predictions_per_seq': modern.max_predictions(length),
      'data.shuffle_buffer': 100, 'train.num_steps': 6, 'train.global_batch_size': 8,
      'train.log_every': 1, 'train.eval_every': 6, 'train.eval_steps': 2,
      'train.checkpoint_every': 3}
  values.update(extra)
  return common.override(modern.get_config(f'tiny,{phase}'), values)


def hf_logits(path, ids, mask):
  model, info = transformers.AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True)
  assert type(model).__name__ == 'ModernBertForMaskedLM'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  with torch.no_grad():
    return model.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def ours(config, params, ids, mask):
  """MLM logits of `config`'s model, jitted (one compile, not one per operation)."""
  model = BertForPreTraining(run_setup.model_config(config))
  logits = jax.jit(lambda p, i, m: model.apply({'params': p}, i, m).mlm_logits)
  return np.asarray(logits(params, jnp.asarray(ids), jnp.asarray(mask)))


def test_modern_pretrains_exports_extends_context_and_fine_tunes(data, records, tmp_path):
  phase1 = str(tmp_path / 'phase1')
  # Batch-size warmup off: one program, the one the next test compiles too
  # (tests/test_batch_warmup.py proves the schedule and its resume bit for bit).
  c1 = config(data, records, 'phase1', 128, **{'train.batch_warmup_steps': 0})
  assert run_setup.model_config(c1).arch == 'modern'
  result = train.train_and_evaluate(c1, phase1)
  assert {k for k in result['eval'] if k.endswith('_loss')} == {'mlm_loss'}
  assert all(math.isfinite(v) for v in result['eval'].values())
  assert result['train']['loss'] == result['train']['mlm_loss']

  rng = np.random.default_rng(0)
  ids = rng.integers(5, 2000, (2, 200))
  mask = np.ones_like(ids)
  mask[1, 150:] = 0
  real = mask.astype(bool)
  _, params1 = checkpointing.restore_params(phase1)
  path1 = export_workdir(phase1, str(tmp_path / 'hf1'))
  hf1 = json.load(open(os.path.join(path1, 'config.json')))
  assert hf1['rope_parameters']['full_attention']['rope_theta'] == 10_000.0
  assert_trees_close(ours(c1, params1, ids, mask)[real], hf_logits(path1, ids, mask)[real], 1e-5)

  # Phase 2: LONG-token rows, global theta 160k, from phase 1's params; the new theta changes
  # what the same params compute, and the export carries it.
  c2 = config(data, records, 'phase2', LONG, **{'train.init_from': phase1})
  assert run_setup.model_config(c2).global_rope_theta == 160_000.0
  state = train._initial_state(pretrain_step.setup(c2))
  assert_trees_close(jax.device_get(state.params), params1, 0.0)
  assert int(state.step) == 0
  moved = ours(c2, params1, ids, mask)[real] - ours(c1, params1, ids, mask)[real]
  assert np.max(np.abs(moved)) > 1e-5  # float32 round-off is below 1e-6 here
  # ... trained as a user runs it: the phase's one command, on one CPU device, 2 rows a step.
  phase2 = str(tmp_path / 'phase2')
  flags = {'train.init_from': phase1, 'train.num_steps': 2, 'train.eval_every': 2,
           'train.log_every': 1,
           'train.eval_steps': 1, 'model.vocab_size': 2000, 'model.num_layers': 3,
           'model.local_window': 32, 'data.train_files': records['train', LONG],
           'data.eval_files': records['eval', LONG], 'data.vocab_file': data / 'vocab.txt',
           'data.max_seq_length': LONG,
           'data.max_predictions_per_seq': modern.max_predictions(LONG)}
  done = subprocess.run(
      [sys.executable, '-m', 'bert_jax.main', '--config=configs/modern.py:tiny,phase2',
       f'--workdir={phase2}'] + [f'--config.{k}={v}' for k, v in flags.items()],
      cwd=ROOT, env=cpu_env(), capture_output=True,
      text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  logged = [json.loads(line) for line in open(os.path.join(phase2, 'metrics.jsonl'))]
  assert [r['step'] for r in logged if 'train/loss' in r] == [1, 2]
  assert all(r['train/tokens_per_second'] / r['train/steps_per_second'] == 2 * LONG
             for r in logged if 'train/tokens_per_second' in r)
  assert math.isfinite(next(r['eval/mlm_loss'] for r in logged if 'eval/mlm_loss' in r))
  path2 = export_workdir(phase2, str(tmp_path / 'hf2'))
  hf2 = json.load(open(os.path.join(path2, 'config.json')))
  assert hf2['rope_parameters']['full_attention']['rope_theta'] == 160_000.0
  assert hf2['rope_parameters']['sliding_attention']['rope_theta'] == 10_000.0
  _, params2 = checkpointing.restore_params(phase2)
  assert_trees_close(ours(c2, params2, ids, mask)[real], hf_logits(path2, ids, mask)[real], 1e-5)

  # The fine-tuning command, unchanged, from the phase-2 workdir.
  files = test_finetune.classification_files(tmp_path)
  tuned = str(tmp_path / 'tuned')
  finetune.run(test_finetune.generic_config(files, phase2), tuned)
  saved = json.load(open(os.path.join(tuned, 'results.json')))
  assert saved['splits']['dev']['summary']['accuracy']['median'] >= 0.9  # learnt the task
  export = saved['runs'][0]['export']
  model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      export, output_loading_info=True)
  assert type(model).__name__ == 'ModernBertForSequenceClassification'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  start = start_points.load_start_point(export)
  head, head_params = start_points.init_head_params(start)
  with torch.no_grad():
    theirs = model.eval()(input_ids=torch.tensor(ids[:, :32]),
                          attention_mask=torch.tensor(mask[:, :32])).logits.numpy()
  mine = jax.jit(heads.build_model(start.cfg, head).apply)(
      {'params': head_params}, jnp.asarray(ids[:, :32]), jnp.asarray(mask[:, :32]))
  assert_trees_close(np.asarray(mine), theirs, 1e-5)


def test_an_hf_modernbert_directory_starts_pre_training(data, records, tmp_path):
  """transformers' own ModernBertForMaskedLM directory (+ the tokenizer's files) as
  train.init_from (continued pre-training). As the fine-tuning command's --init:
  tests/test_hf_tokenizers.py (a ModernBERT directory with a tokenizer.json)."""
  torch.manual_seed(0)
  cfg = BertConfig.from_preset('tiny', arch='modern', vocab_size=2000, num_layers=3,
                               local_window=32)
  hf_config = {k: v for k, v in hf_modern.config_to_hf(cfg).items()
               if k not in ('architectures', 'model_type')}
  model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**hf_config))
  start = str(tmp_path / 'hf')
  model.save_pretrained(start)
  WordPieceTokenizer(str(data / 'vocab.txt'), do_lower_case=True).save_pretrained(start)

  c = config(data, records, 'phase1', 128, **{'train.init_from': start,
                                               'train.batch_warmup_steps': 0})
  state = train._initial_state(pretrain_step.setup(c))
  want = hf_modern.params_from_hf(
      {k: v.detach().numpy() for k, v in model.state_dict().items()}, cfg, 'hf')
  assert_trees_close(jax.device_get(state.params), want, 0.0)
  result = train.train_and_evaluate(c, str(tmp_path / 'continued'))
  assert math.isfinite(result['eval']['mlm_loss'])


@pytest.mark.parametrize('size', ['tiny', 'mini', 'base', 'large'])
def test_every_modern_config_builds_with_the_papers_shapes(size):
  from bert_jax.training import batch_schedule, optim
  for phase, length, theta in (('phase1', 1024, 10_000.0), ('phase2', 8192, 160_000.0)):
    config = modern.get_config(f'{size},{phase}')
    cfg = run_setup.model_config(config)
    assert cfg.arch == 'modern' and cfg.global_attention_every == 3 and cfg.local_window == 128
    assert (cfg.global_rope_theta, cfg.local_rope_theta) == (theta, 10_000.0)
    assert config.data.max_seq_length == length
    assert config.data.max_predictions_per_seq == math.ceil(0.3 * length)
    assert config.data.sentence_objective == 'none' and config.data.masked_lm_prob == 0.3
    optim.from_config(config.optimizer, config.train.num_steps)
    batch_schedule.from_config(config.train, 1)
    # the same tokens a batch in both phases
    assert config.train.global_batch_size * length == modern.SIZES[size][1] * 1024
  if size == 'base':
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (22, 768, 1152)
  with pytest.raises(ValueError, match='SIZE,PHASE'):
    modern.get_config(f'{size},phase3')
