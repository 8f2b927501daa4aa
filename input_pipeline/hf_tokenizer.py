"""A HuggingFace `tokenizers` pipeline as our Tokenizer: what released encoders ship.

ModernBERT, Ettin and RoBERTa ship a byte-level BPE `tokenizer.json` (RoBERTa also as
`vocab.json` + `merges.txt`), XLM-R and mmBERT a Unigram one; WordPiece ones exist too.
`HFTokenizer` reads any of them and encodes with the pipeline itself, so ids equal
`transformers.AutoTokenizer`'s, without the special tokens (our featurizers add the cls and
sep roles themselves).

Which token plays which role comes from the tokenizer's own files, never from BERT's names,
first found wins:
  1. tokenizer_config.json: cls_token, sep_token, pad_token, mask_token, unk_token, with
     bos_token / eos_token standing in for a missing cls / sep (RoBERTa's `<s>`, `</s>`);
  2. special_tokens_map.json, the same keys;
  3. tokenizer.json itself: its post-processor's cls and sep, its model's unk token, its
     padding's pad token, a special token named pad or mask (`<pad>`, `[MASK]`...); for
     `vocab.json` + `merges.txt`, RoBERTa's `<s>` `</s>` `<pad>` `<mask>` `<unk>`.
Casing is the normaliser's (probed as `spm_is_uncased` probes a SentencePiece model).

Pairs: fine-tuning packs `cls a <pair_separator> b sep` with the separator the tokenizer's
own pair template puts between the texts: RoBERTa's and XLM-R's `</s></s>`, BERT's and
ModernBERT's one `[SEP]`, so features equal `AutoTokenizer(a, b)`'s. `save_pretrained`
writes that template back (as a TemplateProcessing, after RoBERTa's offset trimming where the
source trims), so the export tokenizes pairs as the model was fine-tuned on them and gives
the source's character offsets. Pre-training's NSP/SOP pairs stay BERT's `cls a sep b sep`
(only BERT-style models have a sentence objective).

`encode_words` encodes a pre-split sentence's words (CoNLL tagging) as HF's `run_ner.py`
does, each after its word-start space. `encode_with_offsets` gives each token's character
span in the text, which SQuAD features use with byte-level BPE
(`input_pipeline.finetune.squad`), as HF's `run_qa.py` does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from input_pipeline import fs
from input_pipeline.tokenizer import ROLES, Tokenizer, spm_is_uncased

BYTE_LEVEL_SPACE = '\u0120'  # 'Ġ': a byte-level BPE token that starts with a space
METASPACE = '\u2581'  # '▁': SentencePiece's (Metaspace's) space
CONFIG_FILES = ('tokenizer_config.json', 'special_tokens_map.json')
# tokenizer_config.json keys that name each role's token, in order of preference.
ROLE_KEYS = {'pad': ('pad_token',), 'unk': ('unk_token',), 'cls': ('cls_token', 'bos_token'),
             'sep': ('sep_token', 'eos_token'), 'mask': ('mask_token',)}
ROBERTA_TOKENS = {'pad': '<pad>', 'unk': '<unk>', 'cls': '<s>', 'sep': '</s>', 'mask': '<mask>'}
# The parts of tokenizer.json that decide the ids of a text (`fingerprint`).
_ID_PARTS = ('added_tokens', 'normalizer', 'pre_tokenizer', 'model')


class HFTokenizer(Tokenizer):
  """A `tokenizer.json` (byte-level BPE, Unigram, WordPiece) or RoBERTa's `vocab.json` +
  `merges.txt`, given as the file or its directory; special tokens and casing are its own."""

  def __init__(self, path: str):
    self.tokenizer_file = _pipeline_file(path)
    directory = fs.dirname(self.tokenizer_file)
    self.tokenizer_config = _read_config(directory)
    text = fs.read_text(self.tokenizer_file)
    if _is_pipeline(text):
      tok, defaults = _from_str(text), {}
    else:
      tok = _roberta_pipeline(self.tokenizer_file, self.tokenizer_config)
      defaults = ROBERTA_TOKENS
    tok.no_truncation()  # encode whole texts: featurizers cut them, and pre-training packs them
    tok.no_padding()
    spec = json.loads(tok.to_str())
    self.special_tokens = _roles(self.tokenizer_config, spec, defaults, self.tokenizer_file)
    self._tok = tok
    # The type id the tokenizer's own pair template gives the second text: 1 for BERT's,
    # 0 for RoBERTa's and ModernBERT's (a RoBERTa has one token type: 1 would not embed).
    self.pair_type_id = max(tok.encode('a', 'b').type_ids, default=0)
    self._pair_separator = _pair_separator(tok)
    self._fingerprint = hashlib.sha256(json.dumps(
        {k: spec.get(k) for k in _ID_PARTS}, sort_keys=True).encode('utf-8')).hexdigest()
    self._specials = {t['content'] for t in spec['added_tokens'] if t['special']}
    self._continuation, self._word_prefix = _word_convention(spec)
    # A pipeline that marks a word by the space before it ('Ġ', or '▁' from a normaliser)
    # and adds none at a text's start: a sentence's first word reads as in running text
    # (and starts a word for whole-word masking) only with that space before it.
    first = tok.encode('a b', add_special_tokens=False).tokens[:1]
    if self._word_prefix and first and not first[0].startswith(self._word_prefix):
      self.running_text_prefix = ' '
    ids = tok.get_vocab(with_added_tokens=True)
    vocab = [''] * (max(ids.values()) + 1)  # '': an id no token has (gaps are rare)
    for token, i in ids.items():
      vocab[i] = token
    super().__init__(vocab, self.special_tokens,
                     reserved=[t['id'] for t in spec['added_tokens'] if t['special']])
    self._ids.pop('', None)
    self.do_lower_case = spm_is_uncased(tok, self.vocab)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def encode_words(self, words: Sequence[str]) -> list[list[int]]:
    """Each word of a pre-split sentence as `AutoTokenizer(words, is_split_into_words=True,
    add_prefix_space=True)` encodes it: each word pre-tokenized alone (`is_pretokenized`) and,
    where the pipeline marks a word by the space before it but puts none before a text
    (`running_text_prefix`: byte-level BPE's 'Ġ'), after that space, so 'You' reads 'ĠYou' as
    mid-sentence, not 'Y ou'. HF's run_ner.py loads byte-level tokenizers with
    add_prefix_space=True (transformers 4's PreTrainedTokenizerFast and RobertaTokenizer turn it
    into the ByteLevel pre-tokenizer's flag; 5's generic TokenizersBackend ignores it). A
    normaliser's space (Gemma's '▁') gets the same space: AutoTokenizer has no flag for it, and
    unmarked words are ids the model never saw mid-sentence."""
    if not words:
      return []
    enc = self._tok.encode([self.running_text_prefix + w for w in words], is_pretokenized=True,
                           add_special_tokens=False)
    out = [[] for _ in words]
    for i, word in zip(enc.ids, enc.word_ids):
      out[word].append(i)
    return out

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids, each token's [start, end) characters in `text`) as `AutoTokenizer`'s
    offset_mapping gives them: the post-processor runs (RoBERTa's trims the 'Ġ' space off
    a span) and only the text's own tokens are kept."""
    enc = self._tok.encode(text, add_special_tokens=True)
    keep = [i for i, s in enumerate(enc.sequence_ids) if s == 0]
    return [enc.ids[i] for i in keep], [tuple(enc.offsets[i]) for i in keep]

  @property
  def pair_separator(self) -> tuple[int, ...]:
    return self._pair_separator or (self.sep_id,)

  def detokenize(self, pieces: Sequence[str]) -> str:
    """Tokens back to text with the pipeline's own decoder ('Ġ' and byte-level bytes, '▁',
    '##'), for answer spans: joining pieces as WordPiece's or SentencePiece's would leave
    byte-level BPE's 'Ġ' and escaped bytes in the text."""
    if self._tok.decoder is not None:
      return self._tok.decoder.decode(list(pieces))
    text = ''.join(pieces)  # no decoder: at least '▁' (a normaliser's space) back to ' '
    return text.replace(METASPACE, ' ') if self._word_prefix == METASPACE else text

  def is_word_start(self, ids: np.ndarray) -> np.ndarray:
    """The table's answer, and the first token of a text (`ids` of one text) starts a word
    too: a byte-level BPE without a prefix space encodes "Hello" at the start as `Hello`."""
    starts = super().is_word_start(ids)
    if starts.ndim == 1 and starts.size:
      starts[0] = True
    return starts

  def _starts_word(self, token: str) -> bool:
    if token in self._specials:
      return True
    if self._continuation:
      return not token.startswith(self._continuation)
    return token.startswith(self._word_prefix) if self._word_prefix else True

  @property
  def fingerprint(self) -> str:
    """sha256 of the parts of tokenizer.json that decide ids (model, normaliser,
    pre-tokenizer, added tokens) as this `tokenizers` version writes them: not the
    post-processor (`encode` adds no special tokens) nor the file's formatting."""
    return self._fingerprint

  def save_pretrained(self, path: str) -> None:
    """tokenizer.json (our pair template, after the source's offset trimming) +
    tokenizer_config.json + special_tokens_map.json: `AutoTokenizer.from_pretrained(path)`
    loads it with the same ids, offsets and special tokens.
    model_input_names are the source's (ModernBERT's: no token_type_ids), else
    token_type_ids only where the source's pairs have a second type (`pair_type_id`)."""
    from tokenizers import processors  # pylint: disable=g-import-not-at-top
    tok = _from_str(self._tok.to_str())
    roles = self.special_tokens
    cls, sep = roles['cls'], roles['sep']
    between = [self.id_to_token(i) for i in self.pair_separator]
    template = processors.TemplateProcessing(
        single=[cls, '$A', sep],
        pair=[cls, '$A', *between, f'$B:{self.pair_type_id}', f'{sep}:{self.pair_type_id}'],
        special_tokens=sorted({(cls, self.cls_id), (sep, self.sep_id),
                               *((t, self.token_to_id(t)) for t in between)}))
    trimming = _offset_trimming(json.loads(tok.to_str()).get('post_processor'))
    tok.post_processor = template if trimming is None else processors.Sequence(
        [processors.ByteLevel(**trimming), template])
    specials = {f'{role}_token': roles[role] for role in ROLES if role in roles}
    config = self.tokenizer_config
    specials.update({k: _content(config[k]) for k in ('bos_token', 'eos_token')
                     if _content(config.get(k))})
    added = json.loads(tok.to_str())['added_tokens']
    saved = dict(
        tokenizer_class='PreTrainedTokenizerFast', clean_up_tokenization_spaces=False,
        model_input_names=config.get('model_input_names', [
            'input_ids', *['token_type_ids'] * bool(self.pair_type_id), 'attention_mask']),
        added_tokens_decoder={str(t['id']): {k: v for k, v in t.items() if k != 'id'}
                              for t in added},
        **specials)
    if 'model_max_length' in config:
      saved['model_max_length'] = config['model_max_length']
    fs.makedirs(path)
    fs.write_text(fs.join(path, 'tokenizer.json'), tok.to_str())
    fs.write_text(fs.join(path, 'tokenizer_config.json'), json.dumps(saved, indent=2))
    fs.write_text(fs.join(path, 'special_tokens_map.json'), json.dumps(specials, indent=2))


