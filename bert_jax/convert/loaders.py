"""What a start point is (`StartPoint`), which kind a path holds (`detect_kind`), and one
loader per kind, each returning BertForPreTraining's params and the config stored with them,
untouched (how a run computes, its layer layout, is the run's: `start_points.for_run`).

  - workdir: our training workdir (`checkpoints/` + `config.json`), latest or a given step;
  - hf: a HuggingFace directory (`BertForPreTraining`, `BertModel`, a sentence-transformers
    layout, or a fine-tuned `BertFor<Task>` whose head comes along; ModernBERT's, RoBERTa's,
    XLM-R's and ELECTRA's alike);
  - tf: a Google TF checkpoint (`google_tf`).
`start_points.load_start_point` picks the loader; URLs are staged first (`staging`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import jax
import numpy as np

from bert_jax.convert import casing, google_tf, hf, hf_heads, workdir
from bert_jax.model import heads, rtd
from bert_jax.model.encoder import BertConfig
from bert_jax.training import checkpointing
from bert_jax.training.run_setup import model_config
from input_pipeline import fs
from input_pipeline.tokenizer import WordPieceTokenizer

WORKDIR, HF_DIR, TF_CHECKPOINT = 'workdir', 'hf', 'tf'
RANDOM = 'random'  # `random:<start point>`: its config and tokenizer, fresh weights


@dataclasses.dataclass
class StartPoint:
  """What a run starts from. `params` is BertForPreTraining's tree (float32 numpy)."""

  kind: str  # workdir | hf | tf
  path: str
  cfg: BertConfig
  params: dict
  tokenizer: Any  # input_pipeline.tokenizer.Tokenizer, or None (require_tokenizer=False)
  do_lower_case: bool | None  # SentencePiece too (the model's own); None: no tokenizer
  step: int | None = None  # the workdir step that was restored
  head: heads.Head | None = None  # the task head the start point carries, if any
  head_params: dict | None = None  # that head's params ({'classifier': ...})


# ----------------------------------------------------------------------------- detection


def _sentence_transformers_dir(path: str) -> str | None:
  """The Transformer module's directory of a sentence-transformers model, if `path` is one."""
  modules = fs.join(path, 'modules.json')
  if not fs.exists(modules):
    return None
  entries = json.loads(fs.read_text(modules))
  for entry in entries:
    # sentence_transformers.models.Transformer; 6.x saves ...base.modules.transformer.Transformer
    if entry.get('type', '').endswith('.Transformer'):
      return fs.join(path, entry.get('path', ''))
  raise hf.CheckpointError(f'{modules}: no sentence_transformers.models.Transformer module')


def detect_kind(path: str) -> str:
  """workdir | hf | tf, from the files at `path`; an error that lists what each needs."""
  if '://' in path:  # remote workdirs (gs://): only the trainer's own checkpoints live there
    return WORKDIR
  if fs.isdir(fs.join(path, 'checkpoints')):
    return WORKDIR
  st = _sentence_transformers_dir(path) if fs.isdir(path) else None
  if fs.exists(fs.join(st or path, 'config.json')):
    return HF_DIR
  if google_tf.checkpoint_prefix(path):
    return TF_CHECKPOINT
  raise hf.CheckpointError(
      f'{path}: not a start point. Expected a training workdir (checkpoints/ + config.json), '
      'a HuggingFace directory (config.json + model.safetensors or pytorch_model.bin; '
      'sentence-transformers: modules.json), or a TF checkpoint (bert_config.json + '
      'bert_model.ckpt.index/.data-*)')


def is_workdir(path: str) -> bool:
  """Our training workdir (local or URL): it has `checkpoints/`."""
  return fs.isdir(fs.join(path, 'checkpoints'))


# ----------------------------------------------------------------------------- workdir


def relayout(params: dict, scanned: bool, num_layers: int, to_scanned: bool) -> dict:
  """Encoder layers stacked (`layers`, scan) <-> one group per layer (`layer_i`); other
  encoder groups (a pre-norm model's `final_norm`) stay as they are."""
  if scanned == to_scanned:
    return params
  enc = params['encoder']
  rest = {k: v for k, v in enc.items() if k != 'layers' and not k.startswith('layer_')}
  if to_scanned:
    layers = [enc[f'layer_{i}'] for i in range(num_layers)]
    new = {'layers': jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)}
  else:
    new = {f'layer_{i}': jax.tree_util.tree_map(lambda x, i=i: np.asarray(x[i]), enc['layers'])
           for i in range(num_layers)}
  return {**params, 'encoder': {**new, **rest}}


