"""The registry of fine-tuning tasks: name -> `TaskSpec` (its kind, reader and data fields;
its recipe, the learning rate, batch and epochs, is configs/finetune.py's). `configs/finetune.py:<task>`
builds its config from here and the run reads the
task's records through it, so a new task is one `register(TaskSpec(...))` from any module;
its kind (bert_jax/finetune/kinds) says how it is featurized, trained and scored.

Readers return `TaskRecords`: the training records, the evaluation splits (`SplitRecords`: the
dev splits, the first of which selects the best epoch, and test splits, scored when labelled,
else predicted) and the label list. Only the data fields a task declares exist in its config,
so a misspelt or irrelevant override is an error, not silently ignored.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
from typing import Callable

import ml_collections

from input_pipeline.finetune import (beir, conll, glue, mr, pairs, records as tables, squad,
                                     swag)


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
  kind: str  # a bert_jax.finetune.kinds name
  train: list
  splits: list[SplitRecords]
  labels: tuple[str, ...]  # () where the kind has no label list
  squad_v2: bool = False
  train_source: str = ''  # the training file, named in featurizing's messages (SQuAD)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """What the configs and the run need to know of a task.

  `kind` is a kinds name, or a function of the data config where the data decides (generic
  tables: classification or regression). `labels` is the label list known before any data is
  read (GLUE's, CoNLL-2003's), which ahead-of-time compilation sizes the head with; None: the
  data's. `data_fields(d)` adds the task's fields to the data block.
  """
  name: str
  kind: str | Callable[[ml_collections.ConfigDict], str]
  read: Callable[[str, ml_collections.ConfigDict], TaskRecords]
  data_fields: Callable[[ml_collections.ConfigDict], None]
  labels: tuple[str, ...] | None = None

  def kind_for(self, d: ml_collections.ConfigDict) -> str:
    return self.kind(d) if callable(self.kind) else self.kind


TASKS: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
  TASKS[spec.name] = spec
  return spec


def get(name: str) -> TaskSpec:
  if name not in TASKS:
    raise ValueError(f'config.task={name!r}: unknown; use a task of configs/finetune.py '
                     f'({", ".join(TASKS)})')
  return TASKS[name]


def read_task(config) -> TaskRecords:
  """The task's records per split, read by its strict reader; the first
  `data.max_train_examples` training records when that is set."""
  records = get(config.task).read(config.task, config.data)
  return limit_train(records, config.data.max_train_examples)


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


def comma_list(value: str) -> tuple[str, ...]:
  return tuple(v.strip() for v in value.split(',') if v.strip())


def has_column(path: str, column: str) -> bool:
  """Does a table's header (a .jsonl's first object) name `column`? A test file may lack the
  label column: then it is predicted, not scored."""
  for _, text in tables.read_lines(path):
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


def train_dev_test_files(d) -> None:
  """The fields of tasks read from a train, a dev and an optional test file."""
  d.train_file = ''
  d.dev_file = ''
  d.test_file = ''  # optional


# ----------------------------------------------------------------------------- GLUE

GLUE_TASK_NAMES = {'cola': 'CoLA', 'sst2': 'SST-2', 'mrpc': 'MRPC', 'qqp': 'QQP',
                   'stsb': 'STS-B', 'mnli': 'MNLI', 'qnli': 'QNLI', 'rte': 'RTE', 'wnli': 'WNLI'}


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
  kind = 'regression' if task.is_regression else 'classification'
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


def _glue_fields(d) -> None:
  d.glue_dir = ''  # the task's directory of the GLUE download (glue_data/MRPC) or its root
  d.skip_bad_lines = False  # skip rows with the wrong column count instead of failing


def _mnli_fields(d) -> None:
  _glue_fields(d)
  # GLUE's diagnostic test set (AX.tsv), predicted for the leaderboard; empty: looked for
  # beside glue_dir (glue_data/AX/AX.tsv, glue_data/diagnostic/diagnostic.tsv) and under it.
  d.ax_file = ''


for _name, _glue_name in GLUE_TASK_NAMES.items():
  _glue_task = glue.GLUE_TASKS[_glue_name]
  register(TaskSpec(_name, 'regression' if _glue_task.is_regression else 'classification',
                    _read_glue, _mnli_fields if _name == 'mnli' else _glue_fields,
                    labels=_glue_task.labels))


# ----------------------------------------------------------------------------- MR


def _read_mr(name: str, d) -> TaskRecords:
  path = d.mr_file or mr.fetch_mr(d.mr_cache_dir)
  kind = 'regression' if name == 'mr_regression' else 'classification'
  parts = mr.mr_splits(mr.read_mr(path), seed=d.split_seed, task=kind)
  splits = [SplitRecords(s, s, tables.require_examples(parts[s], f'{path} ({s} split)'), True)
            for s in ('dev', 'test')]
  train = tables.require_examples(parts['train'], f'{path} (train split)')
  return TaskRecords(name, kind, train, splits, () if kind == 'regression' else mr.LABELS)


def _mr_fields(d) -> None:
  # vaderSentiment-3.3.2.tar.gz, hutto_ICWSM_2014.tar.gz or the ratings .txt; empty:
  # download the sdist with pip into mr_cache_dir (SHA-256 checked).
  d.mr_file = ''
  d.mr_cache_dir = 'runs/cache/mr'  # where fetch_mr keeps the sdist
  d.split_seed = 0  # the 80/10/10 split's shuffle (input_pipeline/finetune/mr.py)


register(TaskSpec('mr', 'classification', _read_mr, _mr_fields, labels=mr.LABELS))
register(TaskSpec('mr_regression', 'regression', _read_mr, _mr_fields, labels=()))


# ----------------------------------------------------------------------------- CoNLL


def _read_conll(name: str, d) -> TaskRecords:
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
  return TaskRecords(name, 'tagging', train, splits, labels)


def _conll_labels(train: list[tables.TaggedSentence]) -> tuple[str, ...]:
  """CoNLL-2003's tags (HF's and TFDS's order) when the data fits them, else the train
  file's, sorted with O first (always there for entity tags: it is what a word cut by
  max_seq_length is given)."""
  seen = {t for s in train for t in s.tags}
  if seen <= set(conll.CONLL2003_LABELS):
    return conll.CONLL2003_LABELS
  if 'O' in seen or conll.is_bio(tuple(seen)):
    return ('O',) + tuple(sorted(seen - {'O'}))
  return tuple(sorted(seen))


def _conll_fields(d) -> None:
  # Column files, one word a line: `word TAG`, CoNLL-2003's `word POS chunk NER`, or any
  # other column count (each file's first line sets it). Entity tags (B-/I-/E-/S-X and O)
  # are scored by entity F1, bare tags (POS: NN, VBZ) by token accuracy.
  train_dev_test_files(d)  # test: labelled, so the best-dev epoch's test score is reported
  d.label_column = -1  # the tag column, 0-based; negative counts from the end (-1: last)
  d.labels = ''  # comma list of tags; empty: CoNLL-2003's if the data fits, else the train's


register(TaskSpec('conll', 'tagging', _read_conll, _conll_fields,
                  labels=conll.CONLL2003_LABELS))


# ----------------------------------------------------------------------------- SQuAD


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
  return TaskRecords(name, 'span', read['train'], splits, (), v2, train_source=files['train'])


def _squad_fields(d) -> None:
  d.train_file = ''  # train-v1.1.json / train-v2.0.json
  d.dev_file = ''  # dev-v1.1.json / dev-v2.0.json
  d.test_file = ''  # optional, same JSON with answers: scored (EM, F1) at the best epoch
  d.max_seq_length = 384  # window length: [CLS] question [SEP] context [SEP]
  d.doc_stride = 128  # context tokens between window starts
  d.max_query_length = 64  # question tokens kept
  d.n_best_size = 20  # candidate starts and ends per window
  d.max_answer_length = 30  # tokens
  d.null_score_diff_threshold = 0.0  # squad_v2: answer "" when null beats spans by this
  # Refuse a training file in which more than this fraction of the answers cannot be
  # aligned (answer_start not at the answer text, or no window holds it): they are dropped,
  # and many of them means offsets in other units (bytes) or a different context.
  d.max_misaligned_fraction = 0.01


register(TaskSpec('squad', 'span', _read_squad, _squad_fields, labels=()))
register(TaskSpec('squad_v2', 'span', _read_squad, _squad_fields, labels=()))


# ----------------------------------------------------------------------------- SWAG


def _read_swag(name: str, d) -> TaskRecords:
  """SWAG's train.csv and val.csv (labelled); test.csv scored if labelled, else predicted."""
  train = swag.read_swag(required(d, 'train_file'), labelled=True)
  splits = [SplitRecords('dev', 'dev', swag.read_swag(required(d, 'dev_file'), labelled=True),
                         True)]
  if d.test_file:
    test = swag.read_swag(d.test_file)
    splits.append(SplitRecords('test', 'test', test, test[0].label is not None))
  return TaskRecords(name, 'multiple_choice', train, splits, ())


