"""Span extraction (SQuAD 1.1 and 2.0): start and end logits per token (HF's
`BertForQuestionAnswering`), the mean of the start and end cross-entropies
(run_squad.py's `(start_loss + end_loss) / 2`; an unanswerable question or a window without
the answer points at position 0, [CLS]).

Windows come from run_squad.py's featurisation (input_pipeline/finetune/squad.py), answers from
its post-processing (bert_jax/finetune/squad_answers.py), scores from the official scripts
(EM and F1; SQuAD 2.0's best null thresholds too) as fractions, like every other kind's. The
baseline answers nothing.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.finetune import metrics, squad_answers
from bert_jax.finetune.kinds import base
from bert_jax.model import heads
from input_pipeline.finetune import squad

# The official SQuAD scripts report percentages; every other task's scores are fractions, so
# SQuAD's reach epoch lines, results.json and results.md as fractions too (0.8812, not 88.12).
# Counts (total, missing) and the null-odds thresholds are not percentages.
SQUAD_PERCENT_SCORES = ('exact_match', 'exact', 'f1', 'HasAns_exact', 'HasAns_f1',
                        'NoAns_exact', 'NoAns_f1', 'best_exact', 'best_f1')


def squad_fractions(scores: dict) -> dict[str, float]:
  """metrics.squad_evaluate's (or squad_v2_best_thresholds') dict with percentages / 100."""
  return {k: float(v) / 100 if k in SQUAD_PERCENT_SCORES else float(v)
          for k, v in scores.items()}


class Span(base.TaskKind):
  name = 'span'
  baseline_name = 'no-answer'
  head_task = heads.SPAN
  headline = 'f1'
  has_label_list = False
  token_outputs = True
  # The reference's start/end softmax runs over every position, padding included
  # (run_squad.py's compute_loss), so a cut training row would change the loss. Predictions
  # decode real tokens only, and are cut like every other kind's.
  cut_training_rows = False
  scores_version = 2  # version 1 stored SQuAD's scores as percentages

  def schema(self) -> base.BatchSchema:
    return base.rows_schema(base.ArraySpec('start_positions', ('batch',), jnp.int32),
                            base.ArraySpec('end_positions', ('batch',), jnp.int32),
                            base.ArraySpec('label_weights', ('batch',), jnp.float32))

  def make_head(self, labels, classifier_dropout):
    return heads.Head(heads.SPAN)

  def featurize(self, records, labels, tokenizer, d, training, source=''):
    length = d.max_seq_length
    features = squad.squad_features(records, tokenizer, max_seq_length=length,
                                    doc_stride=d.doc_stride, max_query_length=d.max_query_length,
                                    is_training=training, source=source or 'SQuAD',
                                    max_misaligned_fraction=d.max_misaligned_fraction)
    if not features:
      return {'input_ids': np.zeros((0, length), np.int32)}, features
    arrays = squad.feature_arrays(features)
    arrays['label_weights'] = np.ones(len(features), np.float32)
    return arrays, features

  def check_train(self, arrays, d):
    if not len(arrays['input_ids']):
      raise ValueError(f'{d.train_file}: no training question has its answer in the '
                       'whitespace-split context; check the file')

  def loss_sums(self, outputs, batch):
    w = batch['label_weights'].astype(jnp.float32)
    xent = optax.softmax_cross_entropy_with_integer_labels
    loss = (xent(outputs.start_logits, batch['start_positions'])
            + xent(outputs.end_logits, batch['end_positions'])) / 2
    return jnp.sum(w * loss), jnp.sum(w)

  def readout(self, outputs):
    return {'start_logits': outputs.start_logits, 'end_logits': outputs.end_logits}

  def _answers(self, task, split, outputs):
    """Answer texts, decoded with the tokenizer's own casing
    (squad_answers.text_normalization)."""
    d = task.data_config
    return squad_answers.squad_predictions(
        split.records, split.features, outputs['start_logits'], outputs['end_logits'],
        task.tokenizer, n_best_size=d.n_best_size, max_answer_length=d.max_answer_length,
        version_2_with_negative=task.squad_v2,
        null_score_diff_threshold=d.null_score_diff_threshold)

  def predictions(self, task, split, outputs):
    return self._answers(task, split, outputs).predictions

  def score(self, task, split, outputs):
    """SQuAD 2.0's scores add the best null thresholds' (evaluate-v2.0.py's best_exact,
    best_f1 and their thresholds), from each question's null odds."""
    found = self._answers(task, split, outputs)
    out = self.score_predictions(task, split, found.predictions)
    if task.squad_v2:
      out |= squad_fractions(metrics.squad_v2_best_thresholds(
          squad.gold_answers(split.records), found.predictions, found.null_odds))
    return out

  def score_predictions(self, task, split, predictions):
    out = squad_fractions(metrics.squad_evaluate(squad.gold_answers(split.records),
                                                 predictions, version_2=task.squad_v2))
    return out | {'headline': out['f1']}

  def baseline(self, task, split):
    return self.score_predictions(task, split, {e.qas_id: '' for e in split.records})
