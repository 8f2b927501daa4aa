"""BERT and ModernBERT-class encoders with the masked-LM (and next-sentence) heads, in Flax
linen: one model, whose switches `BertConfig.arch`'s family (families.py) presets and whose
head quirks that family declares.

`arch='bert'` is numerically HuggingFace's `modeling_bert.BertForPreTraining` (post-LayerNorm
layers, LayerNorm eps 1e-12, exact erf GELU, tanh pooler over [CLS], MLM decoder tied to the
word embeddings plus an output bias). `arch='modern'` is transformers' `ModernBertForMaskedLM`
(models/modernbert/modeling_modernbert.py): pre-norm layers (the first layer's attention
reads the normed embeddings directly), no biases, GeGLU MLP, RoPE with separate theta for
global and local layers, global attention every Nth layer and a sliding window elsewhere
(attention.py), a final norm, the same tied MLM head, and no pooler or sentence head.
`arch='roberta'` / `'xlm-roberta'` is transformers' `RobertaForMaskedLM`: BERT's block with
positions offset by 2, one token type, eps 1e-5, and no pooler or sentence head.
`arch='electra'` is transformers' `ElectraForMaskedLM` (models/electra/modeling_electra.py):
BERT's block on embeddings `embedding_size` wide, projected to the hidden width when narrower
(`embeddings_project`), and the generator's MLM head (dense to `embedding_size`, exact GELU,
LayerNorm, the tied decoder); no pooler or sentence head. A discriminator
(`ElectraForPreTraining`) has the same encoder; its replaced-token-detection head is not an MLM
head and is not kept. Each switch (`norm_position`, `use_bias`, `mlp`, `positions`,
`global_attention_every`) also works alone on a BERT, for the ablation (configs/ablation.py).
Two departures, both for speed and neither changing a number:
- the MLM head runs only at `masked_lm_positions` (20 of 128 rows), never over the whole
  sequence, because the full-vocabulary projection is the single largest matmul in BERT;
- layers run under `nn.scan`, so compile time does not grow with depth.

Packed rows (input_pipeline/pretrain/batch_layout.py) are handled by feature name: `packed_segment_ids` gives a
block-diagonal attention mask and `position_ids` restart per instance, so each instance gets
exactly the logits it would get alone.

Scanned layers take their index as the scan input: a local or global layer is then a
`lax.cond` between the two attention cores (unrolled layers choose statically).

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
from jax.ad_checkpoint import checkpoint_name

from bert_jax.model import attention as attn_lib, families
from bert_jax.model.attention import AttentionInputs, attention_mask  # noqa: F401 (re-export)

# Sizes from the BERT repository's README ("Well-Read Students Learn Better" grid); the
# intermediate width is always 4H.
PRESETS: dict[str, dict[str, int]] = {
    'tiny': dict(num_layers=2, hidden_size=128, num_heads=2),
    'mini': dict(num_layers=4, hidden_size=256, num_heads=4),
    'small': dict(num_layers=4, hidden_size=512, num_heads=8),
    'medium': dict(num_layers=8, hidden_size=512, num_heads=8),
    'base': dict(num_layers=12, hidden_size=768, num_heads=12),
    'large': dict(num_layers=24, hidden_size=1024, num_heads=16),
    # ModernBERT's own shapes (answerdotai/ModernBERT-{base,large} config.json).
    'modernbert-base': dict(num_layers=22, hidden_size=768, num_heads=12,
                            intermediate_size=1152),
    'modernbert-large': dict(num_layers=28, hidden_size=1024, num_heads=16,
                             intermediate_size=2624),
}

SWITCHES = {'norm_position': ('post', 'pre'), 'mlp': ('mlp', 'glu'),
            'positions': ('learned', 'rope'), 'classifier_pooling': ('cls', 'mean')}


def glu_width(hidden_size: int) -> int:
  """A GeGLU's inner width with the parameters of a 4H MLP (3·H·I = 8·H²), in 64s."""
  return max(64, 64 * round(8 * hidden_size / 3 / 64))

