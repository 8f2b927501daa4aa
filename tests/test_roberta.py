"""RoBERTa and XLM-R (`arch='roberta'` / `'xlm-roberta'`) against transformers' classes (random
weights, float32, right-padded rows, real tokens compared), their HF exports, and a RoBERTa
directory as a start point for fine-tuning and continued pre-training."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from bert_jax.convert import hf, hf_heads, hf_roberta, loaders, start_points
from bert_jax.convert import sentence_transformers_export as st
from bert_jax.model import encoder, heads
from bert_jax.model.encoder import BertConfig, BertForPreTraining
from bert_jax.pretrain import run as pretrain_run, step as pretrain_step
from bert_jax.training import run_setup
from configs import bert_tiny
from tests.hf_reference import random_params, randomize, state_dict
from tests.tolerance import assert_trees_close

PAD = 1  # RoBERTa's and XLM-R's <pad>: positions start at PAD + 1
LENGTH = 24
SMALL = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=LENGTH + PAD + 1, type_vocab_size=1,
             layer_norm_eps=1e-5, pad_token_id=PAD, attn_implementation='eager')
# XLM-R: a larger vocabulary on a tiny width.
XLMR = dict(SMALL, vocab_size=8000, hidden_size=32, num_attention_heads=2, intermediate_size=64)
FAMILIES = {'roberta': (transformers.RobertaConfig, SMALL),
            'xlm-roberta': (transformers.XLMRobertaConfig, XLMR)}
RTOL = 1e-5  # of the largest reference value; the bar is 1e-4 in float32


def hf_model(cls=transformers.RobertaForMaskedLM, family='roberta', seed=0, **extra):
  config_cls, fields = FAMILIES[family]
  torch.manual_seed(seed)
  return randomize(cls(config_cls(**fields, **extra))).eval()


def rows(vocab_size, batch=3, length=LENGTH, seed=0):
  """Ids (no <pad> among the real tokens) and a mask; rows end in 0, 5, 10 pads."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab_size, (batch, length))
  mask = np.ones((batch, length), np.int64)
  for b in range(batch):
    mask[b, length - 5 * b:] = 0
  return np.where(mask == 1, ids, PAD), mask


def torch_out(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 output_hidden_states=True)


def our_config(model, scan=True) -> BertConfig:
  return hf.config_from_hf(model.config.to_dict()).replace(scan_layers=scan)


def real(x, mask):
  return np.asarray(x)[mask.astype(bool)]


@pytest.mark.parametrize('family,scan', [('roberta', True), ('roberta', False),
                                         ('xlm-roberta', True)])
def test_encoder_and_masked_lm_match_hf(family, scan):
  cls = {'roberta': transformers.RobertaForMaskedLM,
         'xlm-roberta': transformers.XLMRobertaForMaskedLM}[family]
  model = hf_model(cls, family)
  cfg = our_config(model, scan)
  assert (cfg.arch, cfg.position_offset, cfg.type_vocab_size) == (family, 2, 1)
  params = hf.params_from_hf(state_dict(model), cfg, source='hf')
  assert 'pooler' not in params and 'nsp' not in params
  ids, mask = rows(cfg.vocab_size)
  ref = torch_out(model, ids, mask)
  # Our pipeline's segment ids mark a second segment: one token type ignores them, as HF's
  # RoBERTa tokenizer (all zeros) does.
  segments = (np.arange(LENGTH) >= LENGTH // 2).astype(np.int32)[None].repeat(3, 0)
  got = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask),
      jnp.asarray(segments))
  assert_trees_close(real(got.sequence_output, mask), real(ref.hidden_states[-1], mask), RTOL)
  assert_trees_close(real(got.mlm_logits, mask), real(ref.logits, mask), RTOL)
  assert got.pooled_output is None and got.nsp_logits is None


