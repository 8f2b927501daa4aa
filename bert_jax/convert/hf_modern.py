"""Flax parameters of `arch='modern'` <-> transformers' ModernBERT directories
(`ModernBertForMaskedLM` and the four task heads, models/modernbert/modeling_modernbert.py).

Key map (ours -> HF; Linear weights are [out, in], the transpose of our kernels):
  embeddings/word_embeddings          model.embeddings.tok_embeddings.weight
  embeddings/layer_norm               model.embeddings.norm.weight
  layer i attention_layer_norm        model.layers.i.attn_norm.weight (not layer 0: Identity)
  layer i attention/{query,key,value} model.layers.i.attn.Wqkv.weight, [3·H, H] in that order
  layer i attention/output            model.layers.i.attn.Wo.weight
  layer i output_layer_norm           model.layers.i.mlp_norm.weight
  layer i intermediate [H, 2, I]      model.layers.i.mlp.Wi.weight, [2·I, H]: input then gate
  layer i output                      model.layers.i.mlp.Wo.weight
  encoder/final_norm                  model.final_norm.weight
  mlm_transform, mlm_layer_norm       head.dense.weight, head.norm.weight
  mlm_output_bias                     decoder.bias (decoder.weight is tied, not written)
Layer 0's attention norm exists in our scanned stack but is never applied (HF's Identity):
exported nowhere, imported as ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.convert import hf_base
from bert_jax.convert.hf_base import CheckpointError
from bert_jax.model import families
from bert_jax.model.encoder import BertConfig, init_params

Array = np.ndarray
MODEL_TYPE = 'modernbert'
_ACT_TO_HF = {'gelu': 'gelu', 'gelu_tanh': 'gelu_pytorch_tanh'}
_ACT_FROM_HF = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh'}
ENCODER_PREFIX = 'model.'


def _with_prefix(state: Mapping[str, Array]) -> dict[str, Array]:
  """A bare `ModernBertModel` state dict (no `model.`) keyed as the task models key it."""
  if any(k.startswith(ENCODER_PREFIX) for k in state):
    return dict(state)
  return {(k if k.startswith(('head.', 'decoder.', 'classifier.')) else ENCODER_PREFIX + k): v
          for k, v in state.items()}


def check_exportable(cfg: BertConfig) -> None:
  """Only the switches transformers' ModernBERT has can be exported to it."""
  fixed = {k: v for k, v in families.MODERN.defaults.items()
           if k in ('norm_position', 'use_bias', 'mlp', 'positions')}
  off = {k: getattr(cfg, k) for k, v in fixed.items() if getattr(cfg, k) != v}
  if cfg.arch != 'modern' or off or cfg.type_vocab_size:
    raise CheckpointError(
        f'model.arch={cfg.arch!r} with {off or "these switches"} has no transformers class: '
        f'ModernBERT export needs arch=modern with {fixed} and type_vocab_size=0')


def config_to_hf(cfg: BertConfig, architecture: str = 'ModernBertForMaskedLM') -> dict[str, Any]:
  check_exportable(cfg)
  return {
      'architectures': [architecture],
      'model_type': MODEL_TYPE,
      'vocab_size': cfg.vocab_size,
      'hidden_size': cfg.hidden_size,
      'intermediate_size': cfg.intermediate_size,
      'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads,
      'hidden_activation': _ACT_TO_HF[cfg.hidden_act],
      'classifier_activation': _ACT_TO_HF[cfg.hidden_act],
      'max_position_embeddings': cfg.max_position_embeddings,
      'initializer_range': cfg.initializer_range,
      'norm_eps': cfg.layer_norm_eps,
      'norm_bias': False,
      'attention_bias': False,
      'mlp_bias': False,
      'classifier_bias': False,
      'decoder_bias': True,
      'attention_dropout': cfg.attention_dropout,
      'embedding_dropout': cfg.hidden_dropout,
      'mlp_dropout': 0.0,
      'classifier_dropout': 0.0,
      'classifier_pooling': cfg.classifier_pooling,
      'global_attn_every_n_layers': cfg.global_attention_every,
      'layer_types': ['full_attention' if cfg.is_global(i) else 'sliding_attention'
                      for i in range(cfg.num_layers)],
      'local_attention': cfg.local_window,
      # The rotary thetas twice, one form for each transformers generation: 4.48-4.57 read
      # only global_rope_theta / local_rope_theta (else their defaults, 160,000 global), 5.x
      # prefers rope_parameters and drops the two legacy keys when it has it.
      'global_rope_theta': cfg.global_rope_theta,
      'local_rope_theta': cfg.local_rope_theta,
      'rope_parameters': {
          'full_attention': {'rope_type': 'default', 'rope_theta': cfg.global_rope_theta},
          'sliding_attention': {'rope_type': 'default', 'rope_theta': cfg.local_rope_theta}},
      'tie_word_embeddings': True,
      # Token ids are the tokenizer's business (exported beside); HF's defaults are
      # ModernBERT's own 50k vocabulary's and out of range for any other.
      'pad_token_id': 0, 'bos_token_id': None, 'eos_token_id': None, 'cls_token_id': None,
      'sep_token_id': None,
      'torch_dtype': 'float32',
  }


