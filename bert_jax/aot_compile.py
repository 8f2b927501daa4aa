"""A run's own train step compiled for a TPU topology on a CPU host (deviceless, libtpu):
per-chip memory, whether it fits, the compiled step's FLOPs and bytes, a roofline estimate,
and the most rows a chip holds. The library behind `python -m bert_jax.aot` (its command
line) and benchmarks/aot_per_chip.py (its sweep), kept apart so benchmarks call the library
a user's command runs, not the command.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re

import jax


GB, GIB = 10**9, 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published per-chip figures (Google Cloud TPU docs, cloud.google.com/tpu/docs/v4, /v5e,
  /v5p, /v6e): HBM capacity in bytes as each page states it (v4's "32 GiB"; v5e's "16 GB",
  v5p's "95 GB" and v6e's "32 GB" taken as decimal gigabytes, the reading that never
  overstates a chip), peak bf16 dense FLOP/s and HBM bandwidth."""
  name: str
  hbm_bytes: int
  peak_flops: float
  hbm_bytes_per_s: float

  def usable_bytes(self, reserve: float | None = None) -> int:
    """What a step may take before it is called a fit: HBM less the reserve (a fraction)."""
    return int(self.hbm_bytes * (1 - (HBM_RESERVE if reserve is None else reserve)))


# By jax device_kind (prefix match, longest first); the one table of chip figures.
CHIPS = {
    'TPU v4': Chip('v4', 32 * GIB, 275e12, 1228e9),
    'TPU v5 lite': Chip('v5e', 16 * GB, 197e12, 819e9),
    'TPU v5e': Chip('v5e', 16 * GB, 197e12, 819e9),
    'TPU v5p': Chip('v5p', 95 * GB, 459e12, 2765e9),
    'TPU v5': Chip('v5p', 95 * GB, 459e12, 2765e9),
    'TPU v6 lite': Chip('v6e', 32 * GB, 918e12, 1640e9),
    'TPU v6e': Chip('v6e', 32 * GB, 918e12, 1640e9),
}
# The share of HBM kept back before a step is called a fit: XLA's memory analysis counts the
# step's arguments, outputs and temporaries, not the executable itself, the runtime's own
# buffers (infeed, collectives' scratch) or fragmentation, and a step compiled to the last
# byte fails at run time on the first of them. 5% (0.8 GB of a v5e, 1.7 GB of a v4) is our
# margin, not a measured figure; `python -m bert_jax.aot --hbm_reserve` changes it.
HBM_RESERVE = 0.05


def topology_devices(topology: str, chip_config: str | None = None):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  generation = topology.split(':')[0]
  if chip_config is None:
    chip_config = 'megacore' if generation in ('v4', 'v5p') else 'default'
  # A host holds up to 2x2x1 chips; smaller topologies (v5e:1x1, one chip) are one host.
  dims = [int(d) for d in re.findall(r'\d+', topology.partition(':')[2])] + [1, 1, 1]
  bounds = tuple(min(b, d) for b, d in zip((2, 2, 1), dims[:3]))
  try:
    topo = topologies.get_topology_desc(platform='tpu', topology_name=topology,
                                        chip_config_name=chip_config,
                                        chips_per_host_bounds=bounds, num_slices=1)
  except Exception as e:  # libtpu missing or an unknown topology name
    raise ValueError(f'--topology={topology!r}: cannot build a TPU topology ({e}); install '
                     "libtpu with pip install 'jax[tpu]' and use names like v4:4x4x4 or "
                     'v5e:16x16') from None
  return topo.devices


def chip(device_kind: str) -> Chip | None:
  for kind in sorted(CHIPS, key=len, reverse=True):
    if device_kind.startswith(kind):
      return CHIPS[kind]
  return None


def usable_bytes(device_kind: str, reserve: float | None = None) -> int | None:
  c = chip(device_kind)
  return c.usable_bytes(reserve) if c else None


