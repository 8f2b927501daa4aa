"""The contrastive loss a sentence-embedding bi-encoder trains with.

`bert_jax.model.heads.pool` is sentence-transformers' `Pooling` (`mean`: the mean over real
tokens, summed in float32; `cls`: the first token), so an exported model (`bert_jax.convert.
sentence_transformers_export`) embeds a text as the fine-tuning run did.

`ranking_loss_sums` is sentence-transformers' `MultipleNegativesRankingLoss` in its default
form (6.2: `directions=('query_to_doc',)`, `partition_mode='joint'`, no hardness weighting):
each query's cosine similarity to every candidate of the batch, times `scale`, and the
cross-entropy of its own positive among them. The candidates are every row's positive and
every row's hard negatives, so each query has B - 1 in-batch negatives besides its own hard
ones.

Data parallelism: the jitted step sees the global batch, sharded over the data axis of the
mesh (GSPMD), so the [B, B·(R-1)] similarity spans every device's rows and each query is ranked
against the candidates of the whole global batch. That is what sentence-transformers gets
only with `gather_across_devices=True` (an all-gather of the embeddings); here XLA inserts
the all-gather itself, and the loss is the same on 1 or N devices.

`matryoshka_loss_sums` is sentence-transformers' `MatryoshkaLoss` over that loss (6.2,
sentence_transformer/losses/matryoshka.py, all dimensions every step): the weighted sum of the
loss at each leading `dim` of the embeddings, each truncation re-normalized (their `shrink`:
`F.normalize(x[..., :dim])`, which the cosine here does). Over the cached loss
(finetune/grad_cache.py) it is the same function of the cached embeddings, as their
`CachedLossDecorator` applies it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# A masked logit: exp() underflows to 0 next to any real one (|cosine·scale| <= scale),
# while staying finite, so a padding query's row gives no NaN to multiply by its zero weight.
_MASKED = -1e9
# torch.nn.functional.normalize's eps, which sentence-transformers' cos_sim uses.
_NORM_EPS = 1e-12


def normalize(x: jax.Array) -> jax.Array:
  """x / max(||x||, 1e-12) along the last axis (torch's `F.normalize`); the square root is
  taken of the clamped squared norm, so a zero vector has a zero gradient, not NaN."""
  x = x.astype(jnp.float32)
  squared = jnp.sum(x * x, axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(squared, _NORM_EPS ** 2))


def ranking_loss_sums(embeddings: jax.Array, weights: jax.Array, scale: float = 20.0
                      ) -> tuple[jax.Array, jax.Array]:
  """(sum of weight · cross-entropy over queries, sum of weights): MultipleNegativesRankingLoss.

  `embeddings` [B, R, H]: per row the query (column 0), its positive (1) and R - 2 hard
  negatives (2 ..). `weights` [B]: 0 marks a padding row, which is neither a query nor a
  candidate (its positive and negatives are masked out of every other row's softmax). The
  caller divides the sums, over one batch or over accumulated micro-batches. Over a sharded
  batch the candidates are the global batch's (see the module docstring).
  """
  batch, columns = embeddings.shape[:2]
  if columns < 2:
    raise ValueError(f'embeddings have {columns} column(s) per row; need the query and its '
                     'positive (and optionally hard negatives): [B, 2 + negatives, H]')
  unit = normalize(embeddings)
  queries = unit[:, 0]  # [B, H]
  # Candidates column-major as sentence-transformers concatenates them: all positives, then
  # each negative column. Candidate j·B + i belongs to row i.
  candidates = jnp.swapaxes(unit[:, 1:], 0, 1).reshape((columns - 1) * batch, -1)
  logits = scale * jnp.einsum('bh,ch->bc', queries, candidates,
                              precision=jax.lax.Precision.HIGHEST)
  real = weights > 0
  logits = jnp.where(jnp.tile(real, columns - 1)[None, :], logits, _MASKED)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  positive = jnp.diagonal(logits[:, :batch])
  weights = weights.astype(jnp.float32)
  loss = jnp.where(real, weights * (log_z - positive), 0.0)
  return jnp.sum(loss), jnp.sum(weights)


def matryoshka_loss_sums(embeddings: jax.Array, weights: jax.Array, scale: float,
                         dims: tuple[tuple[int, float], ...]) -> tuple[jax.Array, jax.Array]:
  """(sum over (dim, weight) of weight · `ranking_loss_sums` at the first `dim` features, the
  sum of row weights); no `dims`: the full embedding's loss alone."""
  if not dims:
    return ranking_loss_sums(embeddings, weights, scale)
  width = embeddings.shape[-1]
  total = 0.0
  for dim, dim_weight in dims:
    if not 0 < dim <= width:
      raise ValueError(f'data.matryoshka_dims: {dim} is not in 1..{width}, the model\'s '
                       'embedding width')
    loss, weight = ranking_loss_sums(embeddings[..., :dim], weights, scale)
    total = total + dim_weight * loss
  return total, weight
