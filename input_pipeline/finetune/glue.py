"""GLUE: each task's TSV layout, label list and splits; TFDS `glue/*`; leaderboard files.

Layouts are those of the GLUE download (`download_glue_data.py` / gluebenchmark.com) and the
label lists are exactly those of google-research/bert `run_classifier.py` and HuggingFace's
`glue.py` processors, in their order (a checkpoint's head is indexed by it):

| task  | train/dev columns used                  | labels                                  |
| ----- | --------------------------------------- | --------------------------------------- |
| CoLA  | no header; 4 columns: label=1, text=3   | 0 1                                     |
| SST-2 | sentence, label                         | 0 1                                     |
| MRPC  | #1 String, #2 String, Quality           | 0 1                                     |
| QQP   | question1, question2, is_duplicate      | 0 1                                     |
| STS-B | sentence1, sentence2, score             | (regression, float)                     |
| MNLI  | sentence1, sentence2, gold_label        | contradiction entailment neutral        |
| QNLI  | question, sentence, label               | entailment not_entailment               |
| RTE   | sentence1, sentence2, label             | entailment not_entailment               |
| WNLI  | sentence1, sentence2, label             | 0 1                                     |
| AX    | sentence1, sentence2 (test only)        | MNLI's                                  |

Columns are found by header name (the reference indexes by position; on GLUE's files both
pick the same columns, and names give a clear error on a wrong file). Test files have no
label and an `index` column (`id` for QQP), which becomes `Example.index` and the submission's
`index`. Files are split on tabs with no quote handling, as GLUE wrote them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence

import numpy as np

from input_pipeline import fs

from input_pipeline.finetune.records import (Example, check_label, data_error, read_lines,
                                  require_examples)

MNLI_LABELS = ('contradiction', 'entailment', 'neutral')
BINARY = ('0', '1')
ENTAILMENT = ('entailment', 'not_entailment')


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """One GLUE task: where its files are, which columns hold what, its labels."""
  name: str  # GLUE's directory name
  labels: tuple[str, ...]  # () for the regression task
  text_a: str
  text_b: str | None
  label: str | None  # header name of the label column in train/dev
  files: dict[str, tuple[str, ...]]  # split -> candidate file names
  tfds: str  # config name under `glue/`
  tfds_text: tuple[str, str | None]  # TFDS feature names of text_a, text_b
  index: str = 'index'  # test files' id column
  # CoLA train/dev have no header: 4 columns, of which these positions hold these fields.
  headerless: dict[str, int] | None = None

  @property
  def is_regression(self) -> bool:
    return not self.labels

  @property
  def splits(self) -> tuple[str, ...]:
    return tuple(self.files)


def _files(*extra: str) -> dict[str, tuple[str, ...]]:
  base = {'train': ('train.tsv',), 'dev': ('dev.tsv',), 'test': ('test.tsv',)}
  return base if not extra else {s: (f'{s}.tsv',) for s in extra}


GLUE_TASKS: dict[str, GlueTask] = {t.name: t for t in [
    GlueTask('CoLA', BINARY, 'sentence', None, 'label', _files(), 'cola', ('sentence', None),
             headerless={'label': 1, 'sentence': 3}),
    GlueTask('SST-2', BINARY, 'sentence', None, 'label', _files(), 'sst2', ('sentence', None)),
    GlueTask('MRPC', BINARY, '#1 String', '#2 String', 'Quality', _files(), 'mrpc',
             ('sentence1', 'sentence2')),
    GlueTask('QQP', BINARY, 'question1', 'question2', 'is_duplicate', _files(), 'qqp',
             ('question1', 'question2'), index='id'),
    GlueTask('STS-B', (), 'sentence1', 'sentence2', 'score', _files(), 'stsb',
             ('sentence1', 'sentence2')),
    GlueTask('MNLI', MNLI_LABELS, 'sentence1', 'sentence2', 'gold_label',
             _files('train', 'dev_matched', 'dev_mismatched', 'test_matched', 'test_mismatched'),
             'mnli', ('premise', 'hypothesis')),
    GlueTask('QNLI', ENTAILMENT, 'question', 'sentence', 'label', _files(), 'qnli',
             ('question', 'sentence')),
    GlueTask('RTE', ENTAILMENT, 'sentence1', 'sentence2', 'label', _files(), 'rte',
             ('sentence1', 'sentence2')),
    GlueTask('WNLI', BINARY, 'sentence1', 'sentence2', 'label', _files(), 'wnli',
             ('sentence1', 'sentence2')),
    # The diagnostic set: `diagnostic/diagnostic.tsv` from download_glue_data.py, `AX.tsv`
    # from the GLUE site. Predicted with an MNLI model.
    GlueTask('AX', MNLI_LABELS, 'sentence1', 'sentence2', None,
             {'test': ('diagnostic.tsv', 'AX.tsv')}, 'ax', ('premise', 'hypothesis')),
]}

# The reference's MNLI processor reads dev_matched/test_matched as "dev"/"test".
_SPLIT_ALIASES = {'MNLI': {'dev': 'dev_matched', 'test': 'test_matched'}}


def glue_task(name: str) -> GlueTask:
  """A task by GLUE's name, case and dashes ignored: 'MRPC', 'sst2', 'STS-B', 'mnli'."""
  key = name.replace('-', '').replace('_', '').lower()
  for task in GLUE_TASKS.values():
    if task.name.replace('-', '').lower() == key or task.tfds == key:
      return task
  raise ValueError(f'unknown GLUE task {name!r}; the tasks are {list(GLUE_TASKS)}')


