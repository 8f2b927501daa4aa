r"""Ablation on the CPU demo: sentence objective (NSP, SOP, none) and masking rate (0.15, 0.30).

  python benchmarks/ablation.py --workdir /tmp/ablation

Ran on 2026-11-22 on a 2-core AMD EPYC VM (AVX-512 with avx512_bf16, 24 GiB, no accelerator)
shared with other jobs: 67 minutes for the six runs (five variants and a second seed of
nsp@0.15), ~11 minutes each. Expected output: one markdown table row per run
(benchmarks/RESULTS.md, "Ablation: sentence objective and masking rate"), held-out MLM
accuracy 0.13-0.16 against a majority-token baseline of ~0.06 for every run, SOP accuracy
~0.77 against its majority label of ~0.54, NSP accuracy at its majority label (~0.66: most
held-out pairs of these short documents are random-next). Differences between variants are
near the seed-to-seed spread.

Everything is the demo's (bert_jax/demo.py): the embedded docstring corpus with 1 in 20
documents held out, its WordPiece vocab of 8,192, 128-token rows, BERT-tiny with
configs/bert_tiny.py's steps, batch, learning rate, warmup and seed. Only the records change:
`--next_sentence` and `--masked_lm_prob` of create_pretraining_data (`demo.records_job`).

Why two held-out MLM columns: a model's own eval records would differ in what is masked (a
0.30 model's records hold twice the masks, a harder task) and in format (SOP pairs, NSP pairs,
full-sentence rows), so MLM accuracies from them do not compare. "common" evaluates every
model on the demo's own eval records (NSP pairs of the held-out documents, masked at 0.15);
"own" uses the model's objective's records of the same documents, also masked at 0.15, which
is where its sentence accuracy comes from. For NSP variants the two are the same set. The
full-sentence model never saw segment id 1, which the common set's B segments carry, so its
"own" column is the fairer of its two.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import logging  # noqa: E402

from bert_jax.pretrain import baselines, run as train  # noqa: E402
from bert_jax.training.metric_writer import read_metrics  # noqa: E402
from configs import bert_tiny, demo as demo_recipes  # noqa: E402
from input_pipeline.pretrain import create_pretraining_data as cpd, demo_corpus  # noqa: E402

# objective@masking_rate[:seed]; the second seed of nsp@0.15 measures the noise.
VARIANTS = 'nsp@0.15,sop@0.15,none@0.15,nsp@0.30,nsp@0.15:1,none@0.30'


def records(paths: dict, data: str, split: str, objective: str, rate: float) -> str:
  """The `split` records of one objective and masking rate, written once (nsp@0.15 are the
  demo's own); returns their file glob."""
  if (objective, rate) == ('nsp', 0.15):
    return paths[split] + ('*' if split == 'train' else '')
  out = os.path.join(data, f'{split}_{objective}_{rate:.2f}.tfrecord')
  if not os.path.exists(out + '.stats.json'):
    cpd.run(demo_corpus.records_job(paths, split, out, demo_recipes.data(), FLAGS.dupe_factor,
                                    objective, rate))
  return out + ('*' if split == 'train' else '')


def tokens_seen(run_dir: str) -> int:
  """Non-padding tokens trained on, from the per-window throughput the loop logs."""
  total, last = 0.0, 0
  for r in read_metrics(run_dir):
    if 'train/nonpadding_tokens_per_second' in r:
      steps = r['step'] - last
      total += r['train/nonpadding_tokens_per_second'] * steps / r['train/steps_per_second']
      last = r['step']
  return round(total)


def evaluate(config, run_dir: str, files: str, objective: str) -> dict:
  """The run's final params on `files` (0.15 records: 20 predictions), every batch of them."""
  c = config.copy_and_resolve_references()
  c.data.eval_files, c.data.sentence_objective = files, objective
  c.data.max_predictions_per_seq = 20
  c.train.eval_steps = 1_000_000
  return train.evaluate_workdir(c, run_dir)


def majority_token(eval_files: str, objective: str) -> float:
  """The most frequent masked token's share of unpacked 0.15 eval records."""
  config = demo_recipes.pretraining(eval_files=eval_files, pack=False,
                                    sentence_objective=objective)
  return baselines.eval_baselines(config)['mlm']


def run_variant(paths: dict, workdir: str, objective: str, rate: float, seed: int) -> dict:
  """Train one variant from scratch and evaluate it; its result JSON makes reruns skip it."""
  name = f'{objective}@{rate:.2f}' + (f' seed {seed}' if seed else '')
  result_file = os.path.join(workdir, 'results', name.replace(' ', '_') + '.json')
  if os.path.exists(result_file):
    print(f'[ablation] {name}: cached in {result_file}', flush=True)
    with open(result_file) as f:
      return json.load(f)
  data = os.path.join(workdir, 'data')
  config = bert_tiny.get_config()
  config.seed = seed
  config.data.train_files = records(paths, data, 'train', objective, rate)
  config.data.eval_files = ''  # evaluated after training, on 0.15 records (see `evaluate`)
  config.data.vocab_file = paths['vocab']
  config.data.sentence_objective = objective
  config.data.max_predictions_per_seq = demo_recipes.max_predictions(rate)
  if FLAGS.steps:
    config.train.num_steps = FLAGS.steps
  run_dir = os.path.join(workdir, 'runs', name.replace(' ', '_'))
  shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run: a resumed one would time nothing
  print(f'[ablation] {name}: training {config.train.num_steps} steps', flush=True)
  start = time.time()
  out = train.train_to_the_end(config, run_dir)
  minutes = (time.time() - start) / 60
  common = evaluate(config, run_dir, paths['eval'], 'nsp')
  own_files = records(paths, data, 'eval', objective, 0.15)
  own = common if objective == 'nsp' else evaluate(config, run_dir, own_files, objective)
  with open(config.data.train_files.rstrip('*') + '.stats.json') as f:
    stats = json.load(f)
  with open(own_files + '.stats.json') as f:  # label 1 = random next (NSP) or swapped (SOP)
    ones = json.load(f).get({'nsp': 'nsp_random_next_fraction',
                             'sop': 'sop_swapped_fraction'}.get(objective, ''))
  result = {
      'variant': name, 'objective': objective, 'rate': rate, 'seed': seed, 'step': out['step'],
      'train_instances': stats['instances'], 'masked_fraction': stats['masked_fraction'],
      'mlm_accuracy': common['mlm_accuracy'], 'mlm_loss': common['mlm_loss'],
      'own_mlm_accuracy': own['mlm_accuracy'], 'own_mlm_loss': own['mlm_loss'],
      'sentence_accuracy': own.get(f'{objective}_accuracy'),
      'sentence_majority': None if ones is None else max(ones, 1 - ones),
      'baseline': majority_token(paths['eval'], 'nsp'),
      'own_baseline': majority_token(own_files, objective),
      'tokens_seen': tokens_seen(run_dir), 'minutes': round(minutes, 2)}
  os.makedirs(os.path.dirname(result_file), exist_ok=True)
  with open(result_file, 'w') as f:
    json.dump(result, f, indent=2)
  print(f'[ablation] {name}: {json.dumps(result)}', flush=True)
  return result


def table(results: list[dict]) -> str:
  rows = ['| variant | train instances | MLM acc (common) | MLM loss (common) | MLM acc (own) | '
          'majority token (common / own) | sentence acc (own) | majority label | tokens seen | '
          'masked tokens seen (approx.) | train minutes |',
          '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
  for r in results:
    sentence = 'n/a' if r['sentence_accuracy'] is None else f"{r['sentence_accuracy']:.4f}"
    majority = 'n/a' if r['sentence_majority'] is None else f"{r['sentence_majority']:.4f}"
    rows.append(
        f"| {r['variant']} | {r['train_instances']:,} | {r['mlm_accuracy']:.4f} | "
        f"{r['mlm_loss']:.4f} | {r['own_mlm_accuracy']:.4f} | {r['baseline']:.4f} / "
        f"{r['own_baseline']:.4f} | {sentence} | {majority} | {r['tokens_seen']:,} | "
        f"{round(r['tokens_seen'] * r['masked_fraction']):,} | {r['minutes']:.1f} |")
  return '\n'.join(rows)


def main():
  logging.set_verbosity(logging.WARNING)
  workdir = os.path.abspath(FLAGS.workdir)
  paths = demo_corpus.prepare_data(workdir, demo_recipes.data(), FLAGS.dupe_factor)
  runs = []
  for variant in FLAGS.variants.split(','):
    objective, rest = variant.split('@')
    rate, _, seed = rest.partition(':')
    runs.append((objective, float(rate), int(seed or 0)))
  results = [run_variant(paths, workdir, *run) for run in runs]
  print(table(results))


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default='/tmp/ablation')
  parser.add_argument('--variants', default=VARIANTS, help='objective@masking_rate[:seed],...')
  parser.add_argument('--steps', type=int, default=0, help='Override the demo\'s num_steps.')
  parser.add_argument('--dupe_factor', type=int, default=5, help='As the demo\'s flag.')
  FLAGS = parser.parse_args()
  main()
