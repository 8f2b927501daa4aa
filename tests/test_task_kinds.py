"""The fine-tuning wing's extension points: a task kind and a task registered from this test
module (multi-label classification, which the product does not ship) run end to end through
`bert_jax.finetune.run` and export to transformers, with no edit to bert_jax/finetune; and the
registries refuse what they cannot use."""

import json
import random

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

from bert_jax.finetune import kinds, results, run as finetune
from bert_jax.model import heads
from configs import finetune as finetune_configs
from input_pipeline import fs
from input_pipeline.finetune import registry
from input_pipeline.finetune.records import Example
from input_pipeline.tokenizer import WordPieceTokenizer
from tests.test_finetune import FILLER, SPECIALS, tiny_start

TOPICS = ('music', 'plot', 'actor')


class MultiLabel(kinds.TaskKind):
  """Any subset of the labels per row: one sigmoid per label (HF's
  `problem_type='multi_label_classification'`), scored by exact-set accuracy."""
  name = 'multi_label'
  baseline_name = 'empty-set'
  head_task = heads.SEQUENCE
  headline = 'subset_accuracy'

  def schema(self):
    return kinds.base.rows_schema(
        kinds.ArraySpec('labels', ('batch', 'classes'), jnp.float32),
        kinds.ArraySpec('label_weights', ('batch',), jnp.float32), sizes=(('classes', 3),))

  def make_head(self, labels, classifier_dropout):
    return heads.Head(heads.SEQUENCE, num_labels=len(labels), labels=labels,
                      problem_type='multi_label_classification',
                      classifier_dropout=classifier_dropout)

  def featurize(self, records, labels, tokenizer, d, training, source=''):
    from input_pipeline.finetune import task_arrays
    single = [Example(e.guid, e.text_a, None, None, e.index) for e in records]
    arrays = task_arrays.classification_features(single, tokenizer, d.max_seq_length, labels)
    arrays['labels'] = np.array([[float(l in e.label) for l in labels] for e in records],
                                np.float32)
    arrays['label_weights'] = np.ones(len(records), np.float32)
    return arrays, None

  def loss_sums(self, outputs, batch):
    w = batch['label_weights']
    loss = optax.sigmoid_binary_cross_entropy(outputs, batch['labels']).mean(-1)
    return jnp.sum(w * loss), jnp.sum(w)

  def predictions(self, task, split, outputs):
    return outputs['logits'] > 0

  def score_predictions(self, task, split, predictions):
    exact = float(np.mean(np.all(predictions == (split.arrays['labels'] > 0.5), axis=1)))
    return {'subset_accuracy': exact, 'headline': exact}

  def baseline(self, task, split):
    return self.score_predictions(task, split, np.zeros_like(split.arrays['labels'], bool))


def read_topics(name, d):
  def read(path):
    rows = [json.loads(line) for line in fs.read_text(path).splitlines()]
    return [Example(str(i), r['text'], None, tuple(r['topics']), i) for i, r in enumerate(rows)]
  dev = registry.SplitRecords('dev', 'dev', read(registry.required(d, 'dev_file')), True)
  return registry.TaskRecords(name, 'multi_label', read(registry.required(d, 'train_file')),
                              [dev], TOPICS)


def topic_fields(d):
  d.train_file = ''  # .jsonl: {"text": ..., "topics": [...]}
  d.dev_file = ''


@pytest.fixture(scope='module')
def registered():
  kinds.register(MultiLabel())
  registry.register(registry.TaskSpec('topics', 'multi_label', read_topics, topic_fields,
                                      labels=TOPICS))
  yield
  del registry.TASKS['topics'], kinds.KINDS['multi_label']


def topic_rows(rng, n):
  rows = []
  for _ in range(n):
    topics = [t for t in TOPICS if rng.random() < 0.4]
    words = [rng.choice([w for w in FILLER if w not in TOPICS]) for _ in range(4)] + topics * 2
    rng.shuffle(words)
    rows.append({'text': ' '.join(words), 'topics': topics})
  return rows


def test_a_kind_registered_outside_the_package_trains_scores_and_exports(registered, tmp_path):
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(SPECIALS + FILLER) + '\n')
  start = tiny_start(tmp_path / 'start', WordPieceTokenizer(str(vocab), do_lower_case=True),
                     num_layers=1)  # one layer: less to compile, as much to learn
  rng = random.Random(0)
  files = {}
  for split, n in (('train', 192), ('dev', 64)):
    files[split] = tmp_path / f'{split}.jsonl'
    files[split].write_text(''.join(json.dumps(r) + '\n' for r in topic_rows(rng, n)))
  c = finetune_configs.get_config('topics')
  assert 'topics' in finetune_configs.tasks() and set(c.data) >= {'train_file', 'dev_file'}
  c.init, c.data.train_file, c.data.dev_file = start, str(files['train']), str(files['dev'])
  c.data.max_seq_length, c.train.global_batch_size, c.train.num_epochs = 16, 16, 4
  c.optimizer.learning_rate = 1e-3
  out = finetune.run(c, str(tmp_path / 'run'))
  dev = results.split_headline(out, 'dev')
  assert out['baseline_kind'] == 'empty-set' and out['splits']['dev']['headline_metric'] == (
      'subset_accuracy')
  assert dev['median'] > dev['majority'] + 0.2, dev  # learnt, not the empty-set guess
  export = out['runs'][0]['export']
  model = transformers.AutoModelForSequenceClassification.from_pretrained(export)
  assert model.config.problem_type == 'multi_label_classification'
  assert [model.config.id2label[i] for i in range(3)] == list(TOPICS)
  tok = transformers.AutoTokenizer.from_pretrained(export)
  with torch.no_grad():
    logits = model(**tok(['music music the film'], return_tensors='pt')).logits
  assert logits.shape == (1, 3)


def test_the_registries_name_what_they_know():
  with pytest.raises(ValueError, match=r"task kind 'nope': unknown; known kinds are .*'span'"):
    kinds.get('nope')
  with pytest.raises(ValueError, match=r"config.task='nope': unknown; use a task of "
                                       r'configs/finetune.py \(cola, sst2'):
    registry.get('nope')
  with pytest.raises(ValueError, match='already Classification'):
    kinds.register(type('Other', (kinds.TaskKind,), {'name': 'classification'})())
  assert kinds.get('multiple_choice').schema().shapes(64)(8)['input_ids'][0] == (8, 4, 64)
  assert kinds.get('tagging').schema().token_axis('label_weights')
  assert not kinds.get('classification').schema().token_axis('labels')
