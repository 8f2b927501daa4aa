"""A sentence-embedding model -> a sentence-transformers directory.

`save_sentence_transformer` writes what `sentence_transformers.SentenceTransformer(path)` loads
and embeds with as our fine-tuning run does (bert_jax.finetune.contrastive.pool):
  config.json, model.safetensors   the bare encoder: HF `BertModel` (arch 'bert': hf.py's map
                                   without the `bert.` prefix; the pooler only when the params
                                   have one), `ModernBertModel` (arch 'modern': hf_modern.py's
                                   encoder map without `model.`), `(XLM)RobertaModel` (arch
                                   'roberta' / 'xlm-roberta': hf_roberta.py's, no `roberta.`)
                                   or `ElectraModel` (hf_electra.py's, no `electra.`);
  tokenizer files                  `tokenizer.save_pretrained`, as every export writes them;
  modules.json                     Transformer at '' and Pooling at '1_Pooling';
  1_Pooling/config.json            mean or CLS pooling, in the keys every sentence-transformers
                                   release reads (6.x converts them to its `pooling_mode`);
  sentence_bert_config.json        max_seq_length (inputs are cut there, as in training);
  config_sentence_transformers.json  cosine similarity, and the prompts trained with
                                   (`{'query': ..., 'document': ...}`), which
                                   `encode(texts, prompt_name='query')`, `encode_query` and
                                   `encode_document` prepend to each text as training did.
  README.md                        for a Matryoshka model only: its trained dimensions and how
                                   to load one (`SentenceTransformer(path, truncate_dim=64)`:
                                   sentence-transformers takes `truncate_dim` when loading and
                                   keeps no default for it in any config file).
The module types are named as sentence-transformers 2-5 wrote them
(`sentence_transformers.models.*`), which 6.x still resolves and `convert/loaders.py`
recognises: the directory is also a start point (`start_points.load_start_point(path)`).

No Normalize module: cosine similarity, the loss's and the retrieval's, does not need one.
A BERT tree without a pooler (a contrastive model never trains one) exports without it, and
HF then initialises `BertModel`'s pooler afresh with a warning: sentence-transformers never
uses the pooler's output.
"""

from __future__ import annotations

import json
import os
import tempfile

import jax
import numpy as np

from bert_jax.convert import hf
from bert_jax.model import encoder as model
from bert_jax.model.encoder import BertConfig
from input_pipeline import fs

POOLING_KEYS = {'mean': 'pooling_mode_mean_tokens', 'cls': 'pooling_mode_cls_token'}
# The keys all-MiniLM-L6-v2's 1_Pooling/config.json has: what every release reads.
_ALL_POOLING_KEYS = ('pooling_mode_cls_token', 'pooling_mode_mean_tokens',
                     'pooling_mode_max_tokens', 'pooling_mode_mean_sqrt_len_tokens')
POOLING_DIR = '1_Pooling'
MODULES = [
    {'idx': 0, 'name': '0', 'path': '', 'type': 'sentence_transformers.models.Transformer'},
    {'idx': 1, 'name': '1', 'path': POOLING_DIR, 'type': 'sentence_transformers.models.Pooling'},
]
# Written last to an object store: a reader that finds it finds the rest.
_LAST = 'modules.json'


def encoder_state(params, cfg: BertConfig) -> hf.StateDict:
  """The bare encoder's HF tensors (`BertModel` / `ModernBertModel` keys, float32 numpy)."""
  params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), dict(params))
  missing = [g for g in ('embeddings', 'encoder') if g not in params]
  if missing:
    raise ValueError(f'params lack {missing}; expected a head model\'s or pre-training tree '
                     '(embeddings, encoder, ...)')
  # hf.params_to_hf converts the family's whole MLM tree: fill the groups a head model lacks
  # with zeros, convert with the encoder bare, and keep the encoder (and a pooler the params
  # really have), not the MLM head's tensors.
  abstract = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
  complete = {k: params[k] if k in params else
              jax.tree_util.tree_map(lambda s: np.zeros(s.shape, np.float32), abstract[k])
              for k in abstract}
  if 'pooler' in params:  # RoBERTa's pre-training tree has none
    complete['pooler'] = params['pooler']
  heads_ = hf.converter(cfg).mlm_prefixes
  state = {k: v for k, v in hf.params_to_hf(complete, cfg, prefix='').items()
           if not k.startswith(heads_) and ('pooler' in params or not k.startswith('pooler.'))}
  return {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}


def hf_config(cfg: BertConfig) -> dict:
  """The bare encoder's config.json (`BertModel`, `ModernBertModel`, `RobertaModel`, ...)."""
  return hf.config_to_hf(cfg, hf.converter(cfg).architecture('Model'))


