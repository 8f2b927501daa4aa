"""A start point's tokenizer and its casing, read from the start point itself.

Casing is a property of the start point, not a flag to remember: an uncased vocabulary fed
cased text maps most capitalised words to other ids and loses accuracy without any error.
It is read from the start point (HF `tokenizer_config.json`, the workdir's config, Google's
model name (`google_tf.casing`), a SentencePiece model's or a tokenizer.json's normaliser,
or the vocabulary itself) and a conflicting `do_lower_case` is a ValueError (`resolve`).
"""

from __future__ import annotations

import json
import logging

from bert_jax.convert import hf
from input_pipeline import fs
from input_pipeline.hf_tokenizer import HFTokenizer
from input_pipeline.tokenizer import SentencePieceTokenizer, WordPieceTokenizer
from input_pipeline.tokenizer_files import (DATA_FIELDS, TOKENIZER_FILES, find_tokenizer_file,
                                            open_tokenizer)


def vocab_is_uncased(vocab_file: str) -> bool:
  """An uncased WordPiece vocabulary has no token with an uppercase letter (lower-cased text
  could never produce one); [CLS]-style specials are skipped."""
  for token in fs.read_text(vocab_file).split('\n'):
    if token.startswith('[') and token.endswith(']'):
      continue
    if token != token.lower():
      return False
  return True


def vocab_casing(vocab_file: str) -> tuple[bool, str]:
  """(casing, evidence) from the vocabulary alone, when nothing names it."""
  lower = vocab_is_uncased(vocab_file)
  return lower, f'vocab.txt ({"no" if lower else "some"} uppercase tokens)'


def resolve(found: bool, evidence: str, given: bool | None, path: str) -> bool:
  """The start point's casing, or a ValueError when the caller asked for the other one."""
  if given is not None and given != found:
    have, want = ('uncased', 'a cased') if found else ('cased', 'an uncased')
    raise ValueError(
        f'{path}: the start point is {have} (do_lower_case={found}, from {evidence}) but '
        f'do_lower_case={given} was given. Drop do_lower_case to use the start point\'s '
        f'casing, or start from {want} model: the other casing maps words to ids the '
        'model never saw in pre-training and silently costs accuracy.')
  return found


def sentencepiece(model_file: str, given: bool | None, path: str):
  """(tokenizer, casing): a SentencePiece model's casing is its own (`spm_is_uncased`: its
  normaliser folds case, or no piece has an upper-case letter), never a guess or a flag."""
  tok = SentencePieceTokenizer(model_file)
  evidence = f'{fs.basename(model_file)}\'s normaliser and pieces'
  return tok, resolve(tok.do_lower_case, evidence, given, path)


def missing(path: str, required: bool, looked_for: str):
  """(None, None) for a start point without a tokenizer, or an error when one is required."""
  if required:
    raise hf.CheckpointError(f'{path}: no tokenizer ({looked_for}); copy the vocabulary the '
                             'model was trained with next to it')
  return None, None


def hf_tokenizer(path: str, given: bool | None, required: bool):
  """The directory's tokenizer (`find_tokenizer_file`): WordPiece vocab.txt (casing from
  tokenizer_config.json, else the vocabulary), our exported SentencePiece `spiece.model`, or
  a tokenizer.json / RoBERTa vocab.json + merges.txt (`HFTokenizer`: ModernBERT, Ettin,
  XLM-R...), whose casing is its normaliser's."""
  file = find_tokenizer_file(path)
  if file is None:
    return missing(path, required, TOKENIZER_FILES)
  name = fs.basename(file)
  if name == 'vocab.txt':
    found, evidence = _hf_casing(path, file)
    lower = resolve(found, evidence, given, path)
    return WordPieceTokenizer(file, lower), lower
  if name == 'spiece.model':
    return sentencepiece(file, given, path)
  tok = HFTokenizer(file)
  return tok, resolve(tok.do_lower_case, f'{name}\'s normaliser', given, path)


def _hf_casing(path: str, vocab: str) -> tuple[bool, str]:
  # sentence_bert_config.json's do_lower_case is sentence-transformers' own pre-lowering
  # switch (False in all-MiniLM-L6-v2, whose tokenizer lowercases): not the tokenizer's.
  config = fs.join(path, 'tokenizer_config.json')
  if fs.exists(config):
    value = json.loads(fs.read_text(config)).get('do_lower_case')
    if value is not None:
      return bool(value), 'tokenizer_config.json do_lower_case'
  return vocab_casing(vocab)


def workdir_tokenizer(d, path: str, given: bool | None, required: bool):
  """(tokenizer, casing) config.json names (`data.spm_model`, `data.vocab_file` or
  `data.tokenizer`, a local path or a URL). A file that is not there is an error when
  `required`; otherwise a warning and no tokenizer (train.init_from then refuses to go on
  unchecked: `check_vocabulary`)."""
  field = next((f for f in DATA_FIELDS if d.get(f)), None)
  if field is None:
    return missing(path, required, 'config.json sets none of data.vocab_file, data.spm_model '
                   'and data.tokenizer')
  file = d[field]
  if not fs.exists(file):
    message = (f'{path}/config.json: data.{field}={file!r} does not exist here; run from the '
               'directory training ran in, or copy the file there')
    if required:
      raise FileNotFoundError(message)
    logging.warning('%s', message)
    return None, None
  if field == 'spm_model':
    return sentencepiece(file, given, path)
  if field == 'tokenizer':
    tok = open_tokenizer(file, bool(d.do_lower_case))
    return tok, resolve(tok.do_lower_case, f'config.json data.tokenizer={file}', given, path)
  lower = resolve(bool(d.do_lower_case), 'config.json data.do_lower_case', given, path)
  return WordPieceTokenizer(file, lower), lower
