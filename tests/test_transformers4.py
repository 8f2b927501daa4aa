"""ModernBERT exports in transformers 4.x (4.57.6, the last: .venv/transformers4 from
requirements-transformers4.txt, installed by scripts/setup_env.sh) as well as in 5.x: 4.48-4.57
read the rotary thetas only from `global_rope_theta` / `local_rope_theta` and fall back to a
global theta of 160,000, so a phase-1 export (10,000) must carry them for 4.x to run our model."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf, hf_modern
from bert_jax.model import encoder
from bert_jax.model.encoder import BertConfig, BertForPreTraining
from tests.hf_reference import random_params
from tests.tolerance import assert_trees_close, tree_scale

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRANSFORMERS4 = os.path.join(ROOT, '.venv', 'transformers4')
RTOL = 1e-4  # of the largest logit, float32
# Run under 4.x: each export's logits and the config 4.x holds, saved beside it.
LOAD_IN_4X = '''
import json, os, sys
import numpy as np, torch, transformers
print(transformers.__version__)
ids, mask = np.load(sys.argv[1]), np.load(sys.argv[2])
for d in sys.argv[3:]:
  model, info = transformers.AutoModelForMaskedLM.from_pretrained(d, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  with torch.no_grad():
    out = model.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  np.save(os.path.join(d, 'logits_4x.npy'), out.logits.numpy())
  with open(os.path.join(d, 'config_4x.json'), 'w') as f:
    json.dump(model.config.to_dict(), f)
'''


def start_transformers4(dirs: list[str], ids: np.ndarray, mask: np.ndarray,
                        tmp) -> subprocess.Popen:
  """LOAD_IN_4X in a subprocess with 4.57 first on the path; runs while this one works."""
  if not os.path.isdir(os.path.join(TRANSFORMERS4, 'transformers')):
    pytest.fail(f'{TRANSFORMERS4}: no transformers 4.x; run bash scripts/setup_env.sh '
                '(requirements-transformers4.txt)')
  np.save(tmp / 'ids.npy', ids)
  np.save(tmp / 'mask.npy', mask)
  # USE_TORCH / USE_FLAX: 4.x would otherwise import the TensorFlow and JAX .venv has (~10 s).
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([TRANSFORMERS4, ROOT]), USE_TORCH='1',
             USE_FLAX='0')
  return subprocess.Popen(
      [sys.executable, '-c', LOAD_IN_4X, str(tmp / 'ids.npy'), str(tmp / 'mask.npy'), *dirs],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def export(tmp, name: str, global_theta: float, local_theta: float):
  """A tiny random ModernBERT (global, local, local, global; window 16) written as HF."""
  cfg = BertConfig.from_preset('tiny', arch='modern', vocab_size=300, num_layers=4,
                               local_window=16, global_rope_theta=global_theta,
                               local_rope_theta=local_theta)
  params = random_params(encoder.init_params, cfg)  # the same for every theta (no parameter)
  return cfg, params, hf.save_pretrained(str(tmp / name), cfg, params)


def logits_here(cfg: BertConfig, params, out: str, ids: np.ndarray,
                mask: np.ndarray) -> np.ndarray:
  """The export's logits in transformers 5.x, checked against our model's."""
  ours = jax.jit(BertForPreTraining(cfg).apply)(
      {'params': params}, jnp.asarray(ids), jnp.asarray(mask))
  model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
  thetas = {k: v['rope_theta'] for k, v in model.config.rope_parameters.items()}
  assert thetas == {'full_attention': cfg.global_rope_theta,
                    'sliding_attention': cfg.local_rope_theta}
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  real = mask.astype(bool)
  assert_trees_close(np.asarray(ours.mlm_logits)[real], want[real], RTOL)
  return want


def test_exports_give_the_same_logits_in_transformers_4_and_5_and_here(tmp_path):
  """Phase 1's thetas (10,000 in every layer) and non-default ones in both layer kinds. The
  phase-1 export as written before (rope_parameters only) is the control: 4.x runs it with
  a global theta of 160,000, so these rows do tell the thetas apart."""
  exports = [export(tmp_path, 'phase1', 10_000.0, 10_000.0),
             export(tmp_path, 'other', 1_000.0, 100.0)]
  old = str(tmp_path / 'phase1_rope_parameters_only')
  shutil.copytree(exports[0][2], old)
  config = json.loads((tmp_path / 'phase1' / 'config.json').read_text())
  assert (config['global_rope_theta'], config['local_rope_theta']) == (10_000.0, 10_000.0)
  del config['global_rope_theta'], config['local_rope_theta']
  with open(os.path.join(old, 'config.json'), 'w') as f:
    json.dump(config, f)

  rng = np.random.default_rng(0)
  ids = rng.integers(3, 300, (2, 100))
  mask = np.ones((2, 100), np.int64)
  mask[1, 67:] = 0
  real = mask.astype(bool)
  proc = start_transformers4([e[2] for e in exports] + [old], ids, mask, tmp_path)

  try:
    wants = [logits_here(cfg, params, out, ids, mask)[real] for cfg, params, out in exports]
  except BaseException:
    proc.kill()
    raise

  stdout, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 0, stderr[-3000:]
  assert stdout.split()[0] == '4.57.6', stdout
  for (cfg, _, out), want in zip(exports, wants):
    assert_trees_close(np.load(os.path.join(out, 'logits_4x.npy'))[real], want, RTOL)
    with open(os.path.join(out, 'config_4x.json')) as f:
      assert hf_modern.config_from_hf(json.load(f)) == cfg.replace(scan_layers=True)
  before = np.load(os.path.join(old, 'logits_4x.npy'))[real]
  assert np.abs(before - wants[0]).max() > 100 * RTOL * tree_scale(wants[0])


def test_config_from_hf_reads_either_generations_thetas_and_refuses_two_that_disagree():
  cfg = BertConfig.from_preset('tiny', arch='modern', vocab_size=300, num_layers=4,
                               global_rope_theta=10_000.0, local_rope_theta=1_000.0)
  both = hf_modern.config_to_hf(cfg)
  legacy_only = {k: v for k, v in both.items() if k not in ('rope_parameters', 'layer_types')}
  new_only = {k: v for k, v in both.items()
              if k not in ('global_rope_theta', 'local_rope_theta')}
  for form in (both, legacy_only, new_only):
    assert hf_modern.config_from_hf(form) == cfg.replace(scan_layers=True)
  with pytest.raises(hf.CheckpointError, match='global_rope_theta=160000.0'):
    hf_modern.config_from_hf(dict(both, global_rope_theta=160_000.0))