def load_workdir(path, step, given_lower, rng, required) -> StartPoint:
  del rng  # a workdir holds every pre-training head
  config = workdir.load_run_config(path)
  step, params = checkpointing.restore_params(path, step)
  if config.train.get('objective') == 'rtd':  # replaced-token detection: the discriminator
    # is the model (its encoder; the replaced-or-not head has no MLM or task use)
    params = rtd.half_params(params, rtd.DISCRIMINATOR, config.rtd.embedding_sharing)
    params = {k: v for k, v in params.items() if k != rtd.HEAD}
  tok, lower = casing.workdir_tokenizer(config.data, path, given_lower, required)
  return StartPoint(WORKDIR, path, model_config(config), params, tok, lower, step)


# ----------------------------------------------------------------------------- HF


def load_hf(path, step, given_lower, rng, required) -> StartPoint:
  if step is not None:
    raise ValueError(f'{path}: step={step} applies to training workdirs only')
  model_dir = _sentence_transformers_dir(path) or path
  hf_config = json.loads(fs.read_text(fs.join(model_dir, 'config.json')))
  cfg = hf.load_config(model_dir)
  state = hf.read_weights(model_dir)
  head_state = {k: state.pop(k) for k in list(state)
                if k.startswith(('classifier.', 'qa_outputs.'))}
  params = hf.params_from_hf(state, cfg, rng=rng, source=model_dir)
  head = hf_heads.head_from_hf_config(hf_config, fs.join(model_dir, 'config.json'))
  head_params = (hf_heads.head_from_hf(head_state, head, cfg.hidden_size, model_dir,
                                         cfg.arch)
                 if head else None)
  if head_state and head_params is None:
    logging.warning('%s: ignored %s: config.json architectures %s name no task head we know '
                    '(%s)', model_dir, sorted(head_state), hf_config.get('architectures'),
                    '<family>' + ', <family>'.join(sorted(hf_heads.TASK_SUFFIXES.values())))
  tok, lower = casing.hf_tokenizer(model_dir, given_lower, required)
  return StartPoint(HF_DIR, path, cfg, params, tok, lower, None,
                    head if head_params else None, head_params)


# ----------------------------------------------------------------------------- TF


def load_tf(path, step, given_lower, rng, required) -> StartPoint:
  if step is not None:
    raise ValueError(f'{path}: step={step} applies to training workdirs only')
  prefix = google_tf.checkpoint_prefix(path)
  directory = fs.dirname(prefix)
  cfg = _tf_checkpoint_config(prefix)
  state, task_heads = google_tf.read_tf_checkpoint(prefix, cfg)
  params = hf.params_from_hf(state, cfg, rng=rng, source=prefix)
  head, head_params = google_tf.task_head(task_heads, cfg.hidden_size, prefix)
  vocab = fs.join(directory, 'vocab.txt')
  if fs.exists(vocab):
    found, evidence = google_tf.casing(directory, vocab)
    lower = casing.resolve(found, evidence, given_lower, directory)
    tok = WordPieceTokenizer(vocab, lower)
  else:
    tok, lower = casing.missing(directory, required, 'vocab.txt')
  return StartPoint(TF_CHECKPOINT, path, cfg, params, tok, lower, None, head, head_params)


def _tf_checkpoint_config(prefix: str) -> BertConfig:
  """The bert_config.json released next to a TF checkpoint."""
  directory = fs.dirname(prefix)
  config_file = fs.join(directory, 'bert_config.json')
  if not fs.exists(config_file):
    raise hf.CheckpointError(f'{directory}: no bert_config.json next to the TF checkpoint; '
                             'copy the one released with it')
  return google_tf.tf_config(config_file)


LOADERS = {WORKDIR: load_workdir, HF_DIR: load_hf, TF_CHECKPOINT: load_tf}


def model_config_of(path: str) -> BertConfig:
  """A start point's encoder config without reading its weights (AOT compilation of a
  fine-tuning step needs the shapes only); `random:` prefixes are ignored."""
  path = path[len(RANDOM) + 1:] if path.startswith(RANDOM + ':') else path
  kind = detect_kind(path)
  if kind == WORKDIR:
    return model_config(workdir.load_run_config(path))
  if kind == HF_DIR:
    return hf.load_config(_sentence_transformers_dir(path) or path)
  return _tf_checkpoint_config(google_tf.checkpoint_prefix(path))
