"""Gradient accumulation inside one jitted step, for every pre-training objective (MLM + NSP/SOP
in step.py, replaced-token detection in rtd.py).

The global batch is split into `accum_steps` micro-batches scanned in order; the loss function
normalises by the whole batch's weights (computed before the split), so the summed gradients
are the full-batch gradient, not an average of per-micro-batch means. Micro-batch i draws its
dropout (and sampling) keys from fold_in(key, i).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def micro_batches(batch, accum_steps: int):
  """[B, ...] -> [A, B/A, ...] with micro-batch i = rows i, i+A, ...: every micro-batch is
  spread over all devices, since each device holds a contiguous block of rows."""

  def split(x):
    b = x.shape[0]
    if b % accum_steps:
      raise ValueError(f'per-step batch {b} is not divisible by accum_steps={accum_steps}')
    return jnp.swapaxes(x.reshape((b // accum_steps, accum_steps) + x.shape[1:]), 0, 1)

  return jax.tree_util.tree_map(split, batch)


def grads_and_sums(grad_fn, params, batch, key, accum_steps: int = 1):
  """(gradients, loss sums) of `grad_fn(params, batch, key) -> (grads, sums)` over the whole
  batch, `accum_steps` micro-batches at a time."""
  if accum_steps == 1:
    return grad_fn(params, batch, key)

  def body(acc, xs):
    micro, i = xs
    g, s = grad_fn(params, micro, jax.random.fold_in(key, i))
    return jax.tree_util.tree_map(jnp.add, acc, (g, s)), None

  zeros = jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(
      grad_fn, params, jax.tree_util.tree_map(lambda x: x[:1], batch), key))
  (grads, sums), _ = jax.lax.scan(
      body, zeros, (micro_batches(batch, accum_steps), jnp.arange(accum_steps)))
  return grads, sums
