"""Hard-negative mining (bert_jax/finetune/mine.py) against a brute-force reference written
from sentence-transformers 6.2's `util.mine_hard_negatives` steps (its file
sentence_transformers/util/hard_negatives.py: the top range_max + max_positives candidates of
the full score list, positives masked, margins against the hardest positive, max/min score,
the first range_max left, ranks range_min.., num_negatives of them), by model and by BM25; and
query/document prompts end to end: the embedding task's featurising and an export whose
`SentenceTransformer.encode(..., prompt_name=...)` gives our embeddings, on a ModernBERT start
point that ships only a tokenizer.json (as released ModernBERTs do)."""

import json
import os

import numpy as np
import pytest
import sentence_transformers

from bert_jax.finetune import embed, mine, retrieval
from configs import common, finetune as finetune_configs
from input_pipeline.finetune import pairs

PROMPTS = {'query': 'query: ', 'document': 'passage: '}


def brute_force(scores, positives, o: mine.MiningOptions):
  """Per query, its negatives by sentence-transformers' steps on the full [Q, D] matrix."""
  max_positives = max(map(len, positives))
  range_max = o.range_max
  if range_max is None:
    wide = o.absolute_margin is not None or o.relative_margin is not None or (
        o.max_score is not None)
    range_max = o.range_min + (10 if wide else 1) * o.num_negatives + max_positives
  out = []
  for row, mine_ in zip(scores, positives):
    ranked = sorted(range(len(row)), key=lambda d: (-row[d], d))[:range_max + max_positives]
    hardest = min(row[p] for p in mine_)

    def keep(s):
      return not ((o.absolute_margin is not None and s + o.absolute_margin > hardest) or
                  (o.relative_margin is not None and
                   s > hardest - abs(hardest) * o.relative_margin) or
                  (o.max_score is not None and s > o.max_score) or
                  (o.min_score is not None and s < o.min_score))
    left = [d for d in ranked if d not in mine_ and keep(row[d])][:range_max]
    out.append(left[o.range_min:][:o.num_negatives])
  return out


OPTIONS = [mine.MiningOptions(), mine.MiningOptions(num_negatives=2, range_min=2),
           mine.MiningOptions(num_negatives=4, absolute_margin=0.1),
           mine.MiningOptions(num_negatives=2, relative_margin=0.3, range_max=6),
           mine.MiningOptions(num_negatives=3, max_score=0.5, min_score=-0.6)]


def test_mining_matches_the_brute_force_reference_and_never_counts_a_positive():
  rng = np.random.default_rng(0)
  given = [pairs.TextPair(f'q{i % 5}', f'p{i}', None, i) for i in range(7)]  # q0, q1: 2 each
  data = mine.mining_input(given, [f'extra{j}' for j in range(9)])
  assert data.queries == [f'q{i}' for i in range(5)] and data.positives[0] == [9, 14]
  assert len(data.corpus) == 16
  scores = rng.uniform(-1, 1, (5, 16))
  for q, mine_ in enumerate(data.positives):  # positives score high: they must be skipped
    scores[q, mine_] = rng.uniform(0.7, 0.95, len(mine_))
  scores[3, 2] = scores[3, 4] = 0.2  # a tie: the lower index first

  def scorer(k):
    ids = np.stack([retrieval.top_k_row(row, k) for row in scores])
    positive = np.concatenate([scores[q, p] for q, p in enumerate(data.positives)])
    return np.take_along_axis(scores, ids, 1), ids, positive

  for options in OPTIONS:
    got = mine.mine_negatives(data, scorer, options)
    assert got == brute_force(scores, data.positives, options), options
    assert all(not set(n) & set(p) for n, p in zip(got, data.positives))
  first = mine.mine_negatives(data, scorer, mine.MiningOptions(num_negatives=1))
  assert [n[0] for n in first] == [int(np.argsort(-np.where(np.isin(np.arange(16), p), -9, row),
                                                  kind='stable')[0])
                                   for row, p in zip(scores, data.positives)]
  with pytest.raises(ValueError, match='cannot mine 5 negatives a query from ranks 2..6'):
    mine.mine_negatives(data, scorer, mine.MiningOptions(5, range_min=2, range_max=6))


