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
     statistics (failed documents included);
  2. plan: one small sequential step chains the summaries in corpus order: each unit's
     carry-in and index of its first window;
  3. every unit is read again and each document keyed by its window; a window's documents are
     grouped and turned into serialized rows (`window_features`, TFRecord framing);
  4. rows are grouped by shard, sorted by window and written atomically (fs.py: gs:// too);
     instance and corpus statistics are merged with Beam combiners into `<output>.stats.json`.

Memory per worker is one unit's scan, one window, and one shard's bytes when it is written
(shard size = corpus / --num_shards), never the corpus. The plan holds O(documents in the
first window of each unit) numbers per unit. (DirectRunner's own runner process, unlike a
fleet's shuffle, keeps each stage's output in memory: the corpus and shards pass through it.)

A document that cannot be read is dropped and counted (`--bad_documents=skip`, the command's
default), never a crashed job or a silent loss.
"""

from __future__ import annotations

import dataclasses
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


def keyed_by_window(docs, carry: int, first: int, window_chars: int):
  """(window index, document number in the unit, document), the cut `cpd.windows` makes."""
  index, size = first, carry
  for n, doc in enumerate(docs):
    yield index, n, doc
    size += cpd.doc_chars(doc)
    if size >= window_chars:
      index, size = index + 1, 0


# ---------------------------------------------------------------- the pipeline


def _read(job: cpd.Job, unit: str, stats: corpus_lib.CorpusStats):
  return corpus_lib.read_unit(unit, job.read_options(), stats)


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
    sizes = np.fromiter((cpd.doc_chars(d) for d in _read(job, unit, stats)), np.int64)
    yield (i, unit_summary(sizes, w)), dataclasses.asdict(stats)

  indexed = (pipeline | p('Units') >> beam.Create(list(enumerate(units)))
             | p('SpreadUnits') >> beam.Reshuffle())
  scanned = indexed | p('Scan') >> beam.FlatMap(scan)
  the_plan = (scanned | p('Summaries') >> beam.Map(lambda s: s[0])
              | p('CollectSummaries') >> beam.combiners.ToList()
              | p('Plan') >> beam.Map(plan, w))
  corpus_stats = (scanned | p('UnitStats') >> beam.Map(lambda s: s[1])
                  | p('CorpusStats') >> beam.CombineGlobally(_CorpusStatsFn()))

  def documents(item, plans):
    i, unit = item
    carry, first = plans[i]
    for index, n, doc in keyed_by_window(_read(job, unit, corpus_lib.CorpusStats()), carry,
                                         first, w):
      yield index, (i, n, doc)

  made = (indexed | p('Documents') >> beam.FlatMap(documents, beam.pvalue.AsSingleton(the_plan))
          | p('GroupWindows') >> beam.GroupByKey()
          | p('MakeRows') >> beam.ParDo(_MakeRows(job)).with_outputs('stats', main='rows'))
  empty = pipeline | p('AllShards') >> beam.Create([(s, None) for s in range(job.num_shards)])
  files = ((made.rows, empty) | p('WithEmptyShards') >> beam.Flatten()
           | p('GroupShards') >> beam.GroupByKey()
           | p('WriteShards') >> beam.Map(_write_shard, job.shard_paths())
           | p('Files') >> beam.combiners.ToList())
  instance_stats = made.stats | p('InstanceStats') >> beam.CombineGlobally(_InstanceStatsFn())
  return (pipeline | p('Once') >> beam.Create([None])
          | p('Summary') >> beam.Map(_finish, job, start, beam.pvalue.AsSingleton(instance_stats),
                                     beam.pvalue.AsSingleton(corpus_stats),
                                     beam.pvalue.AsSingleton(files)))


@beam.typehints.with_output_types(tuple[int, tuple[int, bytes]])
class _MakeRows(beam.DoFn):
  """A window's documents -> (shard, (window, framed records)), and its statistics."""

  def __init__(self, job: cpd.Job):
    super().__init__()
    self.job = job

  def setup(self):
    job = self.job
    self.tokenizer = load_tokenizer(job.vocab_file, job.spm_model, job.do_lower_case,
                                    job.tokenizer)

  def process(self, element):
    index, docs = element
    window = [doc for _, _, doc in sorted(docs, key=lambda d: (d[0], d[1]))]
    features, block = cpd.window_features(self.job, self.tokenizer, window, index)
    records = b''.join(tfrecord.frame(r) for chunk in cpd.encoded_chunks(features)
                       for r in chunk)
    stats = InstanceStats()
    stats.add_block(block)
    yield index % self.job.num_shards, (index, records)
    yield beam.pvalue.TaggedOutput('stats', (
        dataclasses.asdict(stats), len(features['input_ids']),
        int((features['input_mask'] == 0).sum())))


def _write_shard(element, paths: list[str]) -> str:
  shard, parts = element
  parts = sorted((p for p in parts if p is not None), key=lambda p: p[0])
  with fs.writer(paths[shard], 'wb') as f:  # atomic: published whole or not at all
    for _, records in parts:
      f.write(records)
  return paths[shard]


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
  files = files if stats.instances else []
  if not stats.instances:  # the local tool publishes no empty shards either
    for f in job.shard_paths():
      if fs.exists(f):
        fs.remove(f)
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


def pipeline_options(job: cpd.Job, beam_args: list[str], staging: str | None = None):
  """Beam's options from the runner flags. DirectRunner gets --num_workers processes; a remote
  runner gets --num_workers (Dataflow's initial workers) and, unless the flags ship the code
  another way, a setup file that installs this package on every worker (`staging`: its dir)."""
  args = list(beam_args)
  given = {a.split('=')[0] for a in args}
  values = dict(a[2:].split('=', 1) for a in args if a.startswith('--') and '=' in a)
  runner = values.get('runner', 'DirectRunner')
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
  jobs = [cpd.prepare(job) for job in jobs]  # checks, and a tokenizer learnt on this machine
  for job in jobs:
    if fs.exists(job.output_file + '.stats.json'):
      fs.remove(job.output_file + '.stats.json')  # so a stale one is never read back
  start = time.time()
  try:
    with beam.Pipeline(options=pipeline_options(jobs[0], beam_args)) as pipeline:
      for n, job in enumerate(jobs):
        build(pipeline, job, start, label=f'job{n}/' if len(jobs) > 1 else '')
  except Exception as e:  # a job's "wrote nothing" arrives wrapped by the runner
    text = str(e)
    if 'wrote nothing' in text:
      raise ValueError(text[text.index('--output_file='):].split('\n')[0].rstrip('\'"] ')
                       ) from None
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
