"""BERT encoder with the masked-LM and next-sentence heads, in Flax linen.

Numerically the same as HuggingFace's `modeling_bert.BertForPreTraining` (post-LayerNorm
layers, LayerNorm eps 1e-12, exact erf GELU, tanh pooler over [CLS], MLM decoder tied to the
word embeddings plus an output bias). Two departures, both for speed and neither changing a
number:
- the MLM head runs only at `masked_lm_positions` (20 of 128 rows), never over the whole
  sequence, because the full-vocabulary projection is the single largest matmul in BERT;
- layers run under `nn.scan`, so compile time does not grow with depth.

Packed rows (pretraining/features.py) are handled by feature name: `packed_segment_ids` gives a
block-diagonal attention mask and `position_ids` restart per instance, so each instance gets
exactly the logits it would get alone.

Every parameter and the main activations carry logical axis names (`vocab`, `embed`, `heads`,
`kv`, `mlp`, `batch`, `length`, `layers`) which `bert_jax.training.sharding` maps to mesh axes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

# Sizes from the BERT repository's README ("Well-Read Students Learn Better" grid); the
# intermediate width is always 4H.
PRESETS: dict[str, dict[str, int]] = {
    'tiny': dict(num_layers=2, hidden_size=128, num_heads=2),
    'mini': dict(num_layers=4, hidden_size=256, num_heads=4),
    'small': dict(num_layers=4, hidden_size=512, num_heads=8),
    'medium': dict(num_layers=8, hidden_size=512, num_heads=8),
    'base': dict(num_layers=12, hidden_size=768, num_heads=12),
    'large': dict(num_layers=24, hidden_size=1024, num_heads=16),
}

REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}

ACTIVATIONS = {
    'gelu': functools.partial(jax.nn.gelu, approximate=False),  # HF "gelu": exact erf
    'gelu_tanh': functools.partial(jax.nn.gelu, approximate=True),  # the original TF code
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture and numerics of one BERT. Field names follow the paper, not HF."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  hidden_act: str = 'gelu'
  # Compute dtype; parameters, softmax, LayerNorm statistics and logits stay float32.
  dtype: str = 'float32'
  scan_layers: bool = True
  remat_policy: str = 'none'
  # Passed to jax.nn.dot_product_attention: None (XLA picks), 'xla' or 'cudnn'.
  attention_impl: str | None = None

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(f'model.hidden_size={self.hidden_size} is not divisible by '
                       f'model.num_heads={self.num_heads}')
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f'model.hidden_act={self.hidden_act!r}: expected one of {sorted(ACTIVATIONS)}')
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f'model.remat_policy={self.remat_policy!r}: expected one of '
                       f'{sorted(REMAT_POLICIES)}')
    if self.dtype not in ('float32', 'bfloat16'):
      raise ValueError(f'model.dtype={self.dtype!r}: expected float32 or bfloat16')

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @classmethod
  def from_preset(cls, name: str, **overrides: Any) -> 'BertConfig':
    """A named size (tiny ... large) with intermediate 4H, plus any field overrides."""
    if name not in PRESETS:
      raise ValueError(f'unknown model size {name!r}: expected one of {list(PRESETS)}')
    fields = dict(PRESETS[name])
    fields['intermediate_size'] = 4 * fields['hidden_size']
    fields.update(overrides)
    return cls(**fields)

  def replace(self, **changes: Any) -> 'BertConfig':
    return dataclasses.replace(self, **changes)


@struct.dataclass
class BertOutput:
  sequence_output: jax.Array  # [B, S, H]
  pooled_output: jax.Array  # [B, H], or [B, K, H] for packed rows
  mlm_logits: jax.Array  # [B, P, V] float32 at masked_lm_positions (all S if none given)
  nsp_logits: jax.Array  # [B, 2], or [B, K, 2] for packed rows; float32


def _init(cfg: BertConfig, axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(cfg.initializer_range), axes)


def _zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _layer_norm(cfg: BertConfig, name: str) -> nn.LayerNorm:
  # Flax computes the statistics in float32 even when dtype is bfloat16.
  return nn.LayerNorm(
      epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype, name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ('norm',)),
      bias_init=_zeros(('norm',)))


def _dense(cfg: BertConfig, features: int, axes, name: str) -> nn.Dense:
  return nn.Dense(features, dtype=cfg.compute_dtype, name=name,
                  kernel_init=_init(cfg, axes), bias_init=_zeros(axes[-1:]))


class HeadProjection(nn.Module):
  """[B, S, H] -> [B, S, heads, head_dim] (query, key, value), or back when `merge`.

  Not nn.DenseGeneral: it initialises kernels flat, which breaks rank-3 logical sharding.
  """

  cfg: BertConfig
  merge: bool = False

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    heads = (cfg.num_heads, cfg.head_dim)
    if self.merge:
      shape, axes, out_axes = heads + (cfg.hidden_size,), ('heads', 'kv', 'embed'), ('embed',)
      eq, bias_shape = 'bsnd,ndh->bsh', (cfg.hidden_size,)
    else:
      shape, axes, out_axes = (cfg.hidden_size,) + heads, ('embed', 'heads', 'kv'), ('heads', 'kv')
      eq, bias_shape = 'bsh,hnd->bsnd', heads
    kernel = self.param('kernel', _init(cfg, axes), shape, jnp.float32)
    bias = self.param('bias', _zeros(out_axes), bias_shape, jnp.float32)
    dtype = cfg.compute_dtype
    return jnp.einsum(eq, x.astype(dtype), kernel.astype(dtype)) + bias.astype(dtype)


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """x[b, positions[b, p]] for every b, p: [B, S, ...] x [B, P] -> [B, P, ...]."""
  return jnp.take_along_axis(x, positions[:, :, None].astype(jnp.int32), axis=1)


def attention_mask(input_mask: jax.Array | None, packed_segment_ids: jax.Array | None,
                   batch: int, length: int) -> jax.Array:
  """Boolean mask, broadcastable to [B, heads, S_q, S_k], True where attention is allowed.

  Padding masks only keys, as HF does (padded queries still produce finite outputs).
  Packed rows attend only within their own instance; padding (segment 0) attends nowhere,
  which `jax.nn.dot_product_attention` turns into a finite uniform average.
  """
  if packed_segment_ids is not None:
    seg = packed_segment_ids
    same = seg[:, :, None] == seg[:, None, :]
    return (same & (seg[:, None, :] > 0))[:, None, :, :]
  if input_mask is None:
    return jnp.ones((batch, 1, 1, length), bool)
  return (input_mask > 0)[:, None, None, :]


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, looked up and summed in float32 (as HF under
  autocast), then LayerNorm in the compute dtype. Why float32: the lookups' gradients are
  scatter-adds, and a bfloat16 scatter-add has no native GPU atomic (each update is a
  compare-and-swap loop): it cost 100 of 214 ms of a BERT-base bf16 step on an H100
  (benchmarks/gpu_profile.py). The two-row token-type table is a one-hot matmul, as in
  google-research/bert's modeling.py ("always faster for a small vocabulary"): its gradient
  is then a reduction, not 32k atomic adds into two rows."""

  cfg: BertConfig
  deterministic: bool = True

  def setup(self):
    cfg = self.cfg
    self.word_embeddings = nn.Embed(
        cfg.vocab_size, cfg.hidden_size, dtype=jnp.float32,
        embedding_init=_init(cfg, ('vocab', 'embed')))
    self.position_embeddings = nn.Embed(
        cfg.max_position_embeddings, cfg.hidden_size, dtype=jnp.float32,
        embedding_init=_init(cfg, ('position', 'embed')))
    self.token_type_embeddings = nn.Embed(
        cfg.type_vocab_size, cfg.hidden_size, dtype=jnp.float32,
        embedding_init=_init(cfg, ('token_type', 'embed')))
    self.layer_norm = _layer_norm(cfg, 'layer_norm')
    self.dropout = nn.Dropout(cfg.hidden_dropout)

  def __call__(self, input_ids, segment_ids, position_ids):
    token_types = jnp.einsum('bsv,vh->bsh',
                             jax.nn.one_hot(segment_ids, self.cfg.type_vocab_size,
                                            dtype=jnp.float32),
                             self.token_type_embeddings.embedding,
                             precision=jax.lax.Precision.HIGHEST)  # exact rows, even on TF32/TPU
    x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids) + token_types
    x = self.dropout(self.layer_norm(x), deterministic=self.deterministic)
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))

  def attend(self, x):
    """Tied MLM decoder: x @ word_embeddings.T, accumulated in float32."""
    table = self.word_embeddings.embedding
    return jnp.einsum('bph,vh->bpv', x, table.astype(x.dtype),
                      preferred_element_type=jnp.float32)


