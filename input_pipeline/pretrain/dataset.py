"""The tf.data reader for training and eval: per-host shards, checkpointable, numpy out.

Reads google-research/bert's TFRecords unchanged, and ours (plain or packed), from local paths
or gs:// alike: records are read through `tfrecord.records_in_range` (our one file-system
layer), not TensorFlow's file system, whose GCS client reaches only Google's endpoints.

Sharding is by chunk: every file is cut into byte ranges (`read_chunk_bytes`, smaller when the
data is small) and a process reads only its chunks, never a byte another process reads; chunk
counts per process differ by at most one whatever the file count (500 files on 64 hosts
oversample nothing). Training streams are built so that the global batch is the same for 1, 2,
4 or 8 processes (`training_records`).

Training: chunks shuffled per epoch by the seed, dealt to record streams (`SLOTS`) -> this
process's streams, one record from each in turn -> seeded shuffle buffer -> parse -> optional
dynamic masking (RoBERTa-style: fresh masks every time a row is read, by the same
`masking.mask_block` as data creation, whole words optional) -> optional packing on the fly
(`packing.pack_block` over windows of records) -> per-process batch -> prefetch. Eval: chunks in order, no shuffle, no repeat, and the last partial batch padded
with zero-weight rows so every batch has the jitted shape. Reading, masking and packing run as
`tf.numpy_function`s declared stateless, so iterator checkpoints still work.

Records written for another sentence objective than `sentence_objective` (nsp, sop, none; a
marker in each record, objectives.py) are refused with a ValueError up front.

`DataIterator.save/restore` checkpoint the whole tf.data iterator (shuffle buffers included)
with `tf.train.Checkpoint`, staged through a local temporary directory when the target is a
URL, so a restarted run gets exactly the batches it would have got.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import os
import re

import numpy as np
from google.protobuf import message

from input_pipeline import fs, tfrecord
from input_pipeline.tf_data import tf
from input_pipeline.pretrain import batch_layout, masking, objectives, packing
from input_pipeline.pretrain.instances import MaskingConfig

# Record streams dealt chunks round-robin: the global order is the same for any process count
# that divides it (see training_records).
SLOTS = 8


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
  files: str  # comma-separated globs
  batch_size: int  # per process
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  packed: bool = False
  max_instances_per_row: int = 3
  shuffle_buffer: int = 10_000
  seed: int = 0
  dynamic_masking: bool = False  # fresh masks every time a row is read (RoBERTa)
  whole_word_masking: bool = False  # with dynamic_masking; needs the data's tokenizer
  pack: bool = False  # pack unpacked records on the fly, K = max_instances_per_row
  pack_window: int = 1024  # rows the packer sees at once (more: fuller rows)
  # The data's tokenizer, for dynamic masking (replacement tokens, word boundaries).
  vocab_file: str = ''
  spm_model: str = ''
  tokenizer: str = ''  # a tokenizer.json / vocab.json or a model directory (RoBERTa, ModernBERT)
  do_lower_case: bool = True
  # Without a tokenizer file, dynamic masking uses these ids and replacements from
  # [first_real_token_id, vocab_size).
  vocab_size: int = 30522
  mask_id: int = 103
  cls_id: int = 101
  sep_id: int = 102
  first_real_token_id: int = 5
  masked_lm_prob: float = 0.15
  # tf.data threads (0 = TF's default, all cores). On a small CPU machine the input pipeline
  # otherwise competes with XLA for the cores that run the train step.
  threads: int = 0
  # Largest byte range read at once (one request on an object store): the unit of sharding.
  read_chunk_bytes: int = 1 << 20
  # What the records must hold: nsp | sop | none (create_pretraining_data --next_sentence).
  sentence_objective: str = 'nsp'


def list_files(patterns: str) -> list[str]:
  files = []
  for pattern in (p.strip() for p in patterns.split(',') if p.strip()):
    matched = [f for f in fs.glob(pattern) if not f.endswith(('.json', '.tmp'))
               and not fs.basename(f).startswith('.')]
    if not matched:
      raise FileNotFoundError(f'data files {pattern!r}: no such file; create them with '
                              'python -m input_pipeline.pretrain.create_pretraining_data')
    files.extend(matched)
  return files


def record_objective(record: bytes) -> str:
  """The sentence objective a record was written for (objectives.py): its
  marker; else sop for google-research/albert's records (they alone carry `token_boundary`;
  ALBERT's default is SOP), else nsp (google-research/bert's records and ours)."""
  feature = tf.train.Example.FromString(record).features.feature
  if objectives.MARKER in feature:
    return objectives.name_of_code(feature[objectives.MARKER].int64_list.value[0])
  return 'sop' if 'token_boundary' in feature else 'nsp'


def _first_records(files: list[str], sizes: list[int]) -> list[tuple[str, bytes]]:
  """(path, first record) of each non-empty, readable file: one small ranged read each, in
  parallel (object stores answer in tens of milliseconds, many at a time)."""

  def first(path_size):
    path, size = path_size
    try:
      records = tfrecord.records_in_range(path, 0, 1, size) if size else []
    except tfrecord.CorruptRecordError:
      return None  # the reader names it as corrupt
    return (path, records[0]) if records else None

  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    return [r for r in pool.map(first, zip(files, sizes)) if r is not None]


def check_sentence_objective(files: list[str], sizes: list[int], cfg: ReaderConfig) -> None:
  """Refuse records written for another sentence objective than the config's, before training
  on wrong labels (or on none's absent ones). A file comes from one data-creation run, so its
  first record speaks for it: one small read per file. Unreadable files are left to the
  reader, whose error names them as corrupt."""
  want = objectives.check_name(cfg.sentence_objective, 'data.sentence_objective')
  found: dict[str, list[str]] = {}
  for path, record in sorted(_first_records(files, sizes)):
    try:
      found.setdefault(record_objective(record), []).append(path)
    except message.DecodeError:
      pass
  for got, paths in found.items():
    if got != want:
      raise ValueError(
          f'data files {cfg.files!r}: {len(paths)} of {len(files)} files hold {got} records '
          f'({objectives.DESCRIPTIONS[got]}), e.g. {paths[0]}, but data.sentence_objective='
          f'{want!r}; set --config.data.sentence_objective={got}, or re-create the files with '
          f'python -m input_pipeline.pretrain.create_pretraining_data --next_sentence={want}')


def reader_config(config, files: str = '', batch_size: int = 1,
                  seed: int | None = None) -> ReaderConfig:
  """The reader of a run's config (its `data` block and `model.vocab_size`): the one place a
  config becomes a ReaderConfig, for training, eval and the batch layout the step compiles
  for."""
  d = config.data
  return ReaderConfig(
      files=files, batch_size=batch_size, max_seq_length=d.max_seq_length,
      max_predictions_per_seq=d.max_predictions_per_seq, packed=d.packed,
      max_instances_per_row=d.max_instances_per_row, shuffle_buffer=d.shuffle_buffer,
      seed=config.seed if seed is None else seed, dynamic_masking=d.dynamic_masking,
      whole_word_masking=d.whole_word_masking, pack=d.pack, pack_window=d.pack_window,
      vocab_size=config.model.vocab_size, threads=d.threads, vocab_file=d.vocab_file,
      spm_model=d.spm_model, tokenizer=d.get('tokenizer', ''), do_lower_case=d.do_lower_case,
      sentence_objective=d.sentence_objective, masked_lm_prob=d.masked_lm_prob)


def stored_layout(cfg: ReaderConfig) -> batch_layout.BatchLayout:
  """The layout of the records on disk (packed only if written packed)."""
  return batch_layout.BatchLayout(cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.packed,
                              cfg.max_instances_per_row)


def output_layout(cfg: ReaderConfig) -> batch_layout.BatchLayout:
  """The layout of the batches the reader yields (packed too when it packs on the fly)."""
  return dataclasses.replace(stored_layout(cfg), packed=cfg.packed or cfg.pack)


def feature_spec(cfg: ReaderConfig) -> dict[str, tf.io.FixedLenFeature]:
  """How the records store the schema's features: integers as int64, weights as float32."""
  return {name: tf.io.FixedLenFeature(list(shape), tf.float32 if dtype == batch_layout.FLOAT
                                      else tf.int64)
          for name, (shape, dtype) in stored_layout(cfg).features().items()}


def _parse(cfg: ReaderConfig):
  spec = feature_spec(cfg)

  def parse(record):
    ex = tf.io.parse_single_example(record, spec)
    return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in ex.items()}

  return parse


