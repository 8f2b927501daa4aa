"""Our training workdir as a model: its run config and the tokenizer its data names.

A workdir holds `checkpoints/` and the `config.json` training wrote when it started, which
names the model and the tokenizer (`data.vocab_file`, `spm_model` or `tokenizer`);
run_export.py turns a checkpoint into a HuggingFace directory.
"""

from __future__ import annotations

import json

import ml_collections

from configs import upgrade
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
