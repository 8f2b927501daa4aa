"""The chunked MLM loss (model.mlm_loss_chunk, bert_jax/pretrain/mlm_loss.py) against the
whole-logits loss it replaces: the same sums, accuracy and gradients to float32 round-off."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model.encoder import tied_decoder
from bert_jax.pretrain import mlm_loss, step as pretrain_step, synthetic
from configs import bert_tiny, common, modern
from test_sharding import LOSS_RUN, synthetic_losses, tiny_setup


def _max_diff(a, b):
  """In numpy: jnp's ops would compile one small program per leaf shape."""
  a, b = jax.device_get((a, b))
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
             zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@pytest.mark.parametrize('chunk', [1, 3, 7, 50])
def test_chunked_sums_and_gradients_equal_the_full_logits(chunk):
  """7 predictions a row: 7 chunks of 1, 3 of 3 (2 padded), 1 of 7, 1 (chunk > P)."""
  k = jax.random.split(jax.random.key(0), 5)
  b, p, h, v = 3, 7, 16, 97
  hidden = jax.random.normal(k[0], (b, p, h))
  table = 0.3 * jax.random.normal(k[1], (v, h))
  bias = 0.1 * jax.random.normal(k[2], (v,))
  # Half the labels are the argmax, so the accuracy is neither 0 nor 1.
  best = jnp.argmax(tied_decoder(hidden, table, bias), -1)
  labels = jnp.where(jnp.arange(p) % 2 == 0, best, jax.random.randint(k[3], (b, p), 0, v))
  weights = (jax.random.uniform(k[4], (b, p)) < 0.8).astype(jnp.float32)

  def full(hidden, table, bias):
    return mlm_loss.full_sums(tied_decoder(hidden, table, bias), labels, weights)

  def chunked(hidden, table, bias):
    return mlm_loss.chunked_sums(hidden, table, bias, labels, weights, chunk)

  (loss_f, hits_f), (loss_c, hits_c) = full(hidden, table, bias), chunked(hidden, table, bias)
  np.testing.assert_allclose(loss_c, loss_f, rtol=1e-6)
  assert float(hits_c) == float(hits_f) > 0
  grad = lambda f: jax.jit(jax.grad(lambda *a: f(*a)[0], argnums=(0, 1, 2)))
  g_f, g_c = grad(full)(hidden, table, bias), grad(chunked)(hidden, table, bias)
  assert _max_diff(g_f, g_c) < 1e-6, _max_diff(g_f, g_c)


def _config(name, chunk, **extra):
  """BERT-tiny with one layer (the loss is the head's, after any depth: a layer less to
  compile), or ModernBERT-tiny as it is."""
  config = (common.override(bert_tiny.get_config(), {'model.num_layers': 1}) if name == 'bert'
            else modern.get_config('tiny,phase1'))
  return common.override(config, {
      'model.mlm_loss_chunk': chunk, 'model.hidden_dropout': 0.0,
      'model.attention_dropout': 0.0, 'data.max_seq_length': 64,
      'data.max_predictions_per_seq': 10, 'model.vocab_size': 2000, **extra})


@pytest.mark.parametrize('name', ['bert', 'modern'])
def test_pretraining_loss_accuracy_and_gradients_equal_the_unchunked_step(name):
  """The model's own loss_fn (train_step's) and eval sums, chunk 4 of 10 predictions."""
  rng = np.random.default_rng(0)
  batch = synthetic.random_batch(rng, 4, 64, 10, 2000)
  results = []
  for chunk in (0, 4):
    config = _config(name, chunk)
    setup = pretrain_step.setup(config, jax.devices()[:1])
    params = setup.objective.init_params(jax.random.key(0))
    objective = config.data.sentence_objective

    def loss(params, setup=setup, chunk=chunk, objective=objective):
      model = setup.objective.train_step.keywords['model']
      out = model.apply({'params': params}, **pretrain_step.model_inputs(batch))
      sums = pretrain_step.loss_sums(out, batch, objective, chunk)
      return sums['mlm_loss'] / sums['mlm_weight'], sums

    (value, sums), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    evals = jax.jit(setup.objective.eval_step)(params, batch)
    results.append((value, sums, grads, evals))
  (v0, s0, g0, e0), (v1, s1, g1, e1) = results
  np.testing.assert_allclose(v1, v0, rtol=1e-6)
  assert float(s1['mlm_hits']) == float(s0['mlm_hits'])
  assert _max_diff(g0, g1) < 1e-6, _max_diff(g0, g1)
  for key in e0:
    np.testing.assert_allclose(e1[key], e0[key], rtol=1e-6)


@pytest.mark.multi_device
def test_chunked_loss_gives_the_same_losses_on_one_device_and_a_2x2x2_mesh():
  """Batch over data and fsdp, vocabulary over tensor: the chunks split positions only. The
  chunked loss (4 of 10 predictions) on the mesh against the unchunked loss on one device
  (test_sharding.py's runs, dropout on; their 1-device program is the one test_sharding runs,
  which the suite's compilation cache serves): 1 device chunked equals unchunked in the tests
  above, so this is also the chunked loss on 1 device and on 8."""
  chunked = synthetic_losses(tiny_setup((2, 2, 2), jax.devices()[:8], **{
      **LOSS_RUN, 'model.mlm_loss_chunk': 4}), 3)
  whole = synthetic_losses(tiny_setup((1, 1, 1), jax.devices()[:1], **LOSS_RUN), 3)
  np.testing.assert_allclose(chunked, whole, rtol=2e-6)
