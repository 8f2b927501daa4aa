"""Fine-tuning heads on the pre-trained encoder: sequence classification (and regression),
token classification, span extraction and multiple choice, numerically HuggingFace's
`BertForSequenceClassification`, `BertForTokenClassification`, `BertForQuestionAnswering` and
`BertForMultipleChoice` on the same weights. What differs by family is declared in
bert_jax/model/families.py (`head_style`, `head_activation`) and read here. ModernBERT's heads
(`PREDICTION_HEAD`) are transformers'
`ModernBertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice}`
(models/modernbert/modeling_modernbert.py): no pooler, the MLM head's transform (`head`,
our `mlm_transform` + `mlm_layer_norm`, carried over from pre-training as HF carries it) on
the [CLS] state (or the mean, `classifier_pooling='mean'`) or on every token, dropout, then
the classifier; multiple choice pools each choice's first unpadded token. RoBERTa's and XLM-R's
(`CLASSIFICATION_HEAD`) are transformers' `RobertaFor*`: token, span and multiple-choice heads as
BERT's, but the sequence head is `RobertaClassificationHead` (`ClassificationHead`: its own
dense + tanh between two dropouts on the <s> state, then `out_proj`), since RoBERTa has no
NSP-trained pooler to reuse; multiple choice keeps HF's pooler, fresh from an MLM checkpoint.
ELECTRA's (`CLASSIFICATION_HEAD`, `head_activation='gelu'`) are transformers' `ElectraFor*`
(models/electra/modeling_electra.py): token and span heads as BERT's, the sequence head `ElectraClassificationHead` (RoBERTa's, with exact GELU
for tanh), and multiple choice `ElectraSequenceSummary` (dense + GELU on the first token, our
`pooler` group, HF's `sequence_summary.summary`; fresh from a pre-training checkpoint) then
dropout and the classifier.

The encoder is model.py's own `Embeddings`, `Encoder` and pooler, under the same parameter
names as `BertForPreTraining` (`embeddings`, `encoder`, `pooler`), so a pre-trained tree is a
head model's tree minus the head: `with_encoder` moves one into the other. Everything else
follows model.py too: scanned or unrolled layers, packed rows, bfloat16 compute with float32
logits, and logical axis names on every parameter for `bert_jax.training.sharding`.

Like HF, the token and span models have no pooler (HF builds them with
`add_pooling_layer=False`), so an exported directory loads with no unexpected keys.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from bert_jax.model import encoder as enc
from bert_jax.model.encoder import BertConfig, gather_positions

SEQUENCE = 'sequence_classification'
TOKEN = 'token_classification'
SPAN = 'question_answering'
MULTIPLE_CHOICE = 'multiple_choice'
EMBEDDING = 'sentence_embedding'
TASKS = (SEQUENCE, TOKEN, SPAN, MULTIPLE_CHOICE, EMBEDDING)
# How a sentence embedding pools the token states (sentence-transformers' Pooling modes).
POOLING_MODES = ('mean', 'cls')
# HF problem types of BertForSequenceClassification; its loss is chosen by this field.
PROBLEM_TYPES = ('regression', 'single_label_classification', 'multi_label_classification')
# Parameter group of each task's head (also its name in HF's state dict).
HEAD_PARAM = {SEQUENCE: 'classifier', TOKEN: 'classifier', SPAN: 'qa_outputs',
              MULTIPLE_CHOICE: 'classifier'}
# Logical axis of each head's input: the pooler's output (`mlp`, like the NSP head) or tokens.
HEAD_IN_AXIS = {SEQUENCE: 'mlp', TOKEN: 'embed', SPAN: 'embed', MULTIPLE_CHOICE: 'mlp'}
# Heads whose output width is fixed by the task: (start, end) and one score per choice.
FIXED_OUTPUTS = {SPAN: (2, '(start, end)'), MULTIPLE_CHOICE: (1, '(one score per choice)'),
                 EMBEDDING: (1, '(one pooled embedding per text, no classifier)')}
ENCODER_GROUPS = ('embeddings', 'encoder', 'pooler')
# ModernBERT's task heads all start from the MLM head's transform.
MODERN_ENCODER_GROUPS = ('embeddings', 'encoder', 'mlm_transform', 'mlm_layer_norm')


@dataclasses.dataclass(frozen=True)
class Head:
  """What sits on the encoder: the task, its labels and HF's `problem_type`.

  `num_labels=1` on a sequence task is regression (HF's rule); unset, it is 2. Span extraction
  always has two outputs (start, end) and multiple choice one (a score per choice, HF's
  `Linear(hidden, 1)`; the number of choices is the data's). `classifier_dropout=None` means
  the encoder's hidden dropout, as HF.
  """

  task: str
  num_labels: int | None = None
  labels: tuple[str, ...] | None = None
  problem_type: str | None = None
  classifier_dropout: float | None = None
  pooling: str = 'mean'  # sentence_embedding only: POOLING_MODES

  def __post_init__(self):
    if self.labels is not None:  # a list from JSON would make the (static) head unhashable
      object.__setattr__(self, 'labels', tuple(self.labels))
    if self.task not in TASKS:
      raise ValueError(f'Head.task={self.task!r}: expected one of {TASKS}')
    fixed, why = FIXED_OUTPUTS.get(self.task, (None, ''))
    if self.num_labels is None:
      object.__setattr__(self, 'num_labels', fixed or 2)
    if fixed is not None and self.num_labels != fixed:
      raise ValueError(f'Head(task={self.task!r}) has num_labels={fixed} {why}, got '
                       f'{self.num_labels}; leave num_labels unset')
    if self.task == MULTIPLE_CHOICE and self.labels is not None:
      raise ValueError(f'Head(task={MULTIPLE_CHOICE!r}) scores each choice and has no label '
                       'names; leave labels unset')
    if self.pooling not in POOLING_MODES:
      raise ValueError(f'Head.pooling={self.pooling!r}: expected one of {POOLING_MODES}')
    if self.num_labels < 1:
      raise ValueError(f'Head.num_labels={self.num_labels}: needs at least 1')
    if self.labels is not None and len(self.labels) != self.num_labels:
      raise ValueError(f'Head.labels has {len(self.labels)} names for num_labels='
                       f'{self.num_labels}; give one name per label')
    if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
      raise ValueError(f'Head.problem_type={self.problem_type!r}: expected one of '
                       f'{PROBLEM_TYPES} or None')
    if self.problem_type is not None and self.task != SEQUENCE:
      raise ValueError(f'Head.problem_type is for {SEQUENCE!r} only, not {self.task!r}')

  @property
  def resolved_problem_type(self) -> str | None:
    """HF's choice when unset: regression for one label, else single-label classification."""
    if self.task != SEQUENCE:
      return None
    if self.problem_type:
      return self.problem_type
    return 'regression' if self.num_labels == 1 else 'single_label_classification'

  @property
  def label_names(self) -> tuple[str, ...]:
    """id -> name; HF's `LABEL_i` when none were given."""
    return self.labels or tuple(f'LABEL_{i}' for i in range(self.num_labels))

  @property
  def has_pooler(self) -> bool:
    return self.task in (SEQUENCE, MULTIPLE_CHOICE)


@struct.dataclass
class SpanLogits:
  start_logits: jax.Array  # [B, S] float32
  end_logits: jax.Array  # [B, S] float32


def _head_dense(cfg: BertConfig, features: int, in_axis: str, name: str) -> nn.Dense:
  """HF initialises BERT's task heads with N(0, initializer_range) (not truncated), and
  ModernBERT's with a truncated normal of std hidden**-0.5 ("final_out"); zero bias, which
  every task head has (HF's `nn.Linear` default) whatever `use_bias` says of the encoder."""
  init = (nn.initializers.truncated_normal(cfg.hidden_size ** -0.5)
          if cfg.family.heads_on_prediction_head
          else nn.initializers.normal(cfg.initializer_range))
  return nn.Dense(
      features, dtype=cfg.compute_dtype, name=name,
      kernel_init=nn.with_logical_partitioning(init, (in_axis, None)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)))


def encoder_groups(cfg: BertConfig, head: 'Head') -> tuple[str, ...]:
  """The parameter groups a head model takes from a pre-trained tree (an embedding model: the
  encoder alone, as HF's `BertModel` / `ModernBertModel` without a pooler)."""
  if head.task == EMBEDDING:
    return ENCODER_GROUPS[:2]
  if cfg.family.heads_on_prediction_head:
    return MODERN_ENCODER_GROUPS
  if cfg.family.own_sequence_head:  # the sequence head has its own dense (`ClassificationHead`)
    return ENCODER_GROUPS if head.task == MULTIPLE_CHOICE else ENCODER_GROUPS[:2]
  return ENCODER_GROUPS if head.has_pooler else ENCODER_GROUPS[:2]


def encode(cfg: BertConfig, input_ids, input_mask=None, segment_ids=None, *, position_ids=None,
           packed_segment_ids=None, next_sentence_positions=None, add_pooler: bool = True,
           deterministic: bool = True):
  """(sequence_output [B, S, H], pooled [B, H] / [B, K, H] or None): the encoder and its
  pooler, as submodules of the calling module.

  Called inside a compact `__call__`, so the parameters land at the caller's top level under
  encoder.py's names (`embeddings`, `encoder`, `pooler` or ModernBERT's `mlm_transform` and
  `mlm_layer_norm`): pre-trained trees apply unchanged. ModernBERT's pooled output is its
  head's transform of the [CLS] state, or of the masked mean (`classifier_pooling='mean'`).
  """
  sequence_output, _ = enc.encode(cfg, input_ids, input_mask, segment_ids,
                                  position_ids=position_ids,
                                  packed_segment_ids=packed_segment_ids,
                                  deterministic=deterministic)
  if not add_pooler:
    return sequence_output, None
  on_prediction_head = cfg.family.heads_on_prediction_head
  if on_prediction_head and cfg.classifier_pooling == 'mean':
    if next_sentence_positions is not None:
      raise ValueError('model.classifier_pooling=mean pools whole rows: use unpacked rows '
                       '(data.pack=False) or classifier_pooling=cls')
    mask = (jnp.ones(input_ids.shape, jnp.float32) if input_mask is None
            else input_mask.astype(jnp.float32))
    pooled = (jnp.einsum('bsh,bs->bh', sequence_output.astype(jnp.float32), mask) /
              jnp.sum(mask, axis=1, keepdims=True)).astype(sequence_output.dtype)
  elif next_sentence_positions is None:
    pooled = sequence_output[:, 0]
  else:
    pooled = gather_positions(sequence_output, next_sentence_positions)
  if on_prediction_head:
    return sequence_output, enc.prediction_head(cfg, pooled)
  return sequence_output, enc.bert_pooler(cfg, pooled)


def token_states(cfg: BertConfig, sequence_output):
  """What token-level heads read: the encoder's states, through ModernBERT's head."""
  return (enc.prediction_head(cfg, sequence_output) if cfg.family.heads_on_prediction_head
          else sequence_output)


class BertEncoder(nn.Module):
  """`BertForPreTraining` without its MLM and NSP heads (HF's `BertModel`): features for
  any other use, from the same params."""

  cfg: BertConfig
  add_pooler: bool = True

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, deterministic=True,
               **packed):
    return encode(self.cfg, input_ids, input_mask, segment_ids, add_pooler=self.add_pooler,
                  deterministic=deterministic, **packed)


