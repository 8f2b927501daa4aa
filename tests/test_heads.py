"""Fine-tuning heads: parity with transformers' PyTorch BertFor<Task> on the same random
weights, packed rows, bf16, sharding, and the HF export round trip for every head (multiple
choice at the end: [B, C, S] inputs, its loss, its export and HF start points).

Parity bound: max|ours - HF| <= 1e-5 * max(1, max|HF|). Both sides run float32, but XLA's and
PyTorch's CPU kernels sum in different orders (and differ between CPU kinds), so the outputs
agree to float32 round-off of the activations, whose scale is ~1 after every LayerNorm, not
bit for bit; the bound is that round-off, floored at the activations' scale.
"""

import functools
import os

import jax
import numpy as np
import pytest
import torch
import transformers

import hf_reference
from bert_jax.convert import hf, hf_heads, start_points
from bert_jax.finetune import kinds
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig
from bert_jax.training import sharding as shd
from input_pipeline.tokenizer import WordPieceTokenizer

# Jitted: an eager Flax init dispatches and compiles op by op, ~3x the time (same values).
head_init = jax.jit(heads.init_params, static_argnums=(0, 1))


@functools.cache
def random_encoder(cfg: BertConfig) -> dict:
  """`cfg`'s encoder (embeddings, layers, pooler) as transformers initialises it: no XLA
  compile, where heads.init_params compiles once per (config, head)."""
  return hf.params_from_hf(hf_reference.state_dict(hf_reference.torch_model(cfg)), cfg)


def fresh(cfg: BertConfig, head: heads.Head, seed: int) -> dict:
  """A model's params for tests that read its outputs, not its init: random_encoder(cfg)
  under a fresh `head` (heads.with_encoder, the fine-tuning start from an encoder)."""
  return heads.with_encoder(random_encoder(cfg), cfg, head, jax.random.key(seed))

VOCAB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'bert_uncased_vocab.txt')
CONFIGS = {
    'tiny': BertConfig.from_preset('tiny'),
    'base_width_2_layers': BertConfig.from_preset('base', num_layers=2),
}
HEADS = {
    'classification': heads.Head(heads.SEQUENCE, 3, labels=('neg', 'neu', 'pos')),
    'regression': heads.Head(heads.SEQUENCE, 1),
    'token': heads.Head(heads.TOKEN, 5, labels=('O', 'B-PER', 'I-PER', 'B-LOC', 'I-LOC')),
    'span': heads.Head(heads.SPAN),
}
HF_CLASSES = {heads.SEQUENCE: transformers.BertForSequenceClassification,
              heads.TOKEN: transformers.BertForTokenClassification,
              heads.SPAN: transformers.BertForQuestionAnswering}
AUTO_CLASSES = {heads.SEQUENCE: transformers.AutoModelForSequenceClassification,
                heads.TOKEN: transformers.AutoModelForTokenClassification,
                heads.SPAN: transformers.AutoModelForQuestionAnswering}


def parity_bound(reference: np.ndarray) -> float:
  return 1e-5 * max(1.0, float(np.max(np.abs(reference))))


def torch_head_model(cfg, head, seed=0):
  """HF BertFor<Task> in eval mode, every weight random (LayerNorms and biases included)."""
  torch.manual_seed(seed)
  hf_cfg = transformers.BertConfig(**{k: v for k, v in hf_heads.config_to_hf(cfg, head).items()
                                      if k not in ('architectures', 'model_type')})
  return hf_reference.randomize(HF_CLASSES[head.task](hf_cfg).eval())


def torch_logits(model, batch):
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(batch['input_ids']).long(),
                attention_mask=torch.from_numpy(batch['input_mask']).long(),
                token_type_ids=torch.from_numpy(batch['segment_ids']).long())
  if isinstance(model, transformers.BertForQuestionAnswering):
    return {'start_logits': out.start_logits.numpy(), 'end_logits': out.end_logits.numpy()}
  return {'logits': out.logits.numpy()}


