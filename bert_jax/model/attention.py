"""Attention cores, masks and rotary positions of the encoder's layers: pure functions, no
parameters (the projections live in encoder.py).

Three cores:
- `global_attention`: every key of the row (BERT, and ModernBERT's global layers), through
  `jax.nn.dot_product_attention` so accelerators can use fused kernels; rows longer than
  `BLOCKED_FROM` tokens are attended block of `QUERY_BLOCK` queries by block under
  `jax.checkpoint` (memory-efficient attention, Rabe & Staats 2021): the scores of one block
  at a time, B·heads·block·S, instead of B·heads·S² (8,192-token rows: 16x less);
- `local_attention`: ModernBERT's sliding window, keys with |i - j| <= window // 2
  (transformers' `sliding_window_bidirectional_overlay` with `sliding_window =
  local_attention // 2`), computed over chunks of window // 2 queries against their three
  neighbouring key chunks, so scores take B·S·heads·(3/2)·window memory, not B·S²·heads;
  rows shorter than four chunks use the same band as a dense mask;
- dropout on the probabilities when training with `attention_dropout > 0` (no fused kernel).

`implementation` (`model.attention_impl`) picks how a core runs: `xla` (the cores above;
`jax.nn.dot_product_attention(implementation='xla')` where they call it), `splash` (TPU: the
Pallas splash kernel for global and local layers, splash.py; elsewhere in Pallas interpret
mode, for tests), `cudnn` (GPU: cuDNN's fused flash attention through
`jax.nn.dot_product_attention(implementation='cudnn')`, fed as `cudnn_feed` says), `auto`
(TPU: splash, GPU: cudnn, else xla), or None (jax.nn.dot_product_attention picks, as before
`auto` existed). Where the choice cannot run a call, that call takes the xla core and says so
once in the log: splash and cudnn with attention dropout in training, splash on rows not a
multiple of 128 tokens, cudnn in float32 (cuDNN's fused attention takes fp16/bf16) or on a
head size not a multiple of 8 up to 128.

How cuDNN is fed (`cudnn_feed`; what jax.nn.dot_product_attention's cuDNN path takes: key
sequence lengths, a mask it turns into a bias, and a one-sided window only):
- `lengths`: unpacked global rows, any length, no mask tensor: each row's key length (its
  real tokens; padding is a suffix of the row, as every reader here writes it), so the
  kernel skips padded keys and padded queries still attend the real ones (BERT's rule); no
  query blocking (flash attention keeps memory linear in the row);
- `mask`: packed rows (the block-diagonal mask as a [B, 1, S, S] bias: the public call takes
  no segment ids) and local layers over rows shorter than four chunks (the band as a mask),
  said once in the log;
- `chunks`: local layers over longer rows: the chunked layout below (each chunk of
  half_window queries against its three neighbouring key chunks, [B*n, c, 3c] masks) handed
  to the kernel chunk by chunk, the scores still B·S·heads·(3/2)·window; cuDNN's own window
  is causal-only (its right window must be 0), ModernBERT's is two-sided. Said once.

Masks follow BERT's rule in unpacked rows (padding masks keys only, as HF does) and give
packed rows (segment ids, input_pipeline/pretrain/batch_layout.py) a block-diagonal mask, so each instance
sees exactly what it would see alone; the window applies within the row by index distance,
which within one instance is its position distance.

RoPE is transformers' `ModernBertRotaryEmbedding` + `apply_rotary_pos_emb` (rotate-half
convention, frequencies theta^(-2i/d), rotation in float32), from `position_ids`, which packed
rows restart per instance.
"""

from __future__ import annotations

from absl import logging
import jax
import jax.numpy as jnp
from flax import struct

from bert_jax.model import splash as splash_lib

# Local layers switch from a dense band mask to chunks at this many chunks per row.
MIN_CHUNKS = 4
# Global layers attend query block by query block from this row length on.
BLOCKED_FROM = 2048
QUERY_BLOCK = 512

# model.attention_impl values; None: jax.nn.dot_product_attention picks (the old default).
IMPLEMENTATIONS = (None, 'xla', 'splash', 'cudnn', 'auto')
# cuDNN's flash attention head-size limit before Hopper (256 from Hopper on; BERT's and
# ModernBERT's heads are 64).
CUDNN_MAX_HEAD_DIM = 128
AUTO = {'tpu': 'splash', 'gpu': 'cudnn'}  # platform -> implementation; others: xla
_logged: set[str] = set()


def _log_once(message: str, level: int = logging.WARNING) -> None:
  if message not in _logged:
    _logged.add(message)
    logging.log(level, message)