class ClassificationHead(nn.Module):
  """RoBERTa's sequence head (`RobertaClassificationHead`): dropout, dense, tanh, dropout,
  `out_proj`, on the <s> state. At inference it is BERT's pooler + classifier; in training
  the first dropout differs, so it is its own module under HF's names. ELECTRA's
  (`ElectraClassificationHead`) is the same with exact GELU for tanh."""

  cfg: BertConfig
  head: Head

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.cfg
    drop = nn.Dropout(_dropout(cfg, self.head))
    x = drop(x, deterministic=deterministic)
    x = enc.pooler_activation(cfg)(_head_dense(cfg, cfg.hidden_size, 'embed', 'dense')(x))
    x = drop(x, deterministic=deterministic)
    return _head_dense(cfg, self.head.num_labels, HEAD_IN_AXIS[SEQUENCE], 'out_proj')(x)


class BertForSequenceClassification(nn.Module):
  """Dropout + dense on the pooled [CLS]: logits [B, num_labels] float32 ([B, 1] regression);
  RoBERTa's and ELECTRA's `ClassificationHead` on the first token's state.

  Packed rows (`next_sentence_positions` [B, K]) give [B, K, num_labels], one per instance.
  """

  cfg: BertConfig
  head: Head

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, position_ids=None,
               packed_segment_ids=None, next_sentence_positions=None,
               deterministic: bool = True) -> jax.Array:
    cfg = self.cfg
    sequence_output, pooled = encode(
        cfg, input_ids, input_mask, segment_ids, position_ids=position_ids,
        packed_segment_ids=packed_segment_ids, next_sentence_positions=next_sentence_positions,
        add_pooler=not cfg.family.own_sequence_head, deterministic=deterministic)
    if cfg.family.own_sequence_head:
      first = (sequence_output[:, 0] if next_sentence_positions is None
               else gather_positions(sequence_output, next_sentence_positions))
      logits = ClassificationHead(cfg, self.head, name='classifier')(first, deterministic)
      return logits.astype(jnp.float32)
    pooled = nn.Dropout(_dropout(cfg, self.head))(pooled, deterministic=deterministic)
    logits = _head_dense(cfg, self.head.num_labels, HEAD_IN_AXIS[SEQUENCE], 'classifier')(pooled)
    return logits.astype(jnp.float32)


