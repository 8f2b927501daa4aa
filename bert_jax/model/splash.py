"""Splash attention (the TPU Pallas flash-attention kernel with block-sparse masks) as a core
of the encoder's global and local layers: `splash_attention(q, k, v, groups, ...)` computes
what attention.py's xla cores compute, from the same token groups.

Followed: jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py
(`make_splash_mha`, `SegmentIds`, `BlockSizes`; layout [heads, S, d] per example, vmapped
over the batch; the kernel does not scale q) and splash_attention_mask.py (`FullMask`,
`LocalMask(shape, window_size=(left, right), offset)`: keys with q - left <= k <= q + right),
and MaxText's use of them (AI-Hypercomputer/maxtext, layers/attention_op.py,
`tpu_flash_attention`: a `shard_map` with the batch over the data axes and heads over the
tensor axis, `jax.vmap(kernel)` inside).

Masks. Splash masks a query-key pair where their segment ids differ (and, in local layers,
where |i - j| > half_window, a static `LocalMask((S, S), (w, w), 0)`):
- unpacked rows: query ids are all 1, key ids are the input mask (1 real, 0 padding), so
  padding masks keys only and a padded query still attends to the real keys, exactly as the
  xla cores (BERT's rule, as HF);
- packed rows: query ids = key ids = the packed segment ids, so each instance sees itself
  alone; padding (segment 0) queries see the padding keys, where the xla cores let them
  attend nowhere (a uniform average). Outputs at padding positions reach no loss (padding is
  never a key of a real token, nor an MLM or [CLS] position), so losses and gradients agree.
A query with no allowed key at all gets a finite average over the key blocks the kernel
visits (its logits all take the mask value): in a global layer (an all-padding unpacked row)
every block, so the mean of the row's values, exactly what the xla core gives; in a local
layer (a padded query with no real key within its window) the band's blocks, where the xla
cores average over other keys. The kernel's backward through such a query is not the
softmax's (its q and k gradients are not zero), so no loss may read it, and none does.

Sharding: under a mesh (`jax.set_mesh`, as training/sharding.activate does) the kernel runs in
a `jax.shard_map` with the batch and heads split as the logical rules map `batch` and
`heads` (by default (data, fsdp) and tensor), each shard attending its own heads. A batch the
batch axes do not divide (an eval remainder, 3 rows over 4 devices) is padded with empty rows
(segment 0 everywhere, zero values) up to their multiple and cut back after, so each device
attends only its own rows; heads the tensor axis does not divide stay whole on every device
(each computes all heads of its own rows). Without a mesh it runs as is.

Not covered by the kernel, and left to the caller (attention.py): dropout on the attention
probabilities, rows whose length is not a multiple of 128.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash_kernel, splash_attention_mask as splash_mask)
from jax.sharding import PartitionSpec as P

# Block sizes tried largest first; the row length must be a multiple of one (TPU lanes: 128).
BLOCKS = (512, 256, 128)


def block_size(length: int) -> int | None:
  """The largest of BLOCKS dividing `length`, or None (then splash cannot run the row)."""
  return next((b for b in BLOCKS if length % b == 0), None)


def _kernel(heads: int, length: int, half_window: int | None, block: int, interpret: bool):
  """One example's kernel over [heads, S, d], built in the trace that calls it (its mask
  tables become that trace's constants; the numpy work behind them, which grows with
  S² / block², is cached by splash_attention_mask_info._process_mask)."""
  shape = (length, length)
  if half_window is None:
    mask = splash_mask.FullMask(shape)
  else:
    mask = splash_mask.LocalMask(shape, window_size=(half_window, half_window), offset=0)
  sizes = splash_kernel.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
      block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  return splash_kernel.make_splash_mha(
      splash_mask.MultiHeadMask([mask] * heads), block_sizes=sizes, head_shards=1,
      q_seq_shards=1, interpret=interpret)


def segment_ids(groups: jax.Array, packed: bool) -> tuple[jax.Array, jax.Array]:
  """(query ids, key ids) [B, S] int32 from the token groups (attention.token_groups)."""
  kv = groups.astype(jnp.int32)
  return (kv, kv) if packed else (jnp.ones_like(kv), kv)


def _mesh_axes(logical: str, mesh) -> tuple[str, ...]:
  """The mesh axes the rules in scope map `logical` to (none without rules or a mesh)."""
  if mesh is None or mesh.empty:
    return ()
  try:
    spec = nn.logical_to_mesh_axes((logical,))
  except Exception:  # pylint: disable=broad-except  (no rules in scope)
    return ()
  axes = spec[0] if len(spec) else None
  names = (axes,) if isinstance(axes, str) else tuple(axes or ())
  return tuple(a for a in names if a in mesh.axis_names)


def _entry(axes: tuple[str, ...]):
  """`axes` as a PartitionSpec entry: None, one name or a tuple of names."""
  return None if not axes else axes if len(axes) > 1 else axes[0]


def _split(dim: int, axes: tuple[str, ...], mesh):
  """`axes` as a PartitionSpec entry if their sizes divide `dim`, else None (whole)."""
  if not axes or dim % math.prod(mesh.shape[a] for a in axes):
    return None
  return _entry(axes)


def _pad_rows(arrays, multiple: int):
  """The arrays with their leading (batch) dimension zero-padded to a multiple of `multiple`:
  zero segment ids and values make empty rows, attended by nothing real and cut off after."""
  pad = (-arrays[0].shape[0]) % multiple
  if not pad:
    return arrays
  return [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in arrays]


def splash_attention(q, k, v, groups, *, packed: bool, half_window: int | None = None,
                     interpret: bool = False):
  """q, k, v [B, S, heads, d] -> [B, S, heads, d]: softmax(q k^T / sqrt(d)) v over the keys
  of the row (`half_window=None`, global layers) or within |i - j| <= half_window (local
  layers), masked by the token `groups` as the module docstring says."""
  batch, length, heads, dim = q.shape
  block = block_size(length)
  if block is None:
    raise ValueError(f'splash attention needs rows of a multiple of 128 tokens, got {length}')
  scale = 1.0 / jnp.sqrt(jnp.float32(dim)).astype(q.dtype)  # as attention._softmax_attention
  q = q * scale
  q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, heads, S, d]
  q_ids, kv_ids = segment_ids(groups, packed)

  def attend(q, k, v, q_ids, kv_ids):
    kernel = _kernel(q.shape[1], length, half_window, block, interpret)
    return jax.vmap(kernel)(q, k, v, splash_kernel.SegmentIds(q_ids, kv_ids))

  mesh = jax.sharding.get_abstract_mesh()
  batch_axes = _mesh_axes('batch', mesh)
  head_axes = _split(heads, _mesh_axes('heads', mesh), mesh)
  if not batch_axes and head_axes is None:
    out = attend(q, k, v, q_ids, kv_ids)
  else:
    args = _pad_rows([q, k, v, q_ids, kv_ids],
                     math.prod(mesh.shape[a] for a in batch_axes))
    qkv_spec = P(_entry(batch_axes), head_axes, None, None)
    ids_spec = P(_entry(batch_axes), None)
    out = jax.shard_map(attend, mesh=mesh, in_specs=(qkv_spec,) * 3 + (ids_spec,) * 2,
                        out_specs=qkv_spec, check_vma=False)(*args)[:batch]
  return jnp.swapaxes(out, 1, 2)
