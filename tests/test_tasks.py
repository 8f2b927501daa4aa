"""Fine-tuning data: GLUE/generic/MR/CoNLL/SQuAD readers, TFDS, features, submissions."""

import io
import json
import os
import random
import tarfile

import numpy as np
import pytest

from bert_jax.finetune import squad_answers
from bert_jax.finetune.metrics import normalize_answer
from input_pipeline.finetune import conll, task_arrays as task_features, glue, mr, records as tasks, squad
from input_pipeline.finetune.records import Example, TaggedSentence
from input_pipeline.tokenizer import SentencePieceTokenizer, WordPieceTokenizer

DATA = os.path.join(os.path.dirname(__file__), 'data')
VOCAB = os.path.join(DATA, 'bert_uncased_vocab.txt')


@pytest.fixture(scope='module')
def tokenizer():
  return WordPieceTokenizer(VOCAB, do_lower_case=True)


def _write(root, name, text, encoding='utf-8'):
  path = os.path.join(str(root), name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding=encoding, newline='') as f:
    f.write(text)
  return path


def _tsv(*rows):
  return ''.join('\t'.join(r) + '\n' for r in rows)


# ----------------------------------------------------------------------------- GLUE layouts

MNLI_TRAIN_HEADER = ('index', 'promptID', 'pairID', 'genre', 'sentence1_binary_parse',
                     'sentence2_binary_parse', 'sentence1_parse', 'sentence2_parse',
                     'sentence1', 'sentence2', 'label1', 'gold_label')
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:10] + ('label1', 'label2', 'label3', 'label4', 'label5',
                                            'gold_label')
STSB_HEADER = ('index', 'genre', 'filename', 'year', 'old_index', 'source1', 'source2',
               'sentence1', 'sentence2', 'score')
MRPC_HEADER = ('Quality', '#1 ID', '#2 ID', '#1 String', '#2 String')
PREMISE = 'Conceptually cream skimming has two basic dimensions - product and geography.'
HYPOTHESIS = 'Product and geography are what make cream skimming work. '


def _mnli_row(index, premise, hypothesis, *labels):
  parse = '( ( Conceptually ( cream skimming ) ) ... )'
  return (str(index), '31193', f'{index}n', 'government', parse, parse, '(ROOT (S ...))',
          '(ROOT (S ...))', premise, hypothesis) + labels


# Each task's files in GLUE's real layout, and what each split must parse to:
# [(text_a, text_b, label, index)].
GLUE_FILES = {
    'CoLA': {
        'train.tsv': _tsv(('gj04', '1', '', "Our friends won't buy this analysis, let alone "
                           'the next one we propose.'),
                          ('gj04', '0', '*', 'They drank the pub.')),
        'dev.tsv': _tsv(('gj04', '1', '', 'The sailors rode the breeze clear of the rocks.')),
        'test.tsv': _tsv(('index', 'sentence'), ('0', 'Bill whistled past the house.'),
                         ('1', 'The car honked its way down the road.')),
    },
    'SST-2': {
        'train.tsv': _tsv(('sentence', 'label'),
                          ('hide new secretions from the parental units ', '0'),
                          ('that loves its characters ', '1')),
        'dev.tsv': _tsv(('sentence', 'label'), ("it 's a charming and often affecting journey . ",
                                                '1')),
        'test.tsv': _tsv(('index', 'sentence'), ('0', 'uneasy mishmash of styles and genres .')),
    },
    'MRPC': {
        # GLUE's MRPC files start with a UTF-8 byte-order mark.
        'train.tsv': '\ufeff' + _tsv(
            MRPC_HEADER,
            ('1', '702876', '702977', 'Amrozi accused his brother , whom he called " the '
             'witness " , of deliberately distorting his evidence .', 'Referring to him as '
             'only " the witness " , Amrozi accused his brother of deliberately distorting his '
             'evidence .'),
            ('0', '2108705', '2108831', "Yucaipa owned Dominick 's before selling the chain to "
             'Safeway in 1998 for $ 2.5 billion .', "Yucaipa bought Dominick 's in 1995 for $ "
             '693 million and sold it to Safeway for $ 1.8 billion in 1998 .')),
        'dev.tsv': '\ufeff' + _tsv(MRPC_HEADER, ('1', '1355540', '1355592', 'He said the '
                                                 'foodservice pie business doesn \'t fit .',
                                                 'The foodservice pie business does not fit .')),
        'test.tsv': '\ufeff' + _tsv(('index',) + MRPC_HEADER[1:], (
            '0', '1089874', '1089925', "PCCW 's chief operating officer , Mike Butcher , will "
            'report directly to Mr So .', 'Current Chief Operating Officer Mike Butcher will '
            'report to So .')),
    },
    'QQP': {
        'train.tsv': _tsv(('id', 'qid1', 'qid2', 'question1', 'question2', 'is_duplicate'),
                          ('133273', '213221', '213222', 'How is the life of a math student?',
                           'Which level of prepration is enough for the exam jlpt5?', '0')),
        'dev.tsv': _tsv(('id', 'qid1', 'qid2', 'question1', 'question2', 'is_duplicate'),
                        ('201359', '303345', '303346', 'Why are African-Americans so beautiful?',
                         'Why are hispanics so beautiful?', '1')),
        'test.tsv': _tsv(('id', 'question1', 'question2'),
                         ('0', 'Why am I mentally very lonely? How can I solve it?',
                          'Find the remainder when [math]23^{24}[/math] is divided by 24,23?')),
    },
    'STS-B': {
        'train.tsv': _tsv(STSB_HEADER, ('0', 'main-captions', 'MSRvid', '2012test', '0001',
                                        'none', 'none', 'A plane is taking off.',
                                        'An air plane is taking off.', '5.000')),
        'dev.tsv': _tsv(STSB_HEADER, ('0', 'main-captions', 'MSRvid', '2012test', '0000',
                                      'none', 'none', 'A man with a hard hat is dancing.',
                                      'A man wearing a hard hat is dancing.', '5.000'),
                        ('1', 'main-captions', 'MSRvid', '2012test', '0002', 'none', 'none',
                         'A young child is riding a horse.', 'A child is riding a horse.',
                         '4.750')),
        'test.tsv': _tsv(STSB_HEADER[:-1], ('0', 'main-captions', 'MSRvid', '2012test', '0024',
                                            'none', 'none', 'A girl is styling her hair.',
                                            'A girl is brushing her hair.')),
    },
    'MNLI': {
        'train.tsv': _tsv(MNLI_TRAIN_HEADER, _mnli_row(0, PREMISE, HYPOTHESIS, 'neutral',
                                                       'neutral')),
        'dev_matched.tsv': _tsv(MNLI_DEV_HEADER, _mnli_row(
            0, 'The new rights are nice enough', 'Everyone really likes the newest benefits ',
            'neutral', 'entailment', 'neutral', 'neutral', 'neutral', 'neutral')),
        'dev_mismatched.tsv': _tsv(MNLI_DEV_HEADER, _mnli_row(
            0, 'Your contribution helped make it possible.', 'Your contributions were of no '
            'help.', 'contradiction', 'contradiction', 'contradiction', 'contradiction',
            'contradiction', 'contradiction')),
        'test_matched.tsv': _tsv(MNLI_TRAIN_HEADER[:10], _mnli_row(0, 'Hierbas, ans seco.',
                                                                   'Hierbas is a name.')),
        'test_mismatched.tsv': _tsv(MNLI_TRAIN_HEADER[:10], _mnli_row(0, 'What have you '
                                                                      'decided?', 'So?')),
    },
    'QNLI': {
        'train.tsv': _tsv(('index', 'question', 'sentence', 'label'),
                          ('0', 'When did the third Digimon series begin?', 'Unlike the two '
                           'seasons before it, it was darker.', 'not_entailment')),
        'dev.tsv': _tsv(('index', 'question', 'sentence', 'label'),
                        ('0', 'What came into force after the new constitution was herald?',
                         'As of that day, the new constitution was in force.', 'entailment')),
        'test.tsv': _tsv(('index', 'question', 'sentence'),
                         ('0', 'What organization is devoted to Jihad against Israel?',
                          'For some decades prior, Hamas had been active.')),
    },
    'RTE': {
        'train.tsv': _tsv(('index', 'sentence1', 'sentence2', 'label'),
                          ('0', 'No Weapons of Mass Destruction Found in Iraq Yet.',
                           'Weapons of Mass Destruction Found in Iraq.', 'not_entailment')),
        'dev.tsv': _tsv(('index', 'sentence1', 'sentence2', 'label'),
                        ('0', 'Dana Reeve, the widow of Christopher Reeve, has died.',
                         'Christopher Reeve had an accident.', 'not_entailment')),
        'test.tsv': _tsv(('index', 'sentence1', 'sentence2'),
                         ('0', 'Mangla was summoned after Madhumita\'s sister complained.',
                          'Shukla is subjected to a narco-analysis test.')),
    },
    'WNLI': {
        'train.tsv': _tsv(('index', 'sentence1', 'sentence2', 'label'),
                          ('0', 'I stuck a pin through a carrot. When I pulled the pin out, it '
                           'had a hole.', 'The carrot had a hole.', '1')),
        'dev.tsv': _tsv(('index', 'sentence1', 'sentence2', 'label'),
                        ('0', 'The drain is clogged with hair. It has to be cleaned.',
                         'The hair has to be cleaned.', '0')),
        'test.tsv': _tsv(('index', 'sentence1', 'sentence2'),
                         ('0', 'Maude and Dora had seen the trains rushing across the prairie.',
                          'Horses ran away when the trains came.')),
    },
    'AX': {
        'diagnostic.tsv': _tsv(('index', 'sentence1', 'sentence2'),
                               ('0', 'The cat sat on the mat.', 'The cat did not sit on the '
                                'mat.')),
    },
}