# Layer activations that remat policies may keep by name (checkpoint_name in the layer).
SAVEABLE_NAMES = ('qkv', 'attention_context', 'attention_out', 'mlp_out')
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    # `dots` without the widest one: keeps q/k/v, the attention core's output and the
    # attention-output and MLP-output projections; recomputes only the MLP's input
    # projection (GeGLU's [B, S, 2, I]) and what is elementwise. ModernBERT-base at 8,192
    # tokens: 4 rows fit a v5e chip this way (benchmarks/RESULTS.md, "What fits a TPU
    # chip"), where `dots` needs 16.1 GiB.
    'projections': jax.checkpoint_policies.save_only_these_names(*SAVEABLE_NAMES),
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
  # Width of the embedding tables when narrower than hidden_size (ELECTRA-small: 128 of 256),
  # projected up after the embedding LayerNorm; 0 / None: hidden_size (no projection).
  embedding_size: int | None = 0
  # Added to every position id before the table lookup: RoBERTa's table starts at
  # padding_idx + 1 = 2 (fairseq), so 512 tokens use rows 2..513 of 514.
  position_offset: int = 0
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
  # How attention runs (attention.py): xla | splash (TPU) | cudnn (GPU) | auto (the
  # platform's best) | None (jax.nn.dot_product_attention picks).
  attention_impl: str | None = None
  # The encoder family (bert_jax/model/families.py: bert | roberta | xlm-roberta | electra |
  # modern | any registered one): its defaults for the fields below and its head quirks.
  arch: str = 'bert'
  # Architecture switches; the 'modern' family's defaults set all of them to ModernBERT's.
  norm_position: str = 'post'  # post (BERT) | pre (norm before each sub-block, final norm)
  use_bias: bool = True  # biases of the linear layers and norms (task heads keep theirs)
  mlp: str = 'mlp'  # mlp: act(x W1) W2 | glu: (act(x Wi_in) * x Wi_gate) Wo (GeGLU)
  positions: str = 'learned'  # learned absolute table | rope
  global_attention_every: int = 1  # layer i is global iff i % N == 0, else local
  local_window: int = 128  # local layers see keys with |i - j| <= local_window // 2
  global_rope_theta: float = 10_000.0
  local_rope_theta: float = 10_000.0
  classifier_pooling: str = 'cls'  # modern heads' sequence pooling: cls | mean

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
    family = families.get(self.arch)  # an unknown name is a ValueError listing the families
    for name, allowed in SWITCHES.items():
      if getattr(self, name) not in allowed:
        raise ValueError(f'model.{name}={getattr(self, name)!r}: expected one of {allowed}')
    if self.embedding_size is not None and self.embedding_size < 0:
      raise ValueError(f'model.embedding_size={self.embedding_size}: must be >= 0 '
                       '(0: hidden_size)')
    if self.embedding_width != self.hidden_size and not family.embedding_projection:
      raise ValueError(f'model.embedding_size={self.embedding_size} (hidden_size '
                       f'{self.hidden_size}): model.arch={self.arch} has no embedding '
                       'projection (ELECTRA\'s has); set model.arch=electra or embedding_size=0')
    if self.position_offset < 0:
      raise ValueError(f'model.position_offset={self.position_offset}: must be >= 0')
    if self.global_attention_every < 1:
      raise ValueError(f'model.global_attention_every={self.global_attention_every}: '
                       'must be >= 1 (1 = every layer global)')
    if self.global_attention_every > 1 and self.local_window < 2:
      raise ValueError(f'model.local_window={self.local_window}: needs >= 2')
    if self.attention_impl not in attn_lib.IMPLEMENTATIONS:
      raise ValueError(f'model.attention_impl={self.attention_impl!r}: expected one of '
                       f'{attn_lib.IMPLEMENTATIONS}')
    if self.positions == 'rope' and self.head_dim % 2:
      raise ValueError(f'model.positions=rope needs an even head size, got {self.head_dim}')

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def family(self) -> families.Family:
    """The encoder family `arch` names (bert_jax/model/families.py)."""
    return families.get(self.arch)

  @property
  def embedding_width(self) -> int:
    """Width of the embedding tables, the MLM head's output and the tied decoder."""
    return self.embedding_size or self.hidden_size

  @property
  def max_length(self) -> int:
    """The longest row the position table covers."""
    return self.max_position_embeddings - self.position_offset

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def half_window(self) -> int:
    return self.local_window // 2

  def is_global(self, layer):
    """Whether `layer` (an int, or a traced index in a scan) attends globally."""
    return layer % self.global_attention_every == 0

  @classmethod
  def from_preset(cls, name: str, arch: str = 'bert', **overrides: Any) -> 'BertConfig':
    """A named size (tiny ... large, modernbert-*) with `arch`'s switches and any overrides.
    The MLP's width is the size's (4H for BERT's sizes), or for a GLU on a BERT size the
    width with the same parameters (`glu_width`)."""
    if name not in PRESETS:
      raise ValueError(f'unknown model size {name!r}: expected one of {list(PRESETS)}')
    fields = dict(PRESETS[name])
    fields.update(families.get(arch).defaults, arch=arch)
    fields.update(overrides)
    if 'intermediate_size' not in fields:
      h = fields['hidden_size']
      fields['intermediate_size'] = glu_width(h) if fields.get('mlp') == 'glu' else 4 * h
    return cls(**fields)

  def replace(self, **changes: Any) -> 'BertConfig':
    return dataclasses.replace(self, **changes)


