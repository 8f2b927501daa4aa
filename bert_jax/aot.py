r"""Compile the real train step for a TPU topology on a CPU machine (no TPU needed).

  pip install 'jax[tpu]'   # libtpu; compilation is deviceless
  python -m bert_jax.aot --config=configs/bert_large.py:phase2 --topology=v4:4x4x4
  python -m bert_jax.aot --config=configs/finetune.py:mnli --config.init=runs/base \
      --topology=v4:2x2x1

Prints the mesh, per-chip memory (arguments, outputs, temporaries), whether it fits the chip's
HBM, and the model FLOPs per step, for the config's global batch and sequence length.
"""

from __future__ import annotations

import json
import re

import jax
from absl import app, flags
from ml_collections import config_flags

# HBM per chip, by jax device_kind.
HBM_BYTES = {'TPU v4': 32 << 30, 'TPU v5 lite': 16 << 30, 'TPU v5e': 16 << 30,
             'TPU v5p': 95 << 30, 'TPU v5': 95 << 30, 'TPU v6 lite': 32 << 30}


def topology_devices(topology: str, chip_config: str | None = None):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  generation = topology.split(':')[0]
  if chip_config is None:
    chip_config = 'megacore' if generation in ('v4', 'v5p') else 'default'
  try:
    topo = topologies.get_topology_desc(platform='tpu', topology_name=topology,
                                        chip_config_name=chip_config,
                                        chips_per_host_bounds=(2, 2, 1), num_slices=1)
  except Exception as e:  # libtpu missing or an unknown topology name
    raise ValueError(f'--topology={topology!r}: cannot build a TPU topology ({e}); install '
                     "libtpu with pip install 'jax[tpu]' and use names like v4:4x4x4 or "
                     'v5e:16x16') from None
  return topo.devices


def hbm_bytes(device_kind: str) -> int | None:
  for kind in sorted(HBM_BYTES, key=len, reverse=True):
    if device_kind.startswith(kind):
      return HBM_BYTES[kind]
  return None


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
  report = {
      'device_kind': devices[0].device_kind, 'chips': len(devices),
      'objective': setup.objective.name,
      'mesh': dict(setup.mesh.shape), 'global_batch': b, 'seq_len': s, 'packed': packed,
      'hbm_gib': round(hbm / 2**30, 1) if hbm else None,
      # The model-FLOPs formula: XLA's cost_analysis counts a scanned layer loop once.
      'model_tflops_per_step': round(
          flops.train_flops_per_step(setup.model_cfg, b, s, predictions) / 1e12, 3),
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
  return {**report,
          'per_chip_gib': round(per_chip / 2**30, 2),
          'arguments_gib': round(mem.argument_size_in_bytes / 2**30, 2),
          'temporaries_gib': round(mem.temp_size_in_bytes / 2**30, 2),
          'fits': (per_chip <= hbm) if hbm else None}


def _finetuning_setup(config, devices, num_labels: int | None):
  """The fine-tuning run's setup for `devices` (its schedule length does not change the
  compiled step: 1,000 steps)."""
  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import loaders
  from bert_jax.finetune import run as finetune_run, tasks
  if not config.init:
    raise ValueError('a fine-tuning config needs --config.init=<start point> (its config.json '
                     'or bert_config.json is read for the model shapes, not its weights)')
  cfg = loaders.model_config_of(config.init).replace(**finetune_run.model_overrides(config))
  kind, head = tasks.head_without_data(config, num_labels)
  return finetune_run.setup_for(config, cfg, head, kind, 1000, devices)


FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/bert_large.py:phase2 '
                                  'or configs/finetune.py:mnli (with --config.init=START)')
  flags.DEFINE_string('topology', 'v4:4x4x4', 'TPU topology, e.g. v4:4x4x4 or v5e:16x16.')
  flags.DEFINE_string('chip_config', None, 'megacore (v4, v5p) or default; inferred if unset.')
  flags.DEFINE_integer('num_labels', None, 'Fine-tuning: the label count of a task whose '
                       'config does not fix it (generic, a tag set other than CoNLL-2003).')
  flags.mark_flags_as_required(['config'])


def main(argv):
  del argv
  try:
    devices = topology_devices(FLAGS.topology, FLAGS.chip_config)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  try:
    result = compile_for(FLAGS.config, devices, FLAGS.num_labels)
  except (OSError, ValueError) as e:  # a missing start point, a bad config field
    raise app.UsageError(str(e)) from None
  print(json.dumps({'topology': FLAGS.topology, **result}, indent=2))


if __name__ == '__main__':
  define_flags()
  app.run(main)
