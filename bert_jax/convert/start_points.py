"""One loader for every place a fine-tuning (or continued pre-training) run can start from.

  start = load_start_point(path)            # (model config, params, tokenizer) from any of:
  - our training workdir (`checkpoints/` + `config.json`): latest or a given step, the run's
    model config, and the tokenizer named by `data.vocab_file`, `spm_model` or `tokenizer`;
  - a HuggingFace directory: `BertForPreTraining`, `BertModel` (no `bert.` prefix, no heads),
    a sentence-transformers layout (`modules.json` pointing at the Transformer module), or a
    fine-tuned `BertFor<Task>` export (its head comes along as `start.head`); the same for
    ModernBERT, RoBERTa and XLM-R (`RobertaForMaskedLM`'s `lm_head` is our MLM head) and
    ELECTRA (a generator's MLM head is ours; a discriminator's RTD head is dropped);
  - a Google TF checkpoint as google-research/bert released them (`bert_model.ckpt.*`,
    `bert_config.json`, `vocab.txt`), read by variable name without building a TF graph.
Each may be a URL (gs://...): workdirs are read in place, HF directories and TF checkpoints
are staged into a temporary local directory first (`staging`).

Params come back in `BertForPreTraining`'s layout whatever the source; heads the source lacks
are initialised fresh with a warning. `init_head_params` puts a task head on top.

Casing is a property of the start point, not a flag to remember (`casing`): it is read from
the start point and a conflicting `do_lower_case` is a ValueError.

`train.init_from` (continued pre-training) takes every kind through the same checks
(`pretraining_params`): params relaid out to the run's `model.scan_layers`, shapes compared
leaf by leaf with the run's model, and vocabulary and casing compared with the run's data.
Files are looked up through `input_pipeline.fs`, so a workdir and its vocabulary may be URLs.

This module is the public API; the work is done in `loaders` (kinds, detection, one loader
per kind), `google_tf`, `casing` and `staging`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import numpy as np

from bert_jax.convert import loaders, staging
from bert_jax.convert.loaders import (  # re-exported: part of this module's API
    HF_DIR, RANDOM, TF_CHECKPOINT, WORKDIR, StartPoint, detect_kind)
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig, init_params
from bert_jax.training import checkpointing
from bert_jax.training.run_setup import INIT_FROM, start_shape_fields
from input_pipeline import fs
from input_pipeline.tokenizer_files import data_tokenizer, data_tokenizer_field

__all__ = ['ALLOW_VOCAB_CHANGE', 'HF_DIR', 'RANDOM', 'TF_CHECKPOINT', 'WORKDIR', 'StartPoint',
           'check_compatible', 'check_sentence_objective', 'check_vocab_size',
           'check_vocabulary', 'detect_kind',
           'init_head_params', 'load_start_point', 'pretraining_params', 'random_start_point',
           'randomized']


def load_start_point(path: str, *, step: int | None = None, do_lower_case: bool | None = None,
                     rng: jax.Array | None = None, require_tokenizer: bool = True,
                     **config_overrides: Any) -> StartPoint:
  """(config, params, tokenizer) from a workdir, an HF directory or a TF checkpoint.

  `step` picks a workdir checkpoint (default the latest). `do_lower_case`, when given, must
  agree with the start point's casing (ValueError otherwise). `rng` initialises heads the
  start point lacks. `config_overrides` set our-only knobs (dtype, scan_layers, remat_policy,
  attention_impl, dropout rates) on the stored config, through `with_config`; a run applies
  its `config.model` with `run_setup.model_config` / `finetune.run.load_start` instead.
  """
  if path.startswith(RANDOM + ':'):
    return random_start_point(path[len(RANDOM) + 1:], rng=rng, do_lower_case=do_lower_case,
                              require_tokenizer=require_tokenizer, **config_overrides)
  if fs.is_url(path):
    start = staging.load_url(path, step, do_lower_case, rng, require_tokenizer)
  else:
    start = loaders.LOADERS[detect_kind(path)](path, step, do_lower_case, rng, require_tokenizer)
  if config_overrides:
    start = with_config(start, start.cfg.replace(**config_overrides))
  if start.tokenizer is not None:
    check_vocab_size(start.tokenizer, start.cfg.vocab_size, 'its model\'s vocab_size',
                     f'{path}: its tokenizer {fs.basename(_tokenizer_file_name(start.tokenizer))}',
                     'Put the tokenizer the model was trained with beside it.')
  return start


def with_config(start: StartPoint, cfg: BertConfig) -> StartPoint:
  """`start` computing as `cfg` says (a run's dtype, dropout, attention, remat and layer
  layout over the stored config): its params relaid out to `cfg.scan_layers`. The shape and
  family must stay the stored ones."""
  shape = ('arch', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size', 'vocab_size')
  changed = [f for f in shape if getattr(cfg, f) != getattr(start.cfg, f)]
  if changed:
    raise ValueError(f'{start.path}: a run may change how the model computes, not its shape '
                     f'or family ({", ".join(changed)})')
  params = loaders.relayout(start.params, start.cfg.scan_layers, cfg.num_layers, cfg.scan_layers)
  return dataclasses.replace(start, cfg=cfg, params=params)


def with_start_shape(config):
  """A pre-training config with `model.size=init_from` as a copy whose `config.model` holds
  train.init_from's shape and family (run_setup.start_shape_fields of its stored config, read
  without its weights); any other config as it is. Continued pre-training thus takes any
  released checkpoint's shape (ELECTRA-small's 256/128 split, MiniLM-L6, an 8,194-position
  XLM-R), not only a preset's; the workdir's config.json keeps the filled fields, so export and
  resume read them without the start point."""
  m = config.model
  if m.size != INIT_FROM or m.get('hidden_size') is not None:
    return config
  if not config.train.init_from:
    raise ValueError(f'model.size={INIT_FROM} takes the shape of train.init_from, which is not '
                     'set; pass --config.train.init_from=<start point> or name a size')
  stored = loaders.model_config_of(config.train.init_from)
  config = config.copy_and_resolve_references()
  config.model.update(start_shape_fields(stored))
  return config


def random_start_point(path: str, *, rng: jax.Array | None = None, **kwargs: Any) -> StartPoint:
  """`random:<path>`: the start point at `path` with every weight drawn afresh as
  pre-training initialises them (`model.init_params`, `rng`, default key 0): the same model
  config, tokenizer and casing, no pre-training. The baseline that shows what pre-training is
  worth; `randomized` redraws it per fine-tuning seed. A task head `path` carries is dropped."""
  if path.startswith(RANDOM + ':'):
    raise ValueError(f'{RANDOM}:{path}: random: given twice')
  start = load_start_point(path, **kwargs)
  return randomized(dataclasses.replace(start, kind=RANDOM, path=f'{RANDOM}:{start.path}',
                                        step=None, head=None, head_params=None), rng)


def randomized(start: StartPoint, rng: jax.Array | None = None) -> StartPoint:
  """`start` with fresh BertForPreTraining weights from `rng` (float32 numpy, its layout)."""
  rng = jax.random.key(0) if rng is None else rng
  params = jax.tree_util.tree_map(np.asarray, init_params(start.cfg, rng))
  return dataclasses.replace(start, params=params)


def init_head_params(start: StartPoint, head: heads.Head | None = None,
                     rng: jax.Array | None = None, fresh_head: bool = False
                     ) -> tuple[heads.Head, dict]:
  """(head, params of `heads.build_model(start.cfg, head)`): the start point's encoder with
  its own fine-tuned head when it has one for this task, else a fresh head (logged).

  `head=None` takes the start point's head (an error if it has none). A start point's head
  for another task or label count is not reused; with `fresh_head=True` it never is.
  """
  head = head or start.head
  if head is None:
    raise ValueError(f'{start.path}: has no task head; pass head=heads.Head(task, num_labels)')
  own = None
  if (not fresh_head and start.head is not None and start.head.task == head.task
      and start.head.num_labels == head.num_labels):
    own = start.head_params
  elif not fresh_head and start.head is not None:
    logging.warning('%s carries a %s head with %d labels; %s with %d labels gets a fresh one',
                    start.path, start.head.task, start.head.num_labels, head.task,
                    head.num_labels)
  params = heads.with_encoder(start.params, start.cfg, head, rng, head_params=own,
                              source=start.path)
  return head, params


# Architecture fields that must agree between a start point and the run's --config.model.
_SHAPE_FIELDS = {'vocab_size': 'model.vocab_size', 'embedding_size': 'model.embedding_size',
                 'hidden_size': 'model.size',
                 'num_layers': 'model.size', 'num_heads': 'model.size',
                 'intermediate_size': 'model.size',
                 'max_position_embeddings': 'model.size (max_position_embeddings)',
                 'type_vocab_size': 'model.size (type_vocab_size)'}


def check_compatible(start: StartPoint, model_cfg: BertConfig, source: str) -> None:
  """A start point whose params do not fit the run's model is a ValueError naming the leaves
  with both shapes and, when a config field explains it, the field and the flag to set; a
  different activation is only a warning (training adapts, but it is not the same net).

  Leaves are compared with `model_cfg`'s own params (shapes only, nothing allocated) after
  the relayout, so the same check covers every kind and layout: without it a workdir of
  another size passed and died at the first step with Flax's ScopeParamShapeError."""
  if start.cfg.arch != model_cfg.arch:
    raise ValueError(
        f'train.init_from={source} is model.arch={start.cfg.arch!r}, the run\'s model is '
        f'{model_cfg.arch!r}; set --config.model.arch={start.cfg.arch} (the same block, '
        f'positions and heads) and the size that matches it, or --config.model.size={INIT_FROM} '
        'to take both from the start point')
  wanted = jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0)))
  differ = checkpointing.leaf_differences(start.params, wanted, labels=('start point', 'run'))
  fields = [f for f in _SHAPE_FIELDS if getattr(start.cfg, f) != getattr(model_cfg, f)]
  if fields:
    field = fields[0]
    raise ValueError(
        f'train.init_from={source}: {field} is {getattr(start.cfg, field)}, but the run\'s '
        f'model has {getattr(model_cfg, field)} ({differ}); set --config.{_SHAPE_FIELDS[field]} '
        f'to match the start point, or --config.model.size={INIT_FROM} to take its shape')
  if differ:
    raise ValueError(f'train.init_from={source}: its parameters do not fit the run\'s model '
                     f'({differ}); set --config.model.* as the start point was trained')
  if start.cfg.hidden_act != model_cfg.hidden_act:
    logging.warning('train.init_from=%s was trained with hidden_act=%s, the run uses %s; set '
                    '--config.model.hidden_act=%s to keep the same function', source,
                    start.cfg.hidden_act, model_cfg.hidden_act, start.cfg.hidden_act)


