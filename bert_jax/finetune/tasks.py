"""Fine-tuning tasks for the entry point: a config's data -> arrays, outputs -> scores.

Three steps, so the label list can be settled between reading and featurizing (a start point
that carries a classifier fixes the label order its rows were trained in):

  records = read_task(config)                      # readers of input_pipeline, per task
  task = featurize(records, labels, tokenizer, config.data)
  task.score(split, outputs) / task.baseline(split) / task.write_predictions(split, ...)

Every task has one `train` array set and a list of `EvalSplit`s: the dev splits (the first
selects the best epoch; MNLI adds mismatched) and the test splits (scored when labelled, MR's,
CoNLL's and SQuAD's; otherwise only predicted, GLUE's leaderboard files). Arrays always carry
`label_weights` ([N] or [N, S] for tagging): the loop pads batches with zero-weight rows.

Scores are dicts of floats with a `headline` (the number the BERT paper reports for the task,
higher is better), all on a 0-1 scale (SQuAD's EM and F1 too, which its official scripts
give in percent; SQuAD 2.0 adds best_exact / best_f1 and their null thresholds). Baselines
score what a model that ignores its input predicts: the training set's majority class
(majority tag for tagging), its mean target for regression (correlations then undefined:
NaN), and "no answer" for SQuAD; for multiple choice (SWAG),
chance: 1 / num_choices. Tagging with entity tags (B-/I-/E-/S-, `conll.is_bio`) has entity
F1 as headline and token accuracy beside it; bare tag sets (POS: NN, VBZ) have token accuracy
(words' first sub-token) alone.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
from typing import Any

import numpy as np

from bert_jax.finetune import metrics, squad_answers
from bert_jax.model import heads
from input_pipeline import fs
from input_pipeline.tasks import conll, features as features_lib, glue, mr, records as tasks, squad
from input_pipeline.tasks import swag

CLASSIFICATION, REGRESSION, TAGGING, SPAN = 'classification', 'regression', 'tagging', 'span'
MULTIPLE_CHOICE = 'multiple_choice'
GLUE_TASK_NAMES = {'cola': 'CoLA', 'sst2': 'SST-2', 'mrpc': 'MRPC', 'qqp': 'QQP',
                   'stsb': 'STS-B', 'mnli': 'MNLI', 'qnli': 'QNLI', 'rte': 'RTE', 'wnli': 'WNLI'}
# Arrays the model and the loss read; everything else stays on the host.
DEVICE_ARRAYS = ('input_ids', 'input_mask', 'segment_ids', 'labels', 'label_weights',
                 'start_positions', 'end_positions')


@dataclasses.dataclass
class SplitRecords:
  """One evaluation split as read: its records and how it is scored."""
  name: str  # dev, dev_mismatched, test, test_matched, ...
  role: str  # dev | test
  records: list
  labelled: bool
  glue_name: str | None = None  # GLUE metrics / submission name (MNLI-m, AX, ...)
  source: str = ''  # the file it was read from, named in featurizing's messages (SQuAD)


@dataclasses.dataclass
class TaskRecords:
  name: str
  kind: str
  train: list
  splits: list[SplitRecords]
  labels: tuple[str, ...]  # () for regression and span extraction
  squad_v2: bool = False
  train_source: str = ''  # the training file, named in featurizing's messages (SQuAD)


@dataclasses.dataclass
class EvalSplit:
  name: str
  role: str
  arrays: dict[str, np.ndarray]
  labelled: bool
  records: list
  glue_name: str | None = None
  squad_features: list | None = None


# ----------------------------------------------------------------------------- reading


def read_task(config) -> TaskRecords:
  """The task's records per split, read by input_pipeline's strict readers; the first
  `data.max_train_examples` training records when that is set."""
  name, d = config.task, config.data
  if name in GLUE_TASK_NAMES:
    records = _read_glue(name, d)
  elif name in ('mr', 'mr_regression'):
    records = _read_mr(name, d)
  elif name == 'conll':
    records = _read_conll(d)
  elif name in ('squad', 'squad_v2'):
    records = _read_squad(name, d)
  elif name == 'generic':
    records = _read_generic(d)
  elif name == 'swag':
    records = _read_swag(d)
  else:
    raise ValueError(f'config.task={name!r}: unknown; use a task of configs/finetune.py')
  return limit_train(records, d.max_train_examples)


def limit_train(records: TaskRecords, limit: int) -> TaskRecords:
  """Train on the first `limit` records in reading order (0: all), to try a task on part of
  its file. The label list stays the whole file's, so the head (and an export) has the same
  classes whatever the limit."""
  if limit < 0:
    raise ValueError(f'data.max_train_examples={limit}: expected 0 (all) or a positive count')
  if limit:
    if limit > len(records.train):
      logging.info('data.max_train_examples=%d: the training set has only %d records; using '
                   'all', limit, len(records.train))
    records.train = records.train[:limit]
  return records


def required(d, field: str) -> str:
  value = d[field]
  if not value:
    raise ValueError(f'data.{field} is empty: set --config.data.{field}=PATH')
  return value


def _read_glue(name: str, d) -> TaskRecords:
  task = glue.glue_task(GLUE_TASK_NAMES[name])
  directory = required(d, 'glue_dir')
  read = lambda t, split: glue.read_glue(t, directory, split, skip_bad_lines=d.skip_bad_lines)
  train = read(task, 'train')
  if task.name == 'MNLI':
    splits = [SplitRecords('dev_matched', 'dev', read(task, 'dev_matched'), True, 'MNLI-m'),
              SplitRecords('dev_mismatched', 'dev', read(task, 'dev_mismatched'), True, 'MNLI-mm')]
    tests = [(task, 'test_matched', 'MNLI-m'), (task, 'test_mismatched', 'MNLI-mm')]
  else:
    splits = [SplitRecords('dev', 'dev', read(task, 'dev'), True, task.name)]
    tests = [(task, 'test', task.name)]
  for t, split, submission in tests:
    try:
      records = read(t, split)
    except FileNotFoundError:
      logging.info('GLUE %s: no %s file in %s; no leaderboard predictions for it', t.name,
                   split, directory)
      continue
    splits.append(SplitRecords(split, 'test', records, False, submission))
  if task.name == 'MNLI':
    ax = _read_ax(directory, d)
    if ax is not None:
      splits.append(SplitRecords('test_ax', 'test', ax, False, 'AX'))
  kind = REGRESSION if task.is_regression else CLASSIFICATION
  return TaskRecords(name, kind, train, splits, task.labels)


def _read_ax(directory: str, d) -> list | None:
  """GLUE's diagnostic set, predicted with the MNLI model for the leaderboard's AX.tsv:
  `data.ax_file` (an error when missing), else found beside or under `glue_dir`, else a
  warning, since a submission without AX.tsv is incomplete."""
  ax = glue.GLUE_TASKS['AX']
  if d.ax_file:
    return glue.read_glue(ax, directory, 'test', skip_bad_lines=d.skip_bad_lines,
                          path=d.ax_file)
  try:
    return glue.read_glue(ax, directory, 'test', skip_bad_lines=d.skip_bad_lines)
  except FileNotFoundError:
    looked = ', '.join(glue.glue_file_candidates(ax, directory, 'test'))
    logging.warning('GLUE AX (the diagnostic set): not found (looked for %s); no AX.tsv '
                    'leaderboard predictions. Pass --config.data.ax_file=PATH/AX.tsv', looked)
    return None


def _read_mr(name: str, d) -> TaskRecords:
  path = d.mr_file or mr.fetch_mr(d.mr_cache_dir)
  kind = REGRESSION if name == 'mr_regression' else CLASSIFICATION
  parts = mr.mr_splits(mr.read_mr(path), seed=d.split_seed, task=kind)
  splits = [SplitRecords(s, s, tasks.require_examples(parts[s], f'{path} ({s} split)'), True)
            for s in ('dev', 'test')]
  train = tasks.require_examples(parts['train'], f'{path} (train split)')
  return TaskRecords(name, kind, train, splits, () if kind == REGRESSION else mr.LABELS)


def comma_list(value: str) -> tuple[str, ...]:
  return tuple(v.strip() for v in value.split(',') if v.strip())


def _read_conll(d) -> TaskRecords:
  given = comma_list(d.labels)
  read = lambda path, labels: conll.read_conll(path, label_column=d.label_column, labels=labels)
  train = read(required(d, 'train_file'), given or None)
  labels = given or _conll_labels(train)
  dev = read(required(d, 'dev_file'), labels)
  splits = [SplitRecords('dev', 'dev', dev, True)]
  if d.test_file:
    splits.append(SplitRecords('test', 'test', read(d.test_file, labels), True))
  entity = [t for t in labels if conll.is_bio([t])]
  bare = [t for t in labels if t != 'O' and t not in entity]
  if entity and bare:
    logging.warning('CoNLL labels mix entity tags with bare ones (%s): scored by token '
                    'accuracy, not entity F1; is data.label_column=%d the tag column?',
                    ', '.join(bare[:5]), d.label_column)
  return TaskRecords('conll', TAGGING, train, splits, labels)


def _conll_labels(train: list[tasks.TaggedSentence]) -> tuple[str, ...]:
  """CoNLL-2003's tags (HF's and TFDS's order) when the data fits them, else the train
  file's, sorted with O first (always there for entity tags: it is what a word cut by
  max_seq_length is given)."""
  seen = {t for s in train for t in s.tags}
  if seen <= set(conll.CONLL2003_LABELS):
    return conll.CONLL2003_LABELS
  if 'O' in seen or conll.is_bio(tuple(seen)):
    return ('O',) + tuple(sorted(seen - {'O'}))
  return tuple(sorted(seen))


def _read_squad(name: str, d) -> TaskRecords:
  """train_file, dev_file and the optional test_file (labelled, as SQuAD files are: scored
  at the best epoch)."""
  v2 = name == 'squad_v2'
  files = {'train': required(d, 'train_file'), 'dev': required(d, 'dev_file')}
  if d.test_file:
    files['test'] = d.test_file
  read = {split: squad.read_squad(path) for split, path in files.items()}
  if not v2:
    for split, examples in read.items():
      impossible = [e.qas_id for e in examples if e.is_impossible or not e.answers]
      if impossible:
        raise ValueError(f'{files[split]}: {len(impossible)} questions have no answer (e.g. '
                         f'{impossible[0]}): a SQuAD 2.0 file; use configs/finetune.py:squad_v2')
  splits = [SplitRecords(split, split, read[split], True, source=files[split])
            for split in ('dev', 'test') if split in read]
  return TaskRecords(name, SPAN, read['train'], splits, (), v2, train_source=files['train'])


def _read_swag(d) -> TaskRecords:
  """SWAG's train.csv and val.csv (labelled); test.csv scored if labelled, else predicted."""
  train = swag.read_swag(required(d, 'train_file'), labelled=True)
  splits = [SplitRecords('dev', 'dev', swag.read_swag(required(d, 'dev_file'), labelled=True),
                         True)]
  if d.test_file:
    test = swag.read_swag(d.test_file)
    splits.append(SplitRecords('test', 'test', test, test[0].label is not None))
  return TaskRecords('swag', MULTIPLE_CHOICE, train, splits, ())


