"""The data tool on Apache Beam (issue 29): the same shards, byte for byte, as the local tool.

One DirectRunner pipeline (2 worker processes, multi_processing) runs six jobs at once, one
start-up for all: text files with a corrupt document (NSP, unpacked), JSONL with an undecodable
record and an empty file (SOP, packed), Parquet with a corrupt file (full-sentence rows,
unpacked), text on gs:// to gs:// on the GCS emulator (full-sentence rows, packed), more shards
than windows (empty shards), and a TFDS dataset built in the test, read shard by shard by the
workers (SOP). Each is compared with the local tool's run of the same Job: the same files
published, every shard byte-identical, the stats JSON equal but for timings. The command line
(`--runner=DirectRunner`) runs once more, end to end. A file rewritten between Beam's two reads
fails its job (in-process runner); remote runners' refusals are argument checks.
Needs requirements-beam.txt (skipped without apache_beam).
"""

import itertools
import json
import os
import random
import re
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
  kw = {'window_chars': 6_000, 'num_workers': 2, **kw}
  return cpd.Job(output_file=out, masking=masking, vocab_file=VOCAB, input_file=inputs,
                 dupe_factor=2, num_shards=shards, sentence_objective=objective, pack=pack,
                 bad_documents='skip', **kw)


def _tfds_dataset(data_dir, docs):
  """A TFDS text dataset of `docs` in 3 file shards, built here (nothing downloaded); Beam's
  workers, which never import this module, load it from its files by name."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class BeamTestText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, features=tfds.features.FeaturesDict({'text': tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {'train': self._generate_examples()}

    def _generate_examples(self):
      for i, doc in enumerate(docs):
        yield i, {'text': '\n\n'.join(doc)}

  builder = BeamTestText(data_dir=data_dir)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=3))
  assert builder.info.splits['train'].num_shards == 3
  return builder.name


def _written(job):
  """The files a job published (shards, not its stats JSON), by name."""
  return sorted(os.path.basename(f) for f in fs.glob(job.output_file + '*')
                if not f.endswith('.stats.json'))


def _corpus(root):
  """Three layouts of the same kind of text, with the faults a real corpus has."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  docs = list(itertools.islice(corpus.embedded_documents(), 420))
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
        # More shards than windows (2): worker 2 of 3 (shards 2 and 5) makes no row, so the
        # local tool publishes no file of its; workers 0 and 1 publish empty shards too.
        'text_empty_shards': (f'{root}/text/c.txt', 'nsp', False, 8,
                              {'window_chars': 4_000, 'num_workers': 3}),
        'tfds_sop': (None, 'sop', False, 2,
                     {'tfds_name': _tfds_dataset(f'{root}/tfds', docs[360:420]),
                      'tfds_data_dir': f'{root}/tfds', 'num_workers': 1}),
        'jsonl_sop_packed': (f'{root}/jsonl/*.jsonl', 'sop', True, 2,
                             {'input_format': 'jsonl'}),
        'parquet_full': (f'{root}/parquet/*', 'none', False, 2,
                         {'input_format': 'parquet', 'text_field': 'content'}),
        'gs_full_packed': (f'{BUCKET}/text/*.txt', 'none', True, 2, {}),
    }
    pairs = {}
    for name, (inputs, objective, pack, shards, kw) in specs.items():
      out = lambda side, name=name: (f'{BUCKET}/{side}/{name}' if (inputs or '').startswith('gs://')
                                     else f'{root}/{side}/{name}')
      pairs[name] = (_job(inputs, out('local'), objective, pack, shards, **kw),
                     _job(inputs, out('beam'), objective, pack, shards, **kw))
    local = {name: cpd.run(a) for name, (a, _) in pairs.items()}
    beamed = dict(zip(pairs, beam_pipeline.run_many([b for _, b in pairs.values()], BEAM_ARGS)))
    yield {name: (pairs[name], local[name], beamed[name]) for name in pairs}, root


@pytest.mark.parametrize('name', ['text_nsp', 'jsonl_sop_packed', 'parquet_full',
                                  'gs_full_packed', 'text_empty_shards', 'tfds_sop'])
def test_beam_shards_are_byte_identical_and_stats_equal(runs, name):
  (local_job, beam_job), local, beamed = runs[0][name]
  assert local['instances'] > 20
  names = _written(local_job)
  assert _written(beam_job) == names  # the same files published, empty ones included
  assert [os.path.basename(f) for f in beamed['files']] == names
  assert [os.path.basename(f) for f in local['files']] == names
  if name == 'text_empty_shards':
    assert names == [os.path.basename(local_job.shard_paths()[s]) for s in (0, 1, 3, 4, 6, 7)]
    assert [fs.size(f) > 0 for f in beamed['files']] == [True, True, False, False, False, False]
  else:
    assert names == [os.path.basename(f) for f in local_job.shard_paths()]
  for a, b in zip(local['files'], beamed['files']):
    assert fs.read_bytes(a) == fs.read_bytes(b), (a, b)
  assert not fs.exists(beam_pipeline.parts_dir(beam_job))
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
  """The per-unit summaries, chained, put every document in the window `cpd.windows` does;
  the windows made where their unit is read are wholly inside it, and the others (the only
  documents that cross a shuffle) are at most two per unit, whatever the corpus size."""
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
    got, whole = [], []
    for i, u in enumerate(units):
      shared = 0
      for index, window, alone in beam_pipeline.unit_windows([['x' * s] for s in u], *plan[i], w):
        got += [index] * len(window)
        whole += [(i, index)] if alone else []
        shared += not alone
      assert shared <= 2  # the memory bound: at most two windows of a unit cross the shuffle
    assert got == want, (trial, w, units)
    # A window made where it was read has all of its documents in that unit.
    unit_of = [i for i, u in enumerate(units) for _ in u]
    assert all(unit_of[k] == i for i, index in whole for k, x in enumerate(want) if x == index)


