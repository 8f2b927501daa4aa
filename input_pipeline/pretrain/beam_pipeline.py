r"""The data tool as an Apache Beam pipeline: corpus-scale data creation on a fleet.

Why: the local tool (create_pretraining_data.py) runs on one machine, each worker process
reading the whole corpus. For a corpus of 100B tokens that is days on one host; Beam spreads
the reading, tokenizing and masking over as many workers as the runner gives (Dataflow, Flink,
Spark, or DirectRunner's processes here) and writes the same shards.

Same command, plus `--runner` (flags this tool does not know go to Beam):

  python -m input_pipeline.pretrain.create_pretraining_data --input_file='gs://b/text/*' \
    --output_file=gs://b/data/train --vocab_file=gs://b/vocab.txt --num_shards=1024 \
    --runner=DataflowRunner --project=P --region=R --temp_location=gs://b/tmp

Byte identity with the local tool, by construction: both cut the corpus's document stream
into windows by one rule (`windows` / `doc_chars`), make a window's rows with one function
(`window_features`, seeded by the window's index), and write window `i` to shard
`i % num_shards` in window order. Only the orchestration differs:

  1. scan: every unit (a file, or a TFDS shard; corpus.source_units) is read on some worker
     and summarised by the sizes of its documents in a few numbers (`unit_summary`: where the
     window rule cuts it, for any carry-in; O(documents of one window)), plus its corpus
     statistics (failed documents included) and what the read saw (`UnitReading`);
  2. plan: one small sequential step chains the summaries in corpus order: each unit's
     carry-in and index of its first window;
  3. every unit is read again, counted the same way and checked against its scan (`checked`:
     a unit that reads differently, a file changed mid-job or a read that failed once, fails
     the job naming it, never shifting later windows); each window wholly inside the unit is
     made into rows right there (`window_features`, TFRecord framing) and written to a part
     file, one per window; the documents of the at most two windows a unit shares with its
     neighbours are grouped by window and made into rows the same way;
  4. a shard is its windows' parts concatenated in window order, streamed (8 MiB at a time)
     into one atomic write (fs.py: gs:// too); shards are published, empty ones included, as
     the local tool publishes them (`published`); instance and corpus statistics are merged
     with Beam combiners into `<output>.stats.json`.

Memory per worker is one unit's scan and one window; what crosses a shuffle is a few numbers
per unit, the documents of at most two windows per unit, and a part's name per window: never
the corpus or a shard's rows, on a fleet or on the DirectRunner (whose runner process keeps
each stage's output in memory). The plan holds O(documents in the first window of each unit)
numbers per unit. A remote runner's workers see only URLs: local paths and `--train_tokenizer`
(which would read the whole corpus on the launching machine) are refused before submission
(`check_paths_for_runner`).

A document that cannot be read is dropped and counted (`--bad_documents=skip`, the command's
default), never a crashed job or a silent loss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
import numpy as np
from absl import app, flags, logging

from input_pipeline import fs, tfrecord
from input_pipeline.pretrain import corpus as corpus_lib
from input_pipeline.pretrain import create_pretraining_data as cpd
from input_pipeline.pretrain.instances import InstanceStats
from input_pipeline.tokenizer_files import load_tokenizer


# ---------------------------------------------------------------- the window rule, by unit


def unit_summary(sizes: np.ndarray, window_chars: int) -> dict:
  """The window rule over one unit's documents, for any carry-in `c` (chars already in the
  open window, 0 <= c < window_chars), in O(documents of the unit's first window) numbers.

  `cpd.windows` closes a window after a document once its size reaches `window_chars`. Given
  `c`, the first cut is after the first document k with c + P[k] >= W (P: prefix sums); only
  the documents within the unit's first W chars can be that k, and after a cut the rest of the
  unit is cut the same way whatever `c` was. So: P of those candidates, and for each, the
  number of later cuts and the chars left open at the unit's end."""
  prefix = np.cumsum(np.asarray(sizes, np.int64))
  n = len(prefix)
  total = int(prefix[-1]) if n else 0
  m = min(n, int(np.searchsorted(prefix, window_chars, 'left')) + 1)
  memo: dict[int, tuple[int, int]] = {}

  def after(k: int) -> tuple[int, int]:  # (cuts after a cut at k, open chars at the end)
    path, pos = [], k
    while pos not in memo:
      nxt = int(np.searchsorted(prefix, prefix[pos] + window_chars, 'left'))
      if nxt >= n:
        memo[pos] = (0, total - int(prefix[pos]))
        break
      path.append((pos, nxt))
      pos = nxt
    for pos, nxt in reversed(path):
      memo[pos] = (memo[nxt][0] + 1, memo[nxt][1])
    return memo[k]

  return {'documents': n, 'chars': total, 'prefix': prefix[:m].tolist(),
          'after': [after(k) for k in range(m)]}


def apply_summary(summary: dict, carry: int, window_chars: int) -> tuple[int, int]:
  """(windows closed in the unit, chars open at its end) for carry-in `carry`."""
  k = int(np.searchsorted(np.asarray(summary['prefix'], np.int64), window_chars - carry, 'left'))
  if k >= len(summary['prefix']):
    return 0, carry + summary['chars']
  cuts, left = summary['after'][k]
  return cuts + 1, left


def plan(summaries: list[tuple[int, dict]], window_chars: int) -> dict[int, tuple[int, int]]:
  """{unit: (carry-in, index of the window its first document goes to)}, in corpus order."""
  out, carry, closed = {}, 0, 0
  for unit, summary in sorted(summaries, key=lambda s: s[0]):
    out[unit] = (carry, closed)
    cuts, carry = apply_summary(summary, carry, window_chars)
    closed += cuts
  return out


def unit_windows(docs, carry: int, first: int, window_chars: int):
  """The unit's documents cut as `cpd.windows` cuts the corpus: (window index, [(document
  number in the unit, document)], whole), one window in memory at a time. `whole`: the window
  starts and closes in this unit, so no other unit has a document of it."""
  index, size, window = first, carry, []
  for n, doc in enumerate(docs):
    window.append((n, doc))
    size += cpd.doc_chars(doc)
    if size >= window_chars:
      yield index, window, index != first or carry == 0
      index, size, window = index + 1, 0, []
  if window:
    yield index, window, False  # open: later units may add to it


# ---------------------------------------------------------------- every read counted


class UnitReading:
  """What one read of a unit saw: its documents' sizes (count, total, a digest of the sequence)
  and its CorpusStats counts. The scan pass and the second read must see the same, or the
  windows planned from the scan would not be the windows the second read cuts."""

  def __init__(self):
    self._pending: list[int] = []  # sizes not yet in the digest
    self._digest = hashlib.sha256()

  def add(self, doc) -> int:
    size = cpd.doc_chars(doc)
    self._pending.append(size)
    if len(self._pending) >= 4096:
      self._flush()
    return size

  def _flush(self):
    self._digest.update(np.asarray(self._pending, '<i8').tobytes())
    self._pending = []

  def result(self, stats: corpus_lib.CorpusStats, chars: int) -> dict:
    """(`stats.documents` counts the documents read.)"""
    self._flush()
    counts = {k: v for k, v in dataclasses.asdict(stats).items() if k != 'failures'}
    return {'chars': chars, **counts, 'sizes_sha256': self._digest.hexdigest()[:16]}


def scan_unit(docs, window_chars: int, stats: corpus_lib.CorpusStats) -> dict:
  """The scan pass over one unit: its window summary, plus what the read saw (`read`)."""
  reading, sizes = UnitReading(), []
  for doc in docs:
    sizes.append(reading.add(doc))
  summary = unit_summary(np.asarray(sizes, np.int64), window_chars)
  summary['read'] = reading.result(stats, int(sum(sizes)))
  return summary


def checked(docs, unit: str, first: int, expected: dict, stats: corpus_lib.CorpusStats):
  """`docs` (the second read of `unit`), failing at its end if it differs from the scan's read.

  Raising fails the bundle: its output is dropped, a runner that retries (Dataflow: 4 times)
  reads the unit again, and a unit that still differs fails the job, naming the unit."""
  reading, chars = UnitReading(), 0
  for doc in docs:
    chars += reading.add(doc)
    yield doc
  got = reading.result(stats, chars)
  if got != expected:
    diff = ', '.join(f'{k} {expected.get(k)} then {got.get(k)}' for k in got
                     if got[k] != expected.get(k))
    raise UnitChangedError(
        f'corpus unit {unit} (its documents start window {first}) read differently the second '
        f'time: {diff}. The file changed while the job ran, or a read failed that the first '
        'did not; every later window would shift, so the job stops rather than write shards '
        'that differ from the local tool\'s. Leave the inputs unchanged until the job ends '
        '(copy a growing corpus to a fixed snapshot first) and run it again.')


class UnitChangedError(ValueError):
  pass


# ---------------------------------------------------------------- the pipeline


def _read(job: cpd.Job, unit: str, stats: corpus_lib.CorpusStats):
  return corpus_lib.read_unit(unit, job.read_options(), stats)


def parts_dir(job: cpd.Job) -> str:
  """Where windows' rows wait, one file per window, until their shard is written."""
  return job.output_file + '.parts'


def build(pipeline, job: cpd.Job, start: float | None = None, label: str = ''):
  """Add `job` to `pipeline` (several jobs may share one pipeline: their labels differ)."""
  start = time.time() if start is None else start
  w = job.window_chars
  units = corpus_lib.source_units(job.input_file, job.tfds_name, tfds_split=job.tfds_split,
                                  tfds_data_dir=job.tfds_data_dir, by_tfds_shard=True)
  p = lambda name: f'{label}{name}'

  def scan(item):
    i, unit = item
    stats = corpus_lib.CorpusStats()
    yield (i, scan_unit(_read(job, unit, stats), w, stats)), dataclasses.asdict(stats)

  def plan_with_reads(summaries):
    plans = plan(summaries, w)
    return {i: (*plans[i], summary['read']) for i, summary in summaries}

  indexed = (pipeline | p('Units') >> beam.Create(list(enumerate(units)))
             | p('SpreadUnits') >> beam.Reshuffle())
  scanned = indexed | p('Scan') >> beam.FlatMap(scan)
  the_plan = (scanned | p('Summaries') >> beam.Map(lambda s: s[0])
              | p('CollectSummaries') >> beam.combiners.ToList()
              | p('Plan') >> beam.Map(plan_with_reads))
  corpus_stats = (scanned | p('UnitStats') >> beam.Map(lambda s: s[1])
                  | p('CorpusStats') >> beam.CombineGlobally(_CorpusStatsFn()))

  read = (indexed
          | p('Documents') >> beam.ParDo(_Documents(job), beam.pvalue.AsSingleton(the_plan))
          .with_outputs('shuffle', 'stats', main='rows'))
  made = (read.shuffle | p('GroupWindows') >> beam.GroupByKey()
          | p('MakeRows') >> beam.ParDo(_MakeRows(job)).with_outputs('stats', main='rows'))
  rows = (read.rows, made.rows) | p('AllRows') >> beam.Flatten()
  window_stats = (read.stats, made.stats) | p('AllWindowStats') >> beam.Flatten()
  with_rows = (rows | p('ShardsWithRows') >> beam.Map(lambda r: r[0])
               | p('Distinct') >> beam.Distinct() | p('ListShards') >> beam.combiners.ToList())
  empty = pipeline | p('AllShards') >> beam.Create([(s, None) for s in range(job.num_shards)])
  files = ((rows, empty) | p('WithEmptyShards') >> beam.Flatten()
           | p('GroupShards') >> beam.GroupByKey()
           | p('WriteShards') >> beam.FlatMap(_write_shard, job,
                                              beam.pvalue.AsSingleton(with_rows))
           | p('Files') >> beam.combiners.ToList())
  instance_stats = window_stats | p('InstanceStats') >> beam.CombineGlobally(_InstanceStatsFn())
  return (pipeline | p('Once') >> beam.Create([None])
          | p('Summary') >> beam.Map(_finish, job, start, beam.pvalue.AsSingleton(instance_stats),
                                     beam.pvalue.AsSingleton(corpus_stats),
                                     beam.pvalue.AsSingleton(files)))


class _WindowsDoFn(beam.DoFn):
  """A DoFn that turns windows into rows with the job's tokenizer (`make_rows`)."""

  def __init__(self, job: cpd.Job):
    super().__init__()
    self.job = job

  def setup(self):
    job = self.job
    self.tokenizer = load_tokenizer(job.vocab_file, job.spm_model, job.do_lower_case,
                                    job.tokenizer)

  def make_rows(self, index: int, window: list):
    """Window `index` -> its rows in a part file, (shard, (window, part)), and its statistics.

    The rows go to storage here, on the worker that made them, and only the part's name
    travels on: no worker, and no shuffle, ever holds more than one window's rows."""
    features, block = cpd.window_features(self.job, self.tokenizer, window, index)
    rows = len(features['input_ids'])
    if rows:  # deterministic name and bytes: a retried bundle rewrites the same part
      part = fs.join(parts_dir(self.job), f'window-{index:012d}')
      with fs.writer(part, 'wb') as f:
        for chunk in cpd.encoded_chunks(features):
          f.write(b''.join(tfrecord.frame(r) for r in chunk))
      yield index % self.job.num_shards, (index, part)
    stats = InstanceStats()
    stats.add_block(block)
    yield beam.pvalue.TaggedOutput('stats', (
        dataclasses.asdict(stats), rows, int((features['input_mask'] == 0).sum())))


class _Documents(_WindowsDoFn):
  """A unit's second read (`checked` against its scan): the windows wholly inside the unit
  made into rows right here, the documents of the others (the one it continues, the one left
  open at its end: two at most) keyed by window for GroupWindows. Only those cross a shuffle."""

  def process(self, item, plans):
    i, unit = item
    carry, first, read = plans[i]
    stats = corpus_lib.CorpusStats()
    docs = checked(_read(self.job, unit, stats), unit, first, read, stats)
    for index, window, whole in unit_windows(docs, carry, first, self.job.window_chars):
      if whole:
        yield from self.make_rows(index, [doc for _, doc in window])
      else:
        for n, doc in window:
          yield beam.pvalue.TaggedOutput('shuffle', (index, (i, n, doc)))


class _MakeRows(_WindowsDoFn):
  """A window gathered from several units: its documents in corpus order, made into rows."""

  def process(self, element):
    index, docs = element
    yield from self.make_rows(index, [doc for _, _, doc in sorted(docs, key=lambda d: d[:2])])


def published(shard: int, with_rows: list[int], num_workers: int) -> bool:
  """Whether the local tool writes `shard`: its worker (`shard % num_workers`, cpd._run_worker)
  publishes all of its shards, empty ones too, once any of them has a row, and none otherwise."""
  num_workers = max(num_workers, 1)
  return any(s % num_workers == shard % num_workers for s in with_rows)


def _write_shard(element, job: cpd.Job, with_rows: list[int]):
  """A shard's window parts, concatenated in window order (streamed: 8 MiB at a time)."""
  shard, parts = element
  if not published(shard, with_rows, job.num_workers):
    return
  parts = sorted(p for p in parts if p is not None)
  path = job.shard_paths()[shard]
  with fs.writer(path, 'wb') as out:  # atomic: published whole or not at all
    for _, part in parts:
      with fs.open_read(part, 'rb') as f:
        shutil.copyfileobj(f, out, 8 << 20)
  yield path


class _InstanceStatsFn(beam.CombineFn):
  """(InstanceStats dict, rows, padding tokens) summed."""

  def create_accumulator(self):
    return dataclasses.asdict(InstanceStats()), 0, 0

  def add_input(self, acc, item):
    return self.merge_accumulators([acc, item])

  def merge_accumulators(self, accs):
    stats, rows, padding = InstanceStats(), 0, 0
    for s, r, pad in accs:
      stats.merge(InstanceStats(**s))
      rows, padding = rows + r, padding + pad
    return dataclasses.asdict(stats), rows, padding

  def extract_output(self, acc):
    return acc


class _CorpusStatsFn(beam.CombineFn):
  """CorpusStats dicts merged: counts summed, failure reasons kept (sorted, capped)."""

  def create_accumulator(self):
    return dataclasses.asdict(corpus_lib.CorpusStats())

  def add_input(self, acc, item):
    return self.merge_accumulators([acc, item])

  def merge_accumulators(self, accs):
    total = corpus_lib.CorpusStats()
    for a in accs:
      total.merge(corpus_lib.CorpusStats(**a))
    return dataclasses.asdict(total)

  def extract_output(self, acc):
    return acc


def _finish(_, job: cpd.Job, start: float, instance_stats, corpus_stats: dict, files):
  stats, rows, padding = instance_stats
  stats = InstanceStats(**stats)
  fs.rmtree(parts_dir(job))  # every shard is written: the window parts have served
  summary = cpd.write_summary(job, stats, corpus_stats, rows, padding, files,
                              time.time() - start)
  return summary


# ---------------------------------------------------------------- running it


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a fleet's workers install besides Beam itself (its container has apache-beam and
# pyarrow): the imports of input_pipeline on the pipeline's path, at requirements.txt's pins.
WORKER_REQUIREMENTS = ('numpy', 'absl-py', 'tokenizers', 'sentencepiece', 'fsspec', 'gcsfs',
                       'google-crc32c')
TFDS_REQUIREMENTS = ('tensorflow-cpu', 'tensorflow-datasets')  # only with --tfds_name


def worker_setup_file(job: cpd.Job, directory: str) -> str:
  """A `setup.py` in `directory` packaging this checkout's `input_pipeline` with its worker
  requirements: Beam's `--setup_file`, which every remote worker pip-installs."""
  pins = {}
  with open(os.path.join(ROOT, 'requirements.txt')) as f:
    for line in f:
      spec = line.split('#')[0].strip()
      name = spec.split('[')[0]
      for op in ('==', '>=', '<=', '<', '>', '~=', '!='):
        name = name.split(op)[0]
      if spec:
        pins[name.strip().lower()] = spec
  names = WORKER_REQUIREMENTS + (TFDS_REQUIREMENTS if job.tfds_name else ())
  requirements = [pins.get(n, n) for n in names]
  # A --tokenizer directory may hold a spiece.model too.
  if job.spm_model or job.tokenizer or job.train_tokenizer == 'sentencepiece':
    requirements.append('protobuf>=7.36')  # sentencepiece's model proto (setup_env.sh says why)
  shutil.copytree(os.path.join(ROOT, 'input_pipeline'), os.path.join(directory, 'input_pipeline'),
                  ignore=shutil.ignore_patterns('__pycache__', '*.pyc'), dirs_exist_ok=True)
  path = os.path.join(directory, 'setup.py')
  with open(path, 'w') as f:
    f.write('import setuptools\n'
            'setuptools.setup(name="bert-jax-input-pipeline", version="0.0.0", '
            'packages=setuptools.find_packages(), '
            f'install_requires={requirements!r})\n')
  return path


# Runners whose workers are processes of this machine (unless told to start containers).
LOCAL_RUNNERS = ('directrunner', 'direct', 'switchingdirectrunner', 'bundlebaseddirectrunner',
                 'prismrunner', 'prism')


def _runner_flags(beam_args: list[str]) -> tuple[str, dict[str, str], set[str]]:
  """(runner name, --name=value flags, flag names given) of Beam's arguments."""
  given = {a.split('=')[0] for a in beam_args}
  values = dict(a[2:].split('=', 1) for a in beam_args if a.startswith('--') and '=' in a)
  return values.get('runner', 'DirectRunner'), values, given


def workers_are_local(beam_args: list[str]) -> bool:
  """Whether the runner's workers read this machine's files: DirectRunner/PrismRunner's
  processes, or any runner's SDK workers in this process (`--environment_type=LOOPBACK`)."""
  runner, values, _ = _runner_flags(beam_args)
  environment = values.get('environment_type', '').upper()
  return environment == 'LOOPBACK' or (
      runner.rsplit('.', 1)[-1].lower() in LOCAL_RUNNERS and environment not in ('DOCKER',
                                                                                 'EXTERNAL'))


def check_paths_for_runner(job: cpd.Job, beam_args: list[str]) -> None:
  """Refuse, before submission, what only fails on a remote runner's workers: paths of this
  machine (they read and write elsewhere) and `--train_tokenizer` (it would read the whole
  corpus here, on the launching machine, before the fleet starts)."""
  if workers_are_local(beam_args):
    return
  runner = _runner_flags(beam_args)[0]
  if job.train_tokenizer:
    raise ValueError(
        f'--train_tokenizer with --runner={runner}: it learns the vocabulary on this machine, '
        'reading the whole corpus here before the workers start. Learn it first from a sample '
        'with the local tool (the same command without --runner, with --input_file naming a '
        'few of the files and --output_file=gs://BUCKET/tok/sample), then pass '
        '--vocab_file=gs://BUCKET/tok/sample.vocab/vocab.txt (wordpiece) or '
        '--spm_model=gs://BUCKET/tok/sample.spm.model (sentencepiece)')
  paths = [('--input_file', p.strip()) for p in (job.input_file or '').split(',') if p.strip()]
  paths += [(flag, value) for flag, value in (
      ('--vocab_file', job.vocab_file), ('--spm_model', job.spm_model),
      ('--tokenizer', job.tokenizer), ('--output_file', job.output_file),
      ('--tfds_data_dir', job.tfds_data_dir)) if value]
  if job.tfds_name and not job.tfds_data_dir:
    raise ValueError(
        f'--tfds_name={job.tfds_name} with --runner={runner}: its workers would look for the '
        'dataset in their own ~/tensorflow_datasets. Prepare it once, copy the data directory '
        'to a bucket (gcloud storage cp -r ~/tensorflow_datasets gs://BUCKET/tfds) and pass '
        '--tfds_data_dir=gs://BUCKET/tfds')
  for flag, path in paths:
    if not fs.is_url(path) or path.startswith('file://'):
      raise ValueError(
          f'{flag}={path} is a path on this machine, but --runner={runner} runs its workers '
          'elsewhere, where it does not exist: copy it to a bucket the workers can read '
          f'(gcloud storage cp -r {path} gs://BUCKET/...) and pass the gs:// URL'
          + (' (the output too: a worker\'s disk is not kept)' if flag == '--output_file'
             else ''))


def pipeline_options(job: cpd.Job, beam_args: list[str], staging: str | None = None):
  """Beam's options from the runner flags. DirectRunner gets --num_workers processes; a remote
  runner gets --num_workers (Dataflow's initial workers) and, unless the flags ship the code
  another way, a setup file that installs this package on every worker (`staging`: its dir)."""
  args = list(beam_args)
  runner, values, given = _runner_flags(args)
  if runner in ('DirectRunner', 'direct'):
    if '--direct_num_workers' not in given:
      args.append(f'--direct_num_workers={job.num_workers}')
    if '--direct_running_mode' not in given:
      args.append('--direct_running_mode=multi_processing')
    return PipelineOptions(args)
  if '--num_workers' not in given and job.num_workers > 1:
    args.append(f'--num_workers={job.num_workers}')
  ships = {'--setup_file', '--sdk_container_image', '--extra_package', '--extra_packages'}
  if not given & ships and values.get('environment_type', '').upper() != 'LOOPBACK':
    staging = staging or tempfile.mkdtemp(prefix='bert_jax_beam_')
    args.append(f'--setup_file={worker_setup_file(job, staging)}')
  return PipelineOptions(args)


def run(job: cpd.Job, beam_args: list[str]) -> dict:
  """The data tool on a Beam runner: the shards and `<output_file>.stats.json` of `cpd.run`."""
  return run_many([job], beam_args)[0]


def run_many(jobs: list[cpd.Job], beam_args: list[str]) -> list[dict]:
  """Several jobs in one pipeline (one start-up of the runner); their stats, in order."""
  for job in jobs:
    check_paths_for_runner(job, beam_args)  # before anything is read, learnt or submitted
  jobs = [cpd.prepare(job) for job in jobs]  # checks, and a tokenizer learnt on this machine
  for job in jobs:
    if fs.exists(job.output_file + '.stats.json'):
      fs.remove(job.output_file + '.stats.json')  # so a stale one is never read back
    fs.rmtree(parts_dir(job))  # a failed run's window parts
    fs.makedirs(parts_dir(job))
  start = time.time()
  try:
    with beam.Pipeline(options=pipeline_options(jobs[0], beam_args)) as pipeline:
      for n, job in enumerate(jobs):
        build(pipeline, job, start, label=f'job{n}/' if len(jobs) > 1 else '')
  except Exception as e:  # a job's "wrote nothing" arrives wrapped by the runner
    for job in jobs:
      fs.rmtree(parts_dir(job))
    text = str(e)
    if 'wrote nothing' in text:
      raise ValueError(text[text.index('--output_file='):].split('\n')[0].rstrip('\'"] ')
                       ) from None
    if 'read differently the second time' in text:  # UnitChangedError, from a worker
      line = text[text.index('corpus unit '):].split('\n')[0].split(' [while running')[0]
      raise UnitChangedError(line.rstrip('\'"] ')) from None
    raise
  return [json.loads(fs.read_text(job.output_file + '.stats.json')) for job in jobs]


def main(argv):
  try:
    summary = run(cpd.job_from_flags(), [f'--runner={FLAGS.runner or "DirectRunner"}',
                                         *argv[1:]])
  except (ValueError, OSError, KeyError) as e:  # bad input or paths: one line, no traceback
    raise app.UsageError(str(e)) from None
  logging.info('wrote %d rows (%d instances) to %s', summary['rows'], summary['instances'],
               ', '.join(summary['files']))
  print(json.dumps({k: v for k, v in summary.items() if k != 'files'}, indent=2))


FLAGS = flags.FLAGS

if __name__ == '__main__':
  cpd.define_flags()
  app.run(main, flags_parser=cpd.parse_known_flags)
