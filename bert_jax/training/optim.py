"""Learning-rate schedules and optimizers of the BERT papers, in optax.

`adamw_bert` is google-research/bert's `AdamWeightDecayOptimizer`: Adam *without* bias
correction, epsilon 1e-6, decoupled weight decay (scaled by the learning rate) that skips
LayerNorm parameters and biases, after clipping gradients to global norm 1.0. Its schedule
(`bert`) is a linear decay from step 0 to 0 at the last step, overridden by a linear warmup
for the first steps; note that it therefore peaks below the nominal rate
(lr * (1 - warmup/total)). `warmup_linear` is the usual warmup-then-decay-from-the-peak.

`lamb` is NVIDIA's large-batch optimizer as apex `FusedLAMB` computes it
(apex/optimizers/fused_lamb.py `FusedLAMB.step`, csrc/multi_tensor_lamb.cu
`LAMBStage1Functor`, `LAMBStage2Functor`, `multi_tensor_lamb_cuda`), with the defaults
DeepLearningExamples' PyTorch/LanguageModeling/BERT/run_pretraining.py leaves in place:

1. one global gradient norm over all parameters; gradients divided by max(1, norm / 1.0)
   *before* the moments (`clipped_global_grad_norm` in `LAMBStage1Functor`);
2. Adam moments with bias correction 1 - beta^t, t counting from 1
   (`multi_tensor_lamb_cuda`: `bias_correction1 = 1 - pow(beta1, step)`);
3. update = m_hat / (sqrt(v_hat) + eps) + wd * p (decoupled decay, `adam_w_mode=True`);
4. one trust ratio ||p|| / ||update|| *per tensor*, and 1 where either norm is 0
   (`LAMBStage2Functor`). NVIDIA's model holds each layer's weights in separate tensors, so
   for our scanned layers (every leaf under params['encoder']['layers'] is one [L, ...]
   array) the ratio is taken per layer slice; unrolled layers (params['encoder']['layer_<i>'])
   are separate leaves already;
5. no trust ratio where weight decay is 0 (`use_nvlamb=False`: "only apply to those with
   non-zero weight decay"): biases and LayerNorm take a plain bias-corrected Adam step;
6. p -= lr * ratio * update.

`poly_warmup` is DeepLearningExamples' `PolyWarmUpScheduler` (schedulers.py), used by
run_pretraining.py with degree 0.5 and warmup given as a proportion of the phase's steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ('bert', 'warmup_linear', 'constant', 'poly_warmup')
OPTIMIZERS = ('adamw_bert', 'adamw', 'lamb')


def learning_rate_schedule(name: str, peak: float, warmup_steps: float,
                           total_steps: int) -> optax.Schedule:
  """`warmup_steps` may be fractional for `poly_warmup` (NVIDIA's proportion x steps); the
  other schedules round it to whole steps."""
  if name not in SCHEDULES:
    raise ValueError(f'optimizer.schedule={name!r}: expected one of {SCHEDULES}')
  if total_steps <= 0:
    raise ValueError(f'total_steps={total_steps} must be positive')
  if name == 'poly_warmup':
    return poly_warmup_schedule(peak, warmup_steps, total_steps)
  warmup = max(int(round(warmup_steps)), 0)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = peak * step / max(warmup, 1)
    if name == 'bert':
      decayed = peak * (1.0 - jnp.minimum(step, total_steps) / total_steps)
    elif name == 'warmup_linear':
      frac = (step - warmup) / max(total_steps - warmup, 1)
      decayed = peak * (1.0 - jnp.clip(frac, 0.0, 1.0))
    else:
      decayed = jnp.full_like(step, peak)
    return jnp.where(step < warmup, warm, decayed)

  return schedule


def poly_warmup_schedule(peak: float, warmup_steps: float, total_steps: int,
                         degree: float = 0.5) -> optax.Schedule:
  """NVIDIA's `PolyWarmUpScheduler.get_lr`: with progress = k / total,
  lr = peak * progress / warmup while progress < warmup, else peak * (1 - progress)^degree,
  where warmup is the proportion `warmup_steps / total_steps`.

  Step numbering: NVIDIA's `PolyWarmUpScheduler.step` runs before each optimizer step and sets
  k = param_group['step'] + 1, the count `FusedLAMB.step` is about to reach, so the k-th update
  (k = 1..total) uses progress k / total: the first update is already warming up, and the
  last one (k = total) has lr 0. Our argument is optax's 0-based count of updates already
  applied, hence k = count + 1. Past the end (k > total, where NVIDIA's power of a negative
  number would give NaN) the rate stays 0.
  """
  if not 0 <= warmup_steps < total_steps:
    raise ValueError(f'warmup of {warmup_steps} steps must be in [0, total_steps='
                     f'{total_steps}): check optimizer.warmup_proportion / warmup_steps')
  warmup = warmup_steps / total_steps

  def schedule(count):
    k = jnp.asarray(count, jnp.float32) + 1.0
    progress = k / total_steps
    # 1 - progress as (total - k) / total: exact near the end, where float32 1 - k/total
    # would lose up to 4e-4 of its value.
    remaining = jnp.maximum(total_steps - k, 0.0) / total_steps
    decayed = peak * jnp.power(remaining, degree)
    if warmup == 0:
      return decayed
    return jnp.where(progress < warmup, peak * progress / warmup, decayed)

  return schedule


def _names(path) -> list[str]:
  return [str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path]


def decay_mask(params) -> Any:
  """True for parameters that get weight decay: everything but LayerNorm and biases."""

  def keep(path, _):
    names = _names(path)
    return not (names[-1] in ('bias', 'mlm_output_bias') or
                any('layer_norm' in n for n in names))

  return jax.tree_util.tree_map_with_path(keep, params)


def is_layer_stacked(path) -> bool:
  """Whether a leaf is a scanned [L, ...] stack: everything under params['encoder']['layers']
  (bert_jax/model/encoder.py `Encoder`; unrolled layers are named 'layer_<i>' instead)."""
  return _names(path)[:2] == ['encoder', 'layers']


class ScaleByAdamNoBiasState(NamedTuple):
  mu: Any
  nu: Any


def scale_by_adam_without_bias_correction(b1: float = 0.9, b2: float = 0.999,
                                          eps: float = 1e-6) -> optax.GradientTransformation:
  """m / (sqrt(v) + eps) with raw moving averages, as google-research/bert's optimization.py."""

  def init(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return ScaleByAdamNoBiasState(jax.tree_util.tree_map(zeros, params),
                                  jax.tree_util.tree_map(zeros, params))

  def update(updates, state, params=None):
    del params
    mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    out = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return out, ScaleByAdamNoBiasState(mu, nu)

  return optax.GradientTransformation(init, update)


def _trust_ratio(update: jax.Array, param: jax.Array, per_layer: bool) -> jax.Array:
  """||p|| / ||u|| over the tensor (each layer slice of a stack), 1 where a norm is 0."""
  axes = tuple(range(1, update.ndim)) if per_layer else None
  norm = lambda x: jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axes, keepdims=True))
  p_norm, u_norm = norm(param), norm(update)
  ok = (p_norm > 0) & (u_norm > 0)
  return jnp.where(ok, p_norm / jnp.where(ok, u_norm, 1.0), 1.0)