class BertForTokenClassification(nn.Module):
  """Dropout + dense on every token: logits [B, S, num_labels] float32."""

  cfg: BertConfig
  head: Head

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, position_ids=None,
               packed_segment_ids=None, deterministic: bool = True) -> jax.Array:
    cfg = self.cfg
    sequence_output, _ = encode(
        cfg, input_ids, input_mask, segment_ids, position_ids=position_ids,
        packed_segment_ids=packed_segment_ids, add_pooler=False, deterministic=deterministic)
    x = nn.Dropout(_dropout(cfg, self.head))(token_states(cfg, sequence_output),
                                              deterministic=deterministic)
    logits = _head_dense(cfg, self.head.num_labels, HEAD_IN_AXIS[TOKEN], 'classifier')(x)
    return logits.astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
  """A dense to 2 on every token, split into start and end logits [B, S] (no dropout in BERT,
  as HF; ModernBERT's head, dropout and `classifier`)."""

  cfg: BertConfig
  head: Head = Head(SPAN)

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, position_ids=None,
               packed_segment_ids=None, deterministic: bool = True) -> SpanLogits:
    cfg = self.cfg
    sequence_output, _ = encode(
        cfg, input_ids, input_mask, segment_ids, position_ids=position_ids,
        packed_segment_ids=packed_segment_ids, add_pooler=False, deterministic=deterministic)
    x = sequence_output
    if cfg.family.heads_on_prediction_head:
      x = nn.Dropout(_dropout(cfg, self.head))(token_states(cfg, x), deterministic=deterministic)
    logits = _head_dense(cfg, 2, HEAD_IN_AXIS[SPAN], head_param(cfg, SPAN))(x).astype(jnp.float32)
    return SpanLogits(start_logits=logits[..., 0], end_logits=logits[..., 1])


