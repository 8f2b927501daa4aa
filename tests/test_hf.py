"""Parity with transformers' PyTorch BertForPreTraining, and the HF directory round trip."""

import json
import logging
import os

import jax
import numpy as np
import pytest
import torch
import transformers

import hf_reference
from bert_jax.convert import hf
from bert_jax.model import encoder
from bert_jax.model.encoder import BertConfig, BertForPreTraining


TOL = 1e-4
CONFIGS = {
    'tiny': BertConfig.from_preset('tiny'),
    'base_width_2_layers': BertConfig.from_preset('base', num_layers=2),
}


def forward(cfg, params, batch):
  out = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, batch['input_ids'], batch['input_mask'], batch['segment_ids'],
      masked_lm_positions=batch['masked_lm_positions'])
  return {k: np.asarray(getattr(out, k))
          for k in ('sequence_output', 'pooled_output', 'mlm_logits', 'nsp_logits')}


def max_diffs(a, b):
  return {k: float(np.max(np.abs(a[k] - b[k]))) for k in a}


@pytest.mark.parametrize('name', list(CONFIGS))
@pytest.mark.parametrize('scan', [True, False])
def test_forward_matches_hf_pytorch(name, scan):
  cfg = CONFIGS[name].replace(scan_layers=scan)
  model = hf_reference.torch_model(cfg)
  params = hf.params_from_hf(hf_reference.state_dict(model), cfg)
  batch = hf_reference.random_batch(cfg)
  diffs = max_diffs(forward(cfg, params, batch), hf_reference.torch_outputs(model, batch))
  print(name, 'scan' if scan else 'unrolled', diffs)
  assert max(diffs.values()) <= TOL, diffs


def test_params_round_trip_through_hf_state_dict_is_exact():
  cfg = CONFIGS['tiny']
  params = hf_reference.random_params(encoder.init_params, cfg, seed=3)
  back = hf.params_from_hf(hf.params_to_hf(params, cfg), cfg)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, back)


def test_save_load_round_trip_is_bit_identical(tmp_path):
  cfg = CONFIGS['tiny']
  params = hf_reference.random_params(encoder.init_params, cfg, seed=1)
  out = hf.save_pretrained(str(tmp_path / 'export'), cfg, params)
  cfg2, params2 = hf.load_pretrained(out)
  assert cfg2 == cfg
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, params2)


@pytest.mark.parametrize('name', list(CONFIGS))
def test_export_loads_in_transformers_and_predicts_the_same(tmp_path, name):
  cfg = CONFIGS[name]
  # Non-trivial LayerNorm and bias values (random_params'), so a mis-mapped tensor cannot hide.
  params = hf_reference.random_params(encoder.init_params, cfg, seed=2)
  path = hf.save_pretrained(str(tmp_path / 'export'), cfg, params)
  assert not os.path.exists(os.path.join(path, 'pytorch_model.bin'))

  model, info = transformers.BertForPreTraining.from_pretrained(path, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  assert not info['mismatched_keys'] and not info['error_msgs'], info
  model.eval()
  batch = hf_reference.random_batch(cfg)
  diffs = max_diffs(forward(cfg, params, batch), hf_reference.torch_outputs(model, batch))
  assert max(diffs.values()) <= TOL, diffs

  mlm, info = transformers.AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True)
  assert isinstance(mlm, transformers.BertForMaskedLM)
  assert not info['missing_keys'], info
  # The MaskedLM head has no pooler and no NSP head: those (and only those) go unused.
  assert all(k.startswith(('cls.seq_relationship', 'bert.pooler')) for k in info['unexpected_keys'])
  base, info = transformers.AutoModel.from_pretrained(path, output_loading_info=True)
  assert isinstance(base, transformers.BertModel)
  assert not info['missing_keys'], info
  assert all(k.startswith('cls.') for k in info['unexpected_keys']), info


def _write_torch_checkpoint(path, cfg, state, config_overrides=None, fmt='safetensors'):
  os.makedirs(path, exist_ok=True)
  hf_config = hf.config_to_hf(cfg)
  hf_config.update(config_overrides or {})
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf_config, f)
  if fmt == 'safetensors':
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()},
              os.path.join(path, 'model.safetensors'))
  else:
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in state.items()},
               os.path.join(path, 'pytorch_model.bin'))
  return str(path)


def test_load_pytorch_bin_with_legacy_names_and_no_prefix(tmp_path):
  cfg = CONFIGS['tiny']
  model = hf_reference.torch_model(cfg)
  state = hf_reference.state_dict(model)
  legacy = {}
  for k, v in state.items():
    k = k[len('bert.'):] if k.startswith('bert.') else k
    k = k.replace('LayerNorm.weight', 'LayerNorm.gamma').replace('LayerNorm.bias', 'LayerNorm.beta')
    legacy[k] = v
  path = _write_torch_checkpoint(tmp_path / 'legacy', cfg, legacy, fmt='bin')
  cfg2, params = hf.load_pretrained(path)
  batch = hf_reference.random_batch(cfg)
  diffs = max_diffs(forward(cfg2, params, batch), hf_reference.torch_outputs(model, batch))
  assert max(diffs.values()) <= TOL


