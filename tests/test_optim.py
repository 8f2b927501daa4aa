"""The optimizers and schedules, against their reference algorithms written out in NumPy.

References (the algorithms, re-typed here from their published source):
- google-research/bert optimization.py: `create_optimizer`, `AdamWeightDecayOptimizer`;
- NVIDIA apex apex/optimizers/fused_lamb.py `FusedLAMB.step` and csrc/multi_tensor_lamb.cu
  (`LAMBStage1Functor`, `LAMBStage2Functor`, `multi_tensor_lamb_cuda`);
- NVIDIA DeepLearningExamples PyTorch/LanguageModeling/BERT/schedulers.py
  `PolyWarmUpScheduler`, run_pretraining.py (`no_decay`, FusedLAMB defaults) and
  scripts/run_pretraining.sh (the recipe's numbers);
- AnswerDotAI/ModernBERT src/scheduler.py (`WarmupStableDecayScheduler`,
  `OneMinusSqrtScheduler`), main.py (`build_optimizer`, `param_groups_weight_decay`) and
  torch-optimi 0.2.1 optimi/stableadamw.py (`stableadamw`, `_foreach_stableadamw`), which
  the StableAdamW tests also run directly.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax.model import encoder
from bert_jax.model.encoder import BertConfig
from bert_jax.pretrain import step as pretrain_step
from bert_jax.training import optim
from configs import bert_large, common, upgrade

# Jitted: an eager Flax init dispatches and compiles op by op, ~3x the time (same values).
init_params = jax.jit(encoder.init_params, static_argnums=0)


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
  updates, _ = jax.jit(tx.update)(grads, jax.jit(tx.init)(params), params)  # one compile, not
  norm = global_norm(grads)  # one per op of a whole model's tree
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


@pytest.mark.multi_device
def test_lamb_moments_shard_like_their_params():
  config = bert_large.get_config('lamb_phase1')
  config.model.size, config.mesh = 'tiny', (2, 2, 2)
  shardings = pretrain_step.setup(config).shardings
  for moments in (shardings.opt_state[1].mu, shardings.opt_state[1].nu):
    assert moments['encoder']['layers']['intermediate']['kernel'].spec == P(None, 'fsdp', 'tensor')


# ------------------------------------------------------------------ ModernBERT's wsd schedule


def modernbert_lr(t, peak, warmup, decay, total, alpha_f, shape):
  """ModernBERT src/scheduler.py at state.timestamp = t, re-typed: warmup is composer's
  LinearScheduler(alpha_i=1e-10, alpha_f=1.0); then `WarmupStableDecayScheduler` (linear)
  or `OneMinusSqrtScheduler`'s formula (1-sqrt)."""
  if t < warmup:
    return peak * (1e-10 + min(1.0, t / warmup) * (1.0 - 1e-10))
  if t < total - decay:
    return peak
  x = (t - (total - decay)) / decay
  if shape == 'linear':
    return peak * max(0.0, 1.0 - x * (1.0 - alpha_f))
  return peak * max(alpha_f, alpha_f + (1.0 - alpha_f) * (1.0 - math.sqrt(x)))


# peak 1e-3, 10 warmup steps, 100 steps, the last 20 decaying (from step 80); by hand.
WSD_POINTS = {  # step: (linear, 1-sqrt) for final_lr_ratio 0, then for 0.1
    0: ((1e-13, 1e-13), (1e-13, 1e-13)),  # composer's warmup starts at 1e-10 x peak
    5: ((5e-4, 5e-4), (5e-4, 5e-4)),
    10: ((1e-3, 1e-3), (1e-3, 1e-3)),
    79: ((1e-3, 1e-3), (1e-3, 1e-3)),
    80: ((1e-3, 1e-3), (1e-3, 1e-3)),  # decay start: progress 0
    90: ((5e-4, 1e-3 * (1 - 0.5 ** 0.5)), (5.5e-4, 1e-4 + 9e-4 * (1 - 0.5 ** 0.5))),
    99: ((5e-5, 1e-3 * (1 - 0.95 ** 0.5)), (1.45e-4, 1e-4 + 9e-4 * (1 - 0.95 ** 0.5))),
    100: ((0.0, 0.0), (1e-4, 1e-4)),
}


@pytest.mark.parametrize('final', [0.0, 0.1])
@pytest.mark.parametrize('shape', ['linear', '1-sqrt'])
def test_wsd_schedule_equals_hand_computed_values(shape, final):
  schedule = optim.learning_rate_schedule('wsd', 1e-3, 10, 100, decay_proportion=0.2,
                                          decay_shape=shape, final_lr_ratio=final)
  for step, values in WSD_POINTS.items():
    expected = values[final == 0.1][shape == '1-sqrt']
    np.testing.assert_allclose(float(schedule(step)), expected, rtol=2e-6, atol=1e-12,
                               err_msg=f'step {step}')


