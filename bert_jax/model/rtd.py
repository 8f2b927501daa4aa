"""Replaced-token detection's two networks (ELECTRA, Clark et al. 2020): a small MLM generator
and the discriminator that is the product, sharing their token embeddings.

The generator is `encoder.BertForPreTraining` with `arch='electra'` (transformers'
`ElectraForMaskedLM`), narrower than the discriminator by `generator_config`'s rule, which is
google-research/electra's `get_generator_config` (run_pretraining.py): hidden = round(fraction
x the discriminator's), layers likewise, MLP 4 x hidden, one head per 64 dimensions. The
discriminator is `ElectraDiscriminator`, transformers' `ElectraForPreTraining`: the encoder, then
`discriminator_predictions` (dense, `hidden_act`, dense to one logit a token).

Sharing follows the reference's variable scopes (model/modeling.py builds both networks'
embeddings under `electra/embeddings`): the word, position and token-type tables and the
embedding LayerNorm are one group, `params['embeddings']`, read by both; each network keeps
its own `embeddings_project` when its width differs from the tables' (ELECTRA-small's
128-wide tables under a 64-wide generator and a 256-wide discriminator). With
`sharing='gdes'` (DeBERTa-v3's gradient-disentangled embedding sharing, He et al. 2021; the
forward hook of microsoft/DeBERTa's `replaced_token_detection_model.py`) the discriminator
reads stop_gradient(shared) + its own residual of the same shape, initialised at zero, so
its loss never moves the generator's embeddings.

The parameter tree: {'embeddings': shared, 'generator': its tree less the shared leaves,
'discriminator': likewise (plus the residuals under gdes)}. `half_params` rebuilds either
network's whole tree, which is also what exports as that network's HF directory.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import encoder as enc
from bert_jax.model.encoder import BertConfig

GENERATOR, DISCRIMINATOR = 'generator', 'discriminator'
# Leaves of the `embeddings` group both networks read (reference scope `electra/embeddings`).
SHARED = ('word_embeddings', 'position_embeddings', 'token_type_embeddings', 'layer_norm')
SHARING = ('tied', 'gdes')  # ELECTRA's tied embeddings | DeBERTa-v3's GDES
HEAD = 'discriminator_predictions'


@dataclasses.dataclass(frozen=True)
class RtdConfig:
  discriminator: BertConfig
  generator: BertConfig
  sharing: str = 'tied'

  def __post_init__(self):
    if self.sharing not in SHARING:
      raise ValueError(f'rtd.embedding_sharing={self.sharing!r}: expected one of {SHARING}')
    if self.discriminator.arch != 'electra':
      raise ValueError(f'train.objective=rtd trains ELECTRA networks, but model.arch='
                       f'{self.discriminator.arch!r}; set --config.model.arch=electra '
                       '(configs/electra.py does)')
    d, g = self.discriminator, self.generator
    tables = ('vocab_size', 'embedding_width', 'max_position_embeddings', 'type_vocab_size')
    differ = [f for f in tables if getattr(d, f) != getattr(g, f)]
    if differ:
      raise ValueError(f'the generator and discriminator share their embeddings, but differ in '
                       f'{differ}: a generator start point must have the discriminator\'s '
                       'vocabulary, embedding_size, positions and token types')


def generator_config(disc: BertConfig, hidden_fraction: float, layers_fraction: float = 1.0
                     ) -> BertConfig:
  """The generator of `disc`: google-research/electra's `get_generator_config`, on tables as
  wide as the discriminator's (its `embedding_size`)."""
  hidden = int(round(disc.hidden_size * hidden_fraction))
  layers = int(round(disc.num_layers * layers_fraction))
  heads = max(1, hidden // 64)
  if hidden < 1 or layers < 1 or hidden % heads:
    raise ValueError(
        f'rtd.generator_hidden_fraction={hidden_fraction} and rtd.generator_layers_fraction='
        f'{layers_fraction} of a {disc.hidden_size}-wide, {disc.num_layers}-layer '
        f'discriminator give a generator of width {hidden} and {layers} layers; it needs at '
        f'least one of each and a width divisible by its {heads} heads of 64')
  width = disc.embedding_width
  return disc.replace(hidden_size=hidden, num_layers=layers, num_heads=heads,
                      intermediate_size=4 * hidden,
                      embedding_size=0 if width == hidden else width)


class DiscriminatorHead(nn.Module):
  """`ElectraDiscriminatorPredictions`: dense, `hidden_act`, dense to one logit."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    h = enc.ACTIVATIONS[cfg.hidden_act](enc._dense(cfg, cfg.hidden_size, ('embed', 'mlp'),
                                                   'dense')(x))
    return enc._dense(cfg, 1, ('mlp', None), 'dense_prediction')(h)[..., 0]


class ElectraDiscriminator(nn.Module):
  """transformers' `ElectraForPreTraining`: one replaced-or-original logit a token [B, S]
  (float32), under the same packed-row and dropout conventions as every model here."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, position_ids=None,
               packed_segment_ids=None, deterministic: bool = True) -> jax.Array:
    sequence_output, _ = enc.encode(self.cfg, input_ids, input_mask, segment_ids,
                                    position_ids=position_ids,
                                    packed_segment_ids=packed_segment_ids,
                                    deterministic=deterministic)
    return DiscriminatorHead(self.cfg, name=HEAD)(sequence_output).astype(jnp.float32)