def _offset_trimming(processor: dict | None) -> dict | None:
  """The offset trimming of a post-processor (RoBERTa's `RobertaProcessing` and a ByteLevel
  step: a token's span starts after its 'Ġ' space, `trim_offsets`) as a ByteLevel
  post-processor's arguments, or None where it trims none. The export runs that step before
  its template, so its offset_mapping (which run_qa.py reads answers by) stays the source's."""
  steps = [processor or {}]
  steps += steps[0].get('processors') or []
  for p in steps:
    if p.get('type') in ('RobertaProcessing', 'ByteLevel') and p.get('trim_offsets'):
      return {'add_prefix_space': p.get('add_prefix_space', True), 'trim_offsets': True}
  return None


def _pair_separator(tok) -> tuple[int, ...]:
  """The special ids the pipeline's own pair template puts between its two texts (`</s></s>`
  for RoBERTa's); () when it puts none (no post-processor): then BERT's one separator."""
  enc = tok.encode('a', 'b', add_special_tokens=True)
  seqs = enc.sequence_ids
  if 0 not in seqs or 1 not in seqs:
    return ()
  last_a = max(i for i, s in enumerate(seqs) if s == 0)
  first_b = seqs.index(1)
  return tuple(enc.ids[last_a + 1:first_b])


def _from_str(text: str):
  from tokenizers import Tokenizer as Pipeline  # pylint: disable=g-import-not-at-top
  return Pipeline.from_str(text)


