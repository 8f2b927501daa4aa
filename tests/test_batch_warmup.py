"""Batch-size warmup (bert_jax/training/batch_schedule.py): ModernBERT's schedule, as a pure
function of the step; the warmup run trains on the no-warmup record stream cut into growing
batches; 1 and 2 processes get the same global rows at every step; a run stopped at a
checkpoint and rerun logs the uninterrupted run's losses bit for bit; throughput and MFU
count each step's own batch."""

import collections
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.model import flops
from bert_jax.pretrain import run as train
from bert_jax.pretrain import step as ts
from bert_jax.training import batch_schedule
from bert_jax.training.batch_schedule import BatchSchedule
from input_pipeline.pretrain import dataset as data_lib
from test_train import ROOT, config_with, logged_losses, overrides
from cpu_env import cpu_env, free_port

# 8 emulated devices (conftest): every size a multiple of 8. Sizes 8, 8, 16, 16, 24, 24, 32...
WARMUP = {'train.global_batch_size': 32, 'train.batch_warmup_steps': 6,
          'train.batch_warmup_min_size': 8}
SIZES = [8, 8, 16, 16, 24, 24, 32, 32]  # steps 0..7


class ModernBertScheduler:
  """AnswerDotAI/ModernBERT src/sequence_packer.py `BatchSizeWarmupScheduler` (world size 1),
  transcribed: sizes in micro-batch units, thresholds in tokens consumed."""

  def __init__(self, min_batch_size, max_batch_size, warmup_tokens):
    self.min_batch_size, self.max_batch_size = min_batch_size, max_batch_size
    self.warmup_tokens = warmup_tokens
    steps_per_unit = warmup_tokens / sum(range(min_batch_size, max_batch_size))
    self.thresholds, cumsum = [], 0
    for batch_size in range(min_batch_size, max_batch_size):
      cumsum += batch_size
      self.thresholds.append(math.ceil(steps_per_unit * cumsum))

  def __call__(self, current_step):
    if current_step >= self.warmup_tokens:
      return self.max_batch_size
    for i, threshold in enumerate(self.thresholds):
      if current_step < threshold:
        return self.min_batch_size + i
    return self.max_batch_size


def test_the_schedule_is_modernberts_counted_in_steps():
  s = BatchSchedule(32, warmup_steps=6, min_size=8, increment=8)
  assert [s.batch_size_at(t) for t in range(8)] == SIZES
  assert [s.micro_batches_at(t) for t in range(8)] == [1, 1, 2, 2, 3, 3, 4, 4]
  assert s.unit == 8 and s.sizes() == [8, 16, 24, 32]
  # ModernBERT's shape: 768 -> 4608 by micro-batches of 96, fed the tokens each batch holds
  # (rows x 128): the same size at every step as ours over 40 sizes x 25 steps.
  ours = BatchSchedule(4608, warmup_steps=1000, min_size=768, increment=96)
  theirs = ModernBertScheduler(8, 48, warmup_tokens=25 * 128 * 96 * sum(range(8, 48)))
  tokens, sizes = 0, []
  for t in range(1100):
    sizes.append(theirs(tokens) * 96)
    tokens += sizes[-1] * 128
  assert sizes == [ours.batch_size_at(t) for t in range(1100)]
  assert set(collections.Counter(sizes[:1000]).values()) == {25}
  # Fewer steps than sizes: some sizes are skipped, the warmup still ends on time.
  short = BatchSchedule(32, warmup_steps=2, min_size=8, increment=8)
  assert [short.batch_size_at(t) for t in range(4)] == [8, 16, 32, 32]
  off = BatchSchedule(32)
  assert off.unit == 32 and {off.micro_batches_at(t) for t in (0, 5, 10**6)} == {1}


@pytest.mark.parametrize('values, kwargs, message', [
    ({'train.batch_warmup_steps': -1}, {}, r'train.batch_warmup_steps=-1: must be >= 0'),
    ({'train.batch_warmup_steps': 5}, {},
     r'needs train.batch_warmup_min_size in 1..32 \(train.global_batch_size\), got 0'),
    ({**WARMUP, 'train.batch_warmup_min_size': 12}, {},
     r'train.batch_warmup_increment=12 must divide both train.batch_warmup_min_size=12 and '
     r'train.global_batch_size=32'),
    ({**WARMUP, 'train.batch_warmup_increment': 3}, {}, r'increment=3 must divide'),
    (WARMUP, {'process_count': 3}, r'multiple of 3, .* over the 3 processes'),
    (WARMUP, {'batch_shards': 16}, r'multiple of 16, .* the 16 batch shards of the mesh'),
    ({**WARMUP, 'train.accum_steps': 3}, {}, r'multiple of 3, .* train.accum_steps=3'),
])
def test_settings_that_cannot_split_evenly_are_errors_naming_the_fields(values, kwargs, message):
  with pytest.raises(ValueError, match=message):
    batch_schedule.from_config(config_with(values).train, **kwargs)