def _discriminator_init(cfg: BertConfig, rng, seq_len: int):
  return ElectraDiscriminator(cfg).init(rng, jnp.zeros((1, seq_len), jnp.int32))


def _generator_init(cfg: BertConfig, rng, seq_len: int):
  return enc.BertForPreTraining(cfg).init(rng, jnp.zeros((1, seq_len), jnp.int32),
                                          masked_lm_positions=jnp.zeros((1, 1), jnp.int32))


def _assemble(disc: dict, gen: dict, sharing: str, residual) -> dict:
  """Two whole trees (params or their logical specs) -> the RTD tree: the discriminator's
  shared leaves become `embeddings`, the generator's are dropped (the same shapes), and under
  gdes the discriminator keeps `residual(leaf)` of each."""
  def split(tree, own_shared):
    own = {k: v for k, v in tree['embeddings'].items() if k not in SHARED}
    own.update(own_shared)
    rest = {k: v for k, v in tree.items() if k != 'embeddings'}
    return rest | ({'embeddings': own} if own else {})

  shared = {k: v for k, v in disc['embeddings'].items() if k in SHARED}
  gdes = ({k: jax.tree_util.tree_map(residual, v) for k, v in shared.items()}
          if sharing == 'gdes' else {})
  return {'embeddings': shared, GENERATOR: split(gen, {}), DISCRIMINATOR: split(disc, gdes)}


@functools.partial(jax.jit, static_argnames=('cfg', 'seq_len'))
def init_params(cfg: RtdConfig, rng: jax.Array, seq_len: int = 8) -> dict:
  """Unboxed float32 params of both networks; the shared tables are the discriminator's draw,
  GDES residuals start at zero. Jitted, as encoder.init_params is."""
  k_disc, k_gen = jax.random.split(rng)
  disc = nn.unbox(_discriminator_init(cfg.discriminator, k_disc, seq_len)['params'])
  gen = nn.unbox(_generator_init(cfg.generator, k_gen, seq_len)['params'])
  return _assemble(disc, gen, cfg.sharing, jnp.zeros_like)


def logical_param_specs(cfg: RtdConfig, seq_len: int = 8):
  """The logical PartitionSpec of every parameter (a residual shards as its table)."""
  specs = [nn.get_partition_spec(jax.eval_shape(
      lambda f=f, c=c: f(c, jax.random.key(0), seq_len))['params'])
      for f, c in ((_discriminator_init, cfg.discriminator), (_generator_init, cfg.generator))]
  return _assemble(*specs, cfg.sharing, lambda spec: spec)


def half_params(params: dict, half: str, sharing: str = 'tied') -> dict:
  """One network's whole tree (`BertForPreTraining` for the generator, `ElectraDiscriminator`
  for the discriminator) from the RTD tree; under gdes the discriminator's tables are
  stop_gradient(shared) + residual."""
  own = params[half]
  own_emb = own.get('embeddings', {})
  shared = params['embeddings']
  if half == DISCRIMINATOR and sharing == 'gdes':
    shared = {k: jax.tree_util.tree_map(lambda s, r: jax.lax.stop_gradient(s) + r, v,
                                        own_emb[k]) for k, v in shared.items()}
  embeddings = {**{k: v for k, v in own_emb.items() if k not in SHARED}, **shared}
  return {**own, 'embeddings': embeddings}


def rtd_params(disc: dict, gen: dict, sharing: str = 'tied') -> dict:
  """Two whole trees (a released generator / discriminator pair, say) as the RTD tree. The
  shared tables are the discriminator's; under gdes the residuals are zero (the discriminator
  then starts from its own tables exactly when the generator's equal them)."""
  return _assemble(disc, gen, sharing, jnp.zeros_like)
