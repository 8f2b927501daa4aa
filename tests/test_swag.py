"""SWAG: the reader on the released CSV layout, the multiple-choice featurizer against
transformers' run_swag.py tokenization, and the task's scoring (accuracy, chance baseline)."""

import csv
import os

import numpy as np
import pytest
import transformers

from bert_jax.finetune import tasks as finetune_tasks
from configs import finetune as finetune_configs
from input_pipeline.finetune import registry, swag, task_arrays as features_lib
from input_pipeline.tokenizer import WordPieceTokenizer

VOCAB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'bert_uncased_vocab.txt')
# rowanz/swagaf data/train.csv's header: pandas' unnamed index column first.
HEADER = ['', 'video-id', 'fold-ind', 'startphrase', 'sent1', 'sent2', 'gold-source', 'ending0',
          'ending1', 'ending2', 'ending3', 'label']
ROWS = [
    ['0', 'lsmdc1052_Harry_Potter-94857', '18313', 'Students lower their eyes nervously. She',
     'Students lower their eyes nervously.', 'She', 'gold',
     'pats her shoulder, then saunters toward someone.', 'turns with two students.',
     'walks slowly towards someone.', 'wheels around as her dog thunders out.', '2'],
    ['1', 'anetv_dm5WXFiQZUQ', '18419', 'He rides the motorcycle down the hall. He',
     'He rides the motorcycle down the hall.', 'He', 'gold', 'looks at a mirror.',
     'stops, "looking" at the camera.', 'rides off into the distance.', 'waves, then turns.',
     '0'],
]


def write_csv(path, header, rows):
  with open(path, 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)
  return str(path)


def test_reads_the_released_layout_as_run_swag_builds_its_pairs(tmp_path):
  path = write_csv(tmp_path / 'train.csv', HEADER, ROWS)
  examples = swag.read_swag(path, labelled=True)
  assert [e.label for e in examples] == [2, 0] and [e.index for e in examples] == [0, 1]
  first = examples[0]
  assert first.guid == 'lsmdc1052_Harry_Potter-94857-18313'
  assert first.context == 'Students lower their eyes nervously.'
  # run_swag.py: second sentence f'{sent2} {ending_i}' (quoted commas kept)
  assert first.choices == ('She pats her shoulder, then saunters toward someone.',
                           'She turns with two students.', 'She walks slowly towards someone.',
                           'She wheels around as her dog thunders out.')
  assert examples[1].choices[1] == 'He stops, "looking" at the camera.'

  test = write_csv(tmp_path / 'test.csv', HEADER[:-1], [r[:-1] for r in ROWS])  # no label
  assert [e.label for e in swag.read_swag(test)] == [None, None]
  assert [e.label for e in swag.read_swag(path, labelled=False)] == [None, None]
  # HF datasets' export of the test split: a label column of -1 (or empty) is no label.
  hf_test = write_csv(tmp_path / 'hf_test.csv', HEADER, [r[:-1] + ['-1'] for r in ROWS])
  assert [e.label for e in swag.read_swag(hf_test)] == [None, None]
  with pytest.raises(ValueError, match=r'hf_test.csv.*label.*(-1|empty)'):
    swag.read_swag(hf_test, labelled=True)
  mixed = write_csv(tmp_path / 'mixed.csv', HEADER, [ROWS[0], ROWS[1][:-1] + ['']])
  with pytest.raises(ValueError, match='some rows are labelled and some are not'):
    swag.read_swag(mixed)
  # Without the index column, and with three endings: the header decides.
  three = write_csv(tmp_path / 'three.csv', ['sent1', 'sent2', 'ending0', 'ending1', 'ending2',
                                             'label'], [['a b', 'c', 'd', 'e', 'f', '1']])
  (one,) = swag.read_swag(three, labelled=True)
  assert one.choices == ('c d', 'c e', 'c f') and one.guid == 'three.csv-0'


def test_bad_files_name_the_file_line_and_field(tmp_path):
  bad_label = [r[:] for r in ROWS]
  bad_label[1][-1] = '4'
  path = write_csv(tmp_path / 'a.csv', HEADER, bad_label)
  with pytest.raises(ValueError, match=r"a.csv, line 3, field 'label': '4' is not a choice "
                                       r'number 0..3'):
    swag.read_swag(path, labelled=True)
  path = write_csv(tmp_path / 'b.csv', HEADER, [ROWS[0][:-2]])
  with pytest.raises(ValueError, match=r'b.csv, line 2: expected 12 comma-separated columns .*'
                                       'found 10'):
    swag.read_swag(path, labelled=True)
  path = write_csv(tmp_path / 'test.csv', HEADER[:-1], [r[:-1] for r in ROWS])
  with pytest.raises(ValueError, match=r"test.csv, line 1, field 'label': no such column"):
    swag.read_swag(path, labelled=True)
  full = ['video-id', 'fold-ind', 'startphrase', 'sent1', 'sent2', 'gold-source', 'gold-ending',
          'distractor-0', 'distractor-1', 'distractor-2', 'distractor-3', 'gold-type']
  path = write_csv(tmp_path / 'train_full.csv', full, [])
  with pytest.raises(ValueError, match=r"train_full.csv, line 1, field 'ending0': no such column"
                                       r'.*not the \*_full.csv files'):
    swag.read_swag(path)
  path = write_csv(tmp_path / 'empty.csv', HEADER, [])
  with pytest.raises(ValueError, match='empty.csv: no examples'):
    swag.read_swag(path)
  (tmp_path / 'latin1.csv').write_bytes(b'sent1,sent2,ending0,ending1\ncaf\xe9,a,b,c\n')
  with pytest.raises(ValueError, match='latin1.csv, line 2: not UTF-8'):
    swag.read_swag(str(tmp_path / 'latin1.csv'))