def test_bm25_mining_writes_triplets_the_embedding_task_reads(tmp_path):
  given = [pairs.TextPair('what is a tpu', 'a tpu is a matrix chip', None, 0),
           pairs.TextPair('what is a tpu', 'tensor processing unit', None, 1),
           pairs.TextPair('numpy arrays', 'numpy holds arrays of numbers', None, 2),
           pairs.TextPair('cats on mats', 'the cat sat on the mat', None, 3)]
  corpus = ['a gpu is a chip', 'arrays in jax', 'a tpu pod', 'dogs', 'the mat is red',
            'a matrix chip for tpu work', 'numbers']
  data = mine.mining_input(given, corpus)
  options = mine.MiningOptions(num_negatives=2)
  got = mine.mine_negatives(data, mine.bm25_scorer(data), options)
  assert got == brute_force(retrieval.lexical_scores(data.queries, data.corpus),
                            data.positives, options)
  rows = mine.triplets(data, got)
  path = pairs.write_pairs(rows, str(tmp_path / 'mined.tsv'))
  back = pairs.read_pairs(path)
  assert back == rows and all(r.negative not in (r.positive,) for r in back)
  assert [(r.query, r.positive) for r in back[:4]] == [('what is a tpu', given[0].positive)] * 2 + [
      ('what is a tpu', given[1].positive)] * 2  # per query, per positive, per negative


@pytest.fixture(scope='module')
def embedder(tmp_path_factory):
  """A released-style ModernBERT directory (only a byte-level BPE tokenizer.json, no
  vocab.txt) with E5-style prompts: one model, so one compiled predict step, for every test."""
  from tests.test_hf_tokenizers import modernbert_start
  start_dir = modernbert_start(tmp_path_factory.mktemp('modern') / 'start')
  assert not os.path.exists(os.path.join(start_dir, 'vocab.txt'))
  c = common.override(finetune_configs.get_config('embedding'), {
      'init': start_dir, 'data.max_seq_length': 32, 'data.query_prompt': PROMPTS['query'],
      'data.document_prompt': PROMPTS['document'], 'train.eval_batch_size': 16,
      'data.length_buckets': 1})  # one compiled predict step
  return embed.Embedder(c)


@pytest.fixture(scope='module')
def export(embedder, tmp_path_factory):
  """The embedding task's own export of that model (kind.export: pooling, prompts)."""
  path = str(tmp_path_factory.mktemp('st') / 'model')
  embedder.kind.export(path, embedder.start, embedder.kind.make_head((), None), embedder.params)
  return path


TEXTS = ['what is a tensor processing unit', 'a cat sat on the mat', 'numpy arrays', 'x',
         'the quick brown fox jumps over the lazy dog near the river bank today']


