"""SQuAD 1.1/2.0: reading and sliding-window features.

This is google-research/bert `run_squad.py` on our tokenizer interface: contexts split on
whitespace, each word tokenized on its own (tokenizers that give character offsets, the
`tokenizer.json` ones of RoBERTa, ModernBERT...: the whole context at once, answers located
and read back by characters as HF's `run_qa.py` does); windows of `max_seq_length` tokens
`[CLS] question [SEP] context-window [SEP]` every `doc_stride` context tokens; the answer span
narrowed to the tokenized answer (`_improve_answer_span`); each token scored only in the window
where it has the most context (`_check_is_max_context`); a window that does not contain the
answer, and an unanswerable question, point at [CLS] (position 0). Turning the model's
per-window logits back into answer texts (run_squad.py `write_predictions`) is
`bert_jax.finetune.squad_answers`; `gold_answers` are what those are scored against.

Positions are computed for every answerable example from its first answer (dev files list
several; the reference trains on files with one). An answer that cannot be aligned, because
its `answer_start` does not point at its text in the whitespace-split context (dropped from
training as the reference drops it) or because no window holds all its tokens (the reference
would train it as "no answer" in every window; we drop it), is counted in one summary line per
file, and a training file with more than `max_misaligned_fraction` of them is refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence

import numpy as np

from input_pipeline import fs

from input_pipeline.finetune.records import data_error, require_examples
from input_pipeline.tokenizer import Tokenizer

UNIQUE_ID_START = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class Answer:
  text: str
  start: int  # character offset in the context


@dataclasses.dataclass(frozen=True)
class SquadExample:
  """One question. `start_position`/`end_position` are word indices of the first answer
  (-1 when there is none); `recoverable` says the answer text is found in those words."""
  qas_id: str
  question_text: str
  context_text: str
  doc_tokens: tuple[str, ...]
  answers: tuple[Answer, ...]
  is_impossible: bool
  start_position: int = -1
  end_position: int = -1
  recoverable: bool = False


@dataclasses.dataclass
class SquadFeature:
  """One window of one example, padded to max_seq_length."""
  unique_id: int
  example_index: int
  doc_span_index: int
  input_ids: np.ndarray
  input_mask: np.ndarray
  segment_ids: np.ndarray
  token_to_orig_map: dict[int, int]  # window position -> word index in the context
  token_is_max_context: dict[int, bool]
  start_position: int
  end_position: int
  is_impossible: bool
  num_tokens: int  # before padding
  # window position -> [start, end) characters of the context, for tokenizers that give
  # offsets (`encode_with_offsets`); None for WordPiece and SentencePiece (word by word).
  token_to_chars: dict[int, tuple[int, int]] | None = None


def _is_whitespace(c: str) -> bool:
  return c in ' \t\r\n' or ord(c) == 0x202F


def split_context(context: str) -> tuple[list[str], list[int]]:
  """Whitespace words, and the word index of every character (the reference's split)."""
  words, char_to_word = [], []
  prev_is_whitespace = True
  for c in context:
    if _is_whitespace(c):
      prev_is_whitespace = True
    else:
      if prev_is_whitespace:
        words.append(c)
      else:
        words[-1] += c
      prev_is_whitespace = False
    char_to_word.append(len(words) - 1)
  return words, char_to_word


def make_example(qas_id: str, question: str, context: str, answers: Sequence[Answer],
                 is_impossible: bool, where: str) -> SquadExample:
  """A SquadExample with the first answer located in the words; `where` names it in errors."""
  words, char_to_word = split_context(context)
  for k, a in enumerate(answers):
    if not a.text or not 0 <= a.start <= len(context) - len(a.text):
      raise data_error(where, None, f'answers[{k}]', f'answer {a.text!r} at character '
                       f'{a.start} does not lie in the {len(context)}-character context')
  start = end = -1
  recoverable = False
  if answers and not is_impossible:
    first = answers[0]
    start = char_to_word[first.start]
    end = char_to_word[first.start + len(first.text) - 1]
    actual = ' '.join(words[start:end + 1])
    recoverable = actual.find(' '.join(first.text.split())) != -1
  return SquadExample(qas_id, question, context, tuple(words), tuple(answers), is_impossible,
                      start, end, recoverable)


def read_squad(path: str) -> list[SquadExample]:
  """Every question of a SQuAD 1.1 or 2.0 JSON file (`is_impossible` absent means False)."""
  try:
    data = json.loads(fs.read_text(path))
  except FileNotFoundError:
    raise FileNotFoundError(f'{path}: no such file') from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise data_error(path, getattr(e, 'lineno', None), None, f'not a SQuAD JSON file ({e})'
                     ) from None
  if not isinstance(data, dict) or not isinstance(data.get('data'), list):
    raise data_error(path, None, 'data', 'expected {"data": [articles]} (SQuAD JSON)')
  out = []
  for i, article in enumerate(data['data']):
    for j, paragraph in enumerate(_field(article, 'paragraphs', list, f'{path}: data[{i}]')):
      where = f'{path}: data[{i}].paragraphs[{j}]'
      context = _field(paragraph, 'context', str, where)
      for k, qa in enumerate(_field(paragraph, 'qas', list, where)):
        out.append(_qa_example(qa, context, f'{where}.qas[{k}]'))
  return require_examples(out, path)


def _qa_example(qa, context: str, where: str) -> SquadExample:
  answers = []
  for n, a in enumerate(_field(qa, 'answers', list, where)):
    text = _field(a, 'text', str, f'{where}.answers[{n}]')
    start = _field(a, 'answer_start', int, f'{where}.answers[{n}]')
    answers.append(Answer(text, start))
  impossible = qa.get('is_impossible', False)
  if not isinstance(impossible, bool):
    raise data_error(where, None, 'is_impossible', f'expected true/false, got {impossible!r}')
  return make_example(str(_field(qa, 'id', (str, int), where)),
                      _field(qa, 'question', str, where), context, answers, impossible, where)


def _field(obj, name: str, kind, where: str):
  if not isinstance(obj, dict) or name not in obj:
    raise data_error(where, None, name, 'missing (not SQuAD JSON?)')
  value = obj[name]
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    raise data_error(where, None, name, f'expected {getattr(kind, "__name__", kind)}, '
                     f'got {value!r}')
  return value


def read_tfds_squad(split: str, *, name: str = 'squad/v1.1', data_dir: str | None = None
                    ) -> list[SquadExample]:
  """The same examples from TFDS `squad/v1.1` or `squad/v2.0` (splits train, validation)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  ds = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
  out = []
  for n, ex in enumerate(tfds.as_numpy(ds)):
    answers = [Answer(t.decode('utf-8'), int(s))
               for t, s in zip(ex['answers']['text'], ex['answers']['answer_start'])]
    out.append(make_example(ex['id'].decode('utf-8'), ex['question'].decode('utf-8'),
                            ex['context'].decode('utf-8'), answers,
                            bool(ex.get('is_impossible', False)),
                            f'TFDS {name} {split} example {n}'))
  return require_examples(out, f'TFDS {name} split {split}')


# ----------------------------------------------------------------------------- features


@dataclasses.dataclass
class _Doc:
  """A tokenized context."""
  ids: list[int]  # all sub-tokens
  tok_to_orig: list[int]
  orig_to_tok: list[int]
  offsets: list[tuple[int, int]] | None = None  # each token's characters (`_tokenize_context`)


def _tokenize_doc(example: SquadExample, tokenizer: Tokenizer) -> _Doc:
  """Word by word, as the reference does (WordPiece, SentencePiece), or the whole context at
  once where the tokenizer gives offsets (`_tokenize_context`)."""
  if hasattr(tokenizer, 'encode_with_offsets'):
    return _tokenize_context(example.context_text, tokenizer)
  doc = _Doc([], [], [])
  for i, pieces in enumerate(tokenizer.encode_batch(list(example.doc_tokens))):
    doc.orig_to_tok.append(len(doc.ids))
    doc.ids.extend(pieces)
    doc.tok_to_orig.extend([i] * len(pieces))
  return doc


def _tokenize_context(context: str, tokenizer) -> _Doc:
  """The context as running text with each token's characters, as HF's `run_qa.py` tokenizes
  it: byte-level BPE marks a word's leading space ('Ġ'), so words encoded one by one would get
  ids the model never saw mid-sentence. Each token belongs to the word of its first
  non-space character (a token of spaces alone to the word before it)."""
  words, char_to_word = split_context(context)
  ids, offsets = tokenizer.encode_with_offsets(context)
  tok_to_orig = []
  for start, end in offsets:
    pos = start
    while pos < end - 1 and _is_whitespace(context[pos]):
      pos += 1
    word = max(char_to_word[min(pos, len(context) - 1)], 0)
    tok_to_orig.append(max(word, tok_to_orig[-1]) if tok_to_orig else word)
  orig_to_tok = np.searchsorted(tok_to_orig, np.arange(len(words)), 'left').tolist()
  return _Doc(ids, tok_to_orig, orig_to_tok, [tuple(o) for o in offsets])


def _improve_answer_span(doc_ids: list[int], start: int, end: int, answer_ids: list[int]
                         ) -> tuple[int, int]:
  """The sub-span of [start, end] whose tokens are exactly the answer's tokens, if any:
  word "(1895-1943)." holds answer "1895" as the tokens "( 1895 - 1943 ) .".
  """
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if doc_ids[new_start:new_end + 1] == answer_ids:
        return new_start, new_end
  return start, end


def _doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
  """(start, length) windows over the context tokens, as the reference slides them."""
  spans, start = [], 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens)
    spans.append((start, length))
    if start + length == num_tokens:
      break
    start += min(length, doc_stride)
  return spans


def _check_is_max_context(spans: list[tuple[int, int]], index: int, position: int) -> bool:
  """Is window `index` the one where token `position` has the most context on its shorter
  side (ties to the longer window, then the earlier)?"""
  best_score, best_index = None, None
  for i, (start, length) in enumerate(spans):
    end = start + length - 1
    if start <= position <= end:
      score = min(position - start, end - position) + 0.01 * length
      if best_score is None or score > best_score:
        best_score, best_index = score, i
  return index == best_index


def squad_features(examples: Sequence[SquadExample], tokenizer: Tokenizer, *,
                   max_seq_length: int = 384, doc_stride: int = 128,
                   max_query_length: int = 64, is_training: bool = False,
                   source: str = 'SQuAD', max_misaligned_fraction: float | None = None
                   ) -> list[SquadFeature]:
  """Windows of every example (`example_index` indexes `examples`), unique ids from 1e9.

  Answers that cannot be aligned (see the module docstring) are counted in one log line
  naming `source` (the file); in training they are dropped, and more than
  `max_misaligned_fraction` of the answers (None: no limit) is a ValueError."""
  separators = len(tokenizer.pair_separator)  # RoBERTa's `</s></s>` between the texts
  if max_seq_length <= max_query_length + 2 + separators:
    raise ValueError(f'max_seq_length={max_seq_length} must exceed max_query_length + '
                     f'{2 + separators} = {max_query_length + 2 + separators}')
  features, docs = [], {}
  unaligned = Unaligned(sum(not e.is_impossible and bool(e.answers) for e in examples))
  for example_index, example in enumerate(examples):
    if not example.is_impossible and example.answers and not example.recoverable:
      unaligned.misplaced.append(example)
      if is_training:
        continue
    if example.context_text not in docs:  # questions share paragraphs: tokenize each once
      docs[example.context_text] = _tokenize_doc(example, tokenizer)
    doc = docs[example.context_text]
    # run_qa.py strips the question's leading spaces (they would be tokens in byte-level BPE)
    query = tokenizer.encode(example.question_text.lstrip())[:max_query_length]
    answer = _token_answer(example, doc, tokenizer)
    spans = _doc_spans(len(doc.ids), max_seq_length - len(query) - 2 - separators, doc_stride)
    if answer is not None and example.recoverable and not any(
        start <= answer[0] and answer[1] < start + length for start, length in spans):
      unaligned.too_long.append((example, answer[1] - answer[0] + 1, spans))
      if is_training:
        continue
    for span_index in range(len(spans)):
      features.append(_window(example, example_index, doc, query, spans, span_index, answer,
                              tokenizer, max_seq_length, UNIQUE_ID_START + len(features)))
  unaligned.report(source, is_training, max_misaligned_fraction)
  return features


@dataclasses.dataclass
class Unaligned:
  """The answers of one file that cannot be aligned, for its summary line."""
  answers: int  # answerable questions
  misplaced: list = dataclasses.field(default_factory=list)  # examples
  too_long: list = dataclasses.field(default_factory=list)  # (example, tokens, spans)

  @property
  def count(self) -> int:
    return len(self.misplaced) + len(self.too_long)

  def _head(self, source: str) -> str:
    return (f'{source}: {self.count:,} of {self.answers:,} answers could not be aligned '
            f'({self.count / max(self.answers, 1):.2%})')

  def _kinds(self) -> str:
    kinds = []
    if self.misplaced:
      e = self.misplaced[0]
      a = e.answers[0]
      found = e.context_text[a.start:a.start + len(a.text)]
      kinds.append(f'{len(self.misplaced):,} whose answer_start does not point at the answer '
                   f'text (e.g. {e.qas_id}: {a.text!r} at character {a.start}, where the '
                   f'context reads {found!r})')
    if self.too_long:
      e, tokens, spans = self.too_long[0]
      stride = spans[1][0] - spans[0][0]
      kinds.append(f'{len(self.too_long):,} whose tokens no single window holds (e.g. '
                   f'{e.qas_id}: {tokens} tokens; windows of {spans[0][1]} context tokens '
                   f'every {stride})')
    return '; '.join(kinds)

  def summary(self, source: str, dropped: bool) -> str:
    """`train.json: 12 of 87,599 answers could not be aligned (0.01%) and were dropped: ...`."""
    fate = ('were dropped' if dropped else
            'were kept, since evaluation compares answer texts, not positions')
    return f'{self._head(source)} and {fate}: {self._kinds()}'

  def report(self, source: str, training: bool, max_fraction: float | None) -> None:
    """One warning line; a ValueError when training would drop more than `max_fraction`."""
    if not self.count:
      return
    if training and max_fraction is not None and self.count > max_fraction * self.answers:
      raise ValueError(
          f'{self._head(source)}, more than max_misaligned_fraction={max_fraction} allows: '
          f'{self._kinds()}. Check that answer_start counts characters of the context (not '
          'bytes) and that text is the answer found there, or raise '
          '--config.data.max_misaligned_fraction')
    logging.warning('%s', self.summary(source, training))


def _token_answer(example: SquadExample, doc: _Doc, tokenizer: Tokenizer
                  ) -> tuple[int, int] | None:
  """The first answer's token span in the whole context, or None."""
  if example.is_impossible or example.start_position < 0:
    return None
  if doc.offsets is not None:  # the tokens that overlap the answer's characters (run_qa.py)
    first = example.answers[0].start
    last = first + len(example.answers[0].text)
    inside = [i for i, (s, e) in enumerate(doc.offsets) if s < last and e > first]
    return (inside[0], inside[-1]) if inside else None
  start = doc.orig_to_tok[example.start_position]
  if example.end_position < len(example.doc_tokens) - 1:
    end = doc.orig_to_tok[example.end_position + 1] - 1
  else:
    end = len(doc.ids) - 1
  return _improve_answer_span(doc.ids, start, end, tokenizer.encode(example.answers[0].text))


def _window(example, example_index, doc, query, spans, span_index, answer, tokenizer,
            max_seq_length, unique_id) -> SquadFeature:
  span_start, span_length = spans[span_index]
  ids = [tokenizer.cls_id] + query + list(tokenizer.pair_separator)
  offset = len(ids)
  ids += doc.ids[span_start:span_start + span_length] + [tokenizer.sep_id]
  segment = [0] * offset + [1] * (span_length + 1)
  to_orig = {offset + i: doc.tok_to_orig[span_start + i] for i in range(span_length)}
  max_context = {offset + i: _check_is_max_context(spans, span_index, span_start + i)
                 for i in range(span_length)}
  chars = None if doc.offsets is None else {
      offset + i: doc.offsets[span_start + i] for i in range(span_length)}
  start = end = 0
  if answer is not None and span_start <= answer[0] and answer[1] < span_start + span_length:
    start, end = answer[0] - span_start + offset, answer[1] - span_start + offset
  n = len(ids)
  pad = max_seq_length - n
  return SquadFeature(
      unique_id=unique_id, example_index=example_index, doc_span_index=span_index,
      input_ids=np.array(ids + [tokenizer.pad_id] * pad, np.int32),
      input_mask=np.array([1] * n + [0] * pad, np.int32),
      segment_ids=np.array(segment + [0] * pad, np.int32),
      token_to_orig_map=to_orig, token_is_max_context=max_context, start_position=start,
      end_position=end, is_impossible=example.is_impossible, num_tokens=n,
      token_to_chars=chars)


def feature_arrays(features: Sequence[SquadFeature]) -> dict[str, np.ndarray]:
  """The model's batchable arrays, named as the reference's TFRecords name them."""
  return {
      'unique_ids': np.array([f.unique_id for f in features], np.int64),
      'input_ids': np.stack([f.input_ids for f in features]),
      'input_mask': np.stack([f.input_mask for f in features]),
      'segment_ids': np.stack([f.segment_ids for f in features]),
      'start_positions': np.array([f.start_position for f in features], np.int32),
      'end_positions': np.array([f.end_position for f in features], np.int32),
      'is_impossible': np.array([f.is_impossible for f in features], np.int32),
  }


def gold_answers(examples: Sequence[SquadExample]) -> dict[str, list[str]]:
  """qid -> gold answer texts, what `bert_jax.finetune.metrics.squad_evaluate` scores against."""
  return {e.qas_id: [a.text for a in e.answers] for e in examples}
