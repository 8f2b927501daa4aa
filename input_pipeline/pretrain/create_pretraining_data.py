r"""Corpus -> NSP/MLM instances -> sharded TFRecords (+ a stats JSON). A CLI.

Accepts google-research/bert's flags and writes its feature names, so files from either side
read on the other:

  python -m input_pipeline.pretrain.create_pretraining_data --input_file='corpus/*.txt' \
    --output_file=data/train --vocab_file=vocab.txt --do_lower_case \
    --max_seq_length=128 --max_predictions_per_seq=20 --num_shards=8 --num_workers=2

Why not the reference's one big in-memory pass: its users run out of memory on large corpora.
Here the document stream is cut into windows of about `--window_chars` characters (at document
boundaries); each window is tokenized, turned into instances exactly as the reference does
(random next sentences drawn from the same window), shuffled and written to shard
`window % num_shards`. Memory is one window per worker whatever the corpus size, workers own
disjoint shards, and every window has its own seed, so the output depends on the seed and
the shard count but not on the number of workers.

The same command with `--runner=DirectRunner|DataflowRunner|FlinkRunner|SparkRunner` (and that
runner's own flags) runs it as an Apache Beam pipeline instead (beam_pipeline.py, with
requirements-beam.txt): the same window rule and the same per-window function, so for a given
seed and shard count its shards are byte-identical to this tool's.

Inputs: text files (`--input_file`, the reference format), JSONL/Parquet records
(`--input_format=jsonl|parquet --text_field=text`), a TFDS dataset (`--tfds_name`). A document
that cannot be read (undecodable bytes, a corrupt file) is dropped, counted in the stats JSON
(`documents_failed`, `files_failed`, `failures`) and logged (`--bad_documents=skip`, the
default of the command), or stops the run (`--bad_documents=fail`, the default of `Job`).

`--next_sentence=nsp|sop|none` picks the sentence objective (objectives.py):
the reference's NSP pairs (default), ALBERT's sentence-order pairs, or RoBERTa's full-sentence
rows with no sentence label; sop and none records carry a marker the reader checks.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Iterator

from absl import app, flags, logging

from input_pipeline import fs, tfrecord
from input_pipeline.pretrain import corpus as corpus_lib, example_codec, masking, objectives
from input_pipeline.pretrain import packing
from input_pipeline.pretrain.instances import create_instances, InstanceStats, MaskingConfig
from input_pipeline.tokenizer import SentencePieceTokenizer, WordPieceTokenizer
from input_pipeline.tokenizer_files import load_tokenizer


@dataclasses.dataclass(frozen=True)
class Job:
  output_file: str
  masking: MaskingConfig
  vocab_file: str | None = None
  spm_model: str | None = None
  # A tokenizer.json / RoBERTa vocab.json, or a directory holding a tokenizer (a released
  # model's: ModernBERT, RoBERTa, XLM-R...), read by tokenizer_files.open_tokenizer.
  tokenizer: str | None = None
  do_lower_case: bool = True
  input_file: str | None = None
  tfds_name: str | None = None
  tfds_split: str = 'train'
  tfds_feature: str = 'text'
  tfds_data_dir: str | None = None
  skip_bad_lines: bool = False
  input_format: str = 'text'  # text | jsonl | parquet (corpus.INPUT_FORMATS)
  text_field: str = 'text'  # JSONL/Parquet: the column holding a document's text
  bad_documents: str = 'fail'  # fail | skip (drop whole, count, report)
  random_seed: int = 12345
  dupe_factor: int = 10
  num_shards: int = 1
  num_workers: int = 1
  window_chars: int = 1_000_000
  pack: bool = False
  max_instances_per_row: int = 3
  exact_reference_rng: bool = False
  # No vocab_file/spm_model: learn one from the corpus first ('wordpiece' | 'sentencepiece').
  train_tokenizer: str = ''
  vocab_size: int = 30522
  # --next_sentence: nsp (BERT) | sop (ALBERT) | none (RoBERTa FULL-SENTENCES); objectives.py
  sentence_objective: str = 'nsp'

  def read_options(self) -> corpus_lib.ReadOptions:
    return corpus_lib.ReadOptions(
        input_format=self.input_format, text_field=self.text_field,
        skip_bad_lines=self.skip_bad_lines, bad_documents=self.bad_documents,
        tfds_feature=self.tfds_feature, tfds_data_dir=self.tfds_data_dir)

  def documents(self, stats: corpus_lib.CorpusStats | None = None) -> Iterator[list[str]]:
    return corpus_lib.documents_from_flags(
        self.input_file, self.tfds_name, tfds_split=self.tfds_split,
        tfds_feature=self.tfds_feature, tfds_data_dir=self.tfds_data_dir,
        skip_bad_lines=self.skip_bad_lines, stats=stats, input_format=self.input_format,
        text_field=self.text_field, bad_documents=self.bad_documents)

  def shard_paths(self) -> list[str]:
    if self.num_shards == 1:
      return [self.output_file]
    return [f'{self.output_file}-{i:05d}-of-{self.num_shards:05d}' for i in range(self.num_shards)]


def doc_chars(doc: list[str]) -> int:
  """A document's size for the window rule (beam_pipeline.py cuts windows by the same)."""
  return sum(len(s) for s in doc)


