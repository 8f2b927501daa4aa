"""The optimizers and schedules, against their reference algorithms written out in NumPy.

References (the algorithms, re-typed here from their published source):
- google-research/bert optimization.py: `create_optimizer`, `AdamWeightDecayOptimizer`;
- NVIDIA apex apex/optimizers/fused_lamb.py `FusedLAMB.step` and csrc/multi_tensor_lamb.cu
  (`LAMBStage1Functor`, `LAMBStage2Functor`, `multi_tensor_lamb_cuda`);
- NVIDIA DeepLearningExamples PyTorch/LanguageModeling/BERT/schedulers.py
  `PolyWarmUpScheduler`, run_pretraining.py (`no_decay`, FusedLAMB defaults) and
  scripts/run_pretraining.sh (the recipe's numbers).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax.model.encoder import BertConfig, init_params
from bert_jax.pretrain import step as pretrain_step
from bert_jax.training import optim
from configs import bert_large


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


# ------------------------------------------------------------------ references, in float64


def nvidia_poly_warmup_lr(k, base_lr, warmup, total, degree=0.5):
  """schedulers.py `PolyWarmUpScheduler.get_lr` for the optimizer's k-th update, k = 1..total:
  its `step()` runs before each `FusedLAMB.step` and sets last_epoch = group['step'] + 1."""
  progress = k / total
  if progress < warmup:
    return base_lr * progress / warmup
  return base_lr * (1.0 - progress) ** degree


def apex_lamb_step(p, g, m, v, step, lr, decay, b1=0.9, b2=0.999, eps=1e-6, max_grad_norm=1.0):
  """One apex FusedLAMB step over lists of tensors (in place), adam_w_mode, use_nvlamb=False."""
  norm = np.sqrt(sum(np.sum(x ** 2) for x in g))  # one global norm over every group
  clip = norm / max_grad_norm if norm > max_grad_norm else 1.0
  for i in range(len(p)):
    grad = g[i] / clip
    m[i] = m[i] * b1 + (1 - b1) * grad
    v[i] = v[i] * b2 + (1 - b2) * grad * grad
    update = (m[i] / (1 - b1 ** step)) / (np.sqrt(v[i] / (1 - b2 ** step)) + eps) + decay[i] * p[i]
    ratio = lr
    if decay[i] != 0:
      p_norm, u_norm = np.linalg.norm(p[i]), np.linalg.norm(update)
      ratio = lr * p_norm / u_norm if p_norm != 0 and u_norm != 0 else lr
    p[i] = p[i] - ratio * update


def bert_adamw_step(p, g, m, v, step, lr, decay, b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0):
  """google-research/bert: tf.clip_by_global_norm(grads, 1.0), then AdamWeightDecayOptimizer
  (no bias correction) on every variable; `step` is unused (no bias correction)."""
  del step
  norm = np.sqrt(sum(np.sum(x ** 2) for x in g))
  for i in range(len(p)):
    grad = g[i] * clip_norm / max(norm, clip_norm)
    m[i] = b1 * m[i] + (1 - b1) * grad
    v[i] = b2 * v[i] + (1 - b2) * grad ** 2
    p[i] = p[i] - lr * (m[i] / (np.sqrt(v[i]) + eps) + decay[i] * p[i])


def as_tensors(tree):
  """{name: array} the way the PyTorch/TF models hold them: one tensor per layer, so scanned
  [L, ...] stacks (everything under encoder/layers) split into L tensors."""
  out = {}
  for path, x in jax.tree_util.tree_leaves_with_path(tree):
    name = '/'.join(str(k.key) for k in path)
    x = np.asarray(x, np.float64)
    if name.startswith('encoder/layers/'):
      out.update({f'{name}[{layer}]': x[layer] for layer in range(x.shape[0])})
    else:
      out[name] = x
  return out


def reference_decay(name, rate=0.01):
  """run_pretraining.py's `no_decay = ['bias', 'gamma', 'beta', 'LayerNorm']` substring rule
  (the same as the TF code's exclude_from_weight_decay), on our names: LayerNorm modules are
  'layer_norm'; 'gamma'/'beta' were TF-checkpoint names and do not occur."""
  return 0.0 if re.search('bias|layer_norm|LayerNorm|gamma|beta', name) else rate


def tiny_params(scan_layers):
  params = init_params(BertConfig.from_preset('tiny', scan_layers=scan_layers), jax.random.key(0))
  params['nsp']['kernel'] = jnp.zeros_like(params['nsp']['kernel'])  # ||p|| = 0: ratio 1
  return params


def random_grads(params, steps, seed=1):
  """Per-leaf scales over 4 decades; every other step so small that the global norm is < 1
  (no clipping), the others far above it (clipped)."""
  rng = np.random.default_rng(seed)
  leaf_scale = jax.tree_util.tree_map(lambda _: 10 ** rng.uniform(-3, 1), params)
  out = []
  for i in range(steps):
    step_scale = 1.0 if i % 2 == 0 else 1e-5
    out.append(jax.tree_util.tree_map(
        lambda p, s: (rng.standard_normal(p.shape) * s * step_scale).astype(np.float32),
        params, leaf_scale))
  return out


def flat(tree):
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {jax.tree_util.keystr(k): np.asarray(x) for k, x in leaves}


def global_norm(tree):
  leaves = jax.tree_util.tree_leaves(tree)
  return np.sqrt(sum(np.sum(np.square(x, dtype=np.float64)) for x in leaves))


def run_ours(tx, params, grads):
  step = jax.jit(lambda g, s, p: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(g, s, p)))
  state = tx.init(params)
  for g in grads:
    params, state = step(g, state, params)
  return params


def run_reference(step_fn, params, grads, lr_of_update):
  names = list(as_tensors(params))
  p = [as_tensors(params)[n] for n in names]
  m, v = [np.zeros_like(x) for x in p], [np.zeros_like(x) for x in p]
  decay = [reference_decay(n) for n in names]
  for k, g in enumerate(grads, start=1):
    tensors = as_tensors(g)
    step_fn(p, [tensors[n] for n in names], m, v, k, lr_of_update(k), decay)
  return dict(zip(names, p))


# ------------------------------------------------------------------ LAMB and AdamW, 5 steps


@pytest.mark.parametrize('scan_layers', [True, False], ids=['scanned', 'unrolled'])
@pytest.mark.parametrize('name', ['lamb', 'adamw_bert'])
def test_optimizer_matches_its_reference_over_five_steps_on_bert_tiny(name, scan_layers):
  """Whole updates p_5 - p_0 per tensor, BERT-tiny's real tree, steps with and without clipping.

  The bound scales with the compared values: 1e-4 of each tensor's largest reference update,
  plus one float32 rounding of the parameter per step. Float32 against float64 differs by
  round-off (measured up to 2e-5 of the update; reductions differ between CPU kernels, AVX2
  vs AVX-512), while a wrong detail (no bias correction, epsilon 1e-8, one ratio pooled over
  the layers) moves the result by 0.9 to 1.7 of the update.
  """
  params = tiny_params(scan_layers)
  grads = random_grads(params, 5)
  assert [global_norm(g) > 1 for g in grads] == [True, False, True, False, True]
  if name == 'lamb':  # the schedule too: update k uses NVIDIA's lr(k / total)
    schedule = optim.learning_rate_schedule('poly_warmup', 1e-2, 0.4 * 6, 6)
    ref_step, lr_of = apex_lamb_step, lambda k: nvidia_poly_warmup_lr(k, 1e-2, 0.4, 6)
  else:  # google-research/bert's lr at global_step = k - 1 (0 at the first update)
    schedule = optim.learning_rate_schedule('bert', 1e-2, 2, 6)
    ref_step, lr_of = bert_adamw_step, lambda k: reference_bert_lr(k - 1, 1e-2, 2, 6)
  tx = optim.make_optimizer(name, schedule, weight_decay=0.01, eps=1e-6, clip_norm=1.0)
  ours = as_tensors(run_ours(tx, params, grads))
  ref = run_reference(ref_step, params, grads, lr_of)
  start, ulp = as_tensors(params), np.finfo(np.float32).eps
  for n, x in ref.items():
    ref_delta, our_delta = x - start[n], ours[n] - start[n]
    bound = 1e-4 * np.max(np.abs(ref_delta)) + len(grads) * ulp * np.max(np.abs(x))
    assert np.max(np.abs(ref_delta)) > 0, n
    assert np.max(np.abs(our_delta - ref_delta)) <= bound, n


def test_lamb_trust_ratio_is_per_layer_on_scanned_stacks():
  """Two stacked layers, the second 10x smaller, lr 1: LAMB moves each by its own norm
  (ratios 1.0 and 1.0); one ratio pooled over the stack (optax.scale_by_trust_ratio) gives
  0.71 and 7.1."""
  rng = np.random.default_rng(0)
  w = rng.standard_normal((16, 16)).astype(np.float32)
  params = {'encoder': {'layers': {'intermediate': {'kernel': np.stack([w, 0.1 * w])}}}}
  grads = {'encoder': {'layers': {'intermediate': {
      'kernel': rng.standard_normal((2, 16, 16)).astype(np.float32)}}}}
  pooled = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(0.9, 0.999, 1e-6),
                       optax.add_decayed_weights(0.01), optax.scale_by_trust_ratio(),
                       optax.scale_by_learning_rate(1.0))

  def ratios(tx):
    u, _ = tx.update(grads, tx.init(params), params)
    u, p = u['encoder']['layers']['intermediate']['kernel'], np.stack([w, 0.1 * w])
    return [float(np.linalg.norm(u[i]) / np.linalg.norm(p[i])) for i in range(2)]

  np.testing.assert_allclose(ratios(optim.make_optimizer('lamb', lambda _: 1.0)), [1.0, 1.0],
                             rtol=1e-5)
  np.testing.assert_allclose(ratios(pooled), [0.71, 7.1], rtol=1e-2)


def test_lamb_gives_biases_and_layer_norm_a_plain_adam_step():
  """First step: m_hat = g, v_hat = g^2, so no-decay leaves move by -lr * g / (|g| + eps)
  (apex: no ratio where weight decay is 0), decayed kernels by lr * ||p|| per layer."""
  params = tiny_params(scan_layers=True)
  grads = random_grads(params, 1)[0]
  lr = 1e-3
  tx = optim.make_optimizer('lamb', lambda _: lr)
  updates, _ = tx.update(grads, tx.init(params), params)
  norm = global_norm(grads)
  mask, u, g, p = (flat(t) for t in (optim.decay_mask(params), updates, grads, params))
  assert not mask["['encoder']['layers']['attention_layer_norm']['scale']"]
  for key, decayed in mask.items():
    if not decayed:
      gc = g[key] / max(norm, 1.0)
      np.testing.assert_allclose(u[key], -lr * gc / (np.abs(gc) + 1e-6), rtol=1e-5, err_msg=key)
    elif key.startswith("['encoder']['layers']"):
      per_layer = np.linalg.norm(u[key].reshape(2, -1), axis=1)
      np.testing.assert_allclose(per_layer, lr * np.linalg.norm(p[key].reshape(2, -1), axis=1),
                                 rtol=1e-5, err_msg=key)


# ------------------------------------------------------------------ NVIDIA's schedule


@pytest.mark.parametrize('phase,steps', [
    ('lamb_phase1', [0, 1, 1000, 1999, 2000, 2001, 3500, 6500, 7036, 7037]),
    ('lamb_phase2', [0, 1, 198, 199, 200, 201, 1000, 1561, 1562])])
def test_lamb_configs_are_nvidias_recipe(phase, steps):
  """scripts/run_pretraining.sh: global batch 8 GPUs x 8192 / x 4096, lr 6e-3 / 4e-3,
  --warmup_proportion 0.2843 / 0.128, 7038 / 1563 steps; FusedLAMB's defaults; phase 2 resumes
  the moments. The schedule: our count c (updates already applied) is NVIDIA's update
  k = c + 1; bound: float32 arithmetic, relative 1e-6 of each value."""
  batch, base_lr, warmup, total = {'lamb_phase1': (8 * 8192, 6e-3, 0.2843, 7038),
                                   'lamb_phase2': (8 * 4096, 4e-3, 0.128, 1563)}[phase]
  config = bert_large.get_config(phase)
  o = config.optimizer
  assert (config.train.num_steps, config.train.global_batch_size) == (total, batch)
  assert (o.name, o.b1, o.b2, o.eps, o.weight_decay, o.clip_norm) == (
      'lamb', 0.9, 0.999, 1e-6, 0.01, 1.0)
  assert config.train.init_opt_state_from == (phase == 'lamb_phase2')
  _, schedule = optim.from_config(config.optimizer, config.train.num_steps)
  ours = [float(schedule(c)) for c in steps]
  ref = [nvidia_poly_warmup_lr(c + 1, base_lr, warmup, total) for c in steps]
  np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=0)
  assert ours[-1] == 0.0  # NVIDIA's last update: progress 1, lr 0


def test_poly_warmup_gives_the_quoted_phase1_rates():
  """Just after warmup 5.08e-3 (not the peak 6e-3), at step 6,500 1.66e-3 (not 0.64e-3):
  equal to the 3 quoted figures."""
  config = bert_large.get_config('lamb_phase1')
  _, schedule = optim.from_config(config.optimizer, config.train.num_steps)
  assert float(schedule(1999)) < 6e-3  # update 2000 still warms up: 2000 < 0.2843 * 7038
  assert float(schedule(2000)) == pytest.approx(5.08e-3, abs=0.005e-3)
  assert float(schedule(6500)) == pytest.approx(1.66e-3, abs=0.005e-3)


def test_warmup_proportion_errors_name_the_field():
  config = bert_large.get_config('lamb_phase1')
  config.optimizer.warmup_proportion = 1.5
  with pytest.raises(ValueError, match='optimizer.warmup_proportion=1.5'):
    optim.from_config(config.optimizer, config.train.num_steps)


def test_lamb_moments_shard_like_their_params():
  config = bert_large.get_config('lamb_phase1')
  config.model.size, config.mesh = 'tiny', (2, 2, 2)
  shardings = pretrain_step.setup(config).shardings
  for moments in (shardings.opt_state[1].mu, shardings.opt_state[1].nu):
    assert moments['encoder']['layers']['intermediate']['kernel'].spec == P(None, 'fsdp', 'tensor')
