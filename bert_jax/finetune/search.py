"""Exact top-k cosine search over a corpus of embeddings in bounded memory.

`top_k(queries, corpus, k)` returns, per query, the k best corpus rows by cosine similarity
(each vector divided by max(norm, 1e-12), as `retrieval.cosine_scores` and sentence-transformers'
`cos_sim`) without ever holding the [Q, D] score matrix: the corpus is read in chunks of
`chunk` rows (the outer loop, so each chunk goes to the devices once), each query block's
scores against the chunk ([query_block, chunk]) are merged into its running top k by one jitted
program, and only the [Q, k] results persist. What the search adds to the embeddings it is
given is one corpus chunk, one score block and the [Q, k] results: linear in the corpus, and
for a fixed block size independent of the query count. A query block is spread over the
devices (its rows sharded, the chunk replicated), so on a pod every chip scores its own rows.

Ties go to the lower corpus index, as `retrieval.relevant_ranks` breaks them, so the ranks
equal the full-matrix path's: `lax.top_k` puts the lower-index element of equal ones first,
and the running top k (all earlier, lower indices) is placed before the chunk's candidates.
Scores use full float32 products (`Precision.HIGHEST`: a TPU's default would round to bf16).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.finetune import contrastive

CHUNK = 16384  # corpus rows a step scores
QUERY_BLOCK = 1024  # query rows a step scores; the score block is QUERY_BLOCK x CHUNK floats
_EMPTY = -jnp.inf  # a slot not yet filled (a corpus shorter than k) or a padding column


@functools.partial(jax.jit, static_argnames=('k',))
def _merge(best_scores, best_ids, queries, chunk, offset, valid, *, k):
  """The running top k ([B, k] scores and corpus ids) merged with a chunk's candidates.
  `chunk` [C, H] holds corpus rows offset .. offset + valid - 1, then zero padding."""
  scores = jnp.einsum('bh,ch->bc', contrastive.normalize(queries), contrastive.normalize(chunk),
                      precision=jax.lax.Precision.HIGHEST)
  columns = jnp.arange(chunk.shape[0])
  scores = jnp.where(columns[None, :] < valid, scores, _EMPTY)
  ids = jnp.broadcast_to((offset + columns)[None, :], scores.shape)
  scores, where = jax.lax.top_k(jnp.concatenate([best_scores, scores], axis=1), k)
  return scores, jnp.take_along_axis(jnp.concatenate([best_ids, ids], axis=1), where, axis=1)


def top_k(queries, corpus, k: int, *, chunk: int = CHUNK, query_block: int = QUERY_BLOCK,
          devices=None) -> tuple[np.ndarray, np.ndarray]:
  """([Q, k] cosine scores, [Q, k] corpus indices), best first, k cut to the corpus size.

  `queries` [Q, H] and `corpus` [D, H]: any arrays (a numpy memmap works: only a chunk of it
  is read at a time). `devices`: those a query block is sharded over (default all local).
  """
  q = np.asarray(queries, np.float32)
  if q.ndim != 2 or corpus.ndim != 2 or q.shape[1] != corpus.shape[1]:
    raise ValueError(f'expected [Q, H] queries and [D, H] corpus embeddings, got {q.shape} and '
                     f'{tuple(corpus.shape)}')
  if k < 1 or chunk < 1 or query_block < 1:
    raise ValueError(f'k={k}, chunk={chunk}, query_block={query_block}: each must be >= 1')
  n, size = len(q), len(corpus)
  k = min(k, size)
  if not n or not k:
    return np.zeros((n, k), np.float32), np.zeros((n, k), np.int64)
  devices = list(devices or jax.local_devices())
  chunk = min(chunk, size)
  # Blocks of whole device rows; the last block is padded with zero queries (dropped below).
  block = -(-min(query_block, n) // len(devices)) * len(devices)
  rows = NamedSharding(Mesh(np.array(devices), ('data',)), P('data'))
  blocks = []
  for first in range(0, n, block):
    part = q[first:first + block]
    part = np.pad(part, ((0, block - len(part)), (0, 0)))
    blocks.append([jax.device_put(part, rows),
                   jax.device_put(np.full((block, k), -np.inf, np.float32), rows),
                   jax.device_put(np.full((block, k), -1, np.int32), rows)])
  replicated = NamedSharding(rows.mesh, P())
  pending = None
  for offset in range(0, size, chunk):
    part = np.asarray(corpus[offset:offset + chunk], np.float32)
    valid = len(part)
    part = jax.device_put(np.pad(part, ((0, chunk - valid), (0, 0))), replicated)
    for b in blocks:
      b[1], b[2] = _merge(b[1], b[2], b[0], part, np.int32(offset), np.int32(valid), k=k)
    # Dispatch is asynchronous: without a wait every chunk would be copied in before the
    # first is scored (the whole corpus twice). The next chunk is prepared while this runs.
    if pending is not None:
      jax.block_until_ready(pending)
    pending = [b[1] for b in blocks]
  scores = np.concatenate([np.asarray(b[1]) for b in blocks])[:n]
  ids = np.concatenate([np.asarray(b[2]) for b in blocks])[:n].astype(np.int64)
  return scores, ids
