"""Fine-tuning results: the best epoch per seed, the spread over seeds next to the task's
baseline, and the files a run leaves (`results.json`, `results.md`)."""

from __future__ import annotations

import math
import statistics

from bert_jax.finetune import tasks as finetune_tasks


def headline(scores: dict | None) -> float:
  """A split's headline for comparisons: NaN and missing count as worst."""
  value = (scores or {}).get('headline', float('nan'))
  return -math.inf if value is None or math.isnan(value) else value


def best_epoch_index(history: list[dict], split: str) -> int | None:
  """The first epoch with the highest headline on `split` (None before any epoch)."""
  if not history:
    return None
  return max(range(len(history)), key=lambda i: (headline(history[i]['scores'].get(split)), -i))


def fmt(value: float | None) -> str:
  return 'n/a' if value is None or math.isnan(value) else f'{value:.4f}'


def flat_scores(record: dict) -> dict[str, float]:
  return {f'{split}/{k}': v for split, scores in record['scores'].items()
          for k, v in scores.items() if isinstance(v, (int, float)) and not math.isnan(v)}


def summarize(config, task, seeds: list[int], runs: list[dict]) -> dict:
  """Per-seed scores at each seed's best epoch; median, min and max over seeds; baselines."""
  scored = [r for r in runs if r['best_epoch'] is not None]
  splits = {}
  for split in task.evals:
    if not split.labelled:
      continue
    values = [r['scores'][split.name] for r in scored if split.name in r['scores']]
    splits[split.name] = {
        'role': split.role, 'headline_metric': task.headline_name(split),
        'baseline': task.baseline(split), 'summary': spread(values)}
  return {'task': task.name, 'init': config.init, 'seeds': seeds,
          'baseline_kind': task.kind.baseline_name, 'selected_on': task.select_split.name,
          'complete': len(runs) == len(seeds) and all(r['complete'] for r in runs),
          'splits': splits, 'runs': runs,
          'prediction_files': [p for r in runs for p in r['prediction_files']]}


def spread(values: list[dict]) -> dict:
  """{metric: {median, min, max, values}} over seeds, for every numeric metric."""
  out = {}
  for key in (values[0] if values else {}):
    xs = [v[key] for v in values if isinstance(v.get(key), (int, float))]
    real = [x for x in xs if not math.isnan(x)]
    if len(xs) == len(values) and real:
      out[key] = {'median': statistics.median(real), 'min': min(real), 'max': max(real),
                  'values': xs}
  return out


def strict_json(value):
  """NaN (undefined correlations) as null: results.json stays standard JSON."""
  if isinstance(value, float) and math.isnan(value):
    return None
  if isinstance(value, dict):
    return {k: strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json(v) for v in value]
  return value


def markdown(results: dict) -> str:
  """One row per seed, then the median (min-max) and the baseline, for every labelled split's
  headline and detail scores (finetune_tasks.DETAIL_SCORES: SQuAD's EM beside its F1)."""
  splits = results['splits']
  columns = [(name, key, s['headline_metric'] if key == 'headline' else key)
             for name, s in splits.items() for key in
             ('headline',) + finetune_tasks.detail_scores({**s['baseline'], **s['summary']})]
  head = ['seed', 'best epoch'] + [f'{name} {label}' for name, _, label in columns]
  lines = [f'# {results["task"]} from {results["init"]}', '',
           f'Best epoch selected on {results["selected_on"]}.' +
           ('' if results['complete'] else ' **Incomplete run.**'), '',
           '| ' + ' | '.join(head) + ' |', '|' + ' --- |' * len(head)]
  for r in results['runs']:
    cells = [fmt(r['scores'].get(name, {}).get(key)) for name, key, _ in columns]
    lines.append(f'| {r["seed"]} | {r["best_epoch"] or "-"} | ' + ' | '.join(cells) + ' |')
  summary = []
  for name, key, _ in columns:
    h = splits[name]['summary'].get(key)
    summary.append(f'{fmt(h["median"])} ({fmt(h["min"])}-{fmt(h["max"])})' if h else 'n/a')
  lines.append(f'| median (min-max) of {len(results["runs"])} | | ' + ' | '.join(summary) + ' |')
  lines.append(f'| {results["baseline_kind"]} baseline | | ' +
               ' | '.join(fmt(splits[name]['baseline'].get(key)) for name, key, _ in columns)
               + ' |')
  exports = [r['export'] for r in results['runs'] if r['export']]
  if exports:
    lines += ['', 'Exported (best epoch): ' + ', '.join(exports)]
  if results['prediction_files']:
    lines += ['', 'Test predictions (best epoch): ' + ', '.join(results['prediction_files'])]
  return '\n'.join(lines) + '\n'


def split_headline(results: dict, split: str) -> dict:
  """{median, min, max, values, majority} of a labelled split's headline over the seeds, with
  its baseline (the majority class for classification)."""
  scores = results['splits'][split]
  return {**scores['summary']['headline'], 'majority': scores['baseline']['headline']}
