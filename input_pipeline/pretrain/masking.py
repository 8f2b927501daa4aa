"""The reference's MLM masking, vectorised over a whole block of instances with numpy.

Same rules as google-research/bert's `create_masked_lm_predictions` (and `instances.mask_tokens`):
candidates are all real tokens but [CLS]/[SEP]; they are visited in a uniformly random order
(whole words as units with whole-word masking); a unit is taken when it still fits in
num_to_predict = min(max_predictions_per_seq, max(1, round(len * masked_lm_prob))) and skipped
when it does not, until num_to_predict positions are taken; each taken position becomes [MASK]
80%, stays 10%, a random token 10%. Only the random stream differs from the reference's
Python `random.Random` (a numpy Generator, one draw per array instead of per token); with span
pairing, instance creation runs about 3x faster than the per-instance Python path at 128 tokens
(1.6x at 512), and whole data creation 6x the reference's (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence

import numpy as np

from input_pipeline.pretrain import objectives
from input_pipeline.pretrain.instances import (MaskingConfig, Window, full_sentence_rows,
                                                  pair_spans, sop_spans)


@dataclasses.dataclass
class MaskedBlock:
  """N instances padded to max_seq_length, masked; the reference's record fields."""
  input_ids: np.ndarray  # [N, S] int32, after masking
  lengths: np.ndarray  # [N]
  segment_ids: np.ndarray  # [N, S]
  masked_lm_positions: np.ndarray  # [N, P], sorted, 0-padded
  masked_lm_ids: np.ndarray  # [N, P]
  num_masked: np.ndarray  # [N]
  replacements: tuple[int, int, int]  # [MASK], random, kept (totals)

  @classmethod
  def concatenate(cls, blocks: Sequence['MaskedBlock'], cfg: MaskingConfig) -> 'MaskedBlock':
    if not blocks:
      s, p = cfg.max_seq_length, cfg.max_predictions_per_seq
      empty = lambda w: np.zeros((0, w), np.int32)  # noqa: E731
      return cls(empty(s), np.zeros(0, np.int64), empty(s), empty(p), empty(p),
                 np.zeros(0, np.int64), (0, 0, 0))
    cat = lambda name: np.concatenate([getattr(b, name) for b in blocks])  # noqa: E731
    return cls(cat('input_ids'), cat('lengths'), cat('segment_ids'), cat('masked_lm_positions'),
               cat('masked_lm_ids'), cat('num_masked'),
               tuple(int(sum(b.replacements[k] for b in blocks)) for k in range(3)))

  @property
  def input_mask(self) -> np.ndarray:
    return (np.arange(self.input_ids.shape[1]) < self.lengths[:, None]).astype(np.int32)

  @property
  def masked_lm_weights(self) -> np.ndarray:
    p = self.masked_lm_positions.shape[1]
    return (np.arange(p) < self.num_masked[:, None]).astype(np.float32)


