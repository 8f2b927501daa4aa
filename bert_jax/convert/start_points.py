"""One loader for every place a fine-tuning (or continued pre-training) run can start from.

  start = load_start_point(path)            # (model config, params, tokenizer) from any of:
  - our training workdir (`checkpoints/` + `config.json`): latest or a given step, the run's
    model config, and the tokenizer named by `data.vocab_file` / `data.spm_model`;
  - a HuggingFace directory: `BertForPreTraining`, `BertModel` (no `bert.` prefix, no heads),
    a sentence-transformers layout (`modules.json` pointing at the Transformer module), or a
    fine-tuned `BertFor<Task>` export (its head comes along as `start.head`);
  - a Google TF checkpoint as google-research/bert released them (`bert_model.ckpt.*`,
    `bert_config.json`, `vocab.txt`), read by variable name without building a TF graph.
Each may be a URL (gs://...): workdirs are read in place, HF directories and TF checkpoints
are staged into a temporary local directory first (`_load_url`).

Params come back in `BertForPreTraining`'s layout whatever the source; heads the source lacks
are initialised fresh with a warning. `init_head_params` puts a task head on top.

Casing is a property of the start point, not a flag to remember: an uncased vocabulary fed
cased text maps most capitalised words to other ids and loses accuracy without any error.
It is read from the start point (HF `tokenizer_config.json`, the workdir's config, Google's
model name, a SentencePiece model's normaliser, or the vocabulary itself) and a conflicting
`do_lower_case` is a ValueError.

`train.init_from` (continued pre-training) takes every kind through the same checks
(`pretraining_params`): params relaid out to the run's `model.scan_layers`, shapes compared
leaf by leaf with the run's model, and vocabulary and casing compared with the run's data.
Files are looked up through `input_pipeline.fs`, so a workdir and its vocabulary may be URLs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tempfile
from typing import Any

import jax
import numpy as np

from bert_jax import checkpointing, heads, hf, hf_heads
from bert_jax.model import BertConfig, init_params
from input_pipeline import fs
from input_pipeline.tokenizer import SentencePieceTokenizer, WordPieceTokenizer, load_tokenizer

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


def _tf_checkpoint_prefix(path: str) -> str | None:
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
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    latest = tf.train.latest_checkpoint(path)
    if latest:
      return latest
  found = sorted(p[:-len('.index')] for p in fs.glob(fs.join(path, '*.index')))
  if len(found) > 1:
    raise hf.CheckpointError(f'{path}: several TF checkpoints {found}; pass one prefix '
                             '(e.g. DIR/model.ckpt-1000)')
  return found[0] if found else None


def _sentence_transformers_dir(path: str) -> str | None:
  """The Transformer module's directory of a sentence-transformers model, if `path` is one."""
  modules = fs.join(path, 'modules.json')
  if not fs.exists(modules):
    return None
  entries = json.loads(fs.read_text(modules))
  for entry in entries:
    if entry.get('type', '').endswith('models.Transformer'):
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
  if _tf_checkpoint_prefix(path):
    return TF_CHECKPOINT
  raise hf.CheckpointError(
      f'{path}: not a start point. Expected a training workdir (checkpoints/ + config.json), '
      'a HuggingFace directory (config.json + model.safetensors or pytorch_model.bin; '
      'sentence-transformers: modules.json), or a TF checkpoint (bert_config.json + '
      'bert_model.ckpt.index/.data-*)')


# ----------------------------------------------------------------------------- casing

# google-research/bert tokenization.validate_case_matches_checkpoint's model names, widened to
# every size and the whole-word-masking variants released later.
_GOOGLE_NAME = re.compile(
    r'^(?:wwm_)?(uncased|cased|multi_cased|multilingual|chinese)_L-\d+_H-\d+_A-\d+$')
_GOOGLE_LOWER = {'uncased': True, 'multilingual': True, 'chinese': True,
                 'cased': False, 'multi_cased': False}


