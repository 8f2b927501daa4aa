"""Flax parameters <-> HuggingFace `BertForPreTraining` directories (and, through
hf_modern.py, `ModernBertForMaskedLM` ones, through hf_roberta.py `(XLM)RobertaForMaskedLM`
ones, through hf_electra.py `ElectraForMaskedLM` / `ElectraForPreTraining` ones: `model_type`
or `cfg.arch` picks).

`save_pretrained` writes `config.json` + `model.safetensors` (+ tokenizer files) with numpy
only, so exporting needs no torch. `load_pretrained` reads safetensors (single or sharded)
or, through `torch.load(weights_only=True)`, a legacy `pytorch_model.bin`.

HF's Linear weights are [out, in], the transpose of Flax kernels; attention projections are
additionally split into [heads, head_dim]. The MLM decoder is tied to the word embeddings and
its bias to `cls.predictions.bias`, so neither tied copy is written.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.convert import hf_modern
from bert_jax.model.encoder import ROBERTA_ARCHS, BertConfig, init_params
from input_pipeline import fs

Array = np.ndarray
StateDict = dict[str, Array]

HEAD_GROUPS = {'mlm': ('mlm_transform', 'mlm_layer_norm', 'mlm_output_bias'),
               'nsp': ('nsp',), 'pooler': ('pooler',)}


# A directory that is not a loadable BERT or ModernBERT checkpoint (one type for both).
CheckpointError = hf_modern.CheckpointError
# The BERT layout's key maps (shared with hf_roberta.py, which hf.py dispatches to).
from bert_jax.convert import bert_state_map  # noqa: E402  pylint: disable=g-import-not-at-top
from bert_jax.convert.bert_state_map import (  # noqa: E402  pylint: disable=g-import-not-at-top
    ACT_FROM_HF, _get, _set, _top_map)


def _roberta():
  """hf_roberta.py, which builds on this module's maps (so it cannot be imported at the top)."""
  from bert_jax.convert import hf_roberta  # pylint: disable=g-import-not-at-top
  return hf_roberta


def _electra():
  """hf_electra.py (imported when needed, as hf_roberta.py is)."""
  from bert_jax.convert import hf_electra  # pylint: disable=g-import-not-at-top
  return hf_electra


# ----------------------------------------------------------------------------- configs


def config_to_hf(cfg: BertConfig) -> dict[str, Any]:
  return {
      'architectures': ['BertForPreTraining'],
      'model_type': 'bert',
      **bert_state_map.config_fields(cfg),
      'pad_token_id': 0,
      'position_embedding_type': 'absolute',
      'tie_word_embeddings': True,
      'torch_dtype': 'float32',
  }


def with_tokenizer_ids(hf_config: dict[str, Any], cfg: BertConfig, tokenizer) -> dict[str, Any]:
  """`hf_config` with the exported tokenizer's special ids in the id fields it has
  (ModernBERT's pad 50,283, cls 50,281, sep 50,282; an mmBERT's 0, 1, 2), so transformers
  pads and embeds as the release did; a RoBERTa's pad_token_id stays the one its positions
  are numbered from (hf_roberta)."""
  if tokenizer is None:
    return hf_config
  ids = {'pad_token_id': tokenizer.pad_id, 'cls_token_id': tokenizer.cls_id,
         'sep_token_id': tokenizer.sep_id, 'bos_token_id': tokenizer.cls_id,
         'eos_token_id': tokenizer.sep_id}
  for key, value in ids.items():
    if key in hf_config and not (cfg.is_roberta and key == 'pad_token_id'):
      hf_config[key] = value
  return hf_config


def config_to_hf_any(cfg: BertConfig) -> dict[str, Any]:
  """The MLM export's config.json of any arch: BertForPreTraining, ModernBertForMaskedLM,
  (XLM)RobertaForMaskedLM or ElectraForMaskedLM."""
  if cfg.arch == 'modern':
    return hf_modern.config_to_hf(cfg)
  if cfg.is_roberta:
    return _roberta().config_to_hf(cfg)
  if cfg.is_electra:
    return _electra().config_to_hf(cfg)
  return config_to_hf(cfg)


