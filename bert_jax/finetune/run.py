"""Fine-tune a start point on a task, evaluate every epoch, report and export the best
(`python -m bert_jax.finetune`, bert_jax/finetune/__main__.py).

`--init` is anything `start_points.load_start_point` reads: our pre-training workdir, an HF
directory (BertForPreTraining, BertModel, sentence-transformers, a fine-tuned BertFor<Task>)
or a Google TF checkpoint; its tokenizer and casing come with it. `--init=random:<any of
those>` keeps its model config and tokenizer but draws every weight afresh (per seed): the
no-pre-training baseline. Training runs on the same
mesh, sharding rules, optimizer code and Orbax checkpoints as pre-training.

Each seed trains in `<workdir>/seed_<s>/` (checkpoints/, metrics.jsonl, tensorboard/, GLUE
leaderboard files in glue_submission/, other unlabelled test splits' predictions in
predictions/). Checkpoints are written at every epoch end (and on a preemption notice, at
the next step; a notice pending at an epoch end saves before the scoring or the export,
which the resumed run redoes from the same state); the batches of an epoch are a permutation
drawn from (seed, epoch) and dropout keys from the step, so a restarted command continues
exactly where the last checkpoint left off. Every epoch is scored on the dev split(s); the
best epoch so far (first dev split's headline metric) is scored on a labelled test split and
exported at once, so nothing needs to keep old params: `<workdir>/hf_export` for one seed,
`<workdir>/hf_export/seed_<s>` for several, loadable with transformers'
`AutoModelFor<Task>.from_pretrained`. Results of all seeds (median, min, max) next to the
majority-class (mean, no-answer) baseline go to `<workdir>/results.json` and `results.md`.
"""

from __future__ import annotations

import ast
import collections
import json
import math
import statistics
import time
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.convert import hf_heads, start_points
from bert_jax.finetune import step as fst, tasks as finetune_tasks
from bert_jax.training import checkpointing, progress, run_control, setup as run_setup
from bert_jax.training import sharding as shd
from bert_jax.training.loop import Hooks, Loop
from bert_jax.training.metric_writer import MetricWriter
from input_pipeline import fs

# A checkpoint's progress item: 2 = every score on a 0-1 scale (SQuAD's were percentages).
SCORES_VERSION = 2
BASELINE_NAMES = {'classification': 'majority-class', 'regression': 'mean-prediction',
                  'tagging': 'majority-tag', 'span': 'no-answer', 'multiple_choice': 'chance'}


# ----------------------------------------------------------------------------- setup


def seed_list(seeds: Any, first: int) -> list[int]:
  """`config.seeds`: a count N (seeds first .. first+N-1) or a list of seeds."""
  if isinstance(seeds, str):
    try:
      seeds = ast.literal_eval(seeds.strip())
    except (ValueError, SyntaxError):
      raise ValueError(f'config.seeds={seeds!r}: expected a count (3) or a list (0,1,7)') from None
  if isinstance(seeds, int) and not isinstance(seeds, bool):
    if seeds < 1:
      raise ValueError(f'config.seeds={seeds}: need at least one run')
    return list(range(first, first + seeds))
  if isinstance(seeds, (list, tuple)) and seeds and all(
      isinstance(s, int) and not isinstance(s, bool) for s in seeds):
    if len(set(seeds)) != len(seeds):
      raise ValueError(f'config.seeds={list(seeds)}: a seed is repeated')
    return list(seeds)
  raise ValueError(f'config.seeds={seeds!r}: expected a count (3) or a list of ints (0,1,7)')


def model_overrides(config) -> dict:
  """What `config.model` changes in the start point's encoder config: how it runs (dtype,
  layout, rematerialisation, attention) and, when set, its dropout."""
  m = config.model
  overrides = dict(dtype=m.dtype, scan_layers=m.scan_layers, remat_policy=m.remat_policy,
                   attention_impl=m.attention_impl)
  for field in ('hidden_dropout', 'attention_dropout'):
    if m[field] is not None:
      overrides[field] = m[field]
  return overrides


