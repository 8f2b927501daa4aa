"""Replaced-token detection (`train.objective=rtd`): ELECTRA's pre-training objective
(google-research/electra run_pretraining.py `PretrainingModel`), with DeBERTa-v3's
gradient-disentangled embedding sharing as an option (bert_jax/model/rtd.py has the networks).

One step, on the records every objective reads (masked as they were written, or by dynamic
masking):
  1. the generator (an MLM, `rtd.generator_hidden_fraction` of the discriminator's width)
     predicts the masked positions; its loss is the MLM's (weighted mean cross-entropy);
  2. a token is sampled from its softmax at every masked position (`sample_from_softmax`, on
     stop-gradient logits: no gradient flows through the sample) into the original row (the
     masked positions' ids put back, the reference's `unmask`);
  3. the discriminator labels every real token (input_mask 1, every instance of a packed row)
     1 where the sampled row differs from the original (a sample equal to the original is
     labelled original, as the reference's), and its loss is the mean binary cross-entropy
     over those tokens (transformers' `ElectraForPreTraining` loss);
  4. loss = generator MLM + `rtd.disc_weight` (the reference's 50) x discriminator BCE.
Records of any sentence objective serve (google-research/bert's NSP records included): their
sentence labels are not read. One departure: the reference masks 85% [MASK] / 15% kept; the records here keep BERT's
80/10/10, so the generator also sees 10% random tokens at masked positions.

Metrics: the generator's `mlm_loss` / `mlm_accuracy` and the accuracy of its samples
(`sampled_mlm_accuracy`, the reference's), the discriminator's `disc_loss`, `disc_accuracy`
next to its trivial baseline (`disc_baseline_accuracy`: calling every token original, i.e.
1 - `disc_replaced_fraction`) and `disc_auc` (0.5 for a trivial one), from histograms of the
logits so that batches add up exactly: 1,024 bins over [-16, 16], ties within a bin counted
half (tf.metrics.auc likewise thresholds, at 200). Eval samples with a fixed key, so the same
checkpoint scores the same.
"""

from __future__ import annotations

import functools

from absl import logging
import jax
import jax.numpy as jnp
import optax

from bert_jax.convert import hf, hf_electra, loaders, start_points
from bert_jax.convert.workdir import load_run_config
from bert_jax.model import flops, rtd as rtd_model
from bert_jax.model.encoder import BertConfig, BertForPreTraining
from bert_jax.model.rtd import DISCRIMINATOR, GENERATOR, ElectraDiscriminator, RtdConfig
from bert_jax.pretrain import accumulation, mlm_loss
from bert_jax.training import checkpointing
from bert_jax.training.run_setup import Objective
from input_pipeline import fs
from bert_jax.training.state import TrainState, apply_gradients

OBJECTIVES = ('mlm', 'rtd')
AUC_BINS, AUC_RANGE = 1024, 16.0
GENERATOR_FEATURES = ('input_ids', 'input_mask', 'segment_ids', 'masked_lm_positions',
                      'position_ids', 'packed_segment_ids')
DISCRIMINATOR_FEATURES = ('input_mask', 'segment_ids', 'position_ids', 'packed_segment_ids')


def rtd_config(config, disc: BertConfig) -> RtdConfig:
  """The two networks of a run: `disc` (the run's model) and the generator its `rtd` block
  sizes."""
  r = config.rtd
  gen = rtd_model.generator_config(disc, r.generator_hidden_fraction,
                                   r.generator_layers_fraction)
  return RtdConfig(discriminator=disc, generator=gen, sharing=r.embedding_sharing)


