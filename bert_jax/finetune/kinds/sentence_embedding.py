"""Sentence embeddings for search and retrieval: a bi-encoder (every text its own encoder row,
its token states pooled: `mean` or `cls`, `data.pooling`) trained contrastively with in-batch
negatives and optional hard negatives, sentence-transformers' MultipleNegativesRankingLoss
with its scale (`data.similarity_scale`, 20); bert_jax/finetune/contrastive.py.

Training rows are (query, positive[, negative]) from input_pipeline/finetune/pairs.py, as
[batch, texts, tokens] arrays; each text is tokenized alone (`[CLS] text [SEP]`, cut to
max_seq_length), as sentence-transformers tokenizes it, after its prompt: `data.query_prompt`
before every query, `data.document_prompt` before every positive, negative and corpus text
(E5's 'query: ' / 'passage: '), as sentence-transformers prepends a prompt. An evaluation split
is a retrieval task (its queries, the corpus of every positive and negative text, the relevant
documents per query), searched by cosine similarity for each query's top 10 in chunks
(bert_jax/finetune/search.py: never the whole score matrix) and scored with BEIR's
recall@1/10, MRR@10 and nDCG@10 (the headline), next to BM25 on the same split as the lexical
baseline. The export is a sentence-transformers directory (`SentenceTransformer(path)` loads
it) with the pooling trained and the prompts as its `query` and `document` prompts.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from bert_jax.convert import sentence_transformers_export
from bert_jax.finetune import contrastive, retrieval, search
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

  name = 'sentence_embedding'
  baseline_name = 'BM25'
  head_task = heads.EMBEDDING
  headline = retrieval.HEADLINE
  has_label_list = False

  def configure(self, d) -> 'SentenceEmbedding':
    return SentenceEmbedding(d.pooling, float(d.similarity_scale), d.max_seq_length,
                             d.query_prompt, d.document_prompt)

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
    return contrastive.ranking_loss_sums(outputs, batch['label_weights'], self.scale)

  def readout(self, outputs):
    return {'embeddings': outputs}

  def predictions(self, task, split, outputs):
    """[Q, 10] corpus indices, best first: each query's top 10 by cosine similarity."""
    embeddings = outputs['embeddings'][:, 0]
    q = len(split.records.queries)
    return search.top_k(embeddings[:q], embeddings[q:], retrieval.RANK_DEPTH)[1]

  def score_predictions(self, task, split, predictions):
    return retrieval.retrieval_metrics(ranking=predictions, relevant=split.records.relevant)

  def baseline(self, task, split):
    r = split.records
    _, ranking = retrieval.lexical_top_k(r.queries, r.corpus, retrieval.RANK_DEPTH)
    return retrieval.retrieval_metrics(ranking=ranking, relevant=r.relevant)

  def export(self, directory, start, head, params):
    sentence_transformers_export.save_sentence_transformer(
        directory, start.cfg, params, start.tokenizer, pooling=head.pooling, overwrite=True,
        max_seq_length=self.max_seq_length,
        prompts={'query': self.query_prompt, 'document': self.document_prompt})
