r"""A variant of the demo's pre-training, then MR fine-tuning of it (and of its random twin).

  .venv/bin/python -m benchmarks.pretraining_variants --name=adamw_1e3 \
      --variant='{"overrides": {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}}'

The search for a pre-training that pays on MR within the demo's budget, one variant per call.
`--variant` (JSON) changes the demo (bert_jax/demo.py) in these keys only:
  docstrings  false: drop the standard-library docstrings from the mixed corpus (default true)
  objective   the sentence objective of the records: nsp (default) | sop | none
  mlm_prob    the masking rate (default 0.15; the prediction cap grows with it)
  dupe        the dupe factor (default 5)
  overrides   dotted configs/bert_tiny.py fields, e.g. {"train.num_steps": 4800}
  ft          dotted fine-tuning fields for both arms, e.g. {"optimizer.learning_rate": 3e-4}
  random      false: skip the random arm (when an earlier variant has the same vocabulary)
`--data_from=<dir>` copies another variant's (or a demo workdir's) data/ instead of writing it:
same records, so only the training changes. Prints the held-out MLM accuracy next to the
majority token, the fill-mask example, and MR test accuracy (seed 0) of both arms; everything
lands in <output_dir>/<name>.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from absl import app, flags, logging

from bert_jax import demo
from input_pipeline import fs

FLAGS = flags.FLAGS
flags.DEFINE_string('name', None, 'The variant\'s directory name.', required=True)
flags.DEFINE_string('variant', '{}', 'JSON: the changes to the demo (see the docstring).')
flags.DEFINE_string('data_from', '', 'Copy data/ from this directory instead of writing it.')
flags.DEFINE_string('output_dir', 'runs/pretraining_variants', 'Where variants go.')


def write_data(paths: dict, opts: dict) -> None:
  from input_pipeline import corpus  # pylint: disable=g-import-not-at-top
  from input_pipeline import create_pretraining_data as cpd
  from input_pipeline.tokenizer import WordPieceTokenizer
  stats: dict = {}
  docs = demo.demo_documents('mixed', stats)
  if not opts.get('docstrings', True):
    docs = docs[stats['docstring_documents']:]
  corpus.write_text_file((d for i, d in enumerate(docs) if i % 20), paths['train_text'])
  corpus.write_text_file((d for i, d in enumerate(docs) if i % 20 == 0), paths['eval_text'])
  WordPieceTokenizer.train((s for i, d in enumerate(docs) if i % 20 for s in d), 8192,
                           os.path.dirname(paths['vocab']))
  for split in ('train', 'eval'):
    s = cpd.run(demo.records_job(paths, split, paths[split], opts.get('dupe', 5),
                                 sentence_objective=opts.get('objective', 'nsp'),
                                 masked_lm_prob=opts.get('mlm_prob', 0.15), pack=True))
    print(f'[variant] {split}: {s["instances"]:,} instances in {s["rows"]:,} rows (padding '
          f'{s["padding_fraction"]:.3f})', flush=True)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from bert_jax import export, train  # pylint: disable=g-import-not-at-top
  from configs import bert_tiny, common
  opts = json.loads(FLAGS.variant)
  work = fs.absolute(fs.join(FLAGS.output_dir, FLAGS.name))
  start = time.time()
  data = os.path.join(work, 'data')
  paths = {'train_text': f'{data}/train.txt', 'eval_text': f'{data}/eval.txt',
           'vocab': f'{data}/vocab.txt', 'train': f'{data}/train.tfrecord',
           'eval': f'{data}/eval.tfrecord'}
  if not os.path.exists(paths['eval'] + '.stats.json'):
    if FLAGS.data_from:
      shutil.copytree(os.path.join(FLAGS.data_from, 'data'), data)
    else:
      os.makedirs(data, exist_ok=True)
      write_data(paths, opts)
  objective = opts.get('objective', 'nsp')
  predictions = max(20, -(-128 * opts.get('mlm_prob', 0.15) // 1))
  config = common.override(bert_tiny.get_config(), {
      'data.train_files': paths['train'] + '*', 'data.eval_files': paths['eval'],
      'data.vocab_file': paths['vocab'], 'data.packed': True,
      'data.max_instances_per_row': demo.PACK_K, 'data.sentence_objective': objective,
      'data.max_predictions_per_seq': int(predictions), **opts.get('overrides', {})})
  run_dir = fs.join(work, 'train')
  result = train.train_and_evaluate(config, run_dir)
  base = demo.eval_baselines(paths['eval'], objective, packed=True,
                             max_predictions_per_seq=int(predictions))
  print(f'[variant] {FLAGS.name}: held-out MLM accuracy {result["eval"]["mlm_accuracy"]:.4f} '
        f'vs majority token {base["mlm"]:.4f} after {result["step"]} steps '
        f'({(time.time() - start) / 60:.1f} min)', flush=True)
  export_dir = export.export_workdir(run_dir, fs.join(work, 'hf_export'), config=config)
  print(f'[variant] fill-mask: {demo.fill_mask_example(export_dir)}', flush=True)
  arms = {'pretrained': run_dir, **({'random_init': f'random:{run_dir}'}
                                    if opts.get('random', True) else {})}
  for arm, init in arms.items():
    r = demo.finetune_mr(init, fs.join(work, 'mr', arm), 1, **opts.get('ft', {}))
    print(f'[variant] {FLAGS.name} {arm}: MR test accuracy {r["median"]:.4f} '
          f'({(time.time() - start) / 60:.1f} min)', flush=True)


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