def config_from_hf(hf: Mapping[str, Any], source: str = 'config.json') -> BertConfig:
  model_type = hf.get('model_type')
  if model_type == hf_modern.MODEL_TYPE:
    return hf_modern.config_from_hf(hf, source)
  if model_type in ROBERTA_ARCHS:
    return _roberta().config_from_hf(hf, source)
  if model_type == 'electra':
    return _electra().config_from_hf(hf, source)
  if model_type != 'bert':
    arch = ', '.join(hf.get('architectures') or []) or 'unknown architecture'
    raise CheckpointError(f'{source}: model_type is {model_type!r} ({arch}), not BERT; '
                          'only BERT, ModernBERT, RoBERTa, XLM-R and ELECTRA checkpoints '
                          '(model_type "bert", "modernbert", "roberta", "xlm-roberta" or '
                          '"electra") can be loaded')
  act = hf.get('hidden_act', 'gelu')
  if act not in ACT_FROM_HF:
    raise CheckpointError(f'{source}: hidden_act {act!r} is not supported; expected one of '
                          f'{sorted(ACT_FROM_HF)}')
  if hf.get('position_embedding_type', 'absolute') != 'absolute':
    raise CheckpointError(f'{source}: position_embedding_type '
                          f'{hf["position_embedding_type"]!r}; only "absolute" is BERT')
  try:
    return BertConfig(
        vocab_size=hf['vocab_size'], hidden_size=hf['hidden_size'],
        num_layers=hf['num_hidden_layers'], num_heads=hf['num_attention_heads'],
        intermediate_size=hf['intermediate_size'], hidden_act=ACT_FROM_HF[act],
        hidden_dropout=hf.get('hidden_dropout_prob', 0.1),
        attention_dropout=hf.get('attention_probs_dropout_prob', 0.1),
        max_position_embeddings=hf.get('max_position_embeddings', 512),
        type_vocab_size=hf.get('type_vocab_size', 2),
        initializer_range=hf.get('initializer_range', 0.02),
        layer_norm_eps=hf.get('layer_norm_eps', 1e-12))
  except KeyError as e:
    raise CheckpointError(f'{source}: missing field {e.args[0]!r}') from None


# ----------------------------------------------------------------------------- weights


def _hf_key(key: str) -> str:
  """Canonical spelling: no `bert.` prefix, `weight`/`bias` for legacy `gamma`/`beta`."""
  if key.startswith('bert.'):
    key = key[len('bert.'):]
  if key.endswith('.gamma'):
    key = key[:-len('.gamma')] + '.weight'
  elif key.endswith('.beta'):
    key = key[:-len('.beta')] + '.bias'
  return key


def _to_hf_tree(params, cfg: BertConfig, prefix: str = 'bert.') -> dict:
  """Our tree -> HF-keyed, HF-shaped tensors (heads under `cls.`, the rest under `prefix`)."""
  return bert_state_map.to_hf_tree(
      params, cfg, _top_map(), prefix, lambda k: k if k.startswith('cls.') else prefix + k)


def params_to_hf(params, cfg: BertConfig, prefix: str = 'bert.') -> StateDict:
  """Our parameter tree -> HF BertForPreTraining (or ModernBertForMaskedLM, or
  (XLM)RobertaForMaskedLM under `roberta.`, or ElectraForMaskedLM under `electra.`) state dict
  (float32 numpy, no tied copies)."""
  if cfg.arch == 'modern':
    return hf_modern.params_to_hf(params, cfg)
  if cfg.is_roberta:
    return _roberta().params_to_hf(params, cfg, 'roberta.' if prefix == 'bert.' else prefix)
  if cfg.is_electra:
    return _electra().params_to_hf(params, cfg, 'electra.' if prefix == 'bert.' else prefix)
  return bert_state_map.float32_state(params, lambda p: _to_hf_tree(p, cfg, prefix))


def _expected_hf_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
  """HF tensor shapes implied by `cfg`, computed abstractly (no model-sized allocation)."""
  return bert_state_map.expected_shapes(lambda: init_params(cfg, jax.random.key(0)),
                                        lambda p: _to_hf_tree(p, cfg, ''))


def params_from_hf(state: Mapping[str, Array], cfg: BertConfig, *, rng: jax.Array | None = None,
                   source: str = 'checkpoint') -> dict:
  """HF state dict -> our parameter tree.

  Accepts `bert.`-prefixed or bare keys and legacy `gamma`/`beta`. Encoder weights must all be
  present; missing heads (BertModel, sentence-transformers) are freshly initialised from `rng`
  with a warning that names them. ModernBERT, RoBERTa and ELECTRA configs go to their modules.
  """
  if cfg.arch == 'modern':
    return hf_modern.params_from_hf(state, cfg, source)
  if cfg.is_roberta:
    return _roberta().params_from_hf(state, cfg, rng=rng, source=source)
  if cfg.is_electra:
    return _electra().params_from_hf(state, cfg, rng=rng, source=source)
  state = {_hf_key(k): np.asarray(v) for k, v in state.items()}
  expected = _expected_hf_shapes(cfg)
  top = _top_map()
  bert_state_map.check_state(state, expected, [k for k in top if k.startswith('embeddings.')],
                             cfg, source, 'BERT')

  fresh = None
  params: dict = {}
  missing_heads = []
  for key, (path, from_hf, _) in top.items():
    if key in state:
      _set(params, path, from_hf(state[key].astype(np.float32)))
    else:
      missing_heads.append(key)
      if fresh is None:
        fresh = jax.tree_util.tree_map(np.asarray, init_params(
            cfg, rng if rng is not None else jax.random.key(0)))
      _set(params, path, _get(fresh, path))
  if missing_heads:
    logging.warning('%s has no %s: initialised fresh (an encoder-only checkpoint); fine-tune or '
                    'pre-train before using those heads.', source, ', '.join(missing_heads))

  params['encoder'] = bert_state_map.encoder_from_hf(state, cfg)
  known = set(expected) | {'cls.predictions.decoder.weight', 'cls.predictions.decoder.bias',
                           'embeddings.position_ids'}
  bert_state_map.warn_unused(state, known, source, 'BertForPreTraining')
  return params