def windows(documents: Iterator[list[str]], window_chars: int) -> Iterator[list[list[str]]]:
  window, size = [], 0
  for doc in documents:
    window.append(doc)
    size += doc_chars(doc)
    if size >= window_chars:
      yield window
      window, size = [], 0
  if window:
    yield window


def _window_block(job: Job, tokenized: list[list[list[int]]], tokenizer, index: int):
  # Window 0 uses the seed itself: a corpus in one window follows the reference's stream.
  seed = job.random_seed if index == 0 else job.random_seed * 1_000_003 + index
  if job.exact_reference_rng:
    instances = create_instances(tokenized, job.masking, tokenizer, random.Random(seed),
                                 job.dupe_factor)
    return masking.block_from_instances(instances, job.masking)
  return masking.create_block(tokenized, job.masking, tokenizer, seed, job.dupe_factor,
                              sentence_objective=job.sentence_objective)


def window_features(job: Job, tokenizer, window: list[list[str]], index: int):
  """Window `index` of the corpus -> (row features, the masking.Block they came from).

  The one function both runners make shard rows with (beam_pipeline.py calls it too)."""
  prefix = tokenizer.running_text_prefix  # ' ' for byte-level BPE: "Ġword" as mid-document
  sentences = [prefix + s if k else s for doc in window for k, s in enumerate(doc)]
  ids = iter(tokenizer.encode_batch(sentences))
  tokenized = [[next(ids) for _ in doc] for doc in window]  # Window drops empty ones
  block = _window_block(job, tokenized, tokenizer, index)
  if job.pack:
    return packing.pack_block(block, job.masking, job.max_instances_per_row), block
  return block.features(), block


def encoded_chunks(features: dict) -> Iterator[list[bytes]]:
  """Serialized tf.train.Examples of the rows, 4,096 at a time (bounded memory)."""
  for start in range(0, len(features['input_ids']), 4096):
    yield example_codec.encode_examples({k: v[start:start + 4096] for k, v in features.items()})


