r"""Fine-tune a start point on a task (bert_jax/finetune/run.py has what a run does).

  python -m bert_jax.finetune --config=configs/finetune.py:mrpc --init=uncased_L-12_H-768_A-12 \
      --workdir=runs/mrpc --config.data.glue_dir=glue_data/MRPC [--config.seeds=5]
"""

if __name__ == '__main__':  # before the heavy imports, which the new process then does once
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import os

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS


def main(argv):
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import results, run  # pylint: disable=g-import-not-at-top
  from bert_jax.training import run_control  # pylint: disable=g-import-not-at-top
  config = run_control.finetune_config(argv, FLAGS)
  run_control.start_processes()
  with run_control.user_errors():
    outcome = run.run(config, FLAGS.workdir)
  if jax.process_index() == 0:
    print(results.markdown(outcome), end='')
  run_control.skip_exit_collection()


def define_flags():
  """CLI flags, defined only when run as a program (importing must not claim flag names)."""
  from bert_jax.training import run_control  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file('config', None, 'e.g. configs/finetune.py:mrpc')
  flags.DEFINE_string('init', None, 'Start point: our workdir, an HF directory or a TF '
                      'checkpoint (sets config.init).')
  flags.DEFINE_string('workdir', None, 'Checkpoints, metrics, exports and results go here.')
  run_control.define_process_flags()
  flags.mark_flags_as_required(['config', 'workdir'])


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  define_flags()
  app.run(main)
