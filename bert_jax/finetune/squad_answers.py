"""SQuAD answer decoding: per-window start/end logits -> answer texts.

google-research/bert `run_squad.py` `write_predictions` on our tokenizer interface: take the
`n_best_size` best starts and ends of every window (`input_pipeline.finetune.squad` makes the
windows), keep valid spans up to `max_answer_length` tokens that lie in the context and in a
window where their start has the most context, map the best back to the original text
(`get_final_text`), and for SQuAD 2.0 answer "" when the best null score beats the best span
by more than `null_score_diff_threshold`.

Tokenizers that give character offsets (byte-level BPE, Unigram `tokenizer.json`s) read
the answer off the context by characters, as HF's `examples/pytorch/question-answering/
utils_qa.py` `postprocess_qa_predictions` does. Otherwise answer texts are projected back
onto the context with the tokenizer's own casing
(`tokenizer.do_lower_case`, read from a SentencePiece model itself), never a guess: lowercasing
the context for a cased model makes `get_final_text` miss "Steve Smith" in "Steve Smith's".
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from input_pipeline.finetune.squad import SquadExample, SquadFeature
from input_pipeline.tokenizer import Tokenizer, WordPieceTokenizer


@dataclasses.dataclass
class SquadPredictions:
  predictions: dict[str, str]  # qid -> answer text ("" = no answer, SQuAD 2.0)
  nbest: dict[str, list[dict]]  # qid -> [{text, probability, start_logit, end_logit}]
  null_odds: dict[str, float]  # qid -> null score - best span score (SQuAD 2.0 only)


def squad_predictions(examples: Sequence[SquadExample], features: Sequence[SquadFeature],
                      start_logits: np.ndarray, end_logits: np.ndarray, tokenizer: Tokenizer,
                      *, n_best_size: int = 20, max_answer_length: int = 30,
                      version_2_with_negative: bool = False,
                      null_score_diff_threshold: float = 0.0) -> SquadPredictions:
  """Answer texts from per-window logits ([num_features, max_seq_length], row i belongs to
  `features[i]`), as run_squad.py `write_predictions` chooses them, projected onto the
  context with `tokenizer`'s own casing (`text_normalization`)."""
  start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
  if len(start_logits) != len(features) or len(end_logits) != len(features):
    raise ValueError(f'{len(features)} features but {len(start_logits)} start and '
                     f'{len(end_logits)} end logit rows: pass one row per feature, in order')
  by_example = collections.defaultdict(list)
  for i, f in enumerate(features):
    by_example[f.example_index].append(i)
  out = SquadPredictions({}, {}, {})
  normalization = text_normalization(tokenizer)
  for example_index, rows in by_example.items():
    example = examples[example_index]
    nbest, null = _nbest(example, [features[i] for i in rows], start_logits[rows],
                         end_logits[rows], tokenizer, n_best_size, max_answer_length,
                         normalization, version_2_with_negative)
    out.nbest[example.qas_id] = nbest
    best = next((e for e in nbest if e['text']), None)
    if not version_2_with_negative:
      out.predictions[example.qas_id] = nbest[0]['text']
      continue
    diff = null - (best['start_logit'] + best['end_logit']) if best else math.inf
    out.null_odds[example.qas_id] = diff
    out.predictions[example.qas_id] = '' if diff > null_score_diff_threshold else best['text']
  return out


def _best_indexes(logits: np.ndarray, n: int) -> list[int]:
  return np.argsort(-logits, kind='stable')[:n].tolist()


def _nbest(example, features, start_logits, end_logits, tokenizer, n_best_size,
           max_answer_length, normalization, with_null):
  """The n-best answers of one example over all its windows, and its minimum null score."""
  prelim, null = [], None
  for k, f in enumerate(features):
    s, e = start_logits[k], end_logits[k]
    if with_null and (null is None or s[0] + e[0] < null[0]):
      null = (float(s[0] + e[0]), k, float(s[0]), float(e[0]))
    for i in _best_indexes(s, n_best_size):
      for j in _best_indexes(e, n_best_size):
        if (i in f.token_to_orig_map and j in f.token_to_orig_map and i <= j
            and f.token_is_max_context.get(i, False) and j - i + 1 <= max_answer_length):
          prelim.append((float(s[i] + e[j]), k, i, j, float(s[i]), float(e[j])))
  if with_null:
    prelim.append((null[2] + null[3], null[1], 0, 0, null[2], null[3]))
  prelim.sort(key=lambda p: p[0], reverse=True)
  nbest, seen = [], set()
  for _, k, i, j, s, e in prelim:
    if len(nbest) >= n_best_size:
      break
    text = ''  # the null answer (position 0) is never deduplicated, as in the reference
    if i > 0:
      text = _span_text(example, features[k], i, j, tokenizer, normalization)
      if text in seen:
        continue
    seen.add(text)
    nbest.append((text, s, e))
  if with_null and '' not in seen:
    nbest.append(('', null[2], null[3]))
  if not nbest:  # the reference's nonce answer when no span is valid
    nbest.append(('empty', 0.0, 0.0))
  probs = _softmax([s + e for _, s, e in nbest])
  return ([{'text': t, 'probability': p, 'start_logit': s, 'end_logit': e}
           for (t, s, e), p in zip(nbest, probs)], null[0] if with_null else None)


