r"""Does the demo's pre-training pay? Its BERT-tiny against the same model randomly initialised,
fine-tuned on MR with the same recipe and seeds.

  bash scripts/demo.sh                                   # pre-trains runs/demo/train
  .venv/bin/python -m benchmarks.pretraining_pays --init=runs/demo/train [--seeds=3]

Both arms run bert_jax.finetune.run with configs/demo.py:mr (`harness.demo_mr`): the
80/10/10 split of input_pipeline/finetune/mr.py, 64 tokens, batch 32, AdamW lr 1e-4 with 10% warmup
and linear decay (the reference's optimizer and schedule, configs/finetune.py), 3 epochs, test
accuracy at the best dev epoch. `--init` is the pre-trained
start point (a training workdir or an HF export); the random arm is `random:<init>`: the same
model config and tokenizer, every weight drawn as pre-training draws it, afresh per seed.
Seeds 0..N-1 set the head, data order and dropout of both arms (and the random arm's
weights). bert_jax.demo's flags exist too (it is imported) and are ignored.

Prints both arms' per-seed test accuracies, medians and ranges next to the majority class,
the gap of the medians, and whether it is beyond the seed spread (the worst pre-trained seed
beats the best random one). Results go to `<output_dir>/pretraining_pays.json`; re-running reuses
finished arms. Measured figures: benchmarks/RESULTS.md, "Pre-training pays (MR)".
"""

from __future__ import annotations

if __name__ == '__main__':  # CPU malloc tuned, as the CLIs do
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import json
import os
import time

from absl import app, flags, logging

from input_pipeline import fs

FLAGS = flags.FLAGS
flags.DEFINE_string('init', 'runs/demo/train', 'The pre-trained start point (the demo\'s '
                    'training workdir, or an HF directory).')
flags.DEFINE_string('output_dir', 'runs/pretraining_pays', 'Fine-tuning runs and results go '
                    'here.')
flags.DEFINE_integer('seeds', 3, 'Seeds per arm (0 .. N-1).')
flags.DEFINE_float('finetune_lr', 1e-4, 'Peak fine-tuning learning rate of both arms.')


def main(argv):
  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  del argv
  logging.set_verbosity(logging.WARNING)
  init = fs.absolute(FLAGS.init)
  workdir = fs.absolute(FLAGS.output_dir)
  if not fs.exists(init):
    raise app.UsageError(f'--init={init} does not exist: run bash scripts/demo.sh first')
  lr = {'optimizer.learning_rate': FLAGS.finetune_lr}
  start = time.time()
  arms = {}
  for name, point in (('pretrained', init), ('random_init', f'random:{init}')):
    print(f'[pays] {name}: fine-tuning {point} on MR, {FLAGS.seeds} seeds', flush=True)
    t = time.time()
    arms[name] = harness.demo_mr(point, fs.join(workdir, name), FLAGS.seeds, **lr)
    arms[name]['minutes'] = round((time.time() - t) / 60, 2)
  result = {'init': init, 'seeds': FLAGS.seeds, 'learning_rate': FLAGS.finetune_lr, **arms,
            **harness.compare_arms(arms['pretrained'], arms['random_init'], 'pre-training'),
            'minutes': round((time.time() - start) / 60, 2)}
  fs.write_text(fs.join(workdir, 'pretraining_pays.json'), json.dumps(result, indent=2))
  print('| start point | ' + ' | '.join(f'seed {s}' for s in range(FLAGS.seeds)) +
        ' | median | min-max |')
  print('|---' * (FLAGS.seeds + 3) + '|')
  for name in ('pretrained', 'random_init'):
    a = arms[name]
    print(f'| {name} | ' + ' | '.join(f'{v:.4f}' for v in a['values']) +
          f' | {a["median"]:.4f} | {a["min"]:.4f}-{a["max"]:.4f} |')
  print(f'| majority class | | | | {arms["pretrained"]["majority"]:.4f} | |')
  print(f'[pays] gap of medians {result["gap"]:+.4f}; worst pre-trained seed minus best random '
        f'seed {result["margin"]:+.4f}: {result["verdict"]} ({result["minutes"]} minutes)',
        flush=True)


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