GLUE_EXPECTED = {
    ('CoLA', 'train'): [("Our friends won't buy this analysis, let alone the next one we "
                         'propose.', None, '1', 0), ('They drank the pub.', None, '0', 1)],
    ('CoLA', 'test'): [('Bill whistled past the house.', None, None, 0),
                       ('The car honked its way down the road.', None, None, 1)],
    ('SST-2', 'train'): [('hide new secretions from the parental units ', None, '0', 0),
                         ('that loves its characters ', None, '1', 1)],
    ('SST-2', 'test'): [('uneasy mishmash of styles and genres .', None, None, 0)],
    ('MRPC', 'train'): [('Amrozi accused his brother , whom he called " the witness " , of '
                         'deliberately distorting his evidence .', 'Referring to him as only '
                         '" the witness " , Amrozi accused his brother of deliberately '
                         'distorting his evidence .', '1', 0),
                        ("Yucaipa owned Dominick 's before selling the chain to Safeway in 1998 "
                         "for $ 2.5 billion .", "Yucaipa bought Dominick 's in 1995 for $ 693 "
                         'million and sold it to Safeway for $ 1.8 billion in 1998 .', '0', 1)],
    ('MRPC', 'test'): [("PCCW 's chief operating officer , Mike Butcher , will report directly "
                        'to Mr So .', 'Current Chief Operating Officer Mike Butcher will '
                        'report to So .', None, 0)],
    ('QQP', 'train'): [('How is the life of a math student?', 'Which level of prepration is '
                        'enough for the exam jlpt5?', '0', 0)],
    ('QQP', 'test'): [('Why am I mentally very lonely? How can I solve it?', 'Find the '
                       'remainder when [math]23^{24}[/math] is divided by 24,23?', None, 0)],
    ('STS-B', 'dev'): [('A man with a hard hat is dancing.', 'A man wearing a hard hat is '
                        'dancing.', 5.0, 0), ('A young child is riding a horse.',
                                              'A child is riding a horse.', 4.75, 1)],
    ('STS-B', 'test'): [('A girl is styling her hair.', 'A girl is brushing her hair.', None,
                         0)],
    ('MNLI', 'train'): [(PREMISE, HYPOTHESIS, 'neutral', 0)],
    ('MNLI', 'dev'): [('The new rights are nice enough', 'Everyone really likes the newest '
                       'benefits ', 'neutral', 0)],
    ('MNLI', 'dev_mismatched'): [('Your contribution helped make it possible.',
                                  'Your contributions were of no help.', 'contradiction', 0)],
    ('MNLI', 'test_matched'): [('Hierbas, ans seco.', 'Hierbas is a name.', None, 0)],
    ('MNLI', 'test_mismatched'): [('What have you decided?', 'So?', None, 0)],
    ('QNLI', 'dev'): [('What came into force after the new constitution was herald?',
                       'As of that day, the new constitution was in force.', 'entailment', 0)],
    ('RTE', 'train'): [('No Weapons of Mass Destruction Found in Iraq Yet.', 'Weapons of Mass '
                        'Destruction Found in Iraq.', 'not_entailment', 0)],
    ('WNLI', 'train'): [('I stuck a pin through a carrot. When I pulled the pin out, it had a '
                         'hole.', 'The carrot had a hole.', '1', 0)],
    ('AX', 'test'): [('The cat sat on the mat.', 'The cat did not sit on the mat.', None, 0)],
}


@pytest.fixture(scope='module')
def glue_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp('glue_data')
  for task, files in GLUE_FILES.items():
    for name, text in files.items():
      _write(root, os.path.join(task if task != 'AX' else 'diagnostic', name), text)
  return str(root)


def _task_dir(glue_dir, task):
  return os.path.join(glue_dir, task if task != 'AX' else 'diagnostic')


@pytest.mark.parametrize('task,split', sorted(GLUE_EXPECTED))
def test_every_glue_layout_parses(glue_dir, task, split):
  got = glue.read_glue(task, _task_dir(glue_dir, task), split)
  assert [(e.text_a, e.text_b, e.label, e.index) for e in got] == GLUE_EXPECTED[task, split]


def test_every_glue_split_of_every_task_reads(glue_dir):
  for task in glue.GLUE_TASKS.values():
    for split in task.splits:
      examples = glue.read_glue(task, _task_dir(glue_dir, task.name), split)
      assert glue.read_glue(task.name.lower(), glue_dir, split) == examples  # from the root
      labelled = not split.startswith('test')
      assert all((e.label is not None) == labelled for e in examples)
      assert all(isinstance(e.label, float) for e in examples if labelled and
                 task.is_regression)
      assert all(e.label in task.labels for e in examples if labelled and task.labels)


def test_glue_label_lists_are_the_reference_processors():
  labels = {name: t.labels for name, t in glue.GLUE_TASKS.items()}
  assert labels == {
      'CoLA': ('0', '1'), 'SST-2': ('0', '1'), 'MRPC': ('0', '1'), 'QQP': ('0', '1'),
      'STS-B': (), 'MNLI': ('contradiction', 'entailment', 'neutral'),
      'QNLI': ('entailment', 'not_entailment'), 'RTE': ('entailment', 'not_entailment'),
      'WNLI': ('0', '1'), 'AX': ('contradiction', 'entailment', 'neutral')}
  assert glue.glue_task('sst2') is glue.GLUE_TASKS['SST-2']
  assert glue.glue_task('sts-b').is_regression and glue.glue_task('mnli').splits == (
      'train', 'dev_matched', 'dev_mismatched', 'test_matched', 'test_mismatched')


def _one_task_dir(tmp_path, task, name, text):
  _write(tmp_path / task, name, text)
  return str(tmp_path / task)


@pytest.mark.parametrize('task,name,text,error', [
    ('MRPC', 'train.tsv', _tsv(MRPC_HEADER, ('1', '1', '2', 'a', 'b'), ('0', '3', '4', 'c')),
     r"MRPC/train.tsv, line 3: expected 5 tab-separated columns, found 4"),
    ('RTE', 'dev.tsv', _tsv(('index', 'sentence1', 'sentence2', 'label'),
                            ('0', 'a', 'b', 'maybe')),
     r"RTE/dev.tsv, line 2, field 'label': unknown label 'maybe'; the labels are "
     r"\['entailment', 'not_entailment'\]"),
    ('MRPC', 'train.tsv', _tsv(MRPC_HEADER[:4], ('1', '1', '2', 'a')),
     r"MRPC/train.tsv, line 1, field '#2 String': no such column in the header"),
    ('QNLI', 'train.tsv', _tsv(('index', 'question', 'sentence', 'label')),
     r'QNLI/train.tsv: no examples \(empty split\)'),
    ('QNLI', 'train.tsv', '', r'QNLI/train.tsv: empty file'),
    ('CoLA', 'train.tsv', '', r'CoLA/train.tsv: no examples'),
    ('CoLA', 'train.tsv', _tsv(('gj04', '1', 'Only three columns.')),
     r'CoLA/train.tsv, line 1: expected 4 tab-separated columns, found 3'),
    ('STS-B', 'train.tsv', _tsv(STSB_HEADER, ('0', 'g', 'f', 'y', 'o', 's', 's', 'a', 'b',
                                              'high')),
     r"STS-B/train.tsv, line 2, field 'score': 'high' is not a number"),
    ('SST-2', 'train.tsv', _tsv(('sentence', 'label'), ('good', '')),
     r"SST-2/train.tsv, line 2, field 'label': empty label"),
    ('RTE', 'test.tsv', _tsv(('index', 'sentence1', 'sentence2'), ('x', 'a', 'b')),
     r"RTE/test.tsv, line 2, field 'index': 'x' is not an integer"),
])
def test_bad_glue_input_names_file_line_and_field(tmp_path, task, name, text, error):
  split = name[:-4]
  with pytest.raises(ValueError, match=error):
    glue.read_glue(task, _one_task_dir(tmp_path, task, name, text), split)