def platform() -> str:
  """The platform the step is traced for: the mesh in scope's (a TPU topology's when
  compiling ahead of time on a CPU host), else the default backend's."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.platform if device is not None else jax.default_backend()


def resolve(implementation: str | None, where: str | None = None) -> str | None:
  """`auto` -> the best core of the platform `where` (default: `platform()`), logged once;
  other values as they are."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'model.attention_impl={implementation!r}: expected one of '
                     f'{IMPLEMENTATIONS}')
  if implementation != 'auto':
    return implementation
  where = where or platform()
  picked = AUTO.get(where, 'xla')
  _log_once(f'model.attention_impl=auto on {where}: {picked}')
  return picked


def core(implementation, q, *, dropout: bool, packed: bool, groups=None) -> str | None:
  """The implementation a call runs with: `implementation` resolved, or `xla` (logged
  once) where it cannot run this call."""
  impl = resolve(implementation)
  why, level = None, logging.WARNING
  if impl == 'splash':
    if dropout:
      why = 'attention dropout in training (no dropout in the kernel; attention_dropout=0 lifts it)'
    elif splash_lib.block_size(q.shape[1]) is None:
      why = f'rows of {q.shape[1]} tokens (needs a multiple of 128)'
      if q.shape[1] < 128:  # init's dummy rows, not a run's: no warning
        level = logging.INFO
    elif groups is None:
      why = 'no token groups given'
  elif impl == 'cudnn':
    if dropout:
      why = 'attention dropout in training (attention_dropout=0 lifts it)'
    elif q.dtype not in (jnp.bfloat16, jnp.float16):
      why = f'{q.dtype} (cuDNN fused attention takes bfloat16 or float16)'
    elif q.shape[-1] % 8 or q.shape[-1] > CUDNN_MAX_HEAD_DIM:
      why = (f'head size {q.shape[-1]} (cuDNN fused attention takes multiples of 8 up to '
             f'{CUDNN_MAX_HEAD_DIM})')
  if why is None:
    return impl
  _log_once(f'model.attention_impl={implementation}: xla instead of {impl} for {why}', level)
  return 'xla'


def cudnn_feed(packed: bool, length: int, half_window: int | None = None) -> str:
  """How a cudnn call is fed (module docstring): `lengths`, `mask` or `chunks`; the
  last two said once in the log with their reason."""
  if half_window is None and not packed:
    return 'lengths'
  if half_window is not None and length >= MIN_CHUNKS * half_window:
    feed, why = 'chunks', (f'sliding-window layers over rows of {length} tokens in chunks of '
                           f'{half_window} (cuDNN\'s own window is one-sided)')
  else:
    feed, why = 'mask', ('a dense mask for ' + (
        f'sliding-window layers over rows of {length} tokens (under four chunks)'
        if half_window is not None else "packed rows (jax's cuDNN call takes no segment ids)"))
  _log_once(f'model.attention_impl=cudnn: {why}', logging.INFO)
  return feed


def key_lengths(groups: jax.Array) -> jax.Array:
  """[B] int32 real tokens per unpacked row (its padding is a suffix), at least 1: a row of
  padding alone (eval's filler rows) attends its first key, a finite output no loss reads."""
  return jnp.maximum(jnp.sum(groups > 0, axis=1), 1).astype(jnp.int32)


@struct.dataclass
class AttentionInputs:
  """What every layer's attention needs, computed once per forward pass."""
  mask: jax.Array  # bool, broadcastable to [B, 1, S, S]: True where attention is allowed
  groups: jax.Array  # [B, S] int: packed segment ids (0 = padding) or the input mask
  rope_global: tuple[jax.Array, jax.Array] | None  # (cos, sin) [B, S, head_dim], float32
  rope_local: tuple[jax.Array, jax.Array] | None
  packed: bool = struct.field(pytree_node=False, default=False)


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


def token_groups(input_mask, packed_segment_ids, batch: int, length: int) -> jax.Array:
  """Per-token group ids for the local core: packed segment ids, else 1 = real, 0 = pad."""
  if packed_segment_ids is not None:
    return packed_segment_ids.astype(jnp.int32)
  if input_mask is None:
    return jnp.ones((batch, length), jnp.int32)
  return (input_mask > 0).astype(jnp.int32)


def rope_tables(position_ids: jax.Array, head_dim: int, theta: float):
  """(cos, sin) [B, S, head_dim] in float32, as `ModernBertRotaryEmbedding.forward`."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = position_ids[..., None].astype(jnp.float32) * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x [B, S, heads, head_dim] rotated in float32, returned in x's dtype (HF's rule)."""
  xf = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
  return (xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)


