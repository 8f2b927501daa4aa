"""Fine-tuning data: the records every task reader returns, and readers for generic tables.

Every reader in `glue.py`, `mr.py`, `conll.py`, `squad.py` and here returns plain Python
records (`Example`, `TaggedSentence`, `squad.SquadExample`); `task_features.py` turns them into
padded numpy arrays with our tokenizer. Readers are strict: a missing column, a wrong column
count, an unknown label or an empty split is a `ValueError` that names the file, the line and the
field, so a malformed download fails at load time rather than as a silently worse score.

Generic tables (`read_table`) are what users have for their own tasks: `.csv` (quoted as the
`csv` module writes), `.tsv` (plain tab-split, no quoting, as GLUE writes) or `.jsonl` (one JSON
object per line), with the user naming the `text_a` / `text_b` / `label` columns.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os
from collections.abc import Iterator, Sequence

from input_pipeline import fs


@dataclasses.dataclass(frozen=True)
class Example:
  """One sentence (pair) classification or regression example.

  `label` is a label string (classification), a float (regression) or None (test rows).
  `index` is the row's number among the file's data rows, or the test file's own index column:
  the id a GLUE submission refers to.
  """
  guid: str
  text_a: str
  text_b: str | None
  label: str | float | None
  index: int


@dataclasses.dataclass(frozen=True)
class TaggedSentence:
  """One token-tagging sentence: whitespace words and one tag per word (None when unlabelled)."""
  words: tuple[str, ...]
  tags: tuple[str, ...] | None
  pos: tuple[str, ...] | None = None
  chunks: tuple[str, ...] | None = None


def data_error(path: str, line: int | None, field: str | None, message: str) -> ValueError:
  """`ValueError('<path>, line <n>, field <f>: <message>')`: every reader reports this way."""
  where = path if line is None else f'{path}, line {line}'
  if field is not None:
    where += f', field {field!r}'
  return ValueError(f'{where}: {message}')


def read_lines(path: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, text without its line end) for a UTF-8 file.

  A byte-order mark is dropped, `\\r\\n` and `\\n` both end lines, and a line that is not UTF-8
  is an error naming the line (we never guess an encoding: a mis-decoded dataset trains fine
  and scores worse, which nobody notices).
  """
  if not fs.exists(path) or fs.isdir(path):
    raise FileNotFoundError(f'{path}: no such file')
  with fs.open_read(path, 'rb') as f:
    for line_no, raw in enumerate(f, 1):
      try:
        text = raw.decode('utf-8-sig' if line_no == 1 else 'utf-8')
      except UnicodeDecodeError as e:
        raise data_error(path, line_no, None, f'not UTF-8 ({e.reason} at byte {e.start}); '
                         're-encode the file as UTF-8') from None
      yield line_no, text.rstrip('\r\n')


def check_label(value: str, labels: Sequence[str] | None, regression: bool, path: str,
                line: int, field: str) -> str | float:
  """The label as the task defines it: a float for regression, else a member of `labels`."""
  if regression:
    try:
      return float(value)
    except ValueError:
      raise data_error(path, line, field, f'{value!r} is not a number (this task is a '
                       'regression: labels are floats)') from None
  if value == '':
    raise data_error(path, line, field, 'empty label')
  if labels is not None and value not in labels:
    raise data_error(path, line, field, f'unknown label {value!r}; the labels are '
                     f'{list(labels)} (a different label set needs its own label list)')
  return value


def require_examples(items: list, path: str) -> list:
  if not items:
    raise data_error(path, None, None, 'no examples (empty split); check the file and split')
  return items


def label_list(examples: Sequence[Example]) -> tuple[str, ...]:
  """The sorted label strings of `examples`: the label list of a user's own training file."""
  return tuple(sorted({e.label for e in examples if e.label is not None}))