@struct.dataclass
class BertOutput:
  sequence_output: jax.Array  # [B, S, H]
  pooled_output: jax.Array | None  # [B, H], or [B, K, H] for packed rows; None: modern
  mlm_logits: jax.Array  # [B, P, V] float32 at masked_lm_positions (all S if none given)
  nsp_logits: jax.Array | None  # [B, 2], or [B, K, 2] for packed rows; float32
  # What mlm_logits are made of, for a loss that projects in chunks (pretrain/mlm_loss.py):
  # the MLM head's transformed states [B, P, E] and the tied decoder (table [V, E], bias [V]);
  # E = embedding_width (hidden_size but for a narrower ELECTRA).
  # A jitted loss that reads these and not mlm_logits never builds the [B, P, V] logits.
  mlm_hidden: jax.Array | None = None
  mlm_decoder: tuple[jax.Array, jax.Array] | None = None


def _init(cfg: BertConfig, axes: tuple[str | None, ...], std: float | None = None):
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(std or cfg.initializer_range), axes)


def _out_std(cfg: BertConfig) -> float | None:
  """ModernBERT initialises the layers' output projections with range / sqrt(2L)
  (`ModernBertPreTrainedModel._init_weights`, "out"); BERT uses the range everywhere."""
  return (cfg.initializer_range / (2 * cfg.num_layers) ** 0.5 if cfg.family.scaled_output_init
          else None)


def _zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _layer_norm(cfg: BertConfig, name: str) -> nn.LayerNorm:
  # Flax computes the statistics in float32 even when dtype is bfloat16.
  return nn.LayerNorm(
      epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype, name=name, use_bias=cfg.use_bias,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ('norm',)),
      bias_init=_zeros(('norm',)))


def _dense(cfg: BertConfig, features: int, axes, name: str, std: float | None = None) -> nn.Dense:
  return nn.Dense(features, dtype=cfg.compute_dtype, name=name, use_bias=cfg.use_bias,
                  kernel_init=_init(cfg, axes, std), bias_init=_zeros(axes[-1:]))


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
    std = _out_std(cfg) if self.merge else None
    kernel = self.param('kernel', _init(cfg, axes, std), shape, jnp.float32)
    dtype = cfg.compute_dtype
    y = jnp.einsum(eq, x.astype(dtype), kernel.astype(dtype))
    if not cfg.use_bias:
      return y
    return y + self.param('bias', _zeros(out_axes), bias_shape, jnp.float32).astype(dtype)


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """x[b, positions[b, p]] for every b, p: [B, S, ...] x [B, P] -> [B, P, ...]."""
  return jnp.take_along_axis(x, positions[:, :, None].astype(jnp.int32), axis=1)


