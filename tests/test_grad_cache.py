"""The cached contrastive loss (bert_jax/finetune/grad_cache.py) and the Matryoshka loss.

- Cached = uncached: the loss and every parameter gradient of the kind's own
  `value_and_grad` (what the train step calls), jitted with the run's shardings, on 1 device and
  on a (2, 2, 2) mesh, against the uncached one on 1 device (the uncached loss on N devices
  equals 1 device's: tests/test_embedding_task.py), with a hard-negative column, a half-weight
  row and padding rows (copies of row 0 with zero weight, as input_pipeline/finetune/batching.py
  pads a last batch). Dropout off: the uncached pass draws one mask for the whole batch.
- Dropout replayed: the GradCache gradients of a dropout embedding over a batch sharded on 8
  devices equal autodiff through the same chunks with the same keys.
- sentence-transformers 6.2's own CachedMultipleNegativesRankingLoss on our weights exported as
  a sentence-transformers directory, run for real in torch (its forward, cache and backward
  hook): the same loss and word-embedding gradient; its MatryoshkaLoss over it on the same
  embeddings: the same loss.
- Matryoshka against a NumPy sum of MultipleNegativesRankingLoss at each truncation; the
  per-dimension retrieval scores; `truncate_dim` on the export.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer import losses as st_losses

from bert_jax.convert import sentence_transformers_export as st_export
from bert_jax.finetune import contrastive, grad_cache, kinds, program, retrieval, tasks
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig
from bert_jax.training import sharding as shd
from configs import common, finetune as finetune_configs
from input_pipeline.finetune import pairs
from input_pipeline.tokenizer import WordPieceTokenizer
from tests.test_embeddings import numpy_ranking_loss, random_embeddings

VOCAB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'bert_uncased_vocab.txt')
WORDS = ('the model ranks every query against each passage in the batch while a cached loss '
         'embeds small chunks twice and keeps only their vectors so memory stays flat for '
         'thousands of rows on any chip').split()
ROWS, CHUNK, LENGTH = 16, 4, 16  # 4 chunks; on the (2, 2, 2) mesh one row a batch device
MESHES = {'1 device': ((1, 1, 1), 1), '(2,2,2) mesh': ((2, 2, 2), 8)}


def config_for(mesh, dropout: float, **data):
  c = finetune_configs.get_config('embedding')
  return common.override(c, {'mesh': mesh, 'data.max_seq_length': LENGTH,
                             'model.hidden_dropout': dropout,
                             'model.attention_dropout': dropout,
                             **{f'data.{k}': v for k, v in data.items()}})


@pytest.fixture(scope='module')
def tokenizer():
  return WordPieceTokenizer(VOCAB, do_lower_case=True)


@pytest.fixture(scope='module')
def model_cfg(tokenizer):
  return BertConfig.from_preset('tiny', vocab_size=tokenizer.vocab_size, num_layers=1,
                                hidden_size=32, num_heads=2, intermediate_size=64,
                                hidden_dropout=0.0, attention_dropout=0.0, scan_layers=False)


@pytest.fixture(scope='module')
def params(model_cfg):
  """Random weights of the head model's shapes (LayerNorm scales near 1), drawn in NumPy: no
  init program to compile."""
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(heads.init_params, model_cfg, heads.Head(heads.EMBEDDING),
                          jax.random.key(0))
  draw = lambda path, s: (float(path[-1].key == 'scale') + 0.05 * rng.standard_normal(
      s.shape)).astype(np.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def triplets(n: int, seed: int = 0):
  """n (query, positive, negative) texts of a few words each, lengths varying."""
  rng = np.random.default_rng(seed)
  text = lambda: ' '.join(rng.choice(WORDS, rng.integers(2, 12)))
  return [pairs.TextPair(text(), text(), text(), i) for i in range(n)]


def batch_of(records, tokenizer, weights):
  kind = kinds.get('sentence_embedding')
  arrays, _ = kind.featurize(records, (), tokenizer, config_for((1, 1, 1), 0.0).data, True)
  padding = np.flatnonzero(np.asarray(weights) == 0)
  for k in arrays:  # batching.take's padding rows: copies of row 0
    arrays[k][padding] = arrays[k][0]
  arrays['label_weights'] = np.asarray(weights, np.float32)
  return arrays


@functools.lru_cache(maxsize=None)
def jitted_loss_and_grads(kind, model_cfg, mesh):
  """The kind's (loss, grads) as the train step computes them, jitted over `mesh` with the
  run's parameter and batch shardings (program.setup_for), and the key that step draws."""
  devices = jax.devices()[:MESHES[mesh][1]]
  c = config_for(MESHES[mesh][0], model_cfg.hidden_dropout)
  setup = program.setup_for(c, model_cfg, heads.Head(heads.EMBEDDING), kind, 10, devices)
  model = heads.build_model(model_cfg, heads.Head(heads.EMBEDDING))

  def forward(p, inputs, key):
    return model.apply({'params': p}, *(inputs[k] for k in kinds.MODEL_INPUTS),
                       deterministic=False, rngs={'dropout': key})

  fn = jax.jit(lambda p, b, key: kind.value_and_grad(forward, p, b, key),
               in_shardings=(setup.shardings.params, shd.batch_sharding(setup.mesh), None))

  def run(p, batch, key):
    with shd.activate(setup.mesh, setup.rules):
      return jax.device_get(fn(jax.device_put(p, setup.shardings.params), batch, key))
  return run, forward


