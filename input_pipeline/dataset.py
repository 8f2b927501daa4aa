"""The tf.data reader for training and eval: per-host shards, checkpointable, numpy out.

Reads google-research/bert's TFRecords unchanged, and ours (plain or packed). Training:
list files -> this process's share (by file when there are at least as many files as
processes, else by record) -> seeded file shuffle, repeat, interleave -> seeded shuffle ->
parse -> optional dynamic masking (RoBERTa-style: fresh masks every time a row is read, by the
same `masking.mask_block` as data creation, whole words optional) -> optional packing on the
fly (`packing.pack_block` over windows of records) -> per-process batch -> prefetch. Eval: no
shuffle, no repeat, and the last partial batch padded with zero-weight rows so every batch has
the jitted shape. Masking and packing run as `tf.numpy_function` on whole batches, declared
stateless, so iterator checkpoints still work.

Records written for another sentence objective than `sentence_objective` (nsp, sop, none; a
marker in each record, input_pipeline/objectives.py) are refused with a ValueError up front.

`DataIterator.save/restore` checkpoint the whole tf.data iterator (shuffle buffers included)
with `tf.train.Checkpoint`, so a restarted run gets exactly the batches it would have got.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os

import numpy as np
import tensorflow as tf
from google.protobuf import message

from input_pipeline import masking, objectives, packing
from input_pipeline.instances import MaskingConfig

INT_FEATURES_S = ('input_ids', 'input_mask', 'segment_ids')
PACKED_FEATURES_S = ('position_ids', 'packed_segment_ids')
INT_FEATURES_P = ('masked_lm_positions', 'masked_lm_ids')


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
  whole_word_masking: bool = False  # with dynamic_masking; needs vocab_file or spm_model
  pack: bool = False  # pack unpacked records on the fly, K = max_instances_per_row
  pack_window: int = 1024  # rows the packer sees at once (more: fuller rows)
  # The data's tokenizer, for dynamic masking (replacement tokens, word boundaries).
  vocab_file: str = ''
  spm_model: str = ''
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
  # What the records must hold: nsp | sop | none (create_pretraining_data --next_sentence).
  sentence_objective: str = 'nsp'


def list_files(patterns: str) -> list[str]:
  files = []
  for pattern in (p.strip() for p in patterns.split(',') if p.strip()):
    matched = sorted(f for f in glob.glob(pattern) if not f.endswith(('.json', '.tmp')))
    if not matched:
      raise FileNotFoundError(f'data files {pattern!r}: no such file; create them with '
                              'python -m input_pipeline.create_pretraining_data')
    files.extend(matched)
  return files


def record_objective(record: bytes) -> str:
  """The sentence objective a record was written for (input_pipeline/objectives.py): its
  marker; else sop for google-research/albert's records (they alone carry `token_boundary`;
  ALBERT's default is SOP), else nsp (google-research/bert's records and ours)."""
  feature = tf.train.Example.FromString(record).features.feature
  if objectives.MARKER in feature:
    return objectives.name_of_code(feature[objectives.MARKER].int64_list.value[0])
  return 'sop' if 'token_boundary' in feature else 'nsp'


def _first_records(files: list[str]) -> list[tuple[str, bytes]]:
  """(path, first record) of each non-empty, readable file."""

  def first(path):
    return tf.data.Dataset.zip(tf.data.Dataset.from_tensors(path),
                               tf.data.TFRecordDataset(path).take(1))

  ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string)).interleave(
      first, cycle_length=16, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  return [(path.decode(), record) for path, record in ds.ignore_errors().as_numpy_iterator()]


def check_sentence_objective(files: list[str], cfg: ReaderConfig) -> None:
  """Refuse records written for another sentence objective than the config's, before training
  on wrong labels (or on none's absent ones). A file comes from one data-creation run, so its
  first record speaks for it: one small read per file, all in one tf.data pass (~2 ms a
  file here; a dataset per file cost 35 ms). Unreadable files are left to the reader, whose
  error names them as corrupt."""
  want = objectives.check_name(cfg.sentence_objective, 'data.sentence_objective')
  found: dict[str, list[str]] = {}
  for path, record in sorted(_first_records(files)):
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
          f'python -m input_pipeline.create_pretraining_data --next_sentence={want}')


def feature_spec(cfg: ReaderConfig) -> dict[str, tf.io.FixedLenFeature]:
  s, p = cfg.max_seq_length, cfg.max_predictions_per_seq
  spec = {name: tf.io.FixedLenFeature([s], tf.int64) for name in INT_FEATURES_S}
  spec.update({name: tf.io.FixedLenFeature([p], tf.int64) for name in INT_FEATURES_P})
  spec['masked_lm_weights'] = tf.io.FixedLenFeature([p], tf.float32)
  if cfg.packed:  # stored packed rows
    k = cfg.max_instances_per_row
    spec.update({name: tf.io.FixedLenFeature([s], tf.int64) for name in PACKED_FEATURES_S})
    spec['next_sentence_positions'] = tf.io.FixedLenFeature([k], tf.int64)
    spec['next_sentence_labels'] = tf.io.FixedLenFeature([k], tf.int64)
    spec['next_sentence_weights'] = tf.io.FixedLenFeature([k], tf.float32)
  else:
    spec['next_sentence_labels'] = tf.io.FixedLenFeature([1], tf.int64)
  return spec


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
def _tokenizer(vocab_file: str, spm_model: str, do_lower_case: bool):
  from input_pipeline.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  return load_tokenizer(vocab_file or None, spm_model or None, do_lower_case)


def masking_vocab(cfg: ReaderConfig):
  if cfg.vocab_file or cfg.spm_model:
    return _tokenizer(cfg.vocab_file, cfg.spm_model, cfg.do_lower_case)
  if cfg.whole_word_masking:
    raise ValueError('data.whole_word_masking needs the tokenizer: set data.vocab_file or '
                     'data.spm_model')
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


def make_dataset(cfg: ReaderConfig, *, training: bool, process_index: int = 0,
                 process_count: int = 1) -> tf.data.Dataset:
  if cfg.packed and (cfg.dynamic_masking or cfg.pack):
    raise ValueError('data.dynamic_masking and data.pack need unpacked records (these are '
                     'packed): write them without --pack and let the reader pack')
  files = list_files(cfg.files)
  check_sentence_objective(files, cfg)
  by_file = len(files) >= process_count
  if by_file:
    files = files[process_index::process_count]
  ds = tf.data.Dataset.from_tensor_slices(files)
  if training:
    ds = ds.shuffle(len(files), seed=cfg.seed, reshuffle_each_iteration=True).repeat()
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                       block_length=1, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  else:
    ds = ds.flat_map(tf.data.TFRecordDataset)
  if not by_file:
    ds = ds.shard(process_count, process_index)
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
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
      reason = e.message.strip().splitlines()[0][:300]
      raise ValueError(
          f'data files {self._source!r}: corrupt, or not BERT TFRecords of this '
          f'max_seq_length/max_predictions_per_seq/packed setting ({reason}); re-create them '
          'with python -m input_pipeline.create_pretraining_data') from None

  def save(self, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    self._ckpt.write(path)

  def restore(self, path: str) -> None:
    self._ckpt.read(path).assert_consumed()