def test_features_equal_transformers_run_swag_tokenization():
  """[N, C, S] arrays equal to what run_swag.py's fast tokenizer gives for
  (sent1, f'{sent2} {ending}') with truncation=True, including cut pairs."""
  tok = WordPieceTokenizer(VOCAB, do_lower_case=True)
  hf_tok = transformers.BertTokenizerFast(VOCAB, do_lower_case=True)
  examples = [swag.ChoiceExample(f'q{i}', ROWS[i % 2][4], tuple(
      f'{ROWS[i % 2][5]} {e}' for e in ROWS[i % 2][7:11]), i % 4, i) for i in range(3)]
  for length in (64, 12, 9):  # 12 and 9 cut both sides, so the odd-token rule matters
    arrays = features_lib.multiple_choice_features(examples, tok, length)
    assert arrays['input_ids'].shape == (3, 4, length)
    np.testing.assert_array_equal(arrays['labels'], [0, 1, 2])
    np.testing.assert_array_equal(arrays['label_weights'], 1)
    firsts = [e.context for e in examples for _ in e.choices]
    seconds = [c for e in examples for c in e.choices]
    enc = hf_tok(firsts, seconds, truncation=True, max_length=length, padding='max_length',
                 return_tensors='np')
    for ours, theirs in (('input_ids', 'input_ids'), ('input_mask', 'attention_mask'),
                         ('segment_ids', 'token_type_ids')):
      np.testing.assert_array_equal(arrays[ours].reshape(12, length), enc[theirs], ours)
  # HF's longest-first keeps the odd token on the longer (the second on ties) side, where
  # the reference's _truncate_seq_pair keeps it on the first.
  assert features_lib.truncate_longest_first(3, 4, 5) == (2, 3)
  assert features_lib.truncate_seq_pair(3, 4, 5) == (3, 2)
  assert features_lib.truncate_longest_first(10, 3, 5) == (3, 2)
  assert features_lib.truncate_longest_first(2, 10, 6) == (2, 4)
  unlabelled = [swag.ChoiceExample('t', 'a', ('b', 'c'), None, 0)]
  arrays = features_lib.multiple_choice_features(unlabelled, tok, 8)
  assert arrays['labels'].tolist() == [-1] and arrays['label_weights'].tolist() == [0.0]
  with pytest.raises(ValueError, match='example q1: 2 choices, but q0 has 4'):
    features_lib.multiple_choice_features(
        [examples[0], swag.ChoiceExample('q1', 'a', ('b', 'c'), 0, 1)], tok, 16)


def test_swag_task_scores_accuracy_against_chance(tmp_path):
  files = {name: write_csv(tmp_path / f'{name}.csv', HEADER, ROWS) for name in ('train', 'val')}
  files['test'] = write_csv(tmp_path / 'test.csv', HEADER[:-1], [r[:-1] for r in ROWS])
  c = finetune_configs.get_config('swag')
  assert (c.train.global_batch_size, c.optimizer.learning_rate, c.train.num_epochs,
          c.data.max_seq_length) == (16, 2e-5, 3, 128)  # the paper's section 4.4
  c.data.train_file, c.data.dev_file, c.data.test_file = files['train'], files['val'], files['test']
  records = registry.read_task(c)
  assert records.kind == 'multiple_choice'
  assert [(s.name, s.role, s.labelled) for s in records.splits] == [
      ('dev', 'dev', True), ('test', 'test', False)]
  tok = WordPieceTokenizer(VOCAB, do_lower_case=True)
  task = finetune_tasks.featurize(records, (), tok, c.data)
  assert task.head.task == 'multiple_choice' and task.head.num_labels == 1
  dev = task.evals[0]
  assert task.headline_name(dev) == 'accuracy'
  assert task.baseline(dev) == {'accuracy': 0.25, 'headline': 0.25}
  gold = np.eye(4)[[2, 0]]
  assert task.score(dev, {'logits': gold}) == {'accuracy': 1.0, 'headline': 1.0}
  assert task.score(dev, {'logits': np.roll(gold, 1, axis=1)})['accuracy'] == 0.0
  path = task.write_predictions(task.evals[1], {'logits': gold}, str(tmp_path / 'seed_0'))
  assert open(path).read().splitlines() == ['index\tprediction', '0\t2', '1\t0']
  c.data.dev_file = files['test']
  with pytest.raises(ValueError, match=r"test.csv, line 1, field 'label': no such column"):
    registry.read_task(c)