def test_preset_is_roberta_base_shaped():
  cfg = BertConfig.from_preset('base', arch='roberta', vocab_size=50265)
  want = transformers.RobertaConfig(vocab_size=50265, max_position_embeddings=514,
                                    type_vocab_size=1, layer_norm_eps=1e-5)
  assert hf.config_from_hf(want.to_dict()) == cfg
  assert cfg.max_length == 512 and BertConfig().position_offset == 0


HEAD_CASES = [
    (heads.SEQUENCE, transformers.RobertaForSequenceClassification, dict(num_labels=3)),
    (heads.TOKEN, transformers.RobertaForTokenClassification, dict(num_labels=5)),
    (heads.SPAN, transformers.RobertaForQuestionAnswering, {}),
    (heads.MULTIPLE_CHOICE, transformers.RobertaForMultipleChoice, {}),
]


@pytest.mark.parametrize('task,cls,head_kw', HEAD_CASES,
                         ids=['sequence', 'token', 'span', 'choice'])
def test_task_heads_match_hf_and_export_their_keys(task, cls, head_kw):
  model = hf_model(cls, **head_kw)
  cfg = our_config(model)
  head = heads.Head(task, **head_kw)
  params = hf_heads.finetuned_from_hf(state_dict(model), cfg, head, 'hf')
  ids, mask = rows(cfg.vocab_size, batch=4)
  if task == heads.MULTIPLE_CHOICE:
    ids, mask = ids.reshape(2, 2, LENGTH), mask.reshape(2, 2, LENGTH)
  out = jax.jit(heads.build_model(cfg, head).apply)({'params': params}, jnp.asarray(ids),
                                                    jnp.asarray(mask))
  ref = torch_out(model, ids, mask)
  if task == heads.SPAN:
    got, want = (out.start_logits, out.end_logits), (ref.start_logits, ref.end_logits)
  else:
    got, want = out, ref.logits
  if task in (heads.TOKEN, heads.SPAN):
    got, want = (jax.tree_util.tree_map(lambda x: real(x, mask), t) for t in (got, want))
  assert_trees_close(got, jax.tree_util.tree_map(np.asarray, want), RTOL)
  back = hf_heads.finetuned_to_hf(params, cfg, head)
  assert set(back) == set(state_dict(model))


@pytest.mark.parametrize('arch,vocab', [('roberta', 1000), ('xlm-roberta', 8000)])
def test_export_loads_in_transformers_and_as_a_start_point(arch, vocab, tmp_path):
  cfg = BertConfig.from_preset('tiny', arch=arch, vocab_size=vocab, scan_layers=False,
                               max_position_embeddings=LENGTH + 2)
  params = random_params(encoder.init_params, cfg)
  out = hf.save_pretrained(str(tmp_path / 'export'), cfg, params)
  config = json.loads((tmp_path / 'export' / 'config.json').read_text())
  name = hf_roberta.CLASS_PREFIX[arch] + 'ForMaskedLM'
  assert (config['model_type'], config['architectures']) == (arch, [name])
  model, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert type(model).__name__ == name
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  ids, mask = rows(vocab)
  want = torch_out(model.eval(), ids, mask).logits
  got = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask))
  assert_trees_close(real(got.mlm_logits, mask), real(want, mask), RTOL)

  start = start_points.load_start_point(out, require_tokenizer=False, scan_layers=False)
  assert start.kind == loaders.HF_DIR and start.cfg == cfg and start.tokenizer is None
  assert_trees_close(start.params, params, 0.0)


