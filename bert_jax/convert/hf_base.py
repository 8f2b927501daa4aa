"""What every HuggingFace converter shares, at the bottom of `bert_jax/convert`: the one error
type, the BERT-layout config.json fields with transformers' defaults, and the registry of
converters, one per encoder family (hf_bert.py, hf_roberta.py, hf_electra.py, hf_modern.py,
siblings that import only this module and bert_state_map.py).

A `Converter` is a family's HF side: the config.json `model_type`s it reads, its class and
state-dict prefixes, and four functions (config and params, each way). hf.py, hf_heads.py and
sentence_transformers_export.py find a model's converter by its family (`for_arch`) or a
directory's by its `model_type` (`for_model_type`) and never branch on the name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from bert_jax.model.encoder import BertConfig


class CheckpointError(ValueError):
  """A directory that is not a loadable checkpoint of a known family; the message says why and
  what to do."""


# ----------------------------------------------------------------------------- configs

# BERT-layout config.json fields (BertConfig, RobertaConfig and ElectraConfig spell them alike)
# -> (our BertConfig field, transformers' default when absent; None: required).
BERT_LAYOUT_FIELDS = {
    'vocab_size': ('vocab_size', None),
    'hidden_size': ('hidden_size', None),
    'num_hidden_layers': ('num_layers', None),
    'num_attention_heads': ('num_heads', None),
    'intermediate_size': ('intermediate_size', None),
    'hidden_dropout_prob': ('hidden_dropout', 0.1),
    'attention_probs_dropout_prob': ('attention_dropout', 0.1),
    'max_position_embeddings': ('max_position_embeddings', 512),
    'type_vocab_size': ('type_vocab_size', 2),
    'initializer_range': ('initializer_range', 0.02),
    'layer_norm_eps': ('layer_norm_eps', 1e-12),
}


def bert_layout_config(hf: Mapping[str, Any], source: str, family: str, act_from_hf: Mapping,
                       **fields: Any) -> BertConfig:
  """Our config of a BERT-layout config.json (BERT, RoBERTa, ELECTRA): absent fields take
  transformers' defaults (as it would build the model), `fields` set what the family fixes.
  Refuses what these encoders do not compute: relative position embeddings, a causal
  (decoder) model, an activation outside `act_from_hf`."""
  act = hf.get('hidden_act', 'gelu')
  if act not in act_from_hf:
    raise CheckpointError(f'{source}: hidden_act {act!r} is not supported; expected one of '
                          f'{sorted(act_from_hf)}')
  if hf.get('position_embedding_type', 'absolute') != 'absolute':
    raise CheckpointError(f'{source}: position_embedding_type '
                          f'{hf["position_embedding_type"]!r}; only "absolute" is supported')
  if hf.get('is_decoder') or hf.get('add_cross_attention'):
    raise CheckpointError(f'{source}: is_decoder / add_cross_attention: a causal model is not '
                          'an encoder; only bidirectional checkpoints are supported')
  ours: dict[str, Any] = {'arch': family, 'hidden_act': act_from_hf[act]}
  for key, (field, default) in BERT_LAYOUT_FIELDS.items():
    if key in hf:
      ours[field] = hf[key]
    elif default is None:
      raise CheckpointError(f'{source}: missing field {key!r}')
    else:
      ours[field] = default
  ours.update(fields)
  return BertConfig(**ours)


# ----------------------------------------------------------------------------- the registry


@dataclasses.dataclass(frozen=True)
class Converter:
  """One family's HuggingFace side.

  `family`: our `model.arch`. `model_types`: config.json model_types read as this family.
  `class_prefix`: transformers' class names are `<prefix>ForMaskedLM`, `<prefix>Model`,
  `<prefix>For<Task>`. `encoder_prefix`: the encoder's state-dict prefix in task models.
  `pooler_prefix`: where our `pooler` group lives in a task model's state dict (None: never).
  `task_prefixes`: other tensors every task model keeps (ModernBERT's `head.`).
  `mlm_prefixes`: the MLM model's tensors outside the encoder (its heads), which a bare
  encoder (`<prefix>Model`) lacks.
  `config_to_hf(cfg, architecture)`, `config_from_hf(hf, source)`,
  `params_to_hf(params, cfg, prefix)` (the MLM model's tensors; prefix '' for a bare
  encoder), `params_from_hf(state, cfg, rng, source)`.
  `tokenizer_pad_id`: whether config.json's pad_token_id is the tokenizer's (RoBERTa numbers
  positions from it, so it stays the model's)."""

  family: str
  model_types: tuple[str, ...]
  class_prefix: str
  encoder_prefix: str
  config_to_hf: Callable[..., dict[str, Any]]
  config_from_hf: Callable[..., BertConfig]
  params_to_hf: Callable[..., dict]
  params_from_hf: Callable[..., dict]
  pooler_prefix: str | None = None
  task_prefixes: tuple[str, ...] = ()
  mlm_prefixes: tuple[str, ...] = ()
  tokenizer_pad_id: bool = True

  def architecture(self, suffix: str = 'ForMaskedLM') -> str:
    return self.class_prefix + suffix

  def task_tensors(self, state: Mapping[str, Any], keep_pooler: bool) -> dict[str, Any]:
    """What of an MLM model's state dict a task model has: the encoder, the tensors every
    task model keeps, and the pooler where the task has one."""
    def kept(key: str) -> bool:
      if self.pooler_prefix and key.startswith(self.pooler_prefix):
        return keep_pooler
      return key.startswith((self.encoder_prefix, *self.task_prefixes))
    return {k: v for k, v in state.items() if kept(k)}


_BY_FAMILY: dict[str, Converter] = {}
_BY_MODEL_TYPE: dict[str, Converter] = {}


def register(converter: Converter, *, replace: bool = False) -> Converter:
  """Adds `converter` for its family and model_types (again only with `replace=True`)."""
  taken = [t for t in (converter.family, *converter.model_types)
           if t in _BY_FAMILY or t in _BY_MODEL_TYPE]
  if taken and not replace:
    raise ValueError(f'a converter for {taken} is already registered')
  _BY_FAMILY[converter.family] = converter
  for model_type in converter.model_types:
    _BY_MODEL_TYPE[model_type] = converter
  return converter


def for_arch(arch: str) -> Converter:
  """The converter of our family `arch`; a CheckpointError when it has none."""
  try:
    return _BY_FAMILY[arch]
  except KeyError:
    raise CheckpointError(f'model.arch={arch!r} has no HuggingFace converter; registered: '
                          f'{sorted(_BY_FAMILY)}') from None


def for_model_type(hf: Mapping[str, Any], source: str) -> Converter:
  """The converter that reads a config.json of this `model_type`."""
  model_type = hf.get('model_type')
  if model_type in _BY_MODEL_TYPE:
    return _BY_MODEL_TYPE[model_type]
  arch = ', '.join(hf.get('architectures') or []) or 'unknown architecture'
  known = ', '.join(f'"{t}"' for t in sorted(_BY_MODEL_TYPE))
  raise CheckpointError(f'{source}: model_type is {model_type!r} ({arch}), not BERT nor any '
                        f'encoder family registered here; known model types: {known}')


def model_types() -> list[str]:
  return sorted(_BY_MODEL_TYPE)


def class_prefixes() -> set[str]:
  """Every registered family's transformers class prefix (`Bert`, `Roberta`, ...)."""
  return {c.class_prefix for c in _BY_FAMILY.values()}
