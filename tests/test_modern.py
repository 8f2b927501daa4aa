"""The ModernBERT-class encoder (`arch='modern'`) against transformers' ModernBert* classes
(random weights, float32), its sliding window at the edge, packed rows, and its HF export."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf, hf_heads, hf_modern, loaders
from bert_jax.model import attention, encoder, heads
from bert_jax.model.encoder import BertConfig, BertForPreTraining
from tests.hf_reference import random_params, randomize, state_dict
from tests.tolerance import assert_trees_close


# Four layers: global, local, local, global; a window of 16 (8 each side), so rows of 40
# use the dense band and rows of 100 the chunked core.
HF_CONFIG = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                 num_attention_heads=4, local_attention=16, global_rope_theta=1000.0,
                 local_rope_theta=100.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                 cls_token_id=1, sep_token_id=2, attn_implementation='eager')
RTOL = 1e-5  # of the largest reference logit; the bar is 1e-4 in float32


def hf_model(cls=transformers.ModernBertForMaskedLM, seed=0, **extra):
  torch.manual_seed(seed)
  model = cls(transformers.ModernBertConfig(**HF_CONFIG, **extra))
  return randomize(model).eval()


def our_config(model, scan=True) -> BertConfig:
  return hf_modern.config_from_hf(model.config.to_dict()).replace(scan_layers=scan)


def rows(batch=2, length=100, seed=0):
  """Ids and a mask whose second row ends in padding."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, HF_CONFIG['vocab_size'], (batch, length))
  mask = np.ones((batch, length), np.int64)
  mask[1:, length - length // 3:] = 0
  return ids, mask


def torch_logits(model, ids, mask, **kw):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), **kw)


def test_config_round_trips_through_hf():
  model = hf_model()
  cfg = our_config(model)
  assert (cfg.global_attention_every, cfg.local_window, cfg.half_window) == (3, 16, 8)
  assert (cfg.global_rope_theta, cfg.local_rope_theta) == (1000.0, 100.0)
  assert cfg.mlp == 'glu' and cfg.positions == 'rope' and not cfg.use_bias
  again = hf_modern.config_from_hf(hf_modern.config_to_hf(cfg))
  assert again == cfg.replace(scan_layers=True)
  assert BertConfig.from_preset('modernbert-base', arch='modern').intermediate_size == 1152


@pytest.mark.parametrize('length', [40, 100])
@pytest.mark.parametrize('scan', [True, False])
def test_masked_lm_matches_hf(scan, length):
  model = hf_model()
  cfg = our_config(model, scan)
  params = hf_modern.params_from_hf(state_dict(model), cfg, 'hf')
  ids, mask = rows(length=length)
  want = torch_logits(model, ids, mask).logits.numpy()
  got = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask))
  real = mask.astype(bool)
  assert_trees_close(np.asarray(got.mlm_logits)[real], want[real], RTOL)
  assert got.nsp_logits is None and got.pooled_output is None


def test_packed_row_equals_its_instances_alone():
  """Two instances in one row (segment ids, positions restarting) get the logits each gets
  alone, in global and local layers, the second one crossing chunk edges."""
  model = hf_model()
  cfg = our_config(model)
  params = hf_modern.params_from_hf(state_dict(model), cfg, 'hf')
  rng = np.random.default_rng(1)
  a, b = rng.integers(3, 300, 45), rng.integers(3, 300, 50)
  length = 100
  ids = np.zeros((1, length), np.int32)
  ids[0, :45], ids[0, 45:95] = a, b
  seg = np.zeros((1, length), np.int32)
  seg[0, :45], seg[0, 45:95] = 1, 2
  pos = np.zeros((1, length), np.int32)
  pos[0, :45], pos[0, 45:95] = np.arange(45), np.arange(50)
  packed = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray((seg > 0).astype(np.int32)),
      position_ids=jnp.asarray(pos), packed_segment_ids=jnp.asarray(seg)).mlm_logits
  for tokens, span in ((a, slice(0, 45)), (b, slice(45, 95))):
    alone = torch_logits(model, tokens[None], np.ones((1, len(tokens)), np.int64)).logits
    assert_trees_close(np.asarray(packed)[0, span], alone.numpy()[0], RTOL)


