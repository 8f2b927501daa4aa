"""CoNLL column files (and TFDS `conll2003`) as tagged sentences.

The format: one word per line, its fields separated by spaces or tabs; a blank line ends a
sentence; `-DOCSTART- ...` lines separate documents and are not sentences. The word is the
first field and the tag the last unless `label_column` says otherwise; the number of columns
is the file's own (that of its first word line), and every word line must have it:

  2 columns  `word TAG`                 most NER and POS files (WNUT, CoNLL-2002 Spanish)
  3 columns  `word POS NER`              CoNLL-2002 Dutch
  4 columns  `word POS chunk NER`        CoNLL-2003 English (POS and chunk tags are kept too)
  5 columns  `word lemma POS chunk NER`  CoNLL-2003 German

`label_column` (negative counts from the end) picks another tag column: -3 for the POS tags
of a 4-column file.

Tags are kept as the file gives them: the original `eng.train` is IOB1 (an entity starts with
I-, B- only between two adjacent entities of one type), most redistributions are BIO; POS tags
have no prefixes at all. `is_bio` decides from a label set whether entity F1
(`finetune.metrics.entity_f1`, conlleval's chunking, which scores IOB1 and BIO the same way) is
meaningful; `to_bio` rewrites IOB1 as BIO for a label set that wants every entity to start
with B-.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from input_pipeline.finetune.records import data_error, read_lines, require_examples, TaggedSentence

# The order of HuggingFace's `conll2003` dataset and of TFDS `conll2003` (ClassLabel names),
# so a head trained against either indexes the same way.
CONLL2003_LABELS = ('O', 'B-PER', 'I-PER', 'B-ORG', 'I-ORG', 'B-LOC', 'I-LOC', 'B-MISC',
                    'I-MISC')

# The prefixes conlleval's chunking (metrics.get_entities) understands: BIO, IOB1, IOE, IOBES.
_ENTITY_TAG = re.compile(r'^[BIES]-\S+$')
_LAYOUTS = {2: 'word TAG', 4: 'word POS chunk NER'}


def is_bio(labels: Sequence[str]) -> bool:
  """Is this an entity tag set (scored by entity F1) rather than bare tags (POS: NN, VBZ)?

  The rule: at least one label is B-/I-/E-/S-<type> and every other label is O. Any bare
  label (NN, or a mix such as B-PER with NNP) makes it a plain tag set, scored by token
  accuracy: chunking bare tags into "entities" would score nothing a user reads.
  """
  return (any(_ENTITY_TAG.match(t) for t in labels)
          and all(t == 'O' or _ENTITY_TAG.match(t) for t in labels))


def read_conll(path: str, *, label_column: int = -1, labels: Sequence[str] | None = None
               ) -> list[TaggedSentence]:
  """Sentences of a CoNLL file: words (column 0), tags (column `label_column`), and the POS
  and chunk columns when the file has CoNLL-2003's four.

  Every word line must have as many fields as the file's first word line; every tag must be
  in `labels` when given.
  """
  sentences, rows = [], []
  layout = None  # (number of columns, line that set it)
  for line_no, text in read_lines(path):
    fields = text.split()
    if not fields or fields[0] == '-DOCSTART-':
      _flush(rows, sentences, layout)
      continue
    if layout is None:
      layout = (len(fields), line_no)
      _check_label_column(label_column, len(fields), path, line_no)
    if len(fields) != layout[0]:
      raise data_error(path, line_no, None, _column_error(layout, len(fields), text))
    tag = fields[label_column]
    if labels is not None and tag not in labels:
      raise data_error(path, line_no, 'tag',
                       f'unknown tag {tag!r}; the labels are {list(labels)}')
    rows.append((fields[0], tag, fields))
  _flush(rows, sentences, layout)
  return require_examples(sentences, path)


def _check_label_column(label_column: int, num_columns: int, path: str, line_no: int) -> None:
  if not -num_columns <= label_column < num_columns:
    raise data_error(path, line_no, None, f'label_column={label_column} is outside the file\'s '
                     f'{num_columns} columns; use 1..{num_columns - 1} or -1 (the last)')
  if label_column % num_columns == 0:
    raise data_error(path, line_no, None, f'label_column={label_column} is the word column; '
                     'use -1 (the last) or the tag column\'s index')


def _column_error(layout: tuple[int, int], found: int, text: str) -> str:
  expected, first = layout
  name = _LAYOUTS.get(expected, 'word ... TAG')
  return (f'expected {expected} space-separated columns ({name}), found {found}: {text!r}; '
          f'the file\'s first word line (line {first}) sets the column count for every line')


def _flush(rows: list, sentences: list, layout: tuple[int, int] | None) -> None:
  if not rows:
    return
  words = tuple(r[0] for r in rows)
  tags = tuple(r[1] for r in rows)
  pos = chunks = None
  if layout[0] == 4:
    pos, chunks = tuple(r[2][1] for r in rows), tuple(r[2][2] for r in rows)
  sentences.append(TaggedSentence(words, tags, pos, chunks))
  rows.clear()


def to_bio(tags: Sequence[str]) -> tuple[str, ...]:
  """IOB1 -> BIO: an I-X that starts an entity (after O or another type) becomes B-X."""
  out, prev = [], 'O'
  for tag in tags:
    if tag.startswith('I-') and (prev == 'O' or prev[2:] != tag[2:]):
      tag = 'B-' + tag[2:]
    out.append(tag)
    prev = tag
  return tuple(out)


def read_tfds_conll(split: str, *, name: str = 'conll2003', data_dir: str | None = None
                    ) -> list[TaggedSentence]:
  """Sentences from TFDS `conll2003` (splits train, dev, test); tag ids mapped to names."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  ds, info = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False,
                       with_info=True)
  names = {k: info.features[k].feature.names for k in ('ner', 'pos', 'chunks')}
  out = []
  for ex in tfds.as_numpy(ds):
    words = tuple(w.decode('utf-8') for w in ex['tokens'])
    tag = lambda k: tuple(names[k][int(i)] for i in ex[k])  # pylint: disable=cell-var-from-loop
    out.append(TaggedSentence(words, tag('ner'), tag('pos'), tag('chunks')))
  return require_examples(out, f'TFDS {name} split {split}')