def test_finetuned_export_loads_in_transformers_and_back_as_a_start_point(tmp_path):
  cfg = BertConfig.from_preset('tiny', arch='roberta', vocab_size=1000,
                               max_position_embeddings=LENGTH + 2)
  head = heads.Head(heads.SEQUENCE, num_labels=3, labels=('a', 'b', 'c'))
  params = random_params(heads.init_params, cfg, head, seed=1)
  assert set(params) == {'embeddings', 'encoder', 'classifier'}
  out = hf_heads.save_finetuned(str(tmp_path / 'cls'), cfg, head, params)
  model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, output_loading_info=True)
  assert type(model).__name__ == 'RobertaForSequenceClassification'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  ids, mask = rows(cfg.vocab_size)
  want = torch_out(model.eval(), ids, mask).logits
  got = heads.build_model(cfg, head).apply({'params': params}, jnp.asarray(ids),
                                           jnp.asarray(mask))
  assert_trees_close(got, np.asarray(want), RTOL)

  start = start_points.load_start_point(out, require_tokenizer=False)
  assert start.head == head
  again_head, again = start_points.init_head_params(start)
  assert again_head == head
  assert_trees_close(again, params, 0.0)


@pytest.fixture(scope='module')
def roberta_dir(tmp_path_factory):
  """A RobertaForMaskedLM as transformers saves it (lm_head, tied decoder), of a size our
  `tiny` preset with arch=roberta builds, plus the pooler roberta-base's release carries; no
  tokenizer."""
  cfg = BertConfig.from_preset('tiny', arch='roberta', vocab_size=1000)
  fields = {k: v for k, v in hf_roberta.config_to_hf(cfg).items()
            if k not in ('architectures', 'model_type')}
  torch.manual_seed(0)
  model = randomize(transformers.RobertaForMaskedLM(transformers.RobertaConfig(**fields)))
  path = tmp_path_factory.mktemp('roberta')
  model.save_pretrained(str(path))
  file = str(path / 'model.safetensors')
  pooler = {'roberta.pooler.dense.weight': np.full((cfg.hidden_size,) * 2, 0.01, np.float32),
            'roberta.pooler.dense.bias': np.full((cfg.hidden_size,), 0.02, np.float32)}
  safetensors.numpy.save_file({**safetensors.numpy.load_file(file), **pooler}, file,
                              metadata={'format': 'pt'})
  return str(path), cfg, model


def test_roberta_directory_is_a_start_point_for_fine_tuning(roberta_dir):
  path, cfg, model = roberta_dir
  start = start_points.load_start_point(path, require_tokenizer=False)
  assert start.cfg == cfg and start.head is None
  lm_head = {k: v for k, v in state_dict(model).items() if k.startswith('lm_head.')}
  assert_trees_close(start.params['mlm_output_bias'], lm_head['lm_head.bias'], 0.0)
  assert_trees_close(start.params['mlm_transform']['kernel'], lm_head['lm_head.dense.weight'].T,
                     0.0)
  head, params = start_points.init_head_params(start, heads.Head(heads.SEQUENCE, num_labels=2))
  assert set(params) == {'embeddings', 'encoder', 'classifier'}
  assert set(params['classifier']) == {'dense', 'out_proj'}
  _, choice = start_points.init_head_params(start, heads.Head(heads.MULTIPLE_CHOICE))
  assert set(choice) == {'embeddings', 'encoder', 'pooler', 'classifier'}
  np.testing.assert_array_equal(choice['pooler']['bias'], np.float32(0.02))  # the released one
  del start.params['pooler']  # an MLM checkpoint without one: fresh, as HF initialises it
  _, choice = start_points.init_head_params(start, heads.Head(heads.MULTIPLE_CHOICE))
  assert choice['pooler']['kernel'].shape == (cfg.hidden_size,) * 2