class SelfAttention(nn.Module):
  cfg: BertConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, mask):
    cfg = self.cfg
    q, k, v = (
        nn.with_logical_constraint(HeadProjection(cfg, name=name)(x),
                                   ('batch', 'length', 'heads', 'kv'))
        for name in ('query', 'key', 'value'))
    if self.deterministic or cfg.attention_dropout == 0.0:
      if cfg.attention_impl == 'cudnn':  # cuDNN takes a mask of every query row, not [B,1,1,S]
        mask = jnp.broadcast_to(mask, (mask.shape[0], 1, q.shape[1], k.shape[1]))
      ctx = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=cfg.attention_impl)
    else:
      ctx = self._attention_with_dropout(q, k, v, mask)
    ctx = nn.with_logical_constraint(ctx, ('batch', 'length', 'heads', 'kv'))
    return HeadProjection(cfg, merge=True, name='output')(ctx)

  def _attention_with_dropout(self, q, k, v, mask):
    # Dropout on the attention probabilities, as in the paper and HF. Fused attention kernels
    # have no dropout; set model.attention_dropout=0 to get them in training too.
    scale = 1.0 / jnp.sqrt(self.cfg.head_dim).astype(q.dtype)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q * scale, k, preferred_element_type=jnp.float32)
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = nn.Dropout(self.cfg.attention_dropout)(probs, deterministic=False)
    return jnp.einsum('bhqk,bkhd->bqhd', probs.astype(v.dtype), v)


