"""The tf.data reader for training and eval: per-host shards, checkpointable, numpy out.

Reads google-research/bert's TFRecords unchanged, and ours (plain or packed). Training:
list files -> this process's share (by file when there are at least as many files as
processes, else by record) -> seeded file shuffle, repeat, interleave -> seeded shuffle ->
parse -> optional dynamic masking (RoBERTa-style: fresh masks every time a row is read, same
15% / 80-10-10 rules) -> per-process batch -> prefetch. Eval: no shuffle, no repeat, and the
last partial batch padded with zero-weight rows so every batch has the jitted shape.

`DataIterator.save/restore` checkpoint the whole tf.data iterator (shuffle buffers included)
with `tf.train.Checkpoint`, so a restarted run gets exactly the batches it would have got.
"""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import tensorflow as tf

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
  dynamic_masking: bool = False
  # Needed by dynamic masking: special ids and the range of random replacements.
  vocab_size: int = 30522
  mask_id: int = 103
  cls_id: int = 101
  sep_id: int = 102
  first_real_token_id: int = 5
  masked_lm_prob: float = 0.15
  # tf.data threads (0 = TF's default, all cores). On a small CPU machine the input pipeline
  # otherwise competes with XLA for the cores that run the train step.
  threads: int = 0


def list_files(patterns: str) -> list[str]:
  files = []
  for pattern in (p.strip() for p in patterns.split(',') if p.strip()):
    matched = sorted(f for f in glob.glob(pattern) if not f.endswith(('.json', '.tmp')))
    if not matched:
      raise FileNotFoundError(f'data files {pattern!r}: no such file; create them with '
                              'python -m input_pipeline.create_pretraining_data')
    files.extend(matched)
  return files


def feature_spec(cfg: ReaderConfig) -> dict[str, tf.io.FixedLenFeature]:
  s, p = cfg.max_seq_length, cfg.max_predictions_per_seq
  spec = {name: tf.io.FixedLenFeature([s], tf.int64) for name in INT_FEATURES_S}
  spec.update({name: tf.io.FixedLenFeature([p], tf.int64) for name in INT_FEATURES_P})
  spec['masked_lm_weights'] = tf.io.FixedLenFeature([p], tf.float32)
  if cfg.packed:
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


def dynamic_mask(cfg: ReaderConfig):
  """Undo the stored masks, then draw new ones with the reference's rules (token level)."""
  p = cfg.max_predictions_per_seq

  def remask(ex, seed):
    ids = ex['input_ids']
    s = tf.shape(ids)[0]
    # Restore the original tokens at the stored masked positions.
    real = ex['masked_lm_weights'] > 0
    pos = tf.boolean_mask(ex['masked_lm_positions'], real)
    ids = tf.tensor_scatter_nd_update(ids, pos[:, None], tf.boolean_mask(ex['masked_lm_ids'], real))
    candidate = (ex['input_mask'] > 0) & (ids != cfg.cls_id) & (ids != cfg.sep_id)
    length = tf.reduce_sum(ex['input_mask'])
    num = tf.minimum(p, tf.maximum(1, tf.cast(tf.round(
        tf.cast(length, tf.float32) * cfg.masked_lm_prob), tf.int32)))
    num = tf.minimum(num, tf.reduce_sum(tf.cast(candidate, tf.int32)))
    seeds = tf.random.experimental.stateless_split(seed, 3)
    score = tf.where(candidate, tf.random.stateless_uniform([s], seeds[0]), -1.0)
    chosen = tf.sort(tf.math.top_k(score, k=p).indices[:num])
    labels = tf.gather(ids, chosen)
    action = tf.random.stateless_uniform([num], seeds[1])
    random_ids = tf.random.stateless_uniform([num], seeds[2], minval=cfg.first_real_token_id,
                                             maxval=cfg.vocab_size, dtype=tf.int32)
    new = tf.where(action < 0.8, cfg.mask_id, tf.where(action < 0.9, labels, random_ids))
    ids = tf.tensor_scatter_nd_update(ids, chosen[:, None], new)
    pad = p - num
    out = dict(ex)
    out['input_ids'] = ids
    out['masked_lm_positions'] = tf.pad(chosen, [[0, pad]])
    out['masked_lm_ids'] = tf.pad(labels, [[0, pad]])
    out['masked_lm_weights'] = tf.pad(tf.ones([num], tf.float32), [[0, pad]])
    return out

  return remask


def _pad_to_batch(batch_size: int):
  def pad(batch):
    n = tf.shape(next(iter(batch.values())))[0]
    return {k: tf.pad(v, [[0, batch_size - n]] + [[0, 0]] * (len(v.shape) - 1))
            for k, v in batch.items()}
  return pad


def make_dataset(cfg: ReaderConfig, *, training: bool, process_index: int = 0,
                 process_count: int = 1) -> tf.data.Dataset:
  if cfg.dynamic_masking and cfg.packed:
    raise ValueError('data.dynamic_masking works on unpacked rows only')
  files = list_files(cfg.files)
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
  if cfg.dynamic_masking and training:
    seeds = tf.data.Dataset.random(seed=cfg.seed + 2).batch(2).map(
        lambda x: tf.cast(x, tf.int64))
    ds = tf.data.Dataset.zip(ds, seeds).map(dynamic_mask(cfg), tf.data.AUTOTUNE,
                                            deterministic=True)
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
