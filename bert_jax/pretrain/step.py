"""Train state, losses, and the jitted train and eval steps.

The losses are the reference's: MLM is the weighted mean cross-entropy over real masked
positions, NSP the weighted mean over each row's NSP labels (one per instance in packed rows),
and the training loss their sum. `sentence_objective` (data.sentence_objective) names what the
2-way head learns: 'nsp', or ALBERT's 'sop' (same head and loss, metrics named sop_*), or
'none' (RoBERTa's full sentences): MLM alone, no sentence loss or metric at all, whatever
labels the batch carries. Gradient accumulation splits the global batch into
micro-batches inside one jitted step and normalises by the whole batch's weights, so it gives
the full-batch gradient, not an average of per-micro-batch means.

Dropout keys are `fold_in(state.rng, step)`: a resumed run draws the same masks, and with
JAX's partitionable threefry the masks do not depend on the mesh either.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding

from bert_jax import sharding as shd
from bert_jax.model import BertConfig, BertForPreTraining, init_params, logical_param_specs
from input_pipeline import objectives

SENTENCE_HEAD_OBJECTIVES = ('nsp', 'sop')  # objectives that train the 2-way head
MODEL_FEATURES = ('input_ids', 'input_mask', 'segment_ids', 'masked_lm_positions',
                  'position_ids', 'packed_segment_ids', 'next_sentence_positions')


@struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # raw uint32 key data, so it checkpoints like any array


def model_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  return {k: batch[k] for k in MODEL_FEATURES if k in batch}


def nsp_weights(batch) -> jax.Array:
  """1 per real sentence label. Unpacked rows carry one each, except the all-padding rows the
  eval reader appends to fill its last batch (label 0, input_mask 0): counted, they would
  score the sentence head on rows that do not exist."""
  labels = batch['next_sentence_labels']
  if 'next_sentence_weights' in batch:
    return batch['next_sentence_weights'].astype(jnp.float32)
  return (batch['input_mask'][:, 0] > 0).astype(jnp.float32).reshape(labels.shape)


def loss_sums(output, batch, sentence_objective: str = 'nsp') -> dict[str, jax.Array]:
  """Weighted sums (not means), so micro-batches and eval batches add up exactly; the
  sentence head's under `{sentence_objective}_*`, none for 'none'."""
  w_mlm = batch['masked_lm_weights'].astype(jnp.float32)
  labels = batch['masked_lm_ids']
  xent = optax.softmax_cross_entropy_with_integer_labels(output.mlm_logits, labels)
  hit = (jnp.argmax(output.mlm_logits, -1) == labels).astype(jnp.float32)
  sums = {'mlm_loss': jnp.sum(w_mlm * xent), 'mlm_hits': jnp.sum(w_mlm * hit),
          'mlm_weight': jnp.sum(w_mlm)}
  if sentence_objective != 'none':
    sums.update(sentence_sums(output, batch, sentence_objective))
  return sums


def sentence_sums(output, batch, prefix: str) -> dict[str, jax.Array]:
  """Weighted sums of the 2-way sentence head (NSP or SOP labels)."""
  nsp_labels = batch['next_sentence_labels']
  nsp_logits = output.nsp_logits
  if nsp_logits.ndim == 2:  # unpacked: one [CLS] per row, labels [B, 1]
    nsp_logits = nsp_logits[:, None, :]
  nsp_labels = nsp_labels.reshape(nsp_logits.shape[:2])
  w_nsp = nsp_weights(batch).reshape(nsp_labels.shape)
  nsp_xent = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, nsp_labels)
  nsp_hit = (jnp.argmax(nsp_logits, -1) == nsp_labels).astype(jnp.float32)
  return {f'{prefix}_loss': jnp.sum(w_nsp * nsp_xent),
          f'{prefix}_hits': jnp.sum(w_nsp * nsp_hit), f'{prefix}_weight': jnp.sum(w_nsp)}