def sample_from_softmax(key, logits, block: int = 128) -> jax.Array:
  """One id per row of `logits` [..., V], drawn from softmax(logits): the distribution of the
  reference's `sample_from_softmax` (Gumbel-max), by inverse CDF over blocks of `block` ids.
  Gumbel-max draws V uniforms and two logarithms per position (32 x 20 positions of an
  8,192-id vocabulary: 145 ms of a 440 ms BERT-tiny-sized RTD step on a 2-core CPU); this
  draws one uniform, picks the block whose cumulative mass covers it (V / block sums), then the
  id inside that block (block sums): ~19 ms. Ids of zero probability are never drawn."""
  vocab = logits.shape[-1]
  pad = -vocab % block
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  probs = jnp.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, pad)])
  blocks = probs.reshape(probs.shape[:-1] + (-1, block))  # [..., V / block, block]
  block_mass = jnp.sum(blocks, axis=-1)
  below = jnp.cumsum(block_mass, axis=-1)  # mass up to and including each block
  u = jax.random.uniform(key, below.shape[:-1]) * below[..., -1]
  chosen = jnp.minimum(jnp.sum(below <= u[..., None], axis=-1), below.shape[-1] - 1)
  start = jnp.take_along_axis(below - block_mass, chosen[..., None], axis=-1)
  inside = jnp.take_along_axis(blocks, chosen[..., None, None], axis=-2)[..., 0, :]
  offset = jnp.sum(jnp.cumsum(inside, axis=-1) <= (u[..., None] - start), axis=-1)
  return jnp.minimum(chosen * block + jnp.minimum(offset, block - 1), vocab - 1)


def scatter(ids, positions, values, active):
  """ids [B, S] with ids[b, positions[b, p]] = values[b, p] where active[b, p]."""
  ids = jnp.asarray(ids)
  rows = jnp.arange(ids.shape[0])[:, None]
  current = jnp.take_along_axis(ids, positions, axis=1)
  return ids.at[rows, positions].set(jnp.where(active, values, current))


def corrupt(batch, sampled):
  """(original row, the row with the samples, labels 1 = replaced) [B, S] each."""
  positions, active = batch['masked_lm_positions'], batch['masked_lm_weights'] > 0
  original = scatter(batch['input_ids'], positions, batch['masked_lm_ids'], active)
  fake = scatter(original, positions, sampled, active)
  real = batch['input_mask'] > 0
  return original, fake, (fake != original) & real


def discriminator_sums(logits, labels, real) -> dict[str, jax.Array]:
  """Weighted sums of the discriminator over real tokens (mean BCE = disc_loss / disc_weight,
  transformers' ElectraForPreTraining loss), and its AUC histograms."""
  real = real.astype(jnp.float32)
  y = labels.astype(jnp.float32)
  bce = optax.sigmoid_binary_cross_entropy(logits, y)
  hit = ((logits > 0) == labels).astype(jnp.float32)
  bins = jnp.clip(((logits + AUC_RANGE) * (AUC_BINS / (2 * AUC_RANGE))).astype(jnp.int32),
                  0, AUC_BINS - 1)
  hist = lambda w: jnp.zeros(AUC_BINS, jnp.float32).at[bins.ravel()].add(w.ravel())
  return {'disc_loss': jnp.sum(real * bce), 'disc_hits': jnp.sum(real * hit),
          'disc_weight': jnp.sum(real), 'disc_replaced': jnp.sum(real * y),
          'disc_auc_pos': hist(real * y), 'disc_auc_neg': hist(real * (1 - y))}


def rtd_sums(params, batch, key, cfg: RtdConfig, deterministic: bool = True
             ) -> dict[str, jax.Array]:
  """The generator's MLM sums and the discriminator's sums of one batch; `key` draws the
  samples (and the dropout when not `deterministic`)."""
  k_gen, k_sample, k_disc = jax.random.split(key, 3)
  rngs = lambda k: None if deterministic else {'dropout': k}
  gen_in = {k: batch[k] for k in GENERATOR_FEATURES if k in batch}
  gen_out = BertForPreTraining(cfg.generator).apply(
      {'params': rtd_model.half_params(params, GENERATOR)}, **gen_in,
      deterministic=deterministic, rngs=rngs(k_gen))
  w = batch['masked_lm_weights'].astype(jnp.float32)
  loss, hits = mlm_loss.full_sums(gen_out.mlm_logits, batch['masked_lm_ids'], w)
  sampled = sample_from_softmax(k_sample, jax.lax.stop_gradient(gen_out.mlm_logits))
  _, fake, labels = corrupt(batch, sampled)
  disc_in = {k: batch[k] for k in DISCRIMINATOR_FEATURES if k in batch}
  logits = ElectraDiscriminator(cfg.discriminator).apply(
      {'params': rtd_model.half_params(params, DISCRIMINATOR, cfg.sharing)}, fake, **disc_in,
      deterministic=deterministic, rngs=rngs(k_disc))
  sums = {'mlm_loss': loss, 'mlm_hits': hits, 'mlm_weight': jnp.sum(w),
          'sampled_mlm_hits': jnp.sum(w * (sampled == batch['masked_lm_ids']))}
  return sums | discriminator_sums(logits, labels, batch['input_mask'] > 0)


