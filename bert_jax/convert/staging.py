"""Start points at URLs (gs://...): a workdir is read in place, the other kinds are staged.

Orbax and `input_pipeline.fs` read URLs, so a training workdir needs no copy. The HF weight
readers and TF's checkpoint reader need local files, and Google's casing comes from the
directory name, so an HF directory or a Google TF checkpoint is copied into a temporary
local directory of the same name and loaded from there.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from bert_jax.convert import loaders
from input_pipeline import fs

# Files a TF checkpoint prefix URL needs besides `<prefix>.*`.
_TF_SIDE_FILES = ('bert_config.json', 'vocab.txt')


def load_url(url, step, given_lower, rng, required) -> loaders.StartPoint:
  """A start point at a URL (gs://...). A training workdir is read in place (Orbax and our
  file-system layer read URLs). An HF directory or a Google TF checkpoint (a directory or a
  prefix) is staged into a temporary local directory of the same name -- the HF weight
  readers and TF's checkpoint reader need local files, and Google's casing comes from the
  directory name -- and loaded from there; the tokenizer is in memory, so nothing refers to
  the staged copy afterwards. A directory is copied whole, a prefix only `<prefix>.*`,
  bert_config.json and vocab.txt."""
  url = url.rstrip('/')
  if loaders.is_workdir(url):
    return loaders.load_workdir(url, step, given_lower, rng, required)
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
      load = loaders.LOADERS[loaders.detect_kind(local_path)]
      start = load(local_path, step, given_lower, rng, required)
    except (ValueError, FileNotFoundError) as e:  # name the URL, not the staged copy
      try:
        renamed = type(e)(str(e).replace(local, source))
      except TypeError:
        raise e from None
      raise renamed from None
  return dataclasses.replace(start, path=url)
