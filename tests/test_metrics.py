"""Fine-tuning metrics against scikit-learn, scipy, seqeval and the official SQuAD rules."""

import math

import numpy as np
import pytest

from bert_jax.finetune import metrics


def _cases(kind, n_cases=20):
  rng = np.random.default_rng(0)
  for _ in range(n_cases):
    n = int(rng.integers(2, 200))
    if kind == 'binary':
      yield rng.integers(0, 2, n), rng.integers(0, 2, n)
    elif kind == 'multi':
      yield rng.integers(0, 4, n), rng.integers(0, 4, n)
    else:  # floats with ties, as STS-B's 0.2-step scores
      x = np.round(rng.random(n) * 5, 1)
      yield x, np.round(x + rng.normal(0, 1.5, n), 1)


def test_classification_metrics_equal_scikit_learn():
  from sklearn import metrics as sk  # requirements-dev.txt
  for y, p in _cases('binary'):
    assert metrics.accuracy(y, p) == pytest.approx(sk.accuracy_score(y, p), abs=1e-12)
    assert metrics.f1_binary(y, p) == pytest.approx(sk.f1_score(y, p), abs=1e-12)
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(sk.matthews_corrcoef(y, p), abs=1e-12)
  for y, p in _cases('multi'):
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(sk.matthews_corrcoef(y, p), abs=1e-12)
  # Degenerate cases: nothing predicted positive, one class only.
  y, p = np.array([1, 0, 1, 0]), np.zeros(4, int)
  assert metrics.f1_binary(y, p) == sk.f1_score(y, p, zero_division=0) == 0.0
  assert metrics.matthews_corrcoef(y, p) == sk.matthews_corrcoef(y, p) == 0.0
  assert metrics.matthews_corrcoef(['a', 'b', 'a'], ['a', 'b', 'a']) == 1.0


def test_correlations_equal_scipy():
  from scipy import stats
  for x, y in _cases('float'):
    assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
  assert math.isnan(metrics.pearson([1, 2, 3], [2, 2, 2]))
  with pytest.raises(ValueError, match='1-D of one length'):
    metrics.pearson([1, 2], [1, 2, 3])


def test_glue_metric_table_and_scores():
  assert metrics.GLUE_METRICS['MRPC'] == metrics.TaskMetrics(('f1', 'accuracy'), 'f1')
  assert metrics.GLUE_METRICS['STS-B'].headline == 'spearman'
  assert metrics.GLUE_METRICS['CoLA'].metrics == ('mcc',)
  assert set(metrics.GLUE_METRICS) == {'CoLA', 'SST-2', 'MRPC', 'QQP', 'STS-B', 'MNLI-m',
                                       'MNLI-mm', 'QNLI', 'RTE', 'WNLI', 'AX'}
  y, p = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
  got = metrics.glue_metrics('MRPC', y, p)
  assert got['accuracy'] == 0.6 and got['f1'] == pytest.approx(2 / 3)
  assert got['headline'] == got['f1'] and got['score'] == pytest.approx((0.6 + 2 / 3) / 2)
  got = metrics.glue_metrics('STS-B', [0.0, 1.0, 2.0, 5.0], [0.1, 0.9, 2.5, 4.0])
  assert got['spearman'] == pytest.approx(1.0) and got['headline'] == got['spearman']
  with pytest.raises(ValueError, match="unknown GLUE task 'MNLI'"):
    metrics.glue_metrics('MNLI', y, p)


def test_baselines():
  train = ['0', '1', '1', '2', '1']
  assert metrics.majority_class(train) == '1'
  assert metrics.majority_class([2, 0, 2, 0]) == 0  # ties: the smallest
  preds = metrics.baseline_predictions(np.array([1, 0, 1]), 4)
  assert preds.tolist() == [1, 1, 1, 1]
  assert metrics.accuracy([1, 0, 0, 1], preds) == 0.5
  assert metrics.glue_metrics('CoLA', [1, 0, 0, 1], preds)['mcc'] == 0.0
  mean = metrics.baseline_predictions([1.0, 2.0, 6.0], 2, regression=True)
  assert mean.tolist() == [3.0, 3.0]
  assert metrics.mean_squared_error([1.0, 5.0], mean) == 4.0


# ----------------------------------------------------------------------------- SQuAD


