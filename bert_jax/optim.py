"""Learning-rate schedules and optimizers of the BERT papers, in optax.

`adamw_bert` is google-research/bert's `AdamWeightDecayOptimizer`: Adam *without* bias
correction, epsilon 1e-6, decoupled weight decay (scaled by the learning rate) that skips
LayerNorm parameters and biases, after clipping gradients to global norm 1.0. Its schedule
(`bert`) is a linear decay from step 0 to 0 at the last step, overridden by a linear warmup
for the first steps; note that it therefore peaks below the nominal rate
(lr * (1 - warmup/total)). `warmup_linear` is the usual warmup-then-decay-from-the-peak.
`lamb` follows NVIDIA's large-batch recipe (bias-corrected, same decay mask).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ('bert', 'warmup_linear', 'constant')
OPTIMIZERS = ('adamw_bert', 'adamw', 'lamb')


def learning_rate_schedule(name: str, peak: float, warmup_steps: int,
                           total_steps: int) -> optax.Schedule:
  if name not in SCHEDULES:
    raise ValueError(f'optimizer.schedule={name!r}: expected one of {SCHEDULES}')
  if total_steps <= 0:
    raise ValueError(f'total_steps={total_steps} must be positive')
  warmup = max(int(warmup_steps), 0)

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


def decay_mask(params) -> Any:
  """True for parameters that get weight decay: everything but LayerNorm and biases."""

  def keep(path, _):
    names = [str(getattr(k, 'key', k)) for k in path]
    return not (names[-1] in ('bias', 'mlm_output_bias') or
                any('layer_norm' in n for n in names))

  return jax.tree_util.tree_map_with_path(keep, params)


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


def make_optimizer(name: str, schedule: optax.Schedule, *, weight_decay: float = 0.01,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                   clip_norm: float | None = 1.0) -> optax.GradientTransformation:
  if name not in OPTIMIZERS:
    raise ValueError(f'optimizer.name={name!r}: expected one of {OPTIMIZERS}')
  chain = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
  chain.append(scale_by_adam_without_bias_correction(b1, b2, eps) if name == 'adamw_bert'
               else optax.scale_by_adam(b1, b2, eps))
  if weight_decay:
    chain.append(optax.add_decayed_weights(weight_decay, mask=decay_mask))
  if name == 'lamb':
    chain.append(optax.scale_by_trust_ratio())
  chain.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*chain)


def from_config(opt_cfg, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(opt_cfg.schedule, opt_cfg.learning_rate,
                                    opt_cfg.warmup_steps, total_steps)
  tx = make_optimizer(opt_cfg.name, schedule, weight_decay=opt_cfg.weight_decay,
                      b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                      clip_norm=opt_cfg.clip_norm or None)
  return tx, schedule