def binned_auc(pos, neg) -> jax.Array:
  """Area under the ROC curve from score histograms (ascending bins), ties counted half."""
  above = jnp.cumsum(pos[::-1])[::-1] - pos  # positives in higher bins
  pairs = jnp.sum(pos) * jnp.sum(neg)
  return jnp.sum(neg * (above + 0.5 * pos)) / jnp.maximum(pairs, 1.0)


def summarize(sums, disc_weight: float = 50.0) -> dict[str, jax.Array]:
  """Means from sums (+1e-5 against an all-padding batch, as the MLM's)."""
  mlm_w, disc_w = sums['mlm_weight'] + 1e-5, sums['disc_weight'] + 1e-5
  replaced = sums['disc_replaced'] / disc_w
  out = {'mlm_loss': sums['mlm_loss'] / mlm_w, 'mlm_accuracy': sums['mlm_hits'] / mlm_w,
         'sampled_mlm_accuracy': sums['sampled_mlm_hits'] / mlm_w,
         'disc_loss': sums['disc_loss'] / disc_w, 'disc_accuracy': sums['disc_hits'] / disc_w,
         'disc_replaced_fraction': replaced, 'disc_baseline_accuracy': 1.0 - replaced,
         'disc_auc': binned_auc(sums['disc_auc_pos'], sums['disc_auc_neg'])}
  out['loss'] = out['mlm_loss'] + disc_weight * out['disc_loss']
  return out