def _run_worker(job: Job, worker: int) -> dict:
  """Process the windows of the shards this worker owns; write them atomically."""
  tokenizer = load_tokenizer(job.vocab_file, job.spm_model, job.do_lower_case,
                             job.tokenizer)
  paths = job.shard_paths()
  mine = [s for s in range(job.num_shards) if s % job.num_workers == worker]
  writers = {s: tfrecord.TFRecordWriter(paths[s]) for s in mine}
  stats, corpus_stats = InstanceStats(), corpus_lib.CorpusStats()
  rows = padding_tokens = 0
  try:
    for index, window in enumerate(windows(job.documents(corpus_stats), job.window_chars)):
      shard = index % job.num_shards
      if shard not in writers:
        continue
      features, block = window_features(job, tokenizer, window, index)
      stats.add_block(block)
      rows += len(features['input_ids'])
      padding_tokens += int((features['input_mask'] == 0).sum())
      for records in encoded_chunks(features):
        writers[shard].write_many(records)
  except BaseException:
    for w in writers.values():
      w.abort()
    raise
  for w in writers.values():
    w.close() if rows else w.abort()  # a worker that made nothing publishes no empty shards
  return dict(stats=dataclasses.asdict(stats), corpus=dataclasses.asdict(corpus_stats),
              rows=rows, padding_tokens=padding_tokens,
              files=[paths[s] for s in mine] if rows else [])


def train_tokenizer(job: Job) -> Job:
  """Learn a vocabulary from the job's corpus; return the job pointing at it.

  WordPiece goes to `<output_file>.vocab/vocab.txt`, SentencePiece (unigram) to
  `<output_file>.spm.model`; pass the same file to training (`data.vocab_file` /
  `data.spm_model`) so that the exported model carries it.
  """
  if job.vocab_file or job.spm_model or job.tokenizer:
    raise ValueError('--train_tokenizer learns a vocabulary: drop --vocab_file/--spm_model/'
                     '--tokenizer')
  sentences = lambda: (s for doc in job.documents() for s in doc)  # read once per pass
  if job.train_tokenizer == 'wordpiece':
    tok = WordPieceTokenizer.train(sentences, job.vocab_size, job.output_file + '.vocab',
                                   do_lower_case=job.do_lower_case)
    return dataclasses.replace(job, vocab_file=tok.vocab_file, train_tokenizer='')
  if job.train_tokenizer == 'sentencepiece':
    tok = SentencePieceTokenizer.train(sentences(), job.vocab_size, job.output_file + '.spm',
                                       lowercase=job.do_lower_case)
    return dataclasses.replace(job, spm_model=tok.model_file, train_tokenizer='')
  raise ValueError(f'--train_tokenizer={job.train_tokenizer!r}: expected wordpiece or '
                   'sentencepiece')


def check_objective(job: Job) -> None:
  """Fail before any work on an unknown --next_sentence or one exact mode cannot honour."""
  objectives.check_name(job.sentence_objective, '--next_sentence')
  if job.exact_reference_rng and job.sentence_objective != 'nsp':
    raise ValueError(f'--exact_reference_rng reproduces google-research/bert\'s NSP records; '
                     f'it cannot apply to --next_sentence={job.sentence_objective}: drop one')


def _worker_entry(args):
  return _run_worker(*args)


def prepare(job: Job) -> Job:
  """Checks before any work (both runners), and the tokenizer learnt if asked for."""
  if job.num_shards < 1:
    raise ValueError('--num_shards must be at least 1')
  check_objective(job)
  if job.input_format not in corpus_lib.INPUT_FORMATS:
    raise ValueError(f'--input_format={job.input_format!r}: expected one of '
                     f'{corpus_lib.INPUT_FORMATS}')
  if job.bad_documents not in ('fail', 'skip'):
    raise ValueError(f'--bad_documents={job.bad_documents!r}: expected fail or skip')
  fs.check_writable(fs.dirname(fs.absolute(job.output_file)))  # before hours of work
  if job.train_tokenizer:
    job = train_tokenizer(job)
  # Fail fast, in this process.
  load_tokenizer(job.vocab_file, job.spm_model, job.do_lower_case, job.tokenizer)
  return job