class Embeddings(nn.Module):
  """Word (+ learned position) (+ token-type) embeddings, looked up and summed in float32 (as
  HF under autocast), then a norm in the compute dtype. Why float32: the lookups' gradients are
  scatter-adds, and a bfloat16 scatter-add has no native GPU atomic (each update is a
  compare-and-swap loop): it cost 100 of 214 ms of a BERT-base bf16 step on an H100
  (benchmarks/gpu_profile.py). The two-row token-type table is a one-hot matmul, as in
  google-research/bert's modeling.py ("always faster for a small vocabulary"): its gradient
  is then a reduction, not 32k atomic adds into two rows. RoPE models have no position table,
  ModernBERT no token types (`type_vocab_size=0`). ELECTRA's tables may be narrower than the
  layers (`embedding_size`): `embeddings_project` (HF `ElectraModel.embeddings_project`) maps
  the normed sum to the hidden width."""

  cfg: BertConfig
  deterministic: bool = True

  def setup(self):
    cfg = self.cfg
    width = cfg.embedding_width
    self.word_embeddings = nn.Embed(
        cfg.vocab_size, width, dtype=jnp.float32,
        embedding_init=_init(cfg, ('vocab', 'embed')))
    if cfg.positions == 'learned':
      self.position_embeddings = nn.Embed(
          cfg.max_position_embeddings, width, dtype=jnp.float32,
          embedding_init=_init(cfg, ('position', 'embed')))
    if cfg.type_vocab_size:
      self.token_type_embeddings = nn.Embed(
          cfg.type_vocab_size, width, dtype=jnp.float32,
          embedding_init=_init(cfg, ('token_type', 'embed')))
    self.layer_norm = _layer_norm(cfg, 'layer_norm')
    self.dropout = nn.Dropout(cfg.hidden_dropout)
    if width != cfg.hidden_size:
      self.embeddings_project = _dense(cfg, cfg.hidden_size, (None, 'embed'),
                                       'embeddings_project')

  def __call__(self, input_ids, segment_ids, position_ids):
    cfg = self.cfg
    x = self.word_embeddings(input_ids)
    if cfg.positions == 'learned':
      rows = position_ids + cfg.position_offset if cfg.position_offset else position_ids
      x = x + self.position_embeddings(rows)
    if cfg.type_vocab_size == 1:
      x = x + self.token_type_embeddings.embedding[0]
    elif cfg.type_vocab_size:
      x = x + jnp.einsum('bsv,vh->bsh',
                         jax.nn.one_hot(segment_ids, cfg.type_vocab_size, dtype=jnp.float32),
                         self.token_type_embeddings.embedding,
                         precision=jax.lax.Precision.HIGHEST)  # exact rows, even on TF32/TPU
    x = self.dropout(self.layer_norm(x), deterministic=self.deterministic)
    if cfg.embedding_width != cfg.hidden_size:
      x = self.embeddings_project(x)
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))

  def attend(self, x):
    """Tied MLM decoder: x @ word_embeddings.T, accumulated in float32."""
    return tied_decoder(x, self.word_embeddings.embedding)

  def decoder_table(self):
    return self.word_embeddings.embedding


def tied_decoder(x, table, bias=None):
  """x [B, P, H] @ table [V, H].T (+ bias [V]) in float32: the MLM logits, whole or a chunk."""
  logits = jnp.einsum('bph,vh->bpv', x, table.astype(x.dtype),
                      preferred_element_type=jnp.float32)
  return logits if bias is None else logits + bias


