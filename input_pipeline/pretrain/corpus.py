"""Documents (lists of sentences) from text files, a TFDS dataset, or the embedded default.

Text files use the reference format: one sentence per line, a blank line between documents,
`.gz` read transparently, globs allowed. JSONL and Parquet files (`input_format`), the layout
HF datasets and the FineWeb/Dolma family publish, hold one document per record in a text
column (`text_field`), split into sentences like TFDS text. A corpus is a list of *units* (one
file, or one TFDS shard) read in order: the local tool reads them one after another, the Beam
pipeline (beam_pipeline.py) reads them on many workers, and both get the same documents.

A document that cannot be read (undecodable bytes, a record without its text field, a corrupt
file) fails loudly by default in the library; the data tool passes `bad_documents='skip'`,
which drops it whole and counts it (`CorpusStats.documents_failed`/`files_failed`, with the
first `MAX_FAILURES` reasons), so one bad document never kills a corpus-scale job. The embedded default corpus is the Python standard
library's own docstrings (about 260k words of real English technical prose), read from source
with `ast` (nothing imported, nothing downloaded), so it exists on every fresh machine.
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import os
import re
import sysconfig
import zlib
from collections.abc import Iterable, Iterator

from input_pipeline import fs

Document = list[str]

# Sentence ends: . ! ? (optionally closed by quotes/brackets) followed by space and a capital,
# digit or quote. Deliberately simple and documented; good enough for Wikipedia-like prose.
_SENTENCE_END = re.compile(r'(?<=[.!?])["\')\]]*\s+(?=["\'(\[]?[A-Z0-9])')


def split_sentences(text: str) -> list[str]:
  """Split running text into sentences (one paragraph per blank-line block)."""
  out = []
  for paragraph in re.split(r'\n\s*\n', text):
    paragraph = ' '.join(paragraph.split())
    if paragraph:
      out.extend(s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip())
  return out


MAX_FAILURES = 100  # reasons kept in CorpusStats.failures (the counts are always complete)
INPUT_FORMATS = ('text', 'jsonl', 'parquet')


@dataclasses.dataclass
class CorpusStats:
  files: int = 0
  lines: int = 0  # text lines, or JSONL/Parquet records
  documents: int = 0
  empty_files: int = 0
  bad_lines: int = 0
  documents_failed: int = 0  # dropped whole (bad_documents='skip')
  files_failed: int = 0  # unreadable past some point (corrupt gzip/Parquet); earlier documents kept
  failures: list = dataclasses.field(default_factory=list)  # 'file:line: reason', sorted, capped

  def fail(self, where: str, reason: str, *, file: bool = False) -> None:
    if file:
      self.files_failed += 1
    else:
      self.documents_failed += 1
    # The first MAX_FAILURES in sorted order: the same set however the corpus was split.
    self.failures = sorted(self.failures + [f'{where}: {reason}'])[:MAX_FAILURES]

  def merge(self, other: 'CorpusStats') -> None:
    for f in dataclasses.fields(self):
      if f.name != 'failures':
        setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
    self.failures = sorted(self.failures + other.failures)[:MAX_FAILURES]


@dataclasses.dataclass(frozen=True)
class ReadOptions:
  """How units are read: the corpus flags of the data tool, shared by both runners."""
  input_format: str = 'text'
  text_field: str = 'text'
  skip_bad_lines: bool = False
  bad_documents: str = 'fail'  # 'fail': raise on the first; 'skip': drop whole and count
  tfds_feature: str = 'text'
  tfds_data_dir: str | None = None


def expand_patterns(patterns: str | Iterable[str]) -> list[str]:
  """Comma-separated or listed globs -> sorted existing files; an unmatched glob is an error."""
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(',') if p.strip()]
  files = []
  for pattern in patterns:
    pattern = pattern.strip()
    matched = fs.glob(pattern if fs.is_url(pattern) else os.path.expanduser(pattern))
    if not matched:
      raise FileNotFoundError(f'input file {pattern!r}: no such file (or the glob matched none)')
    files.extend(f for f in matched if not fs.isdir(f))
  return files


def _open_binary(path: str):
  raw = fs.open_read(path, 'rb')
  return gzip.open(raw, 'rb') if path.endswith('.gz') else raw


def read_text_files(patterns: str | Iterable[str], *, skip_bad_lines: bool = False,
                    stats: CorpusStats | None = None, bad_documents: str = 'fail'
                    ) -> Iterator[Document]:
  """Stream documents from reference-format files, one line in memory at a time."""
  stats = stats if stats is not None else CorpusStats()
  options = ReadOptions(skip_bad_lines=skip_bad_lines, bad_documents=bad_documents)
  for path in expand_patterns(patterns):
    yield from read_unit(path, options, stats)


def _bad(options: ReadOptions, stats: CorpusStats, where: str, reason: str, hint: str,
         *, file: bool = False) -> None:
  if options.bad_documents != 'skip':
    raise ValueError(f'corpus file {where}: {reason}; {hint}') from None
  stats.fail(where, reason, file=file)


def _read_text_file(path: str, options: ReadOptions, stats: CorpusStats) -> Iterator[Document]:
  doc: Document = []
  saw_text = broken = False
  line_no = 0
  hint = 're-encode the file or pass --skip_bad_lines'
  try:
    with _open_binary(path) as f:
      for line_no, raw in enumerate(f, 1):
        stats.lines += 1
        try:
          line = raw.decode('utf-8').strip()
        except UnicodeDecodeError as e:
          if options.skip_bad_lines:
            stats.bad_lines += 1
            continue
          _bad(options, stats, f'{path}, line {line_no}',
               f'not UTF-8 ({e.reason} at byte {e.start})', hint)
          broken = True  # the rest of this document goes with it
          continue
        if line:
          if not broken:
            doc.append(line)
          saw_text = True
        elif doc or broken:
          if not broken:
            stats.documents += 1
            yield doc
          doc, broken = [], False
  except (OSError, EOFError, zlib.error) as e:  # corrupt gzip, truncated object
    _bad(options, stats, f'{path}, line {line_no + 1}', f'unreadable ({e})',
         'repair or remove the file', file=True)
    return
  if doc and not broken:
    stats.documents += 1
    yield doc
  if not saw_text:
    stats.empty_files += 1


def _record_documents(path: str, records: Iterator[tuple[int, object]], options: ReadOptions,
                      stats: CorpusStats) -> Iterator[Document]:
  """(record number, JSON object / column value or an exception) -> documents."""
  field = options.text_field
  saw_text = False
  for n, value in records:
    stats.lines += 1
    where = f'{path}, record {n}'
    if isinstance(value, Exception):
      _bad(options, stats, where, str(value), 'fix the record')
      continue
    if isinstance(value, dict):
      if field not in value:
        _bad(options, stats, where, f'no field {field!r} (it has {sorted(value)[:8]})',
             'pass --text_field')
        continue
      value = value[field]
    if value is None:
      continue
    if isinstance(value, bytes):
      try:
        value = value.decode('utf-8')
      except UnicodeDecodeError as e:
        _bad(options, stats, where, f'not UTF-8 ({e.reason} at byte {e.start})',
             're-encode the text')
        continue
    if not isinstance(value, str):
      _bad(options, stats, where, f'field {field!r} is {type(value).__name__}, not text',
           'pass --text_field')
      continue
    sentences = split_sentences(value)
    if sentences:
      saw_text = True
      stats.documents += 1
      yield sentences
  if not saw_text:
    stats.empty_files += 1


def _jsonl_records(path: str) -> Iterator[tuple[int, object]]:
  import json  # pylint: disable=g-import-not-at-top
  with _open_binary(path) as f:
    for n, raw in enumerate(f, 1):
      if not raw.strip():
        continue
      try:
        yield n, json.loads(raw)
      except ValueError as e:  # invalid JSON or undecodable bytes
        yield n, ValueError(f'not a JSON object ({str(e)[:80]})')


def _parquet_records(path: str, field: str) -> Iterator[tuple[int, object]]:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  with fs.open_read(path, 'rb') as f:
    table = pq.ParquetFile(f)
    if field not in table.schema_arrow.names:
      raise KeyError(f'Parquet file {path} has no column {field!r}; it has '
                     f'{table.schema_arrow.names}: pass --text_field')
    n = 0
    for batch in table.iter_batches(columns=[field], batch_size=1024):
      for value in batch.column(0).to_pylist():
        n += 1
        yield n, value


def _read_record_file(path: str, options: ReadOptions, stats: CorpusStats) -> Iterator[Document]:
  records = (_jsonl_records(path) if options.input_format == 'jsonl'
             else _parquet_records(path, options.text_field))
  try:
    yield from _record_documents(path, records, options, stats)
  except KeyError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # corrupt file: pyarrow, gzip, I/O
    if isinstance(e, ValueError) and options.bad_documents != 'skip':
      raise
    _bad(options, stats, path, f'unreadable ({type(e).__name__}: {str(e)[:200]})',
         'repair or remove the file', file=True)


TFDS_PREFIX = 'tfds:'
EMBEDDED = 'embedded:'  # the unit of the embedded default corpus


def read_unit(unit: str, options: ReadOptions, stats: CorpusStats) -> Iterator[Document]:
  """The documents of one unit: a file path, `tfds:NAME:SPLIT` or `embedded:` (source_units)."""
  if unit == EMBEDDED:
    yield from embedded_documents(stats=stats)
    return
  if unit.startswith(TFDS_PREFIX):
    name, split = unit[len(TFDS_PREFIX):].rsplit(':', 1)
    yield from tfds_documents(name, split=split, feature=options.tfds_feature,
                              data_dir=options.tfds_data_dir, stats=stats)
    return
  if options.input_format not in INPUT_FORMATS:
    raise ValueError(f'--input_format={options.input_format!r}: expected one of {INPUT_FORMATS}')
  stats.files += 1
  if options.input_format == 'text':
    yield from _read_text_file(unit, options, stats)
  else:
    yield from _read_record_file(unit, options, stats)


def source_units(input_file: str | None, tfds_name: str | None, *, tfds_split: str = 'train',
                 tfds_data_dir: str | None = None, by_tfds_shard: bool = False) -> list[str]:
  """The corpus as an ordered list of units: files (globs expanded, in order), or a TFDS split
  (`by_tfds_shard`: one unit per file shard of a plain split name, for parallel readers; read
  in order, the shards give the documents the whole split gives), or the embedded corpus."""
  if input_file and tfds_name:
    raise ValueError('give either --input_file or --tfds_name, not both')
  if input_file:
    return expand_patterns(input_file)
  if not tfds_name:
    return [EMBEDDED]
  if by_tfds_shard and re.fullmatch(r'\w+', tfds_split):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    shards = tfds.builder(tfds_name, data_dir=tfds_data_dir).info.splits[tfds_split].num_shards
    if shards > 1:
      return [f'{TFDS_PREFIX}{tfds_name}:{tfds_split}[{i}shard]' for i in range(shards)]
  return [f'{TFDS_PREFIX}{tfds_name}:{tfds_split}']


def embedded_documents(stats: CorpusStats | None = None, *, per_module: bool = False
                       ) -> Iterator[Document]:
  """Docstrings of the standard library, one document per module/class/function docstring
  of at least two sentences, in a fixed file order. `per_module=True` joins a module's
  docstrings (in `ast.walk` order) into one document: longer documents, so that NSP pairs can
  take their actual next segment instead of a random one."""
  stats = stats if stats is not None else CorpusStats()
  if per_module:
    yield from _per_module(stats)
    return
  root = sysconfig.get_paths()['stdlib']
  skip = ('test', 'idlelib', 'lib2to3', 'site-packages', 'turtledemo', 'ensurepip', 'tkinter')
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith(('_', '.')))
    for name in sorted(filenames):
      if not name.endswith('.py'):
        continue
      path = os.path.join(dirpath, name)
      try:
        with open(path, encoding='utf-8') as f:
          tree = ast.parse(f.read())
      except (SyntaxError, UnicodeDecodeError, OSError):
        continue
      stats.files += 1
      for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
          doc = ast.get_docstring(node)
          sentences = split_sentences(doc) if doc else []
          if len(sentences) >= 2:
            stats.documents += 1
            yield sentences


def _per_module(stats: CorpusStats) -> Iterator[Document]:
  module: Document = []
  last = None
  counted = CorpusStats()
  for doc in embedded_documents(counted):
    if counted.files != last and module:
      stats.documents += 1
      yield module
      module = []
    last = counted.files
    module.extend(doc)
  if module:
    stats.documents += 1
    yield module
  stats.files += counted.files


# Unlabelled opinion text of Hutto & Gilbert's ICWSM-2014 data (the archive tasks/mr.py
# reads MR from): NYT editorial and Amazon review snippets, whose ids `doc_sentence` keep each
# editorial/review's sentences together, and tweets (one per document). Movie-review snippets,
# MR's own sentences, are never read here.
OPINION_FILES = ('hutto_ICWSM_2014/nytEditorialSnippets_GroundTruth.txt',
                 'hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt',
                 'hutto_ICWSM_2014/tweets_GroundTruth.txt')


def opinion_documents(sdist: str, stats: CorpusStats | None = None) -> Iterator[Document]:
  """Documents (lists of sentences) of the ICWSM-2014 NYT editorial and Amazon review
  snippets (grouped by the id before `_`) and of its tweets (each split into sentences), read
  from the vaderSentiment 3.3.2 sdist (`input_pipeline.finetune.mr.fetch_mr`). Ratings are dropped."""
  import io  # pylint: disable=g-import-not-at-top
  import tarfile  # pylint: disable=g-import-not-at-top
  from input_pipeline.finetune import mr  # pylint: disable=g-import-not-at-top
  stats = stats if stats is not None else CorpusStats()
  with tarfile.open(sdist, 'r:gz') as outer:
    inner = outer.extractfile(mr.INNER_ARCHIVE).read()
  with tarfile.open(fileobj=io.BytesIO(inner), mode='r:gz') as tar:
    for name in OPINION_FILES:
      assert 'movieReview' not in name
      stats.files += 1
      doc: Document = []
      key = None
      for line in tar.extractfile(name).read().decode('utf-8', 'replace').splitlines():
        fields = line.strip().split('\t')
        if len(fields) != 3 or not fields[2].strip():
          continue
        stats.lines += 1
        doc_id = fields[0].split('_')[0] if '_' in fields[0] else fields[0]
        if doc_id != key and doc:
          stats.documents += 1
          yield doc
          doc = []
        key = doc_id
        doc.extend(split_sentences(fields[2]))
      if doc:
        stats.documents += 1
        yield doc


def tfds_documents(name: str, *, split: str = 'train', feature: str = 'text',
                   data_dir: str | None = None, stats: CorpusStats | None = None
                   ) -> Iterator[Document]:
  """Documents from any TFDS text dataset: each example's `feature` split into sentences."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  stats = stats if stats is not None else CorpusStats()
  # Files in order, not interleaved: the split's documents are then its shards' documents one
  # after another, which the Beam pipeline reads shard by shard.
  ds = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False,
                 read_config=tfds.ReadConfig(interleave_cycle_length=1))
  for example in tfds.as_numpy(ds):
    if feature not in example:
      raise KeyError(f'TFDS dataset {name!r} has no feature {feature!r}; it has '
                     f'{sorted(example)}: pass --tfds_feature')
    text = example[feature]
    sentences = split_sentences(text.decode('utf-8') if isinstance(text, bytes) else str(text))
    if sentences:
      stats.documents += 1
      yield sentences


def documents_from_flags(input_file: str | None, tfds_name: str | None, *,
                         tfds_split: str = 'train', tfds_feature: str = 'text',
                         tfds_data_dir: str | None = None, skip_bad_lines: bool = False,
                         stats: CorpusStats | None = None, input_format: str = 'text',
                         text_field: str = 'text', bad_documents: str = 'fail'
                         ) -> Iterator[Document]:
  """One source by flag: files, a TFDS name, or (neither given) the embedded corpus."""
  stats = stats if stats is not None else CorpusStats()
  units = source_units(input_file, tfds_name, tfds_split=tfds_split, tfds_data_dir=tfds_data_dir)
  options = ReadOptions(input_format=input_format, text_field=text_field,
                        skip_bad_lines=skip_bad_lines, bad_documents=bad_documents,
                        tfds_feature=tfds_feature, tfds_data_dir=tfds_data_dir)
  return (doc for unit in units for doc in read_unit(unit, options, stats))


def write_text_file(documents: Iterable[Document], path: str) -> None:
  """Reference format, so any document stream can be fed to either implementation."""
  with fs.writer(path, 'w') as f:
    for doc in documents:
      f.write('\n'.join(doc) + '\n\n')