def run(job: Job) -> dict:
  """Write all shards and `<output_file>.stats.json`; returns the stats."""
  if job.num_workers < 1 or job.num_shards < 1:
    raise ValueError('--num_workers and --num_shards must be at least 1')
  if job.num_workers > job.num_shards:
    raise ValueError(f'--num_workers={job.num_workers} exceeds --num_shards={job.num_shards}: '
                     'a worker owns whole shards, so raise --num_shards')
  job = prepare(job)
  start = time.time()
  if job.num_workers == 1:
    results = [_run_worker(job, 0)]
  else:
    with multiprocessing.get_context('spawn').Pool(job.num_workers) as pool:
      results = pool.map(_worker_entry, [(job, w) for w in range(job.num_workers)])
  stats = InstanceStats()
  for r in results:
    stats.merge(InstanceStats(**r['stats']))
  return write_summary(job, stats, results[0]['corpus'], sum(r['rows'] for r in results),
                       sum(r['padding_tokens'] for r in results),
                       [f for r in results for f in r['files']], time.time() - start)


def check_wrote_something(job: Job, stats: InstanceStats, corpus: dict) -> None:
  if not stats.instances:
    raise ValueError(f'--output_file={job.output_file}: wrote nothing, because '
                     f'{_what_was_read(corpus, job)} gave no instance; check '
                     'the input (one sentence per line, blank lines between documents)')


def write_summary(job: Job, stats: InstanceStats, corpus: dict, rows: int, padding: int,
                  files: list[str], seconds: float) -> dict:
  """`<output_file>.stats.json` from merged totals: the same for both runners (all but the
  timings and `runner` are equal for equal shards)."""
  check_wrote_something(job, stats, corpus)
  seq = job.masking.max_seq_length
  masked = max(stats.masked, 1)
  summary = {
      'instances': stats.instances, 'rows': rows, 'tokens': stats.tokens,
      'documents': corpus['documents'],
      'seconds': round(seconds, 2),
      'instances_per_second': round(stats.instances / max(seconds, 1e-9), 1),
      'padding_fraction_unpacked': round(1 - stats.tokens / max(stats.instances * seq, 1), 4),
      'padding_fraction': round(padding / max(rows * seq, 1), 4),
      'masked_fraction': round(stats.masked / max(stats.tokens, 1), 4),
      'replacement_split': {'mask': round(stats.mask_token / masked, 4),
                            'random': round(stats.random_token / masked, 4),
                            'kept': round(stats.kept_token / masked, 4)},
      'truncation_rate': round(stats.truncated / max(stats.instances, 1), 4),
      'files': sorted(files), 'packed': job.pack,
      'vocab_file': job.vocab_file, 'spm_model': job.spm_model, 'tokenizer': job.tokenizer,
      'max_seq_length': seq, 'max_predictions_per_seq': job.masking.max_predictions_per_seq,
      'max_instances_per_row': job.max_instances_per_row if job.pack else 1,
  }
  summary['sentence_objective'] = job.sentence_objective
  summary.update(objectives.summary(stats, job.sentence_objective))
  summary.update({k: corpus[k] for k in ('empty_files', 'bad_lines', 'documents_failed',
                                         'files_failed', 'failures')})
  if corpus['documents_failed'] or corpus['files_failed']:
    logging.warning('%s: dropped %d unreadable documents and the rest of %d unreadable files '
                    '(stats.json "failures"), e.g. %s', job.output_file,
                    corpus['documents_failed'], corpus['files_failed'], corpus['failures'][:3])
  fs.write_text(job.output_file + '.stats.json', json.dumps(summary, indent=2))
  return summary


def _what_was_read(corpus: dict, job: Job) -> str:
  source = job.tfds_name or job.input_file or 'the embedded corpus'
  return (f'{source} ({corpus["files"]} files, {corpus["empty_files"]} empty, '
          f'{corpus["lines"]} lines, {corpus["bad_lines"]} skipped lines, '
          f'{corpus["documents"]} documents)')


FLAGS = flags.FLAGS