@pytest.mark.parametrize('warmup,proportion,total,final,shape', [
    (10, 0.2, 100, 0.0, 'linear'),
    (7, 0.3, 50, 0.02, '1-sqrt'),
    (0, 1.0, 60, 0.001, '1-sqrt'),  # modernbert-*-learning-rate-decay.yaml: decay all run
    (12, 0.0, 40, 0.0, 'linear')])  # modernbert-*-pretrain.yaml: t_decay 0, no decay
def test_wsd_schedule_equals_modernberts_at_every_step(warmup, proportion, total, final, shape):
  """Our count c (updates applied) is composer's state.timestamp; float32 arithmetic."""
  schedule = optim.learning_rate_schedule('wsd', 8e-4, warmup, total, decay_proportion=proportion,
                                          decay_shape=shape, final_lr_ratio=final)
  decay = round(proportion * total)
  ours = [float(schedule(c)) for c in range(total)]
  ref = [modernbert_lr(c, 8e-4, warmup, decay, total, final, shape) for c in range(total)]
  np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-7 * 8e-4)


@pytest.mark.parametrize('kwargs,message', [
    (dict(decay_proportion=1.5), 'optimizer.decay_proportion=1.5'),
    (dict(decay_proportion=0.95), r'warmup of 10 steps .* decay of 95 .* exceed'),
    (dict(decay_shape='cosine'), "optimizer.decay_shape='cosine'"),
    (dict(final_lr_ratio=2.0), 'optimizer.final_lr_ratio=2.0')])
def test_wsd_errors_name_the_field(kwargs, message):
  with pytest.raises(ValueError, match=message):
    optim.learning_rate_schedule('wsd', 1e-3, 10, 100, **kwargs)


def test_from_config_reads_old_configs_without_the_new_fields():
  """config.json of runs from before wsd / stable_adamw, upgraded as loading does: the same
  optimizer as today's defaults, which leave existing runs unchanged (bert schedule,
  adamw_bert)."""
  new = common.base_config().optimizer
  old_config = common.base_config()
  for field in ('warmup_proportion', 'decay_proportion', 'decay_shape', 'final_lr_ratio',
                'fuse_qkv_rms'):
    del old_config.optimizer[field]
  old = upgrade.upgrade_config(old_config).optimizer
  assert (new.name, new.schedule) == ('adamw_bert', 'bert')
  params = {'dense': {'kernel': jnp.ones((3, 4)), 'bias': jnp.ones(4)}}
  grads = jax.tree_util.tree_map(lambda p: p * 0.5, params)
  outs = []
  for cfg in (old, new):
    tx, schedule = optim.from_config(cfg, 1000)
    outs.append((float(schedule(500)), tx.update(grads, tx.init(params), params)[0]))
  assert outs[0][0] == outs[1][0]
  jax.tree_util.tree_map(np.testing.assert_array_equal, outs[0][1], outs[1][1])


# ------------------------------------------------------------------ ModernBERT's StableAdamW


def optimi_stableadamw_step(p, g, m, v, step, lr, max_lr, decay, b1, b2, eps):
  """torch-optimi 0.2.1 `stableadamw` + `_foreach_stableadamw` with decouple_lr=True, on lists
  of tensors, in place; returns each tensor's rms."""
  debias = lambda beta: (beta ** step - beta) / (beta ** step - 1)  # optimi/utils.py
  b1_hat, b2_hat = debias(b1), debias(b2)
  rms = []
  for i in range(len(p)):
    m[i] = m[i] + (1 - b1_hat) * (g[i] - m[i])  # exp_avg.lerp_(grad, beta1_comp)
    v[i] = v[i] * b2_hat + (1 - b2_hat) * g[i] * g[i]
    rms.append(np.sqrt(np.mean(g[i] ** 2 / np.maximum(v[i], eps ** 2))))
    lr_i = lr / max(1.0, rms[-1])
    if decay[i]:
      p[i] = p[i] * (1 - (lr_i / max_lr) * decay[i])
    p[i] = p[i] - lr_i * m[i] / (np.sqrt(v[i]) + eps)
  return rms