def pooling_config(hidden_size: int, pooling: str) -> dict:
  if pooling not in POOLING_KEYS:
    raise ValueError(f'pooling={pooling!r}: expected one of {sorted(POOLING_KEYS)}')
  return {'word_embedding_dimension': hidden_size,
          **{key: key == POOLING_KEYS[pooling] for key in _ALL_POOLING_KEYS}}


def save_sentence_transformer(path: str, cfg: BertConfig, params, tokenizer,
                              pooling: str = 'mean', overwrite: bool = False, *,
                              max_seq_length: int | None = None,
                              prompts: dict[str, str] | None = None,
                              matryoshka_dims: tuple[int, ...] = ()) -> str:
  """Write a sentence-transformers directory at `path` (local or URL) atomically; returns it.

  `params`: a head model's or pre-training tree (`embeddings`, `encoder`, maybe `pooler`,
  heads; only the encoder is written). `pooling`: 'mean' or 'cls', as trained.
  `max_seq_length`: where sentence-transformers cuts inputs; the model's
  max_position_embeddings when None (pass the fine-tuning run's max_seq_length).
  `prompts`: {name: text prepended to an input}, sentence-transformers' `prompts` (6.x names
  the query and document ones 'query' and 'document'); none by default.
  `matryoshka_dims`: the dimensions a Matryoshka loss trained, named in README.md.
  """
  if tokenizer is None:
    raise ValueError('a sentence-transformers directory needs the tokenizer: pass the one the '
                     'model was trained with')
  state = encoder_state(params, cfg)  # converts (and so validates) before writing
  config = hf_config(cfg)
  pool = pooling_config(cfg.hidden_size, pooling)
  max_len = max_seq_length or cfg.max_length
  if not 0 < max_len <= cfg.max_length:
    raise ValueError(f'max_seq_length={max_len}: expected 1..{cfg.max_length} (the model\'s '
                     'max_position_embeddings, less RoBERTa\'s position offset)')

  def write(tmp: str) -> None:
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
    files = {'config.json': config, _LAST: MODULES,
             'sentence_bert_config.json': {'max_seq_length': max_len, 'do_lower_case': False},
             'config_sentence_transformers.json': {
                 'model_type': 'SentenceTransformer', 'similarity_fn_name': 'cosine',
                 'prompts': dict(prompts or {}), 'default_prompt_name': None},
             os.path.join(POOLING_DIR, 'config.json'): pool}
    if matryoshka_dims:
      with open(os.path.join(tmp, 'README.md'), 'w') as f:
        f.write(matryoshka_card(matryoshka_dims))
    os.makedirs(os.path.join(tmp, POOLING_DIR))
    for name, content in files.items():
      with open(os.path.join(tmp, name), 'w') as f:
        json.dump(content, f, indent=2)
    save_file(state, os.path.join(tmp, 'model.safetensors'), metadata={'format': 'pt'})
    tokenizer.save_pretrained(tmp)

  return _publish(path, write, overwrite)


def matryoshka_card(dims: tuple[int, ...]) -> str:
  """README.md of a Matryoshka export: which truncations were trained, how to load one."""
  listed = ', '.join(str(d) for d in sorted(dims, reverse=True))
  return (f'# Matryoshka sentence embeddings\n\nTrained at the leading {listed} dimensions '
          '(a Matryoshka loss over MultipleNegativesRankingLoss), so a truncated embedding '
          'keeps its meaning:\n\n```python\nfrom sentence_transformers import '
          f'SentenceTransformer\nmodel = SentenceTransformer(path, truncate_dim={min(dims)})\n'
          '```\n\nCompare truncated embeddings by cosine similarity (the model\'s '
          'similarity function), which re-normalizes them as training did.\n')


def _publish(path: str, write, overwrite: bool) -> str:
  """fs.publish_dir locally (a rename); on an object store, where that uploads top-level
  files only, every file under the built directory with modules.json last."""
  if not fs.is_url(path):
    return fs.publish_dir(path, write, overwrite=overwrite)
  if fs.exists(path) and not overwrite and fs.listdir(path):
    raise FileExistsError(f'{path} exists and is not empty; pass overwrite=True or choose '
                          'another directory')
  with tempfile.TemporaryDirectory(prefix='bert_jax_publish_') as tmp:
    write(tmp)
    files = sorted((os.path.relpath(os.path.join(root, name), tmp)
                    for root, _, names in os.walk(tmp) for name in names),
                   key=lambda rel: rel == _LAST)
    for rel in files:
      with open(os.path.join(tmp, rel), 'rb') as f:
        fs.write_bytes(fs.join(path, *rel.split(os.sep)), f.read())
  return path
