"""ELECTRA (`arch='electra'`) against transformers' classes (random weights, float32, embeddings
narrower than the layers, right-padded rows, real tokens compared), its HF exports, and a
discriminator or generator directory as a start point for fine-tuning and continued
pre-training."""

import json
import logging
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf, hf_electra, hf_heads, loaders, start_points
from bert_jax.convert import sentence_transformers_export as st
from bert_jax.model import encoder, heads
from bert_jax.model.encoder import BertConfig, BertForPreTraining
from bert_jax.training import run_setup
from configs import bert_tiny
from tests.hf_reference import random_params, randomize, state_dict
from tests.tolerance import assert_trees_close

LENGTH = 24
# ELECTRA-small's quirk at a tiny size: embeddings (32) narrower than the layers (64), so
# `embeddings_project` and a 32-wide generator head and tied decoder.
SMALL = dict(vocab_size=1000, embedding_size=32, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=128, max_position_embeddings=LENGTH,
             type_vocab_size=2, attn_implementation='eager')
RTOL = 1e-5  # of the largest reference value; the bar is 1e-4 in float32


def hf_model(cls=transformers.ElectraForMaskedLM, seed=0, **extra):
  torch.manual_seed(seed)
  return randomize(cls(transformers.ElectraConfig(**{**SMALL, **extra}))).eval()