class _DefaultVocab:
  """What masking needs when no tokenizer file is configured: BERT's special ids."""

  def __init__(self, cfg: ReaderConfig):
    self.cls_id, self.sep_id, self.mask_id = cfg.cls_id, cfg.sep_id, cfg.mask_id
    self.vocab_size = cfg.vocab_size
    self.replacement_ids = np.arange(cfg.first_real_token_id, cfg.vocab_size, dtype=np.int32)
    self.word_start_table = None


@functools.lru_cache(maxsize=8)
def _tokenizer(vocab_file: str, spm_model: str, tokenizer: str, do_lower_case: bool):
  from input_pipeline.tokenizer_files import data_tokenizer  # pylint: disable=g-import-not-at-top
  return data_tokenizer(dict(vocab_file=vocab_file, spm_model=spm_model, tokenizer=tokenizer,
                             do_lower_case=do_lower_case))


def masking_vocab(cfg: ReaderConfig):
  if cfg.vocab_file or cfg.spm_model or cfg.tokenizer:
    return _tokenizer(cfg.vocab_file, cfg.spm_model, cfg.tokenizer, cfg.do_lower_case)
  if cfg.whole_word_masking:
    raise ValueError('data.whole_word_masking needs the tokenizer: set data.vocab_file, '
                     'data.spm_model or data.tokenizer')
  return _DefaultVocab(cfg)


