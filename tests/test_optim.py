"""The paper-code optimizer and schedule, against their reference formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import optim
from bert_jax.model import BertConfig, init_params


def reference_bert_lr(step, peak, warmup, total):
  """google-research/bert optimization.py: polynomial_decay(power=1) with warmup override."""
  lr = peak * (1.0 - min(step, total) / total)
  if step < warmup:
    lr = peak * step / warmup
  return lr


@pytest.mark.parametrize('step', [0, 1, 5000, 9999, 10000, 10001, 500_000, 899_999, 900_000, 950_000])
def test_bert_schedule_equals_reference_formula(step):
  schedule = optim.learning_rate_schedule('bert', 1e-4, 10_000, 900_000)
  np.testing.assert_allclose(float(schedule(step)), reference_bert_lr(step, 1e-4, 10_000, 900_000),
                             rtol=1e-6, atol=1e-7 * 1e-4)  # float32 step arithmetic


def test_warmup_linear_peaks_at_the_nominal_rate():
  schedule = optim.learning_rate_schedule('warmup_linear', 1e-4, 100, 1100)
  assert float(schedule(50)) == pytest.approx(5e-5)
  assert float(schedule(100)) == pytest.approx(1e-4)
  assert float(schedule(600)) == pytest.approx(5e-5)
  assert float(schedule(1100)) == 0.0


def test_weight_decay_mask_skips_layer_norm_and_biases_only():
  params = jax.eval_shape(lambda: init_params(BertConfig.from_preset('tiny'), jax.random.key(0)))
  mask = optim.decay_mask(params)
  flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(mask)}
  assert flat["['embeddings']['word_embeddings']['embedding']"]
  assert flat["['encoder']['layers']['attention']['query']['kernel']"]
  assert flat["['nsp']['kernel']"]
  assert not flat["['encoder']['layers']['attention']['query']['bias']"]
  assert not flat["['encoder']['layers']['output_layer_norm']['scale']"]
  assert not flat["['embeddings']['layer_norm']['scale']"]
  assert not flat["['mlm_output_bias']"]
  assert not flat["['mlm_layer_norm']['bias']"]


def test_adamw_bert_matches_the_reference_update_rule():
  """Two steps of the reference's AdamWeightDecayOptimizer, written out in numpy."""
  rng = np.random.default_rng(0)
  params = {'dense': {'kernel': rng.standard_normal((3, 4)).astype(np.float32),
                      'bias': rng.standard_normal(4).astype(np.float32)}}
  grads = [jax.tree_util.tree_map(lambda p: rng.standard_normal(p.shape).astype(np.float32) * 3,
                                  params) for _ in range(2)]
  lr, wd = 1e-2, 0.01
  tx = optim.make_optimizer('adamw_bert', lambda _: lr, weight_decay=wd, clip_norm=1.0)
  state, p = tx.init(params), params
  ref = jax.tree_util.tree_map(np.copy, params)
  m = jax.tree_util.tree_map(np.zeros_like, params)
  v = jax.tree_util.tree_map(np.zeros_like, params)
  for g in grads:
    updates, state = tx.update(g, state, p)
    p = optax.apply_updates(p, updates)
    norm = np.sqrt(sum(np.sum(x ** 2) for x in jax.tree_util.tree_leaves(g)))
    g = jax.tree_util.tree_map(lambda x: x * min(1.0, 1.0 / norm), g)
    for key in ('kernel', 'bias'):
      gg = g['dense'][key]
      m['dense'][key] = 0.9 * m['dense'][key] + 0.1 * gg
      v['dense'][key] = 0.999 * v['dense'][key] + 0.001 * gg ** 2
      update = m['dense'][key] / (np.sqrt(v['dense'][key]) + 1e-6)
      if key == 'kernel':
        update = update + wd * ref['dense'][key]
      ref['dense'][key] = ref['dense'][key] - lr * update
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), p, ref)


def test_unknown_names_are_clear_errors():
  with pytest.raises(ValueError, match="optimizer.schedule='cosine'"):
    optim.learning_rate_schedule('cosine', 1e-4, 10, 100)
  with pytest.raises(ValueError, match="optimizer.name='sgd'"):
    optim.make_optimizer('sgd', lambda _: 1e-4)


def test_lamb_trains_with_the_same_mask():
  params = {'w': jnp.ones((4, 4)), 'layer_norm': {'scale': jnp.ones(4)}}
  tx = optim.make_optimizer('lamb', lambda _: 1e-3)
  state = tx.init(params)
  updates, _ = tx.update(jax.tree_util.tree_map(jnp.ones_like, params), state, params)
  assert all(np.all(np.isfinite(u)) for u in jax.tree_util.tree_leaves(updates))