def test_roberta_start_point_for_continued_pretraining(roberta_dir):
  """As train.init_from: a run config with model.arch=roberta builds the checkpoint's model;
  its MLM head is the released lm_head; NSP/SOP and another arch are refused."""
  path, cfg, model = roberta_dir
  config = bert_tiny.get_config()
  config.model.update(arch='roberta', vocab_size=1000, scan_layers=True)
  config.data.sentence_objective = 'none'
  run_cfg = run_setup.model_config(config)
  assert run_cfg == cfg.replace(attention_impl=run_cfg.attention_impl)
  step, params = start_points.pretraining_params(path, run_cfg, data=config.data)
  assert step == 0 and set(params) == {'embeddings', 'encoder', 'mlm_transform',
                                       'mlm_layer_norm', 'mlm_output_bias'}
  ids, mask = rows(cfg.vocab_size)
  want = torch_out(model.eval(), ids, mask).logits
  got = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask))
  assert_trees_close(real(got.mlm_logits, mask), real(want, mask), RTOL)

  for objective in ('nsp', 'sop'):
    config.data.sentence_objective = objective
    with pytest.raises(ValueError, match='sentence_objective=none'):
      start_points.pretraining_params(path, run_cfg, data=config.data)
  with pytest.raises(ValueError, match='model.arch=roberta'):
    start_points.pretraining_params(path, BertConfig.from_preset('tiny', vocab_size=1000))


def test_pretraining_refuses_rows_past_the_position_table(tmp_path):
  """RoBERTa's positions start at pad + 1 = 2: its 514 rows hold 512 tokens. Pre-training at
  data.max_seq_length=514 is refused at setup (the objective that training, eval and AOT
  build), naming the fields and the fix, by fine-tuning's check; 512 builds. BERT's 512 rows
  hold 512 tokens."""
  config = bert_tiny.get_config()
  config.model.update(arch='roberta', vocab_size=1000)
  config.data.sentence_objective = 'none'
  config.data.max_seq_length = 514
  with pytest.raises(ValueError, match=(
      r"data.max_seq_length=514 exceeds the 512 tokens model.size=tiny model.arch=roberta's "
      r'position embeddings hold, max_position_embeddings=514, positions from 2; write the '
      r'data with create_pretraining_data --max_seq_length=512 \(or less\) and set '
      r'--config.data.max_seq_length to it')):
    pretrain_run.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run' / 'config.json').exists()
  config.data.max_seq_length = 512
  assert pretrain_step.objective(config).model_cfg.max_length == 512
  config.model.arch = 'bert'
  config.data.max_seq_length = 513
  with pytest.raises(ValueError, match=r'exceeds the 512 tokens .*max_position_embeddings=512; '):
    pretrain_step.objective(config)


def test_non_roberta_checkpoints_are_refused_clearly():
  fields = dict(transformers.RobertaConfig(**SMALL).to_dict())
  with pytest.raises(hf.CheckpointError, match='only "gelu"'):
    hf.config_from_hf({**fields, 'hidden_act': 'gelu_new'})
  with pytest.raises(hf.CheckpointError, match='is_decoder'):
    hf.config_from_hf({**fields, 'is_decoder': True})
  with pytest.raises(hf.CheckpointError, match='no transformers RoBERTa class'):
    hf_roberta.config_to_hf(BertConfig.from_preset('tiny', arch='roberta', mlp='glu'))


def test_sentence_transformers_export_is_a_roberta_model(tmp_path):
  cfg = BertConfig.from_preset('tiny', arch='roberta', vocab_size=1000,
                               max_position_embeddings=LENGTH + 2)
  params = random_params(encoder.init_params, cfg)
  no_files = types.SimpleNamespace(save_pretrained=lambda directory: None)
  out = st.save_sentence_transformer(str(tmp_path / 'st'), cfg, params, no_files)
  assert json.loads((tmp_path / 'st' / 'sentence_bert_config.json').read_text())[
      'max_seq_length'] == LENGTH
  model, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
  assert type(model).__name__ == 'RobertaModel' and not info['unexpected_keys'], info
  assert all(k.startswith('pooler.') for k in info['missing_keys']), info
  ids, mask = rows(cfg.vocab_size)
  want = torch_out(model.eval(), ids, mask).last_hidden_state
  got = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask))
  assert_trees_close(real(got.sequence_output, mask), real(want, mask), RTOL)
  start = start_points.load_start_point(out, require_tokenizer=False)
  assert_trees_close({k: start.params[k] for k in ('embeddings', 'encoder')},
                     {k: params[k] for k in ('embeddings', 'encoder')}, 0.0)
