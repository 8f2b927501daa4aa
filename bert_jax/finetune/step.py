"""Fine-tuning losses and the jitted train and predict steps of the head models.

The same machinery as pre-training: `objective` hands the model, loss and readout to
bert_jax/training/run_setup.py, which shards the state by the logical axis names of every
parameter (`heads.logical_param_specs`), batches over (data, fsdp), donates the state and draws
dropout keys `fold_in(state.rng, step)`, so a resumed run draws the same masks. The kind
differentiates its loss (`TaskKind.value_and_grad`): one pass over the batch, or the embedding
kind's chunks with cached gradients (`data.embed_chunk`, finetune/grad_cache.py).

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
import optax

from bert_jax.finetune.kinds import MODEL_INPUTS, TaskKind
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig
from bert_jax.training.run_setup import Objective
from bert_jax.training.state import TrainState, apply_gradients


def train_step(state: TrainState, batch, *, model, tx: optax.GradientTransformation,
               schedule: optax.Schedule, kind: TaskKind
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

  def forward(params, inputs, dropout_key):
    return model.apply({'params': params}, *(inputs[k] for k in MODEL_INPUTS),
                       deterministic=False, rngs={'dropout': dropout_key})

  loss, grads = kind.value_and_grad(forward, state.params, batch, key)
  state, update_metrics = apply_gradients(state, grads, tx, schedule)
  return state, {'loss': loss} | update_metrics


def predict_step(params, batch, *, model, kind: TaskKind) -> dict[str, jax.Array]:
  outputs = model.apply({'params': params}, *(batch[k] for k in MODEL_INPUTS))
  return kind.readout(outputs)


# ----------------------------------------------------------------------------- the objective


def objective(cfg: BertConfig, head: heads.Head, kind: TaskKind,
              max_seq_length: int) -> Objective:
  """A task's objective: the encoder with `head`, the kind's loss, its readout as eval."""
  model = heads.build_model(cfg, head)
  return Objective(
      name=f'fine-tuning ({kind.name})', model_cfg=cfg,
      init_params=lambda rng: heads.init_params(cfg, head, rng),
      logical_specs=heads.logical_param_specs(cfg, head),
      train_step=functools.partial(train_step, model=model, kind=kind),
      eval_step=functools.partial(predict_step, model=model, kind=kind),
      batch_shapes=kind.schema().shapes(max_seq_length))
