"""Documents (lists of sentences) from text files, a TFDS dataset, or the embedded default.

Text files use the reference format: one sentence per line, a blank line between documents,
`.gz` read transparently, globs allowed. The embedded default corpus is the Python standard
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


@dataclasses.dataclass
class CorpusStats:
  files: int = 0
  lines: int = 0
  documents: int = 0
  empty_files: int = 0
  bad_lines: int = 0


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
                    stats: CorpusStats | None = None) -> Iterator[Document]:
  """Stream documents from reference-format files, one line in memory at a time."""
  stats = stats if stats is not None else CorpusStats()
  for path in expand_patterns(patterns):
    stats.files += 1
    doc: Document = []
    saw_text = False
    with _open_binary(path) as f:
      for line_no, raw in enumerate(f, 1):
        stats.lines += 1
        try:
          line = raw.decode('utf-8').strip()
        except UnicodeDecodeError as e:
          if skip_bad_lines:
            stats.bad_lines += 1
            continue
          raise ValueError(f'corpus file {path}, line {line_no}: not UTF-8 ({e.reason} at byte '
                           f'{e.start}); re-encode the file or pass --skip_bad_lines') from None
        if line:
          doc.append(line)
          saw_text = True
        elif doc:
          stats.documents += 1
          yield doc
          doc = []
    if doc:
      stats.documents += 1
      yield doc
    if not saw_text:
      stats.empty_files += 1


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
  from the vaderSentiment 3.3.2 sdist (`input_pipeline.tasks.mr.fetch_mr`). Ratings are dropped."""
  import io  # pylint: disable=g-import-not-at-top
  import tarfile  # pylint: disable=g-import-not-at-top
  from input_pipeline.tasks import mr  # pylint: disable=g-import-not-at-top
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
  ds = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
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
                         stats: CorpusStats | None = None) -> Iterator[Document]:
  """One source by flag: files, a TFDS name, or (neither given) the embedded corpus."""
  if input_file and tfds_name:
    raise ValueError('give either --input_file or --tfds_name, not both')
  if input_file:
    return read_text_files(input_file, skip_bad_lines=skip_bad_lines, stats=stats)
  if tfds_name:
    return tfds_documents(tfds_name, split=tfds_split, feature=tfds_feature,
                          data_dir=tfds_data_dir, stats=stats)
  return embedded_documents(stats=stats)


def write_text_file(documents: Iterable[Document], path: str) -> None:
  """Reference format, so any document stream can be fed to either implementation."""
  with fs.writer(path, 'w') as f:
    for doc in documents:
      f.write('\n'.join(doc) + '\n\n')
