"""Retrieval scores in numpy: BEIR's Recall@k, MRR@10 and nDCG@10, cosine scores, and a BM25
baseline. Runs score from each query's top 10 (`search.top_k`, `lexical_top_k`), never the
query x corpus matrix; the full-matrix functions (`cosine_scores`, `lexical_scores`) are the
reference the tests compare those with.

The metrics are what BEIR's `EvaluateRetrieval.evaluate` / `evaluate_custom` report (through
pytrec_eval, i.e. trec_eval), with relevance a set of documents (grade 1 each) or graded, a
{document: grade} dict as BEIR's qrels give it; a document is relevant when its grade is > 0:
  - recall@k: relevant documents among the top k / relevant documents, averaged over queries;
  - MRR@10: 1 / rank of the first relevant document within the top 10, else 0;
  - nDCG@10: sum over relevant documents in the top 10 of grade / log2(rank + 1), divided by
    the same sum for the ideal ranking (the grades sorted, best first, at ranks 1..10):
    trec_eval's `ndcg_cut`, whose gain is the grade itself.
Every metric is a function of the ranks (and grades) of a query's relevant documents, so those
ranks are all we compute (no sort of the whole corpus). Ties are broken by document index,
lower first, so equal scores always give the same ranks (trec_eval breaks ties by document
name, in reverse: identical when scores differ, which float scores almost always do).
A query without any judged document is an error (BEIR's loader drops such queries; pytrec_eval
would drop it silently); a query whose judged documents all have grade 0 scores 0 on every
metric, as trec_eval scores it.

The lexical baseline is BM25 from `bm25s` (Lucene's formula, Elasticsearch's defaults k1=1.2,
b=0.75, as BEIR's BM25 ran on Elasticsearch; lowercased words, English stopwords removed, no
stemming): the number a dense retriever has to beat.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METRICS = ('recall@1', 'recall@10', 'mrr@10', 'ndcg@10')
HEADLINE = 'ndcg@10'
RANK_DEPTH = 10  # the deepest rank any metric reads: a top-10 search scores them all
BM25_K1, BM25_B = 1.2, 0.75  # Elasticsearch's (Lucene's BM25Similarity) defaults


def cosine_scores(query_emb, doc_emb) -> np.ndarray:
  """[Q, D] cosine similarities (float32), each vector divided by max(norm, 1e-12) as
  sentence-transformers' `cos_sim` does."""
  q, d = (np.asarray(x, np.float32) for x in (query_emb, doc_emb))
  if q.ndim != 2 or d.ndim != 2 or q.shape[1] != d.shape[1]:
    raise ValueError(f'expected [Q, H] and [D, H] embeddings, got {q.shape} and {d.shape}')
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
  return unit(q) @ unit(d).T


def grades(judged) -> dict[int, float]:
  """A query's relevance as {document: grade}: a set means grade 1 each."""
  if isinstance(judged, dict):
    return {int(d): float(g) for d, g in judged.items()}
  return {int(d): 1.0 for d in judged}


def relevant_ranks(scores=None, relevant: Sequence = (), *, ranking=None) -> list[np.ndarray]:
  """Per query, the 1-based ranks of its relevant documents (grade > 0; sorted; inf where
  `ranking` does not list one).

  Give `scores` [Q, D] (higher is better; ties go to the lower document index) or `ranking`
  [Q, K] (document indices, best first, e.g. `search.top_k`'s). `relevant`: per query a set
  of documents or a {document: grade} dict.
  """
  return [np.sort(ranks) for ranks, _ in _ranked_gains(scores, relevant, ranking)]


