r"""A variant of the demo's pre-training, then MR fine-tuning of it (and of its random twin).

  .venv/bin/python -m benchmarks.pretraining_variants --name=adamw_1e3 \
      --variant='{"overrides": {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}}'

The search for a pre-training that pays on MR within the demo's budget, one variant per call.
`--variant` (JSON) changes the demo (bert_jax/demo.py) in these keys only:
  docstrings  false: the in_domain corpus (mixed without the standard library's docstrings)
  objective   the sentence objective of the records: nsp (default) | sop | none
  mlm_prob    the masking rate (default 0.15; the prediction cap grows with it)
  dupe        the dupe factor (default 5)
  overrides   dotted configs/bert_tiny.py fields, e.g. {"train.num_steps": 4800}
  ft          dotted fine-tuning fields for both arms, e.g. {"optimizer.learning_rate": 3e-4}
  random      false: skip the random arm (when an earlier variant has the same vocabulary)
The recipe is the demo's (configs/demo.py:pretraining; since the evening of 2026-11-22 with the
poly_warmup schedule: RESULTS rows measured before it pass {"optimizer.schedule": "bert",
"optimizer.warmup_proportion": 0} to repeat). `--data_from=<dir>` copies another variant's (or
a demo workdir's) data/ instead of writing it: same records, so only the training changes. Prints the held-out MLM accuracy next to the
majority token, the fill-mask example, and MR test accuracy (seed 0) of both arms; everything
lands in <output_dir>/<name>.
"""

from __future__ import annotations

if __name__ == '__main__':  # CPU malloc tuned, as the CLIs do
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import json
import os
import time

from absl import app, flags, logging

from benchmarks import harness
from bert_jax.convert import fill_mask
from bert_jax.pretrain import baselines
from input_pipeline.pretrain import demo_corpus
from configs import demo as demo_recipes
from input_pipeline import fs

FLAGS = flags.FLAGS
flags.DEFINE_string('name', None, 'The variant\'s directory name.', required=True)
flags.DEFINE_string('variant', '{}', 'JSON: the changes to the demo (see the docstring).')
flags.DEFINE_string('data_from', '', 'Copy data/ from this directory instead of writing it.')
flags.DEFINE_string('output_dir', 'runs/pretraining_variants', 'Where variants go.')
KEYS = {'docstrings', 'objective', 'mlm_prob', 'dupe', 'overrides', 'ft', 'random'}


def parse_variant(text: str) -> dict:
  try:
    opts = json.loads(text)
  except json.JSONDecodeError as e:
    raise app.UsageError(f'--variant is not JSON ({e}): {text!r}') from e
  if not isinstance(opts, dict) or set(opts) - KEYS:
    raise app.UsageError(f'--variant: expected an object with keys among {sorted(KEYS)}, got '
                         f'{text!r}')
  return opts


def copy_data(source: str, workdir: str) -> None:
  """`source`/data/* into `workdir`/data, through input_pipeline.fs (local or gs://)."""
  files = fs.glob(fs.join(source, 'data', '*'))
  if not files:
    raise app.UsageError(f'--data_from={source}: no data/ files there (a demo or variant '
                         'workdir has them)')
  fs.makedirs(fs.join(workdir, 'data'))
  for f in files:
    fs.write_bytes(fs.join(workdir, 'data', fs.basename(f)), fs.read_bytes(f))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from bert_jax.convert.run_export import export_workdir  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain import run as train
  from configs import common
  opts = parse_variant(FLAGS.variant)
  work = fs.absolute(fs.join(FLAGS.output_dir, FLAGS.name))
  start = time.time()
  if FLAGS.data_from and not fs.exists(fs.join(work, 'data', 'eval.tfrecord.stats.json')):
    copy_data(fs.absolute(FLAGS.data_from), work)
  objective, rate = opts.get('objective', 'nsp'), opts.get('mlm_prob', 0.15)
  corpus = 'mixed' if opts.get('docstrings', True) else 'in_domain'
  paths = demo_corpus.prepare_data(work, demo_recipes.data(), opts.get('dupe', 5), corpus,
                                   pack=True, sentence_objective=objective,
                                   masked_lm_prob=rate)
  config = common.override(demo_recipes.pretraining(paths['train'] + '*', paths['eval'],
                                                    paths['vocab'], True, objective, rate),
                           opts.get('overrides', {}))
  run_dir = fs.join(work, 'train')
  result = train.train_to_the_end(config, run_dir)
  base = baselines.eval_baselines(config)
  print(f'[variant] {FLAGS.name}: held-out MLM accuracy {result["eval"]["mlm_accuracy"]:.4f} '
        f'vs majority token {base["mlm"]:.4f} after {result["step"]} steps '
        f'({(time.time() - start) / 60:.1f} min)', flush=True)
  export_dir = export_workdir(run_dir, fs.join(work, 'hf_export'), config=config)
  print(f'[variant] fill-mask: {fill_mask.fill_mask_example(export_dir)}', flush=True)
  arms = {'pretrained': run_dir, **({'random_init': f'random:{run_dir}'}
                                    if opts.get('random', True) else {})}
  for arm, init in arms.items():
    r = harness.demo_mr(init, fs.join(work, 'mr', arm), 1, **opts.get('ft', {}))
    print(f'[variant] {FLAGS.name} {arm}: MR test accuracy {r["median"]:.4f} '
          f'({(time.time() - start) / 60:.1f} min)', flush=True)


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
