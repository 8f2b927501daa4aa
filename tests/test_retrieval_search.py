"""Retrieval in bounded memory: the chunked exact top-k search against the full score matrix
(bert_jax/finetune/search.py vs retrieval.cosine_scores), and a BEIR-format set read and
scored with graded relevance against an independent NumPy nDCG@10 written from trec_eval's
`ndcg_cut` (gain = grade, discount log2(rank + 1), ideal = grades sorted; pytrec_eval is what
BEIR calls, not installed here)."""

import json
import math

import numpy as np
import pytest

from bert_jax.finetune import retrieval, search
from input_pipeline.finetune import beir


def full_matrix_ranking(queries, corpus, k):
  """The reference: every score, sorted best first, ties to the lower index."""
  scores = retrieval.cosine_scores(queries, corpus)
  return np.stack([np.lexsort((np.arange(len(row)), -row))[:k] for row in scores])


def test_chunked_top_k_equals_the_full_matrix_with_ties_broken_by_index():
  rng = np.random.default_rng(0)

  def signs(n, nonzero):
    """Rows of `nonzero` entries +-1 (norm 2 or 4): every cosine between them is a multiple
    of 1/16, exact in any summation order, so equal scores are equal in every path."""
    out = np.zeros((n, 16), np.float32)
    for row in out:
      row[rng.choice(16, nonzero, replace=False)] = rng.choice([-1, 1], nonzero)
    return out

  # Gaussian documents (distinct scores) and +-1 documents scaled by powers of two (which
  # normalising undoes exactly): many exact ties, across chunks and within them.
  corpus = np.concatenate([rng.standard_normal((30, 16)), signs(20, 4) * 2.0 ** rng.integers(
      -1, 3, (20, 1)), signs(20, 16)]).astype(np.float32)[rng.permutation(70)]
  corpus[5] = 0.0  # a zero vector scores 0, as cos_sim's clamped norm gives it
  queries = signs(13, 4)
  want = full_matrix_ranking(queries, corpus, 12)
  for chunk, block in ((9, 4), (70, 13), (1000, 3)):  # chunks smaller than the corpus, one, >
    scores, ids = search.top_k(queries, corpus, 12, chunk=chunk, query_block=block)
    np.testing.assert_array_equal(ids, want, err_msg=f'chunk={chunk}')
    full = retrieval.cosine_scores(queries, corpus)
    np.testing.assert_allclose(scores, np.take_along_axis(full, want, 1), atol=1e-6)
    assert np.all(np.diff(scores, axis=1) <= 0)
    assert any(len(set(s)) < len(s) for s in scores)  # exact ties were exercised

  # The metrics from the search's top 10 are the full matrix's.
  relevant = [{int(i) for i in rng.choice(70, 3, replace=False)} for _ in range(13)]
  _, top10 = search.top_k(queries, corpus, 10, chunk=16)
  assert retrieval.retrieval_metrics(ranking=top10, relevant=relevant) == pytest.approx(
      retrieval.retrieval_metrics(retrieval.cosine_scores(queries, corpus), relevant),
      abs=1e-12)
  # A corpus smaller than k: k is cut to it.
  scores, ids = search.top_k(queries[:2], corpus[:3], 10, chunk=2)
  np.testing.assert_array_equal(ids, full_matrix_ranking(queries[:2], corpus[:3], 3))
  with pytest.raises(ValueError, match=r'expected \[Q, H\] queries and \[D, H\] corpus'):
    search.top_k(queries, corpus[:, :8], 3)


def write_jsonl(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))


@pytest.fixture
def beir_dir(tmp_path):
  """Six documents, three queries with graded qrels (grade 0: judged, not relevant)."""
  write_jsonl(tmp_path / 'corpus.jsonl', [
      {'_id': 'd0', 'title': 'BERT', 'text': 'an encoder of text'},
      {'_id': 'd1', 'title': '', 'text': 'JAX runs numpy on accelerators'},
      {'_id': 2, 'text': 'a cat sat on the mat'},
      {'_id': 'd3', 'title': 'TPU', 'text': 'a matrix unit chip'},
      {'_id': 'd4', 'title': 'pods', 'text': 'many chips joined'},
      {'_id': 'd5', 'title': 'dogs', 'text': 'bark'}])
  write_jsonl(tmp_path / 'queries.jsonl', [
      {'_id': 'q1', 'text': 'what is bert'}, {'_id': 'q2', 'text': 'tpu chips'},
      {'_id': 'q3', 'text': 'pets'}, {'_id': 'q4', 'text': 'not judged in test'}])
  (tmp_path / 'qrels').mkdir()
  (tmp_path / 'qrels' / 'test.tsv').write_text(
      'query-id\tcorpus-id\tscore\n'
      'q2\td3\t2\nq2\td4\t1\nq2\td1\t0\nq1\td0\t1\nq3\t2\t1\nq3\td5\t2\n')
  return tmp_path


def ndcg_at_10(ranking, qrels):
  """trec_eval's ndcg_cut.10 for one query: ranking = doc ids best first, qrels {id: grade}."""
  dcg = sum(qrels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:10]))
  ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:10]
  idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
  return dcg / idcg if idcg else 0.0


