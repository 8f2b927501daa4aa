"""Fine-tuning data: GLUE/generic/MR/CoNLL/SQuAD readers, TFDS, features, submissions."""

import io
import json
import os
import random
import tarfile

import numpy as np
import pytest

from bert_jax.metrics import normalize_answer
from input_pipeline import conll, glue, mr, squad, task_features, tasks
from input_pipeline.tasks import Example, TaggedSentence
from input_pipeline.tokenizer import WordPieceTokenizer

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
  two = conll.read_conll(_write(tmp_path, 'wnut.txt', 'Hi O\nthere B-person\n'),
                         num_columns=2)
  assert two == [TaggedSentence(('Hi', 'there'), ('O', 'B-person'))]


@pytest.mark.parametrize('text,kwargs,error', [
    ('EU NNP B-NP I-ORG\nrejects VBZ O\n', {},
     r"line 2: expected 4 space-separated columns \(word POS chunk NER\), found 3"),
    ('EU NNP B-NP NNP\n', {}, r"line 1, field 'NER tag': 'NNP' is not a tag"),
    ('EU NNP B-NP I-ORG\n', {'tag_column': 1}, r"line 1, field 'NER tag': 'NNP' is not a tag"),
    ('EU NNP B-NP I-ORG\nx NN I-NP B-GPE\n', {'labels': conll.CONLL2003_LABELS},
     r"line 2, field 'NER tag': unknown tag 'B-GPE'"),
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
  return squad._span_text(example, feature, feature.start_position, feature.end_position,
                          tokenizer, True)


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
    doc_len = len(squad._tokenize_doc(example.doc_tokens, tokenizer).ids)
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
  v2 = squad.squad_predictions(examples, features, start, end, tokenizer,
                               version_2_with_negative=True)
  assert v2.predictions == want
  assert v2.null_odds == {q: -20.0 if a else 20.0 for q, a in want.items()}
  v2 = squad.squad_predictions(examples, features, start, end, tokenizer,
                               version_2_with_negative=True, null_score_diff_threshold=25.0)
  assert v2.predictions['q8'] != '' and v2.predictions['q1'] == '1895'
  assert v2.nbest['q1'][0]['text'] == '1895' and len(v2.nbest['q1']) == 21  # 20 + null
  assert abs(sum(e['probability'] for e in v2.nbest['q1']) - 1) < 1e-9
  # SQuAD 1.1: no null answer; a window without the answer adds nothing.
  v1 = squad.squad_predictions(examples, features, start, end, tokenizer)
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
  got = squad.squad_predictions(examples, features, start, end, tokenizer,
                                max_answer_length=30)
  words = examples[0].doc_tokens
  assert got.predictions['q1'] == squad.get_final_text(
      squad.detokenize([tokenizer.id_to_token(int(i)) for i in f0.input_ids[15:17]], tokenizer),
      ' '.join(words[f0.token_to_orig_map[15]:f0.token_to_orig_map[16] + 1]), True)
  # A start outside its max-context window is never chosen.
  not_max = next(p for p, m in features[1].token_is_max_context.items() if not m)
  start[:], end[:] = -100, -100
  start[1, not_max], end[1, not_max] = 20, 20
  start[0, 15], end[0, 15] = 1, 1
  got = squad.squad_predictions(examples, features, start, end, tokenizer)
  assert got.nbest['q1'][0]['start_logit'] == 1


def test_get_final_text_projects_onto_the_original():
  assert squad.get_final_text('steve smith', "Steve Smith's", True) == 'Steve Smith'
  assert squad.get_final_text('1895', '(1895-1943).', True) == '1895'
  assert squad.get_final_text('zurich', 'Zürich,', True) == 'Zürich'
  assert squad.get_final_text('absent', 'Other words', True) == 'Other words'


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


# ----------------------------------------------------------------------------- TFDS


def _mock_tfds(rows):
  import tensorflow as tf
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
