"""Fine-tuning losses and the jitted train and predict steps of the head models.

The same machinery as pre-training: `objective` hands the model, loss and readout to
bert_jax/training/setup.py, which shards the state by the logical axis names of every
parameter (`heads.logical_param_specs`), batches over (data, fsdp), donates the state and draws
dropout keys `fold_in(state.rng, step)`, so a resumed run draws the same masks.

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

from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig
from bert_jax.training.setup import Objective
from bert_jax.training.state import TrainState

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


# ----------------------------------------------------------------------------- the objective


def batch_shapes(kind: str, max_seq_length: int, num_choices: int = 4):
  """`global_batch -> {array: (shape, dtype)}` of a task's training batch (featurize's arrays
  that go to the devices): what an AOT compilation lowers the step for."""
  int32, float32 = jnp.int32, jnp.float32

  def shapes(b: int) -> dict:
    rows = (b, num_choices, max_seq_length) if kind == 'multiple_choice' else (b, max_seq_length)
    out = {k: (rows, int32) for k in MODEL_INPUTS}
    if kind == 'span':
      out.update(start_positions=((b,), int32), end_positions=((b,), int32),
                 label_weights=((b,), float32))
    elif kind == 'tagging':
      out.update(labels=((b, max_seq_length), int32), label_weights=((b, max_seq_length), float32))
    else:
      out.update(labels=((b,), float32 if kind == 'regression' else int32),
                 label_weights=((b,), float32))
    return out

  return shapes


def objective(cfg: BertConfig, head: heads.Head, kind: str, max_seq_length: int) -> Objective:
  """A task's objective: the encoder with `head`, the task's loss, predictions as readout."""
  model = heads.build_model(cfg, head)
  return Objective(
      name=f'fine-tuning ({kind})', model_cfg=cfg,
      init_params=lambda rng: heads.init_params(cfg, head, rng),
      logical_specs=heads.logical_param_specs(cfg, head),
      train_step=functools.partial(train_step, model=model, kind=kind),
      eval_step=functools.partial(predict_step, model=model),
      batch_shapes=batch_shapes(kind, max_seq_length))
