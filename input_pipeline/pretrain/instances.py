"""NSP sentence pairs and MLM masking with google-research/bert's exact semantics.

`pair_spans` (sentence pairs) and `mask_tokens` (masking) follow the reference's
`create_pretraining_data.py` step for step and draw from a `random.Random` in the same order:
target length with `short_seq_prob`, segment A from a random number of sentence chunks, B the
actual continuation or (50%, or always for a one-chunk document) text from another document
with the unused chunks put back, truncation of the longer segment from a random end, at most
`max_predictions_per_seq` of round(15%) positions masked, 80% [MASK] / 10% random / 10% kept,
never [CLS]/[SEP], whole-word masking optional. Tokens are ids, not strings.

`create_instances` interleaves them as the reference does and reproduces its random stream;
data creation by default pairs with `pair_spans` (O(1) truncation) and masks whole blocks at
once with `masking.mask_block` (same rules, numpy random stream, far faster).

`sop_spans` (ALBERT's sentence order) and `full_sentence_rows` (RoBERTa's FULL-SENTENCES)
are the other two sentence objectives, described in objectives.py.

One documented choice: by default random replacements come from `tokenizer.replacement_ids`
(real tokens, no specials or [unused]); the reference draws from the whole vocabulary, which
`replace_from_full_vocab=True` restores (and with it the reference's exact random stream).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterator, Sequence

import numpy as np



@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  do_whole_word_mask: bool = False
  # True draws random replacements from the whole vocabulary, [unused] included, exactly as
  # the reference does (and so reproduces its records); False uses real tokens only.
  replace_from_full_vocab: bool = False


@dataclasses.dataclass
class Instance:
  tokens: list[int]  # after masking, [CLS] A [SEP] B [SEP], unpadded
  segment_ids: list[int]
  is_random_next: bool
  masked_positions: list[int]
  masked_labels: list[int]
  truncated: bool = False
  replacements: tuple[int, int, int] = (0, 0, 0)  # [MASK], random, kept


@dataclasses.dataclass
class InstanceStats:
  instances: int = 0
  tokens: int = 0
  masked: int = 0
  mask_token: int = 0
  random_token: int = 0
  kept_token: int = 0
  random_next: int = 0  # NSP random next, or SOP swapped
  truncated: int = 0
  documents: int = 0  # full-sentence rows: documents summed over rows
  crossing_rows: int = 0  # full-sentence rows that span two documents or more

  def add_block(self, block) -> None:
    """Totals of a `masking.Block`, vectorised."""
    m = block.masked
    if block.documents is not None:
      self.documents += int(block.documents.sum())
      self.crossing_rows += int((block.documents > 1).sum())
    self.instances += len(block)
    self.tokens += int(m.lengths.sum())
    self.masked += int(m.num_masked.sum())
    self.mask_token += m.replacements[0]
    self.random_token += m.replacements[1]
    self.kept_token += m.replacements[2]
    self.random_next += int(block.is_random_next.sum())
    self.truncated += int(block.truncated.sum())

  def merge(self, other: 'InstanceStats') -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def truncation(len_a: int, len_b: int, max_num_tokens: int, rng: random.Random,
               exact: bool) -> tuple[int, int, int, int]:
  """The reference's truncate_seq_pair on lengths: trim the longer segment (B on a tie) from a
  random end, one token at a time, until the pair fits.

  Returns tokens removed from (front of A, back of A, front of B, back of B). `exact` draws
  one `rng.random()` per token as the reference does (its random stream); otherwise the same
  distribution in O(1): the trimmed lengths are determined by the rule alone, and the number
  of front removals out of r is Binomial(r, 1/2), a popcount of r random bits.
  """
  if exact:
    cuts = [0, 0, 0, 0]
    while len_a + len_b > max_num_tokens:
      side = 0 if len_a > len_b else 2
      if side == 0:
        len_a -= 1
      else:
        len_b -= 1
      cuts[side + (0 if rng.random() < 0.5 else 1)] += 1
    return tuple(cuts)
  excess = len_a + len_b - max_num_tokens
  if excess <= 0:
    return 0, 0, 0, 0
  gap = abs(len_a - len_b)
  first = min(excess, gap)  # from the longer one until they are equal
  rest = excess - first  # then alternately, B first
  cut_a = (first if len_a > len_b else 0) + rest // 2
  cut_b = (first if len_b >= len_a else 0) + rest - rest // 2
  front_a = rng.getrandbits(cut_a).bit_count() if cut_a else 0
  front_b = rng.getrandbits(cut_b).bit_count() if cut_b else 0
  return front_a, cut_a - front_a, front_b, cut_b - front_b


def mask_tokens(tokens: list[int], cfg: MaskingConfig, tokenizer, rng: random.Random):
  """The reference's create_masked_lm_predictions on ids.

  Returns (output tokens, sorted positions, labels, (n_mask, n_random, n_kept)).
  """
  cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
  word_start = tokenizer.is_word_start(tokens) if cfg.do_whole_word_mask else None
  cand_indexes: list[list[int]] = []
  for i, token in enumerate(tokens):
    if token == cls_id or token == sep_id:
      continue
    if (word_start is not None and cand_indexes and not word_start[i]
        and cand_indexes[-1][-1] == i - 1):  # never across [CLS] / [SEP]
      cand_indexes[-1].append(i)
    else:
      cand_indexes.append([i])
  rng.shuffle(cand_indexes)
  output = list(tokens)
  num_to_predict = min(cfg.max_predictions_per_seq,
                       max(1, int(round(len(tokens) * cfg.masked_lm_prob))))
  replacement_ids = (range(tokenizer.vocab_size) if cfg.replace_from_full_vocab
                     else tokenizer.replacement_ids)
  masked: list[tuple[int, int]] = []
  covered: set[int] = set()
  counts = [0, 0, 0]
  for index_set in cand_indexes:
    if len(masked) >= num_to_predict:
      break
    if len(masked) + len(index_set) > num_to_predict:
      continue
    if any(i in covered for i in index_set):
      continue
    for index in index_set:
      covered.add(index)
      if rng.random() < 0.8:
        output[index] = tokenizer.mask_id
        counts[0] += 1
      elif rng.random() < 0.5:
        counts[2] += 1  # kept as is
      else:
        output[index] = int(replacement_ids[rng.randint(0, len(replacement_ids) - 1)])
        counts[1] += 1
      masked.append((index, tokens[index]))
  masked.sort()
  return output, [p for p, _ in masked], [l for _, l in masked], tuple(counts)


class Window:
  """Tokenized documents as one flat token array; sentences are (offset, length) spans.

  Pairing only needs lengths, and every A or B segment (truncated or not) is a contiguous
  run of one document's tokens, so a pair is four integers rather than two token lists.
  """

  def __init__(self, documents: Sequence[Sequence[Sequence[int]]]):
    documents = [[s for s in doc if len(s)] for doc in documents]
    documents = [d for d in documents if d]
    lengths = [[len(s) for s in doc] for doc in documents]
    self.tokens = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(documents)), np.int32,
        sum(map(sum, lengths)))
    self.doc_start: list[int] = []  # flat offset of each document
    self.cum: list[list[int]] = []  # per document: token offset of each sentence, then its end
    offset = 0
    for doc in lengths:
      self.doc_start.append(offset)
      self.cum.append(list(itertools.accumulate(doc, initial=0)))
      offset += self.cum[-1][-1]

  def __len__(self) -> int:
    return len(self.cum)


def pair_spans(window: Window, order: Sequence[int], position: int, cfg: MaskingConfig,
               rng: random.Random, exact: bool
               ) -> Iterator[tuple[int, int, int, int, bool, bool]]:
  """The reference's create_instances_from_document for the document at `order[position]`
  (`order` is the shuffled document list): (A offset, A length, B offset, B length,
  is_random_next, truncated) per pair. A generator, so that a caller masking each pair before
  asking for the next draws from `rng` in exactly the reference's order.
  """
  doc = order[position]
  cum, base = window.cum[doc], window.doc_start[doc]
  num_sentences = len(cum) - 1
  max_num_tokens = cfg.max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < cfg.short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)

  chunk_start = 0  # current_chunk = sentences [chunk_start, i]
  i = 0
  while i < num_sentences:
    if i == num_sentences - 1 or cum[i + 1] - cum[chunk_start] >= target_seq_length:
      chunk_size = i + 1 - chunk_start
      a_end = 1
      if chunk_size >= 2:
        a_end = rng.randint(1, chunk_size - 1)
      a_start, len_a = base + cum[chunk_start], cum[chunk_start + a_end] - cum[chunk_start]
      if chunk_size == 1 or rng.random() < 0.5:
        is_random_next = True
        target_b_length = target_seq_length - len_a
        for _ in range(10):
          random_position = rng.randint(0, len(order) - 1)
          if random_position != position:
            break
        other = order[random_position]
        other_cum = window.cum[other]
        random_start = rng.randint(0, len(other_cum) - 2)
        end = random_start + 1  # sentences up to the first that reaches target_b_length
        last = len(other_cum) - 1
        while end < last and other_cum[end] - other_cum[random_start] < target_b_length:
          end += 1
        b_start = window.doc_start[other] + other_cum[random_start]
        len_b = other_cum[end] - other_cum[random_start]
        i -= chunk_size - a_end  # put the unused segments back
      else:
        is_random_next = False
        b_start = base + cum[chunk_start + a_end]
        len_b = cum[i + 1] - cum[chunk_start + a_end]
      front_a, back_a, front_b, back_b = truncation(len_a, len_b, max_num_tokens, rng, exact)
      len_a -= front_a + back_a
      len_b -= front_b + back_b
      if len_a and len_b:
        yield (a_start + front_a, len_a, b_start + front_b, len_b, is_random_next,
               front_a + back_a + front_b + back_b > 0)
      chunk_start = i + 1
    i += 1


def create_instances_from_document(window: Window, order: Sequence[int], position: int,
                                   cfg: MaskingConfig, tokenizer, rng: random.Random
                                   ) -> list[Instance]:
  """Pairs masked one by one with `mask_tokens`: the reference's exact random stream."""
  instances = []
  flat = window.tokens
  for a_start, len_a, b_start, len_b, is_random_next, truncated in pair_spans(
      window, order, position, cfg, rng, exact=True):
    tokens = ([tokenizer.cls_id] + flat[a_start:a_start + len_a].tolist() + [tokenizer.sep_id]
              + flat[b_start:b_start + len_b].tolist() + [tokenizer.sep_id])
    segment_ids = [0] * (len_a + 2) + [1] * (len_b + 1)
    output, positions, labels, counts = mask_tokens(tokens, cfg, tokenizer, rng)
    instances.append(Instance(output, segment_ids, is_random_next, positions, labels,
                              truncated, counts))
  return instances


