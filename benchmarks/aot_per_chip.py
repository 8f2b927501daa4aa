r"""What fits a TPU chip, from a CPU: the real pre-training step compiled by the deviceless TPU
compiler (libtpu; `bert_jax.aot_compile`, what `python -m bert_jax.aot` runs) for one chip,
per model, row length, chip, attention core, remat policy and MLM loss (whole logits or
chunked), as a markdown table.

  .venv/bin/python benchmarks/aot_per_chip.py --models=modern-base:8192 --chips=v5e \
      --remat=none,dots,full --mlm_loss_chunk=0,512 --rows_per_chip=4
  .venv/bin/python benchmarks/aot_per_chip.py --models=bert-base:128,bert-large:512 \
      --chips=v5e,v5p,v6e --max_rows
  ... --attention_impl=xla,splash   # the splash rows: one flag away

Every cell goes through `bert_jax.aot_compile.compile_for` / `max_rows` (the product's AOT path,
its chip table `aot_compile.CHIPS`), on a one-chip topology (v5e:1x1, v5p:1x1x1, v6e:1x1):
rows per chip is the global batch there, and memory per chip does not depend on the
data-parallel width. Columns: bytes per chip (arguments + outputs + temporaries, what XLA allocates), the
compiled step's FLOPs and bytes accessed (XLA's cost analysis, per chip; it counts a loop body
once, so scanned layers and the chunked loss's scan are undercounted: see --unrolled_layers),
a roofline step time (an ESTIMATE: max(FLOPs / peak bf16 FLOP/s, bytes / HBM bandwidth) from
the published chip figures), and with --max_rows the most rows a chip holds.
`--unrolled_layers=3,6` instead compiles unrolled layers at those depths and extrapolates the
FLOPs linearly to the model's depth (what each remat policy costs, loops counted in full).
`--jsonl=FILE` appends each cell's full result, so a long sweep can be split over calls.
Needs libtpu (.venv/libtpu, scripts/setup_env.sh); compiles one cell at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Deviceless TPU compiles: libtpu importable, one fake host (as tests/test_aot.py sets them).
for key, value in (('TPU_WORKER_HOSTNAMES', 'localhost'), ('TPU_ACCELERATOR_TYPE', 'v4-8'),
                   ('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')):
  os.environ.setdefault(key, value)
os.environ['XLA_FLAGS'] = ''
sys.path.insert(0, os.path.join(ROOT, '.venv', 'libtpu'))  # libtpu is installed apart

from bert_jax import aot_compile  # noqa: E402  pylint: disable=g-import-not-at-top
from configs import bert_base, bert_large, common, modern  # noqa: E402

# name:seq -> (config, spec); phase 1 / phase 2 row lengths of each family.
MODELS = {
    'bert-base:128': (bert_base, 'phase1'), 'bert-base:512': (bert_base, 'phase2'),
    'bert-large:128': (bert_large, 'phase1'), 'bert-large:512': (bert_large, 'phase2'),
    'modern-base:1024': (modern, 'base,phase1'), 'modern-base:8192': (modern, 'base,phase2'),
    'modern-large:1024': (modern, 'large,phase1'), 'modern-large:8192': (modern, 'large,phase2'),
}
TOPOLOGIES = {'v5e': 'v5e:1x1', 'v5p': 'v5p:1x1x1', 'v6e': 'v6e:1x1', 'v4': 'v4:1x1x1'}


def config_for(model: str, remat: str, chunk: int, impl: str, extra: dict):
  module, spec = MODELS[model]
  config = module.get_config(spec)
  return common.override(config, {'model.remat_policy': remat, 'model.mlm_loss_chunk': chunk,
                                  'model.attention_impl': impl, **extra})


def unrolled_flops(config, devices, rows: int, depths: tuple[int, int]) -> dict:
  """Compiled FLOPs of unrolled layers at two depths, extrapolated to the model's depth."""
  from bert_jax.training.run_setup import model_config  # pylint: disable=g-import-not-at-top
  depth = model_config(config).num_layers
  got = {}
  for d in depths:
    c = aot_compile.with_rows_per_chip(config, rows, len(devices))
    c = common.override(c, {'model.scan_layers': False, 'model.num_layers': d})
    got[d] = aot_compile.compile_for(c, devices)
  (d0, r0), (d1, r1) = sorted(got.items())
  per_layer = (r1['compiled_tflops'] - r0['compiled_tflops']) / (d1 - d0)
  return {'tflops_extrapolated': round(r0['compiled_tflops'] + per_layer * (depth - d0), 2),
          'tflops_per_layer': round(per_layer, 3), 'depths': list(got),
          'gb_accessed_per_layer': round(
              (r1['compiled_gb_accessed'] - r0['compiled_gb_accessed']) / (d1 - d0), 2)}


