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

`stable_adamw` and `wsd` are ModernBERT's recipe (Warner et al. 2024; AnswerDotAI/ModernBERT
main.py `build_optimizer` 'decoupled_stableadamw' and `build_scheduler`, with
yamls/modernbert/modernbert-{base,large}-*.yaml): StableAdamW as torch-optimi 0.2.1 computes
it (optimi/stableadamw.py `stableadamw`, `_foreach_stableadamw`; ModernBERT's
src/optimizer.py is the same foreach code plus gradient-norm logging), with
`decouple_lr=True` and `max_lr` left None, which optimi/optimizer.py `OptimiOptimizer.__init__`
sets to the initial (peak) lr. For each update t = 1, 2, ... and each tensor:

1. debiased betas b_hat = (b^t - b) / (b^t - 1) (optimi/utils.py `debias_beta`), so the
   moments themselves are bias-corrected: m = b1_hat m + (1 - b1_hat) g, likewise v with g^2;
2. rms = sqrt(mean(g^2 / max(v, eps^2))) over the tensor, and lr_t = lr / max(1, rms):
   the update clipping of Wortsman et al. 2023, which replaces gradient clipping (ModernBERT
   runs no `gradient_clipping` algorithm and main.py warns when one is set);
3. fully decoupled weight decay, scaled by the *clipped* rate over the peak:
   p *= 1 - (lr_t / max_lr) * wd, then p -= lr_t * m / (sqrt(v) + eps).