def load_start(config):
  """The start point with the run's model overrides (dtype, dropout, layout)."""
  if not config.init:
    raise ValueError('no start point: pass --init=<our workdir | HF directory | TF checkpoint>')
  start = start_points.load_start_point(config.init, do_lower_case=config.do_lower_case,
                                        **model_overrides(config))
  length = config.data.max_seq_length
  if length > start.cfg.max_position_embeddings:
    raise ValueError(f'data.max_seq_length={length} exceeds the start point\'s '
                     f'max_position_embeddings={start.cfg.max_position_embeddings}; lower '
                     '--config.data.max_seq_length')
  if start.tokenizer.vocab_size > start.cfg.vocab_size:
    raise ValueError(f'{config.init}: the tokenizer has {start.tokenizer.vocab_size} tokens but '
                     f'the model embeds {start.cfg.vocab_size}; the start point\'s vocabulary '
                     'does not belong to its weights')
  return start


def batch_multiple(config) -> int:
  """Global batches must split evenly over the batch devices and the processes."""
  data, fsdp, _ = shd.mesh_shape(tuple(config.mesh), jax.device_count())
  return math.lcm(data * fsdp, jax.process_count())


def check_batch_sizes(config) -> int:
  """The eval batch, rounded up to what the mesh splits evenly; the train batch must fit."""
  multiple = batch_multiple(config)
  t = config.train
  if t.global_batch_size < 1 or t.global_batch_size % multiple:
    raise ValueError(f'train.global_batch_size={t.global_batch_size} must be a positive '
                     f'multiple of {multiple} (the mesh\'s data x fsdp devices and the '
                     'processes); change --config.train.global_batch_size or --config.mesh')
  if t.num_epochs < 1:
    raise ValueError(f'train.num_epochs={t.num_epochs}: need at least 1')
  if config.data.length_buckets < 1:
    raise ValueError(f'data.length_buckets={config.data.length_buckets}: expected 1 (every '
                     'batch max_seq_length long) or more')
  if t.stop_after_epoch < 0:
    raise ValueError(f'train.stop_after_epoch={t.stop_after_epoch}: expected 0 (all epochs) or '
                     'the epoch to stop after')
  return -(-max(t.eval_batch_size, 1) // multiple) * multiple


# ----------------------------------------------------------------------------- batches


def take(arrays: dict, rows, keys, length: int | None = None) -> dict:
  """Rows of `arrays` (only `keys`), cut to `length` tokens; row -1 is padding: a copy of row 0
  with zero weight."""
  valid = rows >= 0
  index = np.where(valid, rows, 0)
  full = arrays['input_ids'].shape[-1]
  out = {}
  for k in keys:
    if k in arrays:
      x = arrays[k][index]
      if length is not None and length < full and x.ndim >= 2 and x.shape[-1] == full:
        x = x[..., :length]  # token axes: ids, masks, tag labels and weights
      if k == 'label_weights':
        x = np.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0).astype(np.float32)
      out[k] = x
  return out


