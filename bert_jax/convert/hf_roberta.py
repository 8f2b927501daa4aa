"""Flax parameters of `arch='roberta'` / `'xlm-roberta'` <-> transformers' RoBERTa and XLM-R
directories (`RobertaForMaskedLM`, `XLMRobertaForMaskedLM`, their `RobertaModel` encoders;
models/roberta/modeling_roberta.py).

The encoder is BERT's under `roberta.` (bert_state_map.py's layer map, unchanged); what differs is kept here:
  - positions: HF numbers real tokens from `pad_token_id + 1` (fairseq's
    `create_position_ids_from_input_ids`), our `position_offset`; padding is masked, so its
    position (HF: `pad_token_id`) never reaches a real token;
  - the MLM head `lm_head.{dense,layer_norm,bias}` is our `mlm_transform`, `mlm_layer_norm`,
    `mlm_output_bias`; `lm_head.decoder` is tied to the word embeddings and the bias, so it
    is not written (HF's `_tied_weights_keys`). Its activation is always exact GELU;
  - no NSP head, and a pooler only in `RobertaModel` / `RobertaForMultipleChoice` (read when
    there, written when our tree has one).
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
MODEL_TYPES = ('roberta', 'xlm-roberta')  # config.json model_type == our arch
CLASS_PREFIX = {'roberta': 'Roberta', 'xlm-roberta': 'XLMRoberta'}
ENCODER_PREFIX = 'roberta.'
# Buffers and tied copies a checkpoint may hold that are not parameters of their own.
_NOT_PARAMS = ('embeddings.position_ids', 'embeddings.token_type_ids', 'lm_head.decoder.weight',
               'lm_head.decoder.bias')
# bert_state_map.py's BERT maps and tree helpers: RoBERTa's encoder is BERT's, tensor for tensor.
_bert_top_map, _linear, _set = (  # pylint: disable=protected-access
    bert_state_map._top_map, bert_state_map._linear, bert_state_map._set)


def _same(x):
  return x


def _top_map() -> dict[str, tuple[tuple[str, ...], Callable, Callable]]:
  """HF key (without `roberta.`) -> (our path, hf->ours, ours->hf); layers are bert_state_map.py's."""
  m = {k: v for k, v in _bert_top_map().items()
       if k.startswith(('embeddings.', 'pooler.'))}
  lin = (_linear, _linear)
  m.update({
      'lm_head.dense.weight': (('mlm_transform', 'kernel'), *lin),
      'lm_head.dense.bias': (('mlm_transform', 'bias'), _same, _same),
      'lm_head.layer_norm.weight': (('mlm_layer_norm', 'scale'), _same, _same),
      'lm_head.layer_norm.bias': (('mlm_layer_norm', 'bias'), _same, _same),
      'lm_head.bias': (('mlm_output_bias',), _same, _same),
  })
  return m


def _is_head(key: str) -> bool:
  return key.startswith('lm_head.')


# ----------------------------------------------------------------------------- configs


def check_exportable(cfg: BertConfig) -> None:
  """Only what transformers' RoBERTa has: BERT's block, learned positions past the padding
  index, and exact GELU (RobertaLMHead hard-codes it, whatever hidden_act says)."""
  bert = BertConfig()
  off = {k: getattr(cfg, k) for k in ('norm_position', 'use_bias', 'mlp', 'positions',
                                      'global_attention_every')
         if getattr(cfg, k) != getattr(bert, k)}
  if cfg.hidden_act != 'gelu':
    off['hidden_act'] = cfg.hidden_act
  if cfg.position_offset < 1:
    off['position_offset'] = cfg.position_offset
  if cfg.arch not in MODEL_TYPES or off:
    raise CheckpointError(
        f'model.arch={cfg.arch!r} with {off or "these switches"} has no transformers RoBERTa '
        'class: export needs arch roberta or xlm-roberta, BERT\'s block (post-norm, biases, '
        'learned positions, global attention), hidden_act=gelu and position_offset >= 1')


def architecture(cfg: BertConfig, suffix: str = 'ForMaskedLM') -> str:
  return CLASS_PREFIX[cfg.arch] + suffix


def config_to_hf(cfg: BertConfig, architecture_name: str | None = None) -> dict[str, Any]:
  check_exportable(cfg)
  return {
      'architectures': [architecture_name or architecture(cfg)],
      'model_type': cfg.arch,
      **bert_state_map.config_fields(cfg),
      # HF derives the position offset from pad_token_id; bos/eos are the tokenizer's (RoBERTa's
      # and XLM-R's <s> and </s>) and change no number.
      'pad_token_id': cfg.position_offset - 1,
      'bos_token_id': 0,
      'eos_token_id': 2,
      'position_embedding_type': 'absolute',
      'tie_word_embeddings': True,
      'torch_dtype': 'float32',
  }