@pytest.mark.parametrize('chunked', [True, False])
def test_sliding_window_reaches_exactly_half_the_window(chunked):
  """A key at distance window//2 changes the query's output, one at window//2 + 1 does not,
  on both sides, at the chunk edges (queries 0, 7, 8, 63) and across them."""
  half, length = 8, 64
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(1, length, 2, 4)), jnp.float32) for _ in range(3))
  groups = jnp.ones((1, length), jnp.int32)
  mask = jnp.ones((1, 1, 1, length), bool)

  def run(v):
    if chunked:
      return attention._chunked_local_attention(q, k, v, groups, half, False, 0.0, None)
    return attention.global_attention(q, k, v, mask & attention.band(length, half))

  base = np.asarray(run(v))
  for query in (0, 7, 8, 20, 63):
    for key in (query - half - 1, query - half, query + half, query + half + 1):
      if not 0 <= key < length:
        continue
      moved = np.asarray(run(v.at[0, key].add(1.0)))[0, query]
      changed = not np.allclose(moved, base[0, query])
      assert changed == (abs(key - query) <= half), (query, key)


def test_chunked_and_dense_local_cores_agree_with_padding_and_packing():
  half, length = 8, 72  # not a multiple of the chunk: padded inside
  rng = np.random.default_rng(2)
  q, k, v = (jnp.asarray(rng.normal(size=(2, length, 2, 4)), jnp.float32) for _ in range(3))
  seg = np.ones((2, length), np.int32)
  seg[0, 30:] = 2
  seg[1, 60:] = 0
  seg = jnp.asarray(seg)
  mask = attention.attention_mask(None, seg, 2, length)
  dense = attention.global_attention(q, k, v, mask & attention.band(length, half))
  chunked = attention._chunked_local_attention(q, k, v, seg, half, True, 0.0, None)
  real = np.asarray(seg) > 0
  np.testing.assert_allclose(np.asarray(chunked)[real], np.asarray(dense)[real], atol=1e-6)


HEAD_CASES = [
    (heads.SEQUENCE, transformers.ModernBertForSequenceClassification, dict(num_labels=3), {}),
    (heads.SEQUENCE, transformers.ModernBertForSequenceClassification, dict(num_labels=3),
     dict(classifier_pooling='mean')),
    (heads.TOKEN, transformers.ModernBertForTokenClassification, dict(num_labels=5), {}),
    (heads.SPAN, transformers.ModernBertForQuestionAnswering, {}, {}),
    (heads.MULTIPLE_CHOICE, transformers.ModernBertForMultipleChoice, {}, {}),
]


@pytest.mark.parametrize('task,cls,head_kw,extra', HEAD_CASES,
                         ids=['sequence', 'sequence_mean', 'token', 'span', 'choice'])
def test_task_heads_match_hf(task, cls, head_kw, extra):
  model = hf_model(cls, **head_kw, **extra)
  cfg = our_config(model)
  head = heads.Head(task, **head_kw)
  params = hf_heads.finetuned_from_hf(state_dict(model), cfg, head, 'hf')
  ids, mask = rows(batch=4, length=40)
  if task == heads.MULTIPLE_CHOICE:
    ids, mask = ids.reshape(2, 2, 40), mask.reshape(2, 2, 40)
  out = jax.jit(heads.build_model(cfg, head).apply)({'params': params}, jnp.asarray(ids),
                                                    jnp.asarray(mask))
  ref = torch_logits(model, ids, mask)
  if task == heads.SPAN:
    got, want = (out.start_logits, out.end_logits), (ref.start_logits.numpy(),
                                                      ref.end_logits.numpy())
  else:
    got, want = out, ref.logits.numpy()
  if task in (heads.TOKEN, heads.SPAN):  # compare real tokens only
    real = mask.astype(bool)
    got = jax.tree_util.tree_map(lambda x: np.asarray(x)[real], got)
    want = jax.tree_util.tree_map(lambda x: np.asarray(x)[real], want)
  assert_trees_close(got, want, RTOL)
  back = hf_heads.finetuned_to_hf(params, cfg, head)
  assert set(back) == {k for k in state_dict(model) if k != 'decoder.weight'}


