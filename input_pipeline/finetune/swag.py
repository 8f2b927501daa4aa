"""SWAG (Zellers et al., 2018) as released: its CSV files -> `ChoiceExample` records.

The "regular" files of rowanz/swagaf `data/` (train.csv, val.csv, test.csv) have a header
naming `video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0 .. ending3, label`
(test.csv has no `label`; the released files also start with an unnamed index column pandas
wrote). Columns are found by header name, so that index column, and any other column not
read, is ignored; `ending0 .. endingK` give the number of choices (4 for SWAG).

Each example becomes one context and one second segment per choice as HuggingFace's
`examples/pytorch/multiple-choice/run_swag.py` builds them (google-research/bert has no SWAG
script): first sentence `sent1`, second `f'{sent2} {ending_i}'`; `task_features.
multiple_choice_features` pairs and truncates them. TFDS 4.9 has no `swag` builder (its
`hellaswag` is a different data set), so SWAG is read from its files only.
"""

from __future__ import annotations

import dataclasses
import os

from input_pipeline.finetune import records as tasks
from input_pipeline.finetune.records import data_error

# run_swag.py's context_name and question_header_name (the start of every ending).
CONTEXT, ENDING_START, LABEL = 'sent1', 'sent2', 'label'


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
  """One multiple-choice question: a context, the second segment of every choice, the
  correct choice's number (None when unlabelled) and the row's index among the file's rows."""
  guid: str
  context: str
  choices: tuple[str, ...]
  label: int | None
  index: int


def ending_columns(header: list[str], path: str, line: int) -> list[str]:
  """`ending0 .. endingK` as the header has them, at least two."""
  endings = []
  while f'ending{len(endings)}' in header:
    endings.append(f'ending{len(endings)}')
  if len(endings) < 2:
    missing = f'ending{len(endings)}'
    raise data_error(path, line, missing, f'no such column in the header {header}; a SWAG '
                     'file names its choices ending0, ending1, ... (the "regular" train.csv, '
                     'val.csv or test.csv, not the *_full.csv files)')
  return endings


def read_swag(path: str, *, labelled: bool | None = None) -> list[ChoiceExample]:
  """The examples of a SWAG-layout CSV file.

  `labelled=True` requires the `label` column (train and dev files), False ignores it, None
  reads it when the header has one (a test file), where an empty label or -1 (as HF
  `datasets` exports SWAG's test split) means unlabelled. A label must be a choice number
  0 .. num_choices - 1.
  """
  records = tasks.csv_fields(path)
  header_line, header = next(records, (1, None))
  if header is None:
    raise data_error(path, None, None, 'empty file (expected a header line naming the columns)')
  for column in (CONTEXT, ENDING_START) + ((LABEL,) if labelled else ()):
    if column not in header:
      raise data_error(path, header_line, column, f'no such column in the header {header}; '
                       'expected SWAG\'s columns (sent1, sent2, ending0.., label)')
  endings = ending_columns(header, path, header_line)
  has_label = LABEL in header and labelled is not False
  examples = []
  for n, (line, fields) in enumerate(records):
    if len(fields) != len(header):
      raise data_error(path, line, None, f'expected {len(header)} comma-separated columns (as '
                       f'the header has), found {len(fields)}; fix the row\'s quoting')
    row = dict(zip(header, fields))
    unlabelled = labelled is None and row.get(LABEL, '').strip() in ('', '-1')
    label = _label(row[LABEL], len(endings), path, line) if has_label and not unlabelled else None
    guid = (f'{row["video-id"]}-{row["fold-ind"]}' if row.get('video-id') and row.get('fold-ind')
            else f'{os.path.basename(path)}-{n}')
    examples.append(ChoiceExample(
        guid=guid, context=row[CONTEXT],
        choices=tuple(f'{row[ENDING_START]} {row[e]}' for e in endings), label=label, index=n))
  if len({e.label is None for e in examples}) > 1:
    first = next(e for e in examples if e.label is None)
    raise data_error(path, None, LABEL, f'some rows are labelled and some are not (e.g. row '
                     f'{first.index + 1}); label every row, or none (-1 or empty)')
  return tasks.require_examples(examples, path)


def _label(value: str, num_choices: int, path: str, line: int) -> int:
  try:
    label = int(value)
  except ValueError:
    label = -1
  if not 0 <= label < num_choices:
    raise data_error(path, line, LABEL, f'{value!r} is not a choice number 0..{num_choices - 1}'
                     ' (the number of the correct ending)')
  return label
