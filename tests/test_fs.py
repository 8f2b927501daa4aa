"""input_pipeline/fs.py's local files get the process umask's mode, as open() would give them:
results, configs and exports shared with a team are readable by it."""

import os
import stat

import pytest

from bert_jax.convert import hf
from bert_jax.model import encoder
from bert_jax.model.encoder import BertConfig
from input_pipeline import fs
from tests.hf_reference import random_params


@pytest.fixture
def umask():
  previous = os.umask(0o022)
  yield lambda mask: os.umask(mask)
  os.umask(previous)


def mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


def test_process_umask_reads_without_changing_it(umask):
  umask(0o027)
  assert fs.process_umask() == 0o027 and fs.process_umask() == 0o027


def test_written_files_and_exports_follow_the_umask(umask, tmp_path):
  cfg = BertConfig.from_preset('tiny', vocab_size=64)
  params = random_params(encoder.init_params, cfg)
  for mask, file_mode, dir_mode in ((0o022, 0o644, 0o755), (0o077, 0o600, 0o700)):
    umask(mask)
    out = tmp_path / f'umask_{mask:o}'
    out.mkdir()
    fs.write_text(str(out / 'results.json'), '{}')
    assert mode(out / 'results.json') == file_mode
    export = hf.save_pretrained(str(out / 'export'), cfg, params)
    assert mode(export) == dir_mode
    for name in os.listdir(export):
      assert mode(os.path.join(export, name)) == file_mode, name