def our_logits(cfg, head, params, batch, **extra):
  fn = jax.jit(lambda p, b: heads.build_model(cfg, head).apply(
      {'params': p}, b['input_ids'], b['input_mask'], b['segment_ids'], **extra))
  out = fn(params, {k: batch[k] for k in ('input_ids', 'input_mask', 'segment_ids')})
  if isinstance(out, heads.SpanLogits):
    return {'start_logits': np.asarray(out.start_logits), 'end_logits': np.asarray(out.end_logits)}
  return {'logits': np.asarray(out)}


def check_parity(ours, theirs, label):
  for key, ref in theirs.items():
    assert ours[key].shape == ref.shape, (key, ours[key].shape, ref.shape)
    assert ours[key].dtype == np.float32
    diff = float(np.max(np.abs(ours[key] - ref)))
    print(f'{label} {key}: max|diff|={diff:.3g} max|ref|={np.max(np.abs(ref)):.3g}')
    assert diff <= parity_bound(ref), (label, key, diff)


@pytest.mark.parametrize('size', list(CONFIGS))
@pytest.mark.parametrize('name', list(HEADS))
def test_head_logits_match_hf_pytorch(size, name):
  cfg, head = CONFIGS[size], HEADS[name]
  model = torch_head_model(cfg, head)
  params = hf_heads.finetuned_from_hf(hf_reference.state_dict(model), cfg, head)
  batch = hf_reference.random_batch(cfg)
  check_parity(our_logits(cfg, head, params, batch), torch_logits(model, batch), f'{size} {name}')


@pytest.mark.parametrize('name', ['classification', 'token'])
def test_unrolled_layers_match_scanned(name):
  cfg, head = CONFIGS['tiny'], HEADS[name]
  model = torch_head_model(cfg, head, seed=1)
  state = hf_reference.state_dict(model)
  batch = hf_reference.random_batch(cfg)
  scanned = our_logits(cfg, head, hf_heads.finetuned_from_hf(state, cfg, head), batch)
  flat_cfg = cfg.replace(scan_layers=False)
  flat = our_logits(flat_cfg, head, hf_heads.finetuned_from_hf(state, flat_cfg, head), batch)
  check_parity(flat, scanned, 'unrolled vs scanned')


def test_params_have_hf_layout_init_and_no_pooler_where_hf_has_none():
  cfg = CONFIGS['tiny']
  for name, head in HEADS.items():  # the layout of every head: shapes, not values (no compile)
    params = jax.eval_shape(lambda head=head: heads.init_params(cfg, head, jax.random.key(0)))
    groups = {'embeddings', 'encoder', heads.HEAD_PARAM[head.task]}
    assert set(params) == groups | ({'pooler'} if head.has_pooler else set()), name
    assert params[heads.HEAD_PARAM[head.task]]['kernel'].shape == (cfg.hidden_size,
                                                                   head.num_labels)
  # The values, from one wide head (every task head is made by heads._head_dense): zero bias
  # and HF's N(0, 0.02), not the encoder's truncated normal (std 0.0176, nothing beyond 0.04).
  wide = heads.Head(heads.TOKEN, 32)
  params = head_init(cfg, wide, jax.random.key(0))
  np.testing.assert_array_equal(params['classifier']['bias'], 0)
  kernel = np.ravel(params['classifier']['kernel'])
  assert 0.0185 < np.std(kernel) < 0.0215 and np.max(np.abs(kernel)) > 0.045
  torch_model = torch_head_model(cfg, HEADS['token'])
  n_hf = sum(p.numel() for p in torch_model.parameters())
  n_ours = sum(x.size for x in jax.tree_util.tree_leaves(
      jax.eval_shape(lambda: heads.init_params(cfg, HEADS['token'], jax.random.key(0)))))
  assert n_ours == n_hf