@pytest.mark.parametrize('text,normalized', [
    ('The Cat!', 'cat'),
    ('  a  an the ', ''),
    ('Theatre and anthem', 'theatre and anthem'),  # articles only as whole words
    ('"Blue Door".', 'blue door'),
    ("Steve Smith's", 'steve smiths'),
    ('1,000-meter run', '1000meter run'),
    ('Zürich – the city', 'zürich – city'),  # only ASCII punctuation goes
    ('An apple a day', 'apple day'),
])
def test_official_normalisation(text, normalized):
  assert metrics.normalize_answer(text) == normalized


def test_squad_v1_exact_and_f1():
  gold = {'q1': ['Denver Broncos', 'The Denver Broncos'], 'q2': ['cat sat on mat'],
          'q3': ['1895'], 'q4': ['Paris']}
  preds = {'q1': 'the denver broncos!', 'q2': 'the cat sat', 'q3': '1896'}
  assert metrics.squad_example_scores(gold['q2'], preds['q2']) == (0.0, pytest.approx(2 / 3))
  got = metrics.squad_evaluate(gold, preds)
  # q1 exact; q2 F1 2/3 (P=1, R=1/2); q3 0; q4 missing: 0.
  assert got['exact_match'] == pytest.approx(25.0)
  assert got['f1'] == pytest.approx(100 * (1 + 2 / 3) / 4)
  assert got['missing'] == 1
  assert metrics.squad_example_scores(['x y'], 'y x y') == (0.0, pytest.approx(0.8))
  # v1.1 has no empty-answer rule: an empty prediction scores 0 even against "the".
  assert metrics.squad_example_scores(['the'], '') == (1.0, 0.0)
  with pytest.raises(ValueError, match='q9 has no gold answers: .*version_2=True'):
    metrics.squad_evaluate({'q9': []}, {'q9': ''})


def test_squad_v2_has_ans_no_ans_breakdown():
  gold = {'a': ['Denver Broncos'], 'b': ['1895', '1895 AD'], 'c': [], 'd': [], 'e': ['the']}
  preds = {'a': 'Denver', 'b': '1895 AD', 'c': '', 'd': 'something', 'e': ''}
  got = metrics.squad_evaluate(gold, preds, version_2=True)
  # a: EM 0, F1 2/3; b: 1, 1; c: 1, 1 (both empty); d: 0, 0; e: gold "the" normalises to
  # nothing, so it is scored against "" and the empty prediction matches (1, 1).
  assert got['total'] == 5 and got['HasAns_total'] == 3 and got['NoAns_total'] == 2
  assert got['exact'] == pytest.approx(100 * 3 / 5)
  assert got['f1'] == pytest.approx(100 * (2 / 3 + 3) / 5)
  assert got['HasAns_exact'] == pytest.approx(100 * 2 / 3)
  assert got['HasAns_f1'] == pytest.approx(100 * (2 / 3 + 2) / 3)
  assert got['NoAns_exact'] == got['NoAns_f1'] == 50.0
  answerable = metrics.squad_evaluate({'a': ['x']}, {'a': 'x'}, version_2=True)
  assert 'NoAns_total' not in answerable and answerable['HasAns_exact'] == 100.0


def test_squad_v2_best_threshold_sweep():
  gold = {'a': ['x'], 'b': ['y'], 'c': [], 'd': []}
  preds = {'a': 'x', 'b': 'wrong', 'c': 'z', 'd': ''}
  # Null odds: answer below the threshold. Sweep: start at 2 (c, d right when all are "");
  # a(-3): +1 -> 3; c(-1): -1 -> 2; b(0): +0; d(2): +0. Best 3/4 at -3.
  odds = {'a': -3.0, 'b': 0.0, 'c': -1.0, 'd': 2.0}
  got = metrics.squad_v2_best_thresholds(gold, preds, odds)
  assert got == {'best_exact': 75.0, 'best_exact_thresh': -3.0, 'best_f1': 75.0,
                 'best_f1_thresh': -3.0}


# ----------------------------------------------------------------------------- CoNLL


@pytest.mark.parametrize('tags,entities', [
    (['B-PER', 'I-PER', 'O', 'B-LOC'], [('PER', 0, 1), ('LOC', 3, 3)]),
    (['I-PER', 'I-PER', 'B-PER', 'O'], [('PER', 0, 1), ('PER', 2, 2)]),  # IOB1
    (['I-ORG', 'I-LOC', 'I-LOC'], [('ORG', 0, 0), ('LOC', 1, 2)]),  # type change
    (['B-MISC', 'I-PER'], [('MISC', 0, 0), ('PER', 1, 1)]),  # conlleval: I-X after B-Y starts X
    (['S-PER', 'B-LOC', 'E-LOC', 'E-LOC'], [('PER', 0, 0), ('LOC', 1, 2), ('LOC', 3, 3)]),
    (['O', 'O'], []),
    (['B', 'I', 'O'], [('_', 0, 1)]),
])
def test_entities_follow_conlleval(tags, entities):
  assert metrics.get_entities(tags) == entities


