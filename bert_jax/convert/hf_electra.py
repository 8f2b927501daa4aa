"""Flax parameters of `arch='electra'` <-> transformers' ELECTRA directories
(models/electra/modeling_electra.py): `ElectraForMaskedLM` (a generator; what we export),
`ElectraForPreTraining` (a discriminator), `ElectraModel`, and through hf_heads.py
`ElectraFor<Task>`.

The encoder is BERT's under `electra.` (bert_state_map.py's layer map, unchanged); what differs
is kept here:
  - the embedding tables are `embedding_size` wide, and `electra.embeddings_project` (only when
    that is narrower than hidden_size) is our `embeddings/embeddings_project`;
  - the MLM head is the generator's: `generator_predictions.{dense,LayerNorm}` are our
    `mlm_transform`, `mlm_layer_norm`, `generator_lm_head.bias` our `mlm_output_bias`;
    `generator_lm_head.weight` is tied to the word embeddings, so it is not written;
  - a discriminator's `discriminator_predictions.*` (one replaced-or-not logit a token) is not an
    MLM head: it is dropped and the MLM head starts fresh, both logged; a tree that has the
    group (replaced-token detection's discriminator, bert_jax/model/rtd.py) exports it as
    `ElectraForPreTraining`, and `discriminator_head_from_hf` reads it back;
  - no pooler or NSP head; multiple choice's `sequence_summary.summary` (dense + GELU on the
    first token) is our `pooler` group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.convert import bert_state_map, hf_base
from bert_jax.convert.hf_base import CheckpointError
from bert_jax.model.encoder import BertConfig, init_params

Array = np.ndarray
MODEL_TYPE = 'electra'
ENCODER_PREFIX = 'electra.'
DISCRIMINATOR_HEAD = 'discriminator_predictions.'
DISCRIMINATOR_GROUP = 'discriminator_predictions'  # our group of that head (model/rtd.py)
# Tensors outside `electra.`: the generator's MLM head, multiple choice's summary, the
# discriminator's head (read only to be dropped).
_HEAD_PREFIXES = ('generator_predictions.', 'generator_lm_head.', 'sequence_summary.',
                  DISCRIMINATOR_HEAD)
MLM_GROUPS = ('mlm_transform', 'mlm_layer_norm', 'mlm_output_bias')
# Buffers and tied copies a checkpoint may hold that are not parameters of their own.
_NOT_PARAMS = ('embeddings.position_ids', 'embeddings.token_type_ids',
               'generator_lm_head.weight')
# ElectraConfig's ElectraSequenceSummary fields, the only ones our multiple choice computes.
SUMMARY = dict(summary_type='first', summary_use_proj=True, summary_activation='gelu')
_linear, _set = bert_state_map._linear, bert_state_map._set  # pylint: disable=protected-access


def _same(x):
  return x


def _top_map(cfg: BertConfig) -> dict[str, tuple[tuple[str, ...], Callable, Callable]]:
  """HF key (without `electra.`) -> (our path, hf->ours, ours->hf); layers are BERT's."""
  m = {k: v for k, v in bert_state_map._top_map().items()
       if k.startswith('embeddings.')}
  lin = (_linear, _linear)
  if cfg.embedding_width != cfg.hidden_size:
    m['embeddings_project.weight'] = (('embeddings', 'embeddings_project', 'kernel'), *lin)
    m['embeddings_project.bias'] = (('embeddings', 'embeddings_project', 'bias'), _same, _same)
  m.update({
      'generator_predictions.dense.weight': (('mlm_transform', 'kernel'), *lin),
      'generator_predictions.dense.bias': (('mlm_transform', 'bias'), _same, _same),
      'generator_predictions.LayerNorm.weight': (('mlm_layer_norm', 'scale'), _same, _same),
      'generator_predictions.LayerNorm.bias': (('mlm_layer_norm', 'bias'), _same, _same),
      'generator_lm_head.bias': (('mlm_output_bias',), _same, _same),
      'sequence_summary.summary.weight': (('pooler', 'kernel'), *lin),
      'sequence_summary.summary.bias': (('pooler', 'bias'), _same, _same),
  })
  return m | _discriminator_map()