def _theta(hf: Mapping[str, Any], layer_type: str, legacy: str, default: float,
           source: str) -> float | None:
  """A layer type's theta from 5.x's rope_parameters or 4.x's legacy key, whatever is there;
  both there and different, transformers 4.x and 5.x would run different models: refused.
  None where the config names the key but gives no value (4.x: `local_rope_theta: null`)."""
  rope = (hf.get('rope_parameters') or {}).get(layer_type) or {}
  new, old = rope.get('rope_theta'), hf.get(legacy)
  if new is not None and old is not None and float(new) != float(old):
    raise CheckpointError(
        f'{source}: rope_parameters.{layer_type}.rope_theta={new} but {legacy}={old}; '
        'transformers 5.x reads the first, 4.x the second: make them agree')
  if new is None and old is None and ('rope_theta' in rope or legacy in hf):
    return None
  return float(new if new is not None else old if old is not None else default)


def _check_rope_type(hf: Mapping[str, Any], source: str) -> None:
  """Only unscaled rotary embeddings: a `rope_scaling` (4.x, and 5.x applies it to both
  layer types) or a rope_parameters entry of another rope_type (YaRN, linear...) changes the
  frequencies, which this encoder would silently not do."""
  kinds = {'rope_scaling': hf.get('rope_scaling') or {}}
  kinds.update({f'rope_parameters.{k}': v or {}
                for k, v in (hf.get('rope_parameters') or {}).items()})
  for where, rope in kinds.items():
    if not isinstance(rope, Mapping):
      raise CheckpointError(f'{source}: {where}={rope!r} is not a mapping')
    kind = rope.get('rope_type', rope.get('type'))
    if kind not in (None, 'default'):
      raise CheckpointError(
          f'{source}: {where} has rope_type {kind!r}; only unscaled ("default") rotary '
          'embeddings are supported')