def _masking_config(cfg: ReaderConfig) -> MaskingConfig:
  return MaskingConfig(cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.masked_lm_prob,
                       do_whole_word_mask=cfg.whole_word_masking)


def dynamic_mask(cfg: ReaderConfig):
  """A batch's stored masks undone, then new ones drawn by `masking.mask_block`: the very code
  (and rules, whole-word masking included) that data creation uses, seeded per batch."""
  vocab, mcfg = masking_vocab(cfg), _masking_config(cfg)

  def remask_numpy(ids, input_mask, segment_ids, positions, labels, weights, seed):
    ids = ids.copy()
    rows, slots = np.nonzero(weights > 0)
    ids[rows, positions[rows, slots]] = labels[rows, slots]
    lengths = input_mask.sum(axis=1).astype(np.int64)
    num_a = ((segment_ids == 0) & (input_mask > 0)).sum(axis=1) - 2
    m = masking.mask_block(ids, lengths, num_a, mcfg, vocab,
                           np.random.default_rng(seed.view(np.uint64)))
    return (m.input_ids.astype(np.int32), m.masked_lm_positions.astype(np.int32),
            m.masked_lm_ids.astype(np.int32), m.masked_lm_weights)

  def remask(batch, seed):
    out = dict(batch)
    new = tf.numpy_function(
        remask_numpy, [batch['input_ids'], batch['input_mask'], batch['segment_ids'],
                       batch['masked_lm_positions'], batch['masked_lm_ids'],
                       batch['masked_lm_weights'], seed],
        [tf.int32, tf.int32, tf.int32, tf.float32], stateful=False)
    for name, value in zip(('input_ids', 'masked_lm_positions', 'masked_lm_ids',
                            'masked_lm_weights'), new):
      out[name] = tf.ensure_shape(value, batch[name].shape)
    return out

  return remask