def pad_block(token_lists: list[list[int]], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """Lists of ids -> ([N, S] zero-padded int32, lengths)."""
  lengths = np.fromiter(map(len, token_lists), np.int64, len(token_lists))
  if len(token_lists) and lengths.max() > seq_len:
    raise ValueError(f'a row has {lengths.max()} entries, more than its width {seq_len}')
  ids = np.zeros((len(token_lists), seq_len), np.int32)
  ids[np.arange(seq_len) < lengths[:, None]] = np.fromiter(
      itertools.chain.from_iterable(token_lists), np.int32, int(lengths.sum()))
  return ids, lengths


def mask_block(ids: np.ndarray, lengths: np.ndarray, num_a: np.ndarray, cfg: MaskingConfig,
               tokenizer, rng: np.random.Generator) -> MaskedBlock:
  """Mask N unmasked `[CLS] A [SEP] B [SEP]` rows; `num_a` = len(A) per row."""
  n, s = ids.shape
  p = cfg.max_predictions_per_seq
  col = np.arange(s)
  real = col < lengths[:, None]
  segment_ids = ((col >= num_a[:, None] + 2) & real).astype(np.int32)
  candidate = real & (ids != tokenizer.cls_id) & (ids != tokenizer.sep_id)
  num_to_predict = np.minimum(p, np.maximum(1, np.rint(lengths * cfg.masked_lm_prob))).astype(
      np.int64)

  # Units: single tokens, or whole words (a continuation piece joins the previous candidate's
  # word, exactly as the reference groups cand_indexes; but never across [CLS] or [SEP]: a
  # byte-level BPE document's first token has no 'Ġ', yet starts a word).
  if cfg.do_whole_word_mask:
    after_special = np.ones_like(candidate)
    after_special[:, 1:] = ~candidate[:, :-1]
    start = candidate & (tokenizer.word_start_table[ids] | after_special)
  else:
    start = candidate
  # A unit's length, stored at its start position.
  start_of = np.maximum.accumulate(np.where(start, col, 0), axis=1)  # each token's unit start
  unit_len = np.zeros((n, s), np.int64)
  rows, cols = np.nonzero(candidate)
  np.add.at(unit_len, (rows, start_of[rows, cols]), 1)

  # Visit units in random order; take one when it fits, skip it when it does not.
  order = np.argsort(np.where(start, rng.random((n, s), np.float32), 2.0), axis=1)
  units_per_row = start.sum(axis=1)
  taken_start = np.zeros((n, s), bool)
  count = np.zeros(n, np.int64)
  row = np.arange(n)
  for k in range(int(units_per_row.max(initial=0))):
    open_rows = row[(count < num_to_predict) & (k < units_per_row)]
    if not len(open_rows):
      break
    unit = order[open_rows, k]
    length = unit_len[open_rows, unit]
    fits = count[open_rows] + length <= num_to_predict[open_rows]
    taken_start[open_rows[fits], unit[fits]] = True
    count[open_rows[fits]] += length[fits]
  chosen = candidate & taken_start[row[:, None], start_of]

  # Sorted positions, labels, and the 80/10/10 replacement of each chosen token.
  num_masked = chosen.sum(axis=1)
  rows, cols = np.nonzero(chosen)  # row-major: positions come out sorted
  slot = np.arange(len(rows)) - np.repeat(np.cumsum(num_masked) - num_masked, num_masked)
  positions = np.zeros((n, p), np.int32)
  labels = np.zeros((n, p), np.int32)
  positions[rows, slot] = cols
  labels[rows, slot] = ids[rows, cols]
  action = rng.random(len(rows))
  replacement_ids = (np.arange(tokenizer.vocab_size) if cfg.replace_from_full_vocab
                     else tokenizer.replacement_ids)
  random_ids = replacement_ids[rng.integers(0, len(replacement_ids), len(rows))]
  to_mask, to_random = action < 0.8, action >= 0.9
  out = ids.copy()
  out[rows[to_mask], cols[to_mask]] = tokenizer.mask_id
  out[rows[to_random], cols[to_random]] = random_ids[to_random]
  n_mask, n_random = int(to_mask.sum()), int(to_random.sum())
  return MaskedBlock(out, lengths, segment_ids, positions, labels, num_masked,
                     (n_mask, n_random, len(rows) - n_mask - n_random))


@dataclasses.dataclass
class Block:
  """A window's instances: masked rows plus their sentence labels, in random order."""
  masked: MaskedBlock
  is_random_next: np.ndarray  # [N] bool: NSP random next, SOP swapped, all False for none
  truncated: np.ndarray  # [N] bool
  sentence_objective: str = 'nsp'  # objectives.OBJECTIVES; sop/none records carry a marker
  documents: np.ndarray | None = None  # [N] documents per row (full-sentence rows only)

  def __len__(self) -> int:
    return len(self.is_random_next)

  def features(self) -> dict[str, np.ndarray]:
    """The reference's record fields (features.py), [N, ...] each, plus the objective marker."""
    m = self.masked
    return {'input_ids': m.input_ids, 'input_mask': m.input_mask, 'segment_ids': m.segment_ids,
            'masked_lm_positions': m.masked_lm_positions, 'masked_lm_ids': m.masked_lm_ids,
            'masked_lm_weights': m.masked_lm_weights,
            'next_sentence_labels': self.is_random_next.astype(np.int32)[:, None],
            **objectives.marker_features(self.sentence_objective, len(self))}


def gather_rows(window: Window, spans: np.ndarray, seq_len: int, tokenizer
                ) -> tuple[np.ndarray, np.ndarray]:
  """[N, 4] (A offset, A length, B offset, B length) -> `[CLS] A [SEP] B [SEP]` rows [N, S]
  zero-padded, and their lengths; one vectorised gather from the window's flat tokens."""
  a_start, len_a, b_start, len_b = (spans[:, k:k + 1] for k in range(4))
  col = np.arange(seq_len)
  in_a = (col >= 1) & (col <= len_a)
  in_b = (col >= len_a + 2) & (col < len_a + 2 + len_b)
  index = np.where(in_a, a_start + col - 1, np.where(in_b, b_start + col - len_a - 2, 0))
  ids = np.where(in_a | in_b, window.tokens[index], 0).astype(np.int32)
  ids[:, 0] = tokenizer.cls_id
  rows = np.arange(len(spans))
  ids[rows, len_a[:, 0] + 1] = tokenizer.sep_id
  ids[rows, (len_a + len_b)[:, 0] + 2] = tokenizer.sep_id
  return ids, (len_a + len_b + 3)[:, 0]


def create_block(documents: Sequence[Sequence[Sequence[int]]], cfg: MaskingConfig, tokenizer,
                 seed: int, dupe_factor: int = 1, chunk_rows: int = 4096,
                 sentence_objective: str = 'nsp') -> Block:
  """The reference's main loop over documents (shuffle, dupe passes of pairs, shuffle), with
  pairs kept as spans and masked `chunk_rows` at a time (bounded temporaries); or the rows of
  another sentence objective (objectives.py). Deterministic for `seed`."""
  window = Window(documents)
  if objectives.check_name(sentence_objective, 'sentence objective') == 'sop':
    return sop_block(window, cfg, tokenizer, seed, dupe_factor, chunk_rows)
  if sentence_objective == 'none':
    return full_sentence_block(window, cfg, tokenizer, seed, dupe_factor, chunk_rows)
  rng = random.Random(seed)
  order = list(range(len(window)))
  rng.shuffle(order)
  spans, random_next, truncated = [], [], []
  for _ in range(dupe_factor):
    for position in range(len(order)):
      for a_start, len_a, b_start, len_b, is_random_next, was_truncated in pair_spans(
          window, order, position, cfg, rng, exact=False):
        spans.append((a_start, len_a, b_start, len_b))
        random_next.append(is_random_next)
        truncated.append(was_truncated)
  return block_from_spans(window, spans, random_next, truncated, cfg, tokenizer,
                          np.random.default_rng(seed), chunk_rows)


def block_from_spans(window: Window, spans, labels, truncated, cfg: MaskingConfig, tokenizer,
                     np_rng: np.random.Generator, chunk_rows: int = 4096,
                     sentence_objective: str = 'nsp') -> Block:
  """(A offset, A length, B offset, B length) pairs -> shuffled, masked `[CLS] A [SEP] B [SEP]`
  rows, `chunk_rows` at a time (bounded temporaries); NSP and SOP pairs alike."""
  perm = np_rng.permutation(len(spans))
  spans = np.asarray(spans, np.int64).reshape(-1, 4)[perm]
  chunks = []
  for start in range(0, len(spans), chunk_rows):
    part = spans[start:start + chunk_rows]
    ids, lengths = gather_rows(window, part, cfg.max_seq_length, tokenizer)
    chunks.append(mask_block(ids, lengths, part[:, 1], cfg, tokenizer, np_rng))
  return Block(MaskedBlock.concatenate(chunks, cfg),
               np.asarray(labels, bool)[perm], np.asarray(truncated, bool)[perm],
               sentence_objective)


def block_from_instances(instances, cfg: MaskingConfig) -> Block:
  """Instances masked one by one (`instances.create_instances`) as a Block."""
  s, p = cfg.max_seq_length, cfg.max_predictions_per_seq
  ids, lengths = pad_block([i.tokens for i in instances], s)
  segment_ids, _ = pad_block([i.segment_ids for i in instances], s)
  positions, num_masked = pad_block([i.masked_positions for i in instances], p)
  labels, _ = pad_block([i.masked_labels for i in instances], p)
  replacements = tuple(int(x) for x in np.sum([i.replacements for i in instances], axis=0)) \
      if instances else (0, 0, 0)
  masked = MaskedBlock(ids, lengths, segment_ids, positions, labels, num_masked, replacements)
  return Block(masked, np.array([i.is_random_next for i in instances], bool),
               np.array([i.truncated for i in instances], bool))


def sop_block(window: Window, cfg: MaskingConfig, tokenizer, seed: int, dupe_factor: int,
              chunk_rows: int = 4096) -> Block:
  """ALBERT's SOP pairs (`instances.sop_spans`) of every document, dupe_factor passes."""
  rng = random.Random(seed)
  spans, swapped, truncated = [], [], []
  for _ in range(dupe_factor):
    for doc in range(len(window)):
      for a_start, len_a, b_start, len_b, was_swapped, was_truncated in sop_spans(
          window, doc, cfg, rng):
        spans.append((a_start, len_a, b_start, len_b))
        swapped.append(was_swapped)
        truncated.append(was_truncated)
  return block_from_spans(window, spans, swapped, truncated, cfg, tokenizer,
                          np.random.default_rng(seed), chunk_rows, 'sop')


def full_sentence_block(window: Window, cfg: MaskingConfig, tokenizer, seed: int,
                        dupe_factor: int, chunk_rows: int = 4096) -> Block:
  """RoBERTa's FULL-SENTENCES rows (`instances.full_sentence_rows`), masked; each dupe pass
  reshuffles the documents so that passes differ in where rows start, not only in masks."""
  rng = random.Random(seed)
  orders = []
  for _ in range(dupe_factor):
    order = list(range(len(window)))
    rng.shuffle(order)
    orders.append(order)
  built = full_sentence_rows(window, orders, cfg.max_seq_length, tokenizer.cls_id,
                             tokenizer.sep_id)
  np_rng = np.random.default_rng(seed)
  perm = np_rng.permutation(len(built.rows))
  chunks = []
  for lo in range(0, len(perm), chunk_rows):
    part = [built.rows[r] for r in perm[lo:lo + chunk_rows]]
    lengths = np.fromiter(map(len, part), np.int64, len(part))
    ids = np.zeros((len(part), cfg.max_seq_length), np.int32)
    ids[np.arange(cfg.max_seq_length) < lengths[:, None]] = np.concatenate(part)
    # num_a = length - 2: the whole row is "segment A", so every segment id is 0.
    chunks.append(mask_block(ids, lengths, lengths - 2, cfg, tokenizer, np_rng))
  return Block(MaskedBlock.concatenate(chunks, cfg), np.zeros(len(perm), bool),
               np.asarray(built.cut, bool)[perm], 'none',
               np.asarray(built.documents, np.int64)[perm])