def create_instances(documents: list[list[list[int]]], cfg: MaskingConfig, tokenizer,
                     rng: random.Random, dupe_factor: int = 1) -> list[Instance]:
  """The reference's main loop over a set of documents: shuffle, dupe, create, shuffle."""
  window = Window(documents)
  order = list(range(len(window)))
  rng.shuffle(order)
  instances: list[Instance] = []
  for _ in range(dupe_factor):
    for position in range(len(order)):
      instances.extend(create_instances_from_document(window, order, position, cfg, tokenizer,
                                                      rng))
  rng.shuffle(instances)
  return instances


def sop_spans(window: Window, doc: int, cfg: MaskingConfig, rng: random.Random
              ) -> Iterator[tuple[int, int, int, int, bool, bool]]:
  """ALBERT's sentence-order pairs of one document (objectives.py): (A offset,
  A length, B offset, B length, swapped, truncated). Chunks are cut as `pair_spans` cuts
  them, B is always the actual continuation, then a coin flip swaps A and B."""
  cum, base = window.cum[doc], window.doc_start[doc]
  max_num_tokens = cfg.max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < cfg.short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  num_sentences = len(cum) - 1
  first = 0  # the current chunk is sentences [first, i]
  for i in range(num_sentences):
    if i < num_sentences - 1 and cum[i + 1] - cum[first] < target_seq_length:
      continue
    start, end, chunk_size = cum[first], cum[i + 1], i + 1 - first
    if chunk_size >= 2:
      split = cum[first + rng.randint(1, chunk_size - 1)]
    elif end - start >= 2:  # one sentence: cut it (ALBERT would take another document)
      split = rng.randint(start + 1, end - 1)
    else:
      split = None  # a one-token chunk: no two segments
    first = i + 1
    if split is None:
      continue
    a_start, len_a, b_start, len_b = base + start, split - start, base + split, end - split
    swapped = rng.random() < 0.5
    if swapped:
      a_start, len_a, b_start, len_b = b_start, len_b, a_start, len_a
    front_a, back_a, front_b, back_b = truncation(len_a, len_b, max_num_tokens, rng,
                                                  exact=False)
    len_a -= front_a + back_a
    len_b -= front_b + back_b
    if len_a and len_b:
      yield (a_start + front_a, len_a, b_start + front_b, len_b, swapped,
             front_a + back_a + front_b + back_b > 0)