def test_fresh_head_on_a_pretrained_encoder_warns_and_keeps_the_encoder(caplog):
  cfg = CONFIGS['tiny']
  pre = hf.params_from_hf(hf_reference.state_dict(hf_reference.torch_model(cfg)), cfg)
  params = heads.with_encoder(pre, cfg, HEADS['classification'], jax.random.key(5))
  assert 'initialised fresh' in caplog.text and 'classifier' in caplog.text
  for group in ('embeddings', 'encoder', 'pooler'):
    jax.tree_util.tree_map(np.testing.assert_array_equal, params[group], pre[group])
  assert params['classifier']['kernel'].shape == (cfg.hidden_size, 3)
  token = heads.with_encoder(pre, cfg, HEADS['token'], jax.random.key(5))
  assert 'pooler' not in token


def test_packed_rows_give_each_instance_its_solo_logits():
  cfg = CONFIGS['tiny']
  rng = np.random.default_rng(0)
  lens, length = (10, 7, 6), 32
  solos = [rng.integers(5, cfg.vocab_size, n).astype(np.int32) for n in lens]
  ids, seg, pos, packed = (np.zeros((1, length), np.int32) for _ in range(4))
  starts = np.cumsum((0,) + lens[:-1])
  for k, (s, n, start) in enumerate(zip(solos, lens, starts)):
    ids[0, start:start + n], pos[0, start:start + n] = s, np.arange(n)
    seg[0, start + n // 2:start + n] = 1
    packed[0, start:start + n] = k + 1
  for name in ('classification', 'token', 'span'):
    head = HEADS[name]
    params = fresh(cfg, head, 1)
    model = heads.build_model(cfg, head)
    apply = lambda *a, **k: jax.tree_util.tree_map(np.asarray, jax.jit(model.apply)(*a, **k))
    extra = {'next_sentence_positions': starts[None]} if head.task == heads.SEQUENCE else {}
    out = apply({'params': params}, ids, None, seg, position_ids=pos,
                      packed_segment_ids=packed, **extra)
    # Each instance alone in its own row (the rows padded to the longest, masked): one call.
    alone_ids, alone_mask, alone_seg = (np.zeros((len(lens), max(lens)), np.int32)
                                        for _ in range(3))
    for k, (s, n) in enumerate(zip(solos, lens)):
      alone_ids[k, :n], alone_mask[k, :n], alone_seg[k, n // 2:n] = s, 1, 1
    alone = apply({'params': params}, alone_ids, alone_mask, alone_seg)
    for k, (n, start) in enumerate(zip(lens, starts)):
      if head.task == heads.SEQUENCE:
        np.testing.assert_allclose(out[0, k], alone[k], atol=1e-5)
      elif head.task == heads.TOKEN:
        np.testing.assert_allclose(out[0, start:start + n], alone[k, :n], atol=1e-5)
      else:
        np.testing.assert_allclose(out.start_logits[0, start:start + n],
                                   alone.start_logits[k, :n], atol=1e-5)
        np.testing.assert_allclose(out.end_logits[0, start:start + n], alone.end_logits[k, :n],
                                   atol=1e-5)


def test_bfloat16_compute_gives_float32_logits_near_float32():
  cfg = CONFIGS['tiny']
  batch = hf_reference.random_batch(cfg)
  for name in ('classification', 'token', 'span'):
    head = HEADS[name]
    params = fresh(cfg, head, 2)
    full = our_logits(cfg, head, params, batch)
    half = our_logits(cfg.replace(dtype='bfloat16'), head, params, batch)
    for key in full:
      assert half[key].dtype == np.float32
      diff = np.max(np.abs(half[key] - full[key]))
      assert 0 < diff < 0.05 * max(1.0, np.max(np.abs(full[key]))), (name, key, diff)


def test_dropout_applies_only_in_training():
  cfg = CONFIGS['tiny']
  head = HEADS['classification']
  params = fresh(cfg, head, 3)
  batch = hf_reference.random_batch(cfg)
  model = heads.build_model(cfg, head)
  args = (batch['input_ids'], batch['input_mask'], batch['segment_ids'])
  apply = jax.jit(model.apply, static_argnames='deterministic')
  eval_a = apply({'params': params}, *args)
  eval_b = apply({'params': params}, *args)
  train = apply({'params': params}, *args, deterministic=False,
                rngs={'dropout': jax.random.key(0)})
  np.testing.assert_array_equal(eval_a, eval_b)
  assert np.max(np.abs(train - eval_a)) > 1e-3


@pytest.mark.multi_device
def test_heads_shard_over_a_data_fsdp_tensor_mesh():
  cfg = CONFIGS['tiny']
  mesh = shd.make_mesh((2, 2, 2))
  rules = shd.DEFAULT_RULES
  batch = hf_reference.random_batch(cfg, batch=4)
  for name in ('classification', 'token', 'span'):
    head = HEADS[name]
    params = fresh(cfg, head, 4)
    specs = heads.logical_param_specs(cfg, head)
    shardings = shd.logical_to_sharding(specs, mesh, rules, params)
    sharded = jax.device_put(params, shardings)
    emb = sharded['embeddings']['word_embeddings']['embedding']
    assert emb.sharding.spec == jax.sharding.PartitionSpec('tensor', 'fsdp')
    model = heads.build_model(cfg, head)
    fn = jax.jit(lambda p, ids, m, s: model.apply({'params': p}, ids, m, s),
                 in_shardings=(shardings,) + (shd.batch_sharding(mesh),) * 3)
    with shd.activate(mesh, rules):
      out = fn(sharded, batch['input_ids'], batch['input_mask'], batch['segment_ids'])
    ref = jax.jit(model.apply)({'params': params}, batch['input_ids'], batch['input_mask'],
                               batch['segment_ids'])
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), out, ref)


