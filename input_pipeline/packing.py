"""Pack several short instances into one row without cross-contamination.

Best-fit-decreasing over a window of instances (like Graphcore's packing, which halved the rows
of MLPerf's Wikipedia data): longest first, each into the fullest row that still has room for
its tokens, its masked positions and one more instance (at most `max_instances_per_row`).
Rows carry the packed fields of DESIGN.md; the model turns `packed_segment_ids` into a
block-diagonal attention mask and `position_ids` restart per instance, so every instance gets
exactly the logits it would get alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from input_pipeline.instances import Instance, MaskingConfig


def pack_instances(instances: Sequence[Instance], cfg: MaskingConfig,
                   max_instances_per_row: int) -> list[list[Instance]]:
  seq, preds = cfg.max_seq_length, cfg.max_predictions_per_seq
  # by_room[r] = rows with exactly r free token slots; rows: [free_preds, members]
  by_room: list[list[int]] = [[] for _ in range(seq + 1)]
  rows: list[tuple[list[int], list[Instance]]] = []
  for inst in sorted(instances, key=lambda x: -len(x.tokens)):
    need, need_preds = len(inst.tokens), len(inst.masked_positions)
    placed = False
    for room in range(need, seq + 1):
      bucket = by_room[room]
      for k, row_id in enumerate(bucket):
        free_preds, members = rows[row_id]
        if free_preds[0] >= need_preds and len(members) < max_instances_per_row:
          bucket.pop(k)
          members.append(inst)
          free_preds[0] -= need_preds
          by_room[room - need].append(row_id)
          placed = True
          break
      if placed:
        break
    if not placed:
      rows.append(([preds - need_preds], [inst]))
      by_room[seq - need].append(len(rows) - 1)
  return [members for _, members in rows]


def packed_features(row: Sequence[Instance], cfg: MaskingConfig,
                    max_instances_per_row: int) -> dict[str, np.ndarray]:
  s, p, k = cfg.max_seq_length, cfg.max_predictions_per_seq, max_instances_per_row
  f = {name: np.zeros(s, np.int64) for name in
       ('input_ids', 'input_mask', 'segment_ids', 'position_ids', 'packed_segment_ids')}
  f.update({name: np.zeros(p, np.int64) for name in ('masked_lm_positions', 'masked_lm_ids')})
  f['masked_lm_weights'] = np.zeros(p, np.float32)
  f.update({name: np.zeros(k, np.int64) for name in
            ('next_sentence_positions', 'next_sentence_labels')})
  f['next_sentence_weights'] = np.zeros(k, np.float32)
  start = pred = 0
  for j, inst in enumerate(row):
    n, m = len(inst.tokens), len(inst.masked_positions)
    f['input_ids'][start:start + n] = inst.tokens
    f['input_mask'][start:start + n] = 1
    f['segment_ids'][start:start + n] = inst.segment_ids
    f['position_ids'][start:start + n] = np.arange(n)
    f['packed_segment_ids'][start:start + n] = j + 1
    f['masked_lm_positions'][pred:pred + m] = np.asarray(inst.masked_positions) + start
    f['masked_lm_ids'][pred:pred + m] = inst.masked_labels
    f['masked_lm_weights'][pred:pred + m] = 1.0
    f['next_sentence_positions'][j] = start
    f['next_sentence_labels'][j] = int(inst.is_random_next)
    f['next_sentence_weights'][j] = 1.0
    start, pred = start + n, pred + m
  return f