def _dropout(probs, rate: float, key):
  if key is None or rate == 0.0:
    return probs
  keep = jax.random.bernoulli(key, 1.0 - rate, probs.shape)
  return jnp.where(keep, probs / (1.0 - rate), 0.0)


def _softmax_attention(q, k, v, mask, dropout_rate: float, key, eq_scores: str, eq_out: str):
  scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1])).astype(q.dtype)
  logits = jnp.einsum(eq_scores, q * scale, k, preferred_element_type=jnp.float32)
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = _dropout(jax.nn.softmax(logits, axis=-1), dropout_rate, key)
  return jnp.einsum(eq_out, probs.astype(v.dtype), v)


def global_attention(q, k, v, mask, *, dropout_rate: float = 0.0, key=None,
                     implementation: str | None = None, groups=None, packed: bool = False):
  """q, k, v [B, S, heads, d] -> [B, S, heads, d] over every allowed key of the row. Given
  the token `groups`, rows of `BLOCKED_FROM` tokens or more go block by block."""
  length = q.shape[1]
  implementation = core(implementation, q, dropout=key is not None and dropout_rate > 0.0,
                        packed=packed, groups=groups)
  if implementation == 'splash':
    return splash_lib.splash_attention(q, k, v, groups, packed=packed,
                                       interpret=_interpret())
  if implementation == 'cudnn':  # groups=None: a local layer's band, said by local_attention
    if groups is not None and cudnn_feed(packed, length) == 'lengths':
      return fused_by_lengths(q, k, v, groups)
    return _dense_attention(q, k, v, mask, dropout_rate, key, implementation)
  if groups is not None and length >= BLOCKED_FROM and length % QUERY_BLOCK == 0:
    return _blocked_global_attention(q, k, v, groups, packed, dropout_rate, key, implementation)
  return _dense_attention(q, k, v, mask, dropout_rate, key, implementation)


def _dense_attention(q, k, v, mask, dropout_rate, key, implementation):
  """`xla` is our own softmax core: on CPU its step (fwd + bwd, 4 x 1,024 tokens, 4 heads)
  takes 0.54x the time of `jax.nn.dot_product_attention(implementation='xla')`'s, which
  computes the same scores. None lets jax choose (cuDNN where it can on GPU)."""
  if implementation in (None, 'cudnn') and (key is None or dropout_rate == 0.0):
    if implementation == 'cudnn':  # cuDNN takes a mask of every query row, not [B,1,1,S]
      mask = jnp.broadcast_to(mask, (mask.shape[0], 1, q.shape[1], k.shape[1]))
      return fused_by_mask(q, k, v, mask)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)
  return _softmax_attention(q, k, v, mask, dropout_rate, key, 'bqhd,bkhd->bhqk',
                            'bhqk,bkhd->bqhd')


def fused_by_mask(q, k, v, mask, fused: str = 'cudnn'):
  """jax.nn.dot_product_attention under a [B, 1, Sq, Sk] mask, safe for queries that may read
  no key (padding): cuDNN's backward gives such a query a NaN dq (measured on an H200, every
  one of them), which the query projection's weight gradient then sums into every weight.
  Such a query reads key 0 instead and its output is zero, so its cotangent, and dq, are 0."""
  readable = mask.any(-1, keepdims=True)  # [B, 1, Sq, 1]
  mask = mask | (~readable & (jnp.arange(mask.shape[-1]) == 0))
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=fused)
  return jnp.where(jnp.moveaxis(readable, 1, 2), out, jnp.zeros((), out.dtype))


def fused_by_lengths(q, k, v, groups, fused: str = 'cudnn'):
  """jax.nn.dot_product_attention over the real keys of unpacked rows, by their lengths
  (`fused='xla'`: jax's reference of the same call, which the tests compare on CPU)."""
  return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=key_lengths(groups),
                                      implementation=fused)


def _blocked_global_attention(q, k, v, groups, packed, dropout_rate, key, implementation):
  """`_dense_attention` over blocks of QUERY_BLOCK queries, each under jax.checkpoint (the
  backward recomputes a block's scores instead of keeping them), masks built per block
  from the token groups."""
  batch, length, heads, dim = q.shape
  n = length // QUERY_BLOCK
  blocks = jnp.moveaxis(q.reshape(batch, n, QUERY_BLOCK, heads, dim), 1, 0)
  group_blocks = jnp.moveaxis(groups.reshape(batch, n, QUERY_BLOCK), 1, 0)
  keys = (jnp.zeros((n, 2), jnp.uint32) if key is None
          else jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(key, i)))(jnp.arange(n)))

  @jax.checkpoint
  def one(args):
    q_block, g_block, key_data = args
    allowed = (groups[:, None, :] > 0)[:, None]  # [B, 1, 1, S]: keys of real tokens
    if packed:
      allowed = allowed & (g_block[:, :, None] == groups[:, None, :])[:, None]
    block_key = None if key is None else jax.random.wrap_key_data(key_data)
    return _dense_attention(q_block, k, v, allowed, dropout_rate, block_key, implementation)

  out = jax.lax.map(one, (blocks, group_blocks, keys))
  return jnp.moveaxis(out, 0, 1).reshape(batch, length, heads, dim)