def define_flags():
  """CLI flags, defined only when run as a program (importing must not claim flag names)."""
  # The reference's flags, same names and meanings.
  flags.DEFINE_string('input_file', None, 'Input text file(s): comma-separated globs, .gz ok. '
                      'Omit (and --tfds_name) for the embedded default corpus.')
  flags.DEFINE_string('output_file', None, 'Output TFRecord path (prefix when --num_shards > 1).')
  flags.DEFINE_string('vocab_file', None, 'WordPiece vocab.txt.')
  flags.DEFINE_bool('do_lower_case', True, 'Lower-case the input (uncased models).')
  flags.DEFINE_bool('do_whole_word_mask', False, 'Mask whole words rather than word pieces.')
  flags.DEFINE_integer('max_seq_length', 128, 'Maximum sequence length.')
  flags.DEFINE_integer('max_predictions_per_seq', 20, 'Maximum masked LM predictions per row.')
  flags.DEFINE_integer('random_seed', 12345, 'Random seed.')
  flags.DEFINE_integer('dupe_factor', 10, 'Passes over the input, each with new masks.')
  flags.DEFINE_float('masked_lm_prob', 0.15, 'Masked LM probability.')
  flags.DEFINE_float('short_seq_prob', 0.1, 'Probability of a shorter random target length.')
  # Ours.
  flags.DEFINE_string('spm_model', None, 'SentencePiece .model instead of --vocab_file.')
  flags.DEFINE_string('tokenizer', None, 'Instead of --vocab_file: a tokenizer.json (or '
                      'vocab.json + merges.txt), or a released model\'s directory holding its '
                      'tokenizer; its special tokens and casing are its own.')
  flags.DEFINE_enum('train_tokenizer', None, ['wordpiece', 'sentencepiece'],
                    'Without --vocab_file/--spm_model: learn a vocabulary of --vocab_size from '
                    'the corpus first (written next to --output_file).')
  flags.DEFINE_integer('vocab_size', 30522, 'With --train_tokenizer.')
  flags.DEFINE_string('tfds_name', None, 'TFDS dataset, e.g. wikipedia/20230601.en.')
  flags.DEFINE_string('tfds_split', 'train', 'TFDS split.')
  flags.DEFINE_string('tfds_feature', 'text', 'TFDS text feature.')
  flags.DEFINE_string('tfds_data_dir', None, 'TFDS data_dir.')
  flags.DEFINE_bool('skip_bad_lines', False, 'Skip (and count) non-UTF-8 lines instead of failing.')
  flags.DEFINE_enum('input_format', 'text', list(corpus_lib.INPUT_FORMATS),
                    '--input_file format: text (one sentence per line, blank line between '
                    'documents), jsonl or parquet (one document per record, .gz ok for jsonl).')
  flags.DEFINE_string('text_field', 'text', 'JSONL/Parquet: the field holding the text.')
  flags.DEFINE_enum('bad_documents', 'skip', ['skip', 'fail'],
                    'A document that cannot be read (undecodable bytes, a corrupt file): skip '
                    'drops it and counts it in the stats JSON; fail stops the run.')
  flags.DEFINE_string('runner', None, 'Run as an Apache Beam pipeline on this runner '
                      '(DirectRunner, DataflowRunner, FlinkRunner, SparkRunner...); flags this '
                      'tool does not know go to Beam (--project, --region, --temp_location...). '
                      'Needs requirements-beam.txt.')
  flags.DEFINE_integer('num_shards', 1, 'Output shards.')
  flags.DEFINE_integer('num_workers', 1, 'Worker processes (each owns whole shards).')
  flags.DEFINE_integer('window_chars', 1_000_000, 'Characters of text per instance window.')
  flags.DEFINE_bool('pack', False, 'Pack several instances per row (packed features).')
  flags.DEFINE_integer('max_instances_per_row', 3, 'With --pack: instances per row at most.')
  flags.DEFINE_bool('exact_reference_rng', False, 'Mask instance by instance with the '
                    "reference's random stream (slow; with --replace_from_full_vocab and one "
                    'window it reproduces the reference\'s instances).')
  flags.DEFINE_enum('next_sentence', 'nsp', list(objectives.OBJECTIVES),
                    'Sentence objective: nsp (BERT next sentence), sop (ALBERT sentence order: '
                    'consecutive segments, swapped half the time) or none (RoBERTa '
                    'FULL-SENTENCES: rows of contiguous sentences across documents, no label). '
                    'Train with the same --config.data.sentence_objective.')
  flags.DEFINE_bool('replace_from_full_vocab', False, 'Draw random replacements from the whole '
                    'vocabulary, [unused] included, as the reference does.')