def check_vocab_size(tokenizer, vocab_size: int, model: str, source: str, fix: str) -> None:
  """A tokenizer's ids must index the model's embedding table. More tokens than rows is a
  ValueError: an id past the table is clipped to the last row by XLA's gather without a word
  (a ModernBERT config's default 50,368 with mmBERT's 256k tokenizer trains on garbage).
  Fewer is a model that pads its vocabulary (ModernBERT pads 50,280 ids to 50,368 rows, a
  multiple of 64, for faster matmuls): logged, since no id ever reaches those rows."""
  tokens = tokenizer.vocab_size
  if tokens > vocab_size:
    raise ValueError(
        f'{source} has {tokens:,} tokens (ids up to {tokens - 1:,}), but {model} is '
        f'{vocab_size:,}: ids past the embedding table would be clipped to its last row '
        f'silently. {fix}')
  if tokens < vocab_size:
    logging.info('%s=%d pads the %d tokens of %s with %d rows no id uses (as ModernBERT pads '
                 '50,280 to 50,368)', model, vocab_size, tokens, source, vocab_size - tokens)


def check_max_seq_length(cfg: BertConfig, length: int, model: str, fix: str) -> None:
  """Rows of `length` tokens must fit `model`'s position table (`cfg.max_length`): RoBERTa's
  positions start at pad + 1 = 2 (`position_offset`), so its 514 rows hold 512 tokens, and a
  longer row would index past the table without a word. A ValueError names the fields and
  `fix`."""
  if length > cfg.max_length:
    offset = f', positions from {cfg.position_offset}' if cfg.position_offset else ''
    raise ValueError(f'data.max_seq_length={length} exceeds the {cfg.max_length} tokens '
                     f'{model} position embeddings hold, max_position_embeddings='
                     f'{cfg.max_position_embeddings}{offset}; {fix}')


