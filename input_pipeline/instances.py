"""NSP sentence pairs and MLM masking with google-research/bert's exact semantics.

`create_instances_from_document` and `mask_tokens` follow the reference's
`create_pretraining_data.py` step for step and draw from a `random.Random` in the same order:
target length with `short_seq_prob`, segment A from a random number of sentence chunks, B the
actual continuation or (50%, or always for a one-chunk document) text from another document
with the unused chunks put back, truncation of the longer segment from a random end, at most
`max_predictions_per_seq` of round(15%) positions masked, 80% [MASK] / 10% random / 10% kept,
never [CLS]/[SEP], whole-word masking optional. Tokens are ids, not strings.

One documented choice: by default random replacements come from `tokenizer.replacement_ids`
(real tokens, no specials or [unused]); the reference draws from the whole vocabulary, which
`replace_from_full_vocab=True` restores (and with it the reference's exact random stream).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

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
  random_next: int = 0
  truncated: int = 0
  candidates: int = 0

  def add(self, inst: Instance) -> None:
    self.instances += 1
    self.tokens += len(inst.tokens)
    self.candidates += len(inst.tokens) - 3
    self.masked += len(inst.masked_positions)
    m, r, k = inst.replacements
    self.mask_token += m
    self.random_token += r
    self.kept_token += k
    self.random_next += inst.is_random_next
    self.truncated += inst.truncated

  def merge(self, other: 'InstanceStats') -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: random.Random) -> bool:
  """Trim the longer segment from a random end until the pair fits; True if anything went."""
  truncated = False
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    assert len(trunc) >= 1
    if rng.random() < 0.5:
      del trunc[0]
    else:
      trunc.pop()
    truncated = True
  return truncated


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
    if word_start is not None and cand_indexes and not word_start[i]:
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


def create_instances_from_document(all_documents: Sequence[Sequence[list[int]]],
                                   document_index: int, cfg: MaskingConfig, tokenizer,
                                   rng: random.Random) -> list[Instance]:
  document = all_documents[document_index]
  max_num_tokens = cfg.max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < cfg.short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)

  instances = []
  current_chunk: list[list[int]] = []
  current_length = 0
  i = 0
  while i < len(document):
    segment = document[i]
    current_chunk.append(segment)
    current_length += len(segment)
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        a_end = 1
        if len(current_chunk) >= 2:
          a_end = rng.randint(1, len(current_chunk) - 1)
        tokens_a = [t for chunk in current_chunk[:a_end] for t in chunk]
        tokens_b: list[int] = []
        is_random_next = False
        if len(current_chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          for _ in range(10):
            random_document_index = rng.randint(0, len(all_documents) - 1)
            if random_document_index != document_index:
              break
          random_document = all_documents[random_document_index]
          random_start = rng.randint(0, len(random_document) - 1)
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          i -= len(current_chunk) - a_end  # put the unused segments back
        else:
          for j in range(a_end, len(current_chunk)):
            tokens_b.extend(current_chunk[j])
        truncated = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        if tokens_a and tokens_b:
          tokens = [tokenizer.cls_id] + tokens_a + [tokenizer.sep_id] + tokens_b + [tokenizer.sep_id]
          segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
          output, positions, labels, counts = mask_tokens(tokens, cfg, tokenizer, rng)
          instances.append(Instance(output, segment_ids, is_random_next, positions, labels,
                                    truncated, counts))
      current_chunk = []
      current_length = 0
    i += 1
  return instances


def create_instances(documents: list[list[list[int]]], cfg: MaskingConfig, tokenizer,
                     rng: random.Random, dupe_factor: int = 1) -> list[Instance]:
  """The reference's main loop over a set of documents: shuffle, dupe, create, shuffle."""
  documents = [d for d in documents if d]
  rng.shuffle(documents)
  instances: list[Instance] = []
  for _ in range(dupe_factor):
    for index in range(len(documents)):
      instances.extend(create_instances_from_document(documents, index, cfg, tokenizer, rng))
  rng.shuffle(instances)
  return instances


def to_features(inst: Instance, cfg: MaskingConfig) -> dict[str, np.ndarray]:
  """Padded arrays with the reference's feature names (DESIGN.md)."""
  s, p = cfg.max_seq_length, cfg.max_predictions_per_seq
  n, m = len(inst.tokens), len(inst.masked_positions)
  f = {
      'input_ids': np.zeros(s, np.int64), 'input_mask': np.zeros(s, np.int64),
      'segment_ids': np.zeros(s, np.int64), 'masked_lm_positions': np.zeros(p, np.int64),
      'masked_lm_ids': np.zeros(p, np.int64), 'masked_lm_weights': np.zeros(p, np.float32),
      'next_sentence_labels': np.array([int(inst.is_random_next)], np.int64),
  }
  f['input_ids'][:n] = inst.tokens
  f['input_mask'][:n] = 1
  f['segment_ids'][:n] = inst.segment_ids
  f['masked_lm_positions'][:m] = inst.masked_positions
  f['masked_lm_ids'][:m] = inst.masked_labels
  f['masked_lm_weights'][:m] = 1.0
  return f
