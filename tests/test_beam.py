"""The data tool on Apache Beam (issue 29): the same shards, byte for byte, as the local tool.

One DirectRunner pipeline (2 worker processes, multi_processing) runs four jobs at once, one
start-up for all: text files with a corrupt document (NSP, unpacked), JSONL with an undecodable
record and an empty file (SOP, packed), Parquet with a corrupt file (full-sentence rows,
unpacked) and text on gs:// to gs:// on the GCS emulator (full-sentence rows, packed). Each is
compared with the local tool's run of the same Job: every shard byte-identical, the stats JSON
equal but for timings. The command line (`--runner=DirectRunner`) runs once more, end to end.
Needs requirements-beam.txt (skipped without apache_beam).
"""

import json
import os
import random
import subprocess
import sys

import pytest

beam = pytest.importorskip('apache_beam')

import gcs_server  # noqa: E402
from input_pipeline import fs  # noqa: E402
from input_pipeline.pretrain import beam_pipeline  # noqa: E402
from input_pipeline.pretrain import corpus, create_pretraining_data as cpd  # noqa: E402
from input_pipeline.pretrain.instances import MaskingConfig  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')
BUCKET = 'gs://bert-jax-beam-test'
BEAM_ARGS = ['--runner=DirectRunner', '--direct_num_workers=2',
             '--direct_running_mode=multi_processing']
TIMINGS = ('seconds', 'instances_per_second')


def _job(inputs, out, objective, pack, shards, **kw):
  masking = MaskingConfig(max_seq_length=64, max_predictions_per_seq=10)
  return cpd.Job(output_file=out, masking=masking, vocab_file=VOCAB, input_file=inputs,
                 dupe_factor=2, window_chars=6_000, num_shards=shards, num_workers=2,
                 sentence_objective=objective, pack=pack, bad_documents='skip', **kw)


