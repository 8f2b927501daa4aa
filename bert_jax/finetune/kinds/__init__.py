"""The registry of fine-tuning task kinds: name -> `TaskKind` (kinds/base.py says what one
owns). A new kind is a `TaskKind` subclass and one `register(MyKind())`, from any module: the
run, the step, AOT and the configs find it here."""

from __future__ import annotations

from bert_jax.finetune.kinds.base import MODEL_INPUTS, ArraySpec, BatchSchema, TaskKind
from bert_jax.finetune.kinds.classification import Classification, Regression
from bert_jax.finetune.kinds.multiple_choice import MultipleChoice
from bert_jax.finetune.kinds.sentence_embedding import SentenceEmbedding
from bert_jax.finetune.kinds.span import Span
from bert_jax.finetune.kinds.tagging import Tagging

KINDS: dict[str, TaskKind] = {}


def register(kind: TaskKind) -> TaskKind:
  """Add `kind` under `kind.name` (a name taken by another class is an error)."""
  if not kind.name:
    raise ValueError(f'{type(kind).__name__}: a task kind needs a name')
  known = KINDS.get(kind.name)
  if known is not None and type(known) is not type(kind):
    raise ValueError(f'task kind {kind.name!r} is already {type(known).__name__}')
  KINDS[kind.name] = kind
  return kind


def get(name: str) -> TaskKind:
  if name not in KINDS:
    raise ValueError(f'task kind {name!r}: unknown; known kinds are {sorted(KINDS)}')
  return KINDS[name]


for _kind in (Classification(), Regression(), Tagging(), Span(), MultipleChoice(),
              SentenceEmbedding()):
  register(_kind)

__all__ = ['MODEL_INPUTS', 'ArraySpec', 'BatchSchema', 'KINDS', 'TaskKind', 'get', 'register']
