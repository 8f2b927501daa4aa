r"""Which part of a pre-trained checkpoint helps or hurts on MR: swap parts for fresh ones.

  .venv/bin/python -m benchmarks.pretraining_parts --export=runs/demo/hf_export [--seeds=1]

From the demo's HF export (`BertForPreTraining`) it writes four more HF directories in which
some parts are replaced by transformers' own fresh initialisation (normal 0.02, zero biases,
LayerNorm 1/0, the scheme pre-training starts from): `pooler_fresh` (the NSP-trained pooler
only), `embeddings_only` (encoder layers and pooler fresh), `encoder_only` (embeddings
fresh) and `all_fresh` (nothing pre-trained: the random arm). Each is fine-tuned on MR with
the recipe of benchmarks/pretraining_pays.py (`harness.demo_mr`: 64 tokens, batch 32, lr
1e-4, 3 epochs, test accuracy at the best dev epoch), seeds 0..N-1. The table says whether the
pooler, the embeddings or the encoder layers carry what helps (or what hurts). Results go to
`<output_dir>/pretraining_parts.json`; finished arms are reused.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from absl import app, flags, logging

from benchmarks import harness
from input_pipeline import fs

FLAGS = flags.FLAGS
flags.DEFINE_string('export', 'runs/demo/hf_export', 'The pre-trained HF directory.')
flags.DEFINE_string('output_dir', 'runs/pretraining_parts', 'Variants, runs and results.')
flags.DEFINE_integer('seeds', 1, 'Seeds per arm (0 .. N-1).')

# arm -> the BertModel parts replaced by fresh ones
ARMS = {'pretrained': (), 'pooler_fresh': ('pooler',),
        'embeddings_only': ('encoder', 'pooler'), 'encoder_only': ('embeddings',),
        'all_fresh': ('embeddings', 'encoder', 'pooler')}
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                   'vocab.txt')


def write_variant(export: str, fresh_parts: tuple[str, ...], output: str, seed: int = 0) -> str:
  """`export` with `fresh_parts` of its BertModel re-initialised, as an HF directory."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers
  if os.path.exists(os.path.join(output, 'config.json')):
    return output
  model = transformers.BertForPreTraining.from_pretrained(export)
  torch.manual_seed(seed)
  fresh = transformers.BertForPreTraining(model.config)
  for part in fresh_parts:
    getattr(model.bert, part).load_state_dict(getattr(fresh.bert, part).state_dict())
  model.save_pretrained(output)
  for name in TOKENIZER_FILES:
    if os.path.exists(os.path.join(export, name)):
      shutil.copy(os.path.join(export, name), output)
  return output


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  export, workdir = fs.absolute(FLAGS.export), fs.absolute(FLAGS.output_dir)
  if not os.path.exists(os.path.join(export, 'config.json')):
    raise app.UsageError(f'--export={export} is not an HF directory: run bash scripts/demo.sh')
  results = {}
  for arm, parts in ARMS.items():
    start = time.time()
    init = export if not parts else write_variant(export, parts, fs.join(workdir, arm, 'init'))
    results[arm] = harness.demo_mr(init, fs.join(workdir, arm, 'mr'), FLAGS.seeds)
    results[arm]['minutes'] = round((time.time() - start) / 60, 2)
    print(f'[parts] {arm} (fresh: {", ".join(parts) or "none"}): MR test accuracy '
          f'{results[arm]["values"]}', flush=True)
  fs.write_text(fs.join(workdir, 'pretraining_parts.json'), json.dumps(results, indent=2))
  print('| arm | fresh parts | ' + ' | '.join(f'seed {s}' for s in range(FLAGS.seeds)) +
        ' | median |')
  print('|---' * (FLAGS.seeds + 3) + '|')
  for arm, parts in ARMS.items():
    r = results[arm]
    print(f'| {arm} | {", ".join(parts) or "none"} | ' +
          ' | '.join(f'{v:.4f}' for v in r['values']) + f' | {r["median"]:.4f} |')
  print(f'| majority class | | {results["pretrained"]["majority"]:.4f} |')


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  app.run(main)