def _read_generic(d) -> TaskRecords:
  given = comma_list(d.labels)
  read = lambda path, label, labels: tasks.read_table(
      path, d.text_a, d.text_b or None, label, labels=labels, regression=d.regression,
      skip_bad_lines=d.skip_bad_lines)
  train = read(required(d, 'train_file'), d.label, given or None)
  labels = () if d.regression else (given or tasks.label_list(train))
  dev = read(required(d, 'dev_file'), d.label, labels or None)
  splits = [SplitRecords('dev', 'dev', dev, True)]
  if d.test_file:
    labelled = has_column(d.test_file, d.label)
    test = read(d.test_file, d.label if labelled else None, labels or None)
    splits.append(SplitRecords('test', 'test', test, labelled))
  return TaskRecords('generic', REGRESSION if d.regression else CLASSIFICATION, train, splits,
                     labels)


def has_column(path: str, column: str) -> bool:
  """Does a table's header (a .jsonl's first object) name `column`? A test file may lack the
  label column: then it is predicted, not scored."""
  for _, text in tasks.read_lines(path):
    if not text.strip():
      continue
    if path.endswith('.jsonl'):
      try:
        return column in json.loads(text)
      except (json.JSONDecodeError, TypeError):
        return False  # read_table reports the line
    header = next(csv.reader([text])) if path.endswith('.csv') else text.split('\t')
    return column in header
  return False