def vocab_is_uncased(vocab_file: str) -> bool:
  """An uncased WordPiece vocabulary has no token with an uppercase letter (lower-cased text
  could never produce one); [CLS]-style specials are skipped."""
  for token in fs.read_text(vocab_file).split('\n'):
    if token.startswith('[') and token.endswith(']'):
      continue
    if token != token.lower():
      return False
  return True


def _resolve_casing(found: bool, evidence: str, given: bool | None, path: str) -> bool:
  """The start point's casing, or a ValueError when the caller asked for the other one."""
  if given is not None and given != found:
    have, want = ('uncased', 'a cased') if found else ('cased', 'an uncased')
    raise ValueError(
        f'{path}: the start point is {have} (do_lower_case={found}, from {evidence}) but '
        f'do_lower_case={given} was given. Drop do_lower_case to use the start point\'s '
        f'casing, or start from {want} model: the other casing maps words to ids the '
        'model never saw in pre-training and silently costs accuracy.')
  return found


def _wordpiece(vocab_file: str, lower: bool):
  return WordPieceTokenizer(vocab_file, lower)


def _sentencepiece(model_file: str, given: bool | None, path: str):
  """(tokenizer, casing): a SentencePiece model's casing is its own (`spm_is_uncased`: its
  normaliser folds case, or no piece has an upper-case letter), never a guess or a flag."""
  tok = SentencePieceTokenizer(model_file)
  evidence = f'{fs.basename(model_file)}\'s normaliser and pieces'
  return tok, _resolve_casing(tok.do_lower_case, evidence, given, path)


def _no_tokenizer(path: str, required: bool, looked_for: str):
  if required:
    raise hf.CheckpointError(f'{path}: no tokenizer ({looked_for}); copy the vocabulary the '
                             'model was trained with next to it')
  return None, None


def _hf_tokenizer(path: str, given: bool | None, required: bool):
  """WordPiece vocab.txt (casing from tokenizer_config.json, else the vocabulary) or our
  exported SentencePiece `spiece.model`."""
  vocab, spm = fs.join(path, 'vocab.txt'), fs.join(path, 'spiece.model')
  if fs.exists(vocab):
    found, evidence = _hf_casing(path, vocab)
    lower = _resolve_casing(found, evidence, given, path)
    return _wordpiece(vocab, lower), lower
  if fs.exists(spm):
    return _sentencepiece(spm, given, path)
  return _no_tokenizer(path, required, 'vocab.txt or spiece.model')


def _hf_casing(path: str, vocab: str) -> tuple[bool, str]:
  # sentence_bert_config.json's do_lower_case is sentence-transformers' own pre-lowering
  # switch (False in all-MiniLM-L6-v2, whose tokenizer lowercases): not the tokenizer's.
  config = fs.join(path, 'tokenizer_config.json')
  if fs.exists(config):
    value = json.loads(fs.read_text(config)).get('do_lower_case')
    if value is not None:
      return bool(value), 'tokenizer_config.json do_lower_case'
  lower = vocab_is_uncased(vocab)
  return lower, f'vocab.txt ({"no" if lower else "some"} uppercase tokens)'


# ----------------------------------------------------------------------------- workdir


def _relayout(params: dict, scanned: bool, num_layers: int, to_scanned: bool) -> dict:
  """Encoder layers stacked (`layers`, scan) <-> one group per layer (`layer_i`)."""
  if scanned == to_scanned:
    return params
  enc = params['encoder']
  if to_scanned:
    layers = [enc[f'layer_{i}'] for i in range(num_layers)]
    new = {'layers': jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)}
  else:
    new = {f'layer_{i}': jax.tree_util.tree_map(lambda x, i=i: np.asarray(x[i]), enc['layers'])
           for i in range(num_layers)}
  return {**params, 'encoder': new}