def _is_pipeline(text: str) -> bool:
  """A tokenizer.json (a whole pipeline: it has a model), not a vocab.json (token -> id)."""
  data = json.loads(text)
  return isinstance(data.get('model'), dict)


def _pipeline_file(path: str) -> str:
  """The tokenizer.json or vocab.json `path` is, or holds (tokenizer.json first)."""
  if fs.isdir(path):
    for name in ('tokenizer.json', 'vocab.json'):
      if fs.exists(fs.join(path, name)):
        return fs.join(path, name)
    raise FileNotFoundError(f'{path}: no tokenizer.json or vocab.json + merges.txt')
  if not fs.exists(path):
    raise FileNotFoundError(f'tokenizer {path}: no such file')
  return path


def _read_config(directory: str) -> dict:
  """tokenizer_config.json, with special_tokens_map.json filling in the keys it lacks."""
  config = {}
  for name in reversed(CONFIG_FILES):
    file = fs.join(directory, name)
    if fs.exists(file):
      config.update(json.loads(fs.read_text(file)))
  return config


def _content(value) -> str | None:
  """A special token as the config files write it: a string or an AddedToken's dict."""
  if isinstance(value, dict):
    return value.get('content')
  return value if isinstance(value, str) and value else None


def _roberta_pipeline(vocab_file: str, config: dict):
  """RoBERTa's `vocab.json` + `merges.txt` as transformers 5's `RobertaTokenizer` builds
  them into a pipeline: byte-level BPE (`add_prefix_space` from the config, default False),
  its special tokens added as special tokens. (transformers 4 also let `<mask>` take the
  space before it, as roberta-base's own tokenizer.json does: that changes only a text that
  holds a literal `<mask>`.)"""
  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken, Tokenizer as Pipeline, decoders, pre_tokenizers, processors
  from tokenizers.models import BPE
  merges_file = fs.join(fs.dirname(vocab_file), 'merges.txt')
  if not fs.exists(merges_file):
    raise FileNotFoundError(f'{vocab_file}: no merges.txt beside it (RoBERTa\'s byte-level BPE '
                            'is vocab.json + merges.txt)')
  vocab = json.loads(fs.read_text(vocab_file))
  merges = []
  for n, line in enumerate(fs.read_text(merges_file).split('\n')):
    if not line or line.startswith('#version'):
      continue
    pair = tuple(line.split(' '))
    if len(pair) != 2:
      raise ValueError(f'{merges_file}:{n + 1}: {line!r} is not a pair of tokens')
    merges.append(pair)
  tok = Pipeline(BPE(vocab, merges, continuing_subword_prefix='', end_of_word_suffix='',
                     fuse_unk=False))
  prefix_space = bool(config.get('add_prefix_space', False))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
  tok.decoder = decoders.ByteLevel()
  names = {role: _content(config.get(keys[0])) or _content(config.get(keys[-1]))
           or ROBERTA_TOKENS[role] for role, keys in ROLE_KEYS.items()}
  extra = [_content(t) for t in config.get('additional_special_tokens', [])]
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in [*names.values(), *extra] if t and t in vocab])
  if names['cls'] in vocab and names['sep'] in vocab:
    tok.post_processor = processors.RobertaProcessing(
        (names['sep'], vocab[names['sep']]), (names['cls'], vocab[names['cls']]),
        add_prefix_space=prefix_space)
  return tok


