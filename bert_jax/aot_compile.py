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


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published per-chip figures (Google Cloud TPU docs, cloud.google.com/tpu/docs/v4, /v5e,
  /v5p, /v6e): HBM capacity, peak bf16 dense FLOP/s and HBM bandwidth."""
  name: str
  hbm_bytes: int
  peak_flops: float
  hbm_bytes_per_s: float


# By jax device_kind (prefix match, longest first); the one table of chip figures.
CHIPS = {
    'TPU v4': Chip('v4', 32 << 30, 275e12, 1228e9),
    'TPU v5 lite': Chip('v5e', 16 << 30, 197e12, 819e9),
    'TPU v5e': Chip('v5e', 16 << 30, 197e12, 819e9),
    'TPU v5p': Chip('v5p', 95 << 30, 459e12, 2765e9),
    'TPU v5': Chip('v5p', 95 << 30, 459e12, 2765e9),
    'TPU v6 lite': Chip('v6e', 32 << 30, 918e12, 1640e9),
    'TPU v6e': Chip('v6e', 32 << 30, 918e12, 1640e9),
}
HBM_BYTES = {kind: chip.hbm_bytes for kind, chip in CHIPS.items()}


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


def hbm_bytes(device_kind: str) -> int | None:
  c = chip(device_kind)
  return c.hbm_bytes if c else None


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


def compile_for(config, devices, num_labels: int | None = None) -> dict:
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
  hbm = hbm_bytes(devices[0].device_kind)
  spec = chip(devices[0].device_kind)
  report = {
      'device_kind': devices[0].device_kind, 'chips': len(devices),
      'objective': setup.objective.name,
      'mesh': dict(setup.mesh.shape), 'global_batch': b, 'seq_len': s, 'packed': packed,
      'rows_per_chip': b / len(devices), 'remat_policy': setup.model_cfg.remat_policy,
      'mlm_loss_chunk': config.model.mlm_loss_chunk if 'task' not in config else 0,
      'attention_impl': setup.model_cfg.attention_impl,
      'hbm_gib': round(hbm / 2**30, 1) if hbm else None,
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
          'fits': (per_chip <= hbm) if hbm else None}


def with_rows_per_chip(config, rows: int, chips: int):
  config = copy.deepcopy(config)
  config.train.global_batch_size = rows * chips
  config.train.accum_steps = 1
  return config


def max_rows(config, devices, num_labels: int | None = None, max_compiles: int = 6,
             log=print) -> dict:
  """The most rows a chip holds (global batch = rows x chips, no accumulation): compiles
  1 and 2 rows, predicts the limit from the line through their bytes, then compiles around
  the prediction until a fitting N and a failing N + 1 bracket it (or `max_compiles` run out:
  `max_rows_exact` False). Each failing compile reports the temporaries it needed, so the
  line is refitted from whatever compiled last."""
  chips, hbm = len(devices), hbm_bytes(devices[0].device_kind)
  results: dict[int, dict] = {}

  def run(rows):
    r = compile_for(with_rows_per_chip(config, rows, chips), devices, num_labels)
    if r.get('per_chip_gib') is None and r.get('temporaries_gib') is not None:
      args = next((x['arguments_gib'] for x in results.values() if 'arguments_gib' in x), 0)
      r['per_chip_gib_needed'] = round(r['temporaries_gib'] + args, 2)
    results[rows] = r
    log(f'# {rows} rows/chip: {r.get("per_chip_gib", r.get("per_chip_gib_needed"))} GiB, '
        f'fits={r["fits"]}')
    return r

  def gib(r):
    return r.get('per_chip_gib', r.get('per_chip_gib_needed'))

  lo, hi = 0, None  # lo fits (0 = nothing yet), hi does not
  limit = hbm / 2**30
  for rows in (1, 2):
    if run(rows)['fits']:
      lo = rows
    else:
      hi = rows
      break
  last_failed = False
  while lo > 0 and (hi is None or hi - lo > 1) and len(results) < max_compiles:
    fitting = sorted(r for r in results if results[r]['fits'])
    if last_failed and gib(results[hi]) is not None:  # the secant between lo and hi
      a, b = lo, hi
    else:  # extrapolate the two largest fitting
      a, b = fitting[-2], fitting[-1]
    slope = (gib(results[b]) - gib(results[a])) / (b - a)
    guess = lo + math.floor((limit - gib(results[lo])) / slope) if slope > 0 else 2 * lo
    cand = max(guess, lo + 1) if hi is None else min(max(guess, lo + 1), hi - 1)
    if cand in results:  # no progress from the line: halve the bracket
      cand = (lo + hi) // 2 if hi is not None else 2 * lo
    last_failed = not run(cand)['fits']
    if last_failed:
      hi = cand
    else:
      lo = cand
  best = results.get(lo, {})
  return {**(best or results[min(results)]), 'max_rows_per_chip': lo,
          'max_rows_exact': hi is not None and hi - lo == 1,
          'compiles': {str(k): gib(v) for k, v in sorted(results.items())}}


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
