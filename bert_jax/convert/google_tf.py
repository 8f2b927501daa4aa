"""Google TF checkpoints as google-research/bert released them, read without a TF graph.

A checkpoint is `bert_model.ckpt.{index,data-*}` next to `bert_config.json` and `vocab.txt`
(or a fine-tuning run's `model.ckpt-N`). `read_tf_checkpoint` maps its variables by name to
HF `BertForPreTraining` keys (modeling.py's and run_pretraining.py's scopes), so the HF
import (`hf.params_from_hf`) does the rest; the task heads of run_classifier.py and
run_squad.py come along (`task_head`), optimizer slots are skipped. `casing` reads the
casing from Google's model names (`uncased_L-12_H-768_A-12`). TensorFlow (seconds to import)
is imported only when a checkpoint is read.
"""

from __future__ import annotations

import json
import logging
import os
import re

import numpy as np

from bert_jax.convert import casing as casing_lib, hf, hf_heads
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig
from input_pipeline import fs


def checkpoint_prefix(path: str) -> str | None:
  """The checkpoint prefix at `path` (a prefix itself, or a directory holding one)."""
  if fs.exists(path + '.index'):
    return path
  if not fs.isdir(path):
    return None
  preferred = fs.join(path, 'bert_model.ckpt')
  if fs.exists(preferred + '.index'):
    return preferred
  state = fs.join(path, 'checkpoint')
  if fs.exists(state):  # a fine-tuning run's model_dir: the latest model.ckpt-N
    from input_pipeline.tf_data import tf  # pylint: disable=g-import-not-at-top
    latest = tf.train.latest_checkpoint(path)
    if latest:
      return latest
  found = sorted(p[:-len('.index')] for p in fs.glob(fs.join(path, '*.index')))
  if len(found) > 1:
    raise hf.CheckpointError(f'{path}: several TF checkpoints {found}; pass one prefix '
                             '(e.g. DIR/model.ckpt-1000)')
  return found[0] if found else None


# google-research/bert tokenization.validate_case_matches_checkpoint's model names, widened to
# every size and the whole-word-masking variants released later.
_GOOGLE_NAME = re.compile(
    r'^(?:wwm_)?(uncased|cased|multi_cased|multilingual|chinese)_L-\d+_H-\d+_A-\d+$')
_GOOGLE_LOWER = {'uncased': True, 'multilingual': True, 'chinese': True,
                 'cased': False, 'multi_cased': False}


def casing(directory: str, vocab: str) -> tuple[bool, str]:
  """(do_lower_case, evidence): from the released model's directory name, else `vocab`."""
  match = _GOOGLE_NAME.match(os.path.basename(os.path.normpath(directory)))
  if match:
    return _GOOGLE_LOWER[match.group(1)], f'the model name {match.group(0)}'
  return casing_lib.vocab_casing(vocab)


def _tf_names(cfg: BertConfig) -> dict[str, tuple[str, bool]]:
  """google-research/bert variable name -> (HF key without `bert.`, transpose?).

  modeling.py and run_pretraining.py's scopes; dense kernels are [in, out] (HF is [out, in]),
  `output_weights` are already [out, in], LayerNorms are gamma/beta.
  """
  m = {
      'bert/embeddings/word_embeddings': ('embeddings.word_embeddings.weight', False),
      'bert/embeddings/position_embeddings': ('embeddings.position_embeddings.weight', False),
      'bert/embeddings/token_type_embeddings':
          ('embeddings.token_type_embeddings.weight', False),
      'cls/predictions/output_bias': ('cls.predictions.bias', False),
      'cls/seq_relationship/output_weights': ('cls.seq_relationship.weight', False),
      'cls/seq_relationship/output_bias': ('cls.seq_relationship.bias', False),
  }
  dense = ['bert/pooler/dense', 'cls/predictions/transform/dense']
  norms = ['bert/embeddings/LayerNorm', 'cls/predictions/transform/LayerNorm']
  for i in range(cfg.num_layers):
    layer = f'bert/encoder/layer_{i}'
    dense += [f'{layer}/attention/self/{n}' for n in ('query', 'key', 'value')]
    dense += [f'{layer}/attention/output/dense', f'{layer}/intermediate/dense',
              f'{layer}/output/dense']
    norms += [f'{layer}/attention/output/LayerNorm', f'{layer}/output/LayerNorm']
  for scope in dense:
    key = _hf_scope(scope)
    m[f'{scope}/kernel'] = (f'{key}.weight', True)
    m[f'{scope}/bias'] = (f'{key}.bias', False)
  for scope in norms:
    key = _hf_scope(scope)
    m[f'{scope}/gamma'] = (f'{key}.weight', False)
    m[f'{scope}/beta'] = (f'{key}.bias', False)
  return m