# ----------------------------------------------------------------------------- labels


def reconcile_labels(records: TaskRecords, start_head: heads.Head | None, init: str,
                     fresh_head: bool) -> tuple[str, ...]:
  """The label order to train with: the task's, or a start point's own head's when that head
  is for this task and names the same labels (its rows are trained in that order).

  A head for this task with other labels (or another count) is an error unless fresh_head:
  reusing it would scramble the classes, silently replacing it may not be what was meant.
  """
  labels = records.labels
  task = head_task(records.kind)
  if (fresh_head or start_head is None or start_head.task != task
      or task in (heads.SPAN, heads.MULTIPLE_CHOICE)):  # no label list to reorder
    return labels
  want = 1 if records.kind == REGRESSION else len(labels)
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


def head_task(kind: str) -> str:
  return {CLASSIFICATION: heads.SEQUENCE, REGRESSION: heads.SEQUENCE, TAGGING: heads.TOKEN,
          SPAN: heads.SPAN, MULTIPLE_CHOICE: heads.MULTIPLE_CHOICE}[kind]


# ----------------------------------------------------------------------------- features


@dataclasses.dataclass
class Task:
  """A featurized task: train arrays, eval splits, and how outputs are scored."""
  name: str
  kind: str
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

  @property
  def entity_tags(self) -> bool:
    """Tagging with B-/I-/E-/S- entity tags (conll.is_bio), scored by entity F1; bare tag
    sets (POS) are scored by token accuracy."""
    return self.kind == TAGGING and conll.is_bio(self.labels)

  def headline_name(self, split: EvalSplit) -> str:
    """The metric `headline` stands for on `split`."""
    if split.glue_name:
      return metrics.GLUE_METRICS[split.glue_name].headline
    if self.kind == TAGGING:
      return 'entity_f1' if self.entity_tags else 'token_accuracy'
    return {CLASSIFICATION: 'accuracy', REGRESSION: 'pearson', SPAN: 'f1',
            MULTIPLE_CHOICE: 'accuracy'}[self.kind]

  # ------------------------------------------------------------------- scoring

  def predictions(self, split: EvalSplit, outputs: dict[str, np.ndarray]):
    """Model outputs -> what the metric compares: class ids (choice numbers), floats, tags,
    answer texts."""
    if self.kind in (CLASSIFICATION, MULTIPLE_CHOICE):
      return outputs['logits'].argmax(-1)
    if self.kind == REGRESSION:
      return outputs['logits'][:, 0]
    if self.kind == TAGGING:
      return features_lib.tags_from_predictions(
          outputs['logits'], split.arrays['word_ids'], [len(s.words) for s in split.records],
          self.labels)
    return self._squad_predictions(split, outputs).predictions

  def _squad_predictions(self, split: EvalSplit, outputs: dict[str, np.ndarray]):
    """Answer texts, decoded with the tokenizer's own casing
    (squad_answers.text_normalization)."""
    d = self.data_config
    return squad_answers.squad_predictions(
        split.records, split.squad_features, outputs['start_logits'], outputs['end_logits'],
        self.tokenizer, n_best_size=d.n_best_size, max_answer_length=d.max_answer_length,
        version_2_with_negative=self.squad_v2,
        null_score_diff_threshold=d.null_score_diff_threshold)

  def score(self, split: EvalSplit, outputs: dict[str, np.ndarray]) -> dict[str, float]:
    """The split's scores; SQuAD 2.0's also the best null thresholds' (evaluate-v2.0.py's
    best_exact, best_f1 and their thresholds), from each question's null odds."""
    if self.kind != SPAN:
      return self.score_predictions(split, self.predictions(split, outputs))
    found = self._squad_predictions(split, outputs)
    out = self.score_predictions(split, found.predictions)
    if self.squad_v2:
      out |= squad_fractions(metrics.squad_v2_best_thresholds(
          squad.gold_answers(split.records), found.predictions, found.null_odds))
    return out

  def baseline(self, split: EvalSplit) -> dict[str, float]:
    """The score of a model that ignores its input (see the module docstring), computed
    once per split."""
    if split.name not in self._baselines:
      self._baselines[split.name] = self._baseline(split)
    return self._baselines[split.name]

  def _baseline(self, split: EvalSplit) -> dict[str, float]:
    n = len(split.records)
    if self.kind == CLASSIFICATION:
      ids = self.train['labels'][self.train['label_weights'] > 0]
      return self.score_predictions(split, np.full(n, metrics.majority_class(ids)))
    if self.kind == REGRESSION:
      return self.score_predictions(split, metrics.baseline_predictions(
          self.train['labels'], n, regression=True))
    if self.kind == MULTIPLE_CHOICE:  # a uniform guess: expected accuracy 1 / num_choices
      chance = 1.0 / split.arrays['input_ids'].shape[1]
      return {'accuracy': chance, 'headline': chance}
    if self.kind == TAGGING:
      ids = self.train['labels'][self.train['label_weights'] > 0]
      tag = self.labels[metrics.majority_class(ids)]
      return self.score_predictions(split, [[tag] * len(s.words) for s in split.records])
    return self.score_predictions(split, {e.qas_id: '' for e in split.records})

  def score_predictions(self, split: EvalSplit, predictions) -> dict[str, float]:
    if self.kind == TAGGING:
      gold = [s.tags for s in split.records]
      accuracy = metrics.token_accuracy(gold, predictions)
      if not self.entity_tags:
        return {'token_accuracy': accuracy, 'headline': accuracy}
      out = metrics.entity_f1(gold, predictions)
      return {k: float(out[k]) for k in ('f1', 'precision', 'recall')} | {
          'token_accuracy': accuracy, 'headline': float(out['f1'])}
    if self.kind == SPAN:
      out = squad_fractions(metrics.squad_evaluate(squad.gold_answers(split.records),
                                                   predictions, version_2=self.squad_v2))
      return out | {'headline': out['f1']}
    labels = split.arrays['labels']
    if self.kind == REGRESSION:
      out = {'pearson': metrics.pearson(labels, predictions),
             'spearman': metrics.spearman(labels, predictions),
             'mse': metrics.mean_squared_error(labels, predictions)}
      if split.glue_name:
        return out | metrics.glue_metrics(split.glue_name, labels, predictions)
      return out | {'headline': out['pearson']}
    if split.glue_name:  # GLUE's metrics index the task's own label order
      order = glue.GLUE_TASKS[glue.SUBMISSION_FILES[split.glue_name]].labels
      to_glue = np.array([order.index(label) for label in self.labels])
      return metrics.glue_metrics(split.glue_name, to_glue[labels], to_glue[predictions])
    accuracy = metrics.accuracy(labels, predictions)
    return {'accuracy': accuracy, 'headline': accuracy}

  def write_predictions(self, split: EvalSplit, outputs: dict[str, np.ndarray],
                        directory: str) -> str:
    """An unlabelled test split's predictions under `directory`: GLUE's leaderboard file
    (`glue_submission/<name>.tsv`), else `predictions/<split>.tsv` (`index<TAB>prediction`,
    the row's index in its file; for multiple choice the predicted ending's number)."""
    if self.kind not in (CLASSIFICATION, REGRESSION, MULTIPLE_CHOICE):
      raise ValueError(f'{split.name}: unlabelled {self.kind} splits are not predicted')
    predictions = self.predictions(split, outputs)
    if self.kind == CLASSIFICATION:
      predictions = [self.labels[int(p)] for p in predictions]
    indices = [e.index for e in split.records]
    if split.glue_name:
      target = fs.join(directory, 'glue_submission')
      with fs.staged_dir(target) as local:
        glue.write_glue_submission(local, split.glue_name, indices, predictions)
      return fs.join(target, f'{split.glue_name}.tsv')
    path = fs.join(directory, 'predictions', f'{split.name}.tsv')
    fs.makedirs(fs.dirname(path))
    fs.write_text(path, 'index\tprediction\n' + ''.join(
        f'{i}\t{p if isinstance(p, str) else f"{float(p):.6g}"}\n'
        for i, p in zip(indices, predictions)))
    return path