def _roles(config: dict, spec: dict, defaults: dict, source: str) -> dict[str, str]:
  """Role -> token from the config files, else the pipeline, else `defaults` (module doc)."""
  roles, pipeline = {}, _pipeline_roles(spec)
  for role, keys in ROLE_KEYS.items():
    name = next((_content(config.get(k)) for k in keys if _content(config.get(k))), None)
    name = name or pipeline.get(role) or defaults.get(role)
    if name and (role != 'unk' or name in _vocab_tokens(spec)):
      roles[role] = name  # an unk the vocabulary lacks: none (byte-level BPE needs none)
  missing = [r for r in ROLES if r not in roles and r != 'unk']
  if missing:
    raise ValueError(
        f'{source}: no {", ".join(missing)} token: name it in tokenizer_config.json ('
        f'{", ".join(ROLE_KEYS[r][0] for r in missing)}); the tokenizer\'s files do not say')
  return roles


def _vocab_tokens(spec: dict) -> set[str]:
  vocab = spec['model']['vocab']
  tokens = {v[0] for v in vocab} if isinstance(vocab, list) else set(vocab)
  return tokens | {t['content'] for t in spec['added_tokens']}


def _pipeline_roles(spec: dict) -> dict[str, str]:
  """Roles tokenizer.json itself names (its post-processor, model, padding, special tokens)."""
  found = {}
  processors = [spec.get('post_processor') or {}]
  processors += processors[0].get('processors') or []
  for p in processors:
    if 'cls' in p and 'sep' in p:  # RobertaProcessing, BertProcessing: [token, id]
      found.setdefault('cls', p['cls'][0])
      found.setdefault('sep', p['sep'][0])
    elif p.get('type') == 'TemplateProcessing':  # [cls] $A [sep]: the tokens around A
      single = p['single']
      seq = next((i for i, x in enumerate(single) if 'Sequence' in x), len(single))
      names = [(i, x['SpecialToken']['id']) for i, x in enumerate(single) if 'SpecialToken' in x]
      token = lambda name: (p.get('special_tokens', {}).get(name, {}).get('tokens') or [name])[0]
      before = [token(n) for i, n in names if i < seq]
      after = [token(n) for i, n in names if i > seq]
      if before:
        found.setdefault('cls', before[-1])
      if after:
        found.setdefault('sep', after[0])
  model = spec['model']
  if model.get('unk_token'):
    found['unk'] = model['unk_token']
  elif model.get('type') == 'Unigram' and model.get('unk_id') is not None:
    found['unk'] = model['vocab'][model['unk_id']][0]
  if (spec.get('padding') or {}).get('pad_token'):
    found['pad'] = spec['padding']['pad_token']
  for t in spec['added_tokens']:
    name = t['content'].strip('[]<>').lower()
    if t['special'] and name in ('pad', 'mask', 'unk'):
      found.setdefault(name, t['content'])
  return found


def _steps(step: dict | None, key: str) -> list[dict]:
  """A normaliser's or pre-tokenizer's steps, a Sequence's flattened."""
  if not step:
    return []
  return [x for sub in step.get(key) or [] for x in _steps(sub, key)] or [step]


def _word_convention(spec: dict) -> tuple[str, str]:
  """(continuation prefix, word prefix): WordPiece's `##` marks a piece that continues a
  word; else byte-level BPE's 'Ġ' or Metaspace's '▁' marks one that starts a word. Neither
  (a pipeline that splits words some other way): every token counts as a word start."""
  if spec['model'].get('continuing_subword_prefix'):
    return spec['model']['continuing_subword_prefix'], ''
  for p in _steps(spec.get('pre_tokenizer'), 'pretokenizers'):
    if p.get('type') == 'ByteLevel':
      return '', BYTE_LEVEL_SPACE
    if p.get('type') == 'Metaspace':
      return '', p.get('replacement', METASPACE)
  for p in _steps(spec.get('normalizer'), 'normalizers'):  # Gemma's, Llama's: ' ' -> '▁'
    if p.get('type') == 'Replace' and p.get('pattern') == {'String': ' '}:
      return '', p['content']
  return '', ''