def _interpret() -> bool:
  """Splash off TPU runs in Pallas interpret mode (slow: for tests), said once."""
  where = platform()
  if where == 'tpu':
    return False
  _log_once(f'model.attention_impl=splash on {where}: Pallas interpret mode (slow; for tests)')
  return True


def band(length: int, half_window: int) -> jax.Array:
  """[S, S] True where |i - j| <= half_window."""
  i = jnp.arange(length)
  return jnp.abs(i[:, None] - i[None, :]) <= half_window


def local_attention(q, k, v, mask, groups, *, half_window: int, packed: bool,
                    dropout_rate: float = 0.0, key=None, implementation: str | None = None):
  """Sliding-window attention: each query sees the allowed keys within `half_window`."""
  length = q.shape[1]
  implementation = core(implementation, q, dropout=key is not None and dropout_rate > 0.0,
                        packed=packed, groups=groups)
  if implementation == 'splash':
    return splash_lib.splash_attention(q, k, v, groups, packed=packed, half_window=half_window,
                                       interpret=_interpret())
  if implementation == 'cudnn':
    cudnn_feed(packed, length, half_window)  # said once: chunks or a dense band
  if length < MIN_CHUNKS * half_window:
    return global_attention(q, k, v, mask & band(length, half_window), dropout_rate=dropout_rate,
                            key=key, implementation=implementation)
  fused = 'cudnn' if implementation == 'cudnn' else None
  return _chunked_local_attention(q, k, v, groups, half_window, packed, dropout_rate, key, fused)


def _neighbours(x):
  """[B, n, c, ...] -> [B, n, 3c, ...]: each chunk with its previous and next (zeros past the
  ends, which read as padding keys)."""
  zero = jnp.zeros_like(x[:, :1])
  prev = jnp.concatenate([zero, x[:, :-1]], axis=1)
  nxt = jnp.concatenate([x[:, 1:], zero], axis=1)
  return jnp.concatenate([prev, x, nxt], axis=2)


def _chunked_local_attention(q, k, v, groups, half_window, packed, dropout_rate, key,
                             fused: str | None = None):
  """`fused`: None, our softmax core over [B, n, ...] chunks; else the
  jax.nn.dot_product_attention implementation each of the B·n chunks goes to (cudnn; xla in
  the tests, the same call on CPU)."""
  batch, length, heads, dim = q.shape
  c = half_window
  pad = (-length) % c
  if pad:
    widths = ((0, 0), (0, pad), (0, 0), (0, 0))
    q, k, v = (jnp.pad(x, widths) for x in (q, k, v))
    groups = jnp.pad(groups, ((0, 0), (0, pad)))  # group 0: padding, never a key
  n = (length + pad) // c
  chunks = lambda x: x.reshape((batch, n, c) + x.shape[2:])
  qc, kw, vw = chunks(q), _neighbours(chunks(k)), _neighbours(chunks(v))
  gq, gk = chunks(groups), _neighbours(chunks(groups))
  # Query a of a chunk and key j of its 3c neighbours are (j - c) - a apart, for every chunk.
  a, j = jnp.arange(c)[:, None], jnp.arange(3 * c)[None, :]
  allowed = (jnp.abs(j - c - a) <= half_window)[None, None] & (gk[:, :, None, :] > 0)
  if packed:
    allowed &= gq[:, :, :, None] == gk[:, :, None, :]
  if fused is not None:
    flat = lambda x: x.reshape((batch * n,) + x.shape[2:])
    out = fused_by_mask(flat(qc), flat(kw), flat(vw), flat(allowed)[:, None], fused)
    return out.reshape(batch, n * c, heads, dim)[:, :length]
  out = _softmax_attention(qc, kw, vw, allowed[:, :, None], dropout_rate, key,
                           'bnqhd,bnkhd->bnhqk', 'bnhqk,bnkhd->bnqhd')
  return out.reshape(batch, n * c, heads, dim)[:, :length]