def _cost(compiled) -> dict:
  """The compiled per-chip step's FLOPs and bytes accessed (XLA's cost analysis), or {}."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return {}
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return {k: float(cost[k]) for k in ('flops', 'bytes accessed') if k in (cost or {})}


def roofline_ms(flops: float, bytes_accessed: float, c: Chip) -> float:
  """An estimate, not a measurement: max(FLOPs / peak, bytes / HBM bandwidth)."""
  return 1e3 * max(flops / c.peak_flops, bytes_accessed / c.hbm_bytes_per_s)


def compile_for(config, devices, num_labels: int | None = None,
                reserve: float | None = None) -> dict:
  """Compile a run's own train step for `devices` and report its memory: a pre-training
  config's (the same mesh, shardings and batch layout, packed or not, as `bert_jax.main`
  would use) or a fine-tuning config's (`configs/finetune.py:<task>`: the start point's
  encoder from `config.init`, its config only, with the task's head and loss)."""
  from bert_jax.model import flops  # pylint: disable=g-import-not-at-top
  if 'task' in config:
    setup, packed = _finetuning_setup(config, devices, num_labels), False
    predictions = 0
  else:
    from bert_jax.pretrain import step as pretrain_step  # pylint: disable=g-import-not-at-top
    setup = pretrain_step.setup(config, devices)
    packed, predictions = setup.layout.packed, config.data.max_predictions_per_seq
  b, s = config.train.global_batch_size, config.data.max_seq_length
  spec = chip(devices[0].device_kind)
  usable = spec.usable_bytes(reserve) if spec else None
  report = {
      'device_kind': devices[0].device_kind, 'chips': len(devices),
      'objective': setup.objective.name,
      'mesh': dict(setup.mesh.shape), 'global_batch': b, 'seq_len': s, 'packed': packed,
      'rows_per_chip': b / len(devices), 'remat_policy': setup.model_cfg.remat_policy,
      'mlm_loss_chunk': config.model.mlm_loss_chunk if 'task' not in config else 0,
      'attention_impl': setup.model_cfg.attention_impl,
      'hbm_gib': round(spec.hbm_bytes / GIB, 2) if spec else None,
      'usable_gib': round(usable / GIB, 2) if spec else None,  # HBM less the reserve
      'model_dtype': setup.model_cfg.dtype,
      'accum_steps': config.train.get('accum_steps', 1),
      # The model-FLOPs formula: XLA's cost_analysis counts a scanned layer loop once.
      'model_tflops_per_step': round((setup.objective.train_flops or functools.partial(
          flops.train_flops_per_step, setup.model_cfg))(b, s, predictions) / 1e12, 3),
  }
  step = setup.train_step()
  try:
    with step.activate():
      compiled = step.jitted.lower(setup.abstract_state(), setup.abstract_batch(b)).compile()
  except jax.errors.JaxRuntimeError as e:  # the TPU compiler refuses what cannot fit
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    needed = re.search(r'temporaries \(([\d.]+)G\)', str(e))
    return {**report, 'fits': False,
            'temporaries_gib': float(needed.group(1)) if needed else None,
            'error': str(e).splitlines()[0],
            'hint': 'fewer rows per chip (train.global_batch_size, train.accum_steps), '
                    'model.remat_policy=full, or more chips (--topology)'}
  mem = compiled.memory_analysis()
  per_chip = (mem.argument_size_in_bytes + mem.output_size_in_bytes +
              mem.temp_size_in_bytes - mem.alias_size_in_bytes)
  cost = _cost(compiled)
  if cost:
    # Per chip, from the compiled (partitioned) step. XLA counts a loop body once (the
    # scanned layers, the chunked loss's scan), so with scanned layers both are far below the
    # step's; the roofline takes the model-FLOPs formula per chip where that is larger.
    report['compiled_tflops'] = round(cost.get('flops', 0) / 1e12, 3)
    report['compiled_gb_accessed'] = round(cost.get('bytes accessed', 0) / 1e9, 2)
    if spec:
      step_flops = max(cost.get('flops', 0),
                       report['model_tflops_per_step'] * 1e12 / len(devices))
      report['roofline_ms_estimate'] = round(roofline_ms(
          step_flops, cost.get('bytes accessed', 0), spec), 1)
  return {**report,
          'per_chip_gib': round(per_chip / 2**30, 2),
          'arguments_gib': round(mem.argument_size_in_bytes / 2**30, 2),
          'temporaries_gib': round(mem.temp_size_in_bytes / 2**30, 2),
          'fits': (per_chip <= usable) if usable else None}


def with_rows_per_chip(config, rows: int, chips: int):
  config = copy.deepcopy(config)
  config.train.global_batch_size = rows * chips
  config.train.accum_steps = 1
  return config