def test_glue_missing_file_split_encoding_and_skipping(tmp_path):
  with pytest.raises(FileNotFoundError, match=r'MRPC/dev.tsv: no such file \(GLUE MRPC dev\)'):
    glue.read_glue('MRPC', str(tmp_path / 'MRPC'), 'dev')
  with pytest.raises(ValueError, match=r"GLUE RTE has no split 'validation'"):
    glue.read_glue('RTE', str(tmp_path), 'validation')
  with pytest.raises(ValueError, match="unknown GLUE task 'SNLI'"):
    glue.glue_task('SNLI')
  path = tmp_path / 'RTE' / 'train.tsv'
  path.parent.mkdir()
  path.write_bytes(b'index\tsentence1\tsentence2\tlabel\n0\ta\t\xff\tentailment\n')
  with pytest.raises(ValueError, match=r'RTE/train.tsv, line 2: not UTF-8'):
    glue.read_glue('RTE', str(path.parent), 'train')
  path.write_text(_tsv(('index', 'sentence1', 'sentence2', 'label'), ('0', 'a', 'b', 'entailment'),
                       ('1', 'broken row'), ('2', 'c', 'd', 'not_entailment')))
  got = glue.read_glue('RTE', str(path.parent), 'train', skip_bad_lines=True)
  assert [e.label for e in got] == ['entailment', 'not_entailment']


# ----------------------------------------------------------------------------- generic tables


def test_generic_csv_tsv_jsonl_with_named_columns(tmp_path):
  csv_path = _write(tmp_path, 'reviews.csv', 'id,review,verdict\r\n1,"Loved it, truly",pos\r\n'
                    '2,"Two\nlines, ""quoted""",neg\r\n')
  got = tasks.read_table(csv_path, 'review', label='verdict')
  assert [(e.text_a, e.label) for e in got] == [('Loved it, truly', 'pos'),
                                                ('Two\nlines, "quoted"', 'neg')]
  assert tasks.label_list(got) == ('neg', 'pos')
  tsv_path = _write(tmp_path, 'pairs.tsv', _tsv(('q', 'a', 'score'), ('x?', 'y.', '0.5')))
  got = tasks.read_table(tsv_path, 'q', 'a', 'score', regression=True)
  assert got == [Example('pairs.tsv-0', 'x?', 'y.', 0.5, 0)]
  jsonl_path = _write(tmp_path, 'd.jsonl', '{"text": "fine", "label": 1}\n\n'
                      '{"text": "bad", "label": 0, "extra": [1]}\n')
  got = tasks.read_table(jsonl_path, 'text', label='label', labels=('0', '1'))
  assert [(e.text_a, e.label, e.index) for e in got] == [('fine', '1', 0), ('bad', '0', 1)]
  assert [e.label for e in tasks.read_table(jsonl_path, 'text')] == [None, None]


@pytest.mark.parametrize('name,text,kwargs,error', [
    ('a.csv', 'text,label\nok,pos\n"too","many",cols\n', {},
     r'a.csv, line 3: expected 2 comma-separated columns \(as the header has\), found 3'),
    ('a.csv', 'text,label\nok,pos\n', {'label': 'sentiment'},
     r"a.csv, line 1, field 'sentiment': no such column in the header \['text', 'label'\]"),
    ('a.tsv', 'text\tlabel\nok\tmeh\n', {'labels': ('neg', 'pos')},
     r"a.tsv, line 2, field 'label': unknown label 'meh'"),
    ('a.jsonl', '{"text": "ok", "label": "pos"}\n{"text": "no label"}\n', {},
     r"a.jsonl, line 2, field 'label': missing"),
    ('a.jsonl', '{"text": "ok", "label": "pos"}\n{"text": \n', {}, r'a.jsonl, line 2: not JSON'),
    ('a.tsv', 'text\tlabel\n', {}, r'a.tsv: no examples'),
    ('a.txt', 'text\tlabel\n', {}, r'a.txt: unknown table format'),
])
def test_bad_generic_table_input(tmp_path, name, text, kwargs, error):
  path = _write(tmp_path, name, text)
  kwargs = {'label': 'label', **kwargs}
  with pytest.raises(ValueError, match=error):
    tasks.read_table(path, 'text', **kwargs)


# ----------------------------------------------------------------------------- MR

# Lines in the real file's format: id, mean rating, sentence; CRLF; UTF-8; no final newline.
MR_LINES = [
    ('1', '2.26666666667', "The Rock is destined to be the 21st Century's new ''Conan''."),
    ('2', '-0.6', 'Effective but too tepid biopic'),
    ('3', '0.5', 'Exactly at the positive threshold.'),
    ('4', '-0.5', 'Exactly at the negative threshold.'),
    ('5', '0.4875', 'Neutral: just under the threshold.'),
    ('6', '-0.125', 'Neutral too.'),
    ('7', '1.4375', 'We\u2019ve seen the hippie turned yuppie plot before, but it\u2019s fresh.'),
    ('8', '-1.8125', 'A caf\u00e9 of clich\u00e9s \u2013 and not a good one.'),
]
for _i in range(9, 31):
  MR_LINES.append((str(_i), f'{(-1) ** _i * (0.5 + _i / 10):.4f}', f'Sentence number {_i}.'))


def _mr_file_bytes(lines=MR_LINES):
  return '\r\n'.join('\t'.join(line) for line in lines).encode('utf-8')


def _tar_gz(members):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buf.getvalue()


@pytest.fixture
def mr_sdist(tmp_path):
  """The vaderSentiment-3.3.2 sdist's structure: the ratings file inside an inner tar.gz."""
  inner = _tar_gz({'hutto_ICWSM_2014/_README_.txt': b'readme',
                   mr.RATINGS_FILE: _mr_file_bytes(),
                   'hutto_ICWSM_2014/tweets_GroundTruth.txt': b'1\t0.1\tnot this one'})
  outer = _tar_gz({'vaderSentiment-3.3.2/setup.py': b'', mr.INNER_ARCHIVE: inner})
  (tmp_path / mr.SDIST).write_bytes(outer)
  (tmp_path / 'hutto_ICWSM_2014.tar.gz').write_bytes(inner)
  (tmp_path / 'ratings.txt').write_bytes(_mr_file_bytes())
  return tmp_path


def test_mr_reads_the_sdist_the_inner_archive_and_the_text_file(mr_sdist):
  got = mr.read_mr(str(mr_sdist / mr.SDIST))
  assert mr.read_mr(str(mr_sdist / 'hutto_ICWSM_2014.tar.gz')) == got
  assert mr.read_mr(str(mr_sdist / 'ratings.txt')) == got
  assert len(got) == len(MR_LINES)
  assert got[0] == mr.Snippet(1, 2.26666666667, MR_LINES[0][2])
  assert got[7].text == 'A caf\u00e9 of clich\u00e9s \u2013 and not a good one.'  # UTF-8
  assert not any('\r' in s.text for s in got)
  examples = mr.mr_examples(got)
  by_id = {e.index: e.label for e in examples}
  assert by_id[1] == '1' and by_id[2] == '0' and by_id[3] == '1' and by_id[4] == '0'
  assert 5 not in by_id and 6 not in by_id  # |rating| < 0.5: neutral, left out
  assert len(examples) == len(MR_LINES) - 2
  assert [e.label for e in mr.mr_examples(got, 'regression')][:2] == [2.26666666667, -0.6]