def test_accumulation_and_processes_that_divide_every_size_are_accepted():
  s = batch_schedule.from_config(config_with({**WARMUP, 'train.accum_steps': 2}).train,
                                 process_count=2, batch_shards=8)
  assert [s.batch_size_at(t) for t in range(8)] == SIZES


def _hooks(config):
  """The run's own batch source: `_PretrainingHooks.next_batch` over `_train_iterator`."""
  setup = ts.setup(config)
  schedule = batch_schedule.from_config(config.train, 1, 8)
  return train._PretrainingHooks(setup, '', None, train._train_iterator(config, config.seed),
                                 None, None, schedule)


def _host(batch):
  return {k: np.asarray(v) for k, v in batch.items()}


def test_warmup_batches_are_the_plain_stream_cut_into_growing_batches(data):
  # With a shuffle buffer: the records' order does not depend on how they are batched.
  values = overrides(data, **{'data.eval_files': ''})
  plain = _hooks(config_with(dict(values, **{'train.global_batch_size': 32})))
  warm = _hooks(config_with(dict(values, **WARMUP)))
  got, infos = [], []
  for step, size in enumerate(SIZES):
    batch, info = warm.next_batch(step)
    assert batch['input_ids'].shape == (size, 64)
    got.append(_host(batch))
    infos.append(info)
  want = [_host(plain.next_batch(step)[0]) for step in range(sum(SIZES) // 32)]
  for name in want[0]:
    np.testing.assert_array_equal(np.concatenate([b[name] for b in got]),
                                  np.concatenate([b[name] for b in want]), err_msg=name)
  model_cfg = plain.setup.model_cfg
  assert [i['padded_tokens'] for i in infos] == [s * 64 for s in SIZES]
  assert [i['flops'] for i in infos] == [flops.train_flops_per_step(model_cfg, s, 64, 10)
                                         for s in SIZES]
  assert [i['new_shape'] for i in infos] == [True, False, True, False, True, False, True, False]
  # Without warmup nothing changed: the reader batch of the global batch, one a step, as the
  # reader gives it (the code before warmup: next(DataIterator) of batch_size=global).
  config = plain.setup.config
  before = data_lib.DataIterator(data_lib.make_dataset(data_lib.reader_config(
      config, config.data.train_files, 32, config.seed), training=True))
  for _ in range(len(want)):
    next(before)
  for step in range(len(want), len(want) + 3):
    batch, info = plain.next_batch(step)
    expected = next(before)
    for name in expected:
      np.testing.assert_array_equal(np.asarray(batch[name]), expected[name], err_msg=name)
    assert info['flops'] == flops.train_flops_per_step(model_cfg, 32, 64, 10)


TWO_PROCESS_SCRIPT = """
import json, sys
import jax
import numpy as np
from jax.experimental import multihost_utils
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
from bert_jax.pretrain import run, step as ts
from bert_jax.training import batch_schedule
from configs import bert_tiny, common
config = common.override(bert_tiny.get_config(), json.loads(sys.argv[4]))
setup = ts.setup(config)
schedule = batch_schedule.from_config(config.train, 2, 4)
hooks = run._PretrainingHooks(setup, '', None, run._train_iterator(config, config.seed), None,
                              None, schedule)
out = {}
for step in range(int(sys.argv[5])):
  batch, _ = hooks.next_batch(step)
  for name, value in multihost_utils.process_allgather(batch, tiled=True).items():
    out[f'{step}/{name}'] = np.asarray(value)
if jax.process_index() == 0:
  np.savez(sys.argv[3], **out)
"""


def _rows(batch):
  """A global batch's rows as a sorted list of byte strings (1 and 2 processes order the
  rows of a batch differently: process 0's rows come first)."""
  names = sorted(batch)
  n = len(batch[names[0]])
  return sorted(b''.join(np.ascontiguousarray(batch[k][i]).tobytes() for k in names)
                for i in range(n))


def test_one_and_two_processes_train_on_the_same_global_rows_at_every_step(data, tmp_path):
  # No shuffle buffer: it draws per process (as tests/test_pod.py explains).
  values = overrides(data, **{'data.eval_files': '', 'data.shuffle_buffer': 1, **WARMUP})
  script = tmp_path / 'two.py'
  script.write_text(TWO_PROCESS_SCRIPT)
  port = free_port()
  env = cpu_env(2, PYTHONPATH=ROOT, JAX_CPU_COLLECTIVES_IMPLEMENTATION='gloo')
  procs = [subprocess.Popen(
      [sys.executable, str(script), f'localhost:{port}', str(i), str(tmp_path / 'two.npz'),
       json.dumps(values), str(len(SIZES))], cwd=ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  two = np.load(tmp_path / 'two.npz')
  one = _hooks(config_with(values))
  seen = set()
  for step, size in enumerate(SIZES):
    mine = _host(one.next_batch(step)[0])
    theirs = {name: two[f'{step}/{name}'] for name in mine}
    assert len(theirs['input_ids']) == size
    assert _rows(theirs) == _rows(mine), f'step {step}'
    rows = {r.tobytes() for r in mine['input_ids']}
    assert len(rows) == size and not rows & seen  # new records at every step
    seen |= rows


# Two sizes, 8 rows for 4 steps then 16, and one layer: two step programs, not WARMUP's four
# of two layers, for what the resume and throughput claims need (a stop inside the warmup,
# a size change after the resume).
RESUMED = {'train.global_batch_size': 16, 'train.batch_warmup_steps': 4,
           'train.batch_warmup_min_size': 8, 'model.num_layers': 1}
RESUMED_SIZES = [8, 8, 8, 8, 16, 16, 16, 16]  # steps 0..7


def test_a_run_stopped_at_a_checkpoint_and_rerun_logs_the_uninterrupted_losses(data, tmp_path):
  # A constant learning rate, so that stopping at step 3 (num_steps=3) changes nothing else;
  # the stop falls inside the warmup, in the middle of a size.
  values = overrides(data, steps=8, **{
      **RESUMED, 'data.eval_files': '', 'train.checkpoint_every': 1000,
      'optimizer.schedule': 'constant', 'train.peak_flops_per_device': 1e9})
  assert [batch_schedule.from_config(config_with(values).train, 1, 8).batch_size_at(t)
          for t in range(8)] == RESUMED_SIZES
  train.train_and_evaluate(config_with(values), str(tmp_path / 'whole'))
  train.train_and_evaluate(config_with(dict(values, **{'train.num_steps': 3})),
                           str(tmp_path / 'cut'))
  train.train_and_evaluate(config_with(values), str(tmp_path / 'cut'))
  whole, cut = logged_losses(str(tmp_path / 'whole')), logged_losses(str(tmp_path / 'cut'))
  assert sorted(whole) == list(range(1, 9))
  assert cut == whole  # bit for bit, every step
  # Dropping the warmup settings changes the reader's batch (8 rows -> 16), which the saved
  # data position cannot carry over: a clear error, not tf.data's shape mismatch.
  plain = {k: v for k, v in values.items() if 'batch_warmup' not in k}
  with pytest.raises(ValueError, match=r'checkpoints/8: its data position was saved reading '
                                       r'batches of 8 global rows, this run reads 16'):
    train.train_and_evaluate(config_with(dict(plain, **{'train.num_steps': 10})),
                             str(tmp_path / 'cut'))
  # Throughput counts each step's own batch (log_every=1: one step a line): padded tokens per
  # step = its size x 64, and MFU per token is the same at every size (FLOPs are linear in
  # the batch). MFU is left out of the first line and of every line whose time includes a
  # new size's compilation: step s's line ends after step s+1 is dispatched.
  with open(tmp_path / 'whole' / 'metrics.jsonl') as f:
    lines = {r['step']: r for r in map(json.loads, f) if 'train/loss' in r}
  for step, size in enumerate(RESUMED_SIZES, start=1):
    r = lines[step]
    np.testing.assert_allclose(r['train/tokens_per_second'] / r['train/steps_per_second'],
                               size * 64, rtol=1e-9)
  with_mfu = sorted(s for s, r in lines.items() if 'train/mfu' in r)
  assert with_mfu == [2, 3, 5, 6, 7, 8], with_mfu
  ratios = [lines[s]['train/mfu'] / lines[s]['train/tokens_per_second'] for s in with_mfu]
  np.testing.assert_allclose(ratios, ratios[0], rtol=1e-9)


@pytest.mark.multi_device
def test_a_warmup_size_the_mesh_cannot_split_is_refused_before_training(data, tmp_path):
  values = overrides(data, **{**WARMUP, 'train.batch_warmup_min_size': 4})
  with pytest.raises(ValueError, match=r'multiple of 8, .* the 8 batch shards of the mesh'):
    train.train_and_evaluate(config_with(values), str(tmp_path))
  assert not (tmp_path / 'checkpoints').exists() or not os.listdir(tmp_path / 'checkpoints')