def assert_close(got, want, rtol=2e-5):
  """Loss and every gradient leaf to float32 round-off: relative to the leaf's largest entry,
  plus 1e-9 for leaves whose gradient is zero but for round-off (attention's key bias)."""
  np.testing.assert_allclose(got[0], want[0], rtol=rtol)
  for g, w in zip(jax.tree_util.tree_leaves(got[1]), jax.tree_util.tree_leaves(want[1])):
    np.testing.assert_allclose(g, w, rtol=0, atol=rtol * np.max(np.abs(w)) + 1e-9)


def padded_batch(tokenizer):
  weights = np.ones(ROWS, np.float32)
  weights[[3, 12, 13]] = 0.0  # padding rows, one in the middle
  weights[5] = 0.5
  return batch_of(triplets(ROWS), tokenizer, weights)


def embedding_kind(**data):
  return kinds.get('sentence_embedding').configure(config_for((1, 1, 1), 0.0, **data).data)


@pytest.mark.parametrize('mesh', [
    '1 device', pytest.param('(2,2,2) mesh', marks=pytest.mark.multi_device)])
def test_cached_loss_and_gradients_equal_the_uncached(mesh, tokenizer, model_cfg, params):
  batch, key = padded_batch(tokenizer), jax.random.key(7)
  want = jitted_loss_and_grads(embedding_kind(), model_cfg, '1 device')[0](params, batch, key)
  got = jitted_loss_and_grads(embedding_kind(embed_chunk=CHUNK), model_cfg, mesh)[0](
      params, batch, key)
  assert want[0] > 0
  assert_close(got, want)


