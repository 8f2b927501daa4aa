"""Model behaviour that needs no reference: packing, padding, dtypes, sizes, dropout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf
from bert_jax.model import attention, flops
from bert_jax.model.encoder import BertConfig, BertForPreTraining, count_params, init_params
from bert_jax.model.encoder import PRESETS
from tolerance import assert_trees_close

TINY = BertConfig.from_preset('tiny')


@pytest.fixture(scope='module')
def tiny_params():
  """BERT-tiny's float32 params, made once for the module and by one jitted init (an eager
  Flax init dispatches and compiles op by op: 3x the time); the same values either way."""
  return jax.jit(init_params, static_argnums=0)(TINY, jax.random.key(0))


def apply(cfg, params, **features):
  # jit: op-by-op dispatch of an un-jitted Flax apply is several times slower on CPU.
  return jax.jit(lambda p, f: BertForPreTraining(cfg).apply({'params': p}, **f))(params, features)


@pytest.mark.parametrize('size', list(PRESETS))
def test_parameter_count_equals_hf(size):
  cfg = BertConfig.from_preset(size)
  ours = count_params(jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))
  hf_cfg = transformers.BertConfig(**{k: v for k, v in hf.config_to_hf(cfg).items()
                                      if k not in ('architectures', 'model_type')})
  with torch.device('meta'):
    theirs = transformers.BertForPreTraining(hf_cfg).num_parameters()
  assert ours == theirs
  if size == 'base':
    assert ours == 110_106_428
  if size == 'tiny':
    assert ours == 4_433_468


def _solo(rng, length, real):
  ids = np.zeros(length, np.int32)
  ids[:real] = rng.integers(5, TINY.vocab_size, real)
  seg = np.zeros(length, np.int32)
  seg[real // 2:real] = 1
  mask = (np.arange(length) < real).astype(np.int32)
  return ids, seg, mask


def test_packed_row_gives_each_instance_its_solo_outputs(tiny_params):
  params = tiny_params
  rng = np.random.default_rng(0)
  length, lens, predictions = 32, (12, 9, 7), (np.array([1, 4, 10]), np.array([2, 3, 8]),
                                               np.array([1, 5, 6]))
  solos = [_solo(rng, length, n) for n in lens]
  solo_out = [apply(TINY, params, input_ids=ids[None], input_mask=mask[None],
                    segment_ids=seg[None], masked_lm_positions=pos[None])
              for (ids, seg, mask), pos in zip(solos, predictions)]

  ids, seg, pos_ids, packed_seg = (np.zeros(length, np.int32) for _ in range(4))
  starts = np.cumsum((0,) + lens[:-1])
  for k, ((s_ids, s_seg, _), n, start) in enumerate(zip(solos, lens, starts)):
    ids[start:start + n], seg[start:start + n] = s_ids[:n], s_seg[:n]
    pos_ids[start:start + n], packed_seg[start:start + n] = np.arange(n), k + 1
  mlm_positions = np.concatenate([p + s for p, s in zip(predictions, starts)])
  packed = apply(TINY, params, input_ids=ids[None], segment_ids=seg[None],
                 position_ids=pos_ids[None], packed_segment_ids=packed_seg[None],
                 masked_lm_positions=mlm_positions[None], next_sentence_positions=starts[None])

  for k, (out, n, start) in enumerate(zip(solo_out, lens, starts)):
    np.testing.assert_allclose(packed.sequence_output[0, start:start + n],
                               out.sequence_output[0, :n], atol=1e-5)
    np.testing.assert_allclose(packed.mlm_logits[0, 3 * k:3 * k + 3], out.mlm_logits[0], atol=1e-5)
    np.testing.assert_allclose(packed.nsp_logits[0, k], out.nsp_logits[0], atol=1e-5)
    np.testing.assert_allclose(packed.pooled_output[0, k], out.pooled_output[0], atol=1e-5)


def test_padding_never_changes_real_token_outputs(tiny_params):
  params = tiny_params
  ids, seg, _ = _solo(np.random.default_rng(1), 16, 16)
  short = apply(TINY, params, input_ids=ids[None], segment_ids=seg[None],
                masked_lm_positions=np.array([[3, 7]]))
  padded_ids = np.concatenate([ids, np.zeros(48, np.int32)])
  padded_ids[20:] = 77  # whatever sits under the mask must not matter
  long = apply(TINY, params, input_ids=padded_ids[None],
               input_mask=(np.arange(64) < 16).astype(np.int32)[None],
               segment_ids=np.concatenate([seg, np.ones(48, np.int32)])[None],
               masked_lm_positions=np.array([[3, 7]]))
  np.testing.assert_allclose(long.sequence_output[0, :16], short.sequence_output[0], atol=1e-5)
  np.testing.assert_allclose(long.mlm_logits, short.mlm_logits, atol=1e-5)
  np.testing.assert_allclose(long.nsp_logits, short.nsp_logits, atol=1e-5)


def test_bfloat16_forward_is_close_to_float32(tiny_params):
  """bf16 compute with float32 params: MLM logits within 0.05 of float32 (logit std ~1)."""
  params = tiny_params
  ids, seg, mask = _solo(np.random.default_rng(2), 32, 28)
  feats = dict(input_ids=ids[None], input_mask=mask[None], segment_ids=seg[None],
               masked_lm_positions=np.array([[1, 5, 9, 20]]))
  f32 = apply(TINY, params, **feats)
  bf16 = apply(TINY.replace(dtype='bfloat16'), params, **feats)
  assert bf16.sequence_output.dtype == jnp.bfloat16
  assert bf16.mlm_logits.dtype == jnp.float32 and bf16.nsp_logits.dtype == jnp.float32
  err = float(jnp.max(jnp.abs(bf16.mlm_logits - f32.mlm_logits)))
  scale = float(jnp.std(f32.mlm_logits))
  assert err < 0.05 * max(scale, 1.0), (err, scale)
  assert float(jnp.max(jnp.abs(bf16.nsp_logits - f32.nsp_logits))) < 0.05


def _scatter_adds(jaxpr) -> list:
  """Every scatter-add in `jaxpr` and its sub-jaxprs (jit, scan, remat), as output avals."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'scatter-add':
      found += [v.aval for v in eqn.outvars]
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (tuple, list)) else [value]):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          found += _scatter_adds(inner)
  return found