def config_from_hf(hf_config: Mapping[str, Any], source: str = 'config.json') -> BertConfig:
  """Our config of a RoBERTa / XLM-R config.json; absent fields take RobertaConfig's defaults
  (as transformers would build the model), not roberta-base's."""
  model_type = hf_config.get('model_type')
  if model_type not in MODEL_TYPES:
    raise CheckpointError(f'{source}: model_type {model_type!r} is not one of {MODEL_TYPES}')
  if hf_config.get('hidden_act', 'gelu') != 'gelu':
    raise CheckpointError(f'{source}: hidden_act {hf_config["hidden_act"]!r}; only "gelu" is '
                          'supported for RoBERTa (its MLM head always uses exact GELU)')
  pad = hf_config.get('pad_token_id', 1)
  if pad is None or pad < 0:
    raise CheckpointError(f'{source}: pad_token_id {pad!r}; RoBERTa numbers positions from '
                          'pad_token_id + 1, so it needs one >= 0')
  return hf_base.bert_layout_config(hf_config, source, model_type, {'gelu': 'gelu'},
                                    position_offset=pad + 1)


# ----------------------------------------------------------------------------- weights


def _hf_name(key: str, prefix: str) -> str:
  return key if _is_head(key) else prefix + key


def _to_hf_tree(params, cfg: BertConfig, prefix: str) -> dict:
  """Our tree -> HF-keyed, HF-shaped tensors; groups the tree lacks (a head model's MLM head,
  the pooler of all but multiple choice) are not written."""
  return bert_state_map.to_hf_tree(params, cfg, _top_map(), prefix,
                                   lambda k: _hf_name(k, prefix))


def params_to_hf(params, cfg: BertConfig, prefix: str = ENCODER_PREFIX) -> dict[str, Array]:
  """Our tree -> `(XLM)RobertaForMaskedLM` state dict (float32 numpy, no tied decoder)."""
  check_exportable(cfg)
  return bert_state_map.float32_state(params, lambda p: _to_hf_tree(p, cfg, prefix))


def _canonical(key: str) -> str:
  """No `roberta.` prefix (a bare `RobertaModel` has none)."""
  return bert_state_map.strip_prefix(key, ENCODER_PREFIX)


def _expected_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
  """HF tensor shapes implied by `cfg` (pooler included), computed abstractly."""
  return bert_state_map.expected_shapes(lambda: bert_state_map.with_pooler(cfg),
                                        lambda p: _to_hf_tree(p, cfg, ''))


def params_from_hf(state: Mapping[str, Array], cfg: BertConfig, *, rng: jax.Array | None = None,
                   source: str = 'checkpoint') -> dict:
  """HF RoBERTa / XLM-R state dict -> our tree (its pooler too, when it has one).

  Encoder weights must all be there; a checkpoint without the MLM head (`RobertaModel`,
  sentence-transformers) gets a fresh one from `rng`, with a warning naming it.
  """
  state = {_canonical(k): np.asarray(v) for k, v in state.items()}
  expected = _expected_shapes(cfg)
  top = _top_map()
  bert_state_map.check_state(state, expected, [k for k in top if k.startswith('embeddings.')],
                             cfg, source, 'RoBERTa')

  params: dict = {}
  fresh_heads = []
  for key, (path, from_hf, _) in top.items():
    if key in state:
      _set(params, path, from_hf(state[key].astype(np.float32)))
    elif _is_head(key):
      fresh_heads.append(key)
  if fresh_heads:
    fresh = init_params(cfg, rng if rng is not None else jax.random.key(0))
    for group in ('mlm_transform', 'mlm_layer_norm', 'mlm_output_bias'):
      params[group] = jax.tree_util.tree_map(np.asarray, fresh[group])
    logging.warning('%s has no lm_head (an encoder-only checkpoint): the MLM head is '
                    'initialised fresh; pre-train before using it.', source)
  if 'pooler' in params and len(params['pooler']) != 2:
    raise CheckpointError(f'{source}: pooler.dense.weight and .bias must come together')

  params['encoder'] = bert_state_map.encoder_from_hf(state, cfg)
  bert_state_map.warn_unused(state, set(expected) | set(_NOT_PARAMS), source,
                             'RobertaForMaskedLM')
  return params


for _model_type in MODEL_TYPES:
  hf_base.register(hf_base.Converter(
      family=_model_type, model_types=(_model_type,), class_prefix=CLASS_PREFIX[_model_type],
      encoder_prefix=ENCODER_PREFIX, pooler_prefix=ENCODER_PREFIX + 'pooler.',
      mlm_prefixes=('lm_head.',), config_to_hf=config_to_hf, config_from_hf=config_from_hf,
      params_to_hf=params_to_hf, params_from_hf=params_from_hf, tokenizer_pad_id=False))