def attention_inputs(cfg: BertConfig, input_mask, packed_segment_ids, position_ids,
                     batch: int, length: int) -> AttentionInputs:
  """Masks and RoPE tables for every layer, once per forward pass."""
  rope = lambda theta: (attn_lib.rope_tables(position_ids, cfg.head_dim, theta)
                        if cfg.positions == 'rope' else None)
  has_local = cfg.global_attention_every > 1 and cfg.num_layers > 1
  return AttentionInputs(
      mask=attention_mask(input_mask, packed_segment_ids, batch, length),
      groups=attn_lib.token_groups(input_mask, packed_segment_ids, batch, length),
      rope_global=rope(cfg.global_rope_theta),
      rope_local=rope(cfg.local_rope_theta) if has_local else None,
      packed=packed_segment_ids is not None)


def _pick(flag, if_true, if_false):
  """Static choice for a Python bool, elementwise select for a traced one (scanned layers)."""
  if isinstance(flag, bool):
    return if_true if flag else if_false
  return jax.tree_util.tree_map(lambda a, b: jnp.where(flag, a, b), if_true, if_false)


class SelfAttention(nn.Module):
  """Projections (+ RoPE) around a global or local core (attention.py). `is_global` is a
  Python bool (unrolled layers) or a traced one (scanned layers: a lax.cond)."""

  cfg: BertConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, inputs: AttentionInputs, is_global=True):
    cfg = self.cfg
    q, k, v = (
        checkpoint_name(nn.with_logical_constraint(HeadProjection(cfg, name=name)(x),
                                                   ('batch', 'length', 'heads', 'kv')), 'qkv')
        for name in ('query', 'key', 'value'))
    if cfg.positions == 'rope':
      cos, sin = (inputs.rope_global if inputs.rope_local is None
                  else _pick(is_global, inputs.rope_global, inputs.rope_local))
      q, k = attn_lib.apply_rope(q, cos, sin), attn_lib.apply_rope(k, cos, sin)
    training = not self.deterministic and cfg.attention_dropout > 0.0
    key = self.make_rng('dropout') if training else None
    common = dict(dropout_rate=cfg.attention_dropout, key=key, implementation=cfg.attention_impl)
    global_core = lambda q, k, v: attn_lib.global_attention(
        q, k, v, inputs.mask, groups=inputs.groups, packed=inputs.packed, **common)
    local_core = lambda q, k, v: attn_lib.local_attention(
        q, k, v, inputs.mask, inputs.groups, half_window=cfg.half_window,
        packed=inputs.packed, **common)
    if cfg.global_attention_every == 1 or is_global is True:
      ctx = global_core(q, k, v)
    elif is_global is False:
      ctx = local_core(q, k, v)
    else:  # scanned: a cond, whose residuals would take the global core's S² shape in
      # every layer; checkpointed, a layer keeps only q, k, v and recomputes its core
      ctx = jax.checkpoint(lambda q, k, v: jax.lax.cond(is_global, global_core, local_core,
                                                         q, k, v))(q, k, v)
    ctx = checkpoint_name(nn.with_logical_constraint(ctx, ('batch', 'length', 'heads', 'kv')),
                          'attention_context')
    return checkpoint_name(HeadProjection(cfg, merge=True, name='output')(ctx), 'attention_out')


