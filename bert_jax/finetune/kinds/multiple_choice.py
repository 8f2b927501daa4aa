"""Multiple choice (SWAG): every choice `[CLS] context [SEP] choice_i [SEP]` is its own encoder
row ([batch, choices, tokens]), one score per choice from its pooled [CLS] (HF's
`BertForMultipleChoice`), cross-entropy over the choices. The baseline is chance,
1 / choices; an unlabelled split's predicted ending numbers go to `predictions/<split>.tsv`.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from bert_jax.finetune import metrics
from bert_jax.finetune.kinds import base
from bert_jax.model import heads
from input_pipeline.finetune import task_arrays


class MultipleChoice(base.TaskKind):
  name = 'multiple_choice'
  baseline_name = 'chance'
  head_task = heads.MULTIPLE_CHOICE
  has_label_list = False

  def schema(self) -> base.BatchSchema:
    return base.rows_schema(base.ArraySpec('labels', ('batch',), jnp.int32),
                            base.ArraySpec('label_weights', ('batch',), jnp.float32),
                            row_axes=('batch', 'choices', 'tokens'), sizes=(('choices', 4),))

  def make_head(self, labels, classifier_dropout):
    return heads.Head(heads.MULTIPLE_CHOICE, classifier_dropout=classifier_dropout)

  def featurize(self, records, labels, tokenizer, d, training, source=''):
    return task_arrays.multiple_choice_features(records, tokenizer, d.max_seq_length), None

  def loss_sums(self, outputs, batch):
    w = batch['label_weights'].astype(jnp.float32)
    labels = jnp.where(w > 0, batch['labels'], 0)
    loss = optax.softmax_cross_entropy_with_integer_labels(outputs, labels)
    return jnp.sum(w * loss), jnp.sum(w)

  def predictions(self, task, split, outputs):
    return outputs['logits'].argmax(-1)

  def score_predictions(self, task, split, predictions):
    accuracy = metrics.accuracy(split.arrays['labels'], predictions)
    return {'accuracy': accuracy, 'headline': accuracy}

  def baseline(self, task, split):  # a uniform guess: expected accuracy 1 / num_choices
    chance = 1.0 / split.arrays['input_ids'].shape[1]
    return {'accuracy': chance, 'headline': chance}

  def write_predictions(self, task, split, outputs, directory):
    return base.write_index_predictions(split, self.predictions(task, split, outputs), directory)