def train_step(state: TrainState, batch, *, cfg: RtdConfig, tx: optax.GradientTransformation,
               schedule: optax.Schedule, accum_steps: int = 1, disc_weight: float = 50.0
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  norm_mlm = jnp.sum(batch['masked_lm_weights'].astype(jnp.float32)) + 1e-5
  norm_disc = jnp.sum((batch['input_mask'] > 0).astype(jnp.float32)) + 1e-5

  def loss_fn(params, micro, micro_key):
    sums = rtd_sums(params, micro, micro_key, cfg, deterministic=False)
    return sums['mlm_loss'] / norm_mlm + disc_weight * sums['disc_loss'] / norm_disc, sums

  grads, sums = accumulation.grads_and_sums(jax.grad(loss_fn, has_aux=True), state.params,
                                             batch, key, accum_steps)
  state, update_metrics = apply_gradients(state, grads, tx, schedule)
  return state, summarize(sums, disc_weight) | update_metrics


def eval_step(params, batch, *, cfg: RtdConfig, seed: int = 0) -> dict[str, jax.Array]:
  return rtd_sums(params, batch, jax.random.key(seed), cfg)


def objective(config, disc: BertConfig, layout) -> Objective:
  """The RTD objective of a pre-training config whose model (`disc`) is the discriminator."""
  if config.model.mlm_loss_chunk:
    raise ValueError(f'model.mlm_loss_chunk={config.model.mlm_loss_chunk}: train.objective='
                     'rtd samples from the generator\'s whole logits; set it to 0')
  if config.rtd.generator_init_from and not config.train.init_from:
    raise ValueError(f'rtd.generator_init_from={config.rtd.generator_init_from} needs the '
                     'discriminator beside it: set --config.train.init_from=<discriminator>')
  cfg = rtd_config(config, disc)
  weight = float(config.rtd.disc_weight)
  return Objective(
      name=f'replaced-token detection ({cfg.sharing})', model_cfg=disc,
      init_params=functools.partial(rtd_model.init_params, cfg),
      logical_specs=rtd_model.logical_param_specs(cfg),
      train_step=functools.partial(train_step, cfg=cfg, accum_steps=config.train.accum_steps,
                                   disc_weight=weight),
      eval_step=functools.partial(eval_step, cfg=cfg, seed=config.seed),
      batch_shapes=layout.shapes, layout=layout,
      summarize=functools.partial(summarize, disc_weight=weight),
      train_flops=functools.partial(flops.rtd_train_flops_per_step, cfg.generator, disc))


# ----------------------------------------------------------------------------- start points


def start_params(config, cfg: RtdConfig, fresh: dict) -> tuple[int, dict]:
  """(step, RTD params) for `train.init_from`: an RTD workdir's whole tree (phase 2), or a
  discriminator (an `ElectraForPreTraining` directory, any ELECTRA start point) with the
  generator of `rtd.generator_init_from` (an `ElectraForMaskedLM` directory) or `fresh`'s,
  each checked against its network's shape and the run's data as every start point is
  (`start_points.pretraining_params`). The shared tables are the discriminator's."""
  t, r = config.train, config.rtd
  if loaders.is_workdir(t.init_from) and load_run_config(t.init_from).train.objective == 'rtd':
    step, params = checkpointing.restore_params(t.init_from)
    differ = checkpointing.leaf_differences(params, fresh, labels=('start point', 'run'))
    if differ:
      raise ValueError(f'train.init_from={t.init_from}: its generator and discriminator do not '
                       f'fit the run\'s ({differ}); set --config.model.* and --config.rtd.* '
                       f'as in {fs.join(t.init_from, "config.json")}')
    return step, params
  data = config.data.copy_and_resolve_references()
  data.sentence_objective = 'none'  # whatever the records hold, RTD trains no sentence head
  kw = dict(data=data, allow_vocab_change=t.init_from_allow_vocab_change)
  step, disc = start_points.pretraining_params(t.init_from, cfg.discriminator, **kw)
  head = _discriminator_head(t.init_from, cfg.discriminator)
  if head is None:
    logging.warning('train.init_from=%s has no discriminator head (discriminator_predictions): '
                    'initialised fresh', t.init_from)
    head = fresh[DISCRIMINATOR][rtd_model.HEAD]
  disc = {'embeddings': disc['embeddings'], 'encoder': disc['encoder'], rtd_model.HEAD: head}
  if r.generator_init_from:
    _check_generator_shape(r.generator_init_from, cfg)
    _, gen = start_points.pretraining_params(r.generator_init_from, cfg.generator, **kw)
  else:
    logging.warning('rtd.generator_init_from is empty: the generator starts fresh beside the '
                    'discriminator of %s', t.init_from)
    gen = rtd_model.half_params(fresh, GENERATOR)
  return step, rtd_model.rtd_params(disc, gen, cfg.sharing)


def _discriminator_head(path: str, cfg: BertConfig) -> dict | None:
  """An HF directory's `discriminator_predictions`, if it has one."""
  if loaders.detect_kind(path) != loaders.HF_DIR:
    return None
  with fs.local_dir(path) as local:
    return hf_electra.discriminator_head_from_hf(hf.read_weights(local), cfg, path)


def _check_generator_shape(path: str, cfg: RtdConfig) -> None:
  """The generator the `rtd` block sizes must be the start point's, or an error saying which
  fractions build it."""
  stored, d, g = loaders.model_config_of(path), cfg.discriminator, cfg.generator
  if (stored.hidden_size, stored.num_layers) != (g.hidden_size, g.num_layers):
    raise ValueError(
        f'rtd.generator_init_from={path} is {stored.hidden_size} wide with {stored.num_layers} '
        f'layers; the run\'s generator is {g.hidden_size} x {g.num_layers}. Set '
        f'--config.rtd.generator_hidden_fraction={stored.hidden_size / d.hidden_size:g} and '
        f'--config.rtd.generator_layers_fraction={stored.num_layers / d.num_layers:g}')