def config_from_hf(hf: Mapping[str, Any], source: str = 'config.json') -> BertConfig:
  """Our config of a ModernBERT config.json (transformers 5.x `layer_types` and
  `rope_parameters`, or 4.x `global_attn_every_n_layers` and `global_rope_theta`)."""
  act = hf.get('hidden_activation', 'gelu')
  if act not in _ACT_FROM_HF:
    raise CheckpointError(f'{source}: hidden_activation {act!r}; expected one of '
                          f'{sorted(_ACT_FROM_HF)}')
  for flag in ('norm_bias', 'attention_bias', 'mlp_bias', 'classifier_bias'):
    if hf.get(flag):
      raise CheckpointError(f'{source}: {flag}=true is not supported (ModernBERT has none)')
  if not hf.get('decoder_bias', True):
    raise CheckpointError(f'{source}: decoder_bias=false is not supported')
  if not hf.get('tie_word_embeddings', True):
    raise CheckpointError(f'{source}: tie_word_embeddings=false is not supported (the MLM '
                          'decoder is the word embeddings here)')
  # The MLM head's (and the task heads') activation is `classifier_activation` in transformers
  # (absent: gelu), the MLP's `hidden_activation`; this encoder has one for both.
  head_act = hf.get('classifier_activation', 'gelu')
  if _ACT_FROM_HF.get(head_act) != _ACT_FROM_HF[act]:
    raise CheckpointError(f'{source}: classifier_activation {head_act!r} differs from '
                          f'hidden_activation {act!r}; only one activation for both is supported')
  _check_rope_type(hf, source)
  try:
    layers = hf['num_hidden_layers']
    every = hf.get('global_attn_every_n_layers', 3)
    types = hf.get('layer_types')
    if types is not None:
      globals_ = [i for i, t in enumerate(types) if t == 'full_attention']
      every = globals_[1] if len(globals_) > 1 else max(layers, 1)
      expected = ['full_attention' if i % every == 0 else 'sliding_attention'
                  for i in range(layers)]
      if list(types) != expected:
        raise CheckpointError(f'{source}: layer_types {types} is not "global every Nth layer '
                              'from layer 0"; only that pattern is supported')
    global_theta = _theta(hf, 'full_attention', 'global_rope_theta', 160_000.0, source)
    if global_theta is None:
      raise CheckpointError(f'{source}: the global rotary theta is null')
    local_theta = _theta(hf, 'sliding_attention', 'local_rope_theta', 10_000.0, source)
    return BertConfig(
        arch='modern', **{k: v for k, v in families.MODERN.defaults.items()
                          if k in ('norm_position', 'use_bias', 'mlp', 'positions')},
        type_vocab_size=0, vocab_size=hf['vocab_size'], hidden_size=hf['hidden_size'],
        num_layers=layers, num_heads=hf['num_attention_heads'],
        intermediate_size=hf['intermediate_size'], hidden_act=_ACT_FROM_HF[act],
        max_position_embeddings=hf.get('max_position_embeddings', 8192),
        layer_norm_eps=hf.get('norm_eps', 1e-5),
        initializer_range=hf.get('initializer_range', 0.02),
        hidden_dropout=hf.get('embedding_dropout', 0.0),
        attention_dropout=hf.get('attention_dropout', 0.0),
        global_attention_every=every, local_window=hf.get('local_attention', 128),
        global_rope_theta=global_theta,
        # 4.x: `local_rope_theta: null` means the local layers rotate with the global theta.
        local_rope_theta=global_theta if local_theta is None else local_theta,
        classifier_pooling=hf.get('classifier_pooling', 'cls'))
  except KeyError as e:
    raise CheckpointError(f'{source}: missing field {e.args[0]!r}') from None


def _layers(params, cfg: BertConfig) -> list[dict]:
  enc = params['encoder']
  if cfg.scan_layers:
    return [jax.tree_util.tree_map(lambda x, i=i: x[i], enc['layers'])
            for i in range(cfg.num_layers)]
  return [enc[f'layer_{i}'] for i in range(cfg.num_layers)]


def encoder_to_hf(params, cfg: BertConfig, prefix: str = ENCODER_PREFIX) -> dict[str, Array]:
  """The encoder's tensors (embeddings, layers, final norm), HF-keyed and shaped."""
  h, i_size = cfg.hidden_size, cfg.intermediate_size
  out = {f'{prefix}embeddings.tok_embeddings.weight':
             params['embeddings']['word_embeddings']['embedding'],
         f'{prefix}embeddings.norm.weight': params['embeddings']['layer_norm']['scale'],
         f'{prefix}final_norm.weight': params['encoder']['final_norm']['scale']}
  for i, layer in enumerate(_layers(params, cfg)):
    p = f'{prefix}layers.{i}.'
    att = layer['attention']
    if i > 0:
      out[p + 'attn_norm.weight'] = layer['attention_layer_norm']['scale']
    out[p + 'attn.Wqkv.weight'] = np.concatenate(
        [np.asarray(att[n]['kernel']).reshape(h, h).T for n in ('query', 'key', 'value')])
    out[p + 'attn.Wo.weight'] = np.asarray(att['output']['kernel']).reshape(h, h).T
    out[p + 'mlp_norm.weight'] = layer['output_layer_norm']['scale']
    out[p + 'mlp.Wi.weight'] = np.asarray(layer['intermediate']['kernel']).reshape(h, 2 * i_size).T
    out[p + 'mlp.Wo.weight'] = np.asarray(layer['output']['kernel']).T
  return out


def head_transform_to_hf(params) -> dict[str, Array]:
  return {'head.dense.weight': np.asarray(params['mlm_transform']['kernel']).T,
          'head.norm.weight': params['mlm_layer_norm']['scale']}


