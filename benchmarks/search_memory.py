r"""Exact top-k search over a million-passage corpus on this machine: time and peak memory.

  .venv/bin/python -m benchmarks.search_memory [--passages=1000000] [--dim=384] [--queries=1000]

The corpus is random unit vectors of MiniLM-L6's width (384), made in place in one float32
array (no float64 temporary); the queries likewise. `bert_jax.finetune.search.top_k` (k=10)
scores them in chunks (16,384 passages x 1,024 queries a step) and keeps only each query's top
10. Prints the search's seconds, the process's peak resident size (ru_maxrss), the corpus
array's size and the peak before the search (Python, JAX with the search compiled, and the
corpus), so the search's own share is the difference; run it with two query counts to see
that share does not grow with them. The full-matrix path would hold queries x passages float32
scores (4 GB per 1,000 queries of a million passages).
"""

from __future__ import annotations

import resource
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer('passages', 1_000_000, 'Corpus rows.')
flags.DEFINE_integer('dim', 384, 'Embedding width.')
flags.DEFINE_integer('queries', 1000, 'Query rows.')
flags.DEFINE_integer('k', 10, 'Results per query.')


def unit_rows(n: int, dim: int, seed: int, block: int = 65536):
  """[n, dim] float32 random unit vectors, filled block by block in one array."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  out = np.empty((n, dim), np.float32)
  for first in range(0, n, block):
    part = out[first:first + block]
    rng.standard_normal(part.shape, dtype=np.float32, out=part)
    part /= np.linalg.norm(part, axis=1, keepdims=True)
  return out


def peak_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv):
  del argv
  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import search  # pylint: disable=g-import-not-at-top
  corpus = unit_rows(FLAGS.passages, FLAGS.dim, 0)
  queries = unit_rows(FLAGS.queries, FLAGS.dim, 1)
  search.top_k(queries[:8], corpus[:search.CHUNK], FLAGS.k)  # compile outside the timing
  before = peak_mib()
  start = time.perf_counter()
  scores, ids = search.top_k(queries, corpus, FLAGS.k)
  seconds = time.perf_counter() - start
  print(harness.machine())
  print(f'{FLAGS.passages:,} passages x {FLAGS.dim} (corpus {corpus.nbytes / 2**20:,.0f} MiB), '
        f'{FLAGS.queries:,} queries, top {FLAGS.k}: {seconds:.1f} s '
        f'({FLAGS.queries / seconds:,.0f} queries/s); peak RSS {peak_mib():,.0f} MiB '
        f'(before the search, after its compile: {before:,.0f} MiB); top score '
        f'{scores[:, 0].mean():.3f} mean, ids {ids.shape}')


if __name__ == '__main__':
  app.run(main)