def _hf_scope(scope: str) -> str:
  scope = scope[len('bert/'):] if scope.startswith('bert/') else scope
  return re.sub(r'layer_(\d+)', r'layer.\1', scope).replace('/', '.')


# Task heads of the reference's fine-tuning scripts: run_classifier.py (top-level
# output_weights [num_labels, H]) and run_squad.py (cls/squad, [2, H]).
_TF_HEADS = {'output_weights': (heads.SEQUENCE, 'weight'), 'output_bias': (heads.SEQUENCE, 'bias'),
             'cls/squad/output_weights': (heads.SPAN, 'weight'),
             'cls/squad/output_bias': (heads.SPAN, 'bias')}
_OPTIMIZER_SLOT = re.compile(r'(/adam_[mv]|/Adam(_\d+)?|/LAMB[^/]*|^global_step|'
                             r'^good_steps|^loss_scale|^current_loss_scale)$')


def tf_config(file: str) -> BertConfig:
  """bert_config.json -> BertConfig. Its "gelu" is modeling.py's tanh approximation, so it
  becomes gelu_tanh: the function the weights were trained with (HF maps it to exact erf)."""
  try:
    raw = json.loads(fs.read_text(file))
  except (OSError, ValueError) as e:
    raise hf.CheckpointError(f'{file}: unreadable ({e})') from None
  raw = {**raw, 'model_type': 'bert'}
  if raw.get('hidden_act') == 'gelu':
    raw['hidden_act'] = 'gelu_new'  # HF's name for the tanh form
  return hf.config_from_hf(raw, source=file)


def read_tf_checkpoint(prefix: str, cfg: BertConfig) -> tuple[hf.StateDict, dict]:
  """(HF-keyed float32 state dict, task-head tensors by task) from a TF checkpoint."""
  from input_pipeline.tf_data import tf  # pylint: disable=g-import-not-at-top
  try:
    reader = tf.train.load_checkpoint(prefix)
  except Exception as e:  # TF raises several types for missing or corrupt files
    raise hf.CheckpointError(f'{prefix}: not a readable TF checkpoint ({e})') from None
  names = _tf_names(cfg)
  state, task_heads, unknown = {}, {}, []
  for var in sorted(reader.get_variable_to_shape_map()):
    if var in names:
      key, transpose = names[var]
      value = np.asarray(reader.get_tensor(var), np.float32)
      state[key] = value.T.copy() if transpose else value
    elif var in _TF_HEADS:
      task, part = _TF_HEADS[var]
      task_heads.setdefault(task, {})[f'{heads.HEAD_PARAM[task]}.{part}'] = np.asarray(
          reader.get_tensor(var), np.float32)
    elif not _OPTIMIZER_SLOT.search(var):
      unknown.append(var)
  if unknown:
    logging.warning('%s: ignored %d variables that are not BERT\'s: %s', prefix, len(unknown),
                    unknown[:8])
  return state, task_heads


def task_head(task_heads: dict, hidden_size: int, source: str):
  """(head, head params) of the first complete task head `read_tf_checkpoint` found, or
  (None, None)."""
  for task, tensors in task_heads.items():
    if len(tensors) == 2:
      num_labels = tensors[f'{heads.HEAD_PARAM[task]}.weight'].shape[0]
      head = heads.Head(task, num_labels=num_labels if task == heads.SEQUENCE else 2)
      return head, hf_heads.head_from_hf(tensors, head, hidden_size, source)
  return None, None