@pytest.mark.parametrize('name', list(HEADS))
def test_export_loads_in_auto_model_with_labels_and_same_logits(tmp_path, name):
  cfg, head = CONFIGS['tiny'], HEADS[name]
  params = fresh(cfg, head, 6)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(0)  # non-trivial LayerNorms and biases: no mis-map can hide
  params = jax.tree_util.tree_unflatten(
      treedef, [np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(np.float32)
                for x in leaves])
  tok = WordPieceTokenizer(VOCAB, do_lower_case=True)
  path = hf_heads.save_finetuned(str(tmp_path / name), cfg, head, params, tokenizer=tok)

  model, info = AUTO_CLASSES[head.task].from_pretrained(path, output_loading_info=True)
  assert isinstance(model, HF_CLASSES[head.task])
  for kind in ('missing_keys', 'unexpected_keys', 'mismatched_keys', 'error_msgs'):
    assert not info[kind], (kind, info)
  model.eval()
  assert model.config.id2label == dict(enumerate(head.label_names))
  assert model.config.label2id == {n: i for i, n in enumerate(head.label_names)}
  if name == 'regression':
    assert model.config.problem_type == 'regression' and model.config.num_labels == 1
  batch = hf_reference.random_batch(cfg)
  ours, theirs = our_logits(cfg, head, params, batch), torch_logits(model, batch)
  for key in theirs:
    assert np.max(np.abs(ours[key] - theirs[key])) <= 1e-4, key

  hf_tok = transformers.AutoTokenizer.from_pretrained(path)
  text = 'Fine-tuning heads on BERT, exported.'
  assert hf_tok(text, add_special_tokens=False)['input_ids'] == tok.encode(text)

  start = start_points.load_start_point(path)
  assert start.head == head
  again_head, again = start_points.init_head_params(start)
  assert again_head == head
  jax.tree_util.tree_map(np.testing.assert_array_equal, again, params)


def test_export_refuses_to_overwrite_and_keeps_the_old_one(tmp_path):
  cfg, head = CONFIGS['tiny'], HEADS['token']
  params = fresh(cfg, head, 7)
  path = hf_heads.save_finetuned(str(tmp_path / 'out'), cfg, head, params)
  with pytest.raises(FileExistsError, match='overwrite=True'):
    hf_heads.save_finetuned(path, cfg, head, params)

  class BrokenTokenizer:  # a disk that fills up while the tokenizer is written
    pad_id, cls_id, sep_id = 0, 2, 3

    def save_pretrained(self, path):
      raise OSError('disk full')

  with pytest.raises(OSError, match='disk full'):
    hf_heads.save_finetuned(path, cfg, head, params, tokenizer=BrokenTokenizer(), overwrite=True)
  assert sorted(os.listdir(tmp_path)) == ['out']
  state = hf.read_weights(path)
  again = hf_heads.finetuned_from_hf(state, cfg, head)
  jax.tree_util.tree_map(np.testing.assert_array_equal, again, params)