def rows(vocab_size, batch=3, length=LENGTH, seed=0):
  """Ids, a mask (rows end in 0, 5, 10 pads) and two segments per row."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab_size, (batch, length))
  mask = np.ones((batch, length), np.int64)
  for b in range(batch):
    mask[b, length - 5 * b:] = 0
  segments = np.broadcast_to((np.arange(length) >= length // 3), (batch, length)).astype(np.int64)
  return np.where(mask == 1, ids, 0), mask, segments * mask


def torch_out(model, ids, mask, segments=None):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=None if segments is None else torch.tensor(segments),
                 output_hidden_states=True)


def our_config(model, scan=True) -> BertConfig:
  return hf.config_from_hf(model.config.to_dict()).replace(scan_layers=scan)


def real(x, mask):
  return np.asarray(x)[mask.astype(bool)]


def apply(cfg, params, ids, mask, segments=None):
  return jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask),
      None if segments is None else jnp.asarray(segments))


@pytest.mark.parametrize('embedding_size,scan', [(32, True), (32, False), (64, True)],
                         ids=['narrow-scan', 'narrow-unrolled', 'hidden-wide'])
def test_encoder_and_masked_lm_match_hf(embedding_size, scan):
  model = hf_model(embedding_size=embedding_size)
  cfg = our_config(model, scan)
  assert cfg.arch == 'electra' and cfg.embedding_width == embedding_size
  params = hf.params_from_hf(state_dict(model), cfg, source='hf')
  assert 'pooler' not in params and 'nsp' not in params
  # HF builds embeddings_project only when the widths differ; so do we.
  assert ('embeddings_project' in params['embeddings']) == (embedding_size != 64)
  ids, mask, segments = rows(cfg.vocab_size)
  ref = torch_out(model, ids, mask, segments)
  got = apply(cfg, params, ids, mask, segments)
  assert_trees_close(real(got.sequence_output, mask), real(ref.hidden_states[-1], mask), RTOL)
  assert_trees_close(real(got.mlm_logits, mask), real(ref.logits, mask), RTOL)
  assert got.pooled_output is None and got.nsp_logits is None
  assert got.mlm_hidden.shape[-1] == embedding_size


def test_other_archs_take_no_embedding_size():
  assert BertConfig.from_preset('tiny', arch='electra').embedding_width == 128
  assert hf.config_from_hf(transformers.ElectraConfig(**{**SMALL, 'embedding_size': 64})
                           .to_dict()).embedding_size == 0  # as wide as hidden: no projection
  with pytest.raises(ValueError, match='arch=electra'):
    BertConfig.from_preset('tiny', embedding_size=64)


HEAD_CASES = [
    (heads.SEQUENCE, transformers.ElectraForSequenceClassification, dict(num_labels=3)),
    (heads.TOKEN, transformers.ElectraForTokenClassification, dict(num_labels=5)),
    (heads.SPAN, transformers.ElectraForQuestionAnswering, {}),
    (heads.MULTIPLE_CHOICE, transformers.ElectraForMultipleChoice, {}),
]


@pytest.mark.parametrize('task,cls,head_kw', HEAD_CASES,
                         ids=['sequence', 'token', 'span', 'choice'])
def test_task_heads_match_hf_and_export_their_keys(task, cls, head_kw):
  model = hf_model(cls, **head_kw)
  cfg = our_config(model)
  head = heads.Head(task, **head_kw)
  params = hf_heads.finetuned_from_hf(state_dict(model), cfg, head, 'hf')
  ids, mask, segments = rows(cfg.vocab_size, batch=4)
  if task == heads.MULTIPLE_CHOICE:
    ids, mask, segments = (x.reshape(2, 2, LENGTH) for x in (ids, mask, segments))
  out = jax.jit(heads.build_model(cfg, head).apply)({'params': params}, jnp.asarray(ids),
                                                    jnp.asarray(mask), jnp.asarray(segments))
  ref = torch_out(model, ids, mask, segments)
  if task == heads.SPAN:
    got, want = (out.start_logits, out.end_logits), (ref.start_logits, ref.end_logits)
  else:
    got, want = out, ref.logits
  if task in (heads.TOKEN, heads.SPAN):
    got, want = (jax.tree_util.tree_map(lambda x: real(x, mask), t) for t in (got, want))
  assert_trees_close(got, jax.tree_util.tree_map(np.asarray, want), RTOL)
  back = hf_heads.finetuned_to_hf(params, cfg, head)
  assert set(back) == set(state_dict(model)) - {'electra.embeddings.position_ids'}


def small_cfg(**changes):
  return BertConfig(arch='electra', vocab_size=1000, embedding_size=32, hidden_size=64,
                    num_layers=2, num_heads=4, intermediate_size=128,
                    max_position_embeddings=LENGTH, **changes)


def test_export_loads_in_transformers_and_as_a_start_point(tmp_path):
  cfg = small_cfg(scan_layers=False)
  params = random_params(encoder.init_params, cfg)
  out = hf.save_pretrained(str(tmp_path / 'export'), cfg, params)
  config = json.loads((tmp_path / 'export' / 'config.json').read_text())
  assert (config['model_type'], config['architectures']) == ('electra', ['ElectraForMaskedLM'])
  model, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert type(model).__name__ == 'ElectraForMaskedLM'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  ids, mask, segments = rows(cfg.vocab_size)
  want = torch_out(model.eval(), ids, mask, segments).logits
  got = apply(cfg, params, ids, mask, segments)
  assert_trees_close(real(got.mlm_logits, mask), real(want, mask), RTOL)

  start = start_points.load_start_point(out, require_tokenizer=False, scan_layers=False)
  assert start.kind == loaders.HF_DIR and start.cfg == cfg and start.tokenizer is None
  assert_trees_close(start.params, params, 0.0)


def test_finetuned_export_loads_in_transformers_and_back_as_a_start_point(tmp_path):
  cfg = small_cfg()
  head = heads.Head(heads.SEQUENCE, num_labels=3, labels=('a', 'b', 'c'))
  params = random_params(heads.init_params, cfg, head, seed=1)
  assert set(params) == {'embeddings', 'encoder', 'classifier'}
  out = hf_heads.save_finetuned(str(tmp_path / 'cls'), cfg, head, params)
  model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, output_loading_info=True)
  assert type(model).__name__ == 'ElectraForSequenceClassification'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  ids, mask, segments = rows(cfg.vocab_size)
  want = torch_out(model.eval(), ids, mask, segments).logits
  got = jax.jit(heads.build_model(cfg, head).apply)({'params': params}, jnp.asarray(ids),
                                                    jnp.asarray(mask), jnp.asarray(segments))
  assert_trees_close(got, np.asarray(want), RTOL)

  start = start_points.load_start_point(out, require_tokenizer=False)
  assert start.head == head
  again_head, again = start_points.init_head_params(start)
  assert again_head == head
  assert_trees_close(again, params, 0.0)


@pytest.fixture(scope='module', params=['discriminator', 'generator'])
def electra_dir(request, tmp_path_factory):
  """An ElectraForPreTraining (discriminator) or ElectraForMaskedLM (generator) as transformers
  saves it, of a size the `tiny` preset with arch=electra and embedding_size=64 builds; no
  tokenizer."""
  cfg = BertConfig.from_preset('tiny', arch='electra', vocab_size=1000, embedding_size=64)
  fields = {k: v for k, v in hf_electra.config_to_hf(cfg).items()
            if k not in ('architectures', 'model_type')}
  cls = {'discriminator': transformers.ElectraForPreTraining,
         'generator': transformers.ElectraForMaskedLM}[request.param]
  torch.manual_seed(0)
  model = randomize(cls(transformers.ElectraConfig(**fields))).eval()
  path = tmp_path_factory.mktemp(request.param)
  model.save_pretrained(str(path))
  return str(path), cfg, model, request.param


def test_electra_directory_is_a_start_point_for_fine_tuning(electra_dir, caplog):
  path, cfg, model, kind = electra_dir
  with caplog.at_level(logging.WARNING):
    start = start_points.load_start_point(path, require_tokenizer=False)
  assert start.cfg == cfg and start.head is None
  if kind == 'discriminator':  # its replaced-token-detection head is not an MLM head
    assert 'discriminator_predictions.dense.weight' in caplog.text
    assert 'MLM head' in caplog.text and 'initialised fresh' in caplog.text
  else:
    assert 'initialised fresh' not in caplog.text
  ids, mask, segments = rows(cfg.vocab_size)
  want = torch_out(model, ids, mask, segments).hidden_states[-1]
  got = apply(cfg, start.params, ids, mask, segments)
  assert_trees_close(real(got.sequence_output, mask), real(want, mask), RTOL)
  head, params = start_points.init_head_params(start, heads.Head(heads.SEQUENCE, num_labels=2))
  assert set(params) == {'embeddings', 'encoder', 'classifier'}
  assert set(params['classifier']) == {'dense', 'out_proj'}
  _, choice = start_points.init_head_params(start, heads.Head(heads.MULTIPLE_CHOICE))
  assert set(choice) == {'embeddings', 'encoder', 'pooler', 'classifier'}


def test_electra_start_point_for_continued_pretraining(electra_dir):
  """As train.init_from: a run config with model.arch=electra builds the checkpoint's model;
  a generator's MLM head is its own, a discriminator's fresh; NSP/SOP are refused."""
  path, cfg, model, kind = electra_dir
  config = bert_tiny.get_config()
  config.model.update(arch='electra', vocab_size=1000, embedding_size=64, scan_layers=True)
  config.data.sentence_objective = 'none'
  run_cfg = run_setup.model_config(config)
  assert run_cfg == cfg.replace(attention_impl=run_cfg.attention_impl)
  step, params = start_points.pretraining_params(path, run_cfg, data=config.data)
  assert step == 0 and set(params) == {'embeddings', 'encoder', 'mlm_transform',
                                       'mlm_layer_norm', 'mlm_output_bias'}
  assert params['mlm_transform']['kernel'].shape == (128, 64)
  if kind == 'generator':
    ids, mask, segments = rows(cfg.vocab_size)
    want = torch_out(model, ids, mask, segments).logits
    got = apply(cfg, params, ids, mask, segments)
    assert_trees_close(real(got.mlm_logits, mask), real(want, mask), RTOL)

  for objective in ('nsp', 'sop'):
    config.data.sentence_objective = objective
    with pytest.raises(ValueError, match='sentence_objective=none'):
      start_points.pretraining_params(path, run_cfg, data=config.data)
  with pytest.raises(ValueError, match='model.arch=electra'):
    start_points.pretraining_params(path, BertConfig.from_preset('tiny', vocab_size=1000))


def test_non_electra_checkpoints_are_refused_clearly():
  fields = dict(transformers.ElectraConfig(**SMALL).to_dict())
  with pytest.raises(hf.CheckpointError, match='hidden_act'):
    hf.config_from_hf({**fields, 'hidden_act': 'relu'})
  with pytest.raises(hf.CheckpointError, match='is_decoder'):
    hf.config_from_hf({**fields, 'is_decoder': True})
  with pytest.raises(hf.CheckpointError, match='summary'):
    hf.config_from_hf({**fields, 'architectures': ['ElectraForMultipleChoice'],
                       'summary_type': 'last'})
  with pytest.raises(hf.CheckpointError, match='no transformers ELECTRA class'):
    hf_electra.config_to_hf(small_cfg(norm_position='pre'))


def test_sentence_transformers_export_is_an_electra_model(tmp_path):
  cfg = small_cfg()
  params = random_params(encoder.init_params, cfg)
  no_files = types.SimpleNamespace(save_pretrained=lambda directory: None)
  out = st.save_sentence_transformer(str(tmp_path / 'st'), cfg, params, no_files)
  model, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
  assert type(model).__name__ == 'ElectraModel'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  ids, mask, segments = rows(cfg.vocab_size)
  want = torch_out(model.eval(), ids, mask, segments).last_hidden_state
  got = apply(cfg, params, ids, mask, segments)
  assert_trees_close(real(got.sequence_output, mask), real(want, mask), RTOL)