# The official SQuAD scripts report percentages; every other task's scores are fractions, so
# SQuAD's reach epoch lines, results.json and results.md as fractions too (0.8812, not 88.12).
# Counts (total, missing) and the null-odds thresholds are not percentages.
SQUAD_PERCENT_SCORES = ('exact_match', 'exact', 'f1', 'HasAns_exact', 'HasAns_f1',
                        'NoAns_exact', 'NoAns_f1', 'best_exact', 'best_f1')
# Scores an epoch line and results.md show beside a split's headline, where the split has
# them: SQuAD's EM beside its F1, SQuAD 2.0's best-threshold scores beside the threshold-0 ones.
DETAIL_SCORES = ('exact_match', 'exact', 'best_f1', 'best_exact')


def squad_fractions(scores: dict) -> dict[str, float]:
  """metrics.squad_evaluate's (or squad_v2_best_thresholds') dict with percentages / 100."""
  return {k: float(v) / 100 if k in SQUAD_PERCENT_SCORES else float(v)
          for k, v in scores.items()}


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
  kind = records.kind
  train = _arrays(kind, records.train, labels, tokenizer, d, training=True,
                  source=records.train_source)[0]
  evals = []
  for s in records.splits:
    arrays, features = _arrays(kind, s.records, labels, tokenizer, d, training=False,
                               source=s.source)
    evals.append(EvalSplit(s.name, s.role, arrays, s.labelled, s.records, s.glue_name, features))
  if kind == SPAN and not len(train['input_ids']):
    raise ValueError(f'{d.train_file}: no training question has its answer in the '
                     'whitespace-split context; check the file')
  head = make_head(kind, labels, classifier_dropout)
  return Task(records.name, kind, labels, train, evals, head, tokenizer, d, records.squad_v2)