ModernBERT's decay groups (`filter_bias_norm_wd: true`, main.py `param_groups_weight_decay`
from timm) skip every parameter with ndim <= 1 or a name ending in '.bias': norms and biases,
which is what `decay_mask` excludes. "Tensor" is what torch holds: each layer slice of a
scanned stack is one, and with `fuse_qkv_rms` one layer's query, key and value count as one
(FlexBERT's fused `Wqkv` Linear, src/bert_layers/attention.py).
ModernBERT's recipe: betas (0.9, 0.98), eps 1e-6, weight_decay 1e-5, clip_norm 0.

`wsd` is warmup, constant, decay (ModernBERT src/scheduler.py `WarmupStableDecayScheduler`,
linear decay, and `OneMinusSqrtScheduler`'s 1 - sqrt decay, Hägele et al. 2024).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from absl import logging

SCHEDULES = ('bert', 'warmup_linear', 'constant', 'poly_warmup', 'wsd')
OPTIMIZERS = ('adamw_bert', 'adamw', 'lamb', 'stable_adamw')
DECAY_SHAPES = ('linear', '1-sqrt')


def learning_rate_schedule(name: str, peak: float, warmup_steps: float, total_steps: int, *,
                           decay_proportion: float = 0.1, decay_shape: str = 'linear',
                           final_lr_ratio: float = 0.0) -> optax.Schedule:
  """`warmup_steps` may be fractional for `poly_warmup` (NVIDIA's proportion x steps); the
  other schedules round it to whole steps. The keyword arguments are `wsd`'s only."""
  if name not in SCHEDULES:
    raise ValueError(f'optimizer.schedule={name!r}: expected one of {SCHEDULES}')
  if total_steps <= 0:
    raise ValueError(f'total_steps={total_steps} must be positive')
  if name == 'poly_warmup':
    return poly_warmup_schedule(peak, warmup_steps, total_steps)
  if name == 'wsd':
    return wsd_schedule(peak, warmup_steps, total_steps, decay_proportion, decay_shape,
                        final_lr_ratio)
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


def wsd_schedule(peak: float, warmup_steps: float, total_steps: int,
                 decay_proportion: float = 0.1, decay_shape: str = 'linear',
                 final_lr_ratio: float = 0.0) -> optax.Schedule:
  """Warmup-stable-decay, as ModernBERT's src/scheduler.py: with W warmup steps, D =
  round(decay_proportion x total) decay steps, T = total and r = final_lr_ratio,

    t < W:          peak * (1e-10 + (1 - 1e-10) t / W)  (composer `LinearScheduler`, alpha_i=1e-10)
    W <= t < T - D: peak
    T - D <= t:     peak * (r + (1 - r) (1 - s)), s = x ('linear', `WarmupStableDecayScheduler`)
                    or sqrt(x) ('1-sqrt', `OneMinusSqrtScheduler`), x = (t - (T - D)) / D.

  Step numbering: those schedulers read `state.timestamp`, the batches already trained, which
  is optax's count, so the first update has t = 0 and the last t = T - 1 (lr just above r x
  peak; r x peak itself is reached at t = T). Composer's Trainer (0.22, trainer.py
  `_train_loop`) steps its LambdaLR before advancing the timestamp, so there update k >= 1
  actually ran at t = k - 1; we do not copy that one-step lag. Past T the rate stays r x peak
  (ModernBERT's linear branch would fall on to 0). ModernBERT gives t_decay in tokens or as a
  share of the run ('0.1dur', its default, truncated to whole units by composer
  `_convert_time`); here it is a share, rounded to whole steps.
  """
  if decay_shape not in DECAY_SHAPES:
    raise ValueError(f'optimizer.decay_shape={decay_shape!r}: expected one of {DECAY_SHAPES}')
  if not 0 <= decay_proportion <= 1:
    raise ValueError(f'optimizer.decay_proportion={decay_proportion}: must be in [0, 1], the '
                     'share of the run spent decaying (1 = decay over the whole run)')
  if not 0 <= final_lr_ratio <= 1:
    raise ValueError(f'optimizer.final_lr_ratio={final_lr_ratio}: must be in [0, 1] (the '
                     'rate at the end of the decay / optimizer.learning_rate)')
  warmup = max(int(round(warmup_steps)), 0)
  decay = int(round(decay_proportion * total_steps))
  if warmup + decay > total_steps:
    raise ValueError(f'warmup of {warmup} steps (optimizer.warmup_steps / warmup_proportion) + '
                     f'decay of {decay} (optimizer.decay_proportion={decay_proportion} x '
                     f'{total_steps}) exceed the run\'s {total_steps} steps: shorten one')
  start = total_steps - decay

  def schedule(count):
    t = jnp.asarray(count, jnp.float32)
    warm = peak * (1e-10 + (1.0 - 1e-10) * t / max(warmup, 1))
    x = jnp.clip((t - start) / max(decay, 1), 0.0, 1.0)
    fall = x if decay_shape == 'linear' else jnp.sqrt(x)
    decayed = peak * (final_lr_ratio + (1.0 - final_lr_ratio) * (1.0 - fall))
    return jnp.where(t < warmup, warm, jnp.where(t < start, peak, decayed))

  return schedule


def _names(path) -> list[str]:
  return [str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path]


def decay_mask(params) -> Any:
  """True for parameters that get weight decay: everything but norms and biases.

  Norms are the modules with 'norm' in their name: BERT's 'layer_norm',
  'attention_layer_norm', 'output_layer_norm', 'mlm_layer_norm', and ModernBERT's
  'final_norm' (or any '*_norm'). google-research/bert's exclude_from_weight_decay
  (["LayerNorm", "layer_norm", "bias"]), NVIDIA's `no_decay` and ModernBERT's ndim <= 1 rule
  all skip exactly these."""

  def keep(path, _):
    names = _names(path)
    return not (names[-1] in ('bias', 'mlm_output_bias') or any('norm' in n for n in names))

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


class ScaleByStableAdamWState(NamedTuple):
  count: jax.Array  # updates applied
  mu: Any  # optimi's exp_avg: already bias-corrected (debiased betas)
  nu: Any  # exp_avg_sq, likewise


def _debiased_beta_complement(beta: float, t: jax.Array) -> jax.Array:
  """1 - optimi's `debias_beta(beta, t)` = (1 - beta) / (1 - beta^t), 1 at t = 1.

  1 - beta^t as -expm1(t log beta): in float32 the direct form loses up to 1e-4 of its value
  for beta2 = 0.999 in the first steps (optimi computes it in Python floats)."""
  return (1.0 - beta) / -jnp.expm1(t * math.log(beta))


def _rms_tensor(path, fuse_qkv: bool) -> tuple[str, ...]:
  """The torch tensor a leaf belongs to: itself, or with `fuse_qkv` a layer's fused
  query/key/value (FlexBERT's `Wqkv`); the kernels and the biases are separate tensors."""
  names = _names(path)
  if fuse_qkv and len(names) >= 2 and names[-2] in ('query', 'key', 'value'):
    names = names[:-2] + ['<qkv>', names[-1]]
  return tuple(names)


def scale_by_stable_adamw(b1: float = 0.9, b2: float = 0.99, eps: float = 1e-6,
                          decay_over_max_lr: float = 0.0, mask=decay_mask,
                          fuse_qkv: bool = False) -> optax.GradientTransformation:
  """optimi's StableAdamW step before the learning rate (module docstring): per tensor
  (m / (sqrt(v) + eps) + decay_over_max_lr * p) / max(1, rms), the decay term only where
  `mask(params)` is True. `scale_by_learning_rate` then makes it optimi's
  p * (1 - lr_t wd / max_lr) - lr_t m / (sqrt(v) + eps) with lr_t = lr / max(1, rms).
  Each layer slice of a scanned stack (`is_layer_stacked`) is its own tensor."""

  def init(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return ScaleByStableAdamWState(jnp.zeros([], jnp.int32), jax.tree_util.tree_map(zeros, params),
                                   jax.tree_util.tree_map(zeros, params))

  def update(updates, state, params=None):
    if decay_over_max_lr and params is None:
      raise ValueError('stable_adamw with weight decay needs the params: '
                       'call tx.update(grads, state, params)')
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    c1, c2 = _debiased_beta_complement(b1, t), _debiased_beta_complement(b2, t)
    g32 = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), updates)
    mu = jax.tree_util.tree_map(lambda m, g: m + c1 * (g - m), state.mu, g32)  # torch lerp_
    nu = jax.tree_util.tree_map(lambda v, g: (1.0 - c2) * v + c2 * jnp.square(g), state.nu, g32)

    # Sum and count of g^2 / max(v, eps^2) per tensor ([L] per layer for stacks).
    sums, sizes = {}, {}
    flat_nu = jax.tree_util.tree_leaves(nu)
    for (path, g), v in zip(jax.tree_util.tree_leaves_with_path(g32), flat_nu):
      ratio = jnp.square(g) / jnp.maximum(v, eps * eps)
      stacked = is_layer_stacked(path)
      axes = tuple(range(1, ratio.ndim)) if stacked else None
      key = _rms_tensor(path, fuse_qkv)
      sums[key] = sums.get(key, 0.0) + jnp.sum(ratio, axis=axes)
      sizes[key] = sizes.get(key, 0) + (ratio[0].size if stacked else ratio.size)
    inv = {k: 1.0 / jnp.maximum(1.0, jnp.sqrt(sums[k] / sizes[k])) for k in sums}

    decayed = mask(params) if decay_over_max_lr else jax.tree_util.tree_map(lambda _: False, mu)
    param_leaves = params if params is not None else mu

    def step(path, g, m, v, p, decay):
      u = m / (jnp.sqrt(v) + eps)
      if decay:
        u = u + decay_over_max_lr * p.astype(jnp.float32)
      scale = inv[_rms_tensor(path, fuse_qkv)]
      scale = scale.reshape(scale.shape + (1,) * (u.ndim - scale.ndim))
      return (u * scale).astype(g.dtype)

    out = jax.tree_util.tree_map_with_path(step, updates, mu, nu, param_leaves, decayed)
    return out, ScaleByStableAdamWState(count, mu, nu)

  return optax.GradientTransformation(init, update)


def make_optimizer(name: str, schedule: optax.Schedule, *, weight_decay: float = 0.01,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                   clip_norm: float | None = 1.0, max_lr: float | None = None,
                   fuse_qkv_rms: bool = False) -> optax.GradientTransformation:
  """The chain: clip, Adam moments, decoupled decay, [LAMB ratio], -lr.

  `stable_adamw` scales its decay by lr_t / `max_lr` (optimi's decouple_lr: the schedule's
  peak) and clips per tensor itself (`fuse_qkv_rms`: q, k, v as one tensor)."""
  if name not in OPTIMIZERS:
    raise ValueError(f'optimizer.name={name!r}: expected one of {OPTIMIZERS}')
  chain = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
  if name == 'stable_adamw':
    if weight_decay and not max_lr:
      raise ValueError('stable_adamw decays by lr / max_lr: pass max_lr, the peak '
                       '(optimizer.learning_rate)')
    if clip_norm:
      logging.warning('optimizer.clip_norm=%s with stable_adamw: its update clipping replaces '
                      'gradient clipping (ModernBERT clips nothing); set 0 to match', clip_norm)
    if weight_decay >= 1e-3:  # optimi/optimizer.py's warning for decouple_lr
      logging.warning('optimizer.weight_decay=%s is high for stable_adamw, which decays by '
                      'weight_decay x lr / peak per step, not x lr (ModernBERT: 1e-5)',
                      weight_decay)
    chain.append(scale_by_stable_adamw(b1, b2, eps, weight_decay / max_lr if weight_decay else 0.0,
                                       decay_mask, fuse_qkv_rms))
    chain.append(optax.scale_by_learning_rate(schedule))
    return optax.chain(*chain)
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
  proportion x total_steps. A config.json of an earlier run passes configs/common.py
  `upgrade_config` first, so every field of `optimizer_block` is here."""
  warmup = opt_cfg.warmup_steps
  proportion = opt_cfg.warmup_proportion or 0.0
  if proportion:
    if not 0 < proportion < 1:
      raise ValueError(f'optimizer.warmup_proportion={proportion}: must be in [0, 1) '
                       '(0 = use optimizer.warmup_steps)')
    warmup = proportion * total_steps
  schedule = learning_rate_schedule(
      opt_cfg.schedule, opt_cfg.learning_rate, warmup, total_steps,
      decay_proportion=opt_cfg.decay_proportion, decay_shape=opt_cfg.decay_shape,
      final_lr_ratio=opt_cfg.final_lr_ratio)
  tx = make_optimizer(opt_cfg.name, schedule, weight_decay=opt_cfg.weight_decay,
                      b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                      clip_norm=opt_cfg.clip_norm or None, max_lr=opt_cfg.learning_rate,
                      fuse_qkv_rms=opt_cfg.fuse_qkv_rms)
  return tx, schedule