def _swag_fields(d) -> None:
  # rowanz/swagaf data/: sent1, sent2, ending0..3, label (input_pipeline/finetune/swag.py); each
  # choice is `[CLS] sent1 [SEP] sent2 ending_i [SEP]`, cut to max_seq_length (128).
  d.train_file = ''  # train.csv
  d.dev_file = ''  # val.csv
  d.test_file = ''  # optional test.csv: no labels, so predicted (predictions/test.tsv)


register(TaskSpec('swag', 'multiple_choice', _read_swag, _swag_fields, labels=()))


# ----------------------------------------------------------------------------- generic


def _read_generic(name: str, d) -> TaskRecords:
  given = comma_list(d.labels)
  read = lambda path, label, labels: tables.read_table(
      path, d.text_a, d.text_b or None, label, labels=labels, regression=d.regression,
      skip_bad_lines=d.skip_bad_lines)
  train = read(required(d, 'train_file'), d.label, given or None)
  labels = () if d.regression else (given or tables.label_list(train))
  dev = read(required(d, 'dev_file'), d.label, labels or None)
  splits = [SplitRecords('dev', 'dev', dev, True)]
  if d.test_file:
    labelled = has_column(d.test_file, d.label)
    test = read(d.test_file, d.label if labelled else None, labels or None)
    splits.append(SplitRecords('test', 'test', test, labelled))
  return TaskRecords(name, _generic_kind(d), train, splits, labels)


