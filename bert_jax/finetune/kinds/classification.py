"""Sentence (pair) classification and regression: one output per row from the pooled [CLS]
(HF's `BertForSequenceClassification`), cross-entropy or mean squared error.

Featurisation is run_classifier.py's (input_pipeline/finetune/task_arrays.py). Baselines: the
training set's majority class; for regression its mean target (correlations then undefined:
NaN). GLUE splits report GLUE's metrics in GLUE's label order; unlabelled ones are written as
the leaderboard's files.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.finetune import metrics
from bert_jax.finetune.kinds import base
from bert_jax.model import heads
from input_pipeline.finetune import glue, task_arrays


class Classification(base.TaskKind):
  name = 'classification'
  baseline_name = 'majority-class'
  head_task = heads.SEQUENCE
  headline = 'accuracy'
  label_dtype = jnp.int32

  def schema(self) -> base.BatchSchema:
    return base.rows_schema(base.ArraySpec('labels', ('batch',), self.label_dtype),
                            base.ArraySpec('label_weights', ('batch',), jnp.float32))

  def featurize(self, records, labels, tokenizer, d, training, source=''):
    return task_arrays.classification_features(records, tokenizer, d.max_seq_length,
                                               self._feature_labels(labels)), None

  def _feature_labels(self, labels):
    return labels

  def loss_sums(self, outputs, batch):
    w = batch['label_weights'].astype(jnp.float32)
    labels = jnp.where(w > 0, batch['labels'], 0)  # -1 where there is no label
    loss = optax.softmax_cross_entropy_with_integer_labels(outputs, labels)
    return jnp.sum(w * loss), jnp.sum(w)

  def predictions(self, task, split, outputs):
    return outputs['logits'].argmax(-1)

  def score_predictions(self, task, split, predictions):
    labels = split.arrays['labels']
    if split.glue_name:  # GLUE's metrics index the task's own label order
      order = glue.GLUE_TASKS[glue.SUBMISSION_FILES[split.glue_name]].labels
      to_glue = np.array([order.index(label) for label in task.labels])
      return metrics.glue_metrics(split.glue_name, to_glue[labels], to_glue[predictions])
    accuracy = metrics.accuracy(labels, predictions)
    return {'accuracy': accuracy, 'headline': accuracy}

  def baseline(self, task, split):
    ids = task.train['labels'][task.train['label_weights'] > 0]
    return self.score_predictions(task, split,
                                  np.full(len(split.records), metrics.majority_class(ids)))

  def write_predictions(self, task, split, outputs, directory):
    """GLUE's leaderboard file, else `predictions/<split>.tsv` with label names."""
    names = [task.labels[int(p)] for p in self.predictions(task, split, outputs)]
    return base.write_index_predictions(split, names, directory)


class Regression(Classification):
  name = 'regression'
  baseline_name = 'mean-prediction'
  headline = 'pearson'
  has_label_list = False
  label_dtype = jnp.float32

  def make_head(self, labels, classifier_dropout):
    return heads.Head(heads.SEQUENCE, num_labels=1, classifier_dropout=classifier_dropout)

  def _feature_labels(self, labels):
    return None  # float targets

  def loss_sums(self, outputs, batch):
    w = batch['label_weights'].astype(jnp.float32)
    target = jnp.where(w > 0, batch['labels'], 0.0)  # unlabelled rows are NaN
    loss = jnp.square(outputs[:, 0] - target)
    return jnp.sum(w * loss), jnp.sum(w)

  def predictions(self, task, split, outputs):
    return outputs['logits'][:, 0]

  def score_predictions(self, task, split, predictions):
    labels = split.arrays['labels']
    out = {'pearson': metrics.pearson(labels, predictions),
           'spearman': metrics.spearman(labels, predictions),
           'mse': metrics.mean_squared_error(labels, predictions)}
    if split.glue_name:
      return out | metrics.glue_metrics(split.glue_name, labels, predictions)
    return out | {'headline': out['pearson']}

  def baseline(self, task, split):
    return self.score_predictions(task, split, metrics.baseline_predictions(
        task.train['labels'], len(split.records), regression=True))

  def write_predictions(self, task, split, outputs, directory):
    return base.write_index_predictions(split, self.predictions(task, split, outputs), directory)