def max_rows(config, devices, num_labels: int | None = None, max_compiles: int = 6,
             log=print, reserve: float | None = None, *, unit: int = 1,
             start: int | None = None, cap: int | None = None,
             precision: float = 0.0) -> dict:
  """The most rows a chip holds (global batch = rows x chips, no accumulation), in multiples of
  `unit` (e.g. the rows a chip embeds at a time under GradCache): compiles `start` (default
  one unit) and twice that, predicts the limit from the line through their bytes, then
  compiles around the prediction until a fitting N and a failing N + unit bracket it, or the
  bracket is within `precision` of N, or `max_compiles` run out (`max_rows_exact` False). Each
  failing compile reports the temporaries it needed, so the line is refitted from whatever
  compiled last; where bytes grow faster than the rows (a contrastive score matrix grows with
  their square) the line overshoots, the overshoot fails and the secant between the bracket's
  ends closes in; a guess already compiled halves the bracket instead. No compile above `cap`
  rows (`capped`: `cap` itself fits)."""
  chips, usable = len(devices), usable_bytes(devices[0].device_kind, reserve)
  top = cap // unit if cap else None  # the search runs in units
  first = max((start or unit) // unit, 1)
  first = min(first, top) if top is not None else first
  results: dict[int, dict] = {}

  def run(n):
    r = compile_for(with_rows_per_chip(config, n * unit, chips), devices, num_labels, reserve)
    if r.get('per_chip_gib') is None and r.get('temporaries_gib') is not None:
      args = next((x['arguments_gib'] for x in results.values() if 'arguments_gib' in x), 0)
      r['per_chip_gib_needed'] = round(r['temporaries_gib'] + args, 2)
    results[n] = r
    log(f'# {n * unit} rows/chip: {gib(r)} GiB, fits={r["fits"]}')
    return r

  def gib(r):
    return r.get('per_chip_gib', r.get('per_chip_gib_needed'))

  def bracketed(lo, hi):
    return hi is not None and (hi - lo <= 1 or hi - lo <= lo * precision)

  lo, hi = 0, None  # lo fits (0 = nothing yet), hi does not
  limit = usable / GIB
  if run(first)['fits']:
    lo = first
    if top is None or 2 * first <= top:
      if run(2 * first)['fits']:
        lo = 2 * first
      else:
        hi = 2 * first
  else:  # the start is too many: halve until one fits
    hi = first
    while hi > 1 and lo == 0 and len(results) < max_compiles:
      n = hi // 2
      if run(n)['fits']:
        lo = n
      else:
        hi = n
  last_failed = hi is not None
  while (lo > 0 and not bracketed(lo, hi) and lo != top and len(results) < max_compiles):
    fitting = sorted(n for n in results if results[n]['fits'])
    if last_failed and gib(results[hi]) is not None:  # the secant between lo and hi
      a, b = lo, hi
    elif len(fitting) > 1:  # extrapolate the two largest fitting
      a, b = fitting[-2], fitting[-1]
    else:
      a = b = lo
    slope = (gib(results[b]) - gib(results[a])) / (b - a) if b > a else 0
    if slope > 0:
      guess = lo + math.floor((limit - gib(results[lo])) / slope)
    else:  # no line (one fitting size, a failure without a figure): double or halve
      guess = 2 * lo if hi is None else (lo + hi) // 2
    cand = max(guess, lo + 1) if hi is None else min(max(guess, lo + 1), hi - 1)
    if cand in results:  # no progress from the line: halve the bracket
      cand = (lo + hi) // 2 if hi is not None else 2 * lo
    if top is not None:
      cand = min(cand, top)
    last_failed = not run(cand)['fits']
    if last_failed:
      hi = cand
    else:
      lo = cand
  best = results.get(lo, {})
  return {**(best or results[min(results)]), 'max_rows_per_chip': lo * unit,
          'first_failing': hi * unit if hi is not None else None,
          'capped': hi is None and top is not None and lo == top,
          'max_rows_exact': hi is not None and hi - lo == 1,
          'compiles': {str(k * unit): gib(v) for k, v in sorted(results.items())}}


def _finetuning_setup(config, devices, num_labels: int | None):
  """The fine-tuning run's setup for `devices` (its schedule length does not change the
  compiled step: 1,000 steps)."""
  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import loaders
  from bert_jax.finetune import program, tasks
  from bert_jax.training import run_setup
  if not config.init:
    raise ValueError('a fine-tuning config needs --config.init=<start point> (its config.json '
                     'or bert_config.json is read for the model shapes, not its weights)')
  cfg = run_setup.model_config(config, loaders.model_config_of(config.init))
  kind, head = tasks.head_without_data(config, num_labels)
  return program.setup_for(config, cfg, head, kind, 1000, devices)


# Remat policies by what they recompute in the backward pass, least first (encoder.py).
REMAT_BY_RECOMPUTE = ('none', 'dots', 'projections', 'dots_no_batch', 'full')


def fit_settings(config, devices) -> list[dict]:
  """The settings `fit` may choose from, cheapest step first: bfloat16 compute always (a TPU's
  MXU rate; float32 is for CPU runs); then the fewest gradient-accumulation steps (the most rows
  a chip per step: accumulation adds steps whose small matmuls use a chip less well), then the
  remat policy that recomputes least, then the whole-vocabulary MLM loss before the chunked one
  (one more decoder matmul in the backward). Each is a dict of config overrides."""
  chips = len(devices)
  batch = config.train.global_batch_size
  if batch % chips:
    raise ValueError(f'train.global_batch_size={batch} does not split over {chips} chips: '
                     f'make it a multiple of {chips}')
  rows = batch // chips
  accums = [a for a in range(1, rows + 1) if rows % a == 0]
  chunks = [{}]  # fine-tuning and RTD: no chunked MLM loss to choose
  if 'task' not in config and config.train.objective != 'rtd':
    predictions = config.data.max_predictions_per_seq
    chunks = [{'model.mlm_loss_chunk': c}
              for c in (0, min(512, max(1, -(-predictions // 4))))]
  return [{'model.dtype': 'bfloat16', 'train.accum_steps': a, 'model.remat_policy': r, **c}
          for a in accums for r in REMAT_BY_RECOMPUTE for c in chunks]


def fit(config, devices, num_labels: int | None = None, reserve: float | None = None,
        log=print) -> dict:
  """The cheapest settings (`fit_settings`' order) with which `config`'s step, at its global
  batch, fits a chip of `devices` with the HBM reserve; a report with the override line to
  pass, or `fits` False and why. At each accumulation count the most frugal setting (full
  remat, chunked loss) compiles first: if even it does not fit, the count is passed over in
  one compile, and the cheaper settings are tried only where something fits."""
  from configs import common  # pylint: disable=g-import-not-at-top
  settings = fit_settings(config, devices)
  compiles = []

  def run(values):
    result = compile_for(common.override(copy.deepcopy(config), values), devices, num_labels,
                         reserve)
    # A step the compiler refused reports only the temporaries it needed.
    size = ({'per_chip_gib': result['per_chip_gib']} if 'per_chip_gib' in result else
            {'temporaries_gib': result.get('temporaries_gib')})
    compiles.append({**values, **size, 'fits': result['fits']})
    log(f'# {_flags(values)}: {_needs(size)}, fits={result["fits"]}')
    return result

  for accum in sorted({s['train.accum_steps'] for s in settings}):
    level = [s for s in settings if s['train.accum_steps'] == accum]
    frugal = run(level[-1])
    if not frugal['fits']:
      continue
    for values in level[:-1]:
      result = run(values)
      if result['fits']:
        return {**result, 'fit': values, 'overrides': _flags(values), 'compiles': compiles}
    return {**frugal, 'fit': level[-1], 'overrides': _flags(level[-1]), 'compiles': compiles}
  spec = chip(devices[0].device_kind)
  usable = spec.usable_bytes(reserve) / GIB if spec else None
  return {'fits': False, 'compiles': compiles,
          'error': f'nothing fits: even 1 row a chip per micro-step '
                   f'({config.train.global_batch_size // len(devices)} accumulation steps) '
                   f'with {_flags(settings[-1])} needs {_needs(compiles[-1])} a chip of the '
                   f'{usable and round(usable, 2)} GiB usable (HBM less the reserve)',
          'hint': 'more chips (--topology), shorter rows (data.max_seq_length), or a model '
                  'sharded over fsdp/tensor (train.mesh)'}


def _needs(size: dict) -> str:
  if 'per_chip_gib' in size:
    return f'{size["per_chip_gib"]} GiB'
  return f'more than {size["temporaries_gib"]} GiB of temporaries'


def _flags(values: dict) -> str:
  return ' '.join(f'--config.{k}={v}' for k, v in values.items())