class FullSentenceRows:
  """RoBERTa's FULL-SENTENCES rows (objectives.py) as they are built:
  `[CLS] sentences [SEP]`, whole sentences while they fit, a [SEP] between documents."""

  def __init__(self, tokens: np.ndarray, max_seq_length: int, cls_id: int, sep_id: int):
    self.tokens, self.capacity = tokens, max_seq_length - 2
    self.cls, self.sep = np.array([cls_id], np.int32), np.array([sep_id], np.int32)
    self.rows: list[np.ndarray] = []
    self.documents: list[int] = []  # documents each row's text comes from
    self.cut: list[bool] = []  # the row holds a piece of a sentence longer than a row
    self._reset()

  def _reset(self):
    self.pieces, self.used, self.row_docs, self.last_doc, self.row_cut = [], 0, 0, -1, False

  def close(self):
    if self.pieces:
      self.rows.append(np.concatenate([self.cls, *self.pieces, self.sep]))
      self.documents.append(self.row_docs)
      self.cut.append(self.row_cut)
    self._reset()

  def room(self, doc: int) -> int:
    """Tokens of document occurrence `doc` that still fit in the current row."""
    return self.capacity - self.used - (bool(self.pieces) and doc != self.last_doc)

  def add(self, doc: int, start: int, length: int, cut: bool = False):
    """Tokens [start, start + length) of document occurrence `doc`: into this row if they
    fit, else into a new one."""
    separator = bool(self.pieces) and doc != self.last_doc
    if self.used + separator + length > self.capacity:
      self.close()
      separator = False
    if separator:
      self.pieces.append(self.sep)
    self.pieces.append(self.tokens[start:start + length])
    self.used += separator + length
    self.row_docs += doc != self.last_doc
    self.last_doc = doc
    self.row_cut |= cut


def full_sentence_rows(window: Window, orders: Sequence[Sequence[int]], max_seq_length: int,
                       cls_id: int, sep_id: int) -> FullSentenceRows:
  """Rows over the documents in `orders` (one document order per dupe pass) as one stream.
  A sentence longer than a row will be cut anyway, so it first fills the current row's room,
  then whole rows; its rows count as truncated."""
  rows = FullSentenceRows(window.tokens, max_seq_length, cls_id, sep_id)
  occurrence = 0
  for order in orders:
    for doc in order:
      cum, base = window.cum[doc], window.doc_start[doc]
      for k in range(len(cum) - 1):
        start, length = base + cum[k], cum[k + 1] - cum[k]
        if length <= rows.capacity:
          rows.add(occurrence, start, length)
          continue
        while length:
          room = rows.room(occurrence)
          take = min(length, room if room > 0 else rows.capacity)
          rows.add(occurrence, start, take, cut=True)
          start, length = start + take, length - take
      occurrence += 1
  rows.close()
  return rows
