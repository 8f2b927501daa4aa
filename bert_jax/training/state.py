"""The train state of any model (pre-training or a task head) and its jitted step wrappers.

A `TrainState` is sharded by the logical axis names of every parameter through the run's
rules (sharding.py); optimizer moments follow their params. Dropout keys are
`fold_in(state.rng, step)`, so a resumed run draws the same masks, and with JAX's
partitionable threefry the masks do not depend on the mesh either. Nothing here knows a loss:
the objective (bert_jax/pretrain/step.py, bert_jax/finetune/step.py) brings it.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding

from bert_jax.training import sharding as shd


@struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # raw uint32 key data, so it checkpoints like any array


def apply_gradients(state: TrainState, grads, tx: optax.GradientTransformation,
                    schedule: optax.Schedule) -> tuple[TrainState, dict[str, jax.Array]]:
  """The optimizer update every objective's step ends with: the next state and the metrics
  of the update itself (learning rate, gradient, parameter and update norms)."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {'learning_rate': schedule(state.step), 'grad_norm': optax.tree.norm(grads),
             'param_norm': optax.tree.norm(params), 'update_norm': optax.tree.norm(updates)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def shardings_for(abstract_params, logical_specs, tx, mesh, rules) -> TrainState:
  """NamedSharding for every leaf of the TrainState, from the params' shapes and logical
  PartitionSpecs; optimizer moments follow their params, counts are replicated."""
  param_sh = shd.logical_to_sharding(logical_specs, mesh, rules, abstract_params)
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  rep = shd.replicated(mesh)
  opt_sh = optax.tree_map_params(tx, lambda _, s: s, abstract_opt, param_sh,
                                 transform_non_params=lambda _: rep,
                                 is_leaf=lambda x: isinstance(x, NamedSharding))
  return TrainState(step=rep, params=param_sh, opt_state=opt_sh, rng=rep)


def _state(params, tx, dropout_key) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    rng=jax.random.key_data(dropout_key))


def abstract_state(init_params: Callable, tx) -> TrainState:
  """Shapes and dtypes of the TrainState, allocating nothing (restore targets, AOT)."""
  return jax.eval_shape(lambda: _state(init_params(jax.random.key(0)), tx, jax.random.key(0)))


def fresh_state(init_params: Callable, tx, seed: int, shardings: TrainState) -> TrainState:
  """Step 0 with params drawn from `seed`, initialised directly into the sharded layout (no
  host copy of the full model)."""

  def init(seed):
    params_key, dropout_key = jax.random.split(jax.random.key(seed))
    return _state(init_params(params_key), tx, dropout_key)

  # No mesh context here: DenseGeneral initialises kernels flat, so Flax's init-time sharding
  # constraints would not match their rank; out_shardings places the result anyway.
  return jax.jit(init, out_shardings=shardings)(seed)


def state_from_params(params, tx, seed: int, shardings: TrainState) -> TrainState:
  """Step 0 around given params (a start point, phase 2's init), placed straight into the
  sharded layout; the dropout key is the one `fresh_state` would draw for `seed`."""
  params = jax.device_put(params, shardings.params)

  def init(params, seed):
    return _state(params, tx, jax.random.split(jax.random.key(seed))[1])

  return jax.jit(init, out_shardings=shardings)(params, seed)


def jit_update(step, shardings: TrainState, mesh, rules):
  """`step(state, batch) -> (state, metrics)` jitted with the state's shardings, the state
  donated and the metrics replicated, run under the logical-axis rules."""
  jitted = jax.jit(step, in_shardings=(shardings, shd.batch_sharding(mesh)),
                   out_shardings=(shardings, shd.replicated(mesh)), donate_argnums=0)

  def run(state, batch):
    with shd.activate(mesh, rules):
      return jitted(state, batch)

  run.jitted = jitted
  run.activate = lambda: shd.activate(mesh, rules)  # for lowering `jitted` ahead of time
  return run


def jit_readout(step, params_sharding, mesh, rules):
  """`step(params, batch)` jitted with replicated outputs, so every process sees all of them
  (eval sums, predictions to score)."""
  jitted = jax.jit(step, in_shardings=(params_sharding, shd.batch_sharding(mesh)),
                   out_shardings=shd.replicated(mesh))

  def run(params, batch):
    with shd.activate(mesh, rules):
      return jitted(params, batch)

  run.jitted = jitted
  run.activate = lambda: shd.activate(mesh, rules)
  return run
