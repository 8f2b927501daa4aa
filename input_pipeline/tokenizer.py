"""One tokenizer interface over WordPiece (BERT `vocab.txt`), SentencePiece and, in
`hf_tokenizer`, the `tokenizer.json` released models ship (byte-level BPE, Unigram).

WordPiece runs on HuggingFace's `tokenizers` library configured exactly as
`BertTokenizerFast` (BERT normalizer, BERT pre-tokenizer, `##` continuations, 100-char word
limit), so ids equal HF's on any text and the exported `AutoTokenizer` tokenizes as we did.
SentencePiece trains/loads a `.model` with the BERT special tokens at fixed ids 0-4.

Both expose `is_word_start(ids)` for whole-word masking, `save_pretrained(dir)` writing the
HF tokenizer files next to an exported model, `do_lower_case` (for SentencePiece read from
the model, `spm_is_uncased`) and `fingerprint`, a content hash that tells two vocabularies
apart (continued pre-training refuses a start point whose ids mean other words).
`tokenizer_files.open_tokenizer(path)` reads any of them from a file or a model's directory
(`find_tokenizer_file` documents which file wins).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from input_pipeline import fs

SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
ROLES = ('pad', 'unk', 'cls', 'sep', 'mask')  # the roles of SPECIAL_TOKENS, in that order


class Tokenizer:
  """The interface the pipeline uses; subclasses fill the vocabulary and `encode_batch`.

  `specials` names the token of each role (ROLES: pad unk cls sep mask), BERT's names by
  default; a tokenizer with other names (RoBERTa's `<s>`, `</s>`...) passes its own, and may
  leave out unk (byte-level BPE never needs one: unk_id is then None). `reserved` ids (a
  tokenizer's other special tokens) are never drawn as random replacements.
  """

  vocab: list[str]
  unk_id: int | None

  def __init__(self, vocab: Sequence[str], specials: Mapping[str, str] | None = None,
               reserved: Iterable[int] = ()):
    self.vocab = list(vocab)
    self._ids = {t: i for i, t in enumerate(self.vocab)}
    bert = specials is None
    specials = dict(zip(ROLES, SPECIAL_TOKENS)) if bert else dict(specials)
    missing = [t for t in specials.values() if t not in self._ids]
    if missing:
      raise ValueError(f'vocabulary lacks the {"BERT " * bert}special tokens {missing}')
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        self._ids[specials[r]] if r in specials else None for r in ROLES)
    if None in (self.pad_id, self.cls_id, self.sep_id, self.mask_id):
      raise ValueError(f'special tokens {specials}: pad, cls, sep and mask are required')
    # word_start_table[id]: does this token begin a word (for whole-word masking)?
    self.word_start_table = np.array([self._starts_word(t) for t in self.vocab], bool)
    special = {self._ids[t] for t in specials.values()} | set(reserved)
    # Random replacements come from real tokens only: not special, not [unusedN], not an
    # unassigned id ('') (the reference draws from the whole vocabulary; a random [unused]
    # token teaches nothing).
    self.replacement_ids = np.array(
        [i for i, t in enumerate(self.vocab)
         if i not in special and t and not (t.startswith('[unused') and t.endswith(']'))],
        np.int32)

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  # Put before a document's later sentences when they are encoded one by one, so that their
  # first word is tokenized as in running text: '' for WordPiece and SentencePiece (words
  # are marked alike anywhere), ' ' for byte-level BPE (`hf_tokenizer`).
  running_text_prefix = ''

  @property
  def pair_separator(self) -> tuple[int, ...]:
    """The ids between the two texts of a pair, `cls a <these> b sep`: BERT's one [SEP];
    RoBERTa's tokenizers write two (`</s></s>`, `hf_tokenizer.HFTokenizer`)."""
    return (self.sep_id,)

  def token_to_id(self, token: str) -> int:
    if self.unk_id is None:
      return self._ids[token]
    return self._ids.get(token, self.unk_id)

  def id_to_token(self, i: int) -> str:
    return self.vocab[i]

  def encode(self, text: str) -> list[int]:
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    raise NotImplementedError

  def encode_words(self, words: Sequence[str]) -> list[list[int]]:
    """The ids of each word of a pre-split sentence (CoNLL's), as `AutoTokenizer(words,
    is_split_into_words=True)` gives them: WordPiece and SentencePiece mark a word alike
    wherever it stands, so each word alone. Byte-level BPE marks it by the space before it
    (`HFTokenizer.encode_words`)."""
    return self.encode_batch(words) if words else []

  def is_word_start(self, ids: np.ndarray) -> np.ndarray:
    return self.word_start_table[np.asarray(ids)]

  @property
  def fingerprint(self) -> str:
    """sha256 of what decides the ids: WordPiece's token list, SentencePiece's model."""
    raise NotImplementedError

  def _starts_word(self, token: str) -> bool:
    raise NotImplementedError

  def save_pretrained(self, path: str) -> None:
    raise NotImplementedError


class WordPieceTokenizer(Tokenizer):
  """BERT WordPiece from a `vocab.txt`, identical to HF `BertTokenizerFast`."""

  def __init__(self, vocab_file: str, do_lower_case: bool = True):
    from tokenizers import Tokenizer as HFTokenizer  # pylint: disable=g-import-not-at-top
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors
    if not fs.exists(vocab_file):
      raise FileNotFoundError(f'vocab file {vocab_file}: no such file')
    vocab = fs.read_text(vocab_file).split('\n')
    while vocab and not vocab[-1]:
      vocab.pop()
    super().__init__(vocab)
    self.vocab_file = vocab_file
    self.do_lower_case = do_lower_case
    tok = HFTokenizer(models.WordPiece(dict(self._ids), unk_token='[UNK]',
                                       max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=do_lower_case)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix='##')
    tok.post_processor = processors.TemplateProcessing(
        single='[CLS] $A [SEP]', pair='[CLS] $A [SEP] $B:1 [SEP]:1',
        special_tokens=[('[CLS]', self.cls_id), ('[SEP]', self.sep_id)])
    self._tok = tok

  @classmethod
  def train(cls, sentences: Iterable[str], vocab_size: int, output_dir: str,
            do_lower_case: bool = True, min_frequency: int = 2) -> 'WordPieceTokenizer':
    """Learn a WordPiece vocabulary (HF's trainer) and write `output_dir/vocab.txt`; the same
    sentences give the same file in any process.

    HF's trainer alone does not (huggingface/tokenizers#1794): it numbers the word-piece
    alphabet (`##a`, `##b`, ...) in the order it meets them in a hash map of words, and breaks
    ties between equally frequent merges by those numbers, so two processes picked different
    merges (9 of 2,000 pieces, and most ids, apart on the tests' corpus). A first pass at no
    merges learns that alphabet; the real pass is given it, sorted, after the special tokens, so
    every number it compares is fixed. `sentences` is read twice: a list, or a callable that
    returns a fresh iterable (a one-shot iterator is read into a list first)."""
    from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
    if callable(sentences):
      read = sentences
    else:
      if iter(sentences) is sentences:
        sentences = list(sentences)
      read = lambda: sentences

    def trained(vocab_size: int, special_tokens: list[str]):
      trainer = BertWordPieceTokenizer(lowercase=do_lower_case, strip_accents=None)
      trainer.train_from_iterator(read(), vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=special_tokens, show_progress=False)
      return trainer

    alphabet = trained(0, list(SPECIAL_TOKENS)).get_vocab()
    pieces = sorted(t for t in alphabet if t.startswith('##') and t not in SPECIAL_TOKENS)
    trainer = trained(vocab_size, [*SPECIAL_TOKENS, *pieces])
    with fs.staged_dir(output_dir) as local:
      trainer.save_model(local)
    return cls(fs.join(output_dir, 'vocab.txt'), do_lower_case)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  @property
  def fingerprint(self) -> str:
    return hashlib.sha256('\n'.join(self.vocab).encode('utf-8')).hexdigest()

  def _starts_word(self, token: str) -> bool:
    return not token.startswith('##')

  def save_pretrained(self, path: str) -> None:
    """vocab.txt + tokenizer.json + configs: what `AutoTokenizer.from_pretrained` reads."""
    specials = dict(pad_token='[PAD]', unk_token='[UNK]', cls_token='[CLS]',
                    sep_token='[SEP]', mask_token='[MASK]')
    fs.makedirs(path)
    fs.write_text(fs.join(path, 'vocab.txt'), '\n'.join(self.vocab) + '\n')
    fs.write_text(fs.join(path, 'tokenizer.json'), self._tok.to_str())
    fs.write_text(fs.join(path, 'tokenizer_config.json'), json.dumps(dict(
        tokenizer_class='BertTokenizer', do_lower_case=self.do_lower_case,
        tokenize_chinese_chars=True, strip_accents=None, model_max_length=512, **specials),
        indent=2))
    fs.write_text(fs.join(path, 'special_tokens_map.json'), json.dumps(specials, indent=2))


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece `.model` whose ids 0-4 are [PAD] [UNK] [CLS] [SEP] [MASK]; its casing
  (`do_lower_case`) is the model's own (`spm_is_uncased`)."""

  def __init__(self, model_file: str):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    if not fs.exists(model_file):
      raise FileNotFoundError(f'SentencePiece model {model_file}: no such file')
    self._model_proto = fs.read_bytes(model_file)
    sp = spm.SentencePieceProcessor(model_proto=self._model_proto)
    self.model_file = model_file
    self._fast = _spm_to_fast(self._model_proto, model_file)
    super().__init__([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
    if [self._ids[t] for t in SPECIAL_TOKENS] != list(range(len(SPECIAL_TOKENS))):
      raise ValueError(f'{model_file}: special tokens are not at ids 0-4; train it with '
                       'SentencePieceTokenizer.train')
    self.do_lower_case = spm_is_uncased(self._fast, self.vocab)

  @classmethod
  def train(cls, sentences: Iterable[str], vocab_size: int, output_prefix: str,
            model_type: str = 'unigram', lowercase: bool = True) -> 'SentencePieceTokenizer':
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    if model_type not in ('unigram', 'bpe'):
      raise ValueError(f'model_type={model_type!r}: expected unigram or bpe')
    with fs.staged_dir(fs.dirname(output_prefix) or '.') as local:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences),
          model_prefix=os.path.join(local, fs.basename(output_prefix)), vocab_size=vocab_size,
          model_type=model_type, pad_id=0, pad_piece='[PAD]', unk_id=1, unk_piece='[UNK]',
          bos_id=-1, eos_id=-1, user_defined_symbols=['[CLS]', '[SEP]', '[MASK]'],
          normalization_rule_name='nmt_nfkc_cf' if lowercase else 'nmt_nfkc',
          hard_vocab_limit=False, minloglevel=2)
    return cls(output_prefix + '.model')

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._fast.encode_batch(list(texts), add_special_tokens=False)]

  @property
  def fingerprint(self) -> str:
    """Over the pieces, scores, types, algorithm and normaliser only: the trainer's record of
    its input files and output prefix is in the model too, but changes no id."""
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(self._model_proto)
    h = hashlib.sha256(f'{proto.trainer_spec.model_type}'.encode())
    for p in proto.pieces:
      h.update(f'\n{p.piece}\t{p.score!r}\t{p.type}'.encode('utf-8'))
    h.update(proto.normalizer_spec.SerializeToString(deterministic=True))
    return h.hexdigest()

  def _starts_word(self, token: str) -> bool:
    return token.startswith('\u2581') or token in SPECIAL_TOKENS

  def save_pretrained(self, path: str) -> None:
    """The .model plus a `tokenizer.json` that `AutoTokenizer` loads and that tokenizes as
    this model does (same normalizer charsmap, pieces and algorithm; tested on a corpus)."""
    from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
    fast = PreTrainedTokenizerFast(
        tokenizer_object=self._fast, pad_token='[PAD]', unk_token='[UNK]',
        cls_token='[CLS]', sep_token='[SEP]', mask_token='[MASK]',
        model_input_names=['input_ids', 'token_type_ids', 'attention_mask'])
    with fs.staged_dir(path) as local:
      with open(os.path.join(local, 'spiece.model'), 'wb') as f:
        f.write(self._model_proto)
      fast.save_pretrained(local)


_CASE_PROBE = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ'  # what a case-folding normaliser lowercases


def spm_is_uncased(fast, pieces: Sequence[str]) -> bool:
  """Whether a SentencePiece model lowercases its input, read from the model, not guessed.

  Uncased when its normaliser folds case (what `train(lowercase=True)`'s `nmt_nfkc_cf` rule,
  or any custom rule with case folding, compiles into the model: probed by normalising
  upper-case letters), or when no piece holds an upper-case letter (trained on lower-cased
  text: cased input can only become [UNK], so the model reads lower case, as an uncased
  WordPiece vocabulary does). Cased otherwise. Caseless scripts (Chinese) count as uncased,
  as in Google's `chinese_*` models: lowercasing them changes nothing. SQuAD's answer
  alignment lowercases the original text exactly when this is True.
  """
  folded = fast.normalizer.normalize_str(_CASE_PROBE) if fast.normalizer else _CASE_PROBE
  if not any(c.isupper() for c in folded):
    return True
  return not any(c.isupper() for p in pieces
                 if not (p.startswith(('[', '<')) and p.endswith((']', '>'))) for c in p)


def _spm_to_fast(model_proto: bytes, model_file: str):
  """A SentencePiece model as a `tokenizers.Tokenizer`, built the way transformers' generic
  `SpmConverter` builds it (the model's own precompiled normaliser, Metaspace, unigram or BPE
  with merges from the piece ranks), plus BERT's [CLS] A [SEP] B [SEP] template.

  We encode with this object too, not with sentencepiece itself: the two differ only in how
  they break ties between equal-score segmentations (about 1 line in 1,500), and encoding with
  the exported object makes the exported `AutoTokenizer` agree with our data exactly.
  """
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from tokenizers import (AddedToken, Regex, Tokenizer, decoders, normalizers,
                          pre_tokenizers, processors)
  from tokenizers.models import BPE, Unigram  # pylint: disable=g-import-not-at-top

  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(model_proto)
  pieces = [(p.piece, p.score) for p in proto.pieces]
  if proto.trainer_spec.model_type == 1:
    tok = Tokenizer(Unigram(pieces, unk_id=proto.trainer_spec.unk_id, byte_fallback=False))
  elif proto.trainer_spec.model_type == 2:
    vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
    merges = sorted((rank, vocab[piece[:i]], vocab[piece[i:]], piece[:i], piece[i:])
                    for piece, rank in vocab.items() for i in range(1, len(piece))
                    if piece[:i] in vocab and piece[i:] in vocab)
    tok = Tokenizer(BPE(vocab, [(l, r) for *_, l, r in merges],
                        unk_token=proto.trainer_spec.unk_piece, fuse_unk=True))
  else:
    raise ValueError(f'{model_file}: SentencePiece model type {proto.trainer_spec.model_type} '
                     'is neither unigram nor BPE')
  steps = [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(' {2,}'), '\u2581')]
  if proto.normalizer_spec.precompiled_charsmap:
    steps.insert(0, normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
  tok.normalizer = normalizers.Sequence(steps)
  scheme = 'always' if proto.normalizer_spec.add_dummy_prefix else 'never'
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement='\u2581', prepend_scheme=scheme)
  tok.decoder = decoders.Metaspace(replacement='\u2581', prepend_scheme=scheme)
  tok.add_tokens([AddedToken(p.piece, normalized=False, special=True)
                  for p in proto.pieces if p.type in (3, 4)])  # control, user-defined
  tok.post_processor = processors.TemplateProcessing(
      single='[CLS] $A [SEP]', pair='[CLS] $A [SEP] $B:1 [SEP]:1',
      special_tokens=[(t, tok.token_to_id(t)) for t in ('[CLS]', '[SEP]')])
  return tok