def test_bfloat16_embedding_gradients_never_scatter_in_bfloat16(tiny_params):
  """A bf16 scatter-add has no native GPU atomic: the embedding tables' gradients were 100 of
  214 ms of a BERT-base bf16 step on an H100. They must accumulate in float32, and the
  two-row token-type table's by a matmul (one-hot), not 32k atomic adds into two rows."""
  cfg = TINY.replace(dtype='bfloat16')
  params = tiny_params  # float32 params whatever the compute dtype
  ids, seg, mask = _solo(np.random.default_rng(5), 16, 14)

  def loss(p):
    out = BertForPreTraining(cfg).apply({'params': p}, ids[None], mask[None], seg[None],
                                        masked_lm_positions=np.array([[1, 2]]))
    return jnp.sum(out.mlm_logits) + jnp.sum(out.nsp_logits)

  scatters = _scatter_adds(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  tables = {(cfg.vocab_size, cfg.hidden_size): 'word',
            (cfg.max_position_embeddings, cfg.hidden_size): 'position',
            (cfg.type_vocab_size, cfg.hidden_size): 'token_type'}
  into_tables = [(tables[a.shape], a.dtype) for a in scatters if a.shape in tables]
  assert ('word', jnp.float32) in into_tables and ('position', jnp.float32) in into_tables
  assert all(dtype == jnp.float32 for _, dtype in into_tables), into_tables
  assert 'token_type' not in {name for name, _ in into_tables}, into_tables


def test_dropout_is_active_only_in_training_and_seeded(tiny_params):
  params = tiny_params
  ids, seg, mask = _solo(np.random.default_rng(3), 16, 16)
  feats = dict(input_ids=ids[None], input_mask=mask[None], segment_ids=seg[None],
               masked_lm_positions=np.array([[1, 2]]))
  model = BertForPreTraining(TINY)
  run = jax.jit(lambda key: model.apply({'params': params}, **feats, deterministic=False,
                                        rngs={'dropout': jax.random.key(key)}).mlm_logits)
  eval_out = model.apply({'params': params}, **feats).mlm_logits
  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))
  assert not np.allclose(run(1), eval_out)


