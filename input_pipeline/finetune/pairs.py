"""Text pairs for sentence embeddings: (query, positive[, hard negative]) files, retrieval eval
splits, and a pair set made on this machine by the Inverse Cloze Task.

Files: `.tsv` (a header naming `query`, `positive` and optionally `negative`; plain tab-split,
no quoting, as GLUE writes; other columns ignored) or `.jsonl` (one object per line with those
keys). Either every row has a negative or none does: a batch holds the same number of texts
per row. Readers are strict, as `records.py`'s: a missing column, an empty text or a wrong
column count is a `ValueError` naming the file, the line and what to do.

An eval split is the same file read for retrieval (`read_retrieval_split`): the queries are
the distinct query texts, the corpus every distinct positive and negative text, and a query's
relevant documents the positives of its rows (BEIR's layout: queries, corpus, qrels).

`inverse_cloze_pairs` is the Inverse Cloze Task of Lee et al. 2019 (ORQA, "Latent Retrieval for
Weakly Supervised Open Domain Question Answering", section 6.2): a random sentence of a passage
is the pseudo-query and the rest of the passage its positive; the sentence is left in the
passage 10% of the time (their rate), so that word overlap still counts for something.
`write_demo_pairs` makes train/dev/test files of it from the ICWSM-2014 opinion snippets
(NYT editorials and Amazon reviews: running prose, from the download `tasks/mr.py` makes) or,
with nothing to download, the standard library's docstrings (terser, code-flavoured text).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from input_pipeline import fs
from input_pipeline.finetune.records import (data_error, jsonl_objects, read_lines,
                                             require_examples)

QUERY, POSITIVE, NEGATIVE = 'query', 'positive', 'negative'
FORMATS = ('.tsv', '.jsonl')


@dataclasses.dataclass(frozen=True)
class TextPair:
  """A query, the text it should retrieve, an optional hard negative (a text it should not),
  and the row's number among the file's data rows."""
  query: str
  positive: str
  negative: str | None
  index: int


@dataclasses.dataclass(frozen=True)
class RetrievalSplit:
  """Queries, the corpus they search, and per query its relevant corpus indices: a set, or
  {index: grade} where the judgments are graded (a BEIR set, input_pipeline/finetune/beir.py,
  which also names its queries and documents by their ids)."""
  queries: list[str]
  corpus: list[str]
  relevant: list[set[int]] | list[dict[int, int]]
  query_ids: list[str] | None = None
  doc_ids: list[str] | None = None

  def __len__(self) -> int:  # its queries, as a split's records count its examples
    return len(self.queries)


# ----------------------------------------------------------------------------- reading


def read_pairs(path: str) -> list[TextPair]:
  """The pairs of a `.tsv` or `.jsonl` file (see the module docstring)."""
  if path.endswith('.tsv'):
    rows = _tsv_rows(path)
  elif path.endswith('.jsonl'):
    rows = _jsonl_rows(path)
  else:
    raise data_error(path, None, None, 'unknown pair file format; name it .tsv (a header '
                     'naming query, positive[, negative]) or .jsonl (objects with those keys)')
  pairs, with_negative = [], None
  for n, (line, row) in enumerate(rows):
    for field in (QUERY, POSITIVE, NEGATIVE):
      if field in row and not row[field].strip():
        raise data_error(path, line, field, 'empty text; drop the row or fill it in')
    has = NEGATIVE in row
    if with_negative is None:
      with_negative = (has, line)
    elif has != with_negative[0]:
      first, this = ('a negative', 'none') if with_negative[0] else ('no negative', 'one')
      raise data_error(path, line, NEGATIVE, f'line {with_negative[1]} has {first} and this '
                       f'one has {this}; give every row a negative, or none')
    pairs.append(TextPair(row[QUERY], row[POSITIVE], row.get(NEGATIVE), n))
  return require_examples(pairs, path)


def _tsv_rows(path: str) -> Iterator[tuple[int, dict[str, str]]]:
  lines = ((n, text) for n, text in read_lines(path) if text)
  header_line, header = next(((n, text.split('\t')) for n, text in lines), (1, None))
  if header is None:
    raise data_error(path, None, None, 'empty file (expected a header line naming the columns '
                     'query, positive[, negative])')
  for column in (QUERY, POSITIVE):
    if column not in header:
      raise data_error(path, header_line, column, f'no such column in the header {header}; '
                       'name the columns query, positive and optionally negative, '
                       'tab-separated')
  wanted = [c for c in (QUERY, POSITIVE, NEGATIVE) if c in header]
  for line, text in lines:
    fields = text.split('\t')
    if len(fields) != len(header):
      raise data_error(path, line, None, f'expected {len(header)} tab-separated columns (as '
                       f'the header has), found {len(fields)}; a text may not hold a tab')
    row = dict(zip(header, fields))
    yield line, {c: row[c] for c in wanted}


def _jsonl_rows(path: str) -> Iterator[tuple[int, dict[str, str]]]:
  for line, obj in jsonl_objects(path):
    row = {}
    for field in (QUERY, POSITIVE, NEGATIVE):
      value = obj.get(field)
      if value is None:
        if field != NEGATIVE:
          raise data_error(path, line, field, f'missing; the object has {sorted(obj)}')
        continue
      if not isinstance(value, str):
        raise data_error(path, line, field, f'expected a string, got {value!r}')
      row[field] = value
    yield line, row


def read_retrieval_split(path: str) -> RetrievalSplit:
  """A pair file as a retrieval task. Rows with the same query text are one query (its
  positives all relevant); the corpus is every distinct positive and negative text, in the
  order first seen. A negative is a distractor, relevant to no query it is a negative of."""
  queries: dict[str, set[int]] = {}
  corpus: dict[str, int] = {}
  for pair in read_pairs(path):
    for text in (pair.positive, pair.negative):
      if text is not None:
        corpus.setdefault(text, len(corpus))
    queries.setdefault(pair.query, set()).add(corpus[pair.positive])
  return RetrievalSplit(list(queries), list(corpus), list(queries.values()))


# ----------------------------------------------------------------------------- the ICT


def passages(document: Sequence[str], max_sentences: int = 6, min_sentences: int = 3
             ) -> list[list[str]]:
  """A document's sentences cut into consecutive passages of near-equal length, each at most
  `max_sentences` long; none when the document has fewer than `min_sentences`."""
  n = len(document)
  if n < min_sentences:
    return []
  parts = -(-n // max_sentences)
  return [list(document[p[0]:p[-1] + 1]) for p in np.array_split(np.arange(n), parts)
          if len(p) >= min_sentences]


def inverse_cloze_pairs(documents: Iterable[Sequence[str]], seed: int | str, *,
                        max_sentences: int = 6, min_sentences: int = 3,
                        min_query_words: int = 4, keep_query_probability: float = 0.1,
                        hard_negatives: bool = False) -> list[TextPair]:
  """ICT pairs of `documents` (lists of sentences), one per passage (`passages`).

  The query is a random sentence of the passage (one of at least `min_query_words` words; a
  passage without one gives no pair), the positive the passage's other sentences, or the whole
  passage with probability `keep_query_probability`. With `hard_negatives`, the negative is
  the next passage of the same document (the previous, for the last), and passages of
  one-passage documents give no pair. The same documents and seed give the same pairs.
  """
  rng = random.Random(seed)
  out = []
  for document in documents:
    cut = passages(document, max_sentences, min_sentences)
    for i, passage in enumerate(cut):
      choices = [j for j, s in enumerate(passage) if len(s.split()) >= min_query_words]
      if not choices or (hard_negatives and len(cut) < 2):
        continue
      j = rng.choice(choices)
      keep = rng.random() < keep_query_probability
      rest = passage if keep else passage[:j] + passage[j + 1:]
      negative = None
      if hard_negatives:
        negative = _text(cut[i + 1] if i + 1 < len(cut) else cut[i - 1])
      out.append(TextPair(_text([passage[j]]), _text(rest), negative, len(out)))
  return out


def _text(sentences: Sequence[str]) -> str:
  """Sentences joined on one line (a TSV cell holds no tab or newline)."""
  return ' '.join(' '.join(sentences).split())


# ----------------------------------------------------------------------------- demo files

DEMO_SOURCES = ('docstrings', 'opinion')
SPLITS = ('train', 'dev', 'test')


def _demo_units(source: str, mr_cache_dir: str | None) -> Iterator[list[list[str]]]:
  """Units that never straddle two splits, each a list of documents: a standard-library module
  (its docstrings, each a document) or one opinion editorial, review or tweet."""
  from input_pipeline.pretrain import corpus  # pylint: disable=g-import-not-at-top
  if source == 'opinion':
    if not mr_cache_dir:
      raise ValueError('source=opinion reads the ICWSM-2014 snippets of the vaderSentiment '
                       'sdist: pass mr_cache_dir (where tasks/mr.py fetch_mr keeps it)')
    from input_pipeline.finetune import mr  # pylint: disable=g-import-not-at-top
    for document in corpus.opinion_documents(mr.fetch_mr(mr_cache_dir)):
      yield [document]
    return
  stats = corpus.CorpusStats()
  module, current = [], None
  for docstring in corpus.embedded_documents(stats):
    if stats.files != current and module:
      yield module
      module = []
    current = stats.files
    module.append(docstring)
  if module:
    yield module


def demo_pairs(mr_cache_dir: str | None, *, source: str = 'opinion', seed: int = 0,
               train_pairs: int = 400, eval_queries: int = 100) -> dict[str, list[TextPair]]:
  """ICT train/dev/test pairs: units (`_demo_units`) drawn to a split at random (in proportion
  to the sizes wanted) until every split is full, so no module or review is in two splits. A
  document seen before (the standard library copies some docstrings: `_py_abc` and `abc`) and
  a query or positive text used before are skipped, so no passage is in two splits either.
  Dev and test never keep the query in its passage."""
  if source not in DEMO_SOURCES:
    raise ValueError(f'source={source!r}: expected one of {DEMO_SOURCES}')
  want = {'train': train_pairs, 'dev': eval_queries, 'test': eval_queries}
  out: dict[str, list[TextPair]] = {s: [] for s in SPLITS}
  seen, seen_documents = set(), set()
  rng = random.Random(seed)
  for n, unit in enumerate(_demo_units(source, mr_cache_dir)):
    if all(len(out[s]) >= want[s] for s in SPLITS):
      break
    split = rng.choices(SPLITS, weights=[want[s] for s in SPLITS])[0]
    if len(out[split]) >= want[split]:
      continue
    keep = 0.1 if split == 'train' else 0.0
    unit = [d for d in unit if _text(d) not in seen_documents]
    seen_documents.update(_text(d) for d in unit)
    for pair in inverse_cloze_pairs(unit, f'{seed}:{n}', keep_query_probability=keep):
      if pair.query in seen or pair.positive in seen:
        continue
      seen.update((pair.query, pair.positive))
      out[split].append(dataclasses.replace(pair, index=len(out[split])))
  short = [s for s in SPLITS if len(out[s]) < want[s]]
  if short:
    got = ', '.join(f'{len(out[s])} {s}' for s in short)
    raise ValueError(f'the {source} source gave only {got} pairs; ask for fewer')
  return {s: out[s][:want[s]] for s in SPLITS}


def write_pairs(pairs: Sequence[TextPair], path: str) -> str:
  """A `.tsv` pair file `read_pairs` reads back (the negative column only if pairs have one)."""
  negatives = any(p.negative is not None for p in pairs)
  header = [QUERY, POSITIVE] + ([NEGATIVE] if negatives else [])
  lines = ['\t'.join(header)]
  for p in pairs:
    texts = [p.query, p.positive] + ([p.negative] if negatives else [])
    if any('\t' in t or '\n' in t for t in texts):
      raise ValueError(f'pair {p.index}: a text holds a tab or newline, which a .tsv cannot')
    lines.append('\t'.join(texts))
  fs.write_text(path, '\n'.join(lines) + '\n')
  return path


def write_demo_pairs(directory: str, mr_cache_dir: str | None, *, source: str = 'opinion',
                     seed: int = 0, train_pairs: int = 400, eval_queries: int = 100
                     ) -> dict[str, str]:
  """train.tsv, dev.tsv and test.tsv of `demo_pairs` under `directory`; returns their paths.
  `source='opinion'` fetches the vaderSentiment sdist into `mr_cache_dir` unless it is there;
  'docstrings' needs nothing but Python (mr_cache_dir may be None)."""
  splits = demo_pairs(mr_cache_dir, source=source, seed=seed, train_pairs=train_pairs,
                      eval_queries=eval_queries)
  fs.makedirs(directory)
  return {s: write_pairs(splits[s], fs.join(directory, f'{s}.tsv')) for s in SPLITS}