def _generic_kind(d) -> str:
  return 'regression' if d.regression else 'classification'


def _generic_fields(d) -> None:
  d.train_file = ''  # .csv / .tsv (header names the columns) / .jsonl
  d.dev_file = ''
  d.test_file = ''  # optional; scored if it has the label column, else predicted (predictions/)
  d.text_a = 'sentence'  # column names
  d.text_b = ''  # empty: single sentences
  d.label = 'label'  # the label column (classification or, with regression, a number)
  d.labels = ''  # comma list fixing the label order; empty: sorted train labels
  d.regression = False  # labels are numbers: MSE loss, Pearson/Spearman
  d.skip_bad_lines = False  # skip rows with the wrong column count instead of failing


register(TaskSpec('generic', _generic_kind, _read_generic, _generic_fields))


# ----------------------------------------------------------------------------- embeddings


def _read_pairs(name: str, d) -> TaskRecords:
  """Training pairs; dev (and the optional test) read as retrieval tasks, always labelled:
  a pair file's positives are the relevant documents; a BEIR directory's qrels/dev.tsv (for
  dev_file) or qrels/test.tsv (test_file) grade them (input_pipeline/finetune/beir.py)."""
  train = pairs.read_pairs(required(d, 'train_file'))
  files = {'dev': required(d, 'dev_file'), **({'test': d.test_file} if d.test_file else {})}
  read = lambda path, split: (beir.read_beir(path, split) if beir.is_beir_dir(path) else
                              pairs.read_retrieval_split(path))
  splits = [SplitRecords(split, split, read(path, split), True, source=path)
            for split, path in files.items()]
  return TaskRecords(name, 'sentence_embedding', train, splits, (),
                     train_source=d.train_file)


def _pair_fields(d) -> None:
  # .tsv (header: query, positive[, negative]) or .jsonl ({"query", "positive"[, "negative"]});
  # dev and test are scored by retrieval over all their positive and negative texts, or are
  # BEIR directories (corpus.jsonl, queries.jsonl, qrels/dev.tsv or qrels/test.tsv).
  train_dev_test_files(d)
  d.pooling = 'mean'  # token states -> embedding: mean (sentence-transformers' usual) | cls
  d.similarity_scale = 20.0  # MultipleNegativesRankingLoss's scale (1 / temperature)
  # Prepended to every query / every positive, negative and corpus text, in training, evaluation
  # and the export's sentence-transformers prompts (E5: 'query: ' and 'passage: ').
  d.query_prompt = ''
  d.document_prompt = ''
  # Cached loss (GradCache, sentence-transformers' CachedMultipleNegativesRankingLoss): embed
  # this many rows of the global batch at a time, every query still ranked against the whole
  # batch; the same loss and gradients for one more forward pass, so the batch is not bounded
  # by activations (and no gradient accumulation is needed). Divides train.global_batch_size, a
  # multiple of the data x fsdp devices; 0 = the whole batch in one pass.
  d.embed_chunk = 0
  # Matryoshka (sentence-transformers' MatryoshkaLoss): the loss summed over these leading
  # dimensions, e.g. (768,512,256,128,64), and dev/test scored at each; () = the full one only.
  d.matryoshka_dims = ()
  d.matryoshka_weights = ()  # one per dimension; () = 1 each


register(TaskSpec('embedding', 'sentence_embedding', _read_pairs, _pair_fields, labels=()))
