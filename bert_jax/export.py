r"""Training workdir -> HuggingFace `BertForPreTraining` directory (with its tokenizer).

  python -m bert_jax.export --workdir=/tmp/tiny --output=/tmp/tiny_hf [--step=N]

Reads the run's config from `workdir/config.json` (written when training starts), the params
of the latest (or given) checkpoint whatever mesh or optimizer wrote them, and the tokenizer
named by `data.vocab_file` / `data.spm_model`, so `pipeline("fill-mask", model=DIR)` works.
"""

from __future__ import annotations

import json

import ml_collections
from absl import app, flags

from bert_jax import checkpointing, hf
from input_pipeline import fs


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  path = fs.join(workdir, 'config.json')
  if not fs.exists(path):
    raise FileNotFoundError(f'{path}: missing; pass the training config (--config) instead')
  return ml_collections.ConfigDict(json.loads(fs.read_text(path)))


def run_tokenizer(config):
  if not (config.data.vocab_file or config.data.spm_model):
    return None
  from input_pipeline.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  return load_tokenizer(config.data.vocab_file or None, config.data.spm_model or None,
                        config.data.do_lower_case)


def export_workdir(workdir: str, output: str, step: int | None = None, config=None,
                   overwrite: bool = True) -> str:
  from bert_jax.run_setup import model_config  # pylint: disable=g-import-not-at-top
  config = config if config is not None else load_run_config(workdir)
  step, params = checkpointing.restore_params(workdir, step)
  cfg = model_config(config).replace(scan_layers=config.model.scan_layers)
  return hf.save_pretrained(output, cfg, params, tokenizer=run_tokenizer(config),
                            overwrite=overwrite)


def evaluate_workdir(config, workdir: str) -> dict:
  """Held-out metrics of the latest checkpoint (main.py --mode=eval)."""
  from bert_jax import run_setup, train  # pylint: disable=g-import-not-at-top
  if not config.data.eval_files:
    raise ValueError('--config.data.eval_files is empty')
  step, params = checkpointing.restore_params(workdir)
  setup = run_setup.from_config(config)
  batch = train.per_process_batch(config.train.global_batch_size)
  return {'step': step, **train.evaluate(setup.eval_step(), setup.place_params(params), setup,
                                         batch)}


FLAGS = flags.FLAGS


def define_flags():
  """CLI flags, defined only when run as a program (importing must not claim flag names)."""
  flags.DEFINE_string('workdir', None, 'Training workdir (has checkpoints/ and config.json).')
  flags.DEFINE_string('output', None, 'HuggingFace directory to write.')
  flags.DEFINE_integer('step', None, 'Checkpoint step; default the latest.')


def main(argv):
  del argv
  if not FLAGS.workdir or not FLAGS.output:
    raise app.UsageError('--workdir and --output are required')
  try:
    path = export_workdir(FLAGS.workdir, FLAGS.output, FLAGS.step)
  except (OSError, ValueError) as e:  # missing or unreadable paths, bad checkpoints
    raise app.UsageError(str(e)) from None
  print(f'exported {FLAGS.workdir} to {path}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