def test_a_beir_set_is_read_and_scored_with_graded_relevance(beir_dir):
  split = beir.read_beir(str(beir_dir), 'test')
  assert split.query_ids == ['q2', 'q1', 'q3']  # those with qrels, in qrels order
  assert split.queries == ['tpu chips', 'what is bert', 'pets']
  assert split.doc_ids == ['d0', 'd1', '2', 'd3', 'd4', 'd5']
  assert split.corpus[:3] == ['BERT an encoder of text', 'JAX runs numpy on accelerators',
                              'a cat sat on the mat']
  assert split.relevant == [{3: 2, 4: 1, 1: 0}, {0: 1}, {2: 1, 5: 2}]
  # A ranking per query; q2's grade-2 document second, q3's grade-2 one never retrieved.
  ranking = np.array([[4, 3, 1, 0, 2, 5], [1, 2, 3, 4, 5, 0], [2, 0, 1, 3, 4, 1]])
  got = retrieval.retrieval_metrics(ranking=ranking, relevant=split.relevant)
  by_id = [[split.doc_ids[i] for i in row] for row in ranking]
  qrels = [{split.doc_ids[d]: g for d, g in r.items()} for r in split.relevant]
  want = np.mean([ndcg_at_10(r, q) for r, q in zip(by_id, qrels)])
  assert got['ndcg@10'] == pytest.approx(want, abs=1e-12)
  # By hand: q2 (1/log2(2) + 2/log2(3)) / (2 + 1/log2(3)); q1 1/log2(7); q3 1 / (2 + 1/log2(3))
  by_hand = [(1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)), 1 / math.log2(7),
             1 / (2 + 1 / math.log2(3))]
  assert got['ndcg@10'] == pytest.approx(np.mean(by_hand), abs=1e-12)
  assert got['recall@1'] == pytest.approx((1 / 2 + 0 + 1 / 2) / 3)
  assert got['mrr@10'] == pytest.approx((1 + 1 / 6 + 1) / 3)  # a grade-0 document is no hit
  # Judged but none relevant: trec_eval's zeros, counted in the mean.
  zero = retrieval.retrieval_metrics(ranking=ranking[:1], relevant=[{1: 0}])
  assert zero['ndcg@10'] == zero['recall@10'] == 0.0


@pytest.mark.parametrize('name, text, message', [
    ('corpus.jsonl', '{"_id": "d0", "text": "x"}\n{"_id": "d0", "text": "y"}\n',
     r"corpus.jsonl, line 2, field '_id': 'd0' repeats line 1"),
    ('corpus.jsonl', '{"_id": "d0", "title": "t"}\n', r"corpus.jsonl, line 1, field 'text': "
     'missing'),
    ('queries.jsonl', '{"id": "q1", "text": "x"}\n', r"queries.jsonl, line 1, field '_id': "
     'expected a non-empty string or integer id'),
    ('queries.jsonl', 'q1 what\n', r'queries.jsonl, line 1: not JSON'),
    ('qrels/test.tsv', 'query-id\tcorpus-id\tscore\nq1\td0\n', r'test.tsv, line 2: expected 3 '
     'tab-separated columns'),
    ('qrels/test.tsv', 'query-id\tcorpus-id\tscore\nq1\td0\t0.5\n', r"test.tsv, line 2, field "
     "'score': '0.5' is not an integer grade"),
    ('qrels/test.tsv', 'query-id\tcorpus-id\tscore\n\nq1\td9\t1\n', r"test.tsv, line 3, field "
     "'corpus-id': 'd9' is not an _id of corpus.jsonl"),
    ('qrels/test.tsv', 'query-id\tcorpus-id\tscore\nq7\td0\t1\n', r"test.tsv, line 2, field "
     "'query-id': 'q7' is not an _id of queries.jsonl"),
])
def test_bad_beir_rows_name_the_file_line_and_fix(beir_dir, name, text, message):
  (beir_dir / name).write_text(text)
  with pytest.raises(ValueError, match=message):
    beir.read_beir(str(beir_dir), 'test')


def test_bm25_top_k_equals_the_full_matrix_ties_included():
  """One query's scores at a time, cut by `top_k_row`, against the sorted [Q, D] matrix; most
  BM25 scores are ties (0 for every document sharing no word with the query)."""
  corpus = ['a tpu is a chip', 'the cat sat', 'a chip', 'dogs and cats', 'tpu pods', 'mats',
            'the cat sat', 'numpy', 'tpu chip tpu chip', 'cats']
  queries = ['tpu chip', 'cat', 'nothing matches', 'dogs']
  full = retrieval.lexical_scores(queries, corpus)
  for k in (3, 7, 10, 12):
    scores, ids = retrieval.lexical_top_k(queries, corpus, k)
    want = np.stack([np.lexsort((np.arange(len(row)), -row))[:k] for row in full])
    np.testing.assert_array_equal(ids, want, err_msg=f'k={k}')
    np.testing.assert_array_equal(scores, np.take_along_axis(full, want, 1))
  relevant = [{8}, {1, 6}, {7}, {3}]
  assert retrieval.retrieval_metrics(ranking=retrieval.lexical_top_k(queries, corpus, 10)[1],
                                     relevant=relevant) == retrieval.retrieval_metrics(
                                         full, relevant)


def test_the_embedding_task_reads_a_beir_directory_as_its_dev_and_test_split(beir_dir):
  from configs import common, finetune as finetune_configs
  from input_pipeline.finetune import registry
  (beir_dir / 'qrels' / 'dev.tsv').write_text('query-id\tcorpus-id\tscore\nq4\td5\t3\n')
  (beir_dir / 'train.tsv').write_text('query\tpositive\nq\tp\n')
  c = common.override(finetune_configs.get_config('embedding'), {
      'data.train_file': str(beir_dir / 'train.tsv'), 'data.dev_file': str(beir_dir),
      'data.test_file': str(beir_dir)})
  splits = {s.name: s.records for s in registry.read_task(c).splits}
  assert splits['dev'].queries == ['not judged in test'] and splits['dev'].relevant == [{5: 3}]
  assert splits['test'] == beir.read_beir(str(beir_dir), 'test')