def _load_workdir(path, step, given_lower, rng, required, overrides) -> StartPoint:
  del rng  # a workdir holds every pre-training head
  from bert_jax.export import load_run_config  # pylint: disable=g-import-not-at-top
  from bert_jax.run_setup import model_config  # pylint: disable=g-import-not-at-top
  config = load_run_config(path)
  step, params = checkpointing.restore_params(path, step)
  stored = model_config(config)
  cfg = stored.replace(**overrides) if overrides else stored
  params = _relayout(params, stored.scan_layers, cfg.num_layers, cfg.scan_layers)
  tok, lower = _workdir_tokenizer(config.data, path, given_lower, required)
  return StartPoint(WORKDIR, path, cfg, params, tok, lower, step)


def _workdir_tokenizer(d, path: str, given: bool | None, required: bool):
  """(tokenizer, casing) config.json names (`data.spm_model` or `data.vocab_file`, a local
  path or a URL). A file that is not there is an error when `required`; otherwise a warning
  and no tokenizer (train.init_from then refuses to go on unchecked: `check_vocabulary`)."""
  field = 'spm_model' if d.spm_model else 'vocab_file' if d.vocab_file else None
  if field is None:
    return _no_tokenizer(path, required, 'config.json sets neither data.vocab_file nor '
                         'data.spm_model')
  file = d[field]
  if not fs.exists(file):
    message = (f'{path}/config.json: data.{field}={file!r} does not exist here; run from the '
               'directory training ran in, or copy the file there')
    if required:
      raise FileNotFoundError(message)
    logging.warning('%s', message)
    return None, None
  if field == 'spm_model':
    return _sentencepiece(file, given, path)
  lower = _resolve_casing(bool(d.do_lower_case), 'config.json data.do_lower_case', given, path)
  return _wordpiece(file, lower), lower


# ----------------------------------------------------------------------------- HF


def _load_hf(path, step, given_lower, rng, required, overrides) -> StartPoint:
  if step is not None:
    raise ValueError(f'{path}: step={step} applies to training workdirs only')
  model_dir = _sentence_transformers_dir(path) or path
  hf_config = json.loads(fs.read_text(fs.join(model_dir, 'config.json')))
  cfg = hf.load_config(model_dir)
  if overrides:
    cfg = cfg.replace(**overrides)
  state = hf._read_weights(model_dir)  # pylint: disable=protected-access
  head_state = {k: state.pop(k) for k in list(state)
                if k.startswith(('classifier.', 'qa_outputs.'))}
  params = hf.params_from_hf(state, cfg, rng=rng, source=model_dir)
  head = hf_heads.head_from_hf_config(hf_config, fs.join(model_dir, 'config.json'))
  head_params = (hf_heads.head_from_hf(head_state, head, cfg.hidden_size, model_dir)
                 if head else None)
  if head_state and head_params is None:
    logging.warning('%s: ignored %s: config.json architectures %s name no task head we know '
                    '(%s)', model_dir, sorted(head_state), hf_config.get('architectures'),
                    sorted(hf_heads.ARCHITECTURES.values()))
  tok, lower = _hf_tokenizer(model_dir, given_lower, required)
  return StartPoint(HF_DIR, path, cfg, params, tok, lower, None,
                    head if head_params else None, head_params)


# ----------------------------------------------------------------------------- TF


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
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
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


def _tf_head(task_heads: dict, hidden_size: int, source: str):
  for task, tensors in task_heads.items():
    if len(tensors) == 2:
      num_labels = tensors[f'{heads.HEAD_PARAM[task]}.weight'].shape[0]
      head = heads.Head(task, num_labels=num_labels if task == heads.SEQUENCE else 2)
      return head, hf_heads.head_from_hf(tensors, head, hidden_size, source)
  return None, None


def _google_casing(directory: str, vocab: str) -> tuple[bool, str]:
  match = _GOOGLE_NAME.match(os.path.basename(os.path.normpath(directory)))
  if match:
    return _GOOGLE_LOWER[match.group(1)], f'the model name {match.group(0)}'
  lower = vocab_is_uncased(vocab)
  return lower, f'vocab.txt ({"no" if lower else "some"} uppercase tokens)'


