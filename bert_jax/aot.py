r"""Compile the real train step for a TPU topology on a CPU machine (no TPU needed).

  pip install 'jax[tpu]'   # libtpu; compilation is deviceless
  python -m bert_jax.aot --config=configs/bert_large.py:phase2 --topology=v4:4x4x4
  python -m bert_jax.aot --config=configs/finetune.py:mnli --config.init=runs/base \
      --topology=v4:2x2x1

Prints the mesh, per-chip memory (arguments, outputs, temporaries), whether it fits the chip's
HBM, the model FLOPs per step, the compiled step's FLOPs and bytes accessed per chip (XLA's
cost analysis) and a roofline estimate of the step time, for the config's global batch and
sequence length. `--rows_per_chip=N` compiles N rows a chip instead of the config's global
batch; `--max_rows` searches the most rows a chip holds (a few compiles, guided by a linear
fit of memory in rows):

  python -m bert_jax.aot --config=configs/modern.py:base,phase2 --topology=v5e:1x1 \
      --config.model.remat_policy=full --config.model.mlm_loss_chunk=512 --max_rows

`--fit` picks the cheapest settings with which the config's global batch fits a chip (bfloat16
compute, then the fewest gradient-accumulation steps, the remat policy that recomputes least,
the whole-vocabulary MLM loss before the chunked one: `aot_compile.fit`) and prints the
override line to add to the training command:

  python -m bert_jax.aot --config=configs/modern.py:base,phase2 --topology=v5e:2x2 --fit

A step fits when arguments, outputs and temporaries stay within HBM less a reserve
(`--hbm_reserve`, default 5%: what XLA's memory analysis does not count; aot_compile.py).
benchmarks/aot_per_chip.py sweeps models, chips, remat policies and the chunked MLM loss.
"""

from __future__ import annotations

import json

from absl import app, flags
from ml_collections import config_flags

from bert_jax.aot_compile import (HBM_RESERVE, compile_for, fit, max_rows, topology_devices,
                                  with_rows_per_chip)
from bert_jax.training import run_control

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/bert_large.py:phase2 '
                                  'or configs/finetune.py:mnli (with --config.init=START)')
  flags.DEFINE_string('topology', 'v4:4x4x4', 'TPU topology, e.g. v4:4x4x4 or v5e:16x16.')
  flags.DEFINE_string('chip_config', None, 'megacore (v4, v5p) or default; inferred if unset.')
  flags.DEFINE_integer('num_labels', None, 'Fine-tuning: the label count of a task whose '
                       'config does not fix it (generic, a tag set other than CoNLL-2003).')
  flags.DEFINE_integer('rows_per_chip', None, 'Compile this many rows a chip (global batch = '
                       'rows x chips, no accumulation) instead of the config\'s batch.')
  flags.DEFINE_bool('max_rows', False, 'Search the most rows a chip holds (several compiles).')
  flags.DEFINE_bool('fit', False, 'Pick the cheapest settings that fit the config\'s global '
                    'batch on a chip and print them as --config overrides (several compiles).')
  flags.DEFINE_float('hbm_reserve', HBM_RESERVE, 'The share of a chip\'s HBM kept back before '
                     'a step is called a fit.')
  flags.mark_flags_as_required(['config'])


def main(argv):
  del argv
  run_control.fewer_collections()  # tracing the steps it compiles, as the training CLIs do
  if FLAGS.fit and FLAGS.max_rows:
    raise app.UsageError('--fit and --max_rows: pass one (--fit keeps the config\'s global batch '
                         'and chooses accumulation; --max_rows searches rows a chip)')
  if not 0 <= FLAGS.hbm_reserve < 1:
    raise app.UsageError(f'--hbm_reserve={FLAGS.hbm_reserve}: a share of HBM in [0, 1), '
                         'e.g. 0.05')
  try:
    devices = topology_devices(FLAGS.topology, FLAGS.chip_config)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  try:
    config = FLAGS.config
    if FLAGS.rows_per_chip:
      config = with_rows_per_chip(config, FLAGS.rows_per_chip, len(devices))
    reserve = FLAGS.hbm_reserve
    if FLAGS.fit:
      result = fit(config, devices, FLAGS.num_labels, reserve)
    elif FLAGS.max_rows:
      result = max_rows(config, devices, FLAGS.num_labels, reserve=reserve)
    else:
      result = compile_for(config, devices, FLAGS.num_labels, reserve)
  except (OSError, ValueError) as e:  # a missing start point, a bad config field
    raise app.UsageError(str(e)) from None
  print(json.dumps({'topology': FLAGS.topology, **result}, indent=2))
  if FLAGS.fit:
    if not result['fits']:
      raise SystemExit(f'error: {result["error"]}; {result["hint"]}')
    print(f'fits {FLAGS.topology}: {result["overrides"]}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
