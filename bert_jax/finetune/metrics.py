"""Fine-tuning metrics, in numpy: GLUE's, SQuAD's official EM/F1, CoNLL entity F1, baselines.

Each metric is defined as the reference implementation defines it, and the tests hold it to
that implementation: accuracy, binary F1 and Matthews correlation to scikit-learn's,
Pearson/Spearman to scipy's, SQuAD to the official evaluate-v1.1.py / evaluate-v2.0.py
(normalisation, max over gold answers, v2.0's empty gold for unanswerable questions and
HasAns/NoAns split), entity F1 to seqeval's default (conlleval-compatible) mode and token
accuracy (bare tag sets such as POS) to seqeval's accuracy_score. None of them
needs scikit-learn, scipy or seqeval at run time.

`GLUE_METRICS` says which metrics each GLUE task reports and which is its headline (the BERT
paper's: F1 for MRPC/QQP, Spearman for STS-B, Matthews correlation for CoLA, else accuracy);
the GLUE leaderboard scores a task by the mean of its metrics (`glue_metrics(...)['score']`).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
from collections.abc import Mapping, Sequence

import numpy as np

# ----------------------------------------------------------------------------- classification


def accuracy(labels, predictions) -> float:
  labels, predictions = _pair(labels, predictions)
  return float((labels == predictions).mean())


def f1_binary(labels, predictions, positive=1) -> float:
  """F1 of the positive class (MRPC, QQP); 0.0 when there are no true or predicted positives."""
  labels, predictions = _pair(labels, predictions)
  tp = np.sum((predictions == positive) & (labels == positive))
  predicted, actual = np.sum(predictions == positive), np.sum(labels == positive)
  return float(2 * tp / (predicted + actual)) if predicted + actual else 0.0


def matthews_corrcoef(labels, predictions) -> float:
  """Matthews correlation (CoLA), multi-class form; 0.0 when undefined (a constant column),
  as scikit-learn returns."""
  labels, predictions = _pair(labels, predictions)
  classes, y = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
  k = len(classes)
  confusion = np.zeros((k, k), np.float64)
  np.add.at(confusion, (y[:len(labels)], y[len(labels):]), 1)
  t, p = confusion.sum(1), confusion.sum(0)
  correct, n = np.trace(confusion), confusion.sum()
  cov_yp = correct * n - t @ p
  cov_yy, cov_pp = n * n - t @ t, n * n - p @ p
  if cov_yy * cov_pp == 0:
    return 0.0
  return float(cov_yp / np.sqrt(cov_yy * cov_pp))


def pearson(x, y) -> float:
  """Pearson's r; NaN when either side is constant (as scipy)."""
  x, y = _pair(x, y, float)
  x, y = x - x.mean(), y - y.mean()
  denominator = np.sqrt((x @ x) * (y @ y))
  return float(x @ y / denominator) if denominator else float('nan')


def spearman(x, y) -> float:
  """Spearman's rho: Pearson's r of the ranks, ties given their mean rank (as scipy)."""
  x, y = _pair(x, y, float)
  return pearson(_rank(x), _rank(y))


def _rank(x: np.ndarray) -> np.ndarray:
  order = np.argsort(x, kind='stable')
  sorted_x = x[order]
  starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
  group = np.cumsum(starts) - 1
  first = np.nonzero(starts)[0]
  last = np.r_[first[1:], len(x)] - 1
  ranks = np.empty(len(x))
  ranks[order] = (first[group] + last[group]) / 2 + 1
  return ranks


def _pair(a, b, dtype=None) -> tuple[np.ndarray, np.ndarray]:
  a, b = np.asarray(a, dtype), np.asarray(b, dtype)
  if a.shape != b.shape or a.ndim != 1:
    raise ValueError(f'labels and predictions must be 1-D of one length, got {a.shape} and '
                     f'{b.shape}')
  if not len(a):
    raise ValueError('no examples to score')
  return a, b


# ----------------------------------------------------------------------------- GLUE


