"""BERT's HF state-dict layout as key maps: which of our params each `bert.*` (or `roberta.*`)
tensor is, and how it is transposed, and the activation names. One place read by the
BERT-layout converters, hf_bert.py, hf_roberta.py (RoBERTa and XLM-R, the same layers under
another prefix) and hf_electra.py."""

from __future__ import annotations

import logging
from collections.abc import Callable

import jax
import numpy as np

from bert_jax.convert.hf_base import BERT_LAYOUT_FIELDS, CheckpointError
from bert_jax.model.encoder import BertConfig, init_params

Array = np.ndarray

# BERT-layout configs' hidden_act names (BERT, RoBERTa, ELECTRA) <-> ours.
ACT_FROM_HF = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh'}
ACT_TO_HF = {'gelu': 'gelu', 'gelu_tanh': 'gelu_new'}


def _linear(w: Array) -> Array:
  return w.T


def _layer_map(cfg: BertConfig) -> dict[str, tuple[tuple[str, ...], Callable, Callable]]:
  """HF key suffix in a layer -> (our path inside the layer, hf->ours, ours->hf)."""
  h, n, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
  same = (lambda x: x, lambda x: x)
  qkv_kernel = (lambda w: w.T.reshape(h, n, d), lambda k: k.reshape(h, h).T)
  qkv_bias = (lambda b: b.reshape(n, d), lambda b: b.reshape(h))
  out_kernel = (lambda w: w.T.reshape(n, d, h), lambda k: k.reshape(h, h).T)
  lin = (_linear, _linear)
  m = {}
  for name in ('query', 'key', 'value'):
    m[f'attention.self.{name}.weight'] = (('attention', name, 'kernel'), *qkv_kernel)
    m[f'attention.self.{name}.bias'] = (('attention', name, 'bias'), *qkv_bias)
  m['attention.output.dense.weight'] = (('attention', 'output', 'kernel'), *out_kernel)
  m['attention.output.dense.bias'] = (('attention', 'output', 'bias'), *same)
  m['intermediate.dense.weight'] = (('intermediate', 'kernel'), *lin)
  m['intermediate.dense.bias'] = (('intermediate', 'bias'), *same)
  m['output.dense.weight'] = (('output', 'kernel'), *lin)
  m['output.dense.bias'] = (('output', 'bias'), *same)
  for hf_ln, ours in (('attention.output.LayerNorm', 'attention_layer_norm'),
                      ('output.LayerNorm', 'output_layer_norm')):
    m[f'{hf_ln}.weight'] = ((ours, 'scale'), *same)
    m[f'{hf_ln}.bias'] = ((ours, 'bias'), *same)
  return m


def _top_map() -> dict[str, tuple[tuple[str, ...], Callable, Callable]]:
  """Full HF key (without the `bert.` prefix) -> (our path, hf->ours, ours->hf)."""
  same = (lambda x: x, lambda x: x)
  lin = (_linear, _linear)
  m = {
      'embeddings.word_embeddings.weight': (('embeddings', 'word_embeddings', 'embedding'), *same),
      'embeddings.position_embeddings.weight':
          (('embeddings', 'position_embeddings', 'embedding'), *same),
      'embeddings.token_type_embeddings.weight':
          (('embeddings', 'token_type_embeddings', 'embedding'), *same),
      'embeddings.LayerNorm.weight': (('embeddings', 'layer_norm', 'scale'), *same),
      'embeddings.LayerNorm.bias': (('embeddings', 'layer_norm', 'bias'), *same),
      'pooler.dense.weight': (('pooler', 'kernel'), *lin),
      'pooler.dense.bias': (('pooler', 'bias'), *same),
      'cls.predictions.bias': (('mlm_output_bias',), *same),
      'cls.predictions.transform.dense.weight': (('mlm_transform', 'kernel'), *lin),
      'cls.predictions.transform.dense.bias': (('mlm_transform', 'bias'), *same),
      'cls.predictions.transform.LayerNorm.weight': (('mlm_layer_norm', 'scale'), *same),
      'cls.predictions.transform.LayerNorm.bias': (('mlm_layer_norm', 'bias'), *same),
      'cls.seq_relationship.weight': (('nsp', 'kernel'), *lin),
      'cls.seq_relationship.bias': (('nsp', 'bias'), *same),
  }
  return m