# ----------------------------------------------------------------------------- files


def read_weights(path: str) -> StateDict:
  """All tensors of a local HF directory as float-or-int numpy arrays, keyed as stored."""
  single = os.path.join(path, 'model.safetensors')
  index = os.path.join(path, 'model.safetensors.index.json')
  legacy = os.path.join(path, 'pytorch_model.bin')
  if os.path.exists(single):
    return _read_safetensors(single)
  if os.path.exists(index):
    try:
      with open(index) as f:
        files = sorted(set(json.load(f)['weight_map'].values()))
    except (OSError, ValueError, KeyError) as e:
      raise CheckpointError(f'{index}: unreadable shard index ({e})') from None
    state: StateDict = {}
    for name in files:
      state.update(_read_safetensors(os.path.join(path, name)))
    return state
  if os.path.exists(legacy):
    return _read_torch_bin(legacy)
  raise CheckpointError(f'{path}: no model.safetensors, model.safetensors.index.json or '
                        'pytorch_model.bin; is this an HF model directory?')


def _read_safetensors(file: str) -> StateDict:
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  try:
    with safe_open(file, framework='numpy') as f:
      return {k: f.get_tensor(k) for k in f.keys()}
  except Exception as e:  # safetensors raises several unrelated types for a bad header.
    if 'bfloat16' in str(e) or 'BF16' in str(e):
      return _read_safetensors_via_flax(file)
    raise CheckpointError(f'{file}: not a readable safetensors file ({e})') from None


def _read_safetensors_via_flax(file: str) -> StateDict:
  # numpy has no bfloat16; safetensors' flax backend reads it into jax arrays.
  from safetensors.flax import load_file  # pylint: disable=g-import-not-at-top
  return {k: np.asarray(v, np.float32) for k, v in load_file(file).items()}


def _read_torch_bin(file: str) -> StateDict:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise CheckpointError(f'{file}: reading pytorch_model.bin needs torch '
                          '(pip install torch==2.13.0) or convert it to safetensors') from None
  try:
    state = torch.load(file, map_location='cpu', weights_only=True)
  except Exception as e:
    raise CheckpointError(f'{file}: torch.load(weights_only=True) failed: {e}') from None
  return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def load_config(path: str) -> BertConfig:
  file = fs.join(path, 'config.json')
  if not fs.exists(file):
    if not fs.isdir(path):
      raise CheckpointError(f'{path}: no such directory')
    raise CheckpointError(f'{path}: no config.json; an HF model directory needs one')
  try:
    hf = json.loads(fs.read_text(file))
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{file}: unreadable JSON ({e})') from None
  return config_from_hf(hf, source=file)


def load_pretrained(path: str, *, rng: jax.Array | None = None,
                    **config_overrides: Any) -> tuple[BertConfig, dict]:
  """(model config, float32 params) from an HF BERT directory.

  `config_overrides` set our-only knobs such as dtype, scan_layers or remat_policy.
  """
  cfg = load_config(path)
  if config_overrides:
    cfg = cfg.replace(**config_overrides)
  with fs.local_dir(path) as local:  # safetensors and torch read local files
    params = params_from_hf(read_weights(local), cfg, rng=rng, source=path)
  return cfg, params


def save_pretrained(path: str, cfg: BertConfig, params, tokenizer=None,
                    overwrite: bool = False) -> str:
  """Write an HF `BertForPreTraining` (ModernBERT, RoBERTa, ELECTRA: `...ForMaskedLM`) directory
  atomically; returns `path`.

  Locally, everything is written into a sibling temporary directory first and renamed into
  place, so a failure leaves no half-written export. On an object store (gs://), where a
  directory cannot be renamed, the files are uploaded one by one with `config.json` last: a
  reader that finds it finds the rest. `tokenizer` is anything with `save_pretrained(dir)`.
  """
  state = params_to_hf(params, cfg)  # converts (and so validates) before anything is written
  return fs.publish_dir(path, lambda d: _write_export(d, cfg, state, tokenizer),
                        overwrite=overwrite)


def _write_export(directory: str, cfg: BertConfig, state: StateDict, tokenizer) -> None:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  hf_config = with_tokenizer_ids(config_to_hf_any(cfg), cfg, tokenizer)
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  save_file(state, os.path.join(directory, 'model.safetensors'), metadata={'format': 'pt'})
  if tokenizer is not None:
    tokenizer.save_pretrained(directory)