@dataclasses.dataclass(frozen=True)
class TaskMetrics:
  metrics: tuple[str, ...]  # what the task reports
  headline: str  # the one number the BERT paper reports


GLUE_METRICS: dict[str, TaskMetrics] = {
    'CoLA': TaskMetrics(('mcc',), 'mcc'),
    'SST-2': TaskMetrics(('accuracy',), 'accuracy'),
    'MRPC': TaskMetrics(('f1', 'accuracy'), 'f1'),
    'QQP': TaskMetrics(('f1', 'accuracy'), 'f1'),
    'STS-B': TaskMetrics(('pearson', 'spearman'), 'spearman'),
    'MNLI-m': TaskMetrics(('accuracy',), 'accuracy'),
    'MNLI-mm': TaskMetrics(('accuracy',), 'accuracy'),
    'QNLI': TaskMetrics(('accuracy',), 'accuracy'),
    'RTE': TaskMetrics(('accuracy',), 'accuracy'),
    'WNLI': TaskMetrics(('accuracy',), 'accuracy'),
    'AX': TaskMetrics(('mcc',), 'mcc'),  # the diagnostic's R3
}
_METRIC_FNS = {'accuracy': accuracy, 'f1': f1_binary, 'mcc': matthews_corrcoef,
               'pearson': pearson, 'spearman': spearman}


def glue_metrics(task: str, labels, predictions) -> dict[str, float]:
  """The task's metrics, 'headline' and 'score' (their mean, the leaderboard's task score).

  `task` is a GLUE_METRICS key ('MNLI-m' for matched dev); labels and predictions are class
  ids (the positive class of MRPC/QQP is id 1, label '1'), or floats for STS-B.
  """
  if task not in GLUE_METRICS:
    raise ValueError(f'unknown GLUE task {task!r}; expected one of {list(GLUE_METRICS)}')
  spec = GLUE_METRICS[task]
  out = {m: _METRIC_FNS[m](labels, predictions) for m in spec.metrics}
  out['headline'] = out[spec.headline]
  out['score'] = float(np.mean([out[m] for m in spec.metrics]))
  return out


def majority_class(train_labels) -> int | str:
  """The most frequent training label (the smallest on ties, for determinism)."""
  values, counts = np.unique(np.asarray(train_labels), return_counts=True)
  return values[np.argmax(counts)].item()


def baseline_predictions(train_labels, num_eval: int, regression: bool = False) -> np.ndarray:
  """What a model that ignores its input predicts: the training set's majority class, or its
  mean target for regression (whose correlations are then undefined: NaN)."""
  if regression:
    return np.full(num_eval, float(np.mean(np.asarray(train_labels, float))))
  return np.full(num_eval, majority_class(train_labels))


def mean_squared_error(labels, predictions) -> float:
  labels, predictions = _pair(labels, predictions, float)
  return float(np.mean((labels - predictions) ** 2))


# ----------------------------------------------------------------------------- SQuAD

_ARTICLES = re.compile(r'\b(a|an|the)\b', re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
  """The official normalisation: lower case, drop punctuation, drop a/an/the, fix spaces."""
  s = ''.join(c for c in s.lower() if c not in _PUNCTUATION)
  return ' '.join(_ARTICLES.sub(' ', s).split())


def _token_f1(gold: str, prediction: str, v2: bool) -> float:
  gold_tokens, pred_tokens = normalize_answer(gold).split(), normalize_answer(prediction).split()
  if v2 and (not gold_tokens or not pred_tokens):
    return float(gold_tokens == pred_tokens)  # v2.0: both empty is a match
  common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_tokens), same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def squad_example_scores(gold: Sequence[str], prediction: str, v2: bool = False
                         ) -> tuple[float, float]:
  """(exact, f1) of one prediction: the max over gold answers. v2.0 drops gold answers that
  normalise to nothing and scores an unanswerable question against ""."""
  if v2:
    gold = [a for a in gold if normalize_answer(a)] or ['']
  exact = max(float(normalize_answer(a) == normalize_answer(prediction)) for a in gold)
  return exact, max(_token_f1(a, prediction, v2) for a in gold)