class GluIn(nn.Module):
  """GeGLU's input projection: [B, S, H] -> (input, gate), each [B, S, I]. One [H, 2, I]
  kernel (HF's `Wi`, whose output halves are input and gate), so tensor parallelism splits
  I in both halves alike."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    i = cfg.intermediate_size
    kernel = self.param('kernel', _init(cfg, ('embed', None, 'mlp')), (cfg.hidden_size, 2, i),
                        jnp.float32)
    dtype = cfg.compute_dtype
    y = jnp.einsum('bsh,hti->bsti', x.astype(dtype), kernel.astype(dtype))
    if cfg.use_bias:
      y = y + self.param('bias', _zeros((None, 'mlp')), (2, i), jnp.float32).astype(dtype)
    return y[:, :, 0], y[:, :, 1]


class EncoderLayer(nn.Module):
  """A Transformer layer, post-LN (BERT) or pre-LN (ModernBERT, whose layer 0 skips its
  attention norm: the embeddings were just normed). Signature (carry, inputs, scan_index) ->
  (carry, None) for nn.scan; unrolled layers get their `index` as an attribute."""

  cfg: BertConfig
  deterministic: bool = True
  index: int | None = None

  @nn.compact
  def __call__(self, x, inputs: AttentionInputs, scan_index=None):
    cfg = self.cfg
    index = self.index if self.index is not None else scan_index
    is_global = cfg.is_global(index)  # a Python bool unrolled, a traced one scanned
    drop = functools.partial(nn.Dropout(cfg.hidden_dropout), deterministic=self.deterministic)
    attention = SelfAttention(cfg, self.deterministic, name='attention')
    attention_norm = _layer_norm(cfg, 'attention_layer_norm')
    mlp_norm = _layer_norm(cfg, 'output_layer_norm')
    if cfg.norm_position == 'post':
      x = attention_norm(x + drop(attention(x, inputs, is_global)))
      x = mlp_norm(x + drop(self._mlp(x)))
    else:
      normed = attention_norm(x)  # created on every layer, so scanned stacks are uniform
      first = index == 0  # a Python bool unrolled, a traced one scanned
      x = x + drop(attention(_pick(first, x, normed), inputs, is_global))
      x = x + drop(self._mlp(mlp_norm(x)))
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed')), None

  def _mlp(self, x):
    cfg = self.cfg
    act = ACTIVATIONS[cfg.hidden_act]
    if cfg.mlp == 'glu':
      h, gate = GluIn(cfg, name='intermediate')(x)
      h = act(h) * gate
    else:
      h = act(_dense(cfg, cfg.intermediate_size, ('embed', 'mlp'), 'intermediate')(x))
    h = nn.with_logical_constraint(h, ('batch', 'length', 'mlp'))
    return checkpoint_name(_dense(cfg, cfg.hidden_size, ('mlp', 'embed'), 'output',
                                  _out_std(cfg))(h), 'mlp_out')


class Encoder(nn.Module):
  """The layer stack (+ the final norm of pre-norm models)."""

  cfg: BertConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, inputs: AttentionInputs):
    cfg = self.cfg
    layer = EncoderLayer
    policy = REMAT_POLICIES[cfg.remat_policy]
    if cfg.remat_policy != 'none':
      layer = nn.remat(layer, policy=policy, prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
      stack = nn.scan(
          layer, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
          in_axes=(nn.broadcast, 0), length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: 'layers'})
      x, _ = stack(cfg, self.deterministic, name='layers')(
          x, inputs, jnp.arange(cfg.num_layers, dtype=jnp.int32))
    else:
      for i in range(cfg.num_layers):
        x, _ = layer(cfg, self.deterministic, index=i, name=f'layer_{i}')(x, inputs, None)
    if cfg.norm_position == 'pre':
      x = _layer_norm(cfg, 'final_norm')(x)
    return x


def encode(cfg: BertConfig, input_ids, input_mask=None, segment_ids=None, *, position_ids=None,
           packed_segment_ids=None, deterministic: bool = True):
  """(sequence_output [B, S, H], embeddings module): the encoder, as submodules of the calling
  (compact) module, so every model lands its params under `embeddings` and `encoder`."""
  batch, length = input_ids.shape
  if segment_ids is None:
    segment_ids = jnp.zeros_like(input_ids)
  if position_ids is None:
    position_ids = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  embeddings = Embeddings(cfg, deterministic, name='embeddings')
  x = embeddings(input_ids, segment_ids, position_ids)
  inputs = attention_inputs(cfg, input_mask, packed_segment_ids, position_ids, batch, length)
  return Encoder(cfg, deterministic, name='encoder')(x, inputs), embeddings


def prediction_head(cfg: BertConfig, x):
  """The MLM head's transform (dense, activation, norm: BERT's `cls.predictions.transform`,
  ModernBERT's `head`), as submodules of the caller. ModernBERT's task heads reuse it on the
  pooled or per-token states, under the same names, so a pre-trained one carries over.
  ELECTRA's is `ElectraGeneratorPredictions`: dense to `embedding_size` (the decoder's width)
  and always exact GELU, whatever `hidden_act` says."""
  h = _dense(cfg, cfg.embedding_width, ('embed', 'mlp'), 'mlm_transform',
             _out_std(cfg))(x)
  # Keep the hidden dim whole here: on a (data, fsdp, tensor) mesh with all three > 1, XLA's
  # SPMD partitioner otherwise returns a wrong mlm_transform gradient (seen with jax 0.10.2;
  # tests/test_sharding.py guards it).
  h = nn.with_logical_constraint(h, ('batch',) + ('length',) * (h.ndim - 2) + ('embed',))
  act = ACTIVATIONS[cfg.family.head_activation or cfg.hidden_act]
  return _layer_norm(cfg, 'mlm_layer_norm')(act(h))


def bert_pooler(cfg: BertConfig, cls_tokens):
  """BERT's tanh pooler; for ELECTRA the dense + exact GELU of its multiple-choice
  `ElectraSequenceSummary` (summary_type first, use_proj, activation gelu), HF's
  `sequence_summary.summary`."""
  return pooler_activation(cfg)(
      _dense(cfg, cfg.hidden_size, ('embed', 'mlp'), 'pooler')(cls_tokens))


def pooler_activation(cfg: BertConfig):
  """tanh (BERT's pooler, RoBERTa's classification head), or the family's fixed one."""
  act = cfg.family.head_activation
  return ACTIVATIONS[act] if act else jnp.tanh