def _get(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def _set(tree, path, value):
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


def _layer_tree(params, cfg: BertConfig, i: int):
  enc = params['encoder']
  if cfg.scan_layers:
    return jax.tree_util.tree_map(lambda x: x[i], enc['layers'])
  return enc[f'layer_{i}']


# ----------------------------------------------------------------------------- both ways
# What BERT, RoBERTa and ELECTRA's converters do alike around their own maps.

TopMap = dict[str, tuple[tuple[str, ...], Callable, Callable]]


def to_hf_tree(params, cfg: BertConfig, top: TopMap, prefix: str,
               name: Callable[[str], str]) -> dict:
  """Our tree -> HF-keyed, HF-shaped tensors: `top`'s entries whose group the tree has, keyed
  `name(key)`, then every layer under `{prefix}encoder.layer.{i}.`. Works on numpy, jax arrays
  and tracers (`expected_shapes`)."""
  out = {}
  for key, (path, _, to_hf) in top.items():
    if path[0] in params:
      out[name(key)] = to_hf(_get(params, path))
  layer_map = _layer_map(cfg)
  for i in range(cfg.num_layers):
    layer = _layer_tree(params, cfg, i)
    for key, (path, _, to_hf) in layer_map.items():
      out[f'{prefix}encoder.layer.{i}.{key}'] = to_hf(_get(layer, path))
  return out


def expected_shapes(params_fn: Callable[[], dict], to_tree: Callable[[dict], dict]
                    ) -> dict[str, tuple[int, ...]]:
  """HF tensor shapes of `to_tree(params_fn())`, computed abstractly (nothing allocated)."""
  return {k: tuple(v.shape) for k, v in jax.eval_shape(lambda: to_tree(params_fn())).items()}


def check_state(state: dict, expected: dict, encoder_keys: list[str], cfg: BertConfig,
                source: str, family: str) -> None:
  """Every tensor of `state` that `expected` names has its shape, and the encoder is whole
  (`encoder_keys` plus every layer's); else a CheckpointError naming the tensors."""
  for key, shape in expected.items():
    if key in state and tuple(state[key].shape) != tuple(shape):
      raise CheckpointError(f'{source}: tensor {key} has shape {tuple(state[key].shape)}, but '
                            f'config.json implies {tuple(shape)}')
  layer_keys = [f'encoder.layer.{i}.{k}' for i in range(cfg.num_layers) for k in _layer_map(cfg)]
  missing = [k for k in list(encoder_keys) + layer_keys if k not in state]
  if missing:
    raise CheckpointError(f'{source}: {len(missing)} encoder tensors are missing, e.g. '
                          f'{missing[:3]}; it is not a complete {family} of this config.json')


def encoder_from_hf(state: dict, cfg: BertConfig) -> dict:
  """The `encoder` group from HF's `encoder.layer.{i}.*` tensors, scanned or unrolled as
  `cfg.scan_layers` says."""
  layers = []
  for i in range(cfg.num_layers):
    layer: dict = {}
    for key, (path, from_hf, _) in _layer_map(cfg).items():
      _set(layer, path, from_hf(state[f'encoder.layer.{i}.{key}'].astype(np.float32)))
    layers.append(layer)
  if cfg.scan_layers:
    return {'layers': jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)}
  return {f'layer_{i}': layer for i, layer in enumerate(layers)}


def warn_unused(state: dict, known, source: str, model_class: str) -> None:
  """One warning naming the tensors of `state` that no parameter reads."""
  unused = sorted(k for k in state if k not in known)
  if unused:
    logging.warning('%s: ignored %d tensors that are not part of %s: %s', source, len(unused),
                    model_class, unused[:8])


def config_fields(cfg: BertConfig) -> dict:
  """The config.json fields BERT, RoBERTa and ELECTRA spell alike (the architecture, its
  sizes, dropouts, initialiser and norm eps: hf_base.BERT_LAYOUT_FIELDS); each family adds its
  own."""
  fields = {key: getattr(cfg, ours) for key, (ours, _) in BERT_LAYOUT_FIELDS.items()}
  return {**fields, 'hidden_act': ACT_TO_HF[cfg.hidden_act]}


def with_pooler(cfg: BertConfig) -> dict:
  """init_params' tree with a pooler (which an MLM model without a sentence head lacks: a
  RoBERTa's, an ELECTRA's), for the shapes of a checkpoint that may carry one."""
  params = dict(init_params(cfg, jax.random.key(0)))
  params['pooler'] = {'kernel': np.zeros((cfg.hidden_size,) * 2, np.float32),
                      'bias': np.zeros((cfg.hidden_size,), np.float32)}
  return params


def float32_state(params, to_tree: Callable[[dict], dict]) -> dict:
  """`to_tree(params)` as float32, contiguous numpy: the state dict safetensors writes."""
  params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), dict(params))
  return {k: np.ascontiguousarray(v) for k, v in to_tree(params).items()}


def strip_prefix(key: str, prefix: str) -> str:
  """An HF key without the encoder's prefix (`roberta.`, `electra.`: a bare model has none)."""
  return key[len(prefix):] if key.startswith(prefix) else key