def params_to_hf(params, cfg: BertConfig, prefix: str = ENCODER_PREFIX) -> dict[str, Array]:
  """Our MLM tree -> `ModernBertForMaskedLM` state dict (float32 numpy, no tied decoder);
  `prefix=''` keys the encoder as a bare `ModernBertModel`."""
  check_exportable(cfg)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
  out = {**encoder_to_hf(params, cfg, prefix), **head_transform_to_hf(params),
         'decoder.bias': params['mlm_output_bias']}
  return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def _take(state: dict, key: str, shape: tuple[int, ...], source: str) -> Array:
  if key not in state:
    raise CheckpointError(f'{source}: tensor {key} is missing; not a complete ModernBERT of '
                          'this config.json')
  value = np.asarray(state[key], np.float32)
  if value.shape != shape:
    raise CheckpointError(f'{source}: tensor {key} has shape {value.shape}, but config.json '
                          f'implies {shape}')
  return value


def encoder_from_hf(state: Mapping[str, Array], cfg: BertConfig, source: str,
                    prefix: str = ENCODER_PREFIX) -> dict:
  """HF tensors -> our `embeddings` and `encoder` groups (scanned or unrolled per cfg)."""
  h, n, d, i_size, v = (cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size,
                        cfg.vocab_size)
  state = dict(state)
  take = lambda key, shape: _take(state, prefix + key, shape, source)
  params = {'embeddings': {
      'word_embeddings': {'embedding': take('embeddings.tok_embeddings.weight', (v, h))},
      'layer_norm': {'scale': take('embeddings.norm.weight', (h,))}}}
  layers = []
  for i in range(cfg.num_layers):
    p = f'layers.{i}.'
    q, k, val = np.split(take(p + 'attn.Wqkv.weight', (3 * h, h)), 3)
    layers.append({
        'attention_layer_norm': {'scale': (take(p + 'attn_norm.weight', (h,)) if i > 0
                                           else np.ones((h,), np.float32))},
        'attention': {
            **{name: {'kernel': w.T.reshape(h, n, d)}
               for name, w in (('query', q), ('key', k), ('value', val))},
            'output': {'kernel': take(p + 'attn.Wo.weight', (h, h)).T.reshape(n, d, h)}},
        'output_layer_norm': {'scale': take(p + 'mlp_norm.weight', (h,))},
        'intermediate': {'kernel': take(p + 'mlp.Wi.weight', (2 * i_size, h)).T.reshape(
            h, 2, i_size)},
        'output': {'kernel': take(p + 'mlp.Wo.weight', (h, i_size)).T}})
  if cfg.scan_layers:
    encoder = {'layers': jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)}
  else:
    encoder = {f'layer_{i}': layer for i, layer in enumerate(layers)}
  encoder['final_norm'] = {'scale': take('final_norm.weight', (h,))}
  params['encoder'] = encoder
  return params


def head_transform_from_hf(state: Mapping[str, Array], cfg: BertConfig, source: str) -> dict:
  h = cfg.hidden_size
  return {'mlm_transform': {'kernel': _take(dict(state), 'head.dense.weight', (h, h), source).T},
          'mlm_layer_norm': {'scale': _take(dict(state), 'head.norm.weight', (h,), source)}}


def params_from_hf(state: Mapping[str, Array], cfg: BertConfig, source: str = 'checkpoint', *,
                   rng: jax.Array | None = None) -> dict:
  """`ModernBertForMaskedLM` state dict -> our MLM tree. A checkpoint without the MLM head
  (`ModernBertModel`) gets a fresh head transform from `rng` (ones norm) and zero decoder
  bias."""
  state = _with_prefix(state)
  params = encoder_from_hf(state, cfg, source)
  if 'head.dense.weight' in state:
    params.update(head_transform_from_hf(state, cfg, source))
  else:
    fresh = init_params(cfg, rng if rng is not None else jax.random.key(0))
    params['mlm_transform'] = jax.tree_util.tree_map(np.asarray, fresh['mlm_transform'])
    params['mlm_layer_norm'] = jax.tree_util.tree_map(np.asarray, fresh['mlm_layer_norm'])
  bias = state.get('decoder.bias')
  params['mlm_output_bias'] = (np.zeros((cfg.vocab_size,), np.float32) if bias is None
                               else _take(dict(state), 'decoder.bias', (cfg.vocab_size,), source))
  return params


CONVERTER = hf_base.register(hf_base.Converter(
    family='modern', model_types=(MODEL_TYPE,), class_prefix='ModernBert',
    encoder_prefix=ENCODER_PREFIX, task_prefixes=('head.',), mlm_prefixes=('head.', 'decoder.'),
    config_to_hf=config_to_hf, config_from_hf=config_from_hf, params_to_hf=params_to_hf,
    params_from_hf=params_from_hf))