def _replace_after_first_read(path, text):
  """A second writer: once a reader has opened and closed `path` (Beam's scan pass), atomically
  replace its contents, as a user rewriting a corpus file mid-job would. Linux inotify."""
  import ctypes  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  libc = ctypes.CDLL(None, use_errno=True)
  fd = libc.inotify_init()
  assert fd >= 0 and libc.inotify_add_watch(fd, path.encode(), 0x10) >= 0  # IN_CLOSE_NOWRITE

  def watch():
    os.read(fd, 4096)  # blocks until the first read has closed the file
    with open(path + '.new', 'w') as f:
      f.write(text)
    os.replace(path + '.new', path)
    os.close(fd)

  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


def test_a_unit_that_changes_between_the_two_reads_fails_the_job_naming_it(tmp_path):
  """The scan plans windows from a unit's document sizes; the second read, after the file was
  rewritten with one document dropped, must stop the job, not shift every later window."""
  docs = list(itertools.islice(corpus.embedded_documents(), 30))
  corpus.write_text_file(docs[:10], f'{tmp_path}/a.txt')
  corpus.write_text_file(docs[10:], f'{tmp_path}/b.txt')
  changed = ''.join('\n'.join(d) + '\n\n' for d in docs[10:29])
  watcher = _replace_after_first_read(f'{tmp_path}/b.txt', changed)
  job = _job(f'{tmp_path}/*.txt', f'{tmp_path}/out/train', 'nsp', False, 2, window_chars=2_000)
  os.makedirs(f'{tmp_path}/out')
  with pytest.raises(beam_pipeline.UnitChangedError) as e:  # in this process: no start-up
    beam_pipeline.run(job, ['--runner=DirectRunner', '--direct_num_workers=1',
                                 '--direct_running_mode=in_memory'])
  watcher.join(timeout=5)
  assert not watcher.is_alive()  # the file was replaced, after the scan's read
  message = str(e.value)
  assert message.startswith(f'corpus unit {tmp_path}/b.txt (its documents start window ')
  assert 'documents 20 then 19' in message and 'sizes_sha256 ' in message
  assert 'Leave the inputs unchanged until the job ends' in message
  assert _written(job) == [] and not fs.exists(job.output_file + '.stats.json')


def _remote_job(**kw):
  kw = {'input_file': 'gs://b/text/*.txt', 'vocab_file': 'gs://b/vocab.txt',
        'output_file': 'gs://b/data/train', **kw}
  return cpd.Job(masking=MaskingConfig(), **kw)


@pytest.mark.parametrize('runner', [['--runner=DataflowRunner', '--project=p'],
                                    ['--runner=FlinkRunner', '--environment_type=DOCKER'],
                                    ['--runner=PrismRunner', '--environment_type=DOCKER']])
def test_remote_runners_refuse_local_paths_and_tokenizer_training_before_submission(runner):
  """Pure argument checks: run_many stops before reading, learning or submitting anything."""
  refusals = {
      'input_file': ('input_file', 'corpus/*.txt'), 'vocab_file': ('vocab_file', VOCAB),
      'spm_model': ('spm_model', '/tmp/x.model'), 'tokenizer': ('tokenizer', 'file:///tmp/t'),
      'output_file': ('output_file', 'data/train'),
      'tfds_data_dir': ('tfds_data_dir', '/home/u/tensorflow_datasets')}
  for flag, (field, path) in refusals.items():
    kw = {field: path}
    if field == 'tfds_data_dir':
      kw.update(tfds_name='wiki', input_file=None)
    if field in ('spm_model', 'tokenizer'):
      kw['vocab_file'] = None
    with pytest.raises(ValueError, match=f'--{flag}={re.escape(path)} is a path on this '
                       f'machine, but {runner[0]} runs its workers elsewhere.*pass the gs:// URL'):
      beam_pipeline.run_many([_remote_job(**kw)], runner)
  with pytest.raises(ValueError, match='--tfds_name=wiki with .* --tfds_data_dir=gs://'):
    beam_pipeline.run_many([_remote_job(input_file=None, tfds_name='wiki')], runner)
  with pytest.raises(ValueError, match='--train_tokenizer with .*reading the whole corpus here'
                     '.*--vocab_file=gs://BUCKET/tok/sample.vocab/vocab.txt'):
    beam_pipeline.run_many([_remote_job(vocab_file=None, train_tokenizer='wordpiece')], runner)
  beam_pipeline.check_paths_for_runner(_remote_job(), runner)  # all on gs://: accepted


def test_local_workers_take_local_paths():
  local = _remote_job(input_file='corpus/*.txt', vocab_file=VOCAB, output_file='data/train',
                      train_tokenizer='wordpiece')
  for runner in (['--runner=DirectRunner'], [], ['--runner=PrismRunner'],
                 ['--runner=FlinkRunner', '--environment_type=LOOPBACK']):
    beam_pipeline.check_paths_for_runner(local, runner)