def _random_tags(rng, n_sentences):
  vocab = ['O', 'O', 'O', 'B-PER', 'I-PER', 'B-LOC', 'I-LOC', 'I-ORG', 'B-MISC', 'E-LOC',
           'S-PER']
  return [[vocab[i] for i in rng.integers(0, len(vocab), int(rng.integers(1, 15)))]
          for _ in range(n_sentences)]


def test_entity_f1_equals_seqeval():
  from seqeval import metrics as seqeval  # requirements-dev.txt
  from seqeval.metrics.sequence_labeling import get_entities
  rng = np.random.default_rng(1)
  for _ in range(30):
    gold = _random_tags(rng, 8)
    pred = [[t if rng.random() < 0.7 else 'B-PER' for t in s] for s in gold]
    for sentence in gold + pred:
      assert metrics.get_entities(sentence) == get_entities(sentence)
    got = metrics.entity_f1(gold, pred)
    assert got['precision'] == pytest.approx(seqeval.precision_score(gold, pred), abs=1e-12)
    assert got['recall'] == pytest.approx(seqeval.recall_score(gold, pred), abs=1e-12)
    assert got['f1'] == pytest.approx(seqeval.f1_score(gold, pred), abs=1e-12)
    report = seqeval.classification_report(gold, pred, output_dict=True)
    for kind, scores in got['per_type'].items():
      assert scores['f1'] == pytest.approx(report[kind]['f1-score'], abs=1e-12)
      assert scores['support'] == report[kind]['support']


def test_entity_f1_by_hand_and_sentence_boundaries():
  gold = [['B-PER', 'I-PER', 'O'], ['I-LOC', 'O']]
  pred = [['B-PER', 'O', 'O'], ['B-LOC', 'O']]  # PER span wrong; LOC right (IOB1 vs BIO)
  got = metrics.entity_f1(gold, pred)
  assert (got['precision'], got['recall'], got['f1']) == (0.5, 0.5, 0.5)
  assert got['per_type']['LOC']['f1'] == 1.0 and got['per_type']['PER']['f1'] == 0.0
  # An entity never runs across a sentence boundary.
  assert metrics.entity_f1([['O', 'B-PER'], ['I-PER']], [['O', 'B-PER'], ['I-PER']])[
      'per_type']['PER']['support'] == 2
  with pytest.raises(ValueError, match='sentence 0: 2 gold tags but 1 predicted'):
    metrics.entity_f1([['O', 'O']], [['O']])


def test_token_accuracy_equals_seqeval_and_scikit_learn():
  from seqeval import metrics as seqeval
  from sklearn import metrics as sk
  rng = np.random.default_rng(2)
  pos = ['NN', 'NNP', 'VBZ', 'DT', 'JJ', '.', 'PRP$', '-LRB-']
  for _ in range(20):
    gold = [[pos[i] for i in rng.integers(0, len(pos), int(rng.integers(1, 12)))]
            for _ in range(int(rng.integers(1, 10)))]
    pred = [[t if rng.random() < 0.6 else pos[int(rng.integers(0, len(pos)))] for t in s]
            for s in gold]
    got = metrics.token_accuracy(gold, pred)
    assert got == pytest.approx(seqeval.accuracy_score(gold, pred), abs=1e-12)
    assert got == pytest.approx(sk.accuracy_score(sum(gold, []), sum(pred, [])), abs=1e-12)
  # Word-level over all sentences, not a mean of per-sentence accuracies: 3 of 4 words.
  gold, pred = [['NN'], ['DT', 'NN', 'VBZ']], [['VB'], ['DT', 'NN', 'VBZ']]
  assert metrics.token_accuracy(gold, pred) == 0.75
  with pytest.raises(ValueError, match='sentence 1: 2 gold tags but 1 predicted'):
    metrics.token_accuracy([['NN'], ['DT', 'NN']], [['NN'], ['DT']])
  with pytest.raises(ValueError, match='1 gold sentences but 2 predicted'):
    metrics.token_accuracy([['NN']], [['NN'], ['NN']])
  with pytest.raises(ValueError, match='no words to score'):
    metrics.token_accuracy([[]], [[]])
