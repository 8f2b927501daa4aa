"""Fine-tuning tasks for the entry point: a config's data -> arrays, outputs -> scores.

Three steps, so the label list can be settled between reading and featurizing (a start point
that carries a classifier fixes the label order its rows were trained in):

  records = registry.read_task(config)             # input_pipeline/finetune/registry.py
  task = featurize(records, labels, tokenizer, config.data)
  task.score(split, outputs) / task.baseline(split) / task.write_predictions(split, ...)

Every task has one `train` array set and a list of `EvalSplit`s: the dev splits (the first
selects the best epoch; MNLI adds mismatched) and the test splits (scored when labelled, MR's,
CoNLL's and SQuAD's; otherwise only predicted, GLUE's leaderboard files). Arrays always carry
`label_weights`: the loop pads batches with zero-weight rows.

What a task does with its arrays and outputs is its kind's (bert_jax/finetune/kinds): scores
are dicts of floats with a `headline` (the number the BERT paper reports for the task, higher
is better), all on a 0-1 scale; baselines score what a model that ignores its input predicts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bert_jax.finetune import kinds
from bert_jax.model import heads
from input_pipeline.finetune import registry
from input_pipeline.finetune.registry import TaskRecords

# Scores an epoch line and results.md show beside a split's headline, where the split has
# them: SQuAD's EM beside its F1, SQuAD 2.0's best-threshold scores beside the threshold-0 ones.
DETAIL_SCORES = ('exact_match', 'exact', 'best_f1', 'best_exact')


@dataclasses.dataclass
class EvalSplit:
  name: str
  role: str
  arrays: dict[str, np.ndarray]
  labelled: bool
  records: list
  glue_name: str | None = None
  features: list | None = None  # per-row features a kind decodes with (SQuAD's windows)


# ----------------------------------------------------------------------------- labels


def reconcile_labels(records: TaskRecords, start_head: heads.Head | None, init: str,
                     fresh_head: bool) -> tuple[str, ...]:
  """The label order to train with: the task's, or a start point's own head's when that head
  is for this task and names the same labels (its rows are trained in that order).

  A head for this task with other labels (or another count) is an error unless fresh_head:
  reusing it would scramble the classes, silently replacing it may not be what was meant.
  """
  labels = records.labels
  kind = kinds.get(records.kind)
  if (fresh_head or start_head is None or start_head.task != kind.head_task
      or start_head.task in heads.FIXED_OUTPUTS):  # fixed outputs: no label list to reorder
    return labels
  want = len(labels) if kind.has_label_list else 1
  theirs = start_head.labels
  if theirs is not None and labels and set(theirs) == set(labels):
    return tuple(theirs)
  if theirs is None and start_head.num_labels == want:
    return labels  # HF's default LABEL_i names: nothing to check the order against
  described = (f'labels {list(theirs)}' if theirs else f'{start_head.num_labels} labels')
  ours = f'labels {list(labels)}' if labels else 'one regression output'
  raise ValueError(f'{init}: its {start_head.task} head was trained with {described}, but '
                   f'task {records.name} has {ours}; pass --config.fresh_head=True to train a '
                   'fresh head on its encoder')


# ----------------------------------------------------------------------------- features


@dataclasses.dataclass
class Task:
  """A featurized task: train arrays, eval splits, and how outputs are scored (its kind's)."""
  name: str
  kind: kinds.TaskKind
  labels: tuple[str, ...]
  train: dict[str, np.ndarray]
  evals: list[EvalSplit]
  head: heads.Head
  tokenizer: Any
  data_config: Any
  squad_v2: bool = False
  _baselines: dict = dataclasses.field(default_factory=dict, repr=False)

  @property
  def num_train(self) -> int:
    return len(self.train['input_ids'])

  @property
  def select_split(self) -> EvalSplit:
    return next(s for s in self.evals if s.role == 'dev')

  def headline_name(self, split: EvalSplit) -> str:
    """The metric `headline` stands for on `split`."""
    return self.kind.headline_name(self, split)

  def predictions(self, split: EvalSplit, outputs: dict[str, np.ndarray]):
    """Model outputs -> what the metric compares (class ids, floats, tags, answer texts)."""
    return self.kind.predictions(self, split, outputs)

  def score(self, split: EvalSplit, outputs: dict[str, np.ndarray]) -> dict[str, float]:
    return self.kind.score(self, split, outputs)

  def score_predictions(self, split: EvalSplit, predictions) -> dict[str, float]:
    return self.kind.score_predictions(self, split, predictions)

  def baseline(self, split: EvalSplit) -> dict[str, float]:
    """The score of a model that ignores its input, computed once per split."""
    if split.name not in self._baselines:
      self._baselines[split.name] = self.kind.baseline(self, split)
    return self._baselines[split.name]

  def write_predictions(self, split: EvalSplit, outputs: dict[str, np.ndarray],
                        directory: str) -> str:
    """An unlabelled test split's predictions under `directory` (GLUE's leaderboard files,
    else `predictions/<split>.tsv`)."""
    return self.kind.write_predictions(self, split, outputs, directory)


def detail_scores(scores: dict) -> tuple[str, ...]:
  """The DETAIL_SCORES that `scores` has, in order."""
  return tuple(k for k in DETAIL_SCORES if k in scores)


def format_details(scores: dict) -> str:
  """` exact=0.7000 best_f1=0.7400 (null threshold -1.2000) ...`: the detail scores for an
  epoch line (empty for tasks without any)."""
  out = ''
  for k in detail_scores(scores):
    value = scores[k]
    out += f' {k}={"n/a" if value is None else f"{value:.4f}"}'
    if f'{k}_thresh' in scores:
      out += f' (null threshold {scores[f"{k}_thresh"]:.4f})'
  return out


def featurize(records: TaskRecords, labels: tuple[str, ...], tokenizer, d,
              classifier_dropout: float | None = None) -> Task:
  """Arrays of every split with `tokenizer`, and the head the task trains."""
  kind = kinds.get(records.kind).configure(d)
  train, _ = kind.featurize(records.train, labels, tokenizer, d, training=True,
                            source=records.train_source)
  kind.check_train(train, d)
  evals = []
  for s in records.splits:
    arrays, features = kind.featurize(s.records, labels, tokenizer, d, training=False,
                                      source=s.source)
    evals.append(EvalSplit(s.name, s.role, arrays, s.labelled, s.records, s.glue_name, features))
  head = kind.make_head(labels, classifier_dropout)
  return Task(records.name, kind, labels, train, evals, head, tokenizer, d, records.squad_v2)


def head_without_data(config, num_labels: int | None = None) -> tuple[kinds.TaskKind, heads.Head]:
  """(kind, head) that a task's config implies before any data is read, for compiling its
  step ahead of time: the registry's label list (GLUE's, CoNLL-2003's), two labels where the
  data decides; `num_labels` to override."""
  spec = registry.get(config.task)
  kind = kinds.get(spec.kind_for(config.data)).configure(config.data)
  labels = spec.labels if spec.labels is not None else ('0', '1')
  if num_labels and kind.has_label_list:
    labels = tuple(str(i) for i in range(num_labels))
  return kind, kind.make_head(tuple(labels), config.model.classifier_dropout)