def _softmax(scores: list[float]) -> list[float]:
  x = np.exp(np.array(scores) - max(scores))
  return (x / x.sum()).tolist()


def _span_text(example, feature, i, j, tokenizer, normalization: tuple[bool, bool]) -> str:
  if feature.token_to_chars is not None:  # HF run_qa.py's utils_qa: the characters, verbatim
    return example.context_text[feature.token_to_chars[i][0]:feature.token_to_chars[j][1]]
  pieces = [tokenizer.id_to_token(int(t)) for t in feature.input_ids[i:j + 1]]
  orig = ' '.join(example.doc_tokens[feature.token_to_orig_map[i]:
                                     feature.token_to_orig_map[j] + 1])
  return get_final_text(detokenize(pieces, tokenizer), orig, *normalization)


def text_normalization(tokenizer: Tokenizer) -> tuple[bool, bool]:
  """(lower-cases, strips accents): what `tokenizer` did to the tokens of a predicted span,
  which `get_final_text` must do to the original words to find the span in them. Casing is
  the tokenizer's own (`do_lower_case`; a SentencePiece model's is read from the model), so a
  cased model's "Steve Smith" is found in "Steve Smith's". BERT's normaliser strips accents
  exactly when it lower-cases; SentencePiece's case folding (nmt_nfkc_cf) keeps them."""
  lower = bool(tokenizer.do_lower_case)
  return lower, lower if isinstance(tokenizer, WordPieceTokenizer) else False


def detokenize(pieces: Sequence[str], tokenizer: Tokenizer) -> str:
  """Sub-word pieces back to words: WordPiece drops `##` joins, SentencePiece turns its `▁`
  into spaces; whitespace is then normalised."""
  if isinstance(tokenizer, WordPieceTokenizer):
    text = ' '.join(pieces).replace(' ##', '').replace('##', '')
  else:
    text = ''.join(pieces).replace('\u2581', ' ')
  return ' '.join(text.split())


def basic_tokenize(text: str, do_lower_case: bool, strip_accents: bool | None = None
                   ) -> list[str]:
  """BERT's BasicTokenizer (clean, CJK split, lower case and strip accents, split on
  punctuation), through the `tokenizers` library's BERT normaliser and pre-tokenizer.
  `strip_accents=None` strips them exactly when lower-casing, as BERT does."""
  from tokenizers import normalizers, pre_tokenizers  # pylint: disable=g-import-not-at-top
  norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                    strip_accents=strip_accents, lowercase=do_lower_case)
  return [w for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(
      norm.normalize_str(text))]


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool,
                   strip_accents: bool | None = None) -> str:
  """The part of `orig_text` (the original words the span covers) that `pred_text` (the
  normalised tokens) is: "steve smith" in "Steve Smith's" is "Steve Smith". Falls back to
  `orig_text` when the characters cannot be aligned, as the reference does: so
  `do_lower_case` (and `strip_accents`) must be what the tokenizer did to `pred_text`."""
  tok_text = ' '.join(basic_tokenize(orig_text, do_lower_case, strip_accents))
  start = tok_text.find(pred_text)
  if start == -1:
    return orig_text
  end = start + len(pred_text) - 1
  orig_ns, orig_map = _strip_spaces(orig_text)
  tok_ns, tok_map = _strip_spaces(tok_text)
  if len(orig_ns) != len(tok_ns):
    return orig_text
  tok_s_to_ns = {s: ns for ns, s in tok_map.items()}
  orig_start = orig_map.get(tok_s_to_ns.get(start, -1))
  orig_end = orig_map.get(tok_s_to_ns.get(end, -1))
  if orig_start is None or orig_end is None:
    return orig_text
  return orig_text[orig_start:orig_end + 1]


def _strip_spaces(text: str) -> tuple[str, dict[int, int]]:
  """`text` without spaces, and each remaining character's index in `text`."""
  chars, ns_to_s = [], {}
  for i, c in enumerate(text):
    if c != ' ':
      ns_to_s[len(chars)] = i
      chars.append(c)
  return ''.join(chars), ns_to_s