def glue_split(task: GlueTask, split: str) -> str:
  """The split's canonical name ('dev' of MNLI is 'dev_matched'); unknown ones are errors."""
  split = _SPLIT_ALIASES.get(task.name, {}).get(split, split)
  if split not in task.files:
    raise ValueError(f'GLUE {task.name} has no split {split!r}; its splits are {task.splits}')
  return split


def glue_file_candidates(task: GlueTask, data_dir: str, split: str) -> list[str]:
  """Where a split's file may be, in the order looked: the directory itself, then
  `<data_dir>/<task>` (the download's root). AX also beside the task directory, since it is
  predicted with an MNLI model whose `glue_dir` is `glue_data/MNLI`: `glue_data/AX/AX.tsv`
  (the GLUE site's layout) and `glue_data/diagnostic/diagnostic.tsv` (download_glue_data.py's).
  """
  split = glue_split(task, split)
  if task.name == 'AX':
    parent = fs.dirname(data_dir.rstrip('/'))
    subdirs = ('diagnostic', 'AX')
    dirs = [data_dir] + [fs.join(d, s) for d in (data_dir, parent) for s in subdirs]
  else:
    dirs = [data_dir, fs.join(data_dir, task.name)]
  return list(dict.fromkeys(fs.join(d, f) for d in dirs for f in task.files[split]))


def glue_file(task: GlueTask, data_dir: str, split: str) -> str:
  """The split's file in the task's directory, or in `<data_dir>/<task>` when `data_dir` is
  the GLUE download's root (AX: see `glue_file_candidates`)."""
  candidates = glue_file_candidates(task, data_dir, split)
  for path in candidates:
    if fs.exists(path) and not fs.isdir(path):
      return path
  also = f'; also looked for {", ".join(candidates[1:])}' if task.name == 'AX' else ''
  raise FileNotFoundError(f'{candidates[0]}: no such file (GLUE {task.name} '
                          f'{glue_split(task, split)}{also}); pass the task directory of the '
                          f'GLUE download, e.g. glue_data/{task.name}')