def test_head_validation_errors_say_what_to_fix():
  with pytest.raises(ValueError, match='expected one of'):
    heads.Head('ner')
  with pytest.raises(ValueError, match='num_labels=2'):
    heads.Head(heads.SPAN, num_labels=3)
  with pytest.raises(ValueError, match='one name per label'):
    heads.Head(heads.SEQUENCE, 3, labels=('a', 'b'))
  with pytest.raises(ValueError, match='problem_type'):
    heads.Head(heads.TOKEN, 3, problem_type='regression')
  cfg, head = CONFIGS['tiny'], HEADS['classification']
  state = hf_heads.finetuned_to_hf(fresh(cfg, head, 0), cfg, head)
  with pytest.raises(hf.CheckpointError, match=r'classifier.weight has shape \(3, 128\).*id2label'):
    hf_heads.finetuned_from_hf(state, cfg, heads.Head(heads.SEQUENCE, 4))
  with pytest.raises(hf.CheckpointError, match='no qa_outputs.weight'):
    hf_heads.finetuned_from_hf(state, cfg, HEADS['span'])


# ----------------------------------------------------------------------------- multiple choice

MC = heads.Head(heads.MULTIPLE_CHOICE)


def choice_batch(cfg, questions=2, choices=4, length=32, seed=0):
  """[questions, choices, length] rows with different end padding, two segments."""
  flat = hf_reference.random_batch(cfg, batch=questions * choices, length=length, seed=seed)
  return {k: flat[k].reshape(questions, choices, -1)
          for k in ('input_ids', 'input_mask', 'segment_ids')}


def torch_choice_logits(model, batch, labels=None):
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(batch['input_ids']).long(),
                attention_mask=torch.from_numpy(batch['input_mask']).long(),
                token_type_ids=torch.from_numpy(batch['segment_ids']).long(),
                labels=None if labels is None else torch.from_numpy(labels).long())
  return out


@pytest.mark.parametrize('size', list(CONFIGS))
def test_multiple_choice_logits_and_loss_match_hf_pytorch(size):
  """BertForMultipleChoice on the same random weights: [B, C] logits (the requirement is
  <= 1e-4; the bound here is the float32 round-off one of the other heads) and the loss."""
  cfg = CONFIGS[size]
  torch.manual_seed(3)
  hf_cfg = transformers.BertConfig(**{k: v for k, v in hf_heads.config_to_hf(cfg, MC).items()
                                      if k not in ('architectures', 'model_type')})
  model = hf_reference.randomize(transformers.BertForMultipleChoice(hf_cfg).eval())
  params = hf_heads.finetuned_from_hf(hf_reference.state_dict(model), cfg, MC)
  assert set(params) == {'embeddings', 'encoder', 'pooler', 'classifier'}
  assert params['classifier']['kernel'].shape == (cfg.hidden_size, 1)
  assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == sum(
      p.numel() for p in model.parameters())
  batch = choice_batch(cfg)
  labels = np.array([2, 0])
  theirs = torch_choice_logits(model, batch, labels)
  ours = our_logits(cfg, MC, params, batch)
  assert ours['logits'].shape == (2, 4)
  check_parity(ours, {'logits': theirs.logits.numpy()}, f'{size} multiple choice')
  assert np.max(np.abs(ours['logits'] - theirs.logits.numpy())) <= 1e-4
  total, weight = kinds.get('multiple_choice').loss_sums(
      ours['logits'], {'labels': labels, 'label_weights': np.ones(2)})
  np.testing.assert_allclose(float(total / weight), float(theirs.loss), rtol=1e-5)