COLUMNS = ('model', 'chip', 'attention', 'dtype', 'remat', 'loss chunk', 'rows/chip', 'GiB/chip',
           'args GiB', 'temps GiB', 'fits', 'compiled TFLOP', 'GB accessed',
           'roofline ms (estimate)', 'max rows/chip')


def row_of(cell: dict) -> list[str]:
  r = cell['result']
  gib = r.get('per_chip_gib')
  if gib is None and r.get('temporaries_gib') is not None:
    gib = f'>{r["temporaries_gib"]} (temps)'
  fmt = lambda x: '' if x is None else str(x)
  dtype = cell.get('extra', {}).get('model.dtype', 'float32')
  return [cell['model'], cell['chip'], fmt(cell['attention']), dtype, cell['remat'],
          str(cell['chunk'] or 'off'), fmt(r.get('rows_per_chip') and int(r['rows_per_chip'])),
          fmt(gib), fmt(r.get('arguments_gib')), fmt(r.get('temporaries_gib')),
          {True: 'yes', False: 'no', None: ''}[r.get('fits')], fmt(r.get('compiled_tflops')),
          fmt(r.get('compiled_gb_accessed')), fmt(_roofline(r)),
          fmt(r.get('max_rows_per_chip')) + ('' if r.get('max_rows_exact', True) else ' (≥)')]


def _roofline(r: dict) -> float | None:
  """aot_compile.compile_for's estimate, recomputed from a cell's fields (older cells too)."""
  spec = aot_compile.chip(r.get('device_kind', ''))
  if spec is None or r.get('compiled_tflops') is None:
    return None
  flops = max(r['compiled_tflops'], r['model_tflops_per_step'] / r['chips']) * 1e12
  return round(aot_compile.roofline_ms(flops, r['compiled_gb_accessed'] * 1e9, spec), 1)


def markdown(cells: list[dict]) -> str:
  lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  lines += ['| ' + ' | '.join(row_of(c)) + ' |' for c in cells]
  return '\n'.join(lines)


def parse_value(text: str):
  """A --set value: JSON where it parses (numbers, booleans), else the string."""
  try:
    return json.loads(text)
  except ValueError:
    return text


def add_cell_flags(p: argparse.ArgumentParser) -> None:
  """The flags of an AOT sweep's cells: extra config fields, where to append each cell, a file
  of cells to print instead of compiling."""
  p.add_argument('--set', action='append', default=[], help='extra field=value (dotted)')
  p.add_argument('--jsonl', default='', help='append each cell to this file')
  p.add_argument('--from_jsonl', default='', help='only print the table of this file')


