"""Flax parameters of `arch='bert'` <-> transformers' BERT directories (models/bert/
modeling_bert.py): `BertForPreTraining` (what we export), `BertModel`, `BertForMaskedLM`, and
through hf_heads.py `BertFor<Task>`; legacy `gamma`/`beta` names and bare (unprefixed) keys read.

The layout is bert_state_map.py's, under `bert.`; the heads are `cls.predictions.*` (the MLM
transform and the output bias; the decoder is tied to the word embeddings, so not written) and
`cls.seq_relationship` (NSP).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.convert import bert_state_map, hf_base
from bert_jax.convert.bert_state_map import ACT_FROM_HF, _get, _set, _top_map
from bert_jax.model.encoder import BertConfig, init_params

Array = np.ndarray
MODEL_TYPE = 'bert'
ENCODER_PREFIX = 'bert.'


def config_to_hf(cfg: BertConfig, architecture: str = 'BertForPreTraining') -> dict[str, Any]:
  return {
      'architectures': [architecture],
      'model_type': MODEL_TYPE,
      **bert_state_map.config_fields(cfg),
      'pad_token_id': 0,
      'position_embedding_type': 'absolute',
      'tie_word_embeddings': True,
      'torch_dtype': 'float32',
  }


def config_from_hf(hf: Mapping[str, Any], source: str = 'config.json') -> BertConfig:
  return hf_base.bert_layout_config(hf, source, MODEL_TYPE, ACT_FROM_HF)


def _hf_key(key: str) -> str:
  """Canonical spelling: no `bert.` prefix, `weight`/`bias` for legacy `gamma`/`beta`."""
  key = bert_state_map.strip_prefix(key, ENCODER_PREFIX)
  if key.endswith('.gamma'):
    key = key[:-len('.gamma')] + '.weight'
  elif key.endswith('.beta'):
    key = key[:-len('.beta')] + '.bias'
  return key


def _to_hf_tree(params, cfg: BertConfig, prefix: str = ENCODER_PREFIX) -> dict:
  """Our tree -> HF-keyed, HF-shaped tensors (heads under `cls.`, the rest under `prefix`)."""
  return bert_state_map.to_hf_tree(
      params, cfg, _top_map(), prefix, lambda k: k if k.startswith('cls.') else prefix + k)


def params_to_hf(params, cfg: BertConfig, prefix: str = ENCODER_PREFIX) -> dict[str, Array]:
  """Our parameter tree -> HF BertForPreTraining state dict (float32 numpy, no tied copies)."""
  return bert_state_map.float32_state(params, lambda p: _to_hf_tree(p, cfg, prefix))


def _expected_hf_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
  """HF tensor shapes implied by `cfg`, computed abstractly (no model-sized allocation)."""
  return bert_state_map.expected_shapes(lambda: init_params(cfg, jax.random.key(0)),
                                        lambda p: _to_hf_tree(p, cfg, ''))


def params_from_hf(state: Mapping[str, Array], cfg: BertConfig, *, rng: jax.Array | None = None,
                   source: str = 'checkpoint') -> dict:
  """HF state dict -> our parameter tree.

  Accepts `bert.`-prefixed or bare keys and legacy `gamma`/`beta`. Encoder weights must all be
  present; missing heads (BertModel, sentence-transformers) are freshly initialised from `rng`
  with a warning that names them.
  """
  state = {_hf_key(k): np.asarray(v) for k, v in state.items()}
  expected = _expected_hf_shapes(cfg)
  top = _top_map()
  bert_state_map.check_state(state, expected, [k for k in top if k.startswith('embeddings.')],
                             cfg, source, 'BERT')

  fresh = None
  params: dict = {}
  missing_heads = []
  for key, (path, from_hf, _) in top.items():
    if key in state:
      _set(params, path, from_hf(state[key].astype(np.float32)))
    else:
      missing_heads.append(key)
      if fresh is None:
        fresh = jax.tree_util.tree_map(np.asarray, init_params(
            cfg, rng if rng is not None else jax.random.key(0)))
      _set(params, path, _get(fresh, path))
  if missing_heads:
    logging.warning('%s has no %s: initialised fresh (an encoder-only checkpoint); fine-tune or '
                    'pre-train before using those heads.', source, ', '.join(missing_heads))

  params['encoder'] = bert_state_map.encoder_from_hf(state, cfg)
  known = set(expected) | {'cls.predictions.decoder.weight', 'cls.predictions.decoder.bias',
                           'embeddings.position_ids'}
  bert_state_map.warn_unused(state, known, source, 'BertForPreTraining')
  return params


CONVERTER = hf_base.register(hf_base.Converter(
    family=MODEL_TYPE, model_types=(MODEL_TYPE,), class_prefix='Bert',
    encoder_prefix=ENCODER_PREFIX, pooler_prefix=ENCODER_PREFIX + 'pooler.',
    mlm_prefixes=('cls.',), config_to_hf=config_to_hf, config_from_hf=config_from_hf,
    params_to_hf=params_to_hf, params_from_hf=params_from_hf))
