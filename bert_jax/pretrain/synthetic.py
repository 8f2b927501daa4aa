"""Random batches in the training feature layout, for benchmarks and tests.

Rows end in ~10% padding, carry `predictions` real MLM labels at distinct non-padding
positions and random NSP labels: the peer benchmark's definition (issue 5). Packed layouts
(`packed=True`) get one instance per row in the packed fields, so the batch has exactly the
names, shapes and dtypes of `pretraining.features` that a packed run's step compiles for.
"""

from __future__ import annotations

import numpy as np

from input_pipeline.pretrain import batch_layout


def random_batch(rng: np.random.Generator, batch: int, seq_len: int, predictions: int,
                 vocab_size: int, pad_fraction: float = 0.1, packed: bool = False,
                 max_instances_per_row: int = 3) -> dict[str, np.ndarray]:
  real = seq_len - int(round(pad_fraction * seq_len))
  if predictions > real - 2:
    raise ValueError(f'{predictions} predictions do not fit in {real} real tokens')
  ids = rng.integers(1000, vocab_size, (batch, seq_len)).astype(np.int32)
  ids[:, real:] = 0
  mask = np.zeros((batch, seq_len), np.int32)
  mask[:, :real] = 1
  seg = np.zeros((batch, seq_len), np.int32)
  seg[:, real // 2:real] = 1
  positions = np.stack([np.sort(rng.choice(np.arange(1, real), predictions, replace=False))
                        for _ in range(batch)]).astype(np.int32)
  labels = rng.integers(1000, vocab_size, (batch, predictions)).astype(np.int32)
  out = dict(input_ids=ids, input_mask=mask, segment_ids=seg, masked_lm_positions=positions,
             masked_lm_ids=labels, masked_lm_weights=np.ones((batch, predictions), np.float32),
             next_sentence_labels=rng.integers(0, 2, (batch, 1)).astype(np.int32))
  layout = batch_layout.BatchLayout(seq_len, predictions, packed, max_instances_per_row)
  if packed:  # one instance per row: slot 0 used, the others weightless
    k = max_instances_per_row
    out['position_ids'] = np.tile(np.arange(seq_len, dtype=np.int32), (batch, 1)) * mask
    out['packed_segment_ids'] = mask.copy()
    out['next_sentence_positions'] = np.zeros((batch, k), np.int32)
    out['next_sentence_labels'] = np.pad(out['next_sentence_labels'], ((0, 0), (0, k - 1)))
    out['next_sentence_weights'] = np.zeros((batch, k), np.float32)
    out['next_sentence_weights'][:, 0] = 1.0
  layout.check(out, 'synthetic.random_batch')
  return out
