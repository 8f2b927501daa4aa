"""GradCache (Gao et al. 2021, arXiv 2101.06983): the exact gradient of a loss that couples
every row of a batch (the contrastive loss ranks each query against every row's texts) with
the activations of one chunk of rows alive at a time, so the batch is not bounded by what one
forward-and-backward pass holds.

sentence-transformers' `CachedMultipleNegativesRankingLoss` (6.2: `CachedLossMixin.
forward_cached` and `_backward_hook` in sentence_transformers/base/losses/gradcache.py) in three
steps, here inside the one jitted train step:
  1. embed the batch chunk by chunk (`lax.scan`), keeping only the embeddings;
  2. the loss over all of them and its gradient with respect to every embedding. Under `jit`
     over the mesh the embeddings are one global array, so every device's rows are every
     query's candidates (their `gather_across_devices=True`, without a gather in our code);
  3. embed each chunk again under `jax.vjp` with the same dropout key as in step 1 (their
     `RandContext` replay: the same masks, so the cached gradients belong to the embeddings they
     are pulled back through) and add the chunks' parameter gradients (a second `lax.scan`).
The loss and gradients are autodiff's through one forward of the same chunks with the same keys,
to float32 round-off (tests/test_grad_cache.py), for one extra forward pass (~1/3 more FLOPs).

This is also the gradient accumulation of a contrastive run: accumulating micro-batches would
limit each query's negatives to its micro-batch, where here they are always the whole batch.

Chunk i holds rows i, i + A, i + 2A, ... (A chunks), as pre-training splits its micro-batches
(bert_jax/pretrain/step.py): each device holds a contiguous block of the batch's rows, so every
chunk is spread over all of them.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def chunk_count(batch: int, chunk_rows: int, field: str = 'chunk_rows') -> int:
  """How many chunks of `chunk_rows` a batch of `batch` rows splits into."""
  if chunk_rows < 1 or batch % chunk_rows:
    raise ValueError(f'{field}={chunk_rows} does not divide the global batch of {batch} rows '
                     '(train.global_batch_size); choose a divisor of it that is a multiple of '
                     'the data x fsdp devices, or 0 to embed the whole batch at once')
  return batch // chunk_rows


def split(tree, chunks: int):
  """[B, ...] -> [A, B/A, ...], chunk i = rows i, i + A, ... (see the module docstring)."""
  def one(x):
    return jnp.swapaxes(x.reshape((x.shape[0] // chunks, chunks) + x.shape[1:]), 0, 1)
  return jax.tree_util.tree_map(one, tree)


def merge(tree):
  """The inverse of `split`: [A, B/A, ...] -> [B, ...] in the batch's row order."""
  def one(x):
    return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])
  return jax.tree_util.tree_map(one, tree)


def value_and_grad(embed: Callable[[Any, Any, jax.Array], jax.Array],
                   loss: Callable[[jax.Array], jax.Array], params, inputs, key: jax.Array,
                   chunk_rows: int, field: str = 'chunk_rows') -> tuple[jax.Array, Any]:
  """(loss(E), dloss/dparams) with E the whole batch's embeddings, never holding more than one
  chunk's activations.

  `embed(params, chunk_inputs, chunk_key)` -> the chunk's embeddings ([rows, ...]);
  `inputs`: arrays with the batch's rows first; chunk i draws its dropout from
  `fold_in(key, i)` in both passes. `loss(E)` sees E in the batch's row order.
  """
  batch = jax.tree_util.tree_leaves(inputs)[0].shape[0]
  chunks = chunk_count(batch, chunk_rows, field)
  pieces, index = split(inputs, chunks), jnp.arange(chunks)
  frozen = jax.lax.stop_gradient(params)

  def forward(_, xs):
    piece, i = xs
    return None, embed(frozen, piece, jax.random.fold_in(key, i))

  _, embeddings = jax.lax.scan(forward, None, (pieces, index))
  value, cached = jax.value_and_grad(loss)(merge(embeddings))

  def backward(total, xs):
    piece, i, grad = xs
    _, pull = jax.vjp(lambda p: embed(p, piece, jax.random.fold_in(key, i)), params)
    return jax.tree_util.tree_map(jnp.add, total, pull(grad)[0]), None

  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  grads, _ = jax.lax.scan(backward, zeros, (pieces, index, split(cached, chunks)))
  return value, grads
