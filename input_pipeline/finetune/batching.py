"""Fine-tuning batches from featurized arrays (numpy, host side): which rows an epoch's steps
take, how a batch is cut to a length bucket, and the rows of a batch as arrays.

An epoch's order is a function of (seed, epoch) only, so a resumed run sees exactly the
batches it would have; the last batch of an epoch is padded with row -1, a copy of row 0 with
zero weight, so every step has the same global batch.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def epoch_rows(seed: int, epoch: int, n: int, batch: int) -> np.ndarray:
  """[steps, batch] example indices of one epoch, -1 padding the last batch."""
  steps = -(-n // batch)
  order = np.random.default_rng([seed, epoch]).permutation(n)
  return np.concatenate([order, np.full(steps * batch - n, -1)]).reshape(steps, batch)


def take(arrays: dict, rows, keys: Iterable[str], length: int | None = None,
         token_axis=lambda name: True) -> dict:
  """Rows of `arrays` (only `keys`), the arrays whose last axis is the token axis
  (`token_axis(name)`, a kind's schema says) cut to `length` tokens; row -1 is padding: a
  copy of row 0 with zero weight."""
  valid = rows >= 0
  index = np.where(valid, rows, 0)
  full = arrays['input_ids'].shape[-1]
  out = {}
  for k in keys:
    if k in arrays:
      x = arrays[k][index]
      if (length is not None and length < full and x.ndim >= 2 and x.shape[-1] == full
          and token_axis(k)):
        x = x[..., :length]  # token axes: ids, masks, tag labels and weights
      if k == 'label_weights':
        x = np.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0).astype(np.float32)
      out[k] = x
  return out


def bucket_length(arrays: dict, rows, buckets: int) -> int:
  """The tokens a batch of `rows` is padded to: the smallest of `buckets` evenly spaced lengths
  (multiples of 8, the last = max_seq_length) that holds its longest row.

  Padding every batch to max_seq_length costs ~4x for short inputs (POS sentences at 128);
  padding to the longest row would compile a step per distinct length. A few fixed lengths
  bound the compiles (one train and one predict step per bucket). `rows` are the global
  batch's, so every process picks the same length. Real tokens come first in every row and
  padding is masked out of attention, so without dropout the outputs at real tokens are the
  full-length ones up to float round-off (dropout draws its masks per shape: other masks,
  the same distribution)."""
  full = arrays['input_ids'].shape[-1]
  valid = rows[rows >= 0]
  if buckets <= 1 or not len(valid):
    return full
  real = arrays['input_mask'][valid].reshape(len(valid), -1, full).sum(-1).max()
  step = -(-full // (buckets * 8)) * 8
  return int(min(full, max(-(-int(real) // step), 1) * step))