class BertForMultipleChoice(nn.Module):
  """Choices [B, C, S] -> scores [B, C] float32, as HF's `BertForMultipleChoice`: every choice
  is its own row of the encoder ([B * C, S]), dropout + dense to 1 on its pooled [CLS], and
  the scores reshaped to [B, C] (softmax over choices is the loss's)."""

  cfg: BertConfig
  head: Head = Head(MULTIPLE_CHOICE)

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, position_ids=None,
               deterministic: bool = True) -> jax.Array:
    cfg = self.cfg
    batch, choices, length = input_ids.shape
    rows = lambda x: None if x is None else jnp.reshape(x, (batch * choices, length))
    first = None
    if (cfg.family.heads_on_prediction_head and input_mask is not None
        and cfg.classifier_pooling == 'cls'):
      # HF: "for left or right padding, <cls> is the first non-pad token"
      first = jnp.argmax(rows(input_mask), axis=-1)[:, None]
    _, pooled = encode(cfg, rows(input_ids), rows(input_mask), rows(segment_ids),
                       position_ids=rows(position_ids), next_sentence_positions=first,
                       deterministic=deterministic)
    if first is not None:
      pooled = pooled[:, 0]
    pooled = nn.Dropout(_dropout(cfg, self.head))(pooled, deterministic=deterministic)
    scores = _head_dense(cfg, 1, HEAD_IN_AXIS[MULTIPLE_CHOICE], 'classifier')(pooled)
    return scores.astype(jnp.float32).reshape(batch, choices)