def test_export_loads_in_transformers_with_no_missing_keys_and_imports_back(tmp_path):
  cfg = BertConfig.from_preset('tiny', arch='modern', vocab_size=300, num_layers=4,
                               local_window=16, scan_layers=False)
  params = random_params(encoder.init_params, cfg)
  out = hf.save_pretrained(str(tmp_path / 'export'), cfg, params)
  config = json.loads((tmp_path / 'export' / 'config.json').read_text())
  assert config['architectures'] == ['ModernBertForMaskedLM']
  model, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert type(model).__name__ == 'ModernBertForMaskedLM'
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  ids, mask = rows(length=100)
  want = torch_logits(model.eval(), ids, mask).logits.numpy()
  got = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask))
  real = mask.astype(bool)
  assert_trees_close(np.asarray(got.mlm_logits)[real], want[real], RTOL)

  start = loaders.LOADERS[loaders.HF_DIR](out, None, True, None, False)
  assert start.cfg == cfg.replace(scan_layers=True)
  relaid = loaders.relayout(params, False, cfg.num_layers, True)
  layer0_norm = relaid['encoder']['layers']['attention_layer_norm']['scale'][0]
  relaid['encoder']['layers']['attention_layer_norm']['scale'][0] = np.ones_like(layer0_norm)
  assert_trees_close(start.params, relaid, 0.0)


def test_bert_switches_are_not_exportable_as_modernbert():
  cfg = BertConfig.from_preset('tiny', positions='rope')
  with pytest.raises(hf.CheckpointError, match='no transformers class'):
    hf_modern.config_to_hf(cfg)


@pytest.mark.parametrize('packed', [False, True])
def test_blocked_global_attention_equals_dense_with_gradients(packed, monkeypatch):
  monkeypatch.setattr(attention, 'BLOCKED_FROM', 64)
  monkeypatch.setattr(attention, 'QUERY_BLOCK', 16)
  length = 64
  rng = np.random.default_rng(3)
  q, k, v = (jnp.asarray(rng.normal(size=(2, length, 2, 4)), jnp.float32) for _ in range(3))
  groups = np.ones((2, length), np.int32)
  groups[0, 20:] = 2 if packed else 1
  groups[1, 50:] = 0
  groups = jnp.asarray(groups)
  mask = attention.attention_mask(None if packed else groups, groups if packed else None,
                                  2, length)
  real = (np.asarray(groups) > 0)[:, :, None, None]

  def loss(fn, q, k, v):
    return jnp.sum(jnp.where(real, fn(q, k, v), 0.0) ** 2)

  blocked = lambda q, k, v: attention.global_attention(q, k, v, mask, groups=groups,
                                                       packed=packed)
  dense = lambda q, k, v: attention._dense_attention(q, k, v, mask, 0.0, None, None)
  got = jax.value_and_grad(lambda *a: loss(blocked, *a), argnums=(0, 1, 2))(q, k, v)
  want = jax.value_and_grad(lambda *a: loss(dense, *a), argnums=(0, 1, 2))(q, k, v)
  assert_trees_close(got, want, 1e-6)


def test_masked_lm_matches_hf_through_the_blocked_global_core(monkeypatch):
  monkeypatch.setattr(attention, 'BLOCKED_FROM', 64)
  monkeypatch.setattr(attention, 'QUERY_BLOCK', 32)
  model = hf_model()
  cfg = our_config(model)
  params = hf_modern.params_from_hf(state_dict(model), cfg, 'hf')
  ids, mask = rows(length=128)
  want = torch_logits(model, ids, mask).logits.numpy()
  got = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask))
  real = mask.astype(bool)
  assert_trees_close(np.asarray(got.mlm_logits)[real], want[real], RTOL)


def _temp_bytes(fn, length):
  x = jax.ShapeDtypeStruct((1, length, 2, 8), jnp.float32)
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2)))
  return grad.lower(x, x, x).compile().memory_analysis().temp_size_in_bytes


def test_local_and_long_global_attention_memory_grows_linearly_with_the_row():
  """Doubling the row doubles the local core's (and the blocked global core's) training
  memory; the dense global core's quadruples."""
  def local(q, k, v):
    groups = jnp.ones(q.shape[:2], jnp.int32)
    return attention.local_attention(q, k, v, jnp.ones((1, 1, 1, q.shape[1]), bool), groups,
                                     half_window=64, packed=False)

  def blocked(q, k, v):
    groups = jnp.ones(q.shape[:2], jnp.int32)
    return attention.global_attention(q, k, v, None, groups=groups)

  def dense(q, k, v):
    return attention._dense_attention(q, k, v, jnp.ones((1, 1, 1, q.shape[1]), bool), 0.0,
                                      None, None)

  growth = {name: _temp_bytes(fn, 8192) / _temp_bytes(fn, 4096)
            for name, fn in (('local', local), ('blocked', blocked), ('dense', dense))}
  assert growth['local'] < 2.5 and growth['blocked'] < 2.5, growth
  assert growth['dense'] > 3.5, growth