def _load_tf(path, step, given_lower, rng, required, overrides) -> StartPoint:
  if step is not None:
    raise ValueError(f'{path}: step={step} applies to training workdirs only')
  prefix = _tf_checkpoint_prefix(path)
  directory = fs.dirname(prefix)
  config_file = fs.join(directory, 'bert_config.json')
  if not fs.exists(config_file):
    raise hf.CheckpointError(f'{directory}: no bert_config.json next to the TF checkpoint; '
                             'copy the one released with it')
  cfg = tf_config(config_file)
  if overrides:
    cfg = cfg.replace(**overrides)
  state, task_heads = read_tf_checkpoint(prefix, cfg)
  params = hf.params_from_hf(state, cfg, rng=rng, source=prefix)
  head, head_params = _tf_head(task_heads, cfg.hidden_size, prefix)
  vocab = fs.join(directory, 'vocab.txt')
  if fs.exists(vocab):
    found, evidence = _google_casing(directory, vocab)
    lower = _resolve_casing(found, evidence, given_lower, directory)
    tok = _wordpiece(vocab, lower)
  else:
    tok, lower = _no_tokenizer(directory, required, 'vocab.txt')
  return StartPoint(TF_CHECKPOINT, path, cfg, params, tok, lower, None, head, head_params)


# ----------------------------------------------------------------------------- public API

_LOADERS = {WORKDIR: _load_workdir, HF_DIR: _load_hf, TF_CHECKPOINT: _load_tf}


def load_start_point(path: str, *, step: int | None = None, do_lower_case: bool | None = None,
                     rng: jax.Array | None = None, require_tokenizer: bool = True,
                     **config_overrides: Any) -> StartPoint:
  """(config, params, tokenizer) from a workdir, an HF directory or a TF checkpoint.

  `step` picks a workdir checkpoint (default the latest). `do_lower_case`, when given, must
  agree with the start point's casing (ValueError otherwise). `rng` initialises heads the
  start point lacks. `config_overrides` set our-only knobs: dtype, scan_layers, remat_policy,
  attention_impl, dropout rates.
  """
  if path.startswith(RANDOM + ':'):
    return random_start_point(path[len(RANDOM) + 1:], rng=rng, do_lower_case=do_lower_case,
                              require_tokenizer=require_tokenizer, **config_overrides)
  if fs.is_url(path):
    return _load_url(path, step, do_lower_case, rng, require_tokenizer, config_overrides)
  kind = detect_kind(path)
  return _LOADERS[kind](path, step, do_lower_case, rng, require_tokenizer, config_overrides)


# Files a TF checkpoint prefix URL needs besides `<prefix>.*`.
_TF_SIDE_FILES = ('bert_config.json', 'vocab.txt')


def _load_url(url, step, given_lower, rng, required, overrides) -> StartPoint:
  """A start point at a URL (gs://...). A training workdir is read in place (Orbax and our
  file-system layer read URLs). An HF directory or a Google TF checkpoint (a directory or a
  prefix) is staged into a temporary local directory of the same name -- the HF weight
  readers and TF's checkpoint reader need local files, and Google's casing comes from the
  directory name -- and loaded from there; the tokenizer is in memory, so nothing refers to
  the staged copy afterwards. A directory is copied whole, a prefix only `<prefix>.*`,
  bert_config.json and vocab.txt."""
  url = url.rstrip('/')
  if _is_workdir(url):
    return _load_workdir(url, step, given_lower, rng, required, overrides)
  prefix = fs.exists(url + '.index')
  source = fs.dirname(url) if prefix else url
  if not fs.exists(source):
    raise FileNotFoundError(f'{url}: no such start point')
  with tempfile.TemporaryDirectory(prefix='bert_jax_start_') as tmp:
    local = os.path.join(tmp, fs.basename(source) or 'start_point')
    if prefix:
      name = fs.basename(url)
      os.makedirs(local)
      for f in fs.listdir(source):
        if f.startswith(name + '.') or f in _TF_SIDE_FILES:
          with open(os.path.join(local, f), 'wb') as out:
            out.write(fs.read_bytes(fs.join(source, f)))
    else:
      fs.download_dir(source, local)
    local_path = os.path.join(local, fs.basename(url)) if prefix else local
    try:
      start = _LOADERS[detect_kind(local_path)](local_path, step, given_lower, rng, required,
                                                overrides)
    except (ValueError, FileNotFoundError) as e:  # name the URL, not the staged copy
      try:
        renamed = type(e)(str(e).replace(local, source))
      except TypeError:
        raise e from None
      raise renamed from None
  return dataclasses.replace(start, path=url)