def pool(sequence_output: jax.Array, input_mask: jax.Array | None, mode: str = 'mean'
         ) -> jax.Array:
  """Sentence embeddings [B, H] float32 of the encoder's states [B, S, H], as
  sentence-transformers' `Pooling` computes them: `mean` sums the real tokens' states
  (input_mask 1) in float32 and divides by their count clamped at 1e-9 (an all-padding row
  gives zeros, not NaN); `cls` takes position 0 (the first unpadded token of right-padded
  rows)."""
  if mode not in POOLING_MODES:
    raise ValueError(f'pooling={mode!r}: expected one of {POOLING_MODES}')
  states = sequence_output.astype(jnp.float32)
  if mode == 'cls':
    return states[:, 0]
  mask = (jnp.ones(states.shape[:2], jnp.float32) if input_mask is None
          else input_mask.astype(jnp.float32))
  total = jnp.einsum('bsh,bs->bh', states, mask, precision=jax.lax.Precision.HIGHEST)
  return total / jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1e-9)


class BertForSentenceEmbedding(nn.Module):
  """Texts [..., S] -> embeddings [..., H] float32: every text its own encoder row, its token
  states pooled (`head.pooling`), no pooler and no classifier, as a sentence-transformers
  model (Transformer + Pooling) embeds it. A bi-encoder batch is [B, texts, S]: a query, its
  positive and any hard negatives per row."""

  cfg: BertConfig
  head: Head = Head(EMBEDDING)

  @nn.compact
  def __call__(self, input_ids, input_mask=None, segment_ids=None, *, position_ids=None,
               deterministic: bool = True) -> jax.Array:
    lead, length = input_ids.shape[:-1], input_ids.shape[-1]
    rows = lambda x: None if x is None else jnp.reshape(x, (-1, length))
    sequence_output, _ = encode(self.cfg, rows(input_ids), rows(input_mask), rows(segment_ids),
                                position_ids=rows(position_ids), add_pooler=False,
                                deterministic=deterministic)
    embeddings = pool(sequence_output, rows(input_mask), self.head.pooling)
    return embeddings.reshape(lead + embeddings.shape[-1:])


MODELS = {SEQUENCE: BertForSequenceClassification, TOKEN: BertForTokenClassification,
          SPAN: BertForQuestionAnswering, MULTIPLE_CHOICE: BertForMultipleChoice,
          EMBEDDING: BertForSentenceEmbedding}


def _dropout(cfg: BertConfig, head: Head) -> float:
  return cfg.hidden_dropout if head.classifier_dropout is None else head.classifier_dropout


def build_model(cfg: BertConfig, head: Head) -> nn.Module:
  """The Flax module for `head.task`; call `.apply({'params': p}, input_ids, ...)`."""
  return MODELS[head.task](cfg, head)


def _dummy_init(cfg: BertConfig, head: Head, rng: jax.Array, seq_len: int):
  shape = (1, 1, seq_len) if head.task == MULTIPLE_CHOICE else (1, seq_len)
  ids = jnp.zeros(shape, jnp.int32)
  return build_model(cfg, head).init(rng, ids)