ALLOW_VOCAB_CHANGE = '--config.train.init_from_allow_vocab_change=True'


def check_vocabulary(start: StartPoint, data, source: str, allow_change: bool = False) -> None:
  """The run's data must use the start point's vocabulary (same content: a sha256 of the
  token list, SentencePiece model or tokenizer.json's model and normaliser,
  `Tokenizer.fingerprint`) and casing (`data.do_lower_case` for WordPiece; a SentencePiece
  model's and a tokenizer.json's are their own). Otherwise the same ids mean other words
  and continued pre-training silently unlearns; a ValueError names both sides and the fix,
  or, with `allow_change` (ALLOW_VOCAB_CHANGE, a deliberate change), a warning.

  A run that names no tokenizer (data.vocab_file, spm_model or tokenizer) has nothing to
  compare: a warning."""
  run_tok = data_tokenizer(data)
  if run_tok is None:
    logging.warning('train.init_from=%s: the run names no data.vocab_file, data.spm_model or '
                    'data.tokenizer, so the start point\'s vocabulary and casing are not '
                    'checked against the data; name the one the data was made with to have '
                    'them checked', source)
    return
  field = data_tokenizer_field(data).split('=')[0]
  problems = []
  if start.tokenizer is None:
    problems.append(f'it has no vocabulary that can be read here to compare with {field}; '
                    'copy the one it was trained with next to it (or where its config.json '
                    'says)')
  elif start.tokenizer.fingerprint != run_tok.fingerprint:
    problems.append(f'its vocabulary {_tokenizer_file(start)} (sha256 '
                    f'{start.tokenizer.fingerprint[:12]}) is not the run\'s {field}='
                    f'{_tokenizer_file_name(run_tok)} (sha256 {run_tok.fingerprint[:12]}); '
                    f'make the data with the start point\'s vocabulary and set {field} to it')
  elif start.do_lower_case != run_tok.do_lower_case:
    problems.append(f'it is {"un" if start.do_lower_case else ""}cased (do_lower_case='
                    f'{start.do_lower_case}) but the run has data.do_lower_case='
                    f'{bool(data.do_lower_case)}; set --config.data.do_lower_case='
                    f'{start.do_lower_case} and make the data with that casing')
  if not problems:
    return
  message = f'train.init_from={source}: {"; ".join(problems)}'
  if allow_change:
    logging.warning('%s. Going on: train.init_from_allow_vocab_change=True', message)
    return
  raise ValueError(f'{message}. Or pass {ALLOW_VOCAB_CHANGE} to change it deliberately.')