def job_from_flags() -> Job:
  if not FLAGS.output_file:
    raise app.UsageError('--output_file is required')
  masking = MaskingConfig(FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
                          FLAGS.masked_lm_prob, FLAGS.short_seq_prob, FLAGS.do_whole_word_mask,
                          FLAGS.replace_from_full_vocab)
  return Job(output_file=FLAGS.output_file, masking=masking, vocab_file=FLAGS.vocab_file,
             spm_model=FLAGS.spm_model, tokenizer=FLAGS.tokenizer,
             do_lower_case=FLAGS.do_lower_case,
             input_file=FLAGS.input_file, tfds_name=FLAGS.tfds_name,
             tfds_split=FLAGS.tfds_split, tfds_feature=FLAGS.tfds_feature,
             tfds_data_dir=FLAGS.tfds_data_dir, skip_bad_lines=FLAGS.skip_bad_lines,
             input_format=FLAGS.input_format, text_field=FLAGS.text_field,
             bad_documents=FLAGS.bad_documents,
             random_seed=FLAGS.random_seed, dupe_factor=FLAGS.dupe_factor,
             num_shards=FLAGS.num_shards, num_workers=FLAGS.num_workers,
             window_chars=FLAGS.window_chars, pack=FLAGS.pack,
             max_instances_per_row=FLAGS.max_instances_per_row,
             exact_reference_rng=FLAGS.exact_reference_rng,
             train_tokenizer=FLAGS.train_tokenizer or '', vocab_size=FLAGS.vocab_size,
             sentence_objective=FLAGS.next_sentence)


def main(argv):
  beam_args = argv[1:]  # flags absl does not know: the Beam runner's own
  if beam_args and not FLAGS.runner:
    raise app.UsageError(f'unknown flags {beam_args} (runner flags need --runner)')
  if FLAGS.runner:
    if importlib.util.find_spec('apache_beam') is None:
      raise SystemExit(f'error: --runner={FLAGS.runner} needs Apache Beam: pip install -r '
                       'requirements-beam.txt (or bash scripts/setup_env.sh --with-beam)')
    # The Beam pipeline's own entry point, with this command's argv: beam_pipeline.py imports
    # this module (its window rule and row function), so this one hands over the process
    # rather than import it back.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ['PYTHONPATH'] = os.pathsep.join(
        p for p in (root, os.environ.get('PYTHONPATH')) if p)
    os.execv(sys.executable, [sys.executable, '-m', 'input_pipeline.pretrain.beam_pipeline',
                              *sys.argv[1:]])
  try:
    summary = run(job_from_flags())
  except (ValueError, OSError, KeyError) as e:  # bad input or paths: one line, no traceback
    raise app.UsageError(str(e)) from None
  logging.info('wrote %d rows (%d instances) to %s', summary['rows'], summary['instances'],
               ', '.join(summary['files']))
  print(json.dumps({k: v for k, v in summary.items() if k != 'files'}, indent=2))


def parse_known_flags(argv: list[str]) -> list[str]:
  """absl's flags, the rest (a Beam runner's options) left in argv for main."""
  return FLAGS(argv, known_only=True)


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=parse_known_flags)
