"""Fine-tuned head models <-> HuggingFace `BertForSequenceClassification`,
`BertForTokenClassification`, `BertForQuestionAnswering` and `BertForMultipleChoice` directories.

`save_finetuned` writes what `AutoModelFor{SequenceClassification,TokenClassification,
QuestionAnswering,MultipleChoice}.from_pretrained` loads with no missing or unexpected key: the
encoder under `bert.` (the pooler only for sequence and multiple-choice tasks, as HF builds the
others without one), the head as `classifier.*` or `qa_outputs.*`, and a config.json with the
architecture, `id2label` / `label2id` and `problem_type` (multiple choice has no labels: its
`classifier` is HF's `Linear(hidden, 1)` whatever config.json's num_labels says). The encoder
tensors come from `hf.params_to_hf`, so they are converted exactly as a pre-training export is.

Every family goes to and from its own `<class prefix>For<Task>` through its converter
(hf_base.Converter: class and state-dict prefixes) and its head style (model/families.py):
ModernBERT's `ModernBertFor<Task>` (the encoder under `model.`, the MLM head's transform as
`head.*`, every task's head as `classifier.*`); RoBERTa's and XLM-R's `(XLM)RobertaFor<Task>`
(the encoder under `roberta.`; the sequence head is `classifier.dense` + `classifier.out_proj`,
multiple choice keeps `roberta.pooler`); ELECTRA's `ElectraFor<Task>` (the encoder under
`electra.`; the sequence head `ElectraClassificationHead` is `classifier.dense` +
`classifier.out_proj`, multiple choice's summary `sequence_summary.summary`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.convert import hf, hf_base
from bert_jax.model import encoder as model, families, heads
from bert_jax.model.encoder import BertConfig
from bert_jax.model.heads import Head, MULTIPLE_CHOICE, SEQUENCE, SPAN, TOKEN, head_param
from input_pipeline import fs

# Task -> transformers' class name after the family's prefix (`Bert`, `Roberta`, ...).
TASK_SUFFIXES = {SEQUENCE: 'ForSequenceClassification', TOKEN: 'ForTokenClassification',
                 SPAN: 'ForQuestionAnswering', MULTIPLE_CHOICE: 'ForMultipleChoice'}
ARCHITECTURES = {task: 'Bert' + suffix for task, suffix in TASK_SUFFIXES.items()}


def architecture(cfg: BertConfig, task: str) -> str:
  return hf.converter(cfg).architecture(TASK_SUFFIXES[task])


def _task_of(class_name: str) -> str | None:
  """The task of a transformers class name of any registered family, if it names one."""
  return next((task for task, suffix in TASK_SUFFIXES.items()
               if class_name.endswith(suffix)
               and class_name[:-len(suffix)] in hf_base.class_prefixes()), None)


# ----------------------------------------------------------------------------- configs


def config_to_hf(cfg: BertConfig, head: Head) -> dict[str, Any]:
  """HF config.json of a fine-tuned model: the encoder's fields plus the head's."""
  out = hf.config_to_hf(cfg)
  out['architectures'] = [architecture(cfg, head.task)]
  if head.task != MULTIPLE_CHOICE:  # HF's default (LABEL_0, LABEL_1) there, as run_swag.py's
    names = head.label_names
    out.update(id2label={str(i): name for i, name in enumerate(names)},
               label2id={name: i for i, name in enumerate(names)})
  if head.resolved_problem_type:
    out['problem_type'] = head.resolved_problem_type
  if head.classifier_dropout is not None:
    out['classifier_dropout'] = head.classifier_dropout
    if 'summary_last_dropout' in out and head.task == MULTIPLE_CHOICE:
      out['summary_last_dropout'] = head.classifier_dropout  # ElectraSequenceSummary's
  return out


def head_from_hf_config(hf_config: Mapping[str, Any], source: str = 'config.json') -> Head | None:
  """The Head an HF config.json describes, or None for a model without a task head."""
  archs = hf_config.get('architectures') or []
  task = next((t for t in map(_task_of, archs) if t is not None), None)
  if task is None:
    return None
  if task == MULTIPLE_CHOICE:  # one score per choice: id2label describes nothing
    dropout = hf_config.get('classifier_dropout')
    if 'summary_last_dropout' in hf_config:  # ELECTRA's summary's, not the classifier's
      last = hf_config.get('summary_last_dropout', 0.1)
      dropout = None if last == hf_config.get('hidden_dropout_prob', 0.1) else last
    return Head(task, classifier_dropout=dropout)
  id2label = hf_config.get('id2label') or {}
  num_labels = len(id2label) or int(hf_config.get('num_labels', 2))
  try:
    labels = tuple(id2label[str(i)] for i in range(num_labels)) if id2label else None
  except KeyError as e:
    raise hf.CheckpointError(f'{source}: id2label lacks id {e.args[0]}; ids must be '
                             f'0..{num_labels - 1}') from None
  if labels == tuple(f'LABEL_{i}' for i in range(num_labels)):
    labels = None  # HF's default names: nothing the user chose
  head = Head(task, num_labels=num_labels, labels=None if task == SPAN else labels,
              classifier_dropout=hf_config.get('classifier_dropout'))
  problem_type = hf_config.get('problem_type') if task == SEQUENCE else None
  if problem_type and problem_type != head.resolved_problem_type:  # else HF's default anyway
    head = dataclasses.replace(head, problem_type=problem_type)
  return head


# ----------------------------------------------------------------------------- weights


def _linear_to_hf(name: str, group) -> hf.StateDict:
  return {f'{name}.weight': np.ascontiguousarray(np.asarray(group['kernel'], np.float32).T),
          f'{name}.bias': np.asarray(group['bias'], np.float32)}


def head_to_hf(params, head: Head, cfg: BertConfig) -> hf.StateDict:
  """Our head group -> HF `classifier.*` / `qa_outputs.*` (Linear weights are [out, in])."""
  name = head_param(cfg, head.task)
  if cfg.family.own_sequence_head and head.task == SEQUENCE:
    return {**_linear_to_hf(f'{name}.dense', params[name]['dense']),
            **_linear_to_hf(f'{name}.out_proj', params[name]['out_proj'])}
  return _linear_to_hf(name, params[name])


def head_from_hf(state: Mapping[str, np.ndarray], head: Head, hidden_size: int,
                 source: str = 'checkpoint', arch: str = 'bert') -> dict | None:
  """HF head tensors -> our head group, or None when the state has none for this head.

  Tensors of another size than `head` (config.json's id2label says 3 labels, the classifier
  has 5) mean an inconsistent directory: an error, not a silently fresh head.
  """
  family = families.get(arch)
  name = 'classifier' if family.heads_on_prediction_head else heads.HEAD_PARAM[head.task]
  two_layer = family.own_sequence_head and head.task == SEQUENCE
  linear = f'{name}.out_proj' if two_layer else name
  weight, bias = state.get(f'{linear}.weight'), state.get(f'{linear}.bias')
  if weight is None or bias is None:
    return None
  want = (head.num_labels, hidden_size)
  if tuple(weight.shape) != want or tuple(bias.shape) != want[:1]:
    fix = ('make config.json id2label (num_labels) match the tensors'
           if head.task in (SEQUENCE, TOKEN) else
           f'every {hf_base.for_arch(arch).architecture(TASK_SUFFIXES[head.task])} has that '
           'shape; check config.json architectures')
    raise hf.CheckpointError(
        f'{source}: {linear}.weight has shape {tuple(weight.shape)} and {linear}.bias '
        f'{tuple(bias.shape)}, but {head.task} with {head.num_labels} labels needs {want}; '
        + fix)
  group = {'kernel': np.asarray(weight, np.float32).T.copy(),
           'bias': np.asarray(bias, np.float32)}
  if not two_layer:
    return {name: group}
  dense_w, dense_b = state.get(f'{name}.dense.weight'), state.get(f'{name}.dense.bias')
  if (dense_w is None or dense_b is None or tuple(dense_w.shape) != (hidden_size, hidden_size)
      or tuple(dense_b.shape) != (hidden_size,)):
    raise hf.CheckpointError(f'{source}: {name}.out_proj comes without a {name}.dense of '
                             f'[{hidden_size}, {hidden_size}] and [{hidden_size}]; not a '
                             'RobertaClassificationHead / ElectraClassificationHead')
  return {name: {'dense': {'kernel': np.asarray(dense_w, np.float32).T.copy(),
                           'bias': np.asarray(dense_b, np.float32)},
                 'out_proj': group}}


def finetuned_from_hf(state: Mapping[str, np.ndarray], cfg: BertConfig, head: Head,
                      source: str = 'checkpoint') -> dict:
  """HF `BertFor<Task>` state dict -> params of `heads.build_model(cfg, head)`."""
  state = dict(state)
  head_state = {k: state.pop(k) for k in list(state)
                if k.startswith(('classifier.', 'qa_outputs.'))}
  own = head_from_hf(head_state, head, cfg.hidden_size, source, cfg.arch)
  if own is None:
    raise hf.CheckpointError(f'{source}: no {head_param(cfg, head.task)}.weight/.bias; not a '
                             f'{architecture(cfg, head.task)} state dict')
  # Pre-training heads (and the pooler of token/span models) are absent: params_from_hf
  # fills them fresh with a warning, with_encoder then keeps only what the head model has.
  pre = hf.params_from_hf(state, cfg, source=source)
  return heads.with_encoder(pre, cfg, head, head_params=own, source=source)


def _complete_tree(params, cfg: BertConfig) -> dict:
  """`params` plus zero-filled pre-training groups it lacks, so `hf.params_to_hf` (which
  converts the whole BertForPreTraining tree) runs; the filler tensors are dropped after.
  A pooler the pre-training tree has no place for (RoBERTa's multiple choice) is kept."""
  abstract = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
  tree = {k: params[k] if k in params else
          jax.tree_util.tree_map(lambda s: np.zeros(s.shape, np.float32), abstract[k])
          for k in abstract}
  if 'pooler' in params:
    tree['pooler'] = params['pooler']
  return tree


def finetuned_to_hf(params, cfg: BertConfig, head: Head) -> hf.StateDict:
  """A head model's params -> the HF state dict of its `(Modern)BertFor<Task>` (float32)."""
  state = hf.params_to_hf(_complete_tree(params, cfg), cfg)
  # the encoder, what every task model of the family has (ModernBERT's `head`), and the
  # pooler (ELECTRA's summary) where this task model has one
  keep = hf.converter(cfg).task_tensors(state, 'pooler' in heads.encoder_groups(cfg, head))
  keep.update(head_to_hf(params, head, cfg))
  return keep


# ----------------------------------------------------------------------------- files


def save_finetuned(path: str, cfg: BertConfig, head: Head, params, tokenizer=None,
                   overwrite: bool = False) -> str:
  """Write an HF `(Modern)BertFor<Task>` directory (config.json, model.safetensors, tokenizer files)
  atomically; returns `path`.

  Not `hf.save_pretrained`: that writes BertForPreTraining's config and `cls.*` tensors,
  which `AutoModelFor<Task>` would report as unexpected keys. The tokenizer writes its own
  files (`tokenizer.save_pretrained(dir)`), exactly as in a pre-training export.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  state = finetuned_to_hf(params, cfg, head)  # converts (and so validates) before writing
  hf_config = hf.with_tokenizer_ids(config_to_hf(cfg, head), cfg, tokenizer)

  def write(tmp: str) -> None:
    with open(os.path.join(tmp, 'config.json'), 'w') as f:
      json.dump(hf_config, f, indent=2, sort_keys=True)
    save_file(state, os.path.join(tmp, 'model.safetensors'), metadata={'format': 'pt'})
    if tokenizer is not None:
      tokenizer.save_pretrained(tmp)

  return fs.publish_dir(path, write, overwrite=overwrite)