def torch_tensors(tree, fuse_qkv):
  """{name: (flat float64 array, torch ndim)}: the tensors ModernBERT's torch model holds. A
  scanned [L, ...] stack is L tensors; with `fuse_qkv` one layer's query, key and value
  kernels (biases) are one `Wqkv` weight (bias). Adam is elementwise and the rms a mean, so
  the order inside a fused tensor does not matter."""
  out = {}
  for name, x in as_tensors(tree).items():
    parts = name.split('/')
    ndim = x.ndim
    if fuse_qkv and len(parts) >= 3 and parts[-2].split('[')[0] in ('query', 'key', 'value'):
      parts[-2] = 'Wqkv'
      ndim = 2 if parts[-1].startswith('kernel') else 1
    key = '/'.join(parts)
    prev = out.get(key, (np.zeros(0), ndim))[0]
    out[key] = (np.concatenate([prev, x.ravel()]), ndim)
  return out


def modernbert_decay(name, ndim, rate):
  """main.py `param_groups_weight_decay` (timm): no decay where ndim <= 1 or '.bias'; our
  attention biases are [heads, head_dim] (torch: 1-D), hence the name test on them."""
  return 0.0 if ndim <= 1 or name.split('[')[0].endswith('bias') else rate


def stable_grads(params, seed=3):
  """Steps 1 and 3 at the leaves' own scales (3: clipped, v still remembers step 2), step 2
  1e-5 of that (never clipped), step 4 layer 1 x 3 (clipped) and layer 0 x 1e-3 (not)."""
  grads = random_grads(params, 3, seed)

  def layer_split(path, g):
    names = [str(k.key) for k in path]
    if names[:2] == ['encoder', 'layers']:
      return np.stack([g[0] * 1e-3, g[1] * 3])
    if names[0] == 'encoder' and names[1].startswith('layer_'):
      return g * (1e-3 if names[1] == 'layer_0' else 3)
    return g

  return grads + [jax.tree_util.tree_map_with_path(layer_split, grads[2])]


def numpy_stable_reference(params, grads, lrs, fuse_qkv, wd, b1=0.9, b2=0.98, eps=1e-6):
  """optimi's StableAdamW in float64 on ModernBERT's tensors and param groups, max_lr = lrs[0]
  (the peak): the final tensors and, per step, each tensor's rms (> 1: clipped)."""
  start = torch_tensors(params, fuse_qkv)
  names = list(start)
  decay = [modernbert_decay(n, start[n][1], wd) for n in names]
  p = [start[n][0].copy() for n in names]
  m, v = [np.zeros_like(x) for x in p], [np.zeros_like(x) for x in p]
  rms = []
  for k, (g, lr) in enumerate(zip(grads, lrs), start=1):
    tensors = torch_tensors(g, fuse_qkv)
    r = optimi_stableadamw_step(p, [tensors[n][0] for n in names], m, v, k, lr, lrs[0], decay,
                                b1, b2, eps)
    rms.append(dict(zip(names, r)))
  return dict(zip(names, p)), rms


def optimi_stable_reference(params, grads, lrs, fuse_qkv, wd, b1=0.9, b2=0.98, eps=1e-6):
  """torch-optimi's own StableAdamW (foreach: the code ModernBERT's src/optimizer.py copies),
  float32, with main.py's two param groups and max_lr left to default to lrs[0]."""
  import optimi  # torch-optimi, requirements-dev.txt
  import torch
  start = torch_tensors(params, fuse_qkv)
  names = list(start)
  tensors = {n: torch.nn.Parameter(torch.tensor(start[n][0], dtype=torch.float32))
             for n in names}
  no_decay = {n for n in names if not modernbert_decay(n, start[n][1], wd)}
  groups = [{'params': [tensors[n] for n in names if n in no_decay], 'weight_decay': 0.0},
            {'params': [tensors[n] for n in names if n not in no_decay], 'weight_decay': wd}]
  opt = optimi.StableAdamW(groups, lr=lrs[0], betas=(b1, b2), eps=eps, weight_decay=wd,
                           decouple_lr=True, foreach=True)
  assert all(g['max_lr'] == lrs[0] for g in opt.param_groups)
  for g, lr in zip(grads, lrs):
    step = torch_tensors(g, fuse_qkv)
    for n in names:
      tensors[n].grad = torch.tensor(step[n][0], dtype=torch.float32)
    for group in opt.param_groups:
      group['lr'] = lr  # as composer's LambdaLR sets it
    opt.step()
  return {n: tensors[n].detach().numpy().astype(np.float64) for n in names}


