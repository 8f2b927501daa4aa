"""Fine-tuning losses and the jitted train and predict steps of the head models.

The same machinery as pre-training (train_step.py): a `TrainState` sharded by the logical
axis names of every parameter (`heads.logical_param_specs` through bert_jax/sharding.py's
rules), batches sharded over (data, fsdp), the state donated, dropout keys
`fold_in(state.rng, step)` so a resumed run draws the same masks.

Losses are weighted means over `label_weights`, so the zero-weight rows that pad an epoch's
last batch (and the positions of a tagged row that carry no label) count for nothing:
cross-entropy for classification and tagging (first sub-words only) and over the choices
of a multiple-choice row (HF's `BertForMultipleChoice` loss), mean squared error for
regression, and for span extraction the mean of the start and end cross-entropies
(run_squad.py's `(start_loss + end_loss) / 2`; an unanswerable question or a window without
the answer points at position 0, [CLS]).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from bert_jax import heads
from bert_jax.model import BertConfig
from bert_jax.train_step import TrainState, jit_readout, jit_update, shardings_for

MODEL_INPUTS = ('input_ids', 'input_mask', 'segment_ids')


def loss_sums(kind: str, outputs, batch) -> tuple[jax.Array, jax.Array]:
  """(weighted loss sum, weight sum) of a batch for task `kind` (finetune_tasks' kinds)."""
  w = batch['label_weights'].astype(jnp.float32)
  if kind == 'span':
    xent = lambda logits, positions: optax.softmax_cross_entropy_with_integer_labels(
        logits, positions)
    loss = (xent(outputs.start_logits, batch['start_positions'])
            + xent(outputs.end_logits, batch['end_positions'])) / 2
  elif kind == 'regression':
    target = jnp.where(w > 0, batch['labels'], 0.0)  # unlabelled rows are NaN
    loss = jnp.square(outputs[:, 0] - target)
  elif kind in ('classification', 'tagging', 'multiple_choice'):
    labels = jnp.where(w > 0, batch['labels'], 0)  # -1 / -100 where there is no label
    loss = optax.softmax_cross_entropy_with_integer_labels(outputs, labels)
  else:
    raise ValueError(f'unknown task kind {kind!r}')
  return jnp.sum(w * loss), jnp.sum(w)


def train_step(state: TrainState, batch, *, model, tx: optax.GradientTransformation,
               schedule: optax.Schedule, kind: str) -> tuple[TrainState, dict[str, jax.Array]]:
  key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

  def loss_fn(params):
    outputs = model.apply({'params': params}, *(batch[k] for k in MODEL_INPUTS),
                          deterministic=False, rngs={'dropout': key})
    total, weight = loss_sums(kind, outputs, batch)
    return total / jnp.maximum(weight, 1.0)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {'loss': loss, 'learning_rate': schedule(state.step),
             'grad_norm': optax.tree.norm(grads), 'param_norm': optax.tree.norm(params)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def predict_step(params, batch, *, model) -> dict[str, jax.Array]:
  outputs = model.apply({'params': params}, *(batch[k] for k in MODEL_INPUTS))
  if isinstance(outputs, heads.SpanLogits):
    return {'start_logits': outputs.start_logits, 'end_logits': outputs.end_logits}
  return {'logits': outputs}


# ----------------------------------------------------------------------------- sharded setup


def abstract_params(cfg: BertConfig, head: heads.Head):
  return jax.eval_shape(lambda: heads.init_params(cfg, head, jax.random.key(0)))


def state_shardings(cfg: BertConfig, head: heads.Head, tx, mesh, rules) -> TrainState:
  return shardings_for(abstract_params(cfg, head), heads.logical_param_specs(cfg, head), tx,
                       mesh, rules)


def abstract_state(cfg: BertConfig, head: heads.Head, tx) -> TrainState:
  """Shapes of the TrainState (the restore target), allocating nothing."""

  def build():
    params = heads.init_params(cfg, head, jax.random.key(0))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(jax.random.key(0)))

  return jax.eval_shape(build)


def state_from_params(params, shardings: TrainState, tx, seed: int) -> TrainState:
  """Step 0 around a start point's params, placed straight into the sharded layout."""
  params = jax.device_put(params, shardings.params)

  def init(params):
    dropout_key = jax.random.split(jax.random.key(seed))[1]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(dropout_key))

  return jax.jit(init, out_shardings=shardings)(params)


def jit_train_step(cfg: BertConfig, head: heads.Head, kind: str, tx, schedule, mesh, rules,
                   shardings: TrainState):
  step = functools.partial(train_step, model=heads.build_model(cfg, head), tx=tx,
                           schedule=schedule, kind=kind)
  return jit_update(step, shardings, mesh, rules)


def jit_predict_step(cfg: BertConfig, head: heads.Head, mesh, rules, shardings: TrainState):
  """Outputs replicated, so every process can score the whole split."""
  step = functools.partial(predict_step, model=heads.build_model(cfg, head))
  return jit_readout(step, shardings.params, mesh, rules)
