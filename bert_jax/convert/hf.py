"""Flax parameters <-> HuggingFace model directories of every registered encoder family:
`BertForPreTraining` (hf_bert.py), `(XLM)RobertaForMaskedLM` (hf_roberta.py),
`ElectraForMaskedLM` / `ElectraForPreTraining` (hf_electra.py), `ModernBertForMaskedLM`
(hf_modern.py), or any family registered with hf_base.register. A directory's config.json
`model_type` picks the converter when reading, the model's `arch` when writing.

`save_pretrained` writes `config.json` + `model.safetensors` (+ tokenizer files) with numpy
only, so exporting needs no torch. `load_pretrained` reads safetensors (single or sharded)
or, through `torch.load(weights_only=True)`, a legacy `pytorch_model.bin`.

HF's Linear weights are [out, in], the transpose of Flax kernels; attention projections are
additionally split into [heads, head_dim]. MLM decoders are tied to the word embeddings, so no
tied copy is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

# The built-in families' converters register themselves on import (hf_base's registry).
from bert_jax.convert import hf_bert, hf_electra, hf_modern, hf_roberta  # noqa: F401
from bert_jax.convert import hf_base
from bert_jax.model.encoder import BertConfig
from input_pipeline import fs

Array = np.ndarray
StateDict = dict[str, Array]

# A directory that is not a loadable checkpoint of a known family (one type for all).
CheckpointError = hf_base.CheckpointError


# ----------------------------------------------------------------------------- configs


def converter(cfg: BertConfig) -> hf_base.Converter:
  """The HF side of `cfg`'s family."""
  return hf_base.for_arch(cfg.arch)


def config_to_hf(cfg: BertConfig, architecture: str | None = None) -> dict[str, Any]:
  """The MLM export's config.json of any family (BertForPreTraining, ModernBertForMaskedLM,
  (XLM)RobertaForMaskedLM, ElectraForMaskedLM, ...), or of `architecture`."""
  conv = converter(cfg)
  return conv.config_to_hf(cfg, architecture) if architecture else conv.config_to_hf(cfg)


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
  own_pad = converter(cfg).tokenizer_pad_id
  for key, value in ids.items():
    if key in hf_config and (own_pad or key != 'pad_token_id'):
      hf_config[key] = value
  return hf_config


def config_from_hf(hf: Mapping[str, Any], source: str = 'config.json') -> BertConfig:
  """Our config of any registered family's config.json (its `model_type` decides)."""
  return hf_base.for_model_type(hf, source).config_from_hf(hf, source)


# ----------------------------------------------------------------------------- weights


def params_to_hf(params, cfg: BertConfig, prefix: str | None = None) -> StateDict:
  """Our parameter tree -> the family's MLM model state dict (float32 numpy, no tied copies):
  BertForPreTraining's under `bert.`, (XLM)RobertaForMaskedLM's under `roberta.`, ...;
  `prefix=''` keys the encoder bare (a `BertModel` in a sentence-transformers directory)."""
  conv = converter(cfg)
  return conv.params_to_hf(params, cfg, conv.encoder_prefix if prefix is None else prefix)


def params_from_hf(state: Mapping[str, Array], cfg: BertConfig, *, rng: jax.Array | None = None,
                   source: str = 'checkpoint') -> dict:
  """HF state dict -> our parameter tree, by `cfg`'s family. Encoder weights must all be
  present; missing heads (an encoder-only checkpoint) are initialised fresh from `rng` with a
  warning that names them."""
  return converter(cfg).params_from_hf(state, cfg, rng=rng, source=source)


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
                    overwrite: bool = False, architecture: str | None = None) -> str:
  """Write an HF `BertForPreTraining` (ModernBERT, RoBERTa, ELECTRA: `...ForMaskedLM`) directory
  atomically, or the family's `architecture` (`ElectraForPreTraining`: a replaced-token
  detection discriminator's tree); returns `path`.

  Locally, everything is written into a sibling temporary directory first and renamed into
  place, so a failure leaves no half-written export. On an object store (gs://), where a
  directory cannot be renamed, the files are uploaded one by one with `config.json` last: a
  reader that finds it finds the rest. `tokenizer` is anything with `save_pretrained(dir)`.
  """
  state = params_to_hf(params, cfg)  # converts (and so validates) before anything is written
  hf_config = config_to_hf(cfg, architecture)
  return fs.publish_dir(path, lambda d: _write_export(d, cfg, hf_config, state, tokenizer),
                        overwrite=overwrite)


def _write_export(directory: str, cfg: BertConfig, hf_config: dict, state: StateDict,
                  tokenizer) -> None:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  hf_config = with_tokenizer_ids(hf_config, cfg, tokenizer)
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  save_file(state, os.path.join(directory, 'model.safetensors'), metadata={'format': 'pt'})
  if tokenizer is not None:
    tokenizer.save_pretrained(directory)