def assert_same_updates(ours, ref, start, steps):
  """Whole updates p_T - p_0 per tensor, bounded as in the 5-step LAMB/AdamW test."""
  ulp = np.finfo(np.float32).eps
  for n, x in ref.items():
    ref_delta, our_delta = x - start[n][0], ours[n][0] - start[n][0]
    bound = 1e-4 * np.max(np.abs(ref_delta)) + steps * ulp * np.max(np.abs(x))
    assert np.max(np.abs(ref_delta)) > 0, n
    assert np.max(np.abs(our_delta - ref_delta)) <= bound, n


def stable_recipe(fuse_qkv, wd=0.1):
  """ModernBERT's optimizer block (yamls/modernbert/*.yaml) through our config, with a
  1-sqrt decay that moves the rate within 4 steps (1, 1, 0.42, 0.18 x peak), and a decay
  large enough to see (ModernBERT's 1e-5 would vanish in round-off)."""
  return common.optimizer_block(
      name='stable_adamw', learning_rate=1e-2, b1=0.9, b2=0.98, eps=1e-6, weight_decay=wd,
      clip_norm=0.0, fuse_qkv_rms=fuse_qkv, schedule='wsd', warmup_steps=0,
      decay_proportion=0.75, decay_shape='1-sqrt', final_lr_ratio=0.0)


@pytest.mark.filterwarnings('ignore:You are using weight_decay=0.1')  # optimi: high on purpose
@pytest.mark.parametrize('scan_layers', [True, False], ids=['scanned', 'unrolled'])
@pytest.mark.parametrize('arch', ['bert', 'modern'])
@pytest.mark.parametrize('reference', ['numpy', 'optimi'])
def test_stable_adamw_matches_optimi_over_four_steps(reference, arch, scan_layers):
  """Both tiny trees, via from_config; modern fuses q/k/v as FlexBERT's Wqkv. The reference's
  own rms shows both regimes are exercised: nothing clipped at steps 1-2, most tensors at
  step 3, at step 4 every layer-1 tensor and no layer-0 one (per layer slice)."""
  cfg = BertConfig.from_preset('tiny', arch=arch, scan_layers=scan_layers)
  params = init_params(cfg, jax.random.key(0))
  grads = stable_grads(params)
  fuse = arch == 'modern'
  tx, schedule = optim.from_config(stable_recipe(fuse), 4)
  lrs = [modernbert_lr(c, 1e-2, 0, 3, 4, 0.0, '1-sqrt') for c in range(4)]
  np.testing.assert_allclose([float(schedule(c)) for c in range(4)], lrs, rtol=1e-6)
  ours = torch_tensors(run_ours(tx, params, grads), fuse)
  ref, rms = numpy_stable_reference(params, grads, lrs, fuse, wd=0.1)
  assert max(max(r.values()) for r in rms[:2]) <= 1 + 1e-6
  assert np.mean([r > 1 for r in rms[2].values()]) > 0.5
  layer = lambda n, i: ('/layers/' in n and n.endswith(f'[{i}]')) or f'/layer_{i}/' in n
  for i, clipped in ((0, False), (1, True)):
    assert {rms[3][n] > 1 for n in rms[3] if layer(n, i)} == {clipped}, i
  if reference == 'optimi':
    ref = optimi_stable_reference(params, grads, lrs, fuse, wd=0.1)
  assert_same_updates(ours, ref, torch_tensors(params, fuse), len(grads))


