"""Retrieval scores in numpy: BEIR's Recall@k, MRR@10 and nDCG@10, cosine scores, and a BM25
baseline.

The metrics are what BEIR's `EvaluateRetrieval.evaluate` / `evaluate_custom` report (through
pytrec_eval, i.e. trec_eval), for binary relevance:
  - recall@k: relevant documents among the top k / relevant documents, averaged over queries;
  - MRR@10: 1 / rank of the first relevant document within the top 10, else 0;
  - nDCG@10: sum over relevant documents in the top 10 of 1 / log2(rank + 1), divided by the
    same sum for the ideal ranking (the min(|relevant|, 10) best ranks).
With binary gains every metric is a function of the ranks of a query's relevant documents, so
those ranks are all we compute (no sort of the whole corpus). Ties are broken by document
index, lower first, so equal scores always give the same ranks (trec_eval breaks ties by
document name, in reverse: identical when scores differ, which float scores almost always do).
A query without a relevant document is an error: pytrec_eval would drop it silently.

The lexical baseline is BM25 from `bm25s` (Lucene's formula, Elasticsearch's defaults k1=1.2,
b=0.75, as BEIR's BM25 ran on Elasticsearch; lowercased words, English stopwords removed, no
stemming): the number a dense retriever has to beat.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METRICS = ('recall@1', 'recall@10', 'mrr@10', 'ndcg@10')
HEADLINE = 'ndcg@10'
BM25_K1, BM25_B = 1.2, 0.75  # Elasticsearch's (Lucene's BM25Similarity) defaults


def cosine_scores(query_emb, doc_emb) -> np.ndarray:
  """[Q, D] cosine similarities (float32), each vector divided by max(norm, 1e-12) as
  sentence-transformers' `cos_sim` does."""
  q, d = (np.asarray(x, np.float32) for x in (query_emb, doc_emb))
  if q.ndim != 2 or d.ndim != 2 or q.shape[1] != d.shape[1]:
    raise ValueError(f'expected [Q, H] and [D, H] embeddings, got {q.shape} and {d.shape}')
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
  return unit(q) @ unit(d).T


def relevant_ranks(scores=None, relevant: Sequence[set[int]] = (), *, ranking=None
                   ) -> list[np.ndarray]:
  """Per query, the 1-based ranks of its relevant documents (sorted; inf where `ranking`
  does not list one).

  Give `scores` [Q, D] (higher is better; ties go to the lower document index) or `ranking`
  [Q, K] (document indices, best first, e.g. a top-K search's output).
  """
  if (scores is None) == (ranking is None):
    raise ValueError('give scores [Q, D] or ranking [Q, K], not both')
  table = np.asarray(scores if ranking is None else ranking)
  if table.ndim != 2 or len(table) != len(relevant):
    raise ValueError(f'expected a [Q, D] array for {len(relevant)} queries, got {table.shape}')
  out = []
  for q, docs in enumerate(relevant):
    docs = np.array(sorted(docs), np.int64)
    if not len(docs):
      raise ValueError(f'query {q} has no relevant document; every query needs one')
    if ranking is None:
      row = table[q]
      if docs.max() >= len(row) or docs.min() < 0:
        raise ValueError(f'query {q}: relevant document {docs.max()} is not among the '
                         f'{len(row)} scored')
      s = row[docs]
      above = np.sum(row[None, :] > s[:, None], axis=1)
      tied_before = np.array([np.sum(row[:d] == v) for d, v in zip(docs, s)], np.int64)
      ranks = (above + tied_before + 1).astype(np.float64)
    else:
      position = {int(d): i + 1 for i, d in reversed(list(enumerate(table[q])))}
      ranks = np.array([position.get(int(d), np.inf) for d in docs], np.float64)
    out.append(np.sort(ranks))
  return out


def retrieval_metrics(scores=None, relevant: Sequence[set[int]] = (), *, ranking=None
                      ) -> dict[str, float]:
  """BEIR's recall@1, recall@10, MRR@10 and nDCG@10 (means over queries) and 'headline'
  (nDCG@10, BEIR's main number). Inputs as `relevant_ranks`."""
  per_query = {name: [] for name in METRICS}
  for ranks in relevant_ranks(scores, relevant, ranking=ranking):
    for k in (1, 10):
      per_query[f'recall@{k}'].append(np.sum(ranks <= k) / len(ranks))
    per_query['mrr@10'].append(1.0 / ranks[0] if ranks[0] <= 10 else 0.0)
    top = ranks[ranks <= 10]
    ideal = np.arange(1, min(len(ranks), 10) + 1)
    per_query['ndcg@10'].append(np.sum(1 / np.log2(top + 1)) / np.sum(1 / np.log2(ideal + 1)))
  out = {name: float(np.mean(values)) for name, values in per_query.items()}
  out['headline'] = out[HEADLINE]
  return out


def lexical_scores(queries: Sequence[str], corpus: Sequence[str], *, k1: float = BM25_K1,
                   b: float = BM25_B) -> np.ndarray:
  """[Q, D] BM25 scores of every corpus text for every query (float32)."""
  import bm25s  # pylint: disable=g-import-not-at-top  # only the baseline needs it
  if not len(corpus):
    raise ValueError('empty corpus: nothing to score')
  tokenize = lambda texts: bm25s.tokenize(list(texts), lower=True, stopwords='en',
                                          show_progress=False)
  # numpy backends: what an install without scipy or numba (requirements.txt) runs too.
  retriever = bm25s.BM25(method='lucene', k1=k1, b=b, backend='numpy', csc_backend='numpy')
  retriever.index(tokenize(corpus), show_progress=False)
  words = tokenize(queries)
  names = {i: w for w, i in words.vocab.items()}
  out = np.zeros((len(queries), len(corpus)), np.float32)
  for q, ids in enumerate(words.ids):
    known = retriever.get_tokens_ids([names[i] for i in ids])  # words the corpus has
    if known:  # else nothing matches: all zeros
      out[q] = retriever.get_scores_from_ids(known)
  return out