def head_without_data(config, num_labels: int | None = None) -> tuple[str, heads.Head]:
  """(kind, head) that a task's config implies before any data is read, for compiling its
  step ahead of time: GLUE's and MR's label sets, CoNLL-2003's tags, SQuAD's spans, SWAG's
  choices; `num_labels` for the rest (generic classification, other tag sets) or to
  override."""
  task, dropout = config.task, config.model.classifier_dropout
  if task in ('squad', 'squad_v2'):
    return SPAN, make_head(SPAN, (), dropout)
  if task == 'swag':
    return MULTIPLE_CHOICE, make_head(MULTIPLE_CHOICE, (), dropout)
  if task in GLUE_TASK_NAMES:
    glue_task = glue.GLUE_TASKS[GLUE_TASK_NAMES[task]]
    kind, labels = (REGRESSION if glue_task.is_regression else CLASSIFICATION), glue_task.labels
  elif task == 'conll':
    kind, labels = TAGGING, conll.CONLL2003_LABELS
  elif task in ('mr_regression',) or (task == 'generic' and config.data.regression):
    kind, labels = REGRESSION, ()
  else:  # mr, generic
    kind, labels = CLASSIFICATION, ('0', '1')
  if num_labels and kind != REGRESSION:
    labels = tuple(str(i) for i in range(num_labels))
  return kind, make_head(kind, tuple(labels or ()), dropout)