def _corpus(root):
  """Three layouts of the same kind of text, with the faults a real corpus has."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  docs = list(corpus.embedded_documents())[:360]
  os.makedirs(f'{root}/text')
  corpus.write_text_file(docs[:100], f'{root}/text/a.txt')
  corpus.write_text_file(docs[100:140], f'{root}/text/b.txt')
  with open(f'{root}/text/b.txt', 'ab') as f:  # a document with undecodable bytes
    f.write(b'A fine first sentence.\nThen \xff\xfe garbage.\nAnd more.\n\n')
  corpus.write_text_file(docs[140:160], f'{root}/text/c.txt')
  os.makedirs(f'{root}/jsonl')
  for name, part in (('0', docs[160:230]), ('1', docs[230:260])):
    with open(f'{root}/jsonl/{name}.jsonl', 'wb') as f:
      for i, doc in enumerate(part):
        f.write(json.dumps({'id': i, 'text': ' '.join(doc)}).encode() + b'\n')
        if i == 5 and name == '0':
          f.write(b'{"id": 99, "text": "bad \xff bytes"}\n')
  open(f'{root}/jsonl/2.jsonl', 'w').close()  # an empty file
  os.makedirs(f'{root}/parquet')
  for name, part in (('0', docs[260:320]), ('1', docs[320:360])):
    pq.write_table(pa.table({'id': list(range(len(part))),
                             'content': ['\n\n'.join(doc) for doc in part]}),
                   f'{root}/parquet/{name}.parquet', row_group_size=16)
  with open(f'{root}/parquet/2.parquet', 'wb') as f:  # a truncated download
    f.write(b'PAR1 not really parquet')
  return docs


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """{name: (job run locally, job run on Beam)}, every Beam job in one pipeline."""
  root = str(tmp_path_factory.mktemp('beam'))
  docs = _corpus(root)
  with gcs_server.running():
    gcsfs_fs, _ = fs._filesystem(BUCKET)  # pylint: disable=protected-access
    gcsfs_fs.mkdir(BUCKET[len('gs://'):])
    corpus.write_text_file(docs[:120], f'{BUCKET}/text/x.txt')
    corpus.write_text_file(docs[120:200], f'{BUCKET}/text/y.txt')
    specs = {
        'text_nsp': (f'{root}/text/*.txt', 'nsp', False, 3, {}),
        'jsonl_sop_packed': (f'{root}/jsonl/*.jsonl', 'sop', True, 2,
                             {'input_format': 'jsonl'}),
        'parquet_full': (f'{root}/parquet/*', 'none', False, 2,
                         {'input_format': 'parquet', 'text_field': 'content'}),
        'gs_full_packed': (f'{BUCKET}/text/*.txt', 'none', True, 2, {}),
    }
    pairs = {}
    for name, (inputs, objective, pack, shards, kw) in specs.items():
      out = lambda side, name=name: (f'{BUCKET}/{side}/{name}' if inputs.startswith('gs://')
                                     else f'{root}/{side}/{name}')
      pairs[name] = (_job(inputs, out('local'), objective, pack, shards, **kw),
                     _job(inputs, out('beam'), objective, pack, shards, **kw))
    local = {name: cpd.run(a) for name, (a, _) in pairs.items()}
    beamed = dict(zip(pairs, beam_pipeline.run_many([b for _, b in pairs.values()], BEAM_ARGS)))
    yield {name: (pairs[name], local[name], beamed[name]) for name in pairs}, root


@pytest.mark.parametrize('name', ['text_nsp', 'jsonl_sop_packed', 'parquet_full',
                                  'gs_full_packed'])
def test_beam_shards_are_byte_identical_and_stats_equal(runs, name):
  (local_job, beam_job), local, beamed = runs[0][name]
  assert local['instances'] > 50
  assert beamed['files'] == beam_job.shard_paths() and local['files'] == local_job.shard_paths()
  for a, b in zip(local_job.shard_paths(), beam_job.shard_paths()):
    assert fs.read_bytes(a) == fs.read_bytes(b), (a, b)
  assert ({k: v for k, v in local.items() if k not in TIMINGS + ('files',)} ==
          {k: v for k, v in beamed.items() if k not in TIMINGS + ('files',)})
  assert json.loads(fs.read_text(beam_job.output_file + '.stats.json')) == beamed
  assert beamed['sentence_objective'] == local_job.sentence_objective
  assert beamed['packed'] == local_job.pack


def test_faults_are_counted_and_named_never_fatal(runs):
  stats = {name: r[2] for name, r in runs[0].items()}
  assert stats['text_nsp']['documents_failed'] == 1
  assert stats['text_nsp']['failures'] == [
      f'{runs[1]}/text/b.txt, line {_line_of_bad_bytes(runs[1])}: not UTF-8 (invalid start '
      'byte at byte 5)']
  assert stats['jsonl_sop_packed']['documents_failed'] == 1
  assert stats['jsonl_sop_packed']['empty_files'] == 1
  assert 'jsonl/0.jsonl, record 7: not a JSON object' in stats['jsonl_sop_packed']['failures'][0]
  assert stats['parquet_full']['files_failed'] == 1
  assert stats['parquet_full']['failures'][0].startswith(f'{runs[1]}/parquet/2.parquet: ')
  assert stats['gs_full_packed']['documents_failed'] == 0 == stats['gs_full_packed']['failures'].__len__()


def _line_of_bad_bytes(root):
  with open(f'{root}/text/b.txt', 'rb') as f:
    return next(n for n, line in enumerate(f, 1) if b'\xff' in line)


def test_the_command_with_runner_writes_what_the_local_command_writes(runs, tmp_path):
  root = runs[1]
  common = [f'--input_file={root}/jsonl/*.jsonl', '--input_format=jsonl', f'--vocab_file={VOCAB}',
            '--max_seq_length=64', '--max_predictions_per_seq=10', '--dupe_factor=1',
            '--window_chars=6000', '--num_shards=2', '--next_sentence=nsp', '--pack']
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  for side, extra in (('local', []), ('beam', ['--runner=DirectRunner', '--num_workers=2',
                                               '--direct_running_mode=multi_processing'])):
    out = subprocess.run([sys.executable, '-m', 'input_pipeline.pretrain.create_pretraining_data',
                          f'--output_file={tmp_path}/{side}/train', *common, *extra], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'dropped 1 unreadable documents' in out.stderr
  for shard in ('train-00000-of-00002', 'train-00001-of-00002'):
    assert (tmp_path / 'local' / shard).read_bytes() == (tmp_path / 'beam' / shard).read_bytes()


def test_window_plan_cuts_where_the_local_window_rule_cuts():
  """The per-unit summaries, chained, put every document in the window `cpd.windows` does."""
  rng = random.Random(0)
  for trial in range(300):
    w = rng.choice([5, 50, 400])
    units = [[rng.choice([1, 3, 7, 40, 120, 700]) for _ in range(rng.choice([0, 1, 2, 5, 30]))]
             for _ in range(rng.randint(1, 6))]
    docs = [['x' * size] for unit in units for size in unit]
    want = [i for i, window in enumerate(cpd.windows(iter(docs), w)) for _ in window]
    import numpy as np  # pylint: disable=g-import-not-at-top
    plan = beam_pipeline.plan(
        [(i, beam_pipeline.unit_summary(np.array(u, np.int64), w)) for i, u in enumerate(units)], w)
    got = [index for i, u in enumerate(units) for index, _, _ in
           beam_pipeline.keyed_by_window([['x' * s] for s in u], *plan[i], w)]
    assert got == want, (trial, w, units)