def test_mr_split_is_80_10_10_and_fixed_by_the_seed(mr_sdist):
  snippets = mr.read_mr(str(mr_sdist / mr.SDIST))
  splits = mr.mr_splits(snippets, seed=0)
  n = len(mr.mr_examples(snippets))
  assert [len(splits[k]) for k in ('train', 'dev', 'test')] == [n * 8 // 10, n // 10,
                                                                n - n * 8 // 10 - n // 10]
  ids = [e.index for k in ('train', 'dev', 'test') for e in splits[k]]
  assert sorted(ids) == sorted(e.index for e in mr.mr_examples(snippets))
  expected = mr.mr_examples(snippets)
  random.Random(0).shuffle(expected)
  assert [e.index for e in splits['train']] == [e.index for e in expected[:n * 8 // 10]]
  assert mr.mr_splits(snippets, seed=0) == splits
  assert mr.mr_splits(snippets, seed=1)['train'] != splits['train']
  regression = mr.mr_splits(snippets, seed=0, task='regression')
  assert [e.index for e in regression['test']] == [e.index for e in splits['test']]


@pytest.mark.parametrize('line,error', [
    (('9', '1.5'), r'line 2: expected 3 tab-separated columns \(id, rating, sentence\)'),
    (('9', 'good', 'text'), r"line 2, field 'rating': 'good' is not a number"),
    (('9', '4.5', 'text'), r"line 2, field 'rating': 4.5 is outside \[-4, 4\]"),
    (('x', '1.0', 'text'), r"line 2, field 'id': 'x' is not an integer"),
])
def test_bad_mr_lines(tmp_path, line, error):
  path = tmp_path / 'ratings.txt'
  path.write_bytes(_mr_file_bytes([MR_LINES[0], line]))
  with pytest.raises(ValueError, match=error):
    mr.read_mr(str(path))


def test_mr_bad_archives_and_a_corrupt_cache(tmp_path):
  (tmp_path / 'other.tar.gz').write_bytes(_tar_gz({'x/y.txt': b'1'}))
  with pytest.raises(FileNotFoundError, match=r'other.tar.gz:hutto_ICWSM_2014/movieReview'
                                              r'Snippets_GroundTruth.txt: no hutto'):
    mr.read_mr(str(tmp_path / 'other.tar.gz'))
  path = tmp_path / 'ratings.txt'
  path.write_bytes(_mr_file_bytes()[:-10] + b'\xe9\r\n')
  with pytest.raises(ValueError, match=r'ratings.txt, line 30: not UTF-8'):
    mr.read_mr(str(path))
  (tmp_path / 'cache').mkdir()
  (tmp_path / 'cache' / mr.SDIST).write_bytes(b'truncated download')
  with pytest.raises(ValueError, match=r'SHA-256 .* is not that of PyPI\'s vaderSentiment-'
                                       r'3.3.2.tar.gz .*delete it and fetch again'):
    mr.fetch_mr(str(tmp_path / 'cache'))


# ----------------------------------------------------------------------------- CoNLL

CONLL_TEXT = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O
to TO B-VP O
boycott VB I-VP O
British JJ B-NP I-MISC
lamb NN I-NP O
. . O O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

S.AFRICA NNP B-NP I-LOC
Bonn NNP I-NP B-LOC
unaffable JJ B-NP O
tokenization NN I-NP O
"""


def test_conll_reads_sentences_and_documents(tmp_path):
  got = conll.read_conll(_write(tmp_path, 'eng.train', CONLL_TEXT))
  assert [s.words for s in got] == [
      ('EU', 'rejects', 'German', 'call', 'to', 'boycott', 'British', 'lamb', '.'),
      ('Peter', 'Blackburn'), ('S.AFRICA', 'Bonn', 'unaffable', 'tokenization')]
  assert got[0].tags[:3] == ('I-ORG', 'O', 'I-MISC') and got[0].pos[0] == 'NNP'
  assert got[0].chunks[:2] == ('B-NP', 'B-VP')
  assert conll.to_bio(got[2].tags) == ('B-LOC', 'B-LOC', 'O', 'O')
  assert conll.to_bio(('I-PER', 'I-PER', 'I-LOC', 'O', 'I-LOC')) == (
      'B-PER', 'I-PER', 'B-LOC', 'O', 'B-LOC')
  two = conll.read_conll(_write(tmp_path, 'wnut.txt', 'Hi O\nthere B-person\n'))
  assert two == [TaggedSentence(('Hi', 'there'), ('O', 'B-person'))]


@pytest.mark.parametrize('text,kwargs,error', [
    ('EU NNP B-NP I-ORG\nrejects VBZ O\n', {},
     r"line 2: expected 4 space-separated columns \(word POS chunk NER\), found 3"),
    ('EU NNP B-NP I-ORG\n', {'label_column': 4},
     r"line 1: label_column=4 is outside the file's 4 columns"),
    ('EU NNP B-NP I-ORG\n', {'label_column': -4}, r"line 1: label_column=-4 is the word column"),
    ('EU NNP B-NP I-ORG\nx NN I-NP B-GPE\n', {'labels': conll.CONLL2003_LABELS},
     r"line 2, field 'tag': unknown tag 'B-GPE'"),
    ('-DOCSTART- -X- -X- O\n\n', {}, r'no examples'),
])
def test_bad_conll_input(tmp_path, text, kwargs, error):
  with pytest.raises(ValueError, match=r'eng.testa' + '.*' + error):
    conll.read_conll(_write(tmp_path, 'eng.testa', text), **kwargs)


def test_token_classification_round_trip(tmp_path, tokenizer):
  sentences = conll.read_conll(_write(tmp_path, 'eng.train', CONLL_TEXT))
  sentences = [TaggedSentence(s.words, conll.to_bio(s.tags)) for s in sentences]
  labels = conll.CONLL2003_LABELS
  f = task_features.tagging_features(sentences, tokenizer, 32, labels)
  assert f['input_ids'].shape == f['labels'].shape == f['word_ids'].shape == (3, 32)
  row = 2  # S.AFRICA Bonn unaffable tokenization: several sub-words per word
  n = int(f['input_mask'][row].sum())
  pieces = [tokenizer.id_to_token(i) for i in f['input_ids'][row, :n]]
  assert pieces == ['[CLS]', 's', '.', 'africa', 'bonn', 'una', '##ffa', '##ble', 'token',
                    '##ization', '[SEP]']
  assert f['word_ids'][row, :n].tolist() == [-1, 0, 0, 0, 1, 2, 2, 2, 3, 3, -1]
  assert f['labels'][row, :n].tolist() == [-100, labels.index('B-LOC'), -100, -100,
                                           labels.index('B-LOC'), 0, -100, -100, 0, -100, -100]
  assert (f['label_weights'] == (f['labels'] != -100)).all()
  assert (f['segment_ids'] == 0).all() and (f['input_ids'][:, n:][row] == 0).all()
  # Predictions: the gold id at first sub-words, noise everywhere else -> the gold tags back.
  rng = np.random.default_rng(0)
  noise = rng.integers(0, len(labels), f['labels'].shape)
  predictions = np.where(f['labels'] >= 0, f['labels'], noise)
  num_words = [len(s.words) for s in sentences]
  got = task_features.tags_from_predictions(predictions, f['word_ids'], num_words, labels)
  assert got == [list(s.tags) for s in sentences]
  logits = np.eye(len(labels))[predictions] + rng.random(predictions.shape + (len(labels),)) * .5
  assert task_features.tags_from_predictions(logits, f['word_ids'], num_words, labels) == got
  # Cut at 6 positions (4 sub-words): later words get the default tag back.
  short = task_features.tagging_features(sentences, tokenizer, 6, labels)
  got = task_features.tags_from_predictions(short['labels'].clip(0), short['word_ids'],
                                            num_words, labels, default='O')
  assert got[2] == ['B-LOC', 'B-LOC', 'O', 'O'] and got[0] == ['B-ORG', 'O', 'B-MISC'] + ['O'] * 6
  with pytest.raises(ValueError, match=r"sentence 0, word 0 \('EU'\): tag 'I-ORG' is not in"):
    task_features.tagging_features([TaggedSentence(('EU',), ('I-ORG',))], tokenizer, 8,
                                   ('O', 'B-ORG'))


# ----------------------------------------------------------------------------- classification


def _reference_truncate(tokens_a, tokens_b, max_length):
  """run_classifier.py's `_truncate_seq_pair`, verbatim in behaviour."""
  while True:
    if len(tokens_a) + len(tokens_b) <= max_length:
      break
    if len(tokens_a) > len(tokens_b):
      tokens_a.pop()
    else:
      tokens_b.pop()


def test_truncation_matches_the_reference_loop():
  rng = random.Random(0)
  for _ in range(2000):
    la, lb, m = rng.randint(0, 60), rng.randint(0, 60), rng.randint(0, 90)
    a, b = list(range(la)), list(range(lb))
    _reference_truncate(a, b, m)
    assert task_features.truncate_seq_pair(la, lb, m) == (len(a), len(b))


def test_pair_features_are_cls_a_sep_b_sep_like_hf(tokenizer):
  import transformers
  hf = transformers.BertTokenizerFast(vocab=VOCAB, do_lower_case=True)
  examples = [Example('0', 'The cat sat.', 'A dog barked loudly.', '1', 0),
              Example('1', 'Unaffable tokenization!', None, '0', 1),
              Example('2', 'Short.', 'Also short.', None, 2)]
  f = task_features.classification_features(examples, tokenizer, 16, ('0', '1'))
  for i, e in enumerate(examples):
    want = hf(e.text_a, e.text_b, max_length=16, padding='max_length')
    assert f['input_ids'][i].tolist() == want['input_ids']
    assert f['segment_ids'][i].tolist() == want['token_type_ids']
    assert f['input_mask'][i].tolist() == want['attention_mask']
  assert f['labels'].tolist() == [1, 0, -1] and f['label_weights'].tolist() == [1, 1, 0]
  assert f['input_ids'].dtype == np.int32


def test_pair_truncation_trims_the_longer_side_first(tokenizer):
  a = 'one two three four five six seven eight nine ten'
  b = 'alpha beta gamma'
  f = task_features.classification_features([Example('0', a, b, 0.5, 0)], tokenizer, 10, None)
  ids = f['input_ids'][0].tolist()
  ta, tb = tokenizer.encode(a), tokenizer.encode(b)
  la, lb = task_features.truncate_seq_pair(len(ta), len(tb), 7)
  assert (la, lb) == (4, 3)
  assert ids == [101] + ta[:4] + [102] + tb + [102]
  assert f['segment_ids'][0].tolist() == [0] * 6 + [1] * 4
  assert f['labels'].dtype == np.float32 and f['labels'][0] == 0.5
  one = task_features.classification_features([Example('0', a, None, '1', 0)], tokenizer, 5,
                                               ('0', '1'))
  assert one['input_ids'][0].tolist() == [101] + ta[:3] + [102]
  with pytest.raises(ValueError, match=r"example x: label 'maybe' is not in the label list"):
    task_features.classification_features([Example('x', 'a', None, 'maybe', 0)], tokenizer, 8,
                                          ('0', '1'))
  with pytest.raises(ValueError, match=r"example y: label 'pos' is not a number; pass the"):
    task_features.classification_features([Example('y', 'a', None, 'pos', 0)], tokenizer, 8,
                                          None)


# ----------------------------------------------------------------------------- SQuAD

_FILLER = ('The committee met again in the spring and reviewed the many reports that had been '
           'filed during the previous year by the regional offices. ')
_CONTEXT_1 = ('John Smith (1895-1943) was a painter. ' + _FILLER * 4 +
              'He later moved to Zürich, where he opened a studio called "Blue Door". ' +
              _FILLER * 3 + 'The studio closed in 1941 after a fire.')
_CONTEXT_2 = ('The Japanese electronics industry is the largest in the world. ' + _FILLER * 5 +
              'Its exports reached 75 billion dollars.')


def _squad_json(version_2=False):
  def qa(qid, question, answer=None, context=_CONTEXT_1, impossible=False, start=None):
    answers = [] if answer is None else [
        {'text': answer, 'answer_start': context.index(answer) if start is None else start}]
    out = {'id': qid, 'question': question, 'answers': answers}
    if version_2:
      out['is_impossible'] = impossible
    return out

  qas1 = [qa('q1', 'What year was John Smith born?', '1895'),
          qa('q2', 'Where did he move?', 'Zürich'),
          qa('q3', 'What was the studio called?', '"Blue Door"'),
          qa('q4', 'When did the studio close?', '1941'),
          qa('q5', 'Who was a painter?', 'John Smith')]
  qas2 = [qa('q6', 'Which country has the largest electronics industry?', 'Japan',
             context=_CONTEXT_2),
          qa('q7', 'How much did exports reach?', '75 billion dollars', context=_CONTEXT_2)]
  if version_2:
    qas2.append(qa('q8', 'What is the capital of the studio?', None, context=_CONTEXT_2,
                   impossible=True))
  return {'version': '2.0' if version_2 else '1.1', 'data': [
      {'title': 'Smith', 'paragraphs': [{'context': _CONTEXT_1, 'qas': qas1}]},
      {'title': 'Japan', 'paragraphs': [{'context': _CONTEXT_2, 'qas': qas2}]}]}


@pytest.fixture
def squad_file(tmp_path):
  def make(version_2=False, data=None):
    path = tmp_path / f'squad{int(version_2)}.json'
    path.write_text(json.dumps(data or _squad_json(version_2), ensure_ascii=False),
                    encoding='utf-8')
    return str(path)
  return make


def _span_text(example, feature, tokenizer):
  return squad_answers._span_text(example, feature, feature.start_position,
                                  feature.end_position, tokenizer,
                                  squad_answers.text_normalization(tokenizer))


def test_squad_windows_recover_every_gold_span(squad_file, tokenizer):
  examples = squad.read_squad(squad_file())
  assert [e.qas_id for e in examples] == ['q1', 'q2', 'q3', 'q4', 'q5', 'q6', 'q7']
  features = squad.squad_features(examples, tokenizer, max_seq_length=64, doc_stride=16,
                                  max_query_length=12, is_training=True)
  per_example = {}
  for f in features:
    per_example.setdefault(f.example_index, []).append(f)
    assert f.num_tokens <= 64 and len(f.input_ids) == 64
    assert f.input_ids[0] == tokenizer.cls_id and f.input_ids[f.num_tokens - 1] == tokenizer.sep_id
    if f.start_position:  # this window holds the answer: its text is the gold answer
      example = examples[f.example_index]
      assert f.segment_ids[f.start_position] == 1 and f.start_position <= f.end_position
      got = _span_text(example, f, tokenizer)
      # 'Japan' inside the word 'Japanese' is the reference's documented limit: whole words.
      gold = 'Japanese' if example.qas_id == 'q6' else example.answers[0].text
      assert normalize_answer(got) == normalize_answer(gold)
      assert got == gold  # exactly, even '"Blue Door"' out of 'Door".'
    else:
      assert f.end_position == 0
  for index, example in enumerate(examples):
    windows = per_example[index]
    assert len(windows) >= 4  # long contexts: several windows each
    assert any(w.start_position for w in windows), example.qas_id
    # Every context token is the max-context token of exactly one window.
    counts = {}
    for w in windows:
      for position, is_max in w.token_is_max_context.items():
        counts.setdefault((w.doc_span_index, position), is_max)
    doc_len = len(squad._tokenize_doc(example, tokenizer).ids)
    assert sum(counts.values()) == doc_len


def test_squad_span_is_narrowed_to_the_answer_tokens(squad_file, tokenizer):
  examples = squad.read_squad(squad_file())
  q1 = examples[0]
  assert q1.doc_tokens[q1.start_position] == '(1895-1943)'  # the whitespace word
  f = next(f for f in squad.squad_features([q1], tokenizer, max_seq_length=64, doc_stride=16,
                                          max_query_length=12) if f.start_position)
  assert f.start_position == f.end_position  # just the token "1895"
  assert tokenizer.id_to_token(int(f.input_ids[f.start_position])) == '1895'
  japan = examples[5]  # "Japan" inside "Japanese": the whole word, as the reference
  f = next(f for f in squad.squad_features([japan], tokenizer, max_seq_length=64,
                                           doc_stride=16, max_query_length=12)
           if f.start_position)
  assert _span_text(japan, f, tokenizer) == 'Japanese'


def test_squad_predictions_from_gold_logits(squad_file, tokenizer):
  examples = squad.read_squad(squad_file(version_2=True))
  features = squad.squad_features(examples, tokenizer, max_seq_length=64, doc_stride=16,
                                  max_query_length=12)
  arrays = squad.feature_arrays(features)
  assert arrays['input_ids'].shape == (len(features), 64)
  assert arrays['unique_ids'][0] == squad.UNIQUE_ID_START
  start = np.zeros((len(features), 64))
  end = np.zeros((len(features), 64))
  rows = np.arange(len(features))
  start[rows, arrays['start_positions']] += 10.0
  end[rows, arrays['end_positions']] += 10.0
  want = {'q1': '1895', 'q2': 'Zürich', 'q3': '"Blue Door"', 'q4': '1941',
          'q5': 'John Smith', 'q6': 'Japanese', 'q7': '75 billion dollars', 'q8': ''}
  # The null score is the smallest over the windows: 0 where a window holds the answer (vs
  # 20 for the span), 20 everywhere for the unanswerable q8 (vs 0 for any span).
  v2 = squad_answers.squad_predictions(examples, features, start, end, tokenizer,
                                       version_2_with_negative=True)
  assert v2.predictions == want
  assert v2.null_odds == {q: -20.0 if a else 20.0 for q, a in want.items()}
  v2 = squad_answers.squad_predictions(examples, features, start, end, tokenizer,
                                       version_2_with_negative=True,
                                       null_score_diff_threshold=25.0)
  assert v2.predictions['q8'] != '' and v2.predictions['q1'] == '1895'
  assert v2.nbest['q1'][0]['text'] == '1895' and len(v2.nbest['q1']) == 21  # 20 + null
  assert abs(sum(e['probability'] for e in v2.nbest['q1']) - 1) < 1e-9
  # SQuAD 1.1: no null answer; a window without the answer adds nothing.
  v1 = squad_answers.squad_predictions(examples, features, start, end, tokenizer)
  assert {q: v1.predictions[q] for q in want if q != 'q8'} == {
      q: a for q, a in want.items() if q != 'q8'}


def test_squad_answer_length_and_max_context_rules(squad_file, tokenizer):
  examples = squad.read_squad(squad_file())[:1]
  features = squad.squad_features(examples, tokenizer, max_seq_length=64, doc_stride=16,
                                  max_query_length=12)
  f0 = features[0]
  start, end = np.full((len(features), 64), -100.0), np.full((len(features), 64), -100.0)
  assert 20 in f0.token_to_orig_map and 51 in f0.token_to_orig_map
  start[0, 20], end[0, 51] = 10, 10  # 32 tokens: longer than max_answer_length=30
  start[0, 15], end[0, 16] = 4, 4
  got = squad_answers.squad_predictions(examples, features, start, end, tokenizer,
                                        max_answer_length=30)
  words = examples[0].doc_tokens
  assert got.predictions['q1'] == squad_answers.get_final_text(
      squad_answers.detokenize([tokenizer.id_to_token(int(i)) for i in f0.input_ids[15:17]],
                               tokenizer),
      ' '.join(words[f0.token_to_orig_map[15]:f0.token_to_orig_map[16] + 1]), True)
  # A start outside its max-context window is never chosen.
  not_max = next(p for p, m in features[1].token_is_max_context.items() if not m)
  start[:], end[:] = -100, -100
  start[1, not_max], end[1, not_max] = 20, 20
  start[0, 15], end[0, 15] = 1, 1
  got = squad_answers.squad_predictions(examples, features, start, end, tokenizer)
  assert got.nbest['q1'][0]['start_logit'] == 1


def test_get_final_text_projects_onto_the_original():
  assert squad_answers.get_final_text('steve smith', "Steve Smith's", True) == 'Steve Smith'
  assert squad_answers.get_final_text('1895', '(1895-1943).', True) == '1895'
  assert squad_answers.get_final_text('zurich', 'Zürich,', True) == 'Zürich'
  assert squad_answers.get_final_text('absent', 'Other words', True) == 'Other words'


def test_squad_training_drops_unrecoverable_answers(squad_file, tokenizer):
  data = _squad_json()
  qa = data['data'][1]['paragraphs'][0]['qas'][0]
  qa['answers'][0]['text'] = 'Korea'  # at Japan's offset: not in the words there
  examples = squad.read_squad(squad_file(data=data))
  assert not examples[5].recoverable and examples[6].recoverable
  train = squad.squad_features(examples, tokenizer, max_seq_length=64, doc_stride=16,
                               max_query_length=12, is_training=True)
  assert 5 not in {f.example_index for f in train}
  evaluate = squad.squad_features(examples, tokenizer, max_seq_length=64, doc_stride=16,
                                  max_query_length=12)
  assert 5 in {f.example_index for f in evaluate}


@pytest.mark.parametrize('mutate,error', [
    (lambda d: d['data'][0]['paragraphs'][0].pop('context'),
     r"data\[0\].paragraphs\[0\], field 'context': missing"),
    (lambda d: d['data'][0]['paragraphs'][0]['qas'][1]['answers'][0].update(answer_start=10**6),
     r"data\[0\].paragraphs\[0\].qas\[1\], field 'answers\[0\]': answer 'Zürich' at character "
     r"1000000 does not lie in the"),
    (lambda d: d['data'][0]['paragraphs'][0]['qas'][0]['answers'][0].update(answer_start='3'),
     r"qas\[0\].answers\[0\], field 'answer_start': expected int, got '3'"),
    (lambda d: d['data'][1]['paragraphs'][0]['qas'][0].update(is_impossible='no'),
     r"data\[1\].paragraphs\[0\].qas\[0\], field 'is_impossible': expected true/false"),
    (lambda d: d.pop('data'), r"field 'data': expected \{\"data\": \[articles\]\}"),
    (lambda d: d.update(data=[]), r'no examples'),
])
def test_bad_squad_input_names_the_json_path(squad_file, mutate, error):
  data = _squad_json()
  mutate(data)
  with pytest.raises(ValueError, match=error):
    squad.read_squad(squad_file(data=data))


def test_squad_not_json(tmp_path):
  path = tmp_path / 'bad.json'
  path.write_text('{"data": [\n  {"paragraphs": }\n]}')
  with pytest.raises(ValueError, match=r'bad.json, line 2: not a SQuAD JSON file'):
    squad.read_squad(str(path))


def _spm(tmp_path, lowercase):
  """A tiny SentencePiece model trained here, cased or case-folding (nmt_nfkc_cf)."""
  sentences = ["Steve Smith's bat broke in the second match.",
               'Steve Smith moved to Zürich, then left Zürich for Paris.',
               'The captain praised Steve Smith after the match.',
               'Zürich is a city; Paris is a city too.'] * 20
  return SentencePieceTokenizer.train(sentences, 60, str(tmp_path / f'sp{int(lowercase)}'),
                                      lowercase=lowercase)


def _gold_logits(features, length):
  """Logits that put each window's gold start and end (or [CLS]) far above the rest."""
  start, end = np.zeros((len(features), length)), np.zeros((len(features), length))
  for k, f in enumerate(features):
    start[k, f.start_position] = end[k, f.end_position] = 10.0
  return start, end


def test_squad_answers_keep_the_sentencepiece_models_own_casing(squad_file, tmp_path):
  context = "In the second match Steve Smith's bat broke. He moved to Zürich, then left."
  data = {'data': [{'paragraphs': [{'context': context, 'qas': [
      {'id': 'who', 'question': 'Whose bat broke?',
       'answers': [{'text': 'Steve Smith', 'answer_start': context.index('Steve')}]},
      {'id': 'where', 'question': 'Where did he move?',
       'answers': [{'text': 'Zürich', 'answer_start': context.index('Zürich')}]}]}]}]}
  examples = squad.read_squad(squad_file(data=data))
  for lowercase in (False, True):
    tok = _spm(tmp_path, lowercase)
    assert tok.do_lower_case is lowercase  # read from the model, not guessed
    # SentencePiece keeps accents.
    assert squad_answers.text_normalization(tok) == (lowercase, False)
    features = squad.squad_features(examples, tok, max_seq_length=48, max_query_length=12)
    got = squad_answers.squad_predictions(examples, features, *_gold_logits(features, 48), tok)
    # The spans' words are "Smith's" and "Zürich,": the answer is cut out of them.
    assert got.predictions == {'who': 'Steve Smith', 'where': 'Zürich'}, lowercase
  # Guessing lowercase for the cased model (the bug): its "Steve Smith" is not found in the
  # lowercased context, so the whole words come back. BERT's accent stripping, applied to
  # the case-folding model's "zürich", loses "Zürich" the same way.
  assert squad_answers.get_final_text('Steve Smith', "Steve Smith's", True) == "Steve Smith's"
  assert squad_answers.get_final_text('Steve Smith', "Steve Smith's", False) == 'Steve Smith'
  assert squad_answers.get_final_text('zürich', 'Zürich,', True) == 'Zürich,'
  assert squad_answers.get_final_text('zürich', 'Zürich,', True, False) == 'Zürich'


# evaluate-v2.0.py, the official SQuAD 2.0 evaluation script (linked from
# https://rajpurkar.github.io/SQuAD-explorer/), verbatim: the functions behind its
# best_exact / best_exact_thresh / best_f1 / best_f1_thresh. Run in its own namespace, as its
# normalize_answer would shadow ours.
_OFFICIAL_V2 = r'''
import collections
import re
import string


def make_qid_to_has_ans(dataset):
    qid_to_has_ans = {}
    for article in dataset:
        for p in article['paragraphs']:
            for qa in p['qas']:
                qid_to_has_ans[qa['id']] = bool(qa['answers'])
    return qid_to_has_ans


def normalize_answer(s):
    """Lower text and remove punctuation, articles and extra whitespace."""

    def remove_articles(text):
        regex = re.compile(r'\b(a|an|the)\b', re.UNICODE)
        return re.sub(regex, ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def get_tokens(s):
    if not s: return []
    return normalize_answer(s).split()


def compute_exact(a_gold, a_pred):
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold, a_pred):
    gold_toks = get_tokens(a_gold)
    pred_toks = get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def get_raw_scores(dataset, preds):
    exact_scores = {}
    f1_scores = {}
    for article in dataset:
        for p in article['paragraphs']:
            for qa in p['qas']:
                qid = qa['id']
                gold_answers = [a['text'] for a in qa['answers']
                                if normalize_answer(a['text'])]
                if not gold_answers:
                    # For unanswerable questions, only correct answer is empty string
                    gold_answers = ['']
                if qid not in preds:
                    print('Missing prediction for %s' % qid)
                    continue
                a_pred = preds[qid]
                # Take max over all gold answers
                exact_scores[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
                f1_scores[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
    return exact_scores, f1_scores


def find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for i, qid in enumerate(qid_list):
        if qid not in scores: continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            if preds[qid]:
                diff = -1
            else:
                diff = 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def find_all_best_thresh(main_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans):
    best_exact, exact_thresh = find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
    best_f1, f1_thresh = find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
    main_eval['best_exact'] = best_exact
    main_eval['best_exact_thresh'] = exact_thresh
    main_eval['best_f1'] = best_f1
    main_eval['best_f1_thresh'] = f1_thresh
'''


def _official_best_thresholds(gold, preds, na_probs):
  """What evaluate-v2.0.py --na-prob-file reports for these, through its own functions."""
  official = {}
  exec(compile(_OFFICIAL_V2, 'evaluate-v2.0.py', 'exec'), official)  # pylint: disable=exec-used
  dataset = [{'paragraphs': [{'qas': [{'id': q, 'answers': [{'text': a} for a in answers]}
                                      for q, answers in gold.items()]}]}]
  exact_raw, f1_raw = official['get_raw_scores'](dataset, preds)
  out = {}
  official['find_all_best_thresh'](out, preds, exact_raw, f1_raw, na_probs,
                                   official['make_qid_to_has_ans'](dataset))
  return out


def test_squad_v2_best_thresholds_are_the_official_scripts(squad_file, tokenizer, capsys):
  from bert_jax.finetune import metrics  # pylint: disable=g-import-not-at-top
  words = ['alpha', 'beta', 'gamma', 'the', 'delta', 'a']
  for seed in range(20):
    rng = random.Random(seed)
    gold, preds, na_probs = {}, {}, {}
    for n in range(rng.randint(1, 60)):
      q = f'q{n}'
      gold[q] = [] if rng.random() < 0.4 else [
          ' '.join(rng.choices(words, k=rng.randint(1, 3))) for _ in range(rng.randint(1, 3))]
      if rng.random() < 0.9:  # some questions have no prediction
        preds[q] = rng.choice(['', ' '.join(rng.choices(words, k=rng.randint(1, 3)))] +
                              gold[q])
      na_probs[q] = round(rng.gauss(0, 2), 1)  # ties included
    if not preds:
      continue
    want = _official_best_thresholds(gold, preds, na_probs)
    got = metrics.squad_v2_best_thresholds(gold, preds, na_probs)
    assert got.keys() == want.keys()
    for k in want:
      assert got[k] == pytest.approx(want[k], abs=1e-9), (seed, k)
  # And on what squad_predictions gives: its null odds are the script's na_probs.
  examples = squad.read_squad(squad_file(version_2=True))
  features = squad.squad_features(examples, tokenizer, max_seq_length=64, doc_stride=16,
                                  max_query_length=12)
  logits = np.random.default_rng(0).normal(size=(2, len(features), 64))
  for shift in (-3.0, 0.0, 3.0):  # the null's logits raised or lowered
    logits[:, :, 0] += shift
    out = squad_answers.squad_predictions(examples, features, *logits, tokenizer,
                                          version_2_with_negative=True)
    gold = squad.gold_answers(examples)
    assert metrics.squad_v2_best_thresholds(gold, out.predictions, out.null_odds) == (
        pytest.approx(_official_best_thresholds(gold, out.predictions, out.null_odds)))
  capsys.readouterr()  # the script's "Missing prediction" lines


def test_squad_unaligned_answers_are_one_line_per_file_and_refused_above_a_limit(
    squad_file, tokenizer, caplog):
  data = _squad_json()
  data['data'][1]['paragraphs'][0]['qas'][0]['answers'][0]['text'] = 'Korea'  # at "Japan"
  long_answer = _FILLER.strip()  # 25 tokens: only a window starting at most 1 before it
  data['data'][0]['paragraphs'][0]['qas'].append(
      {'id': 'q9', 'question': 'What happened?',
       'answers': [{'text': long_answer, 'answer_start': _CONTEXT_1.index(long_answer)}]})
  path = squad_file(data=data)
  examples = squad.read_squad(path)
  kwargs = dict(max_seq_length=32, doc_stride=8, max_query_length=8, source=path)
  summary = (f"{path}: 2 of 8 answers could not be aligned (25.00%) and were dropped: 1 whose "
             "answer_start does not point at the answer text (e.g. q6: 'Korea' at character "
             "4, where the context reads 'Japan'); 1 whose tokens no single window holds "
             "(e.g. q9: 25 tokens; windows of 26 context tokens every 8)")
  caplog.clear()
  train = squad.squad_features(examples, tokenizer, is_training=True,
                               max_misaligned_fraction=0.25, **kwargs)
  assert {f.example_index for f in train} == {0, 1, 2, 3, 4, 7}  # not q9 (5), q6 (6)
  assert [(r.levelname, r.getMessage()) for r in caplog.records] == [('WARNING', summary)]
  caplog.clear()
  evaluate = squad.squad_features(examples, tokenizer, max_misaligned_fraction=0.0, **kwargs)
  assert {f.example_index for f in evaluate} == set(range(8))  # scored by text: all kept
  assert [r.getMessage() for r in caplog.records] == [summary.replace(
      'and were dropped', 'and were kept, since evaluation compares answer texts, not positions')]
  with pytest.raises(ValueError) as error:
    squad.squad_features(examples, tokenizer, is_training=True, max_misaligned_fraction=0.2,
                         **kwargs)
  assert str(error.value).startswith(
      f'{path}: 2 of 8 answers could not be aligned (25.00%), more than '
      'max_misaligned_fraction=0.2 allows: 1 whose answer_start')
  assert str(error.value).endswith('or raise --config.data.max_misaligned_fraction')
  caplog.clear()
  squad.squad_features(examples[:5], tokenizer, is_training=True, max_misaligned_fraction=0.0,
                       **kwargs)
  assert not caplog.records  # nothing to report: no line


# ----------------------------------------------------------------------------- TFDS


def _mock_tfds(rows):
  from input_pipeline.tf_data import tf
  import tensorflow_datasets as tfds

  def as_dataset(self, split, *args, **kwargs):
    del args, kwargs
    as_dataset.calls.append((self.name, self.builder_config.name, str(split)))
    return tf.data.Dataset.from_tensor_slices(rows)

  as_dataset.calls = []
  return tfds.testing.mock_data(as_dataset_fn=as_dataset), as_dataset.calls


def test_tfds_glue_maps_labels_by_name():
  mock, calls = _mock_tfds({'premise': ['p0', 'p1', 'p2'], 'hypothesis': ['h0', 'h1', 'h2'],
                            'label': [0, 1, 2], 'idx': [7, 8, 9]})
  with mock:
    got = glue.read_tfds_glue('MNLI', 'dev')
  assert calls == [('glue', 'mnli', 'validation_matched')]
  # TFDS's MNLI order is entailment, neutral, contradiction; ours the reference's.
  assert [(e.text_a, e.text_b, e.label, e.index) for e in got] == [
      ('p0', 'h0', 'entailment', 7), ('p1', 'h1', 'neutral', 8),
      ('p2', 'h2', 'contradiction', 9)]
  mock, calls = _mock_tfds({'sentence': ['good film', 'bad film', 'unseen'],
                            'label': [1, 0, -1], 'idx': [0, 1, 2]})
  with mock:
    got = glue.read_tfds_glue('sst2', 'train')
  assert [(e.text_a, e.text_b, e.label) for e in got] == [
      ('good film', None, '1'), ('bad film', None, '0'), ('unseen', None, None)]
  mock, _ = _mock_tfds({'sentence1': ['a'], 'sentence2': ['b'], 'label': [3.2], 'idx': [0]})
  with mock:
    assert glue.read_tfds_glue('stsb', 'dev')[0].label == pytest.approx(3.2)


def test_tfds_squad_and_conll():
  context = 'Denver Broncos won Super Bowl 50 in 2016.'
  mock, calls = _mock_tfds({
      'id': ['a1', 'a2'], 'title': ['t', 't'], 'context': [context, context],
      'question': ['Who won?', 'When?'],
      'answers': {'text': [['Denver Broncos'], ['2016']],
                  'answer_start': [[0], [context.index('2016')]]}})
  with mock:
    got = squad.read_tfds_squad('validation')
  assert calls == [('squad', 'v1.1', 'validation')]
  assert [(e.qas_id, e.answers[0], e.doc_tokens[e.start_position]) for e in got] == [
      ('a1', squad.Answer('Denver Broncos', 0), 'Denver'),
      ('a2', squad.Answer('2016', 36), '2016.')]
  mock, _ = _mock_tfds({'tokens': [['EU', 'rejects', 'German']], 'pos': [[22, 42, 16]],
                        'chunks': [[11, 21, 11]], 'ner': [[3, 0, 7]]})
  with mock:
    got = conll.read_tfds_conll('train')
  assert got[0].words == ('EU', 'rejects', 'German')
  assert got[0].tags == ('B-ORG', 'O', 'B-MISC')


# ----------------------------------------------------------------------------- submissions


def test_glue_submission_files(tmp_path):
  path = glue.write_glue_submission(str(tmp_path), 'MNLI-m', [0, 1, 2], [1, 0, 2])
  assert os.path.basename(path) == 'MNLI-m.tsv'
  assert open(path).read() == ('index\tprediction\n0\tentailment\n1\tcontradiction\n'
                               '2\tneutral\n')
  path = glue.write_glue_submission(str(tmp_path), 'STS-B', [0, 1], np.array([4.12345, 0.5]))
  assert open(path).read() == 'index\tprediction\n0\t4.123\n1\t0.500\n'
  path = glue.write_glue_submission(str(tmp_path), 'CoLA', np.arange(2), np.array([1, 0]))
  assert open(path).read() == 'index\tprediction\n0\t1\n1\t0\n'
  path = glue.write_glue_submission(str(tmp_path), 'AX', [0], ['neutral'])
  assert open(path).read() == 'index\tprediction\n0\tneutral\n'
  assert glue.submission_name('MNLI', 'test_mismatched') == 'MNLI-mm'
  assert glue.submission_name('mnli', 'test') == 'MNLI-m'
  assert glue.submission_name('sst2') == 'SST-2'
  with pytest.raises(ValueError, match=r"RTE: prediction 'neutral' is not one of"):
    glue.write_glue_submission(str(tmp_path), 'RTE', [0], ['neutral'])
  with pytest.raises(ValueError, match=r'QNLI: label id 2 outside 0..1'):
    glue.write_glue_submission(str(tmp_path), 'QNLI', [0], [2])
  with pytest.raises(ValueError, match=r'MRPC: 2 indices but 1 predictions'):
    glue.write_glue_submission(str(tmp_path), 'MRPC', [0, 1], [1])
  with pytest.raises(ValueError, match=r"unknown GLUE submission 'MNLI'"):
    glue.write_glue_submission(str(tmp_path), 'MNLI', [0], [1])


def test_glue_test_split_to_submission_end_to_end(glue_dir, tmp_path):
  test = glue.read_glue('QQP', _task_dir(glue_dir, 'QQP'), 'test')
  path = glue.write_glue_submission(str(tmp_path), glue.submission_name('QQP'),
                                    [e.index for e in test], [1] * len(test))
  assert open(path).read().splitlines() == ['index\tprediction', '0\t1']


# ----------------------------------------------------------------------------- CoNLL layouts

# One document in each layout: 2 columns (word TAG), CoNLL-2003 English's 4 (word POS chunk
# NER) and CoNLL-2003 German's 5 (word lemma POS chunk NER); the NER tags are the last column.
CONLL_LAYOUTS = {
    2: '-DOCSTART- O\n\nEU I-ORG\nrejects O\n\nPeter B-PER\n',
    4: '-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n',
    5: ('-DOCSTART- -X- -X- -X- O\n\nEU EU NNP B-NP I-ORG\nrejects reject VBZ B-VP O\n\n'
        'Peter Peter NNP B-NP B-PER\n'),
}


@pytest.mark.parametrize('columns', sorted(CONLL_LAYOUTS))
def test_conll_column_count_comes_from_the_file(tmp_path, columns):
  path = _write(tmp_path, f'ner{columns}.txt', CONLL_LAYOUTS[columns])
  got = conll.read_conll(path)
  assert [s.words for s in got] == [('EU', 'rejects'), ('Peter',)]
  assert [s.tags for s in got] == [('I-ORG', 'O'), ('B-PER',)]
  assert got[0].pos == (('NNP', 'VBZ') if columns == 4 else None)
  if columns == 2:
    with pytest.raises(ValueError, match=r"ner2.txt, line 3: label_column=-3 is outside the "
                       r"file's 2 columns"):
      conll.read_conll(path, label_column=-3)
  else:  # the POS tags, counted from the end or the start
    pos = [('NNP', 'VBZ'), ('NNP',)]
    assert [s.tags for s in conll.read_conll(path, label_column=-3)] == pos
    assert [s.tags for s in conll.read_conll(path, label_column=columns - 3)] == pos
  tabs = _write(tmp_path, f'tabs{columns}.tsv', CONLL_LAYOUTS[columns].replace(' ', '\t'))
  assert conll.read_conll(tabs) == got


def test_conll_pos_file_and_inconsistent_columns(tmp_path):
  pos = conll.read_conll(_write(tmp_path, 'pos.txt', 'The DT\ncat NN\nsat VBD\n. .\n\nIt PRP\n'))
  assert pos == [TaggedSentence(('The', 'cat', 'sat', '.'), ('DT', 'NN', 'VBD', '.')),
                 TaggedSentence(('It',), ('PRP',))]
  with pytest.raises(ValueError, match=(
      r"pos.txt, line 4: expected 2 space-separated columns \(word TAG\), found 3: "
      r"'New York NNP'; the file's first word line \(line 2\) sets the column count")):
    conll.read_conll(_write(tmp_path, 'pos.txt', '\nThe DT\n\nNew York NNP\n'))
  with pytest.raises(ValueError, match=r"de.txt, line 2: expected 5 space-separated columns "
                     r"\(word \.\.\. TAG\), found 4"):
    conll.read_conll(_write(tmp_path, 'de.txt', 'EU EU NNP B-NP I-ORG\nx NN I-NP O\n'))


@pytest.mark.parametrize('labels,bio', [
    (conll.CONLL2003_LABELS, True),
    (('O', 'S-LOC', 'B-PER', 'E-PER'), True),  # IOBES
    (('B-NP', 'I-NP', 'O'), True),  # chunk tags: conlleval scores chunking by chunk F1
    (('I-ORG',), True),
    (('DT', 'NN', 'VBZ', '.'), False),
    (('-LRB-', 'NNP', 'PRP$'), False),
    (('O', 'B-PER', 'NNP'), False),  # mixed: not an entity tag set
    (('O',), False),
])
def test_entity_tag_sets_are_told_from_bare_ones(labels, bio):
  assert conll.is_bio(labels) is bio


# ----------------------------------------------------------------------------- AX beside MNLI


def test_ax_is_found_beside_or_under_the_glue_directory(tmp_path):
  root = tmp_path / 'glue_data'
  mnli = str(root / 'MNLI')
  os.makedirs(mnli)
  with pytest.raises(FileNotFoundError, match=(
      r'MNLI/diagnostic.tsv: no such file \(GLUE AX test; also looked for .*MNLI/AX.tsv, .*'
      r'glue_data/AX/AX.tsv')):
    glue.read_glue('AX', mnli, 'test')
  _write(root, 'AX/AX.tsv', _tsv(('index', 'sentence1', 'sentence2'),
                                 ('0', 'The cat sat on the mat.', 'The cat did not sit.'),
                                 ('1', 'A dog barked.', 'An animal made a sound.')))
  got = glue.read_glue('AX', mnli, 'test')  # glue_data/MNLI -> glue_data/AX/AX.tsv
  assert [(e.text_a, e.label, e.index) for e in got] == [
      ('The cat sat on the mat.', None, 0), ('A dog barked.', None, 1)]
  assert glue.read_glue('AX', mnli + os.sep, 'test') == got
  assert glue.read_glue('AX', str(root), 'test') == got  # the download's root
  assert glue.read_glue('AX', str(root / 'AX'), 'test') == got  # its own directory
  elsewhere = _write(tmp_path, 'diag/my_ax.tsv', _tsv(('index', 'sentence1', 'sentence2'),
                                                      ('7', 'a', 'b')))
  assert [e.index for e in glue.read_glue('AX', mnli, 'test', path=elsewhere)] == [7]
  with pytest.raises(FileNotFoundError, match=r'nope.tsv: no such file \(GLUE AX test\)'):
    glue.read_glue('AX', mnli, 'test', path=str(tmp_path / 'nope.tsv'))
