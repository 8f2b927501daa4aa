"""ModernBERT-architecture releases in their released shapes against transformers' classes:
ModernBERT-base and -large, an Ettin encoder (ettin-encoder-32m) and mmBERT-small (a 256k
Gemma vocabulary, pad id 0, local rotary theta 160,000), from their config.json as released
(tests/data/released_configs/, README there says where each comes from).

Each family's config is kept as released except `num_hidden_layers`, cut to 4 (global, local,
local, global) so that both attention kinds run within the test's time; rows of 160 tokens
(one ending in padding) are longer than the 128-token window, so the local layers do differ
from the global ones. Random float32 weights; the bar is the issue's, 1e-4 of the largest
reference value (the errors, ~1e-6 of it, are printed with -s). Per family:
  - the encoder's hidden states and the MLM logits equal ModernBertForMaskedLM's;
  - ModernBertForSequenceClassification (the config's classifier_pooling) on that encoder
    equals ours, and our fine-tuned export loads in AutoModelForSequenceClassification;
  - our MLM export loads in AutoModelForMaskedLM with no missing or unexpected keys and gives
    the same logits in transformers 5.x and 4.57 (.venv/transformers4, as in
    tests/test_transformers4.py), and loads back as a start point (`train.init_from`,
    `--init`) with the same config and weights.
"""

import json
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers.initialization import no_init_weights

from bert_jax.convert import hf, hf_heads, hf_modern, loaders
from bert_jax.model import heads
from bert_jax.model.encoder import BertForPreTraining
from tests.hf_reference import randomize, state_dict
from tests.test_transformers4 import ROOT, TRANSFORMERS4

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data',
                          'released_configs')
FAMILIES = ('ModernBERT-base', 'ModernBERT-large', 'ettin-encoder-32m', 'mmBERT-small')
LAYERS = 4  # global, local, local, global (every one of them global_attn_every_n_layers=3)
LENGTH, PADDED_FROM = 160, 136  # both rows longer than the 128-token window
RTOL = 1e-4  # of the largest reference value, float32 (the bar)
# Fields transformers reads from config.json that decide the numbers, and the config's own
# (token ids are the tokenizer's: exported beside it, see README in released_configs/).
NUMERIC_FIELDS = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_attention_heads',
                  'num_hidden_layers', 'hidden_activation', 'classifier_activation', 'norm_eps',
                  'norm_bias', 'attention_bias', 'mlp_bias', 'classifier_bias', 'decoder_bias',
                  'local_attention', 'layer_types', 'rope_parameters', 'classifier_pooling',
                  'max_position_embeddings', 'tie_word_embeddings')


def released(name: str) -> dict:
  with open(os.path.join(CONFIG_DIR, name + '.json')) as f:
    return json.load(f)


def trimmed(name: str) -> dict:
  config = dict(released(name), num_hidden_layers=LAYERS)
  if 'layer_types' in config:
    config['layer_types'] = config['layer_types'][:LAYERS]
  return config


