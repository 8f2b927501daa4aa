"""The batch schema: every feature's name, per-row shape and dtype, plain and packed.

One table read by the tf.data reader (what it parses and what it yields), the jitted train
step's inputs, AOT compilation (`bert_jax.aot` compiles exactly the step a run will use) and
the synthetic batches of tests and benchmarks, so they cannot drift apart.

Plain rows hold one instance (google-research/bert's records): one NSP label per row. Packed
rows hold up to `max_instances_per_row` instances (create_pretraining_data --pack, or
data.pack=True on the fly): per-token positions and instance ids, one NSP label, position
and weight per instance.
"""

from __future__ import annotations

import dataclasses

import numpy as np

INT, FLOAT = np.dtype(np.int32), np.dtype(np.float32)


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  packed: bool = False  # rows of several instances (stored packed, or packed by the reader)
  max_instances_per_row: int = 3

  def features(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (per-row shape, dtype) of a batch row."""
    s, p, k = self.max_seq_length, self.max_predictions_per_seq, self.max_instances_per_row
    out = {'input_ids': ((s,), INT), 'input_mask': ((s,), INT), 'segment_ids': ((s,), INT),
           'masked_lm_positions': ((p,), INT), 'masked_lm_ids': ((p,), INT),
           'masked_lm_weights': ((p,), FLOAT)}
    if self.packed:
      out.update({'position_ids': ((s,), INT), 'packed_segment_ids': ((s,), INT),
                  'next_sentence_positions': ((k,), INT), 'next_sentence_labels': ((k,), INT),
                  'next_sentence_weights': ((k,), FLOAT)})
    else:
      out['next_sentence_labels'] = ((1,), INT)
    return out

  def shapes(self, batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {k: ((batch_size,) + shape, dtype) for k, (shape, dtype) in self.features().items()}

  def zeros(self, batch_size: int) -> dict[str, np.ndarray]:
    """A batch of all-padding rows: every weight and mask 0, so it adds nothing to any loss or
    metric (eval hosts whose data ended feed these while others finish)."""
    return {k: np.zeros(shape, dtype) for k, (shape, dtype) in self.shapes(batch_size).items()}

  def check(self, batch: dict[str, np.ndarray], where: str) -> None:
    """Raise ValueError when a batch's names, shapes or dtypes differ from the schema."""
    want = self.shapes(len(next(iter(batch.values()))))
    got = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in batch.items()}
    if got != want:
      diff = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
      raise ValueError(f'{where}: batch does not match the feature schema for {self}: '
                       + ', '.join(f'{k} {got.get(k)} != {want.get(k)}' for k in diff))