def read_glue(task: str | GlueTask, data_dir: str, split: str, *,
              skip_bad_lines: bool = False, path: str | None = None) -> list[Example]:
  """Examples of one split of one GLUE task from its directory (`glue_data/MRPC`) or the
  download's root (`glue_data`), or from the file `path` when given (AX's `data.ax_file`).

  Splits: train, dev, test (MNLI: train, dev_matched, dev_mismatched, test_matched,
  test_mismatched, with dev/test meaning matched; AX: test). Test examples have label None.
  `skip_bad_lines` skips rows with the wrong column count (and logs how many) instead of
  failing on the first.
  """
  task = task if isinstance(task, GlueTask) else glue_task(task)
  split = glue_split(task, split)
  if path is None:
    path = glue_file(task, data_dir, split)
  elif not fs.exists(path) or fs.isdir(path):
    raise FileNotFoundError(f'{path}: no such file (GLUE {task.name} {split})')
  is_test = split.startswith('test')
  if task.headerless and not is_test:
    rows = _positional_rows(path, task.headerless, 4, skip_bad_lines)
  else:
    rows = _named_rows(path, task, is_test, skip_bad_lines)
  out = []
  for n, (line_no, row) in enumerate(rows):
    out.append(_example(task, path, split, n, line_no, row, is_test))
  return require_examples(out, path)


def _example(task, path, split, n, line_no, row, is_test) -> Example:
  label = None
  if not is_test:
    label = check_label(row[task.label], task.labels, task.is_regression, path, line_no,
                        task.label)
  index = n
  if is_test:
    try:
      index = int(row[task.index])
    except ValueError:
      raise data_error(path, line_no, task.index, f'{row[task.index]!r} is not an integer '
                       'index') from None
  return Example(guid=f'{split}-{index}', text_a=row[task.text_a],
                 text_b=row[task.text_b] if task.text_b else None, label=label, index=index)


def _named_rows(path, task, is_test, skip_bad_lines):
  """Rows as {header name: field}, after checking the header has the task's columns."""
  lines = _nonblank(path)
  line_no, header = next(lines, (1, None))
  if header is None:
    raise data_error(path, None, None, 'empty file (expected a header line)')
  header = header.split('\t')
  wanted = [c for c in (task.text_a, task.text_b) if c]
  wanted += [task.index] if is_test else [task.label]
  for column in wanted:
    if column not in header:
      raise data_error(path, line_no, column, f'no such column in the header {header}: not '
                       f'GLUE {task.name}\'s layout (is this the right file?)')
  for line_no, fields in _checked(path, lines, len(header), skip_bad_lines):
    yield line_no, dict(zip(header, fields))


def _positional_rows(path, positions, num_columns, skip_bad_lines):
  for line_no, fields in _checked(path, _nonblank(path), num_columns, skip_bad_lines):
    yield line_no, {name: fields[i] for name, i in positions.items()}


def _nonblank(path: str) -> Iterator[tuple[int, str]]:
  return ((n, text) for n, text in read_lines(path) if text)


def _checked(path, lines, num_columns, skip_bad_lines):
  skipped = 0
  for line_no, text in lines:
    fields = text.split('\t')
    if len(fields) != num_columns:
      if skip_bad_lines:
        skipped += 1
        continue
      raise data_error(path, line_no, None, f'expected {num_columns} tab-separated columns, '
                       f'found {len(fields)}; fix the row or pass skip_bad_lines=True')
    yield line_no, fields
  if skipped:
    logging.warning('%s: skipped %d rows with the wrong number of columns', path, skipped)


# ----------------------------------------------------------------------------- TFDS

_TFDS_SPLITS = {'dev': 'validation', 'dev_matched': 'validation_matched',
                'dev_mismatched': 'validation_mismatched'}