def bucket_length(arrays: dict, rows, buckets: int) -> int:
  """The tokens a batch of `rows` is padded to: the smallest of `buckets` evenly spaced lengths
  (multiples of 8, the last = max_seq_length) that holds its longest row.

  Padding every batch to max_seq_length costs ~4x for short inputs (POS sentences at 128);
  padding to the longest row would compile a step per distinct length. A few fixed lengths
  bound the compiles (one train and one predict step per bucket). `rows` are the global
  batch's, so every process picks the same length. Real tokens come first in every row and
  padding is masked out of attention, so without dropout the outputs at real tokens are the
  full-length ones up to float round-off (dropout draws its masks per shape: other masks,
  the same distribution)."""
  full = arrays['input_ids'].shape[-1]
  valid = rows[rows >= 0]
  if buckets <= 1 or not len(valid):
    return full
  real = arrays['input_mask'][valid].reshape(len(valid), -1, full).sum(-1).max()
  step = -(-full // (buckets * 8)) * 8
  return int(min(full, max(-(-int(real) // step), 1) * step))


def epoch_rows(seed: int, epoch: int, n: int, batch: int):
  """[steps, batch] example indices of one epoch, -1 padding the last batch: a function of
  (seed, epoch) only, so a resumed run sees exactly the batches it would have."""
  steps = -(-n // batch)
  order = np.random.default_rng([seed, epoch]).permutation(n)
  return np.concatenate([order, np.full(steps * batch - n, -1)]).reshape(steps, batch)


def local_rows(rows):
  """This process's contiguous share of a global batch's rows."""
  return rows.reshape(jax.process_count(), -1)[jax.process_index()]


NO_TOKEN_SCORE = -1e30  # logits at positions past a cut batch's length


def predict_all(predict, params, arrays: dict, batch: int, mesh, buckets: int = 1,
                token_outputs: bool = False) -> dict:
  """Outputs for every row of `arrays`, in order (padding rows dropped). Batches are cut to
  their `bucket_length`; `token_outputs` (tagging and span logits, [batch, tokens, ...]) are
  padded back to max_seq_length with a score no real token reaches."""
  n, full = len(arrays['input_ids']), arrays['input_ids'].shape[-1]
  outs = []
  for first in range(0, n, batch):
    rows = np.arange(first, first + batch)
    rows[rows >= n] = -1
    length = bucket_length(arrays, rows, buckets)
    local = take(arrays, local_rows(rows), fst.MODEL_INPUTS, length)
    out = jax.device_get(predict(params, shd.global_batch(local, mesh)))
    if token_outputs and length < full:
      out = {k: np.pad(v, [(0, 0), (0, full - length)] + [(0, 0)] * (v.ndim - 2),
                       constant_values=NO_TOKEN_SCORE) for k, v in out.items()}
    outs.append(out)
  return {k: np.concatenate([o[k] for o in outs])[:n] for k in outs[0]}


def host_tree(tree):
  """A sharded tree as host numpy on every process (export)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def headline(scores: dict | None) -> float:
  """A split's headline for comparisons: NaN and missing count as worst."""
  value = (scores or {}).get('headline', float('nan'))
  return -math.inf if value is None or math.isnan(value) else value


def best_epoch_index(history: list[dict], split: str) -> int | None:
  """The first epoch with the highest headline on `split` (None before any epoch)."""
  if not history:
    return None
  return max(range(len(history)), key=lambda i: (headline(history[i]['scores'].get(split)), -i))


# ----------------------------------------------------------------------------- one seed


_SETUPS: collections.OrderedDict = collections.OrderedDict()


def setup_for(config, start_cfg, head, kind: str, total_steps: int,
              devices=None) -> run_setup.RunSetup:
  """The run setup (bert_jax/training/setup.py) of a task's objective over `devices` (default
  all; AOT passes a TPU topology's), one per distinct (model, head, optimizer, run length,
  mesh) in this process: seeds, a resumed call and repeated runs in one process (a notebook,
  the tests, the demo's arms) compile once."""
  key = (start_cfg, head, kind, config.optimizer.to_json(), total_steps, tuple(config.mesh),
         repr(config.sharding_rules), config.data.max_seq_length,
         None if devices is None else tuple(devices))
  if key not in _SETUPS:
    objective = fst.objective(start_cfg, head, kind, config.data.max_seq_length)
    _SETUPS[key] = run_setup.build(config, objective, total_steps, devices)
    while len(_SETUPS) > 4:
      _SETUPS.popitem(last=False)
  _SETUPS.move_to_end(key)
  return _SETUPS[key]


class Program:
  """What every seed of a run shares: the step geometry and the run setup."""

  def __init__(self, config, task, start, eval_batch: int):
    t = config.train
    self.eval_batch = eval_batch
    self.batch = t.global_batch_size
    self.steps_per_epoch = -(-task.num_train // self.batch)
    self.total_steps = self.steps_per_epoch * t.num_epochs
    self.stop_step = min(t.stop_after_epoch or t.num_epochs, t.num_epochs) * self.steps_per_epoch
    self.setup = setup_for(config, start.cfg, task.head, task.kind, self.total_steps)
    self.mesh = self.setup.mesh
    self.length_buckets = config.data.length_buckets
    self.token_outputs = task.kind in (finetune_tasks.TAGGING, finetune_tasks.SPAN)
    # Span training keeps whole rows: the reference's start/end softmax runs over every
    # position, padding included (run_squad.py's compute_loss), so a cut row would change
    # the loss. Predictions decode real tokens only, and are cut like every other task's.
    self.train_buckets = 1 if task.kind == finetune_tasks.SPAN else self.length_buckets

  def train_step(self, state, batch):
    return self.setup.train_step()(state, batch)

  def predict(self, params, arrays: dict) -> dict:
    return predict_all(self.setup.eval_step(), params, arrays, self.eval_batch, self.mesh,
                       self.length_buckets, token_outputs=self.token_outputs)


class SeedRun(Hooks):
  """Training, evaluation and export of one seed in `<workdir>/seed_<seed>`: the shared loop
  (bert_jax/training/loop.py) with epoch ends as its boundaries."""

  def __init__(self, config, workdir: str, task, start, seed: int, export_dir: str | None,
               program: Program):
    self.config, self.task, self.start, self.seed = config, task, start, seed
    self.program = program
    self.dir = fs.join(workdir, f'seed_{seed}')
    self.export_dir = export_dir
    self.is_chief = jax.process_index() == 0
    self.history: list[dict] = []
    self.epoch_loss = [0.0, 0]  # loss sum and steps of the epoch in progress
    self.prediction_files: list[str] = []
    self._timer = Throughput()  # examples per second of the epoch in progress
    self._rows = (None, None)  # (epoch, its [steps, batch] rows)

  # ------------------------------------------------------------------- checkpoints

  def _progress_item(self) -> dict:
    return {'history': self.history, 'epoch_loss': self.epoch_loss,
            'prediction_files': self.prediction_files, 'geometry': self._geometry(),
            'scores_version': SCORES_VERSION}

  @property
  def _rescored_path(self) -> str:
    return fs.join(self.dir, 'rescored.json')

  def _write_rescored(self, step: int) -> None:
    """The scores of an epoch end re-done at an already saved step (Orbax keeps one
    checkpoint per step): kept beside it, so later runs do not score it again."""
    if self.is_chief:
      fs.write_text(self._rescored_path,
                    json.dumps({'step': step, 'progress': strict_json(self._progress_item())}))

  def _read_rescored(self, step: int) -> dict | None:
    if not fs.exists(self._rescored_path):
      return None
    saved = json.loads(fs.read_text(self._rescored_path))
    return saved['progress'] if saved['step'] == step else None

  def _geometry(self) -> dict:
    """What a checkpoint's step means: a resumed run must agree, or its batches and
    learning rates would not be the interrupted run's."""
    p = self.program
    return {'num_train': self.task.num_train, 'batch_size': p.batch,
            'total_steps': p.total_steps}

  def _check_geometry(self, saved: dict) -> None:
    if saved == self._geometry():
      return
    raise ValueError(
        f'{self.dir}: its checkpoint was written by a run with {saved} (training rows, batch '
        f'size, steps over all epochs), this config gives {self._geometry()}; resume with the '
        'same data, train.global_batch_size and train.num_epochs (train.stop_after_epoch ends '
        'a run early without changing it), or use a fresh --workdir')

  def save(self, state, step: int) -> None:
    checkpointing.save(self.manager, step, state, progress=self._progress_item(), force=True)
    self.manager.wait_until_finished()

  def _initial_state(self, manager):
    """The latest checkpoint (state and scores so far), else the start point plus a head."""
    latest = manager.latest_step()
    if latest is not None:
      state, progress_item = checkpointing.restore(
          manager, latest, self.program.setup.abstract_state(), with_progress=True,
          what_to_do='Resume with the model.scan_layers (and task) the run was started with '
          '(its config.json: older fine-tuning runs were scanned, '
          '--config.model.scan_layers=True), or fine-tune into a new workdir.')
      saved = self._read_rescored(latest) or progress_item
      self._check_geometry(saved['geometry'])
      if (saved.get('scores_version') != SCORES_VERSION and saved['history'] and
          self.task.kind == finetune_tasks.SPAN):
        raise ValueError(
            f'{self.dir}: its checkpoint was written when SQuAD scores were percentages (they '
            'are 0-1 now, like every task\'s), so its best epoch could not be compared with '
            'new ones; fine-tune into a new --workdir')
      self.history, self.epoch_loss = saved['history'], list(saved['epoch_loss'])
      self.prediction_files = list(saved['prediction_files'])
      logging.info('seed %d: resumed from step %d (%d epochs done)', self.seed, latest,
                   len(self.history))
      return state
    start = self.start
    if start.kind == start_points.RANDOM:  # random:<...>: every seed its own random encoder
      start = start_points.randomized(start, jax.random.fold_in(jax.random.key(self.seed), 1))
    _, params = start_points.init_head_params(
        start, self.task.head, rng=jax.random.key(self.seed),
        fresh_head=self.config.fresh_head)
    return self.program.setup.state_from_params(params, self.seed)

  # ------------------------------------------------------------------- the loop

  def run(self, preemption: run_control.PreemptionFlag) -> dict:
    """This seed's result; `preemption.requested` tells whether a notice stopped it.

    An epoch's end (dev scores, then test scores and the export when the epoch is the best)
    is done whole or not at all: a notice agreed on before it, between the dev and the test
    predictions, or before the export, saves the trained state at once and leaves the scoring
    to the resumed run, which redoes it from the same state (the same scores) before training
    on."""
    p = self.program
    self.manager = checkpointing.make_manager(self.dir, max_to_keep=1, async_save=False)
    state = self._initial_state(self.manager)
    step = int(state.step)
    self.writer = MetricWriter(self.dir)
    self.bar = progress.progress_bar(p.total_steps, step, desc=f'seed {self.seed}',
                                     unit='step', disable=not self.is_chief)
    self.preemption = preemption
    try:
      stopped = False
      if self._epoch_unscored(step):  # saved at an epoch end whose scoring a notice cut short
        stopped = not self._end_epoch(state, step)
        if not stopped:
          self._write_rescored(step)
      if not stopped and step < p.stop_step:
        loop = Loop(p.train_step, self, preemption, self.writer, self.bar,
                    self.config.train.log_every, latest_checkpoint=self.manager.latest_step,
                    label=f'seed {self.seed}')
        state, step, stopped = loop.run(state, p.stop_step)
    finally:
      self.bar.close()
      self.manager.close()
      self.writer.close()
    if stopped:
      logging.warning('preemption notice: seed %d saved step %d; run the same command to '
                      'resume', self.seed, step)
    return self.result(step)

  def _epoch_unscored(self, step: int) -> bool:
    """An epoch ended at `step` and its scores are not in the history yet."""
    spe = self.program.steps_per_epoch
    return step > 0 and step % spe == 0 and len(self.history) < step // spe

  # ------------------------------------------------------------------- loop hooks

  def next_batch(self, step: int):
    """Step `step + 1`'s rows of the epoch's permutation (seed, epoch), cut to their length
    bucket; this process's share goes to the devices."""
    p = self.program
    epoch, b = divmod(step, p.steps_per_epoch)
    if self._rows[0] != epoch:
      self._rows = (epoch, epoch_rows(self.seed, epoch, self.task.num_train, p.batch))
    rows = self._rows[1][b]
    length = bucket_length(self.task.train, rows, p.train_buckets)
    batch = take(self.task.train, local_rows(rows), finetune_tasks.DEVICE_ARRAYS, length)
    return shd.global_batch(batch, p.mesh), {'examples': int((rows >= 0).sum())}

  def is_boundary(self, step: int) -> bool:
    return step % self.program.steps_per_epoch == 0

  def at_boundary(self, state, step: int, preemption) -> bool:
    return self._end_epoch(state, step)

  def record(self, step: int, metrics: dict[str, float], info: dict) -> None:
    self.epoch_loss = [self.epoch_loss[0] + metrics['loss'], self.epoch_loss[1] + 1]
    self._timer.step(info['examples'])

  def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
    epoch = len(self.history) + 1
    return {'epoch': str(epoch), 'loss': f'{metrics["loss"]:.4f}'}

  def _end_epoch(self, state, step: int) -> bool:
    """Score the dev splits; if this epoch is the best so far, score the test splits, write
    GLUE's leaderboard files and export. False, with nothing recorded or written, when a
    preemption notice is agreed on before the dev or the test predictions or before the
    export: the checkpoint comes first, and the resumed run redoes the whole epoch end from
    the same state (the same scores, files and export)."""
    if self.preemption.reached():
      return False
    loss_sum, loss_steps = self.epoch_loss
    record = {'epoch': step // self.program.steps_per_epoch, 'step': step,
              'train_loss': loss_sum / max(loss_steps, 1),
              'train_examples_per_second': self._timer.rate(), 'scores': {}}
    for split in self.task.evals:
      if split.role == 'dev':
        outputs = self.program.predict(state.params, split.arrays)
        record['scores'][split.name] = self.task.score(split, outputs)
    if self.preemption.reached():
      return False
    history = self.history + [record]
    best = best_epoch_index(history, self.task.select_split.name) == len(history) - 1
    unlabelled = self._score_tests(state, record) if best else []
    # A multi-host export (every host gathers the params, the chief writes them) can outlast
    # the grace period, so a notice that came during the test predictions stops here too.
    # Every process decides `best` and `export_dir` alike, so all reach this check together.
    if best and self.export_dir and self.preemption.reached():
      return False
    self.epoch_loss = [0.0, 0]
    self._timer = Throughput()
    self.history = history
    if best:
      record['best'] = True
      self.prediction_files = [self.task.write_predictions(split, outputs, self.dir)
                               for split, outputs in unlabelled]
      if self.export_dir:
        self._export(state)
    self.writer.write(step, flat_scores(record), 'eval/')
    self.bar.write(self.epoch_line(record))
    return True

  def _score_tests(self, state, record) -> list:
    """Predict the test splits (every process: the predictions are collective); labelled
    ones are scored into `record`, unlabelled ones come back as (split, outputs) for the
    chief to write once the epoch end is certain to finish (none on other processes)."""
    unlabelled = []
    for split in self.task.evals:
      if split.role != 'test':
        continue
      outputs = self.program.predict(state.params, split.arrays)
      if split.labelled:
        record['scores'][split.name] = self.task.score(split, outputs)
      elif self.is_chief:
        unlabelled.append((split, outputs))
    return unlabelled

  def _export(self, state) -> None:
    params = host_tree(state.params)
    if not self.is_chief:
      return
    with fs.staged_dir(self.export_dir) as local:
      hf_heads.save_finetuned(local, self.start.cfg, self.task.head, params,
                              tokenizer=self.start.tokenizer, overwrite=True)
    logging.info('seed %d: exported epoch %d to %s', self.seed, len(self.history),
                 self.export_dir)

  # ------------------------------------------------------------------- reporting

  def epoch_line(self, record: dict) -> str:
    """`seed 0 epoch 2: dev accuracy=0.8512 (majority-class baseline 0.5012), ...`; SQuAD's
    detail scores (EM, SQuAD 2.0's best thresholds) follow its F1's baseline."""
    parts = []
    for split in self.task.evals:
      scores = record['scores'].get(split.name)
      if scores is not None:
        name = self.task.headline_name(split)
        base = self.task.baseline(split)['headline']
        parts.append(f'{split.name} {name}={fmt(scores["headline"])} '
                     f'({BASELINE_NAMES[self.task.kind]} baseline {fmt(base)})'
                     + finetune_tasks.format_details(scores))
    rate = record['train_examples_per_second']
    speed = f', {rate:.1f} examples/s' if rate else ''
    best = ' (best so far)' if record.get('best') else ''
    return (f'seed {self.seed} epoch {record["epoch"]}: ' + ', '.join(parts) +
            f', train loss {record["train_loss"]:.4f}{speed}{best}')

  def result(self, step: int) -> dict:
    best = best_epoch_index(self.history, self.task.select_split.name)
    out = {'seed': self.seed, 'epochs_done': len(self.history), 'step': step,
           'complete': step >= self.program.total_steps and not self._epoch_unscored(step),
           'best_epoch': None, 'scores': {},
           'history': self.history, 'export': None,
           'prediction_files': self.prediction_files}
    if best is not None:
      out['best_epoch'] = self.history[best]['epoch']
      out['scores'] = self.history[best]['scores']
      out['export'] = self.export_dir
    return out


class Throughput:
  """Examples per second over an epoch's steps, not counting the run's first step (which
  includes compilation)."""

  def __init__(self):
    self.start, self.examples, self.steps = None, 0, 0

  def step(self, examples: int) -> None:
    self.steps += 1
    if self.start is None:
      self.start = time.perf_counter()
      return
    self.examples += examples

  def rate(self) -> float | None:
    if self.start is None or self.steps < 2:
      return None
    return self.examples / max(time.perf_counter() - self.start, 1e-9)


def fmt(value: float | None) -> str:
  return 'n/a' if value is None or math.isnan(value) else f'{value:.4f}'


def flat_scores(record: dict) -> dict[str, float]:
  return {f'{split}/{k}': v for split, scores in record['scores'].items()
          for k, v in scores.items() if isinstance(v, (int, float)) and not math.isnan(v)}


# ----------------------------------------------------------------------------- all seeds


def run(config, workdir: str) -> dict:
  """Fine-tune every seed of `config` (resuming each from its checkpoint), write
  results.json and results.md; returns the results."""
  workdir = fs.absolute(workdir)
  seeds = seed_list(config.seeds, config.seed)
  eval_batch = check_batch_sizes(config)
  if jax.process_index() == 0:
    fs.check_writable(workdir)  # now, not after the first epoch
    fs.write_text(fs.join(workdir, 'config.json'), config.to_json_best_effort(indent=2))
  records = finetune_tasks.read_task(config)  # bad task data fails now, not after ~20 s of loading
  start = load_start(config)
  task = build_task(config, start, records)
  program = Program(config, task, start, eval_batch)
  runs = []
  preemption = run_control.PreemptionFlag()  # one for the job: its count spans every seed
  try:
    for seed in seeds:
      export = None
      if config.export:
        export = fs.join(workdir, 'hf_export', *([f'seed_{seed}'] if len(seeds) > 1 else []))
      seed_run = SeedRun(config, workdir, task, start, seed, export, program)
      runs.append(seed_run.run(preemption))
      if preemption.requested:
        break
  finally:
    preemption.restore()
  results = summarize(config, task, seeds, runs)
  if jax.process_index() == 0:
    fs.write_text(fs.join(workdir, 'results.json'), json.dumps(strict_json(results), indent=2))
    fs.write_text(fs.join(workdir, 'results.md'), markdown(results))
  return results


def run_or_reuse(config, workdir: str) -> dict:
  """`run`, or the results of a complete earlier run of the same seeds in `workdir` (the demo
  and the benchmarks re-run their commands to continue where they stopped)."""
  results_file = fs.join(fs.absolute(workdir), 'results.json')
  if fs.exists(results_file):
    results = json.loads(fs.read_text(results_file))
    if results.get('complete') and results.get('seeds') == seed_list(config.seeds, config.seed):
      return results
  return run(config, workdir)


def split_headline(results: dict, split: str) -> dict:
  """{median, min, max, values, majority} of a labelled split's headline over the seeds, with
  its baseline (the majority class for classification)."""
  scores = results['splits'][split]
  return {**scores['summary']['headline'], 'majority': scores['baseline']['headline']}


def build_task(config, start, records=None):
  """The task's arrays for this start point; `records` (read_task's) when already read."""
  records = records if records is not None else finetune_tasks.read_task(config)
  labels = finetune_tasks.reconcile_labels(records, start.head, config.init, config.fresh_head)
  task = finetune_tasks.featurize(records, labels, start.tokenizer, config.data,
                                  classifier_dropout=config.model.classifier_dropout)
  logging.info('%s: %d training rows, eval splits %s, labels %s', task.name, task.num_train,
               [f'{s.name} ({len(s.records)})' for s in task.evals], list(task.labels))
  return task


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
          'baseline_kind': BASELINE_NAMES[task.kind], 'selected_on': task.select_split.name,
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