def pack_on_the_fly(cfg: ReaderConfig):
  """A window of unpacked rows -> packed rows (`packing.pack_block`, as data creation packs)."""
  mcfg, k = _masking_config(cfg), cfg.max_instances_per_row
  spec = feature_spec(dataclasses.replace(cfg, packed=True))
  names = sorted(spec)

  def pack_numpy(ids, input_mask, segment_ids, positions, labels, weights, nsp):
    block = masking.Block(
        masking.MaskedBlock(ids, input_mask.sum(axis=1), segment_ids, positions, labels,
                            (weights > 0).sum(axis=1), (0, 0, 0)),
        nsp[:, 0] > 0, np.zeros(len(ids), bool))
    f = packing.pack_block(block, mcfg, k)
    return tuple(f[n].astype(np.float32 if spec[n].dtype == tf.float32 else np.int32)
                 for n in names)

  def pack(batch):
    out = tf.numpy_function(
        pack_numpy, [batch[n] for n in ('input_ids', 'input_mask', 'segment_ids',
                                         'masked_lm_positions', 'masked_lm_ids',
                                         'masked_lm_weights', 'next_sentence_labels')],
        [tf.float32 if spec[n].dtype == tf.float32 else tf.int32 for n in names],
        stateful=False)
    return {n: tf.ensure_shape(v, [None] + spec[n].shape) for n, v in zip(names, out)}

  return pack


def _pad_to_batch(batch_size: int):
  def pad(batch):
    n = tf.shape(next(iter(batch.values())))[0]
    return {k: tf.pad(v, [[0, batch_size - n]] + [[0, 0]] * (len(v.shape) - 1))
            for k, v in batch.items()}
  return pad


def chunks(files: list[str], sizes: list[int], read_chunk_bytes: int) -> list[tuple]:
  """(file, start, end, file size) byte ranges over all files, in order. The chunk size shrinks
  for small data (to 1/256 of it, at least 4 KiB) so that even small data has many chunks; it
  never depends on the process count, so neither does the data order."""
  if not sum(sizes):
    raise ValueError(f'data files {files[:3]}...: all empty; re-create them with '
                     'python -m input_pipeline.pretrain.create_pretraining_data')
  size = max(min(read_chunk_bytes, math.ceil(sum(sizes) / 256)), 4096)
  return [(f, start, min(start + size, n), n) for f, n in zip(files, sizes)
          for start in range(0, n, size)]


def _columns(rows: list[tuple]) -> tuple:
  """Chunk rows as columns; offsets int64 (files over 2 GiB)."""
  paths, starts, ends, sizes = zip(*rows)
  return (tf.constant(paths, tf.string),) + tuple(tf.constant(c, tf.int64)
                                                  for c in (starts, ends, sizes))


def training_records(all_chunks: list[tuple], seed: int, process_index: int,
                     process_count: int) -> tf.data.Dataset:
  """This process's share of one global, endless record stream, identical for any process count
  that divides `SLOTS`.

  Every epoch the chunk list is shuffled by the seed alone (the same on every host) and dealt
  round-robin to `slots` streams; the global stream takes one record from each slot in turn.
  Process i owns slots i, i+n, ...: it reads only their chunks, and its records are exactly the
  global records i, i+n, ..., so a global batch holds the same rows whether 1, 2, 4 or 8
  processes read it (tested against one process). Slots get equal chunk counts to within one,
  so no host oversamples files.
  """
  slots = process_count * math.ceil(SLOTS / process_count)
  columns = _columns(all_chunks)

  def epoch_order(epoch):  # stateless: every stream (and host) sees the same permutation
    seeds = tf.stack([tf.constant(seed, tf.int64), epoch])
    return tf.random.experimental.stateless_shuffle(tf.range(len(all_chunks)), seed=seeds)

  def read(index):
    return _chunk_records(*(tf.gather(c, index) for c in columns))

  order = tf.data.Dataset.counter().map(epoch_order).unbatch()
  streams = tuple(order.shard(slots, s).map(read, tf.data.AUTOTUNE, deterministic=True).unbatch()
                  for s in range(process_index, slots, process_count))
  return tf.data.Dataset.zip(streams).map(lambda *records: tf.stack(records)).unbatch()


def _read_chunk(path, start, end, file_size):
  records = tfrecord.records_in_range(path.decode(), int(start), int(end), int(file_size))
  return np.array(records, dtype=object) if records else np.zeros([0], dtype=object)


def _chunk_records(path, start, end, file_size) -> tf.Tensor:
  records = tf.numpy_function(_read_chunk, [path, start, end, file_size], tf.string,
                              stateful=False)
  return tf.ensure_shape(records, [None])


