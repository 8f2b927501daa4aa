"""config.json files of earlier versions lack the fields added since: read back (start points,
export, the resume check), they get today's defaults for their kind and keep their values."""

import json
import os

import pytest

from bert_jax.convert import start_points
from bert_jax.convert.run_export import export_workdir
from bert_jax.convert.workdir import load_run_config
from bert_jax.pretrain import run as train
from bert_jax.pretrain import step as pretrain_step
from bert_jax.training import batch_schedule, checkpointing, optim, run_setup
from configs import bert_tiny, finetune
from input_pipeline.pretrain import dataset as data_lib

# Fields that came after the first runs, so their config.json files lack them.
PRETRAINING_NEWER = {
    'model': ('arch', 'norm_position', 'mlp', 'num_layers', 'intermediate_size',
              'mlm_loss_chunk'),
    'optimizer': ('warmup_proportion', 'decay_proportion', 'decay_shape', 'final_lr_ratio',
                  'fuse_qkv_rms'),
    'train': ('accum_steps', 'batch_warmup_steps', 'batch_warmup_min_size',
              'batch_warmup_increment', 'init_opt_state_from'),
    'data': ('masked_lm_prob', 'sentence_objective'),
}
FINETUNING_NEWER = {
    'optimizer': ('warmup_proportion', 'decay_shape'),
    'train': ('stop_after_epoch',),
    'data': ('length_buckets', 'max_train_examples'),
}


def write_old_config(workdir, config, newer) -> dict:
  """`config` as an earlier version wrote it (without the `newer` fields); returns the JSON
  today's version writes for it."""
  today = json.loads(config.to_json_best_effort())
  old = json.loads(config.to_json_best_effort())
  for block, fields in newer.items():
    for field in fields:
      del old[block][field]
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(old, f)
  return today


def pretraining_config(vocab_file=''):
  """bert_tiny with values that differ from the defaults, which the upgrade must keep."""
  config = bert_tiny.get_config()
  config.model.vocab_size = 100
  config.model.hidden_dropout = 0.2
  config.optimizer.learning_rate = 3e-4
  config.train.global_batch_size = 16
  config.data.max_seq_length = 64
  config.data.vocab_file = vocab_file
  return config


def test_old_pretraining_config_json_reads_as_todays(tmp_path):
  config = pretraining_config()
  today = write_old_config(tmp_path, config, PRETRAINING_NEWER)
  loaded = load_run_config(str(tmp_path))
  assert json.loads(loaded.to_json_best_effort()) == today
  assert (loaded.model.arch, loaded.model.mlm_loss_chunk, loaded.optimizer.decay_shape,
          loaded.train.batch_warmup_steps, loaded.data.masked_lm_prob) == (
              'bert', 0, 'linear', 0, 0.15)
  assert (loaded.model.hidden_dropout, loaded.optimizer.learning_rate,
          loaded.train.global_batch_size, loaded.data.max_seq_length) == (0.2, 3e-4, 16, 64)
  # The readers take it as they take today's config.
  assert run_setup.model_config(loaded) == run_setup.model_config(config)
  _, schedule = optim.from_config(loaded.optimizer, 100)
  assert float(schedule(50)) == float(optim.from_config(config.optimizer, 100)[1](50))
  assert batch_schedule.from_config(loaded.train).unit == 16
  assert data_lib.reader_config(loaded) == data_lib.reader_config(config)


def test_old_finetuning_config_json_gets_its_tasks_defaults(tmp_path):
  """A fine-tuning config (it has `task`) gets configs/finetune.py's defaults, not
  pre-training's (warmup 10% of the steps, not 0; no pre-training fields)."""
  config = finetune.get_config('squad')
  config.train.global_batch_size = 24
  config.data.max_seq_length = 256
  today = write_old_config(tmp_path, config, FINETUNING_NEWER)
  loaded = load_run_config(str(tmp_path))
  assert json.loads(loaded.to_json_best_effort()) == today
  assert (loaded.optimizer.warmup_proportion, loaded.optimizer.decay_shape,
          loaded.train.stop_after_epoch, loaded.data.length_buckets) == (0.1, 'linear', 0, 4)
  assert (loaded.train.global_batch_size, loaded.data.max_seq_length) == (24, 256)
  assert 'accum_steps' not in loaded.train and 'size' not in loaded.model


@pytest.fixture(scope='module')
def old_workdir(tmp_path_factory):
  """A workdir of an earlier version: a checkpoint at step 1 and a config.json without the
  newer fields."""
  d = tmp_path_factory.mktemp('old_run')
  words = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + [f'w{i}' for i in range(95)]
  (d / 'vocab.txt').write_text('\n'.join(words) + '\n')
  config = pretraining_config(str(d / 'vocab.txt'))
  manager = checkpointing.make_manager(str(d), async_save=False)
  checkpointing.save(manager, 1, pretrain_step.setup(config).fresh_state(), force=True)
  manager.wait_until_finished()
  manager.close()
  write_old_config(str(d), config, PRETRAINING_NEWER)
  return str(d), config


def test_old_workdir_loads_as_a_start_point_and_exports(old_workdir, tmp_path):
  path, config = old_workdir
  start = start_points.load_start_point(path)
  assert start.kind == 'workdir' and start.step == 1
  assert start.cfg == run_setup.model_config(config) and start.cfg.hidden_dropout == 0.2
  out = export_workdir(path, str(tmp_path / 'hf'))
  with open(os.path.join(out, 'config.json')) as f:
    hf_config = json.load(f)
  assert (hf_config['num_hidden_layers'], hf_config['hidden_dropout_prob'],
          hf_config['vocab_size']) == (2, 0.2, 100)


def test_resuming_an_old_workdir_compares_its_batch(old_workdir):
  """The resume check reads the old config.json's train block (no batch-warmup fields)."""
  path, config = old_workdir
  train._check_reader_batch(config, path, 1)
  config = pretraining_config()
  config.train.global_batch_size = 32
  with pytest.raises(ValueError, match='saved reading batches of 16 global rows, this run '
                                       'reads 32'):
    train._check_reader_batch(config, path, 1)