def test_stable_adamw_clips_each_layer_slice_by_hand():
  """A [2, 8, 8] stack and a plain kernel + bias, 2 steps, lr 0.1 = max_lr, wd 0.05.
  Step 1 by hand: m = g, v = g^2, rms = 1 (no clip): p - 0.1 g / (|g| + eps) - 0.05 p
  (fully decoupled: lr / max_lr x wd), biases without the last term.
  Step 2: layer 0 gets 1e-3 x, layer 1 5 x its step-1 gradient: layer 1's rms is
  sqrt(25 / (b2_hat + 25 (1 - b2_hat))) = 1.3803 (b2_hat = 0.98 / 1.98), so it moves 1.38 x
  less than unclipped, layer 0 not at all less; one rms pooled over the stack (optax-style, one
  leaf one tensor) would be 0.98 and clip neither."""
  rng = np.random.default_rng(0)
  params = {'encoder': {'layers': {'output': {'kernel': rng.standard_normal((2, 8, 8))}}},
            'dense': {'kernel': rng.standard_normal((4, 3)), 'bias': rng.standard_normal(3)}}
  params = jax.tree_util.tree_map(lambda x: x.astype(np.float32), params)
  g1 = jax.tree_util.tree_map(lambda x: rng.standard_normal(x.shape).astype(np.float32), params)
  g2 = jax.tree_util.tree_map(lambda x: x * 0.5, g1)  # dense: rms < 1
  g2['encoder']['layers']['output']['kernel'] = g1['encoder']['layers']['output']['kernel'] * (
      np.array([1e-3, 5.0], np.float32)[:, None, None])
  tx = optim.make_optimizer('stable_adamw', lambda _: 0.1, weight_decay=0.05, max_lr=0.1,
                            b2=0.98, clip_norm=None)
  state = tx.init(params)
  u1, state = tx.update(g1, state, params)
  p1 = optax.apply_updates(params, u1)
  leaves = zip(jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(g1),
               jax.tree_util.tree_leaves(p1))
  for (path, p), g, new in leaves:
    decay = 0.0 if path[-1].key == 'bias' else 0.05
    np.testing.assert_allclose(new, p - 0.1 * g / (np.abs(g) + 1e-6) - decay * p, rtol=1e-5,
                               atol=1e-6, err_msg=jax.tree_util.keystr(path))
  u2, _ = tx.update(g2, state, p1)
  b2_hat = 0.98 / 1.98
  assert math.sqrt(25 / (b2_hat + 25 * (1 - b2_hat))) == pytest.approx(1.3803, abs=1e-4)
  ref, rms = numpy_stable_reference(params, [g1, g2], [0.1, 0.1], False, wd=0.05)
  assert rms[1]['encoder/layers/output/kernel[1]'] == pytest.approx(1.3803, abs=1e-4)
  assert rms[1]['encoder/layers/output/kernel[0]'] < 1
  assert rms[1]['dense/kernel'] < 1
  ours = torch_tensors(optax.apply_updates(p1, u2), False)
  assert_same_updates(ours, ref, torch_tensors(params, False), 2)
  # Per layer slice, not pooled: pooled, layer 1 would not be clipped.
  kernel = lambda t: t['encoder']['layers']['output']['kernel']
  v = b2_hat * kernel(g1) ** 2 + (1 - b2_hat) * kernel(g2) ** 2
  pooled = math.sqrt(np.mean(kernel(g2) ** 2 / v))
  per_layer = np.sqrt(np.mean(kernel(g2) ** 2 / v, axis=(1, 2)))
  assert pooled == pytest.approx(0.976, abs=1e-3) and per_layer[0] < 1 < per_layer[1]
  m = 0.9 / 1.9 * kernel(g1) + 1 / 1.9 * kernel(g2)  # b1_hat = 0.9 / 1.9
  unclipped = -0.1 * (m / (np.sqrt(v) + 1e-6) + 0.5 * kernel(p1))  # wd / max_lr = 0.5
  np.testing.assert_allclose(kernel(u2)[0], unclipped[0], rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(kernel(u2)[1], unclipped[1] / per_layer[1], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize('scan_layers', [True, False], ids=['scanned', 'unrolled'])
@pytest.mark.parametrize('arch', ['bert', 'modern'])
def test_decay_mask_is_modernberts_rule(arch, scan_layers):
  """main.py `param_groups_weight_decay` on the torch tensors (ndim <= 1 or a bias), and for
  BERT still google-research/bert's rule: the 'norm' names cover ModernBERT's final_norm."""
  cfg = BertConfig.from_preset('tiny', arch=arch, scan_layers=scan_layers)
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  mask = dict(jax.tree_util.tree_leaves_with_path(optim.decay_mask(params)))
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = '/'.join(str(k.key) for k in path)
    ndim = leaf.ndim - optim.is_layer_stacked(path)
    assert mask[path] == bool(modernbert_decay(name, ndim, 1.0)), name
    if arch == 'bert':
      assert mask[path] == bool(reference_decay(name)), name
  if arch == 'modern':
    assert not optim.decay_mask(params)['encoder']['final_norm']['scale']


def test_stable_adamw_needs_the_peak_for_its_decay():
  with pytest.raises(ValueError, match='max_lr'):
    optim.make_optimizer('stable_adamw', lambda _: 1e-3, weight_decay=1e-5)


@pytest.mark.multi_device
def test_stable_adamw_moments_shard_like_their_params():
  config = bert_large.get_config('lamb_phase1')
  config.model.size, config.mesh = 'tiny', (2, 2, 2)
  config.optimizer.update(stable_recipe(fuse_qkv=False, wd=1e-5))
  state = pretrain_step.setup(config).shardings.opt_state[0]
  for moments in (state.mu, state.nu):
    assert moments['encoder']['layers']['intermediate']['kernel'].spec == P(None, 'fsdp', 'tensor')
