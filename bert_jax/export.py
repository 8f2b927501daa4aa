r"""Training workdir -> HuggingFace `BertForPreTraining` (or the arch's own MaskedLM class:
`ModernBertForMaskedLM`, `RobertaForMaskedLM`, `ElectraForMaskedLM`...) directory (with its
tokenizer).

  python -m bert_jax.export --workdir=/tmp/tiny --output=/tmp/tiny_hf [--step=N]

Reads the run's config from `workdir/config.json` (written when training starts), the params
of the latest (or given) checkpoint whatever mesh or optimizer wrote them, and the tokenizer
named by `data.vocab_file`, `data.spm_model` or `data.tokenizer`, so
`pipeline("fill-mask", model=DIR)` works.
The work is `bert_jax.convert.run_export.export_workdir`; this module is its command line.
"""

from __future__ import annotations

from absl import app, flags

from bert_jax.convert.run_export import export_workdir


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