def summarize(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Means from sums (the sentence head's only if the sums have it); the +1e-5 is the
  reference's guard against an all-padding batch."""
  mlm_w = sums['mlm_weight'] + 1e-5
  out = {'mlm_loss': sums['mlm_loss'] / mlm_w, 'mlm_accuracy': sums['mlm_hits'] / mlm_w}
  out['loss'] = out['mlm_loss']
  for prefix in SENTENCE_HEAD_OBJECTIVES:
    if f'{prefix}_weight' in sums:
      w = sums[f'{prefix}_weight'] + 1e-5
      out[f'{prefix}_loss'] = sums[f'{prefix}_loss'] / w
      out[f'{prefix}_accuracy'] = sums[f'{prefix}_hits'] / w
      out['loss'] = out['mlm_loss'] + out[f'{prefix}_loss']
  return out


def _micro_batches(batch, accum_steps: int):
  """[B, ...] -> [A, B/A, ...] with micro-batch i = rows i, i+A, ...: every micro-batch is
  spread over all devices, since each device holds a contiguous block of rows."""

  def split(x):
    b = x.shape[0]
    if b % accum_steps:
      raise ValueError(f'per-step batch {b} is not divisible by accum_steps={accum_steps}')
    return jnp.swapaxes(x.reshape((b // accum_steps, accum_steps) + x.shape[1:]), 0, 1)

  return jax.tree_util.tree_map(split, batch)


def train_step(state: TrainState, batch, *, model: BertForPreTraining,
               tx: optax.GradientTransformation, schedule: optax.Schedule,
               accum_steps: int = 1, sentence_objective: str = 'nsp'
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  norm_mlm = jnp.sum(batch['masked_lm_weights'].astype(jnp.float32)) + 1e-5
  head = sentence_objective if sentence_objective in SENTENCE_HEAD_OBJECTIVES else None
  norm_head = jnp.sum(nsp_weights(batch)) + 1e-5 if head else None

  def loss_fn(params, micro, micro_key):
    out = model.apply({'params': params}, **model_inputs(micro), deterministic=False,
                      rngs={'dropout': micro_key})
    sums = loss_sums(out, micro, sentence_objective)
    if head is None:
      return sums['mlm_loss'] / norm_mlm, sums
    return sums['mlm_loss'] / norm_mlm + sums[f'{head}_loss'] / norm_head, sums

  grad_fn = jax.grad(loss_fn, has_aux=True)
  if accum_steps == 1:
    grads, sums = grad_fn(state.params, batch, key)
  else:
    def body(acc, xs):
      micro, i = xs
      g, s = grad_fn(state.params, micro, jax.random.fold_in(key, i))
      return jax.tree_util.tree_map(jnp.add, acc, (g, s)), None

    zeros = jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(
        grad_fn, state.params, jax.tree_util.tree_map(lambda x: x[:1], batch), key))
    (grads, sums), _ = jax.lax.scan(
        body, zeros, (_micro_batches(batch, accum_steps), jnp.arange(accum_steps)))

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = summarize(sums)
  metrics.update(learning_rate=schedule(state.step), grad_norm=optax.tree.norm(grads),
                 param_norm=optax.tree.norm(params), update_norm=optax.tree.norm(updates))
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch, *, model: BertForPreTraining,
              sentence_objective: str = 'nsp') -> dict[str, jax.Array]:
  out = model.apply({'params': params}, **model_inputs(batch))
  return loss_sums(out, batch, sentence_objective)


# ----------------------------------------------------------------------------- sharded setup


def state_shardings(model_cfg: BertConfig, tx, mesh, rules) -> TrainState:
  """NamedSharding for every leaf of the TrainState; optimizer moments follow their params."""
  abstract_params = jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0)))
  return shardings_for(abstract_params, logical_param_specs(model_cfg), tx, mesh, rules)


def shardings_for(abstract_params, logical_specs, tx, mesh, rules) -> TrainState:
  """The TrainState shardings of any model (pre-training or a fine-tuning head) from its
  abstract params and their logical PartitionSpecs."""
  param_sh = shd.logical_to_sharding(logical_specs, mesh, rules, abstract_params)
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  rep = shd.replicated(mesh)
  opt_sh = optax.tree_map_params(tx, lambda _, s: s, abstract_opt, param_sh,
                                 transform_non_params=lambda _: rep,
                                 is_leaf=lambda x: isinstance(x, NamedSharding))
  return TrainState(step=rep, params=param_sh, opt_state=opt_sh, rng=rep)


def abstract_train_state(model_cfg: BertConfig, tx) -> TrainState:
  """Shapes and dtypes of the TrainState, allocating nothing (restore targets, AOT)."""

  def build():
    params = init_params(model_cfg, jax.random.key(0))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(jax.random.key(0)))

  return jax.eval_shape(build)


def create_train_state(model_cfg: BertConfig, tx, seed: int, shardings: TrainState) -> TrainState:
  """Initialise directly into the sharded layout (no host copy of the full model)."""

  def init(seed):
    params_key, dropout_key = jax.random.split(jax.random.key(seed))
    params = init_params(model_cfg, params_key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(dropout_key))

  # No mesh context here: DenseGeneral initialises kernels flat, so Flax's init-time sharding
  # constraints would not match their rank; out_shardings places the result anyway.
  return jax.jit(init, out_shardings=shardings)(seed)


def state_from_params(params, tx, seed: int, shardings: TrainState) -> TrainState:
  """A fresh step-0 state around given params (phase 2 init, HF checkpoints)."""
  params = jax.device_put(params, shardings.params)

  def init(params, seed):
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(jax.random.split(jax.random.key(seed))[1]))

  return jax.jit(init, out_shardings=shardings)(params, seed)


def jit_train_step(model_cfg: BertConfig, tx, schedule, shardings: TrainState, mesh, rules,
                   accum_steps: int = 1, sentence_objective: str = 'nsp'):
  """The train step, jitted once with explicit shardings and the state donated."""
  objectives.check_name(sentence_objective, 'data.sentence_objective')
  step = functools.partial(train_step, model=BertForPreTraining(model_cfg), tx=tx,
                           schedule=schedule, accum_steps=accum_steps,
                           sentence_objective=sentence_objective)
  return jit_update(step, shardings, mesh, rules)


def jit_update(step, shardings: TrainState, mesh, rules):
  """`step(state, batch) -> (state, metrics)` jitted with the state's shardings, the state
  donated and the metrics replicated, run under the logical-axis rules (pre-training and
  fine-tuning alike)."""
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

  return run


def jit_eval_step(model_cfg: BertConfig, params_sharding, mesh, rules,
                  sentence_objective: str = 'nsp'):
  objectives.check_name(sentence_objective, 'data.sentence_objective')
  step = functools.partial(eval_step, model=BertForPreTraining(model_cfg),
                           sentence_objective=sentence_objective)
  return jit_readout(step, params_sharding, mesh, rules)
