r"""Hard negatives for a pair file: (query, positive) pairs -> (query, positive, negative)
triplets the embedding task trains on (configs/finetune.py:embedding reads the .tsv).

  python -m bert_jax.finetune.mine --config=configs/finetune.py:embedding --init=runs/emb \
      --pairs=train.tsv --output=train_mined.tsv [--method=model|bm25] [--num_negatives=3] \
      [--range_min=0] [--range_max=N] [--absolute_margin=X | --relative_margin=X] \
      [--corpus=more.tsv]

The semantics are sentence-transformers' `util.mine_hard_negatives` (6.2,
sentence_transformers/util/hard_negatives.py, `sampling_strategy='top'`,
`output_format='triplet'`): the corpus is the `--corpus` texts (a pair file's positives and
negatives, or a BEIR corpus.jsonl) followed by the pairs' positives, de-duplicated; a repeated
query is one query with all its positives; each query's top `range_max + max_positives`
candidates are retrieved; its own positives are never candidates (so never counted in the
range); candidates closer to the query than its hardest (lowest-scoring) positive allows are
dropped: by `absolute_margin` (score + margin > positive score) and `relative_margin`
(score > positive - |positive| * margin); then `max_score` / `min_score`; of the rest, ranks
`range_min` .. `range_max` (0-based, best first) are kept and the first `num_negatives` of
those are the negatives; every (positive, negative) of a query is one triplet. `range_max`
defaults as there: `range_min + num_negatives + max_positives`, or `range_min +
10 * num_negatives + max_positives` when a margin or max_score may drop candidates.
Differences: ties go to the lower corpus index (torch's topk leaves them unspecified), and
candidates are scored by `--method`: the start point's cosine similarity (the embedding task's
prompts, pooling and max_seq_length; the search of bert_jax/finetune/search.py) or BM25
(bert_jax/finetune/retrieval.py's, one query's scores at a time).
"""

if __name__ == '__main__':  # before the heavy imports, as the other CLIs
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from absl import app, flags

METHODS = ('model', 'bm25')


@dataclasses.dataclass(frozen=True)
class MiningOptions:
  """sentence-transformers' mine_hard_negatives arguments of the same names."""
  num_negatives: int = 3
  range_min: int = 0
  range_max: int | None = None
  absolute_margin: float | None = None
  relative_margin: float | None = None
  max_score: float | None = None
  min_score: float | None = None

  def window(self, max_positives: int) -> int:
    """range_max, checked, defaulting as sentence-transformers does."""
    if self.num_negatives < 1:
      raise ValueError(f'num_negatives={self.num_negatives}: need at least 1')
    if self.range_min < 0:
      raise ValueError(f'range_min={self.range_min}: must be >= 0')
    range_max = self.range_max
    if range_max is None:
      drops = (self.absolute_margin, self.relative_margin, self.max_score)
      spread = 10 * self.num_negatives if any(x is not None for x in drops) else self.num_negatives
      range_max = self.range_min + spread + max_positives
    if self.range_min >= range_max:
      raise ValueError(f'range_min={self.range_min} must be below range_max={range_max}')
    if self.num_negatives > range_max - self.range_min:
      raise ValueError(f'cannot mine {self.num_negatives} negatives a query from ranks '
                       f'{self.range_min}..{range_max}; lower num_negatives or range_min, or '
                       'raise range_max')
    return range_max


# Scores the queries against the corpus: (k) -> ([Q, k] scores and [Q, k] corpus ids, best first,
# -1 past a corpus shorter than k; the scores of every query's positives, in `positives` order).
Scorer = Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class MiningInput:
  """Unique queries, the de-duplicated corpus, and each query's positives (corpus indices)."""
  queries: list[str]
  corpus: list[str]
  positives: list[list[int]]


