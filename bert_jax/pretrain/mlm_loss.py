"""The MLM loss without the whole [B, P, V] float32 logits: the tied decoder projection, the
softmax cross-entropy and the argmax accuracy, `chunk` masked positions of every row at a time.

`model.mlm_loss_chunk=C` (pre-training configs) splits each row's P predictions into
ceil(P / C) chunks of at most C positions (the last padded with weight-0 positions) and runs
them in a `lax.scan` whose body is under `jax.checkpoint`: the forward keeps only each chunk's
two sums, the backward recomputes one chunk's logits [B, C, V] at a time. Peak memory of the
head is then B·C·V floats instead of B·P·V (ModernBERT at 8,192 tokens: P = 2,458 predictions
a row and V = 50,368 are 495 MB of float32 logits a row, and as much again for their
gradient), for one more decoder matmul in the backward (2·B·P·H·V FLOPs).

Numerically it is the unchunked loss: every logit is the same einsum of the same operands
(`encoder.tied_decoder`), the cross-entropy and argmax are per position over the whole
vocabulary, and only the order of the final sums changes (float32 round-off). Chunks split
positions, not rows, so the batch axis keeps its sharding and a vocabulary sharded over the
`tensor` axis is reduced as in the unchunked loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from bert_jax.model.encoder import tied_decoder


def full_sums(logits, labels, weights) -> tuple[jax.Array, jax.Array]:
  """(Σ w·xent, Σ w·[argmax = label]) from whole logits [B, P, V]."""
  xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  hit = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return jnp.sum(weights * xent), jnp.sum(weights * hit)


def chunked_sums(hidden, table, bias, labels, weights, chunk: int
                 ) -> tuple[jax.Array, jax.Array]:
  """`full_sums(tied_decoder(hidden, table, bias), labels, weights)`, `chunk` positions of
  each row at a time under `jax.checkpoint`. hidden [B, P, H], table [V, H], bias [V],
  labels and weights [B, P]."""
  if chunk <= 0:
    raise ValueError(f'model.mlm_loss_chunk={chunk}: must be > 0 to chunk (0 = off)')
  b, p, h = hidden.shape
  n = -(-p // chunk)
  c = -(-p // n)  # the same number of chunks with the least padding
  pad = n * c - p
  weights = weights.astype(jnp.float32)
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    labels = jnp.pad(labels, ((0, 0), (0, pad)))
    weights = jnp.pad(weights, ((0, 0), (0, pad)))
  # [B, n·c, ...] -> [n, B, c, ...]: scan over chunks, rows (and their sharding) untouched.
  split = lambda x: jnp.swapaxes(x.reshape((b, n, c) + x.shape[2:]), 0, 1)

  @jax.checkpoint
  def chunk_sums(table, bias, h_c, labels_c, w_c):
    return full_sums(tied_decoder(h_c, table, bias), labels_c, w_c)

  def body(carry, xs):
    loss, hits = chunk_sums(table, bias, *xs)
    return (carry[0] + loss, carry[1] + hits), None

  zero = jnp.zeros((), jnp.float32)
  (loss, hits), _ = jax.lax.scan(body, (zero, zero),
                                 (split(hidden), split(labels), split(weights)))
  return loss, hits
