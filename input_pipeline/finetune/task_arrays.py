"""Examples -> padded numpy arrays for fine-tuning, with our tokenizer.

Sentence (pair) classification/regression follows google-research/bert `run_classifier.py`
`convert_single_example`: `[CLS] a [SEP] b [SEP]` (RoBERTa's tokenizers: `<s> a </s></s> b
</s>`, as their own pair template), segment ids 0 then 1, the pair trimmed one
token at a time from the end of the longer side (`_truncate_seq_pair`; B on ties), a single
sentence cut to max_seq_length - 2, padding with the tokenizer's [PAD] id.

Token classification labels the first sub-word of every word, as HuggingFace's `run_ner.py`
with `label_all_tokens=False`: later sub-words, [CLS], [SEP] and padding get label -100 and
weight 0. The words are encoded as run_ner.py's `tokenizer(words, is_split_into_words=True)`
with `add_prefix_space=True` encodes them (`Tokenizer.encode_words`: a byte-level BPE word
after its space, as mid-sentence). `word_ids` records which word every position belongs to, so
`tags_from_predictions` maps per-position predictions back to one tag per word.

Multiple choice pairs the context with each choice (`[CLS] context [SEP] choice_i [SEP]`)
into [N, num_choices, max_seq_length] arrays, as HuggingFace's `run_swag.py` tokenizes them:
its fast tokenizer's `truncation=True` (longest-first, `truncate_longest_first`), which differs
from `_truncate_seq_pair` only in which side keeps the odd token when both are cut;
`labels` [N] is the correct choice's number.

Array names: input_ids, input_mask, segment_ids (the reference's), labels (int32 class ids,
or float32 targets for regression; -1 / NaN for unlabelled test rows) and label_weights
(1.0 where a label exists).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from input_pipeline.finetune.records import Example, TaggedSentence
from input_pipeline.finetune.swag import ChoiceExample
from input_pipeline.tokenizer import Tokenizer

IGNORE_INDEX = -100


def truncate_seq_pair(len_a: int, len_b: int, max_length: int) -> tuple[int, int]:
  """The lengths `_truncate_seq_pair` leaves: pop from the longer (B on ties) until they fit."""
  while len_a + len_b > max_length:
    if len_a > len_b:
      len_a -= 1
    else:
      len_b -= 1
  return len_a, len_b


def truncate_longest_first(len_a: int, len_b: int, max_length: int) -> tuple[int, int]:
  """The lengths HuggingFace tokenizers' `LongestFirst` pair truncation leaves
  (tokenizers/src/utils/truncation.rs, "ported from the legacy truncation code"): the shorter
  side is kept whole if the longer can take the rest, else both are cut to half, the longer
  (the second on ties) keeping the odd token."""
  if len_a + len_b <= max_length:
    return len_a, len_b
  swap = len_a > len_b
  n1, n2 = (len_b, len_a) if swap else (len_a, len_b)
  n2 = n1 if n1 > max_length else max(n1, max_length - n1)
  if n1 + n2 > max_length:
    n1 = max_length // 2
    n2 = n1 + max_length % 2
  return (n2, n1) if swap else (n1, n2)


def _pack_pair(tokenizer: Tokenizer, a: list[int], b: list[int] | None, max_seq_length: int,
               truncate=truncate_seq_pair) -> tuple[list[int], list[int]]:
  """(ids, segment ids) of `[CLS] a [SEP] (b [SEP])`, the pair cut by `truncate`, unpadded;
  between the texts the tokenizer's own separator (RoBERTa's `</s></s>`: `pair_separator`)."""
  cls, sep = tokenizer.cls_id, tokenizer.sep_id
  if b is None:
    a = a[:max_seq_length - 2]
    return [cls] + a + [sep], [0] * (len(a) + 2)
  between = list(tokenizer.pair_separator)
  if max_seq_length < 2 + len(between):
    raise ValueError(f'max_seq_length={max_seq_length}: a pair needs room for {2 + len(between)} '
                     'special tokens')
  la, lb = truncate(len(a), len(b), max_seq_length - 2 - len(between))
  ids = [cls] + a[:la] + between + b[:lb] + [sep]
  return ids, [0] * (la + 1 + len(between)) + [1] * (lb + 1)


def classification_features(examples: Sequence[Example], tokenizer: Tokenizer,
                            max_seq_length: int, labels: Sequence[str] | None
                            ) -> dict[str, np.ndarray]:
  """Arrays for sentence (pair) classification; `labels=None` or () means regression.

  A label outside `labels` is a ValueError naming the example (readers already check theirs;
  this catches a head's label list that differs from the data's).
  """
  if max_seq_length < 3:
    raise ValueError(f'max_seq_length={max_seq_length}: need room for [CLS] and [SEP]')
  n = len(examples)
  texts_a = tokenizer.encode_batch([e.text_a for e in examples])
  pairs = [i for i, e in enumerate(examples) if e.text_b is not None]
  texts_b = dict(zip(pairs, tokenizer.encode_batch([examples[i].text_b for i in pairs])))
  out = {k: np.zeros((n, max_seq_length), np.int32)
         for k in ('input_ids', 'input_mask', 'segment_ids')}
  out['input_ids'][:] = tokenizer.pad_id
  for i in range(n):
    ids, segments = _pack_pair(tokenizer, texts_a[i], texts_b.get(i), max_seq_length)
    out['input_ids'][i, :len(ids)] = ids
    out['input_mask'][i, :len(ids)] = 1
    out['segment_ids'][i, :len(ids)] = segments
  out['labels'], out['label_weights'] = _labels(examples, labels)
  return out


def multiple_choice_features(examples: Sequence[ChoiceExample], tokenizer: Tokenizer,
                             max_seq_length: int) -> dict[str, np.ndarray]:
  """Arrays [N, num_choices, max_seq_length] for multiple choice; labels [N] (-1 unlabelled)."""
  if max_seq_length < 3:
    raise ValueError(f'max_seq_length={max_seq_length}: need room for [CLS] and two [SEP]')
  n = len(examples)
  choices = len(examples[0].choices) if examples else 0
  for e in examples:
    if len(e.choices) != choices:
      raise ValueError(f'example {e.guid}: {len(e.choices)} choices, but {examples[0].guid} has '
                       f'{choices}; every example of a split needs the same number')
  contexts = tokenizer.encode_batch([e.context for e in examples])
  seconds = tokenizer.encode_batch([c for e in examples for c in e.choices])
  out = {k: np.zeros((n, choices, max_seq_length), np.int32)
         for k in ('input_ids', 'input_mask', 'segment_ids')}
  out['input_ids'][:] = tokenizer.pad_id
  for i in range(n):
    for j in range(choices):
      ids, segments = _pack_pair(tokenizer, contexts[i], seconds[i * choices + j],
                                 max_seq_length, truncate_longest_first)
      out['input_ids'][i, j, :len(ids)] = ids
      out['input_mask'][i, j, :len(ids)] = 1
      out['segment_ids'][i, j, :len(ids)] = segments
  out['labels'] = np.array([-1 if e.label is None else e.label for e in examples], np.int32)
  out['label_weights'] = np.array([e.label is not None for e in examples], np.float32)
  return out


def _labels(examples: Sequence[Example], labels: Sequence[str] | None
            ) -> tuple[np.ndarray, np.ndarray]:
  weights = np.array([e.label is not None for e in examples], np.float32)
  if not labels:
    return np.array([np.nan if e.label is None else _target(e) for e in examples],
                    np.float32), weights
  index = {label: i for i, label in enumerate(labels)}
  ids = np.full(len(examples), -1, np.int32)
  for i, e in enumerate(examples):
    if e.label is not None:
      if e.label not in index:
        raise ValueError(f'example {e.guid}: label {e.label!r} is not in the label list '
                         f'{list(labels)}')
      ids[i] = index[e.label]
  return ids, weights


def _target(e: Example) -> float:
  try:
    return float(e.label)
  except ValueError:
    raise ValueError(f'example {e.guid}: label {e.label!r} is not a number; pass the task\'s '
                     'label list for classification (labels=None means regression)') from None


def tagging_features(sentences: Sequence[TaggedSentence], tokenizer: Tokenizer,
                     max_seq_length: int, labels: Sequence[str]) -> dict[str, np.ndarray]:
  """Arrays for token classification, first sub-word labelled.

  Adds `word_ids` [N, max_seq_length]: the word index of every sub-word position, -1 for
  [CLS], [SEP] and padding. Words past max_seq_length - 2 sub-words are cut (and get the
  default tag back from `tags_from_predictions`); so do words the tokenizer turns into no
  tokens at all (a lone control character).
  """
  index = {label: i for i, label in enumerate(labels)}
  n = len(sentences)
  out = {k: np.zeros((n, max_seq_length), np.int32)
         for k in ('input_ids', 'input_mask', 'segment_ids')}
  out['input_ids'][:] = tokenizer.pad_id
  out['labels'] = np.full((n, max_seq_length), IGNORE_INDEX, np.int32)
  out['label_weights'] = np.zeros((n, max_seq_length), np.float32)
  out['word_ids'] = np.full((n, max_seq_length), -1, np.int32)
  for row, sentence in enumerate(sentences):
    pieces = tokenizer.encode_words(list(sentence.words))
    word_ids = [w for w, p in enumerate(pieces) for _ in p][:max_seq_length - 2]
    ids = [t for p in pieces for t in p][:max_seq_length - 2]
    length = len(ids) + 2
    out['input_ids'][row, :length] = [tokenizer.cls_id] + ids + [tokenizer.sep_id]
    out['input_mask'][row, :length] = 1
    out['word_ids'][row, 1:length - 1] = word_ids
    if sentence.tags is not None:
      _tag_row(out, row, sentence, word_ids, index, labels)
  return out


def _tag_row(out, row, sentence, word_ids, index, labels) -> None:
  if len(sentence.tags) != len(sentence.words):
    raise ValueError(f'sentence {row}: {len(sentence.words)} words but {len(sentence.tags)} '
                     'tags')
  previous = -1
  for position, word in enumerate(word_ids, start=1):
    if word != previous:  # the first sub-word of `word`
      tag = sentence.tags[word]
      if tag not in index:
        raise ValueError(f'sentence {row}, word {word} ({sentence.words[word]!r}): tag '
                         f'{tag!r} is not in the label list {list(labels)}')
      out['labels'][row, position] = index[tag]
      out['label_weights'][row, position] = 1.0
    previous = word


def first_subword_mask(word_ids: np.ndarray) -> np.ndarray:
  """True where a position holds the first sub-word of a word."""
  word_ids = np.asarray(word_ids)
  before = np.pad(word_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
  return (word_ids >= 0) & (word_ids != before)


def tags_from_predictions(predictions: np.ndarray, word_ids: np.ndarray,
                          num_words: Sequence[int], labels: Sequence[str],
                          default: str = 'O') -> list[list[str]]:
  """One tag per word from per-position predictions (class ids [N, L] or logits [N, L, C]):
  each word takes its first sub-word's prediction; words with no position (cut by
  max_seq_length, or no tokens) take `default`."""
  predictions = np.asarray(predictions)
  if predictions.ndim == 3:
    predictions = predictions.argmax(-1)
  first = first_subword_mask(word_ids)
  out = []
  for row, count in enumerate(num_words):
    tags = [default] * count
    for position in np.nonzero(first[row])[0]:
      tags[word_ids[row, position]] = labels[int(predictions[row, position])]
    out.append(tags)
  return out