@functools.partial(jax.jit, static_argnames=('cfg', 'head', 'seq_len'))
def init_params(cfg: BertConfig, head: Head, rng: jax.Array, seq_len: int = 8) -> dict:
  """Unboxed float32 parameters of the whole head model (encoder random too); jitted as
  encoder.init_params is."""
  return nn.unbox(_dummy_init(cfg, head, rng, seq_len)['params'])


def logical_param_specs(cfg: BertConfig, head: Head, seq_len: int = 8):
  """Logical PartitionSpec of every parameter (for `sharding.logical_to_sharding`)."""
  abstract = jax.eval_shape(lambda: _dummy_init(cfg, head, jax.random.key(0), seq_len))
  return nn.get_partition_spec(abstract['params'])


def head_param(cfg: BertConfig, task: str) -> str:
  """The head's parameter group: BERT's names by task, ModernBERT's `classifier` always."""
  return 'classifier' if cfg.family.heads_on_prediction_head else HEAD_PARAM[task]


def init_head(cfg: BertConfig, head: Head, rng: jax.Array) -> dict:
  """Fresh parameters of the head alone ({'classifier': ...} or {'qa_outputs': ...})."""
  name = head_param(cfg, head.task)
  if cfg.family.own_sequence_head and head.task == SEQUENCE:
    module = ClassificationHead(cfg, head)
  else:
    module = _head_dense(cfg, head.num_labels, HEAD_IN_AXIS[head.task], name)
  variables = module.init(rng, jnp.zeros((1, cfg.hidden_size), cfg.compute_dtype))
  return {name: jax.tree_util.tree_map(np.asarray, nn.unbox(variables['params']))}


def _fresh_pooler(cfg: BertConfig, rng: jax.Array) -> dict:
  """A pooler as HF initialises RobertaForMultipleChoice's (an MLM checkpoint has none), or
  ElectraForMultipleChoice's `sequence_summary.summary`."""
  dense = _head_dense(cfg, cfg.hidden_size, 'embed', 'pooler')
  variables = dense.init(rng, jnp.zeros((1, cfg.hidden_size), cfg.compute_dtype))
  return jax.tree_util.tree_map(np.asarray, nn.unbox(variables['params']))


def with_encoder(encoder_params, cfg: BertConfig, head: Head, rng: jax.Array | None = None,
                 head_params: dict | None = None, source: str = 'the start point') -> dict:
  """A head model's params: the encoder (and pooler if the task has one) from a pre-trained
  tree (`BertForPreTraining` layout, extra groups ignored) plus `head_params` or, when none,
  a freshly initialised head with a warning saying so."""
  groups = encoder_groups(cfg, head)
  missing = [g for g in groups if g not in encoder_params]
  if cfg.family.own_sequence_head and missing == ['pooler']:
    logging.warning('%s has no pooler (%s pre-training checkpoints have none): initialised '
                    'fresh for %s, as HF does', source, cfg.arch, head.task)
    encoder_params = {**encoder_params, 'pooler': _fresh_pooler(
        cfg, jax.random.fold_in(rng if rng is not None else jax.random.key(0), 1))}
    missing = []
  if missing:
    raise ValueError(f'{source}: parameters lack {missing}; expected a BertForPreTraining '
                     f'tree ({", ".join(groups)})')
  params = {g: encoder_params[g] for g in groups}
  if head.task == EMBEDDING:  # no head parameters: the pooled encoder is the model
    return params
  if head_params is None:
    name = head_param(cfg, head.task)
    init = (f'truncated N(0, {cfg.hidden_size ** -0.5:.3g})'
            if cfg.family.heads_on_prediction_head
            else f'N(0, {cfg.initializer_range:g})')
    logging.warning('%s has no %s head for %s with %d labels: initialised fresh '
                    '(%s, zero bias); fine-tune before predicting.', source, name,
                    head.task, head.num_labels, init)
    head_params = init_head(cfg, head, rng if rng is not None else jax.random.key(0))
  params.update(head_params)
  return params