def test_multiple_choice_scores_each_choice_alone():
  """A choice's score does not depend on the other choices of its row, nor on their order."""
  cfg = CONFIGS['tiny']
  params = fresh(cfg, MC, 8)
  batch = choice_batch(cfg, questions=1, choices=3, seed=2)
  model = heads.build_model(cfg, MC)
  args = lambda b: (b['input_ids'], b['input_mask'], b['segment_ids'])
  apply = jax.jit(model.apply, static_argnames='deterministic')
  whole = apply({'params': params}, *args(batch))
  order = [2, 0, 1]
  shuffled = apply({'params': params}, *args({k: v[:, order] for k, v in batch.items()}))
  np.testing.assert_allclose(shuffled[0], whole[0, order], atol=1e-5)
  alone = apply({'params': params}, *args({k: v[:, 1:2] for k, v in batch.items()}))
  np.testing.assert_allclose(alone[0, 0], whole[0, 1], atol=1e-5)
  train = apply({'params': params}, *args(batch), deterministic=False,
                rngs={'dropout': jax.random.key(0)})
  assert np.max(np.abs(train - whole)) > 1e-4  # HF's dropout on the pooled output


def test_multiple_choice_export_and_hf_start_point_keep_the_classifier(tmp_path):
  """Our export loads in AutoModelForMultipleChoice with no missing key and the same logits;
  a BertForMultipleChoice saved by transformers itself (config.json with HF's default two
  labels) is a start point whose classifier comes along as the multiple-choice head."""
  cfg = CONFIGS['tiny']
  params = fresh(cfg, MC, 9)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(1)
  params = jax.tree_util.tree_unflatten(
      treedef, [np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(np.float32)
                for x in leaves])
  tok = WordPieceTokenizer(VOCAB, do_lower_case=True)
  path = hf_heads.save_finetuned(str(tmp_path / 'mc'), cfg, MC, params, tokenizer=tok)
  model, info = transformers.AutoModelForMultipleChoice.from_pretrained(
      path, output_loading_info=True)
  assert isinstance(model, transformers.BertForMultipleChoice)
  for kind in ('missing_keys', 'unexpected_keys', 'mismatched_keys', 'error_msgs'):
    assert not info[kind], (kind, info)
  model.eval()
  batch = choice_batch(cfg, seed=4)
  theirs = torch_choice_logits(model, batch).logits.numpy()
  diff = float(np.max(np.abs(our_logits(cfg, MC, params, batch)['logits'] - theirs)))
  print(f'export multiple choice: max|diff|={diff:.3g}')
  assert diff <= 1e-4
  start = start_points.load_start_point(path)
  assert start.head == MC
  _, again = start_points.init_head_params(start, MC)
  jax.tree_util.tree_map(np.testing.assert_array_equal, again, params)

  hf_dir = str(tmp_path / 'hf_saved')
  model.save_pretrained(hf_dir)  # transformers' own files
  tok.save_pretrained(hf_dir)
  start = start_points.load_start_point(hf_dir)
  assert start.head == MC
  np.testing.assert_array_equal(start.head_params['classifier']['kernel'],
                                model.classifier.weight.detach().numpy().T)
  _, from_hf = start_points.init_head_params(start, MC)
  again = our_logits(cfg, MC, from_hf, batch)['logits']
  assert np.max(np.abs(again - theirs)) <= 1e-4


def test_multiple_choice_head_validation():
  assert MC.num_labels == 1 and MC.has_pooler and MC.labels is None
  assert heads.Head(heads.SEQUENCE).num_labels == 2 and heads.Head(heads.SPAN).num_labels == 2
  with pytest.raises(ValueError, match=r'num_labels=1 \(one score per choice\), got 4; leave'):
    heads.Head(heads.MULTIPLE_CHOICE, num_labels=4)
  with pytest.raises(ValueError, match='no label names'):
    heads.Head(heads.MULTIPLE_CHOICE, labels=('a',))
  cfg = CONFIGS['tiny']
  state = hf_heads.finetuned_to_hf(fresh(cfg, HEADS['classification'], 0), cfg,
                                   HEADS['classification'])
  with pytest.raises(hf.CheckpointError, match=r'needs \(1, 128\); every BertForMultipleChoice'):
    hf_heads.finetuned_from_hf(state, cfg, MC)