def read_tfds_glue(task: str | GlueTask, split: str, *, data_dir: str | None = None
                   ) -> list[Example]:
  """The same examples from TFDS `glue/<config>` (our split names or TFDS's).

  TFDS stores labels as class indices in its own order (MNLI: entailment, neutral,
  contradiction); they are mapped back to the task's label strings by name, so the label ids
  `task_features` assigns are the same whichever reader was used. Test rows (TFDS label -1)
  get label None; `index` is TFDS's `idx`.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  task = task if isinstance(task, GlueTask) else glue_task(task)
  split = _SPLIT_ALIASES.get(task.name, {}).get(split, split)
  tfds_split = _TFDS_SPLITS.get(split, split)
  name = f'glue/{task.tfds}'
  ds, info = tfds.load(name, split=tfds_split, data_dir=data_dir, shuffle_files=False,
                       with_info=True)
  to_label = _tfds_label_fn(task, info.features['label'])
  out = []
  for ex in tfds.as_numpy(ds):
    text_b = _text(ex[task.tfds_text[1]]) if task.tfds_text[1] else None
    index = int(ex['idx'])
    out.append(Example(guid=f'{split}-{index}', text_a=_text(ex[task.tfds_text[0]]),
                       text_b=text_b, label=to_label(ex['label']), index=index))
  return require_examples(out, f'TFDS {name} split {tfds_split}')


def _tfds_label_fn(task: GlueTask, feature):
  if task.is_regression:
    return lambda v: None if float(v) == -1 else float(v)
  names = feature.names
  # Binary GLUE tasks store 0/1 with TFDS names in that order (unacceptable/acceptable, ...);
  # the NLI tasks' TFDS names are our label strings.
  mapped = [n if n in task.labels else str(i) for i, n in enumerate(names)]
  if sorted(mapped) != sorted(task.labels):
    raise ValueError(f'TFDS glue/{task.tfds} labels {names} do not map onto {task.labels}')
  return lambda v: None if int(v) < 0 else mapped[int(v)]


def _text(value) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


# ----------------------------------------------------------------------------- submission

# GLUE server file name -> task whose labels it uses.
SUBMISSION_FILES = {'CoLA': 'CoLA', 'SST-2': 'SST-2', 'MRPC': 'MRPC', 'STS-B': 'STS-B',
                    'QQP': 'QQP', 'MNLI-m': 'MNLI', 'MNLI-mm': 'MNLI', 'QNLI': 'QNLI',
                    'RTE': 'RTE', 'WNLI': 'WNLI', 'AX': 'AX'}


def submission_name(task: str, split: str = 'test') -> str:
  """The leaderboard file name (without .tsv) of a task's test split: MNLI -> MNLI-m/-mm."""
  task = glue_task(task).name
  if task == 'MNLI':
    split = _SPLIT_ALIASES['MNLI'].get(split, split)
    return {'test_matched': 'MNLI-m', 'test_mismatched': 'MNLI-mm'}[split]
  return task


def write_glue_submission(output_dir: str, name: str, indices: Sequence[int],
                          predictions: Sequence) -> str:
  """Write `<output_dir>/<name>.tsv` as the GLUE server reads it: `index<TAB>prediction`.

  `name` is a SUBMISSION_FILES key ('CoLA', 'MNLI-m', 'AX', ...). `predictions` are label ids
  into the task's label list or the label strings themselves (written as strings: '1',
  'entailment'); for STS-B, floats (written with 3 decimals). `indices` are the test examples'
  `Example.index`. Zip the 11 files together to submit.
  """
  if name not in SUBMISSION_FILES:
    raise ValueError(f'unknown GLUE submission {name!r}; expected one of {list(SUBMISSION_FILES)}')
  task = GLUE_TASKS[SUBMISSION_FILES[name]]
  if len(indices) != len(predictions):
    raise ValueError(f'{name}: {len(indices)} indices but {len(predictions)} predictions')
  if len(set(int(i) for i in indices)) != len(indices):
    raise ValueError(f'{name}: repeated test indices')
  values = [_prediction_text(task, p, name) for p in predictions]
  fs.makedirs(output_dir)
  path = fs.join(output_dir, f'{name}.tsv')
  with fs.writer(path, 'w') as f:
    f.write('index\tprediction\n')
    for index, value in zip(indices, values):
      f.write(f'{int(index)}\t{value}\n')
  return path


def _prediction_text(task: GlueTask, p, name: str) -> str:
  if task.is_regression:
    return f'{float(p):.3f}'
  if isinstance(p, (int, np.integer)):
    if not 0 <= p < len(task.labels):
      raise ValueError(f'{name}: label id {p} outside 0..{len(task.labels) - 1}')
    return task.labels[int(p)]
  if p not in task.labels:
    raise ValueError(f'{name}: prediction {p!r} is not one of {list(task.labels)}')
  return str(p)
