"""CoNLL-2003 column files (and TFDS `conll2003`) as tagged sentences.

The format: one word per line, `word POS chunk NER` separated by single spaces; a blank line
ends a sentence; `-DOCSTART- -X- -X- O` lines separate documents and are not sentences. Tags
are kept as the file gives them: the original `eng.train` is IOB1 (an entity starts with I-,
B- only between two adjacent entities of one type), most redistributions are BIO. Entity F1
(`bert_jax.metrics.entity_f1`, conlleval's chunking) scores both the same way; `to_bio`
rewrites IOB1 as BIO for a label set that wants every entity to start with B-.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from input_pipeline.tasks import TaggedSentence, data_error, read_lines, require_examples

# The order of HuggingFace's `conll2003` dataset and of TFDS `conll2003` (ClassLabel names),
# so a head trained against either indexes the same way.
CONLL2003_LABELS = ('O', 'B-PER', 'I-PER', 'B-ORG', 'I-ORG', 'B-LOC', 'I-LOC', 'B-MISC',
                    'I-MISC')

_TAG = re.compile(r'^(O|[BIES]-\S+)$')


def read_conll(path: str, *, num_columns: int = 4, tag_column: int = -1,
               labels: Sequence[str] | None = None) -> list[TaggedSentence]:
  """Sentences of a CoNLL file: words, tags (column `tag_column`), and POS/chunk columns
  when the file has the CoNLL-2003 four.

  Every line must have `num_columns` space-separated fields; every tag must be O or B-/I-/E-/
  S-<type>, and in `labels` when given.
  """
  sentences, rows = [], []
  for line_no, text in read_lines(path):
    fields = text.split()
    if not fields:
      _flush(rows, sentences, num_columns)
      continue
    if fields[0] == '-DOCSTART-':
      _flush(rows, sentences, num_columns)
      continue
    if len(fields) != num_columns:
      raise data_error(path, line_no, None, f'expected {num_columns} space-separated columns '
                       f'(word POS chunk NER), found {len(fields)}: {text!r}')
    _check_tag(fields[tag_column], labels, path, line_no)
    rows.append((fields[0], fields[tag_column], fields))
  _flush(rows, sentences, num_columns)
  return require_examples(sentences, path)


def _check_tag(tag: str, labels, path: str, line_no: int) -> None:
  if not _TAG.match(tag):
    raise data_error(path, line_no, 'NER tag', f'{tag!r} is not a tag (O, B-X, I-X, E-X or '
                     'S-X): is tag_column right?')
  if labels is not None and tag not in labels:
    raise data_error(path, line_no, 'NER tag', f'unknown tag {tag!r}; the labels are '
                     f'{list(labels)}')


def _flush(rows: list, sentences: list, num_columns: int) -> None:
  if not rows:
    return
  words = tuple(r[0] for r in rows)
  tags = tuple(r[1] for r in rows)
  pos = chunks = None
  if num_columns == 4:
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
