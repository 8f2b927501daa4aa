r"""Entry point: train (default), eval or export, from one ml_collections config.

  python -m bert_jax.main --config=configs/bert_base.py:phase1 --workdir=/tmp/base \
      --config.data.train_files='data/train-*' [--mode=train|eval|export]

Multi-host: on Cloud TPU `jax.distributed.initialize()` needs no arguments; elsewhere pass
--coordinator_address, --num_processes and --process_id (launch/local_pod.sh does).
"""

if __name__ == '__main__':  # before the heavy imports, which the new process then does once
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import json
import os

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax.training import log_filters, run_control

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/bert_tiny.py.')
flags.DEFINE_string('workdir', None, 'Checkpoints, metrics and TensorBoard logs go here.')
flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'export'], 'What to do.')
flags.DEFINE_string('output', None, 'export: the HuggingFace directory to write.')
run_control.define_process_flags()
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  import jax  # pylint: disable=g-import-not-at-top
  run_control.start_processes()
  log_filters.quiet_library_info()
  with run_control.user_errors():
    result = run_mode(FLAGS.config)
  if jax.process_index() == 0:
    logging.info('result: %s', result)
    print(json.dumps(result, indent=2, default=str))
  run_control.skip_exit_collection()


def run_mode(config) -> dict:
  # pylint: disable=g-import-not-at-top
  from bert_jax.convert.run_export import export_workdir
  from bert_jax.pretrain import run as train
  if FLAGS.mode == 'train':
    if not config.data.train_files:
      raise app.UsageError('--config.data.train_files is empty: point it at TFRecords from '
                           'python -m input_pipeline.pretrain.create_pretraining_data')
    result = train.train_and_evaluate(config, FLAGS.workdir)
  elif FLAGS.mode == 'eval':
    result = train.evaluate_workdir(config, FLAGS.workdir)
  else:
    if not FLAGS.output:
      raise app.UsageError('--mode=export needs --output')
    result = {'exported': export_workdir(FLAGS.workdir, FLAGS.output, config=config)}
  return result


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