class EncoderLayer(nn.Module):
  """Post-LN Transformer layer; signature (carry, mask) -> (carry, None) for nn.scan."""

  cfg: BertConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, mask):
    cfg = self.cfg
    drop = functools.partial(nn.Dropout(cfg.hidden_dropout), deterministic=self.deterministic)
    attn = SelfAttention(cfg, self.deterministic, name='attention')(x, mask)
    x = _layer_norm(cfg, 'attention_layer_norm')(x + drop(attn))
    h = _dense(cfg, cfg.intermediate_size, ('embed', 'mlp'), 'intermediate')(x)
    h = nn.with_logical_constraint(ACTIVATIONS[cfg.hidden_act](h), ('batch', 'length', 'mlp'))
    h = _dense(cfg, cfg.hidden_size, ('mlp', 'embed'), 'output')(h)
    x = _layer_norm(cfg, 'output_layer_norm')(x + drop(h))
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed')), None


class Encoder(nn.Module):
  cfg: BertConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, mask):
    cfg = self.cfg
    layer = EncoderLayer
    policy = REMAT_POLICIES[cfg.remat_policy]
    if cfg.remat_policy != 'none':
      layer = nn.remat(layer, policy=policy, prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
      stack = nn.scan(
          layer, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
          in_axes=nn.broadcast, length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: 'layers'})
      x, _ = stack(cfg, self.deterministic, name='layers')(x, mask)
      return x
    for i in range(cfg.num_layers):
      x, _ = layer(cfg, self.deterministic, name=f'layer_{i}')(x, mask)
    return x


class BertForPreTraining(nn.Module):
  """BERT with both pre-training heads.

  Call with the feature dict's arrays (pretraining/features.py names). `masked_lm_positions`
  limits the MLM head to those rows; `next_sentence_positions` (packed rows) pools each instance's [CLS].
  Dropout is on when `deterministic=False` and needs a 'dropout' rng.
  """

  cfg: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, masked_lm_positions=None,
               position_ids=None, packed_segment_ids=None, next_sentence_positions=None,
               deterministic: bool = True) -> BertOutput:
    cfg = self.cfg
    batch, length = input_ids.shape
    if segment_ids is None:
      segment_ids = jnp.zeros_like(input_ids)
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    embeddings = Embeddings(cfg, deterministic, name='embeddings')
    x = embeddings(input_ids, segment_ids, position_ids)
    mask = attention_mask(input_mask, packed_segment_ids, batch, length)
    sequence_output = Encoder(cfg, deterministic, name='encoder')(x, mask)

    if next_sentence_positions is None:
      cls_tokens = sequence_output[:, 0]
    else:
      cls_tokens = gather_positions(sequence_output, next_sentence_positions)
    pooled = jnp.tanh(_dense(cfg, cfg.hidden_size, ('embed', 'mlp'), 'pooler')(cls_tokens))
    nsp_logits = _dense(cfg, 2, ('mlp', None), 'nsp')(pooled).astype(jnp.float32)

    mlm_in = (sequence_output if masked_lm_positions is None
              else gather_positions(sequence_output, masked_lm_positions))
    h = _dense(cfg, cfg.hidden_size, ('embed', 'mlp'), 'mlm_transform')(mlm_in)
    # Keep the hidden dim whole here: on a (data, fsdp, tensor) mesh with all three > 1, XLA's
    # SPMD partitioner otherwise returns a wrong mlm_transform gradient (seen with jax 0.10.2;
    # tests/test_sharding.py guards it).
    h = nn.with_logical_constraint(h, ('batch', 'length', 'embed'))
    h = _layer_norm(cfg, 'mlm_layer_norm')(ACTIVATIONS[cfg.hidden_act](h))
    bias = self.param('mlm_output_bias', _zeros(('vocab',)), (cfg.vocab_size,), jnp.float32)
    mlm_logits = embeddings.attend(h) + bias
    return BertOutput(sequence_output=sequence_output, pooled_output=pooled,
                      mlm_logits=mlm_logits, nsp_logits=nsp_logits)


def init_params(cfg: BertConfig, rng: jax.Array, seq_len: int = 8) -> dict:
  """Unboxed float32 parameters for `cfg`, from a tiny dummy batch."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  variables = BertForPreTraining(cfg).init(rng, ids, masked_lm_positions=jnp.zeros((1, 1), jnp.int32))
  return nn.unbox(variables['params'])


def logical_param_specs(cfg: BertConfig, seq_len: int = 8):
  """The logical PartitionSpec of every parameter, without allocating any."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  abstract = jax.eval_shape(
      lambda: BertForPreTraining(cfg).init(jax.random.key(0), ids,
                                           masked_lm_positions=jnp.zeros((1, 1), jnp.int32)))
  return nn.get_partition_spec(abstract['params'])


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
