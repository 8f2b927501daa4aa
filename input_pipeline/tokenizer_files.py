"""Which tokenizer a path holds, and opening it: `load_tokenizer` (the data and run configs'
fields), `open_tokenizer` (a file, or the one a directory holds) and `find_tokenizer_file`.
Apart from input_pipeline/tokenizer.py and hf_tokenizer.py so that each class's module stays
free of the others (hf_tokenizer builds on tokenizer's base class)."""

from __future__ import annotations

import json

from input_pipeline import fs
from input_pipeline.hf_tokenizer import HFTokenizer
from input_pipeline.tokenizer import (SPECIAL_TOKENS, SentencePieceTokenizer, Tokenizer,
                                      WordPieceTokenizer)


def load_tokenizer(vocab_file: str | None = None, spm_model: str | None = None,
                   do_lower_case: bool = True, tokenizer: str | None = None) -> Tokenizer:
  """The tokenizer one of --vocab_file, --spm_model or --tokenizer (`open_tokenizer`) names."""
  if sum(map(bool, (vocab_file, spm_model, tokenizer))) != 1:
    raise ValueError('give exactly one of --vocab_file (WordPiece), --spm_model (SentencePiece) '
                     'or --tokenizer (a tokenizer.json, or a directory holding a tokenizer)')
  if tokenizer:
    return open_tokenizer(tokenizer, do_lower_case)
  if vocab_file:
    return WordPieceTokenizer(vocab_file, do_lower_case)
  return SentencePieceTokenizer(spm_model)


DATA_FIELDS = ('vocab_file', 'spm_model', 'tokenizer')


def data_tokenizer(data) -> Tokenizer | None:
  """The tokenizer a run's `data` block names (data.vocab_file, data.spm_model or
  data.tokenizer, the one create_pretraining_data was given), or None when it names none."""
  named = [f for f in DATA_FIELDS if data.get(f)]
  if len(named) > 1:
    raise ValueError(f'data.{" and data.".join(named)} are all set: name the data\'s tokenizer '
                     'once (vocab_file for WordPiece, spm_model for SentencePiece, tokenizer '
                     'for a tokenizer.json or a model directory)')
  if not named:
    return None
  return load_tokenizer(data.get('vocab_file') or None, data.get('spm_model') or None,
                        bool(data.get('do_lower_case', True)), data.get('tokenizer') or None)


def data_tokenizer_field(data) -> str:
  """`data.<field>=<value>` of the run's tokenizer, for messages ('' when none is named)."""
  return next((f'data.{f}={data.get(f)}' for f in DATA_FIELDS if data.get(f)), '')


def open_tokenizer(path: str, do_lower_case: bool = True) -> Tokenizer:
  """A tokenizer file, or the one a directory holds (`find_tokenizer_file`), by its kind:
  vocab.txt (WordPiece, cased as `do_lower_case` says), a SentencePiece .model, or a
  tokenizer.json / vocab.json (`hf_tokenizer.HFTokenizer`, casing its own)."""
  if fs.isdir(path):
    file = find_tokenizer_file(path)
    if file is None:
      raise FileNotFoundError(f'{path}: no tokenizer ({TOKENIZER_FILES})')
    path = file
  if path.endswith('.json'):
    return HFTokenizer(path)
  if path.endswith('.model'):
    return SentencePieceTokenizer(path)
  return WordPieceTokenizer(path, do_lower_case)


TOKENIZER_FILES = 'vocab.txt, spiece.model, tokenizer.json or vocab.json + merges.txt'


def find_tokenizer_file(directory: str) -> str | None:
  """The file a directory's tokenizer is read from, or None; decided by the files' content,
  not by tokenizer_config.json's `tokenizer_class` (often absent, and transformers itself
  overrides ModernBERT's). The first of:
    1. vocab.txt, unless a tokenizer.json beside it is not WordPiece (BERT's releases and
       our WordPiece exports hold both, the same vocabulary: WordPieceTokenizer keeps its
       fingerprint and BERT's casing rules);
    2. spiece.model, unless a tokenizer.json beside it lacks BERT's special tokens at ids
       0-4 (our SentencePiece exports hold both; ALBERT's or T5's do not fit ours);
    3. tokenizer.json (ModernBERT, Ettin, XLM-R, mmBERT...);
    4. vocab.json + merges.txt (RoBERTa's byte-level BPE).
  """
  pipeline, vocab = fs.join(directory, 'tokenizer.json'), fs.join(directory, 'vocab.txt')
  spm, bpe_vocab = fs.join(directory, 'spiece.model'), fs.join(directory, 'vocab.json')
  spec = json.loads(fs.read_text(pipeline)) if fs.exists(pipeline) else None
  if fs.exists(vocab) and (spec is None or spec['model'].get('type') == 'WordPiece'):
    return vocab
  if fs.exists(spm) and (spec is None or _bert_specials_first(spec)):
    return spm
  if spec is not None:
    return pipeline
  if fs.exists(bpe_vocab) and fs.exists(fs.join(directory, 'merges.txt')):
    return bpe_vocab
  return None


def _bert_specials_first(spec: dict) -> bool:
  """Whether a tokenizer.json's ids 0-4 are SPECIAL_TOKENS, as in our SentencePiece export."""
  vocab = spec['model'].get('vocab')
  if isinstance(vocab, list):  # Unigram: [piece, score] by id
    return [v[0] for v in vocab[:len(SPECIAL_TOKENS)]] == list(SPECIAL_TOKENS)
  return all((vocab or {}).get(t) == i for i, t in enumerate(SPECIAL_TOKENS))