def read_table(path: str, text_a: str, text_b: str | None = None, label: str | None = None, *,
               labels: Sequence[str] | None = None, regression: bool = False,
               skip_bad_lines: bool = False) -> list[Example]:
  """Examples from a `.csv`, `.tsv` or `.jsonl` file with user-named columns.

  The first line of a CSV/TSV is its header. `label=None` reads unlabelled rows (a test
  file). With `labels`, a label outside it is an error; without, any non-empty string is a
  label (`label_list(train)` then gives the list to check dev/test files against).
  `skip_bad_lines` skips (and logs the count of) rows with the wrong number of columns.
  """
  wanted = [c for c in (text_a, text_b, label) if c is not None]
  rows = _table_rows(path, wanted, skip_bad_lines)
  examples = []
  for n, (line_no, row) in enumerate(rows):
    value = None
    if label is not None:
      value = check_label(row[label], labels, regression, path, line_no, label)
    examples.append(Example(guid=f'{os.path.basename(path)}-{n}', text_a=row[text_a],
                            text_b=row[text_b] if text_b else None, label=value, index=n))
  return require_examples(examples, path)


def _table_rows(path: str, wanted: list[str], skip_bad_lines: bool
                ) -> Iterator[tuple[int, dict[str, str]]]:
  if path.endswith('.jsonl'):
    return _jsonl_rows(path, wanted)
  if path.endswith('.csv'):
    return _delimited_rows(path, wanted, csv_fields, 'comma-separated', skip_bad_lines)
  if path.endswith('.tsv'):
    return _delimited_rows(path, wanted, _tsv_fields, 'tab-separated', skip_bad_lines)
  raise data_error(path, None, None, 'unknown table format; name the file .csv, .tsv or .jsonl')


def _tsv_fields(path: str) -> Iterator[tuple[int, list[str]]]:
  for line_no, text in read_lines(path):
    if text:
      yield line_no, text.split('\t')


def csv_fields(path: str) -> Iterator[tuple[int, list[str]]]:
  """CSV records with the line each starts on (a quoted field may span lines)."""
  for _ in read_lines(path):  # the encoding check, with line numbers
    pass
  with io.TextIOWrapper(fs.open_read(path, 'rb'), encoding='utf-8-sig', newline='') as f:
    reader = csv.reader(f)
    start = 1
    for fields in reader:
      if fields:
        yield start, fields
      start = reader.line_num + 1


def _delimited_rows(path, wanted, split_fields, kind, skip_bad_lines):
  records = split_fields(path)
  header_line, header = next(records, (1, None))
  if header is None:
    raise data_error(path, None, None, 'empty file (expected a header line naming the columns)')
  for column in wanted:
    if column not in header:
      raise data_error(path, header_line, column, f'no such column in the header {header}; '
                       'name the column as the header does')
  skipped = 0
  for line_no, fields in records:
    if len(fields) != len(header):
      if skip_bad_lines:
        skipped += 1
        continue
      raise data_error(path, line_no, None, f'expected {len(header)} {kind} columns (as the '
                       f'header has), found {len(fields)}; fix the row or skip bad lines')
    yield line_no, dict(zip(header, fields))
  if skipped:
    logging.warning('%s: skipped %d rows with the wrong number of columns', path, skipped)


def jsonl_objects(path: str) -> Iterator[tuple[int, dict]]:
  """(line number, object) of every non-blank line of a .jsonl file; a line that is not a
  JSON object is an error naming the file and line."""
  for line_no, text in read_lines(path):
    if not text.strip():
      continue
    try:
      row = json.loads(text)
    except json.JSONDecodeError as e:
      raise data_error(path, line_no, None, f'not JSON ({e.msg} at column {e.colno})') from None
    if not isinstance(row, dict):
      raise data_error(path, line_no, None, 'expected a JSON object per line')
    yield line_no, row


def _jsonl_rows(path, wanted):
  for line_no, row in jsonl_objects(path):
    for column in wanted:
      if column not in row:
        raise data_error(path, line_no, column, f'missing; the object has {sorted(row)}')
      if row[column] is None or isinstance(row[column], (dict, list)):
        raise data_error(path, line_no, column, f'expected a string or number, got {row[column]!r}')
    yield line_no, {c: str(row[c]) for c in wanted}
