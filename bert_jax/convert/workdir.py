"""Our training workdir as a model: its run config, its tokenizer, its export to HF.

A workdir holds `checkpoints/` and the `config.json` training wrote when it started, which
names the model and the tokenizer (`data.vocab_file`, `spm_model` or `tokenizer`). `export_workdir`
turns the latest (or a given) checkpoint into a HuggingFace `BertForPreTraining` (or
`ModernBertForMaskedLM`) directory,
whatever mesh or optimizer wrote it (`python -m bert_jax.export` is its command line).
"""

from __future__ import annotations

import json

import ml_collections

from bert_jax.convert import hf
from configs import upgrade
from bert_jax.training import checkpointing
from bert_jax.training.run_setup import model_config
from input_pipeline import fs
from input_pipeline.tokenizer_files import data_tokenizer


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The config the run was started with (`workdir/config.json`, a path or a URL), with the
  fields an earlier version did not write filled by today's defaults (`upgrade_config`)."""
  path = fs.join(workdir, 'config.json')
  if not fs.exists(path):
    raise FileNotFoundError(f'{path}: missing; pass the training config (--config) instead')
  return upgrade.upgrade_config(ml_collections.ConfigDict(json.loads(fs.read_text(path))))


def run_tokenizer(config):
  """The tokenizer the run's data names (`tokenizer_files.data_tokenizer`), or None."""
  return data_tokenizer(config.data)


def export_workdir(workdir: str, output: str, step: int | None = None, config=None,
                   overwrite: bool = True) -> str:
  """Writes the workdir's latest (or `step`) params as an HF directory; returns `output`."""
  config = config if config is not None else load_run_config(workdir)
  step, params = checkpointing.restore_params(workdir, step)
  cfg = model_config(config).replace(scan_layers=config.model.scan_layers)
  return hf.save_pretrained(output, cfg, params, tokenizer=run_tokenizer(config),
                            overwrite=overwrite)