def mining_input(pairs, corpus: Sequence[str] = ()) -> MiningInput:
  """sentence-transformers' corpus (the given texts, then the positives, de-duplicated in
  order) and its unique queries, each with its positives in first-seen order."""
  texts = list(dict.fromkeys(list(corpus) + [p.positive for p in pairs]))
  index = {t: i for i, t in enumerate(texts)}
  positives: dict[str, list[int]] = {}
  for p in pairs:
    own = positives.setdefault(p.query, [])
    if index[p.positive] not in own:
      own.append(index[p.positive])
  return MiningInput(list(positives), texts, list(positives.values()))


def mine_negatives(data: MiningInput, scorer: Scorer,
                   options: MiningOptions = MiningOptions()) -> list[list[int]]:
  """Per query, its negatives' corpus indices, best first (at most num_negatives)."""
  max_positives = max(len(p) for p in data.positives)
  range_max = options.window(max_positives)
  scores, ids, positive_scores = scorer(range_max + max_positives)
  scores = np.where(ids < 0, -np.inf, scores.astype(np.float64))
  for q, positives in enumerate(data.positives):
    scores[q, np.isin(ids[q], positives)] = -np.inf  # a positive is never a candidate
  query_of = np.repeat(np.arange(len(data.positives)), [len(p) for p in data.positives])
  hardest = np.array([np.min(np.asarray(positive_scores, np.float64)[query_of == q])
                      for q in range(len(data.positives))])[:, None]
  if options.absolute_margin is not None:
    scores[scores + options.absolute_margin > hardest] = -np.inf
  if options.relative_margin is not None:
    scores[scores > hardest - np.abs(hardest) * options.relative_margin] = -np.inf
  if options.max_score is not None:
    scores[scores > options.max_score] = -np.inf
  if options.min_score is not None:
    scores[scores < options.min_score] = -np.inf
  out = []
  for row, row_ids in zip(scores, ids):
    order = np.argsort(-row, kind='stable')[:range_max][options.range_min:]
    order = order[:options.num_negatives]
    out.append([int(row_ids[j]) for j in order if np.isfinite(row[j])])
  return out


def triplets(data: MiningInput, negatives: list[list[int]]):
  """The triplet rows: per query, per positive, per negative (sentence-transformers' order)."""
  from input_pipeline.finetune.pairs import TextPair  # pylint: disable=g-import-not-at-top
  out = []
  for query, positives, mined in zip(data.queries, data.positives, negatives):
    for p in positives:
      for n in mined:
        out.append(TextPair(query, data.corpus[p], data.corpus[n], len(out)))
  return out


def model_scorer(embedder, data: MiningInput) -> Scorer:
  """Cosine similarity of the start point's embeddings (queries with the query prompt,
  documents with the document prompt)."""
  from bert_jax.finetune import contrastive, search  # pylint: disable=g-import-not-at-top
  q = embedder.embed(data.queries, 'query')
  d = embedder.embed(data.corpus, 'document')

  def scorer(k):
    unit = lambda x: np.asarray(contrastive.normalize(x))
    query_of = np.repeat(np.arange(len(q)), [len(p) for p in data.positives])
    positive = np.sum(unit(q[query_of]) * unit(d[np.concatenate(data.positives)]), axis=-1)
    return (*_padded(*search.top_k(q, d, k), k), positive)
  return scorer


def bm25_scorer(data: MiningInput) -> Scorer:
  """BM25 (retrieval.py's: Lucene's formula, Elasticsearch's k1 and b), one query's [D]
  scores at a time."""
  from bert_jax.finetune import retrieval  # pylint: disable=g-import-not-at-top

  def scorer(k):
    kk = min(k, len(data.corpus))
    scores = np.zeros((len(data.queries), kk), np.float32)
    ids = np.zeros((len(data.queries), kk), np.int64)
    positive = []
    for q, row in enumerate(retrieval.lexical_rows(data.queries, data.corpus)):
      ids[q] = retrieval.top_k_row(row, kk)
      scores[q] = row[ids[q]]
      positive.extend(row[data.positives[q]])
    return (*_padded(scores, ids, k), np.array(positive))
  return scorer