def _discriminator_map() -> dict[str, tuple[tuple[str, ...], Callable, Callable]]:
  """`ElectraDiscriminatorPredictions` (dense, dense_prediction) <-> our `DISCRIMINATOR_GROUP`."""
  g, lin = DISCRIMINATOR_GROUP, (_linear, _linear)
  return {f'{DISCRIMINATOR_HEAD}{name}.{leaf}': ((g, name, ours), *(lin if ours == 'kernel'
                                                                      else (_same, _same)))
          for name in ('dense', 'dense_prediction')
          for leaf, ours in (('weight', 'kernel'), ('bias', 'bias'))}


def _is_head(key: str) -> bool:
  return key.startswith(_HEAD_PREFIXES)


# ----------------------------------------------------------------------------- configs


def check_exportable(cfg: BertConfig) -> None:
  """Only what transformers' ELECTRA has: BERT's block, learned positions from 0, token types."""
  bert = BertConfig()
  off = {k: getattr(cfg, k) for k in ('norm_position', 'use_bias', 'mlp', 'positions',
                                      'global_attention_every', 'position_offset')
         if getattr(cfg, k) != getattr(bert, k)}
  if cfg.type_vocab_size < 1:
    off['type_vocab_size'] = cfg.type_vocab_size
  if cfg.arch != 'electra' or off:
    raise CheckpointError(
        f'model.arch={cfg.arch!r} with {off or "these switches"} has no transformers ELECTRA '
        'class: export needs arch electra, BERT\'s block (post-norm, biases, learned positions '
        'from 0, global attention) and type_vocab_size >= 1')


def architecture(suffix: str = 'ForMaskedLM') -> str:
  return 'Electra' + suffix


def config_to_hf(cfg: BertConfig, architecture_name: str | None = None) -> dict[str, Any]:
  check_exportable(cfg)
  return {
      'architectures': [architecture_name or architecture()],
      'model_type': MODEL_TYPE,
      **bert_state_map.config_fields(cfg),
      'embedding_size': cfg.embedding_width,
      'pad_token_id': 0,
      'position_embedding_type': 'absolute',
      **SUMMARY,
      # multiple choice's dropout after the summary: ours is the classifier's (hidden_dropout
      # unless the head sets one; hf_heads.config_to_hf writes that)
      'summary_last_dropout': cfg.hidden_dropout,
      'tie_word_embeddings': True,
      'torch_dtype': 'float32',
  }


def config_from_hf(hf_config: Mapping[str, Any], source: str = 'config.json') -> BertConfig:
  """Our config of an ELECTRA config.json; absent fields take ElectraConfig's defaults (as
  transformers would build the model: embedding_size 128, not hidden_size)."""
  if hf_config.get('model_type') != MODEL_TYPE:
    raise CheckpointError(f'{source}: model_type {hf_config.get("model_type")!r} is not '
                          f'{MODEL_TYPE!r}')
  if 'ElectraForMultipleChoice' in (hf_config.get('architectures') or []):
    off = {k: hf_config.get(k, v) for k, v in SUMMARY.items() if hf_config.get(k, v) != v}
    if hf_config.get('summary_proj_to_labels'):
      off['summary_proj_to_labels'] = True
    if off:
      raise CheckpointError(f'{source}: ElectraForMultipleChoice with {off}; only '
                            f'ElectraConfig\'s sequence summary ({SUMMARY}) is supported')
  embedding = hf_config.get('embedding_size', 128)
  return hf_base.bert_layout_config(
      hf_config, source, MODEL_TYPE, bert_state_map.ACT_FROM_HF,
      embedding_size=0 if embedding == hf_config.get('hidden_size') else embedding)


# ----------------------------------------------------------------------------- weights


def _to_hf_tree(params, cfg: BertConfig, prefix: str) -> dict:
  """Our tree -> HF-keyed, HF-shaped tensors; groups the tree lacks (a head model's MLM head,
  the pooler of all but multiple choice) are not written."""
  return bert_state_map.to_hf_tree(params, cfg, _top_map(cfg), prefix,
                                   lambda k: k if _is_head(k) else prefix + k)


def params_to_hf(params, cfg: BertConfig, prefix: str = ENCODER_PREFIX) -> dict[str, Array]:
  """Our tree -> `ElectraForMaskedLM` state dict (float32 numpy, no tied decoder weight)."""
  check_exportable(cfg)
  return bert_state_map.float32_state(params, lambda p: _to_hf_tree(p, cfg, prefix))


def _canonical(key: str) -> str:
  """No `electra.` prefix (a bare `ElectraModel` has none)."""
  return bert_state_map.strip_prefix(key, ENCODER_PREFIX)