def rows(config: dict, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Two rows of ids from the whole vocabulary (mmBERT's past 200k too), the second ending in
  the config's pad id."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, config['vocab_size'], (2, LENGTH))
  mask = np.ones((2, LENGTH), np.int64)
  mask[1, PADDED_FROM:] = 0
  ids[1, PADDED_FROM:] = config['pad_token_id']
  return ids, mask


def hf_model(cls, config: dict, seed: int, **extra):
  """`cls` of the config, eager attention, every weight random (hf_reference.randomize).
  transformers' own initialisation is skipped: randomize overwrites all of it, and torch's
  trunc_normal_ on CPU takes ~20 s for one ModernBERT-base embedding."""
  torch.manual_seed(seed)
  hf_config = transformers.ModernBertConfig(**config, **extra, attn_implementation='eager')
  with no_init_weights():
    model = cls(hf_config)
  model.tie_weights()  # skipped with the initialisation: the MLM decoder is the embeddings
  return randomize(model).eval()


def torch_run(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))


def relative_error(got, want, mask) -> tuple[float, float, float]:
  """(max |got - want|, max |want|, their ratio) over the real tokens (`mask` over the
  leading axes). In float32 torch, which reduces mmBERT's 256k-wide logits on every core
  with one temporary."""
  with warnings.catch_warnings():  # read-only (JAX's) arrays: nothing here writes to them
    warnings.filterwarnings('ignore', 'The given NumPy array is not writable')
    got, want = torch.from_numpy(np.asarray(got)), torch.from_numpy(np.asarray(want))
  real = torch.from_numpy(np.asarray(mask, bool))
  assert got.shape == want.shape and got.dtype == want.dtype == torch.float32, (got, want)
  per_token = lambda x: x.reshape(*real.shape, -1).aminmax(dim=-1)
  low, high = per_token(want)
  scale = float(torch.maximum(-low, high)[real].max())
  low, high = per_token(torch.sub(got, want))
  err = float(torch.maximum(-low, high)[real].max())
  return err, scale, err / scale


def close(got, want, mask, what: str) -> None:
  """Within RTOL of the largest reference value; the figures are printed (-s)."""
  err, scale, _ = relative_error(got, want, mask)
  print(f'{what}: max |diff| {err:.3g} / max |ref| {scale:.3g} = {err / scale:.2g}')
  assert err <= RTOL * scale, f'{what}: max |diff| {err:.3g} > {RTOL:g} x {scale:.3g}'


def assert_same_trees(got, want) -> None:
  """Bit for bit (an export read back)."""
  got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(got)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  assert got_tree == want_tree
  for (path, a), b in zip(got_leaves, want_leaves):
    assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)


# ------------------------------------------------------------------ transformers 4.57 worker

LOAD_IN_4X = '''
import json, os, sys
import numpy as np, torch, transformers
print(transformers.__version__, flush=True)
for line in sys.stdin:
  out, inputs, auto = line.split()
  model, info = getattr(transformers, auto).from_pretrained(out, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  ids, mask = np.load(os.path.join(inputs, 'ids.npy')), np.load(os.path.join(inputs, 'mask.npy'))
  with torch.no_grad():
    logits = model.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  np.save(os.path.join(inputs, 'logits_4x.npy'), logits.numpy()[mask.astype(bool)])
  with open(os.path.join(inputs, 'config_4x.json'), 'w') as f:
    json.dump(model.config.to_dict(), f)
  print('done', flush=True)
'''


