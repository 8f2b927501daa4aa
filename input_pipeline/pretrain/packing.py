"""Pack several short instances into one row without cross-contamination.

Best-fit-decreasing (like Graphcore's packing, which halved the rows of MLPerf's Wikipedia
data): longest first, each into the fullest row that still has room for its tokens, its masked
positions and one more instance (at most `max_instances_per_row`, K). Rows carry the packed
fields of features.py; the model turns `packed_segment_ids` into a block-diagonal attention mask
and `position_ids` restart per instance, so every instance gets exactly the logits it would get
alone. Row assembly is vectorised: one scatter per field for the whole block.

All three sentence objectives (objectives.py) pack alike: SOP rows are pairs
like NSP's; full-sentence rows are instances with all-zero segment ids whose sentence labels the
trainer ignores, and gain little (only a window's last row is short) but still pack.
"""

from __future__ import annotations

import numpy as np

from input_pipeline.pretrain import objectives
from input_pipeline.pretrain.instances import MaskingConfig
from input_pipeline.pretrain.masking import Block


def pack_rows(lengths: np.ndarray, num_masked: np.ndarray, cfg: MaskingConfig,
              max_instances_per_row: int) -> list[list[int]]:
  """Instance indices per row, best-fit-decreasing on token count."""
  seq, preds = cfg.max_seq_length, cfg.max_predictions_per_seq
  # by_room[r]: rows with exactly r free token slots; row = [free_preds, members]
  by_room: list[list[int]] = [[] for _ in range(seq + 1)]
  rows: list[tuple[list[int], list[int]]] = []
  lengths, num_masked = lengths.tolist(), num_masked.tolist()
  for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
    need, need_preds = lengths[i], num_masked[i]
    placed = False
    for room in range(need, seq + 1):
      bucket = by_room[room]
      for k, row_id in enumerate(bucket):
        free_preds, members = rows[row_id]
        if free_preds[0] >= need_preds and len(members) < max_instances_per_row:
          bucket.pop(k)
          members.append(i)
          free_preds[0] -= need_preds
          if len(members) < max_instances_per_row:
            by_room[room - need].append(row_id)
          placed = True
          break
      if placed:
        break
    if not placed:
      rows.append(([preds - need_preds], [i]))
      by_room[seq - need].append(len(rows) - 1)
  return [members for _, members in rows]


def pack_block(block: Block, cfg: MaskingConfig, max_instances_per_row: int,
               chunk_rows: int = 4096) -> dict[str, np.ndarray]:
  """A block's instances -> packed rows (the packed fields of features.py), [R, ...] each."""
  m = block.masked
  s, p, k = cfg.max_seq_length, cfg.max_predictions_per_seq, max_instances_per_row
  groups = pack_rows(m.lengths, m.num_masked, cfg, k)
  n, r = len(block), len(groups)
  # Where each instance goes: its row, its slot in the row, its token and prediction offsets.
  row_of = np.empty(n, np.int64)
  slot_of = np.empty(n, np.int64)
  for row, members in enumerate(groups):
    row_of[members] = row
    slot_of[members] = np.arange(len(members))
  order = np.lexsort((slot_of, row_of))  # instances in row-then-slot order
  first_in_row = np.r_[True, row_of[order][1:] != row_of[order][:-1]]

  def offsets(sizes):
    ends = np.cumsum(sizes[order])
    starts_in_order = ends - sizes[order]
    row_base = np.maximum.accumulate(np.where(first_in_row, starts_in_order, 0))
    out = np.empty(n, np.int64)
    out[order] = starts_in_order - row_base
    return out

  token_offset, pred_offset = offsets(m.lengths), offsets(m.num_masked)

  f = {name: np.zeros((r, s), np.int32) for name in
       ('input_ids', 'input_mask', 'segment_ids', 'position_ids', 'packed_segment_ids')}
  f.update({name: np.zeros((r, p), np.int32) for name in ('masked_lm_positions', 'masked_lm_ids')})
  f['masked_lm_weights'] = np.zeros((r, p), np.float32)
  for lo in range(0, n, chunk_rows):  # scatter a chunk of instances at a time: bounded memory
    hi = min(n, lo + chunk_rows)
    inst, col = np.nonzero(np.arange(s) < m.lengths[lo:hi, None])
    inst += lo
    dst = (row_of[inst], token_offset[inst] + col)
    f['input_ids'][dst] = m.input_ids[inst, col]
    f['input_mask'][dst] = 1
    f['segment_ids'][dst] = m.segment_ids[inst, col]
    f['position_ids'][dst] = col
    f['packed_segment_ids'][dst] = slot_of[inst] + 1
    inst, j = np.nonzero(np.arange(p) < m.num_masked[lo:hi, None])
    inst += lo
    dst = (row_of[inst], pred_offset[inst] + j)
    f['masked_lm_positions'][dst] = m.masked_lm_positions[inst, j] + token_offset[inst]
    f['masked_lm_ids'][dst] = m.masked_lm_ids[inst, j]
    f['masked_lm_weights'][dst] = 1.0

  f.update({name: np.zeros((r, k), np.int32) for name in
            ('next_sentence_positions', 'next_sentence_labels')})
  f['next_sentence_weights'] = np.zeros((r, k), np.float32)
  dst = (row_of, slot_of)
  f['next_sentence_positions'][dst] = token_offset
  f['next_sentence_labels'][dst] = block.is_random_next
  f['next_sentence_weights'][dst] = 1.0
  f.update(objectives.marker_features(block.sentence_objective, r))
  return f