def _expected_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
  """HF tensor shapes implied by `cfg` (multiple choice's summary included), abstractly."""
  return bert_state_map.expected_shapes(lambda: bert_state_map.with_pooler(cfg),
                                        lambda p: _to_hf_tree(p, cfg, ''))


def params_from_hf(state: Mapping[str, Array], cfg: BertConfig, *, rng: jax.Array | None = None,
                   source: str = 'checkpoint') -> dict:
  """HF ELECTRA state dict -> our tree (multiple choice's summary as `pooler`, when there).

  Encoder weights must all be there. A checkpoint without the generator's MLM head (a
  discriminator, `ElectraModel`, a task model) gets a fresh one from `rng`, with a warning
  that says why; a discriminator's replaced-token-detection head is dropped.
  """
  state = {_canonical(k): np.asarray(v) for k, v in state.items()}
  expected = _expected_shapes(cfg)
  top = _top_map(cfg)
  bert_state_map.check_state(state, expected, [k for k in top if not _is_head(k)], cfg, source,
                             'ELECTRA')

  params: dict = {}
  for key, (path, from_hf, _) in top.items():
    if key in state:
      _set(params, path, from_hf(state[key].astype(np.float32)))
  discriminator = sorted(k for k in state if k.startswith(DISCRIMINATOR_HEAD))
  if any(g not in params for g in MLM_GROUPS):
    fresh = init_params(cfg, rng if rng is not None else jax.random.key(0))
    for group in MLM_GROUPS:
      params[group] = jax.tree_util.tree_map(np.asarray, fresh[group])
    if discriminator:
      logging.warning('%s is an ELECTRA discriminator (ElectraForPreTraining): its replaced-'
                      'token-detection head (%s) is not an MLM head and is dropped; the MLM '
                      'head (ElectraForMaskedLM\'s generator_predictions, generator_lm_head) '
                      'is initialised fresh; pre-train before using it.', source,
                      ', '.join(discriminator))
    else:
      logging.warning('%s has no generator_predictions / generator_lm_head (an encoder-only '
                      'checkpoint): the MLM head is initialised fresh; pre-train before using '
                      'it.', source)
  elif discriminator:
    logging.warning('%s: dropped the discriminator head %s', source, ', '.join(discriminator))
  if 'pooler' in params and len(params['pooler']) != 2:
    raise CheckpointError(f'{source}: sequence_summary.summary.weight and .bias must come '
                          'together')

  params.pop(DISCRIMINATOR_GROUP, None)  # read by discriminator_head_from_hf
  params['encoder'] = bert_state_map.encoder_from_hf(state, cfg)
  bert_state_map.warn_unused(state, set(expected) | set(_NOT_PARAMS) | set(discriminator),
                             source, 'ElectraForMaskedLM')
  return params


def discriminator_head_from_hf(state: Mapping[str, Array], cfg: BertConfig,
                               source: str = 'checkpoint') -> dict | None:
  """The discriminator head of an `ElectraForPreTraining` state dict as our
  `DISCRIMINATOR_GROUP` tree, or None when the checkpoint has none (a generator)."""
  state = {_canonical(k): np.asarray(v) for k, v in state.items()}
  head = {k: v for k, v in _discriminator_map().items() if k in state}
  if not head:
    return None
  if len(head) != 4:
    raise CheckpointError(f'{source}: has only {sorted(head)} of ElectraForPreTraining\'s '
                          'discriminator_predictions (dense and dense_prediction, weight and bias)')
  out: dict = {}
  for key, (path, from_hf, _) in head.items():
    _set(out, path, from_hf(state[key].astype(np.float32)))
  h = cfg.hidden_size
  if out[DISCRIMINATOR_GROUP]['dense']['kernel'].shape != (h, h):
    raise CheckpointError(f'{source}: discriminator_predictions.dense is not {h} x {h}')
  return out[DISCRIMINATOR_GROUP]


CONVERTER = hf_base.register(hf_base.Converter(
    family=MODEL_TYPE, model_types=(MODEL_TYPE,), class_prefix='Electra',
    encoder_prefix=ENCODER_PREFIX, pooler_prefix='sequence_summary.',
    mlm_prefixes=_HEAD_PREFIXES, config_to_hf=config_to_hf, config_from_hf=config_from_hf,
    params_to_hf=params_to_hf, params_from_hf=params_from_hf))