def _is_workdir(path: str) -> bool:
  """Our training workdir (local or URL): it has `checkpoints/`."""
  return fs.isdir(fs.join(path, 'checkpoints'))


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
  from bert_jax import model  # pylint: disable=g-import-not-at-top
  rng = jax.random.key(0) if rng is None else rng
  params = jax.tree_util.tree_map(np.asarray, model.init_params(start.cfg, rng))
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
_SHAPE_FIELDS = {'vocab_size': 'model.vocab_size', 'hidden_size': 'model.size',
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
  wanted = jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0)))
  differ = checkpointing.leaf_differences(start.params, wanted, labels=('start point', 'run'))
  fields = [f for f in _SHAPE_FIELDS if getattr(start.cfg, f) != getattr(model_cfg, f)]
  if fields:
    field = fields[0]
    raise ValueError(
        f'train.init_from={source}: {field} is {getattr(start.cfg, field)}, but the run\'s '
        f'model has {getattr(model_cfg, field)} ({differ}); set --config.{_SHAPE_FIELDS[field]} '
        'to match the start point')
  if differ:
    raise ValueError(f'train.init_from={source}: its parameters do not fit the run\'s model '
                     f'({differ}); set --config.model.* as the start point was trained')
  if start.cfg.hidden_act != model_cfg.hidden_act:
    logging.warning('train.init_from=%s was trained with hidden_act=%s, the run uses %s; set '
                    '--config.model.hidden_act=%s to keep the same function', source,
                    start.cfg.hidden_act, model_cfg.hidden_act, start.cfg.hidden_act)


ALLOW_VOCAB_CHANGE = '--config.train.init_from_allow_vocab_change=True'


def check_vocabulary(start: StartPoint, data, source: str, allow_change: bool = False) -> None:
  """The run's data must use the start point's vocabulary (same content: a sha256 of the
  token list or SentencePiece model, `Tokenizer.fingerprint`) and casing (`data.do_lower_case`
  for WordPiece; a SentencePiece model's is its own). Otherwise the same ids mean other words
  and continued pre-training silently unlearns; a ValueError names both sides and the fix,
  or, with `allow_change` (ALLOW_VOCAB_CHANGE, a deliberate change), a warning.

  A run that names no data.vocab_file / data.spm_model has nothing to compare: a warning."""
  if not (data.vocab_file or data.spm_model):
    logging.warning('train.init_from=%s: the run names no data.vocab_file or data.spm_model, '
                    'so the start point\'s vocabulary and casing are not checked against the '
                    'data; name the one the data was made with to have them checked', source)
    return
  field = 'data.spm_model' if data.spm_model else 'data.vocab_file'
  run_tok = load_tokenizer(data.vocab_file or None, data.spm_model or None,
                           bool(data.do_lower_case))
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
  return getattr(tok, 'vocab_file', None) or getattr(tok, 'model_file', '?')


def _tokenizer_file(start: StartPoint) -> str:
  """A workdir names its vocabulary in config.json; other kinds hold theirs (possibly in a
  staged copy, so named by the start point's path and the file's name)."""
  file = _tokenizer_file_name(start.tokenizer)
  return file if start.kind == WORKDIR else f'{fs.basename(file)} of {start.path}'


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
  start = load_start_point(init_from, rng=rng, require_tokenizer=False,
                           scan_layers=model_cfg.scan_layers)
  check_compatible(start, model_cfg, init_from)
  if data is not None:
    check_vocabulary(start, data, init_from, allow_vocab_change)
  return start.step or 0, start.params
