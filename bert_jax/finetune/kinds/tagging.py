"""Token classification (CoNLL NER, POS): logits per token (HF's
`BertForTokenClassification`), cross-entropy over each word's first sub-word.

Entity tags (B-/I-/E-/S-, `conll.is_bio`) are scored by entity F1 (seqeval's) with token
accuracy beside it; bare tag sets (POS: NN, VBZ) by token accuracy alone. The baseline tags
every word with the training set's majority tag.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from bert_jax.finetune import metrics
from bert_jax.finetune.kinds import base
from bert_jax.model import heads
from input_pipeline.finetune import conll, task_arrays


class Tagging(base.TaskKind):
  name = 'tagging'
  baseline_name = 'majority-tag'
  head_task = heads.TOKEN
  token_outputs = True

  def schema(self) -> base.BatchSchema:
    return base.rows_schema(base.ArraySpec('labels', ('batch', 'tokens'), jnp.int32),
                            base.ArraySpec('label_weights', ('batch', 'tokens'), jnp.float32))

  def featurize(self, records, labels, tokenizer, d, training, source=''):
    return task_arrays.tagging_features(records, tokenizer, d.max_seq_length, labels), None

  def loss_sums(self, outputs, batch):
    w = batch['label_weights'].astype(jnp.float32)
    labels = jnp.where(w > 0, batch['labels'], 0)  # -100 where there is no label
    loss = optax.softmax_cross_entropy_with_integer_labels(outputs, labels)
    return jnp.sum(w * loss), jnp.sum(w)

  @staticmethod
  def entity_tags(task) -> bool:
    return conll.is_bio(task.labels)

  def headline_name(self, task, split) -> str:
    return 'entity_f1' if self.entity_tags(task) else 'token_accuracy'

  def predictions(self, task, split, outputs):
    return task_arrays.tags_from_predictions(
        outputs['logits'], split.arrays['word_ids'], [len(s.words) for s in split.records],
        task.labels)

  def score_predictions(self, task, split, predictions):
    gold = [s.tags for s in split.records]
    accuracy = metrics.token_accuracy(gold, predictions)
    if not self.entity_tags(task):
      return {'token_accuracy': accuracy, 'headline': accuracy}
    out = metrics.entity_f1(gold, predictions)
    return {k: float(out[k]) for k in ('f1', 'precision', 'recall')} | {
        'token_accuracy': accuracy, 'headline': float(out['f1'])}

  def baseline(self, task, split):
    ids = task.train['labels'][task.train['label_weights'] > 0]
    tag = task.labels[metrics.majority_class(ids)]
    return self.score_predictions(task, split, [[tag] * len(s.words) for s in split.records])
