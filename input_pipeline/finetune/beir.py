"""A retrieval set in BEIR's layout (Thakur et al. 2021, the `beir` package's GenericDataLoader):

  <dir>/corpus.jsonl        {"_id": ..., "title": ..., "text": ...} per line (title optional)
  <dir>/queries.jsonl       {"_id": ..., "text": ...} per line
  <dir>/qrels/<split>.tsv   a header line, then `query-id<TAB>corpus-id<TAB>score` per line,
                            the score an integer grade (0: judged not relevant)

read as a `pairs.RetrievalSplit`: the queries that have qrels in the split (BEIR's loader keeps
only those), in qrels order, the whole corpus in file order, and per query its graded
{document index: grade}, which `retrieval.retrieval_metrics` scores as pytrec_eval does. A
document's text is `title + ' ' + text`, stripped, as BEIR's dense models embed it. Ids may be
JSON strings or integers (compared as strings, as the qrels file holds them).

Strict, as the other readers: a line that is not a JSON object, a missing or non-string field,
a repeated id, a qrels row without three columns, a non-integer score, or a qrels id that is not
in the corpus or the queries is a `ValueError` naming the file, the line and the fix.
"""

from __future__ import annotations

from input_pipeline import fs
from input_pipeline.finetune.pairs import RetrievalSplit
from input_pipeline.finetune.records import data_error, jsonl_objects, read_lines

CORPUS, QUERIES, QRELS = 'corpus.jsonl', 'queries.jsonl', 'qrels'


def is_beir_dir(path: str) -> bool:
  """Does `path` hold a BEIR set (a corpus.jsonl)?"""
  return fs.isdir(path) and fs.exists(fs.join(path, CORPUS))


def _id(path: str, line: int, obj: dict) -> str:
  value = obj.get('_id')
  if isinstance(value, bool) or not isinstance(value, (str, int)) or value == '':
    raise data_error(path, line, '_id', f'expected a non-empty string or integer id, got '
                     f'{value!r}; the object has {sorted(obj)}')
  return str(value)


def _text(path: str, line: int, obj: dict, field: str, required: bool) -> str:
  value = obj.get(field)
  if value is None and not required:
    return ''
  if not isinstance(value, str):
    what = 'missing' if value is None else f'expected a string, got {value!r}'
    raise data_error(path, line, field, f'{what}; the object has {sorted(obj)}')
  return value


def _objects(path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()):
  """(id, {field: text}) per line, ids unique."""
  seen: dict[str, int] = {}
  for line, obj in jsonl_objects(path):
    key = _id(path, line, obj)
    if key in seen:
      raise data_error(path, line, '_id', f'{key!r} repeats line {seen[key]}; ids must be '
                       'unique')
    seen[key] = line
    yield key, {f: _text(path, line, obj, f, f in required) for f in required + optional}


def read_documents(directory: str) -> tuple[list[str], list[str]]:
  """(ids, texts) of corpus.jsonl, in file order; a text is `title + ' ' + text`, stripped."""
  ids, texts = [], []
  for key, fields in _objects(fs.join(directory, CORPUS), ('text',), ('title',)):
    ids.append(key)
    texts.append(f'{fields["title"]} {fields["text"]}'.strip())
  return ids, texts


def read_qrels(path: str, queries=None, corpus=None) -> dict[str, dict[str, int]]:
  """{query id: {corpus id: grade}} in file order; the first line is the header. `queries` /
  `corpus`: the ids a row may name (None: any)."""
  qrels: dict[str, dict[str, int]] = {}
  lines = ((n, t) for n, t in read_lines(path) if t.strip())
  if next(lines, None) is None:
    raise data_error(path, None, None, 'empty file (expected a header line, then query-id, '
                     'corpus-id and score per line, tab-separated)')
  for line, text in lines:
    fields = text.split('\t')
    if len(fields) != 3:
      raise data_error(path, line, None, f'expected 3 tab-separated columns (query-id, '
                       f'corpus-id, score), found {len(fields)}')
    query, doc, score = fields
    try:
      grade = int(score)
    except ValueError:
      raise data_error(path, line, 'score', f'{score!r} is not an integer grade') from None
    for field, key, known, where in (('query-id', query, queries, QUERIES),
                                     ('corpus-id', doc, corpus, CORPUS)):
      if known is not None and key not in known:
        raise data_error(path, line, field, f'{key!r} is not an _id of {where}; fix the id or '
                         'drop the line')
    if doc in qrels.setdefault(query, {}):
      raise data_error(path, line, 'corpus-id', f'({query!r}, {doc!r}) is judged twice; keep '
                       'one line per pair')
    qrels[query][doc] = grade
  return qrels


def read_beir(directory: str, split: str = 'test') -> RetrievalSplit:
  """The queries, corpus and graded relevance of `split` (see the module docstring)."""
  qrels_path = fs.join(directory, QRELS, f'{split}.tsv')
  for path in (fs.join(directory, CORPUS), fs.join(directory, QUERIES), qrels_path):
    if not fs.exists(path):
      raise FileNotFoundError(f'{path}: no such file; a BEIR directory holds {CORPUS}, '
                              f'{QUERIES} and {QRELS}/<split>.tsv')
  doc_ids, corpus = read_documents(directory)
  queries = {key: f['text'] for key, f in _objects(fs.join(directory, QUERIES), ('text',))}
  index = {key: i for i, key in enumerate(doc_ids)}
  qrels = read_qrels(qrels_path, queries, index)
  if not qrels:
    raise data_error(qrels_path, None, None, 'no judgments: nothing to score')
  return RetrievalSplit([queries[q] for q in qrels], corpus,
                        [{index[d]: g for d, g in judged.items()} for judged in qrels.values()],
                        query_ids=list(qrels), doc_ids=doc_ids)