def make_head(kind: str, labels: tuple[str, ...], classifier_dropout: float | None
              ) -> heads.Head:
  if kind == SPAN:
    return heads.Head(heads.SPAN)
  if kind == MULTIPLE_CHOICE:
    return heads.Head(heads.MULTIPLE_CHOICE, classifier_dropout=classifier_dropout)
  if kind == REGRESSION:
    return heads.Head(heads.SEQUENCE, num_labels=1, classifier_dropout=classifier_dropout)
  return heads.Head(head_task(kind), num_labels=len(labels), labels=labels,
                    classifier_dropout=classifier_dropout)


def _arrays(kind, records, labels, tokenizer, d, training: bool, source: str = ''):
  length = d.max_seq_length
  if kind in (CLASSIFICATION, REGRESSION):
    return features_lib.classification_features(records, tokenizer, length,
                                                 labels if kind == CLASSIFICATION else None), None
  if kind == TAGGING:
    return features_lib.tagging_features(records, tokenizer, length, labels), None
  if kind == MULTIPLE_CHOICE:
    return features_lib.multiple_choice_features(records, tokenizer, length), None
  features = squad.squad_features(records, tokenizer, max_seq_length=length,
                                  doc_stride=d.doc_stride, max_query_length=d.max_query_length,
                                  is_training=training, source=source or 'SQuAD',
                                  max_misaligned_fraction=d.max_misaligned_fraction)
  if not features:
    return {'input_ids': np.zeros((0, length), np.int32)}, features
  arrays = squad.feature_arrays(features)
  arrays['label_weights'] = np.ones(len(features), np.float32)
  return arrays, features