def make_dataset(cfg: ReaderConfig, *, training: bool, process_index: int = 0,
                 process_count: int = 1) -> tf.data.Dataset:
  if cfg.packed and (cfg.dynamic_masking or cfg.pack):
    raise ValueError('data.dynamic_masking and data.pack need unpacked records (these are '
                     'packed): write them without --pack and let the reader pack')
  files = list_files(cfg.files)
  sizes = fs.sizes(files)
  check_sentence_objective(files, sizes, cfg)
  all_chunks = chunks(files, sizes, cfg.read_chunk_bytes)
  if training:
    ds = training_records(all_chunks, cfg.seed, process_index, process_count)
  else:  # in order, no repeat; process i reads chunks i, i+n, ... (maybe none at all)
    mine = all_chunks[process_index::process_count]
    ds = tf.data.Dataset.from_tensor_slices(_columns(mine or all_chunks[:1])).take(len(mine))
    ds = ds.flat_map(lambda *chunk: tf.data.Dataset.from_tensor_slices(_chunk_records(*chunk)))
  if training:
    ds = ds.shuffle(cfg.shuffle_buffer, seed=cfg.seed + 1, reshuffle_each_iteration=True)
  ds = ds.map(_parse(cfg), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  dynamic = cfg.dynamic_masking and training
  if dynamic or cfg.pack:
    # Masking and packing work on whole batches (numpy, vectorised): a batch, or a packing
    # window whose packed rows are then re-batched.
    ds = ds.batch(cfg.pack_window if cfg.pack else cfg.batch_size,
                  drop_remainder=training and not cfg.pack)
    if dynamic:
      seeds = tf.data.Dataset.random(seed=cfg.seed + 2).batch(2)
      ds = tf.data.Dataset.zip(ds, seeds).map(dynamic_mask(cfg), tf.data.AUTOTUNE,
                                              deterministic=True)
    if cfg.pack:
      ds = ds.map(pack_on_the_fly(cfg), tf.data.AUTOTUNE, deterministic=True).unbatch()
      ds = ds.batch(cfg.batch_size, drop_remainder=training)
  else:
    ds = ds.batch(cfg.batch_size, drop_remainder=training)
  if not training:
    ds = ds.map(_pad_to_batch(cfg.batch_size))
  ds = ds.prefetch(tf.data.AUTOTUNE)
  if cfg.threads:
    options = tf.data.Options()
    options.threading.private_threadpool_size = cfg.threads
    options.autotune.cpu_budget = cfg.threads
    ds = ds.with_options(options)
  return ds


class DataIterator:
  """Numpy batches from a tf.data pipeline; its position saves and restores exactly."""

  def __init__(self, dataset: tf.data.Dataset, source: str = ''):
    self._iterator = iter(dataset)
    self._ckpt = tf.train.Checkpoint(iterator=self._iterator)
    self._source = source

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    try:
      return {k: v.numpy() for k, v in next(self._iterator).items()}
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError,
            tf.errors.UnknownError) as e:
      reason = _first_line(e.message)
      if 'not a valid TFRecord' in reason:
        raise ValueError(reason) from None
      raise ValueError(
          f'data files {self._source!r}: corrupt, or not BERT TFRecords of this '
          f'max_seq_length/max_predictions_per_seq/packed setting ({reason}); re-create them '
          'with python -m input_pipeline.pretrain.create_pretraining_data') from None

  def save(self, directory: str) -> None:
    """The iterator's state as files in `directory` (a local path or URL)."""
    with fs.staged_dir(directory) as local:
      self._ckpt.write(os.path.join(local, 'it'))

  def restore(self, directory: str) -> None:
    if not fs.exists(fs.join(directory, 'it.index')):
      raise FileNotFoundError(f'{directory}: no data-iterator state (it.index)')
    with fs.local_dir(directory) as local:
      self._ckpt.read(os.path.join(local, 'it')).assert_consumed()


def _first_line(message: str) -> str:
  """The Python error a numpy_function raised, without TensorFlow's traceback around it."""
  corrupt = re.search(r'(\S+: not a valid TFRecord[^\n]*)', message)
  if corrupt:
    return corrupt.group(1)
  lines = [l.strip() for l in message.strip().splitlines() if l.strip()]
  return lines[0][:300] if lines else message