def scale_by_layerwise_trust_ratio(mask=decay_mask) -> optax.GradientTransformation:
  """apex `LAMBStage2Functor`'s ratio, on the leaves where `mask(params)` is True (the
  weight-decayed ones), one ratio per tensor and per layer slice of scanned stacks.

  optax.scale_by_trust_ratio takes one norm over a whole leaf: on [L, ...] stacks that pools
  all layers into a single ratio. Stateless, so the optimizer state stays Adam's."""

  def update(updates, state, params):
    if params is None:
      raise ValueError('LAMB needs the params: call tx.update(grads, state, params)')

    def scale(path, u, p, on):
      return u * _trust_ratio(u, p, is_layer_stacked(path)).astype(u.dtype) if on else u

    return jax.tree_util.tree_map_with_path(scale, updates, params, mask(params)), state

  return optax.GradientTransformation(optax.init_empty_state, update)


def make_optimizer(name: str, schedule: optax.Schedule, *, weight_decay: float = 0.01,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                   clip_norm: float | None = 1.0) -> optax.GradientTransformation:
  """The chain: clip, Adam moments, decoupled decay, [LAMB ratio], -lr."""
  if name not in OPTIMIZERS:
    raise ValueError(f'optimizer.name={name!r}: expected one of {OPTIMIZERS}')
  chain = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
  chain.append(scale_by_adam_without_bias_correction(b1, b2, eps) if name == 'adamw_bert'
               else optax.scale_by_adam(b1, b2, eps))
  if weight_decay:
    chain.append(optax.add_decayed_weights(weight_decay, mask=decay_mask))
    if name == 'lamb':  # apex: no ratio at all where decay is 0 (use_nvlamb=False)
      chain.append(scale_by_layerwise_trust_ratio(decay_mask))
  chain.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*chain)


def from_config(opt_cfg, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """`optimizer.warmup_proportion` > 0 (NVIDIA's --warmup_proportion) replaces warmup_steps by
  proportion x total_steps; older configs (config.json of earlier runs) lack the field."""
  warmup = opt_cfg.warmup_steps
  proportion = opt_cfg.get('warmup_proportion', 0.0) or 0.0
  if proportion:
    if not 0 < proportion < 1:
      raise ValueError(f'optimizer.warmup_proportion={proportion}: must be in [0, 1) '
                       '(0 = use optimizer.warmup_steps)')
    warmup = proportion * total_steps
  schedule = learning_rate_schedule(opt_cfg.schedule, opt_cfg.learning_rate, warmup, total_steps)
  tx = make_optimizer(opt_cfg.name, schedule, weight_decay=opt_cfg.weight_decay,
                      b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                      clip_norm=opt_cfg.clip_norm or None)
  return tx, schedule