def test_prompts_reach_featurising_and_the_export_reproduces_our_embeddings(export, embedder):
  """Also: a ModernBERT start point with only a tokenizer.json, through the embedding task's
  featurising, predict step and export."""
  with open(os.path.join(export, 'config_sentence_transformers.json')) as f:
    assert json.load(f)['prompts'] == PROMPTS
  # Training rows: the query prompt before the query, the document prompt before the others.
  kind = embedder.kind
  arrays, _ = kind.featurize([pairs.TextPair('a b', 'c', 'd', 0)], (), embedder.start.tokenizer,
                             embedder.config.data, training=True)
  tok = embedder.start.tokenizer
  for column, text in enumerate(['query: a b', 'passage: c', 'passage: d']):
    ids = [tok.cls_id] + tok.encode(text) + [tok.sep_id]
    assert list(arrays['input_ids'][0, column, :len(ids)]) == ids
    assert int(arrays['input_mask'][0, column].sum()) == len(ids)
  st = sentence_transformers.SentenceTransformer(export, device='cpu')
  for role in ('query', 'document'):
    ours = embedder.embed(TEXTS, role)
    theirs = st.encode(TEXTS, prompt_name=role)
    cosine = np.sum(ours * theirs, -1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(
        theirs, axis=-1)
    assert np.max(1 - cosine) <= 1e-5, (role, 1 - cosine)
    plain = st.encode(TEXTS)  # without the prompt: another embedding
    assert np.max(1 - np.sum(ours * plain, -1) / np.linalg.norm(ours, axis=-1) /
                  np.linalg.norm(plain, axis=-1)) > 1e-4
  np.testing.assert_allclose(st.encode_query(TEXTS), st.encode(TEXTS, prompt_name='query'))


def test_model_mining_matches_brute_force_on_sentence_transformers_embeddings(export, embedder):
  given = [pairs.TextPair(TEXTS[i], TEXTS[(i + 1) % 5], None, i) for i in range(5)]
  data = mine.mining_input(given, ['a dog', 'jax on a tpu', 'mats and rugs', 'the river'])
  st = sentence_transformers.SentenceTransformer(export, device='cpu')
  full = retrieval.cosine_scores(st.encode(data.queries, prompt_name='query'),
                                 st.encode(data.corpus, prompt_name='document'))
  options = mine.MiningOptions(num_negatives=2, range_min=1)
  got = mine.mine_negatives(data, mine.model_scorer(embedder, data), options)
  assert got == brute_force(full, data.positives, options)


def test_beir_evaluation_equals_the_full_matrix_on_sentence_transformers_embeddings(
    export, embedder, tmp_path):
  """beir_eval's embed + chunked search + graded metrics against sentence-transformers'
  embeddings, the whole score matrix and BEIR's ignore_identical_ids (a document named as its
  query is never counted), scored by the independent trec_eval nDCG of test_retrieval_search."""
  from bert_jax.finetune import beir_eval
  from input_pipeline.finetune import beir
  from tests.test_retrieval_search import ndcg_at_10
  docs = TEXTS + ['a dog', 'jax on a tpu', 'mats and rugs', 'the river', 'q1 twin', 'more',
                  'arrays of numbers', 'a fox']
  ids = [f'd{i}' for i in range(len(docs))]
  ids[10] = 'q1'  # the same id as a query: BEIR drops it from that query's results
  (tmp_path / 'corpus.jsonl').write_text(''.join(
      json.dumps({'_id': i, 'title': '', 'text': t}) + '\n' for i, t in zip(ids, docs)))
  queries = ['tensor unit', 'cat mat', 'arrays', 'fox dog']
  (tmp_path / 'queries.jsonl').write_text(''.join(
      json.dumps({'_id': f'q{i}', 'text': t}) + '\n' for i, t in enumerate(queries)))
  (tmp_path / 'qrels').mkdir()
  (tmp_path / 'qrels' / 'dev.tsv').write_text(
      'query-id\tcorpus-id\tscore\nq0\td0\t2\nq0\td6\t1\nq1\td1\t1\nq1\td8\t2\nq2\td2\t1\n'
      'q2\td11\t1\nq3\td4\t2\nq3\td12\t1\nq3\td5\t0\n')
  split = beir.read_beir(str(tmp_path), 'dev')
  got = beir_eval.evaluate(embedder, split)
  st = sentence_transformers.SentenceTransformer(export, device='cpu')
  full = retrieval.cosine_scores(st.encode(split.queries, prompt_name='query'),
                                 st.encode(split.corpus, prompt_name='document'))
  want = []
  for q, row in enumerate(full):
    ranking = [split.doc_ids[d] for d in np.lexsort((np.arange(len(row)), -row))
               if split.doc_ids[d] != split.query_ids[q]]
    want.append(ndcg_at_10(ranking, {split.doc_ids[d]: g for d, g in split.relevant[q].items()}))
  assert got['ndcg@10'] == pytest.approx(np.mean(want), abs=1e-9)
  kept = beir_eval.evaluate(embedder, split, ignore_identical_ids=False)
  assert kept == retrieval.retrieval_metrics(full, split.relevant)