@pytest.mark.multi_device
def test_cached_gradients_replay_each_chunks_dropout():
  """A dropout embedding (mask 50%) and a loss that couples all rows: GradCache's (loss,
  grads), over a batch sharded on 8 devices, equal plain autodiff through the same chunks
  (rows i, i + 4, ...) embedded with the same keys fold_in(key, i); other keys give others."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((32, 6)), jnp.float32)
  params = {'w': jnp.asarray(rng.standard_normal((6, 8)), jnp.float32)}
  chunks = 4

  def embed(p, rows, key):
    keep = jax.random.bernoulli(key, 0.5, (rows.shape[0], 8))
    return jnp.where(keep, jnp.tanh(rows @ p['w']) * 2.0, 0.0)

  def loss(e):
    return jnp.sum(jax.nn.logsumexp(e @ e.T, axis=-1))

  @jax.jit
  def direct(p, key, shift):
    out = jnp.zeros((32, 8), jnp.float32)
    for i in range(chunks):
      rows = np.arange(i, 32, chunks)
      out = out.at[rows].set(embed(p, x[rows], jax.random.fold_in(key, i + shift)))
    return loss(out)

  key = jax.random.key(5)
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('data',))
  sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
      'data')))
  got = jax.jit(lambda p, x: grad_cache.value_and_grad(embed, loss, p, x, key, 32 // chunks))(
      params, sharded)
  want = jax.value_and_grad(direct)(params, key, 0)
  assert_close(jax.device_get(got), jax.device_get(want))
  other = jax.value_and_grad(direct)(params, key, 1)[0]
  assert abs(float(other) - float(want[0])) > 1e-3 * abs(float(want[0]))


def test_cached_loss_equals_sentence_transformers(tokenizer, model_cfg, params, tmp_path):
  """Our weights exported (convert/sentence_transformers_export.py) and loaded by
  sentence-transformers; its CachedMultipleNegativesRankingLoss (mini_batch_size 4) on the
  same triplets (all rows real): the same mean loss, and the same word-embedding gradient
  (its torch backward hook against our cached vjp). Dropout off (`model.eval()`). Then its
  MatryoshkaLoss over that loss (`CachedLossDecorator`) on our embeddings: the same loss as
  ours; and the export loads with `truncate_dim` as our leading features."""
  records = triplets(ROWS, seed=2)
  batch = batch_of(records, tokenizer, np.ones(ROWS))
  loss, grads = jitted_loss_and_grads(embedding_kind(embed_chunk=CHUNK), model_cfg, '1 device')[0](
      params, batch, jax.random.key(0))

  dims = (32, 16)
  path = st_export.save_sentence_transformer(str(tmp_path / 'st'), model_cfg, params, tokenizer,
                                             max_seq_length=LENGTH, matryoshka_dims=dims)
  model = SentenceTransformer(path, device='cpu')
  model.eval()
  theirs = st_losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=CHUNK)
  columns = [[p.query for p in records], [p.positive for p in records],
             [p.negative for p in records]]
  their_loss = theirs([model.preprocess(texts) for texts in columns], None)
  their_loss.backward()
  np.testing.assert_allclose(float(loss), their_loss.item(), rtol=2e-5)
  word = model[0].auto_model.embeddings.word_embeddings.weight.grad.numpy()
  ours = np.asarray(grads['embeddings']['word_embeddings']['embedding'])
  np.testing.assert_allclose(ours, word, rtol=0, atol=2e-4 * np.max(np.abs(word)))

  embeddings = np.stack([model.encode(texts) for texts in columns], axis=1)  # [B, 3, H]
  weights = (1.0, 0.5)
  matryoshka = st_losses.MatryoshkaLoss(model, st_losses.CachedMultipleNegativesRankingLoss(
      model, mini_batch_size=CHUNK), list(dims), list(weights))
  with torch.no_grad():
    want = matryoshka.loss.calculate_loss(
        [[torch.from_numpy(embeddings[:, c])] for c in range(3)])
  total, count = contrastive.matryoshka_loss_sums(jnp.asarray(embeddings), jnp.ones(ROWS), 20.0,
                                                  tuple(zip(dims, weights)))
  np.testing.assert_allclose(float(total / count), want.item(), rtol=2e-5)

  small = SentenceTransformer(path, device='cpu', truncate_dim=16).encode(columns[0][:4])
  assert small.shape == (4, 16)
  np.testing.assert_allclose(small, embeddings[:4, 0, :16], rtol=1e-6)
  with open(os.path.join(path, 'README.md')) as f:
    assert 'truncate_dim=16' in f.read()


def test_matryoshka_loss_is_the_weighted_sum_over_truncations():
  emb = random_embeddings(6, 3, hidden=16, seed=5)
  weights = np.array([1, 1, 0, 2, 1, 0.5], np.float32)
  dims = ((16, 1.0), (8, 0.5), (4, 2.0))
  total, weight = jax.jit(contrastive.matryoshka_loss_sums, static_argnums=(2, 3))(
      jnp.asarray(emb), jnp.asarray(weights), 20.0, dims)
  want = sum(w * numpy_ranking_loss(emb[..., :d], weights)[0] for d, w in dims)
  np.testing.assert_allclose(float(total), want, rtol=1e-5)
  assert float(weight) == float(np.sum(weights))
  with pytest.raises(ValueError, match='matryoshka_dims: 32 is not in 1..16'):
    contrastive.matryoshka_loss_sums(jnp.asarray(emb), jnp.asarray(weights), 20.0, ((32, 1.0),))


def test_matryoshka_scores_each_dimension_and_settings_are_checked():
  kind = kinds.get('sentence_embedding').configure(
      config_for((1, 1, 1), 0.0, matryoshka_dims=(8, 16), matryoshka_weights=(2, 1)).data)
  assert kind.matryoshka == ((16, 1.0), (8, 2.0))  # sorted as MatryoshkaLoss sorts them
  rng = np.random.default_rng(6)
  queries, corpus = ['a', 'b', 'c'], ['d', 'e', 'f', 'g', 'h']
  emb = rng.standard_normal((8, 1, 16)).astype(np.float32)
  split = tasks.EvalSplit('dev', 'dev', {}, True,
                          pairs.RetrievalSplit(queries, corpus, [{0}, {2, 3}, {4}]))
  scores = kind.score(None, split, {'embeddings': emb})
  for dim, suffix in ((16, ''), (8, '@8d')):
    want = retrieval.retrieval_metrics(
        retrieval.cosine_scores(emb[:3, 0, :dim], emb[3:, 0, :dim]), split.records.relevant)
    for metric in retrieval.METRICS:
      assert scores[metric + suffix] == pytest.approx(want[metric], abs=1e-12), (metric, dim)
  assert '@16d' not in ''.join(scores)  # the full width is the plain scores

  for fields, message in (({'embed_chunk': -1}, 'data.embed_chunk=-1'),
                          ({'matryoshka_dims': (8, 8)}, 'distinct positive'),
                          ({'matryoshka_dims': (8, 4), 'matryoshka_weights': (1,)},
                           'one weight per dimension'),
                          ({'matryoshka_weights': (1,)}, 'without data.matryoshka_dims')):
    with pytest.raises(ValueError, match=message):
      kinds.get('sentence_embedding').configure(config_for((1, 1, 1), 0.0, **fields).data)
  with pytest.raises(ValueError, match=r'data.embed_chunk=6 does not divide the global batch '
                                       r'of 16 rows \(train.global_batch_size\)'):
    grad_cache.chunk_count(16, 6, 'data.embed_chunk')