def _ranked_gains(scores, relevant, ranking) -> list[tuple[np.ndarray, np.ndarray]]:
  """Per query, (ranks, grades) of its relevant documents, in document order."""
  if (scores is None) == (ranking is None):
    raise ValueError('give scores [Q, D] or ranking [Q, K], not both')
  table = np.asarray(scores if ranking is None else ranking)
  if table.ndim != 2 or len(table) != len(relevant):
    raise ValueError(f'expected a [Q, D] array for {len(relevant)} queries, got {table.shape}')
  out = []
  for q, judged in enumerate(relevant):
    graded = grades(judged)
    if not graded:
      raise ValueError(f'query {q} has no relevant document; every query needs one')
    positive = sorted(d for d, g in graded.items() if g > 0)
    docs = np.array(positive, np.int64)
    gains = np.array([graded[d] for d in positive], np.float64)
    if ranking is None:
      row = table[q]
      if len(docs) and (docs.max() >= len(row) or docs.min() < 0):
        raise ValueError(f'query {q}: relevant document {docs.max()} is not among the '
                         f'{len(row)} scored')
      s = row[docs]
      above = np.sum(row[None, :] > s[:, None], axis=1)
      tied_before = np.array([np.sum(row[:d] == v) for d, v in zip(docs, s)], np.int64)
      ranks = (above + tied_before + 1).astype(np.float64)
    else:
      position = {int(d): i + 1 for i, d in reversed(list(enumerate(table[q])))}
      ranks = np.array([position.get(int(d), np.inf) for d in docs], np.float64)
    out.append((ranks, gains))
  return out


def retrieval_metrics(scores=None, relevant: Sequence = (), *, ranking=None
                      ) -> dict[str, float]:
  """BEIR's recall@1, recall@10, MRR@10 and nDCG@10 (means over queries) and 'headline'
  (nDCG@10, BEIR's main number). Inputs as `relevant_ranks`."""
  per_query = {name: [] for name in METRICS}
  for ranks, gains in _ranked_gains(scores, relevant, ranking):
    if not len(ranks):  # judged, none relevant: trec_eval's zeros
      for name in METRICS:
        per_query[name].append(0.0)
      continue
    for k in (1, 10):
      per_query[f'recall@{k}'].append(np.sum(ranks <= k) / len(ranks))
    first = np.min(ranks)
    per_query['mrr@10'].append(1.0 / first if first <= 10 else 0.0)
    top = ranks <= 10
    ideal = np.sort(gains)[::-1][:10]
    per_query['ndcg@10'].append(np.sum(gains[top] / np.log2(ranks[top] + 1))
                                / np.sum(ideal / np.log2(np.arange(2, len(ideal) + 2))))
  out = {name: float(np.mean(values)) for name, values in per_query.items()}
  out['headline'] = out[HEADLINE]
  return out


def lexical_scores(queries: Sequence[str], corpus: Sequence[str], *, k1: float = BM25_K1,
                   b: float = BM25_B) -> np.ndarray:
  """[Q, D] BM25 scores of every corpus text for every query (float32)."""
  out = np.zeros((len(queries), len(corpus)), np.float32)
  for q, row in enumerate(lexical_rows(queries, corpus, k1=k1, b=b)):
    out[q] = row
  return out


def lexical_top_k(queries: Sequence[str], corpus: Sequence[str], k: int, **bm25
                  ) -> tuple[np.ndarray, np.ndarray]:
  """([Q, k] BM25 scores, [Q, k] corpus indices), best first, ties to the lower index; one
  query's [D] scores at a time, never the [Q, D] matrix."""
  k = min(k, len(corpus))
  scores, ids = np.zeros((len(queries), k), np.float32), np.zeros((len(queries), k), np.int64)
  for q, row in enumerate(lexical_rows(queries, corpus, **bm25)):
    ids[q] = top_k_row(row, k)
    scores[q] = row[ids[q]]
  return scores, ids


def top_k_row(row: np.ndarray, k: int) -> np.ndarray:
  """The indices of `row`'s k largest values, best first, ties to the lower index, in
  O(D + k log k): the k-th value splits the row, and its ties are taken in index order."""
  if k >= len(row):
    return np.lexsort((np.arange(len(row)), -row))
  threshold = np.partition(row, len(row) - k)[len(row) - k]
  above = np.flatnonzero(row > threshold)
  tied = np.flatnonzero(row == threshold)[:k - len(above)]
  chosen = np.concatenate([above, tied])
  return chosen[np.lexsort((chosen, -row[chosen]))]


def lexical_rows(queries: Sequence[str], corpus: Sequence[str], *, k1: float = BM25_K1,
                 b: float = BM25_B):
  """Per query, its [D] BM25 scores of every corpus text (float32), one query at a time."""
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
  for ids in words.ids:
    known = retriever.get_tokens_ids([names[i] for i in ids])  # words the corpus has
    # else nothing matches: all zeros
    yield (np.asarray(retriever.get_scores_from_ids(known), np.float32) if known else
           np.zeros(len(corpus), np.float32))
