"""Encoder families as objects: what BERT, RoBERTa, XLM-R, ELECTRA and ModernBERT differ in,
declared once per family instead of branched on by name across the model code.

A family is one `Family`: the config fields its checkpoints set unless told otherwise (block
switches, position offset, token types, norm eps), and its head quirks (a pooler with a
sentence head, RoBERTa's classification head, ModernBERT's heads on the MLM transform,
ELECTRA's fixed GELU and embedding projection). `BertConfig.arch` names the family and
`BertConfig.family` returns it; the model, the heads, FLOP counting and the objectives read its
fields. Its HuggingFace side (config.json fields, state-dict names, export classes) is the
converter registered under the same name in `bert_jax.convert.hf_base`; its tokenizer
conventions (pair template, word-start prefix, special ids) are read from the tokenizer files a
checkpoint ships (`input_pipeline.hf_tokenizer`), never assumed from the family.

A new family is a `register(Family(...))` (and a converter) from any module, as
tests/test_families.py does from a test file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

# How a family's task heads read the encoder (bert_jax/model/heads.py):
POOLER = 'pooler'  # BERT: the tanh pooler over [CLS] (trained by NSP), then the classifier
# RoBERTa, ELECTRA: sequences through their own dense + activation (`ClassificationHead`); the
# pooler exists only for multiple choice (fresh from an MLM checkpoint)
CLASSIFICATION_HEAD = 'classification_head'
# ModernBERT: every head reads the MLM head's transform (`head`), under `classifier`
PREDICTION_HEAD = 'prediction_head'
HEAD_STYLES = (POOLER, CLASSIFICATION_HEAD, PREDICTION_HEAD)


@dataclasses.dataclass(frozen=True)
class Family:
  """One encoder family's model-side facts.

  `defaults` are BertConfig fields the family's checkpoints have unless a config says
  otherwise. `sentence_head`: pre-training has the pooler and the 2-way NSP/SOP head.
  `pretrained_with` says what its released checkpoints were trained on (for refusals).
  `head_activation`: the activation the MLM head and the pooler / classification head use
  whatever `hidden_act` says (ELECTRA's exact GELU), None for hidden_act and tanh.
  `embedding_projection`: embeddings narrower than the hidden width are projected up.
  `scaled_output_init`: layer output projections start at range / sqrt(2 L) (ModernBERT)."""

  name: str
  defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  sentence_head: bool = False
  pretrained_with: str = 'MLM'
  head_style: str = POOLER
  head_activation: str | None = None
  embedding_projection: bool = False
  scaled_output_init: bool = False

  def __post_init__(self):
    if self.head_style not in HEAD_STYLES:
      raise ValueError(f'Family({self.name!r}).head_style={self.head_style!r}: expected one of '
                       f'{HEAD_STYLES}')
    object.__setattr__(self, 'defaults', MappingProxyType(dict(self.defaults)))

  @property
  def own_sequence_head(self) -> bool:
    """Sequences are classified by the family's own dense head, not a pretrained pooler."""
    return self.head_style == CLASSIFICATION_HEAD

  @property
  def heads_on_prediction_head(self) -> bool:
    return self.head_style == PREDICTION_HEAD


_REGISTRY: dict[str, Family] = {}


def register(family: Family, *, replace: bool = False) -> Family:
  """Adds `family` under its name (a second one of the same name needs `replace=True`)."""
  if family.name in _REGISTRY and not replace:
    raise ValueError(f'encoder family {family.name!r} is already registered')
  _REGISTRY[family.name] = family
  return family


def get(name: str) -> Family:
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(f'model.arch={name!r}: expected one of {names()}') from None


def names() -> list[str]:
  return sorted(_REGISTRY)


# ----------------------------------------------------------------------------- built-ins

# HF's BertForPreTraining (modeling_bert.py): BertConfig's own defaults, post-norm, learned
# positions, two token types, the tanh pooler and the NSP head.
BERT = register(Family('bert', sentence_head=True, pretrained_with='MLM and NSP'))

# RoBERTa / XLM-R (roberta-base's config.json, modeling_roberta.py): BERT's block, position ids
# offset past fairseq's padding index, one token type, eps 1e-5; no pooler or sentence head (MLM
# on full sentences), RobertaClassificationHead for sequences.
_ROBERTA_DEFAULTS = dict(position_offset=2, type_vocab_size=1, layer_norm_eps=1e-5,
                         max_position_embeddings=514)
ROBERTA = register(Family('roberta', _ROBERTA_DEFAULTS, pretrained_with='MLM on full sentences',
                          head_style=CLASSIFICATION_HEAD))
XLM_ROBERTA = register(Family('xlm-roberta', _ROBERTA_DEFAULTS,
                              pretrained_with='MLM on full sentences',
                              head_style=CLASSIFICATION_HEAD))

# ELECTRA (ElectraConfig, modeling_electra.py): BERT's block and positions on embeddings
# `embedding_size` wide (electra-small's 128 under 256 hidden), the generator's MLM head with
# exact GELU, ElectraClassificationHead for sequences, ElectraSequenceSummary (dense + GELU,
# our pooler) for multiple choice; no sentence head.
ELECTRA = register(Family('electra', pretrained_with='replaced-token detection',
                          head_style=CLASSIFICATION_HEAD, head_activation='gelu',
                          embedding_projection=True))

# ModernBERT (transformers' ModernBertConfig defaults, modeling_modernbert.py): pre-norm, no
# biases, GeGLU, RoPE with 160k / 10k thetas, global attention every third layer and a
# 128-token window elsewhere, eps 1e-5, no dropout, no token types, 8,192 positions; its heads
# read the MLM head's transform; no pooler or sentence head.
MODERN = register(Family(
    'modern',
    dict(norm_position='pre', use_bias=False, mlp='glu', positions='rope',
         global_attention_every=3, local_window=128, global_rope_theta=160_000.0,
         local_rope_theta=10_000.0, layer_norm_eps=1e-5, type_vocab_size=0,
         max_position_embeddings=8192, hidden_dropout=0.0, attention_dropout=0.0),
    pretrained_with='MLM at 30% without a sentence objective', head_style=PREDICTION_HEAD,
    scaled_output_init=True))
