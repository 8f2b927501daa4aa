"""Sentence embeddings for search and retrieval: a bi-encoder (every text its own encoder row,
its token states pooled: `mean` or `cls`, `data.pooling`) trained contrastively with in-batch
negatives and optional hard negatives, sentence-transformers' MultipleNegativesRankingLoss
with its scale (`data.similarity_scale`, 20); bert_jax/finetune/contrastive.py. With
`data.embed_chunk` rows the batch is embedded a chunk at a time and the gradient cached
(GradCache, sentence-transformers' CachedMultipleNegativesRankingLoss; finetune/grad_cache.py):
the same loss and gradients, every query still ranked against the whole global batch, with one
chunk's activations in memory. `data.matryoshka_dims` (and `_weights`) sum the loss over leading
dimensions (sentence-transformers' MatryoshkaLoss), and each split is also scored at each of them.

Training rows are (query, positive[, negative]) from input_pipeline/finetune/pairs.py, as
[batch, texts, tokens] arrays; each text is tokenized alone (`[CLS] text [SEP]`, cut to
max_seq_length), as sentence-transformers tokenizes it, after its prompt: `data.query_prompt`
before every query, `data.document_prompt` before every positive, negative and corpus text
(E5's 'query: ' / 'passage: '), as sentence-transformers prepends a prompt. An evaluation split
is a retrieval task (its queries, the corpus of every positive and negative text, the relevant
documents per query), searched by cosine similarity for each query's top 10 in chunks
(bert_jax/finetune/search.py: never the whole score matrix) and scored with BEIR's
recall@1/10, MRR@10 and nDCG@10 (the headline; and per Matryoshka dimension,
`<metric>@<dim>d`), next to BM25 on the same split as the lexical baseline. The export is a
sentence-transformers directory (`SentenceTransformer(path)` loads it, `truncate_dim=<dim>` for
a Matryoshka dimension) with the pooling trained and the prompts as its `query` and `document`
prompts.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from bert_jax.convert import sentence_transformers_export
from bert_jax.finetune import contrastive, grad_cache, retrieval, search
from bert_jax.finetune.kinds import base
from bert_jax.model import heads
from input_pipeline.finetune import pairs, task_arrays
from input_pipeline.finetune.records import Example


@dataclasses.dataclass(frozen=True, eq=True)
class SentenceEmbedding(base.TaskKind):
  pooling: str = 'mean'
  scale: float = 20.0
  max_seq_length: int = 128
  query_prompt: str = ''
  document_prompt: str = ''
  embed_chunk: int = 0  # rows of the global batch embedded at a time; 0: all at once
  matryoshka: tuple[tuple[int, float], ...] = ()  # (dim, weight), largest dim first

  name = 'sentence_embedding'
  baseline_name = 'BM25'
  head_task = heads.EMBEDDING
  headline = retrieval.HEADLINE
  has_label_list = False

  def configure(self, d) -> 'SentenceEmbedding':
    if d.embed_chunk < 0:
      raise ValueError(f'data.embed_chunk={d.embed_chunk}: expected 0 (the whole batch at once) '
                       'or the rows of the global batch to embed at a time')
    return SentenceEmbedding(d.pooling, float(d.similarity_scale), d.max_seq_length,
                             d.query_prompt, d.document_prompt, int(d.embed_chunk),
                             matryoshka_dims(d))

  def schema(self) -> base.BatchSchema:
    return base.rows_schema(base.ArraySpec('label_weights', ('batch',), jnp.float32),
                            row_axes=('batch', 'texts', 'tokens'), sizes=(('texts', 2),))

  def make_head(self, labels, classifier_dropout):
    return heads.Head(heads.EMBEDDING, pooling=self.pooling)

  def featurize(self, records, labels, tokenizer, d, training, source=''):
    """Training pairs -> [N, texts, S]; a retrieval split -> its queries then its corpus as
    [Q + D, 1, S] (embedded one text a row)."""
    q, doc = self.query_prompt, self.document_prompt
    if isinstance(records, pairs.RetrievalSplit):
      texts = [[q + t for t in records.queries] + [doc + t for t in records.corpus]]
    else:
      texts = [[q + p.query for p in records], [doc + p.positive for p in records]]
      if records and records[0].negative is not None:
        texts.append([doc + p.negative for p in records])
    columns = [task_arrays.classification_features(
        [Example(str(i), t, None, None, i) for i, t in enumerate(column)], tokenizer,
        d.max_seq_length, None) for column in texts]
    arrays = {k: np.stack([c[k] for c in columns], axis=1) for k in base.MODEL_INPUTS}
    if not isinstance(records, pairs.RetrievalSplit):
      arrays['label_weights'] = np.ones(len(records), np.float32)
    return arrays, None

  def loss_sums(self, outputs, batch):
    return contrastive.matryoshka_loss_sums(outputs, batch['label_weights'], self.scale,
                                            self.matryoshka)

  def value_and_grad(self, forward, params, batch, key):
    if not self.embed_chunk:
      return super().value_and_grad(forward, params, batch, key)
    inputs = {k: batch[k] for k in base.MODEL_INPUTS}
    return grad_cache.value_and_grad(forward, lambda e: self.mean_loss(e, batch), params,
                                     inputs, key, self.embed_chunk, 'data.embed_chunk')

  def readout(self, outputs):
    return {'embeddings': outputs}

  def predictions(self, task, split, outputs):
    """[Q, 10] corpus indices, best first: each query's top 10 by cosine similarity."""
    embeddings = outputs['embeddings'][:, 0]
    q = len(split.records.queries)
    return search.top_k(embeddings[:q], embeddings[q:], retrieval.RANK_DEPTH)[1]

  def score(self, task, split, outputs):
    """The retrieval metrics of the whole embedding and, `<metric>@<dim>d`, of each smaller
    Matryoshka dimension (its leading features, re-normalized by the cosine)."""
    scores = super().score(task, split, outputs)
    width = outputs['embeddings'].shape[-1]
    for dim, _ in self.matryoshka:
      if dim < width:
        cut = {'embeddings': outputs['embeddings'][..., :dim]}
        at_dim = super().score(task, split, cut)
        scores.update({f'{k}@{dim}d': v for k, v in at_dim.items() if k in retrieval.METRICS})
    return scores

  def score_predictions(self, task, split, predictions):
    return retrieval.retrieval_metrics(ranking=predictions, relevant=split.records.relevant)

  def baseline(self, task, split):
    r = split.records
    _, ranking = retrieval.lexical_top_k(r.queries, r.corpus, retrieval.RANK_DEPTH)
    return retrieval.retrieval_metrics(ranking=ranking, relevant=r.relevant)

  def export(self, directory, start, head, params):
    """A sentence-transformers directory; a Matryoshka run's names its dimensions."""
    sentence_transformers_export.save_sentence_transformer(
        directory, start.cfg, params, start.tokenizer, pooling=head.pooling, overwrite=True,
        max_seq_length=self.max_seq_length,
        prompts={'query': self.query_prompt, 'document': self.document_prompt},
        matryoshka_dims=tuple(dim for dim, _ in self.matryoshka))


def matryoshka_dims(d) -> tuple[tuple[int, float], ...]:
  """`data.matryoshka_dims` / `_weights` as (dim, weight) pairs, largest dim first (as
  sentence-transformers' MatryoshkaLoss sorts them); weights default to 1 each."""
  dims, weights = tuple(d.matryoshka_dims), tuple(d.matryoshka_weights)
  if not dims:
    if weights:
      raise ValueError('data.matryoshka_weights is set without data.matryoshka_dims')
    return ()
  if any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in dims) or (
      len(set(dims)) != len(dims)):
    raise ValueError(f'data.matryoshka_dims={dims}: expected distinct positive dimensions, e.g. '
                     '(768,256,64)')
  weights = weights or (1.0,) * len(dims)
  if len(weights) != len(dims):
    raise ValueError(f'data.matryoshka_weights={weights}: one weight per dimension of '
                     f'data.matryoshka_dims={dims}, or () for 1 each')
  return tuple(sorted(((dim, float(w)) for dim, w in zip(dims, weights)), reverse=True))