class Transformers4:
  """One transformers 4.57 process for the whole module (its start costs ~10 s): each export
  is sent to it as written and answered while this process goes on."""

  def __init__(self):
    if not os.path.isdir(os.path.join(TRANSFORMERS4, 'transformers')):
      pytest.fail(f'{TRANSFORMERS4}: no transformers 4.x; run bash scripts/setup_env.sh '
                  '(requirements-transformers4.txt)')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TRANSFORMERS4, ROOT]), USE_TORCH='1',
               USE_FLAX='0')
    self.proc = subprocess.Popen([sys.executable, '-c', LOAD_IN_4X], cwd=ROOT, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    self.version = None

  def send(self, out: str, ids: np.ndarray, mask: np.ndarray, inputs: str,
           auto: str = 'AutoModelForMaskedLM') -> None:
    os.makedirs(inputs, exist_ok=True)
    np.save(os.path.join(inputs, 'ids.npy'), ids)
    np.save(os.path.join(inputs, 'mask.npy'), mask)
    self.proc.stdin.write(f'{out} {inputs} {auto}\n')
    self.proc.stdin.flush()

  def answer(self, inputs: str) -> tuple[np.ndarray, dict]:
    if self.version is None:
      self.version = self.proc.stdout.readline().strip()
    line = self.proc.stdout.readline()
    if line.strip() != 'done':
      self.proc.kill()
      pytest.fail(f'transformers 4.x failed: {line}{self.proc.stderr.read()[-3000:]}')
    with open(os.path.join(inputs, 'config_4x.json')) as f:
      return np.load(os.path.join(inputs, 'logits_4x.npy')), json.load(f)

  def close(self):
    self.proc.stdin.close()
    try:
      self.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.proc.kill()


@pytest.fixture(scope='module')
def transformers4():
  worker = Transformers4()
  yield worker
  worker.close()


# ------------------------------------------------------------------ one family at a time


class Family:
  """A family's trimmed HF model (eager attention, random weights), and ours from it."""

  def __init__(self, name: str):
    self.name = name
    self.config = trimmed(name)
    self.model = hf_model(transformers.ModernBertForMaskedLM, self.config, seed=0)
    self.cfg = hf_modern.config_from_hf(self.model.config.to_dict())
    self.params = hf_modern.params_from_hf(state_dict(self.model), self.cfg, name)
    self.ids, self.mask = rows(self.config)
    self._ours = None

  def ours(self):
    if self._ours is None:
      apply = jax.jit(BertForPreTraining(self.cfg).apply)
      self._ours = apply({'params': self.params}, jnp.asarray(self.ids), jnp.asarray(self.mask))
    return self._ours


@pytest.fixture(scope='module', params=FAMILIES)
def family(request):
  if any('transformers_4' in item.name for item in request.session.items):
    request.getfixturevalue('transformers4')  # first: its ~10 s of imports overlap our work
  # Module scope with params: pytest runs every test of one family before building the next,
  # so one family's models (mmBERT's 98M-entry embedding) are alive at a time.
  return Family(request.param)


@pytest.mark.parametrize('name', FAMILIES)
def test_every_numeric_field_of_the_released_config_is_read_and_exported(name):
  """The full-depth released config: our config carries each field transformers' numbers
  depend on, and our export's config.json is read by transformers as the released one is."""
  config = released(name)
  cfg = hf_modern.config_from_hf(config, name)
  want = transformers.ModernBertConfig(**config).to_dict()  # as transformers reads it
  assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads,
          cfg.intermediate_size, cfg.max_position_embeddings) == (
              want['vocab_size'], want['hidden_size'], want['num_hidden_layers'],
              want['num_attention_heads'], want['intermediate_size'],
              want['max_position_embeddings'])
  assert (cfg.layer_norm_eps, cfg.local_window, cfg.classifier_pooling) == (
      want['norm_eps'], want['local_attention'], want['classifier_pooling'])
  assert want['layer_types'] == ['full_attention' if cfg.is_global(i) else 'sliding_attention'
                                 for i in range(cfg.num_layers)]
  assert (cfg.global_rope_theta, cfg.local_rope_theta) == (
      want['rope_parameters']['full_attention']['rope_theta'],
      want['rope_parameters']['sliding_attention']['rope_theta'])
  got = transformers.ModernBertConfig(**hf_modern.config_to_hf(cfg)).to_dict()
  assert {k: got[k] for k in NUMERIC_FIELDS} == {k: want[k] for k in NUMERIC_FIELDS}


def test_hidden_states_and_masked_lm_logits_match_transformers(family):
  ours = family.ours()
  encoder_outputs = []  # ModernBertModel's, seen on the way through ModernBertForMaskedLM
  hook = family.model.model.register_forward_hook(
      lambda module, args, output: encoder_outputs.append(output.last_hidden_state))
  try:
    logits = torch_run(family.model, family.ids, family.mask).logits
  finally:
    hook.remove()
  close(ours.sequence_output, encoder_outputs[0].numpy(), family.mask,
        f'{family.name} hidden states')
  close(ours.mlm_logits, logits.numpy(), family.mask, f'{family.name} MLM logits')
  # The rows do reach past the window: with every layer global, the states are far off.
  all_global = jax.jit(BertForPreTraining(family.cfg.replace(global_attention_every=1)).apply)(
      {'params': family.params}, jnp.asarray(family.ids), jnp.asarray(family.mask),
      masked_lm_positions=jnp.zeros((2, 1), jnp.int32)).sequence_output
  assert relative_error(all_global, encoder_outputs[0].numpy(), family.mask)[2] > 1000 * RTOL