def _padded(scores, ids, k):
  """[Q, k] with -1 ids (and -inf scores) past a corpus shorter than k."""
  missing = k - ids.shape[1]
  return (np.pad(scores, ((0, 0), (0, missing)), constant_values=-np.inf),
          np.pad(ids, ((0, 0), (0, missing)), constant_values=-1))


def read_corpus(path: str) -> list[str]:
  """Extra candidate texts: a pair file's positives and negatives, or a BEIR corpus.jsonl
  (a directory holding one: its documents)."""
  from input_pipeline.finetune import beir, pairs  # pylint: disable=g-import-not-at-top
  if beir.is_beir_dir(path):
    return beir.read_documents(path)[1]
  return list(dict.fromkeys(t for p in pairs.read_pairs(path)
                            for t in (p.positive, p.negative) if t is not None))


FLAGS = flags.FLAGS


def main(argv):
  from bert_jax.training import run_control  # pylint: disable=g-import-not-at-top
  from input_pipeline.finetune import pairs  # pylint: disable=g-import-not-at-top
  config = run_control.finetune_config(argv, FLAGS)
  options = MiningOptions(FLAGS.num_negatives, FLAGS.range_min, FLAGS.range_max,
                          FLAGS.absolute_margin, FLAGS.relative_margin, FLAGS.max_score,
                          FLAGS.min_score)
  with run_control.user_errors():
    given = pairs.read_pairs(FLAGS.pairs)
    data = mining_input(given, read_corpus(FLAGS.corpus) if FLAGS.corpus else ())
    if FLAGS.method == 'bm25':
      scorer = bm25_scorer(data)
    else:
      from bert_jax.finetune import embed  # pylint: disable=g-import-not-at-top
      scorer = model_scorer(embed.Embedder(config), data)
    negatives = mine_negatives(data, scorer, options)
    rows = triplets(data, negatives)
    if not rows:
      raise ValueError('no negative survived the filters; widen range_max or lower the margin')
    pairs.write_pairs(rows, FLAGS.output)
  found = sum(map(len, negatives))
  print(f'{FLAGS.output}: {len(rows)} triplets from {len(data.queries)} queries '
        f'({found / len(data.queries):.2f} negatives a query, {sum(not n for n in negatives)} '
        f'queries with none) over a corpus of {len(data.corpus)} texts ({FLAGS.method})')


def define_flags():
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file('config', None, 'configs/finetune.py:embedding (the model '
                                  'method embeds with its data.pooling, prompts, max_seq_length)')
  flags.DEFINE_string('init', None, 'The model: our workdir, a sentence-transformers or HF '
                      'directory (sets config.init); unused by --method=bm25.')
  flags.DEFINE_string('pairs', None, 'The (query, positive) pair file (.tsv or .jsonl).')
  flags.DEFINE_string('corpus', None, 'More candidate texts: a pair file or a BEIR directory.')
  flags.DEFINE_string('output', None, 'The triplet .tsv to write.')
  flags.DEFINE_enum('method', 'model', METHODS, 'Score candidates by the model or by BM25.')
  flags.DEFINE_integer('num_negatives', 3, 'Negatives a query (each a triplet per positive).')
  flags.DEFINE_integer('range_min', 0, 'Skip this many best candidates (0-based rank).')
  flags.DEFINE_integer('range_max', None, 'Consider candidates up to this rank (default: see '
                       'the module docstring).')
  flags.DEFINE_float('absolute_margin', None, 'Drop candidates with score + margin > the '
                     'positive\'s.')
  flags.DEFINE_float('relative_margin', None, 'Drop candidates scoring above positive - '
                     '|positive| * margin.')
  flags.DEFINE_float('max_score', None, 'Drop candidates scoring above this.')
  flags.DEFINE_float('min_score', None, 'Drop candidates scoring below this.')
  flags.mark_flags_as_required(['config', 'pairs', 'output'])


if __name__ == '__main__':
  define_flags()
  app.run(main)
