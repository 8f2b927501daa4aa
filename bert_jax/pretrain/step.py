"""Pre-training's losses, train and eval steps, and its objective for the shared setup.

The losses are the reference's: MLM is the weighted mean cross-entropy over real masked
positions, NSP the weighted mean over each row's NSP labels (one per instance in packed rows),
and the training loss their sum. `sentence_objective` (data.sentence_objective) names what the
2-way head learns: 'nsp', or ALBERT's 'sop' (same head and loss, metrics named sop_*), or
'none' (RoBERTa's full sentences): MLM alone, no sentence loss or metric at all, whatever
labels the batch carries. Gradient accumulation (accumulation.py) gives the full-batch
gradient. `train.objective` picks MLM (this module) or replaced-token detection (rtd.py).

Dropout keys are `fold_in(state.rng, step)` (bert_jax/training/state.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from bert_jax.convert import start_points
from bert_jax.model import flops
from bert_jax.model.encoder import BertForPreTraining, init_params, logical_param_specs
from bert_jax.pretrain import accumulation, mlm_loss, rtd
from bert_jax.training.run_setup import Objective, RunSetup, build, model_config
from bert_jax.training.state import TrainState, apply_gradients
from input_pipeline.pretrain import objectives
from input_pipeline.pretrain import dataset as data_lib

SENTENCE_HEAD_OBJECTIVES = ('nsp', 'sop')  # objectives that train the 2-way head
MODEL_FEATURES = ('input_ids', 'input_mask', 'segment_ids', 'masked_lm_positions',
                  'position_ids', 'packed_segment_ids', 'next_sentence_positions')


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


def loss_sums(output, batch, sentence_objective: str = 'nsp',
              mlm_chunk: int = 0) -> dict[str, jax.Array]:
  """Weighted sums (not means), so micro-batches and eval batches add up exactly; the
  sentence head's under `{sentence_objective}_*`, none for 'none'. `mlm_chunk` > 0
  (model.mlm_loss_chunk): the MLM sums `mlm_chunk` positions a row at a time from the head's
  states, never the whole logits (pretrain/mlm_loss.py); the same numbers."""
  w_mlm = batch['masked_lm_weights'].astype(jnp.float32)
  labels = batch['masked_lm_ids']
  if mlm_chunk:
    loss, hits = mlm_loss.chunked_sums(output.mlm_hidden, *output.mlm_decoder, labels, w_mlm,
                                       mlm_chunk)
  else:
    loss, hits = mlm_loss.full_sums(output.mlm_logits, labels, w_mlm)
  sums = {'mlm_loss': loss, 'mlm_hits': hits, 'mlm_weight': jnp.sum(w_mlm)}
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


def train_step(state: TrainState, batch, *, model: BertForPreTraining,
               tx: optax.GradientTransformation, schedule: optax.Schedule,
               accum_steps: int = 1, sentence_objective: str = 'nsp', mlm_chunk: int = 0
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  norm_mlm = jnp.sum(batch['masked_lm_weights'].astype(jnp.float32)) + 1e-5
  head = sentence_objective if sentence_objective in SENTENCE_HEAD_OBJECTIVES else None
  norm_head = jnp.sum(nsp_weights(batch)) + 1e-5 if head else None

  def loss_fn(params, micro, micro_key):
    out = model.apply({'params': params}, **model_inputs(micro), deterministic=False,
                      rngs={'dropout': micro_key})
    sums = loss_sums(out, micro, sentence_objective, mlm_chunk)
    if head is None:
      return sums['mlm_loss'] / norm_mlm, sums
    return sums['mlm_loss'] / norm_mlm + sums[f'{head}_loss'] / norm_head, sums

  grads, sums = accumulation.grads_and_sums(jax.grad(loss_fn, has_aux=True), state.params,
                                             batch, key, accum_steps)
  state, update_metrics = apply_gradients(state, grads, tx, schedule)
  return state, summarize(sums) | update_metrics


def eval_step(params, batch, *, model: BertForPreTraining,
              sentence_objective: str = 'nsp', mlm_chunk: int = 0) -> dict[str, jax.Array]:
  out = model.apply({'params': params}, **model_inputs(batch))
  return loss_sums(out, batch, sentence_objective, mlm_chunk)


# ----------------------------------------------------------------------------- the objective


def objective(config) -> Objective:
  """Pre-training's objective from a config: BertForPreTraining, the MLM (+ sentence) loss
  with `train.accum_steps` micro-batches, the eval sums, the reader's batch layout; or with
  `train.objective=rtd` replaced-token detection (rtd.py) with the model as discriminator."""
  model_cfg = model_config(start_points.with_start_shape(config))
  start_points.check_max_seq_length(
      model_cfg, config.data.max_seq_length,
      f'model.size={config.model.size} model.arch={model_cfg.arch}\'s',
      f'write the data with create_pretraining_data --max_seq_length={model_cfg.max_length} '
      '(or less) and set --config.data.max_seq_length to it')
  if config.train.objective not in rtd.OBJECTIVES:
    raise ValueError(f'train.objective={config.train.objective!r}: expected one of '
                     f'{rtd.OBJECTIVES} (masked LM, or replaced-token detection)')
  sentence_objective = config.data.sentence_objective
  objectives.check_name(sentence_objective, 'data.sentence_objective')
  rtd_objective = config.train.objective == 'rtd'  # trains no sentence head on any records
  if (not model_cfg.family.sentence_head and sentence_objective != 'none'
      and not rtd_objective):
    raise ValueError(f'model.arch={model_cfg.arch!r} has no sentence head, but '
                     f'data.sentence_objective={sentence_objective!r}: write the data with '
                     'create_pretraining_data --next_sentence=none and set '
                     '--config.data.sentence_objective=none')
  layout = data_lib.output_layout(data_lib.reader_config(config))
  if rtd_objective:
    return rtd.objective(config, model_cfg, layout)
  model = BertForPreTraining(model_cfg)
  mlm_chunk = config.model.mlm_loss_chunk
  return Objective(
      name=f'pretraining ({sentence_objective})', model_cfg=model_cfg,
      init_params=functools.partial(init_params, model_cfg),
      logical_specs=logical_param_specs(model_cfg),
      train_step=functools.partial(train_step, model=model,
                                   accum_steps=config.train.accum_steps,
                                   sentence_objective=sentence_objective, mlm_chunk=mlm_chunk),
      eval_step=functools.partial(eval_step, model=model, sentence_objective=sentence_objective,
                                  mlm_chunk=mlm_chunk),
      batch_shapes=layout.shapes, layout=layout, summarize=summarize,
      train_flops=functools.partial(flops.train_flops_per_step, model_cfg))


def setup(config, devices=None) -> RunSetup:
  """The run setup of a pre-training config (training, eval, export, AOT, benchmarks)."""
  return build(config, objective(config), config.train.num_steps, devices)
