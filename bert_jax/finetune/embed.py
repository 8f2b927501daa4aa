"""Texts -> sentence embeddings with a start point, through the fine-tuning run's own pieces:
the sentence-embedding kind's featurising (its prompts and max_seq_length), its head and the
run setup's jitted predict step over the config's mesh (each batch's rows sharded over the
devices, bert_jax/finetune/program.py `predict_all`). Texts are featurised and embedded a
block at a time, so what a million-passage corpus costs beyond its [N, H] float32 embeddings
is one block's token arrays.

`Embedder(config)` serves the hard-negative miner (bert_jax/finetune/mine.py) and the BEIR
evaluation (bert_jax/finetune/beir_eval.py): `config` is configs/finetune.py:embedding's with
`init` (a workdir, a sentence-transformers or HF directory: `run.load_start`'s).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from bert_jax.convert import start_points
from bert_jax.finetune import kinds, program, run as finetune
from input_pipeline.finetune import pairs

BLOCK = 8192  # texts featurised at a time


class Embedder:
  """A start point's embeddings of queries and documents, as the embedding task computes them."""

  def __init__(self, config):
    self.config = config
    self.start = finetune.load_start(config)
    self.kind = kinds.get('sentence_embedding').configure(config.data)
    head = self.kind.make_head((), None)
    _, self.params = start_points.init_head_params(self.start, head, jax.random.key(0))
    self.setup = program.setup_for(config, self.start.cfg, head, self.kind, 1)
    self.batch = finetune.check_batch_sizes(config)

  def _embed(self, split: pairs.RetrievalSplit) -> np.ndarray:
    arrays, _ = self.kind.featurize(split, (), self.start.tokenizer, self.config.data,
                                    training=False)
    out = program.predict_all(self.setup.eval_step(), self.params, arrays, self.batch,
                              self.setup.mesh, self.config.data.length_buckets)
    return np.asarray(out['embeddings'][:, 0], np.float32)

  def embed(self, texts: Sequence[str], role: str) -> np.ndarray:
    """[N, H] float32 embeddings of `texts` as queries (`role='query'`: the query prompt) or
    documents ('document': the document prompt)."""
    if role not in ('query', 'document'):
      raise ValueError(f'role={role!r}: expected query or document')
    out = None
    for first in range(0, len(texts), BLOCK):
      block = list(texts[first:first + BLOCK])
      split = (pairs.RetrievalSplit(block, [], []) if role == 'query' else
               pairs.RetrievalSplit([], block, []))
      part = self._embed(split)
      if out is None:
        out = np.empty((len(texts), part.shape[1]), np.float32)
      out[first:first + len(block)] = part
    if out is None:
      return np.zeros((0, self.start.cfg.hidden_size), np.float32)
    return out