def test_export_loads_in_transformers_4_and_5_and_back_as_a_start_point(family, tmp_path,
                                                                        transformers4):
  out = hf.save_pretrained(str(tmp_path / 'export'), family.cfg, family.params)
  transformers4.send(out, family.ids, family.mask, str(tmp_path / 'in4x'))
  want = np.asarray(family.ours().mlm_logits)

  model, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert type(model).__name__ == 'ModernBertForMaskedLM'
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  exported = model.config.to_dict()
  assert ({k: exported[k] for k in NUMERIC_FIELDS}
          == {k: family.model.config.to_dict()[k] for k in NUMERIC_FIELDS})
  close(want, torch_run(model.eval(), family.ids, family.mask).logits.numpy(), family.mask,
        f'{family.name} export in {transformers.__version__}')

  # train.init_from / --init: the export is a start point with the same config and weights.
  start = loaders.LOADERS[loaders.HF_DIR](out, None, True, None, False)
  assert start.cfg == family.cfg
  assert_same_trees(start.params, family.params)

  logits_4x, config_4x = transformers4.answer(str(tmp_path / 'in4x'))
  assert transformers4.version == '4.57.6'
  assert hf_modern.config_from_hf(config_4x) == family.cfg
  close(want[family.mask.astype(bool)], logits_4x, np.ones(logits_4x.shape[:1], bool),
        f'{family.name} export in 4.57.6')


def test_sequence_classification_matches_transformers_and_exports(family, tmp_path):
  """ModernBertForSequenceClassification with the config's pooling (mean for all four), on
  the pre-trained encoder (what fine-tuning with --init starts from) and a random classifier."""
  torch.manual_seed(1)
  config = transformers.ModernBertConfig(**family.config, num_labels=3,
                                         attn_implementation='eager')
  with no_init_weights():
    model = transformers.ModernBertForSequenceClassification(config)
  model.model, model.head = family.model.model, family.model.head
  randomize(model.classifier)
  model.eval()
  assert model.config.classifier_pooling == family.config['classifier_pooling']
  head = heads.Head(heads.SEQUENCE, num_labels=3)
  params = hf_heads.finetuned_from_hf(state_dict(model), family.cfg, head, family.name)
  got = jax.jit(heads.build_model(family.cfg, head).apply)(
      {'params': params}, jnp.asarray(family.ids), jnp.asarray(family.mask))
  want = torch_run(model, family.ids, family.mask).logits.numpy()
  whole_rows = np.ones((2,), bool)
  close(got, want, whole_rows, f'{family.name} sequence classification')

  out = hf_heads.save_finetuned(str(tmp_path / 'tuned'), family.cfg, head, params)
  back, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, output_loading_info=True)
  assert type(back).__name__ == 'ModernBertForSequenceClassification'
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  assert back.config.classifier_pooling == family.config['classifier_pooling']
  close(got, torch_run(back.eval(), family.ids, family.mask).logits.numpy(), whole_rows,
        f'{family.name} sequence classification export')


def test_config_quirks_transformers_would_run_differently_are_refused_or_followed():
  """What config_from_hf would otherwise read silently wrong."""
  base = released('ModernBERT-base')
  for bad, match in ((dict(rope_scaling={'rope_type': 'yarn', 'factor': 4.0}), 'yarn'),
                     (dict(rope_parameters={'full_attention': {'rope_type': 'linear',
                                                               'rope_theta': 1e4}}), 'linear'),
                     (dict(tie_word_embeddings=False), 'tie_word_embeddings'),
                     (dict(classifier_activation='silu'), 'classifier_activation'),
                     (dict(hidden_activation='gelu_pytorch_tanh'), 'classifier_activation')):
    with pytest.raises(hf.CheckpointError, match=match):
      hf_modern.config_from_hf(dict(base, **bad))
  # transformers 4.x: a null local theta is the global one.
  cfg = hf_modern.config_from_hf(dict(base, local_rope_theta=None))
  assert cfg.local_rope_theta == cfg.global_rope_theta == 160_000.0
  tanh = hf_modern.config_from_hf(dict(base, hidden_activation='gelu_pytorch_tanh',
                                       classifier_activation='gelu_new'))
  assert tanh.hidden_act == 'gelu_tanh'