def read_cells(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--models', default='modern-base:8192', help=f'comma list of {list(MODELS)}')
  p.add_argument('--chips', default='v5e', help=f'comma list of {list(TOPOLOGIES)}')
  p.add_argument('--attention_impl', default='xla', help='comma list: xla, splash')
  p.add_argument('--remat', default='none', help='comma list: none, dots, dots_no_batch, full')
  p.add_argument('--mlm_loss_chunk', default='0', help='comma list; 0 = whole logits')
  p.add_argument('--rows_per_chip', default='1', help='comma list: rows per chip compiled')
  p.add_argument('--max_rows', action='store_true', help='search the most rows per chip')
  p.add_argument('--unrolled_layers', default='', help='e.g. 3,6: FLOPs with loops counted')
  add_cell_flags(p)
  args = p.parse_args()
  if args.from_jsonl:
    cells = read_cells(args.from_jsonl)
    print(markdown(cells))
    print(predicted(cells))
    return
  extra = {k: parse_value(v) for k, v in (kv.split('=', 1) for kv in args.set)}
  cells = []
  for model in args.models.split(','):
    for chip in args.chips.split(','):
      devices = aot_compile.topology_devices(TOPOLOGIES[chip])
      for impl in args.attention_impl.split(','):
        for remat in args.remat.split(','):
          for chunk, rows in ((int(c), int(r)) for c in args.mlm_loss_chunk.split(',')
                              for r in args.rows_per_chip.split(',')):
            config = config_for(model, remat, chunk, impl, extra)
            start = time.time()
            if args.unrolled_layers:
              depths = tuple(int(d) for d in args.unrolled_layers.split(','))
              result = unrolled_flops(config, devices, rows, depths)
              result['rows_per_chip'] = rows
            elif args.max_rows:
              result = aot_compile.max_rows(config, devices,
                                            log=lambda m: print(m, file=sys.stderr))
            else:
              result = aot_compile.compile_for(
                  aot_compile.with_rows_per_chip(config, rows, len(devices)), devices)
            cell = dict(model=model, chip=chip, attention=impl, remat=remat, chunk=chunk,
                        extra=extra, seconds=round(time.time() - start), result=result)
            print(json.dumps(cell), file=sys.stderr, flush=True)
            if args.jsonl:
              with open(args.jsonl, 'a') as f:
                f.write(json.dumps(cell) + '\n')
            cells.append(cell)
  print(markdown(cells))
  print(predicted(cells))


def predicted(cells: list[dict]) -> str:
  """Rows per chip predicted from two compiles of one cell at different rows, on the line
  through their bytes, for every chip's HBM (an estimate for chips not compiled for: their
  compiler lays out memory a little differently)."""
  found: dict[tuple, list] = {}
  for c in cells:
    key = (c['model'], c['chip'], c['attention'], c['remat'], c['chunk'],
           json.dumps(c.get('extra', {}), sort_keys=True))
    found.setdefault(key, []).append(c['result'])
  groups: dict[tuple, list] = {}
  for key, results in found.items():
    # A step that did not fit reports its temporaries only: its arguments are the group's.
    args = next((r['arguments_gib'] for r in results if 'arguments_gib' in r), None)
    for r in results:
      gib = r.get('per_chip_gib')
      if gib is None and r.get('temporaries_gib') is not None and args is not None:
        gib = r['temporaries_gib'] + args
      if gib is not None and r.get('rows_per_chip'):
        groups.setdefault(key, []).append((r['rows_per_chip'], gib))
  chips = {c.name: c for c in aot_compile.CHIPS.values() if c.name in ('v5e', 'v5p', 'v6e')}
  lines = ['| model | compiled on | attention | remat | loss chunk | extra | GiB/row | fixed GiB | '
           + ' | '.join(f'predicted max rows {n} ({chips[n].usable_bytes() / 2**30:.2f} GiB usable)'
                        for n in chips) + ' |',
           '|' + '---|' * (8 + len(chips))]
  for key, points in groups.items():
    points = sorted(set(points))
    if len(points) < 2:
      continue
    (r0, g0), (r1, g1) = points[0], points[-1]
    per_row = (g1 - g0) / (r1 - r0)
    fixed = g0 - per_row * r0
    fit = [str(int((chips[n].usable_bytes() / 2**30 - fixed) // per_row)) for n in chips]
    lines.append('| ' + ' | '.join([*map(str, key[:5]), key[5], f'{per_row:.2f}',
                                    f'{fixed:.2f}', *fit]) + ' |')
  return '\n'.join(lines) if len(lines) > 2 else ''


if __name__ == '__main__':
  main()
