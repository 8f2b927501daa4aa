"""Encoder families as objects (bert_jax/model/families.py, bert_jax/convert/hf_base.py): a
family added from this test module, without editing bert_jax, is a start point, fine-tunes
end to end through the run, and exports to a directory that loads back as its own family.

The toy family is BERT's block with positions offset by 3 (the first three rows of the position
table are never read) and an extra config.json field its converter reads and writes
(`toy_position_offset`); its HF side is the BERT-layout converter under a `toy.` prefix.
"""

from __future__ import annotations

import json
import random

import jax
import numpy as np
import pytest

from bert_jax.convert import bert_state_map, hf, hf_base, hf_bert, start_points
from bert_jax.finetune import results, run as finetune
from bert_jax.model import encoder, families, heads
from bert_jax.model.encoder import BertConfig
from configs import finetune as finetune_configs
from input_pipeline.tokenizer import WordPieceTokenizer
from tests.test_finetune import FILLER, SPECIALS, sentences

TOY = 'toybert'
OFFSET = 3

# Jitted: an eager Flax init or apply dispatches and compiles op by op.
init_params = jax.jit(encoder.init_params, static_argnums=0)
mlm_logits = jax.jit(lambda cfg, params, ids: encoder.BertForPreTraining(cfg).apply(
    {'params': params}, ids).mlm_logits, static_argnums=0)


def _config_to_hf(cfg: BertConfig, architecture: str = 'ToyBertForPreTraining') -> dict:
  return {'architectures': [architecture], 'model_type': TOY,
          **bert_state_map.config_fields(cfg), 'toy_position_offset': cfg.position_offset,
          'pad_token_id': 0, 'tie_word_embeddings': True}


def _config_from_hf(hf_config, source='config.json') -> BertConfig:
  return hf_base.bert_layout_config(hf_config, source, TOY, bert_state_map.ACT_FROM_HF,
                                    position_offset=hf_config['toy_position_offset'])


def _params_to_hf(params, cfg, prefix='toy.'):
  return hf_bert.params_to_hf(params, cfg, prefix)


def _params_from_hf(state, cfg, *, rng=None, source='checkpoint'):
  state = {bert_state_map.strip_prefix(k, 'toy.'): v for k, v in state.items()}
  return hf_bert.params_from_hf(state, cfg, rng=rng, source=source)


@pytest.fixture(scope='module', autouse=True)
def toy_family():
  """The family and its converter, registered as any user module would (`replace=True`: a
  worker that imports this module twice registers the same objects again)."""
  families.register(families.Family(TOY, dict(position_offset=OFFSET,
                                              max_position_embeddings=64 + OFFSET),
                                    sentence_head=True, pretrained_with='MLM and NSP'),
                    replace=True)
  hf_base.register(hf_base.Converter(
      family=TOY, model_types=(TOY,), class_prefix='ToyBert', encoder_prefix='toy.',
      pooler_prefix='toy.pooler.', mlm_prefixes=('cls.',), config_to_hf=_config_to_hf,
      config_from_hf=_config_from_hf, params_to_hf=_params_to_hf,
      params_from_hf=_params_from_hf), replace=True)


@pytest.fixture(scope='module')
def toy_start(tmp_path_factory) -> tuple[str, BertConfig, dict]:
  """One toy start point (its initialiser compiled once) for both tests: (path, cfg, params)."""
  tmp_path = tmp_path_factory.mktemp('toy')
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(SPECIALS + FILLER + ['good', 'great', 'bad', 'awful']) + '\n')
  tok = WordPieceTokenizer(str(vocab), do_lower_case=True)
  cfg = BertConfig.from_preset('tiny', arch=TOY, vocab_size=tok.vocab_size, num_layers=1)
  params = jax.tree_util.tree_map(np.asarray, init_params(cfg, jax.random.key(3)))
  path = hf.save_pretrained(str(tmp_path / 'toy_start'), cfg, params, tokenizer=tok)
  return path, cfg, params


def test_a_family_from_a_test_module_loads_as_itself(toy_start):
  path, cfg, params = toy_start
  with open(f'{path}/config.json') as f:
    stored = json.load(f)
  assert stored['model_type'] == TOY and stored['toy_position_offset'] == OFFSET
  assert stored['architectures'] == ['ToyBertForPreTraining']
  start = start_points.load_start_point(path)
  assert start.cfg == cfg and start.cfg.position_offset == OFFSET and start.cfg.max_length == 64
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, start.params, params))
  # The family's declaration is what the model computes: the same weights read as a BERT
  # (positions from row 0) give other outputs.
  ids = np.array([[2, 7, 8, 9, 3]], np.int32)
  toy = mlm_logits(cfg, params, ids)
  bert = mlm_logits(cfg.replace(arch='bert', position_offset=0), params, ids)
  assert float(np.max(np.abs(np.asarray(toy) - np.asarray(bert)))) > 1e-3


def test_a_family_from_a_test_module_fine_tunes_and_exports(toy_start, tmp_path):
  path, _, _ = toy_start
  rng = random.Random(0)
  files = {}
  for split, n in (('train', 128), ('dev', 32)):
    files[split] = tmp_path / f'{split}.tsv'
    files[split].write_text('sentence\tlabel\n' + ''.join(
        f'{text}\t{int(label)}\n' for text, label in sentences(rng, n)))
  c = finetune_configs.get_config('generic')
  c.init, c.data.train_file, c.data.dev_file = path, str(files['train']), str(files['dev'])
  c.data.text_a, c.data.label = 'sentence', 'label'
  c.data.max_seq_length, c.train.global_batch_size, c.train.num_epochs = 16, 16, 3
  c.optimizer.learning_rate = 1e-3
  out = finetune.run(c, str(tmp_path / 'run'))
  dev = results.split_headline(out, 'dev')
  assert dev['median'] > 0.8, dev  # learnt the sentiment words through the toy encoder
  export = out['runs'][0]['export']
  exported = json.loads((tmp_path / 'run' / 'hf_export' / 'config.json').read_text()
                        if (tmp_path / 'run' / 'hf_export' / 'config.json').exists()
                        else open(f'{export}/config.json').read())
  assert exported['architectures'] == ['ToyBertForSequenceClassification']
  assert exported['model_type'] == TOY and exported['toy_position_offset'] == OFFSET
  again = start_points.load_start_point(export)
  assert again.cfg.arch == TOY and again.cfg.position_offset == OFFSET
  assert again.head == heads.Head(heads.SEQUENCE, num_labels=2, labels=again.head.labels)
  assert again.head_params is not None and again.tokenizer is not None