def _tokenizer_file_name(tok) -> str:
  return (getattr(tok, 'vocab_file', None) or getattr(tok, 'model_file', None)
          or getattr(tok, 'tokenizer_file', '?'))


def _tokenizer_file(start: StartPoint) -> str:
  """A workdir names its vocabulary in config.json; other kinds hold theirs (possibly in a
  staged copy, so named by the start point's path and the file's name)."""
  file = _tokenizer_file_name(start.tokenizer)
  return file if start.kind == WORKDIR else f'{fs.basename(file)} of {start.path}'


def check_sentence_objective(start: StartPoint, objective: str, source: str) -> None:
  """A family without a sentence head (RoBERTa and XLM-R: MLM alone on full sentences;
  ELECTRA: replaced-token detection; ModernBERT) cannot be continued with NSP or SOP: that would
  train a fresh head on the pooled first state (and a pooler it never had), no longer the
  released model's objective."""
  family = start.cfg.family
  if not family.sentence_head and objective != 'none':
    raise ValueError(
        f'train.init_from={source} is a {start.cfg.arch} checkpoint, pre-trained with '
        f'{family.pretrained_with} and without a sentence head, but data.sentence_objective='
        f'{objective!r}; set --config.data.sentence_objective=none (records written by '
        f'create_pretraining_data --next_sentence=none) and --config.model.arch={start.cfg.arch}')


def pretraining_params(init_from: str, model_cfg: BertConfig, rng: jax.Array | None = None, *,
                       data=None, allow_vocab_change: bool = False) -> tuple[int, dict]:
  """(step, BertForPreTraining params in `model_cfg`'s layout) for `train.init_from`.

  Every kind goes through the same path: our workdir (its latest step), an HF directory or a
  TF checkpoint (step 0, missing pre-training heads initialised fresh) is loaded in the run's
  layer layout (`model.scan_layers`, either way), its params checked against the run's model
  (`check_compatible`) and, given the run's `data` config, its vocabulary and casing against
  the data's (`check_vocabulary`). All before the first step, which otherwise fails (another
  size) or trains on ids that mean other words (another vocabulary).
  """
  start = load_start_point(init_from, rng=rng, require_tokenizer=False)
  if data is not None:
    check_sentence_objective(start, data.sentence_objective, init_from)
  if not start.cfg.family.sentence_head and 'pooler' in start.params:
    # Released RoBERTa checkpoints carry a pooler MLM pre-training neither uses nor trains
    # (an ElectraForMultipleChoice its summary, our pooler).
    start = dataclasses.replace(start, params={k: v for k, v in start.params.items()
                                               if k != 'pooler'})
  start = with_config(start, start.cfg.replace(scan_layers=model_cfg.scan_layers))
  check_compatible(start, model_cfg, init_from)
  if data is not None:
    check_vocabulary(start, data, init_from, allow_vocab_change)
  return start.step or 0, start.params