def squad_evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                   version_2: bool = False) -> dict[str, float]:
  """SQuAD scores in percent, keyed as the official scripts key them.

  v1.1: {'exact_match', 'f1'}. v2.0: {'exact', 'f1', 'total', 'HasAns_exact', 'HasAns_f1',
  'HasAns_total', 'NoAns_exact', 'NoAns_f1', 'NoAns_total'}, a question being HasAns when its
  gold answer list is non-empty. A question without a prediction scores 0, as in v1.1 (the
  v2.0 script fails on one); 'missing' counts them.
  """
  scores = {q: squad_example_scores(_gold_list(q, a, version_2), predictions[q], version_2)
            if q in predictions else (0.0, 0.0) for q, a in gold.items()}
  missing = sum(q not in predictions for q in gold)
  if not scores:
    raise ValueError('no gold questions to score')
  if not version_2:
    out = _totals(scores, scores, '')
    return {'exact_match': out['exact'], 'f1': out['f1'], 'missing': missing}
  out = _totals(scores, scores, '')
  has_answer = [q for q in scores if gold[q]]
  no_answer = [q for q in scores if not gold[q]]
  if has_answer:
    out.update(_totals(scores, has_answer, 'HasAns_'))
  if no_answer:
    out.update(_totals(scores, no_answer, 'NoAns_'))
  out['missing'] = missing
  return out


def _gold_list(qid: str, answers: Sequence[str], version_2: bool) -> Sequence[str]:
  if not answers and not version_2:
    raise ValueError(f'question {qid} has no gold answers: a SQuAD 2.0 set needs '
                     'version_2=True')
  return answers


def _totals(scores, qids, prefix: str) -> dict[str, float]:
  n = len(qids)
  return {f'{prefix}exact': 100.0 * sum(scores[q][0] for q in qids) / n,
          f'{prefix}f1': 100.0 * sum(scores[q][1] for q in qids) / n, f'{prefix}total': n}


def squad_gold_from_json(dataset) -> dict[str, list[str]]:
  """qid -> answer texts from a SQuAD JSON object (the whole file or its "data" list)."""
  articles = dataset['data'] if isinstance(dataset, dict) else dataset
  return {qa['id']: [a['text'] for a in qa['answers']]
          for article in articles for p in article['paragraphs'] for qa in p['qas']}


def squad_v2_best_thresholds(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                             null_odds: Mapping[str, float]) -> dict[str, float]:
  """The official v2.0 script's best thresholds: the `null_score_diff_threshold` that would
  maximise EM and F1 on this set, given each question's null odds (`SquadPredictions.null_odds`,
  the script's na_probs). Returns best_exact, best_exact_thresh, best_f1, best_f1_thresh."""
  scores = {q: squad_example_scores(a, predictions[q], True) for q, a in gold.items()
            if q in predictions}
  if not scores:
    raise ValueError('no predicted questions to score')
  out = {}
  for k, name in enumerate(('exact', 'f1')):
    best, thresh = _best_threshold(gold, scores, k, predictions, null_odds)
    out[f'best_{name}'], out[f'best_{name}_thresh'] = best, thresh
  return out


def _best_threshold(gold, scores, k, predictions, null_odds) -> tuple[float, float]:
  """Sweep the threshold up through the questions in null-odds order: below it every question
  answers "", so the score starts at the number of unanswerable questions."""
  current = best = sum(not answers for answers in gold.values())
  best_thresh = 0.0
  for q in sorted(null_odds, key=lambda q: null_odds[q]):
    if q not in scores:
      continue
    if gold[q]:
      current += scores[q][k]
    elif predictions[q]:
      current -= 1
    if current > best:
      best, best_thresh = current, null_odds[q]
  return 100.0 * best / len(scores), float(best_thresh)


# ----------------------------------------------------------------------------- CoNLL entities