@pytest.mark.parametrize('policy', ['full', 'dots', 'projections'])
def test_remat_does_not_change_gradients(tiny_params, policy):
  params = tiny_params
  ids, seg, mask = _solo(np.random.default_rng(4), 16, 14)

  def loss(p, cfg):
    out = BertForPreTraining(cfg).apply({'params': p}, ids[None], mask[None], seg[None],
                                        masked_lm_positions=np.array([[1, 2]]))
    return jnp.sum(out.mlm_logits ** 2) + jnp.sum(out.nsp_logits)

  g0 = jax.jit(jax.grad(loss), static_argnums=1)(params, TINY)
  g1 = jax.jit(jax.grad(loss), static_argnums=1)(params, TINY.replace(remat_policy=policy))
  # Same math, different fusion: equal to float32 round-off at the gradients' scale (entries
  # reach ~140 here; observed differences ~1e-7 of that on AVX2 and AVX-512 alike).
  assert_trees_close(g1, g0, rtol=1e-6)


def test_gelu_tanh_is_selectable_and_differs_from_erf(tiny_params):
  params = tiny_params
  ids = np.arange(5, 21, dtype=np.int32)[None]
  erf = apply(TINY, params, input_ids=ids).mlm_logits
  tanh = apply(TINY.replace(hidden_act='gelu_tanh'), params, input_ids=ids).mlm_logits
  assert 0 < float(jnp.max(jnp.abs(erf - tanh))) < 0.05


def test_bad_config_fields_name_the_field():
  with pytest.raises(ValueError, match='model.hidden_size=100 is not divisible by model.num_heads=3'):
    BertConfig(hidden_size=100, num_heads=3)
  with pytest.raises(ValueError, match="model.hidden_act='relu'"):
    BertConfig(hidden_act='relu')
  with pytest.raises(ValueError, match="unknown model size 'huge'"):
    BertConfig.from_preset('huge')


def test_flops_charge_local_layers_the_keys_their_core_scores():
  """`computed=True` counts 3 x window/2 keys a local query (the chunked core's neighbouring
  chunks), as XLA's own cost analysis of the two cores says; the default counts the window + 1
  keys it may see (MFU's useful work)."""
  cfg = BertConfig.from_preset('tiny', arch='modern', local_window=32)
  local = next(i for i in range(cfg.num_layers) if not cfg.is_global(i))
  assert flops.attention_span(cfg, local, 128) == 33
  assert flops.attention_span(cfg, local, 128, computed=True) == 48
  assert flops.attention_span(cfg, local, 32, computed=True) == 32  # dense band: every key
  q = jnp.ones((1, 128, 2, 8))
  ones = jnp.ones((1, 128), jnp.int32)
  mask = attention.attention_mask(ones, None, 1, 128)
  groups = attention.token_groups(ones, None, 1, 128)
  cost = lambda f: jax.jit(f).lower(q, q, q).compile().cost_analysis()['flops']
  local_cost = cost(lambda q, k, v: attention.local_attention(
      q, k, v, mask, groups, half_window=16, packed=False, implementation='xla'))
  global_cost = cost(lambda q, k, v: attention.global_attention(q, k, v, mask,
                                                               implementation='xla'))
  assert local_cost / global_cost == pytest.approx(48 / 128, rel=0.1)


def test_projections_policy_recomputes_the_glu_input_that_dots_keeps(capsys):
  """`remat_policy=projections` is `dots` without GeGLU's [B, S, 2, I] input projection (the
  widest activation of a modern layer), which decides what fits a chip at 8,192 tokens."""
  cfg = BertConfig.from_preset('tiny', arch='modern', vocab_size=128, scan_layers=False)
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  ids = np.arange(3, 35, dtype=np.int32)[None]

  def saved(policy) -> str:
    model = BertForPreTraining(cfg.replace(remat_policy=policy))
    loss = lambda p: jnp.sum(model.apply({'params': p}, ids).mlm_logits ** 2)
    jax.ad_checkpoint.print_saved_residuals(loss, params)
    return capsys.readouterr().out

  glu_input = f'f32[1,32,2,{cfg.intermediate_size}]'
  assert glu_input in saved('dots')
  kept = saved('projections')
  assert glu_input not in kept and f'f32[1,32,{cfg.num_heads},{cfg.head_dim}]' in kept  # q, k, v