class BertForPreTraining(nn.Module):
  """The encoder with its pre-training heads: MLM, and for a family with a sentence head
  (BERT) the pooler and the 2-way sentence head (NSP/SOP).

  Call with the feature dict's arrays (input_pipeline/pretrain/batch_layout.py names). `masked_lm_positions`
  limits the MLM head to those rows; `next_sentence_positions` (packed rows) pools each instance's [CLS].
  Dropout is on when `deterministic=False` and needs a 'dropout' rng.
  """

  cfg: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, masked_lm_positions=None,
               position_ids=None, packed_segment_ids=None, next_sentence_positions=None,
               deterministic: bool = True) -> BertOutput:
    cfg = self.cfg
    sequence_output, embeddings = encode(
        cfg, input_ids, input_mask, segment_ids, position_ids=position_ids,
        packed_segment_ids=packed_segment_ids, deterministic=deterministic)
    pooled = nsp_logits = None
    if cfg.family.sentence_head:
      if next_sentence_positions is None:
        cls_tokens = sequence_output[:, 0]
      else:
        cls_tokens = gather_positions(sequence_output, next_sentence_positions)
      pooled = bert_pooler(cfg, cls_tokens)
      nsp_logits = _dense(cfg, 2, ('mlp', None), 'nsp')(pooled).astype(jnp.float32)

    mlm_in = (sequence_output if masked_lm_positions is None
              else gather_positions(sequence_output, masked_lm_positions))
    h = prediction_head(cfg, mlm_in)
    bias = self.param('mlm_output_bias', _zeros(('vocab',)), (cfg.vocab_size,), jnp.float32)
    mlm_logits = embeddings.attend(h) + bias
    return BertOutput(sequence_output=sequence_output, pooled_output=pooled,
                      mlm_logits=mlm_logits, nsp_logits=nsp_logits, mlm_hidden=h,
                      mlm_decoder=(embeddings.decoder_table(), bias))


@functools.partial(jax.jit, static_argnames=('cfg', 'seq_len'))
def init_params(cfg: BertConfig, rng: jax.Array, seq_len: int = 8) -> dict:
  """Unboxed float32 parameters for `cfg`, from a tiny dummy batch. Jitted: run eagerly, Flax
  dispatches every initialiser op by op (BERT-tiny 15-38 s on a 2-core CPU against ~11 s
  compiled, the same values), and the compiled init is cached per config."""
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