def test_encoder_only_checkpoint_loads_with_fresh_heads_and_a_warning(tmp_path, caplog):
  cfg = CONFIGS['tiny']
  state = hf_reference.state_dict(hf_reference.torch_model(cfg))
  encoder_only = {k[len('bert.'):]: v for k, v in state.items()
                  if k.startswith('bert.') and not k.startswith('bert.pooler')}
  path = _write_torch_checkpoint(tmp_path / 'st', cfg, encoder_only)
  with caplog.at_level(logging.WARNING):
    _, params = hf.load_pretrained(path)
  assert 'cls.seq_relationship.weight' in caplog.text and 'pooler.dense.weight' in caplog.text
  np.testing.assert_array_equal(params['embeddings']['word_embeddings']['embedding'],
                                state['bert.embeddings.word_embeddings.weight'])
  assert params['nsp']['kernel'].shape == (cfg.hidden_size, 2)


def test_not_bert_names_the_architecture(tmp_path):
  cfg = CONFIGS['tiny']
  path = _write_torch_checkpoint(
      tmp_path / 'gpt2', cfg, {}, {'model_type': 'gpt2', 'architectures': ['GPT2LMHeadModel']})
  with pytest.raises(hf.CheckpointError, match='gpt2.*GPT2LMHeadModel.*not BERT'):
    hf.load_pretrained(path)


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
  cfg = CONFIGS['tiny']
  state = hf_reference.state_dict(hf_reference.torch_model(cfg))
  state['bert.encoder.layer.1.intermediate.dense.weight'] = np.zeros((7, 128), np.float32)
  path = _write_torch_checkpoint(tmp_path / 'bad', cfg, state)
  with pytest.raises(hf.CheckpointError,
                     match=r'encoder.layer.1.intermediate.dense.weight.*\(7, 128\).*\(512, 128\)'):
    hf.load_pretrained(path)


def test_missing_config_unreadable_weights_and_missing_dir(tmp_path):
  with pytest.raises(hf.CheckpointError, match='no such directory'):
    hf.load_pretrained(str(tmp_path / 'nope'))
  (tmp_path / 'empty').mkdir()
  with pytest.raises(hf.CheckpointError, match='no config.json'):
    hf.load_pretrained(str(tmp_path / 'empty'))
  cfg = CONFIGS['tiny']
  path = _write_torch_checkpoint(tmp_path / 'corrupt', cfg, {'x': np.zeros(3, np.float32)})
  with open(os.path.join(path, 'model.safetensors'), 'wb') as f:
    f.write(b'\x00garbage' * 10)
  with pytest.raises(hf.CheckpointError, match='model.safetensors: not a readable safetensors'):
    hf.load_pretrained(path)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    f.write('{not json')
  with pytest.raises(hf.CheckpointError, match='config.json: unreadable JSON'):
    hf.load_pretrained(path)


def test_missing_encoder_tensor_is_an_error(tmp_path):
  cfg = CONFIGS['tiny']
  state = hf_reference.state_dict(hf_reference.torch_model(cfg))
  del state['bert.encoder.layer.0.attention.self.key.weight']
  path = _write_torch_checkpoint(tmp_path / 'partial', cfg, state)
  with pytest.raises(hf.CheckpointError, match='encoder tensors are missing.*layer.0.attention'):
    hf.load_pretrained(path)


def test_save_never_leaves_a_half_written_directory(tmp_path):
  cfg = CONFIGS['tiny']
  params = hf_reference.random_params(encoder.init_params, cfg)

  class BrokenTokenizer:  # a disk that fills up while the tokenizer is written
    pad_id, cls_id, sep_id = 0, 2, 3

    def save_pretrained(self, path):
      raise OSError('disk full')

  with pytest.raises(OSError, match='disk full'):
    hf.save_pretrained(str(tmp_path / 'out'), cfg, params, tokenizer=BrokenTokenizer())
  assert os.listdir(tmp_path) == []
  hf.save_pretrained(str(tmp_path / 'out'), cfg, params)
  with pytest.raises(FileExistsError, match='overwrite=True'):
    hf.save_pretrained(str(tmp_path / 'out'), cfg, params)
  with pytest.raises(OSError, match='disk full'):
    hf.save_pretrained(str(tmp_path / 'out'), cfg, params, tokenizer=BrokenTokenizer(),
                       overwrite=True)
  _, again = hf.load_pretrained(str(tmp_path / 'out'))  # the earlier export is intact
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, again)