def _split_tag(tag: str) -> tuple[str, str]:
  """('B', 'PER') from 'B-PER'; 'O' is ('O', '_'), a bare 'B' is ('B', '_')."""
  return tag[0], tag[1:].split('-', maxsplit=1)[-1] or '_'


# conlleval's chunk boundaries, as (previous tag, tag) prefix pairs.
_ENDS = {('B', 'B'), ('B', 'S'), ('B', 'O'), ('I', 'B'), ('I', 'S'), ('I', 'O')}
_STARTS = {('E', 'E'), ('E', 'I'), ('S', 'E'), ('S', 'I'), ('O', 'E'), ('O', 'I')}


def _chunk_ends(prev: tuple[str, str], cur: tuple[str, str]) -> bool:
  """Does a chunk end between `prev` and `cur`? After E or S always; after B or I when the
  next tag begins something else; and whenever the type changes."""
  return (prev[0] in 'ES' or (prev[0], cur[0]) in _ENDS
          or (prev[0] not in 'O.' and prev[1] != cur[1]))


def _chunk_starts(prev: tuple[str, str], cur: tuple[str, str]) -> bool:
  """Does a chunk start at `cur`? At B or S always; at I or E after O/E/S (an IOB1
  entity's first word); and whenever the type changes."""
  return (cur[0] in 'BS' or (prev[0], cur[0]) in _STARTS
          or (cur[0] not in 'O.' and prev[1] != cur[1]))


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """(type, first, last) chunks of one tag sequence, as conlleval / seqeval find them in
  BIO, IOB1, IOE and IOBES alike (an I-X after O starts an entity)."""
  chunks, prev, begin = [], ('O', '_'), 0
  for i, tag in enumerate(list(tags) + ['O']):
    cur = _split_tag(tag)
    if _chunk_ends(prev, cur):
      chunks.append((prev[1], begin, i - 1))
    if _chunk_starts(prev, cur):
      begin = i
    prev = cur
  return chunks


def entity_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
              ) -> dict[str, object]:
  """Micro precision/recall/F1 over exact entity matches (type and span), per sentence, with
  a per-type breakdown {type: {precision, recall, f1, support}}; undefined ratios are 0."""
  if len(gold) != len(predicted):
    raise ValueError(f'{len(gold)} gold sentences but {len(predicted)} predicted')
  true, pred = collections.defaultdict(set), collections.defaultdict(set)
  for n, (g, p) in enumerate(zip(gold, predicted)):
    if len(g) != len(p):
      raise ValueError(f'sentence {n}: {len(g)} gold tags but {len(p)} predicted')
    for kind, start, end in get_entities(g):
      true[kind].add((n, start, end))
    for kind, start, end in get_entities(p):
      pred[kind].add((n, start, end))
  per_type = {k: _prf(len(true[k] & pred[k]), len(pred[k]), len(true[k]))
              for k in sorted(set(true) | set(pred))}
  total = _prf(sum(len(true[k] & pred[k]) for k in per_type),
               sum(len(pred[k]) for k in per_type), sum(len(true[k]) for k in per_type))
  return {**total, 'per_type': per_type}


def _prf(tp: int, predicted: int, actual: int) -> dict[str, float]:
  precision = tp / predicted if predicted else 0.0
  recall = tp / actual if actual else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {'precision': precision, 'recall': recall, 'f1': f1, 'support': actual}


def token_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
  """The fraction of words whose predicted tag is the gold one, over all sentences: the POS
  tagging score (seqeval's `accuracy_score` on the same lists)."""
  if len(gold) != len(predicted):
    raise ValueError(f'{len(gold)} gold sentences but {len(predicted)} predicted')
  right = total = 0
  for n, (g, p) in enumerate(zip(gold, predicted)):
    if len(g) != len(p):
      raise ValueError(f'sentence {n}: {len(g)} gold tags but {len(p)} predicted')
    right += sum(a == b for a, b in zip(g, p))
    total += len(g)
  if not total:
    raise ValueError('no words to score')
  return right / total
