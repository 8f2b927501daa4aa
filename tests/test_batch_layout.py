"""One feature schema: what the reader yields, what synthetic batches hold and what the step
(and AOT) compiles for are the same names, shapes and dtypes, plain and packed."""

import jax
import numpy as np
import pytest

from bert_jax import aot_compile
from bert_jax.pretrain import synthetic
from bert_jax.pretrain import step as pretrain_step
from input_pipeline.pretrain import create_pretraining_data as cpd, dataset as data_lib, batch_layout
from input_pipeline.pretrain.instances import MaskingConfig
from test_train import config_with, overrides


@pytest.fixture(scope='module')
def packed_data(data, tmp_path_factory):
  d = tmp_path_factory.mktemp('packed')
  cpd.run(cpd.Job(output_file=str(d / 'train'), masking=MaskingConfig(64, 10),
                  vocab_file=str(data / 'vocab.txt'), input_file=str(data / 'eval.txt'),
                  dupe_factor=1, pack=True, max_instances_per_row=3, window_chars=30_000))
  return d


@pytest.mark.parametrize('kind', ['plain', 'stored_packed', 'packed_on_the_fly'])
def test_reader_batches_match_the_schema_the_step_compiles_for(data, packed_data, kind):
  values = overrides(data, **{'data.eval_files': ''})
  if kind == 'stored_packed':
    values.update({'data.packed': True, 'data.train_files': str(packed_data / 'train')})
  if kind == 'packed_on_the_fly':
    values.update({'data.pack': True, 'data.pack_window': 64})
  config = config_with(values)
  setup = pretrain_step.setup(config)
  assert setup.layout.packed == (kind != 'plain')
  cfg = data_lib.ReaderConfig(
      files=config.data.train_files, batch_size=16, max_seq_length=64,
      max_predictions_per_seq=10, packed=config.data.packed, pack=config.data.pack,
      pack_window=config.data.pack_window, shuffle_buffer=10)
  batch = next(data_lib.DataIterator(data_lib.make_dataset(cfg, training=True)))
  setup.layout.check(batch, kind)  # raises naming the differing features
  abstract = setup.abstract_batch(16)
  assert {k: (v.shape, v.dtype) for k, v in abstract.items()} == {
      k: (v.shape, v.dtype) for k, v in batch.items()}
  fake = synthetic.random_batch(np.random.default_rng(0), 16, 64, 10, 2000,
                                packed=setup.layout.packed)
  assert {k: (v.shape, v.dtype) for k, v in fake.items()} == {
      k: (v.shape, v.dtype) for k, v in batch.items()}


def test_schema_check_names_what_differs():
  layout = batch_layout.BatchLayout(8, 2)
  batch = layout.zeros(4)
  batch['input_ids'] = batch['input_ids'].astype(np.int64)
  del batch['masked_lm_weights']
  with pytest.raises(ValueError, match='input_ids .*int64.*masked_lm_weights None'):
    layout.check(batch, 'here')


def test_aot_compiles_the_packed_step_a_packed_run_uses(data):
  # Deviceless TPU compilation needs libtpu; the same code path compiles for this CPU's
  # devices, and the lowered step must take the packed features.
  config = config_with(overrides(data, **{'data.pack': True, 'mesh': (-1, 1, 1)}))
  result = aot_compile.compile_for(config, jax.devices())
  assert result['packed'] and result['global_batch'] == 16
  setup = pretrain_step.setup(config)
  step = setup.train_step()
  with step.activate():
    lowered = step.jitted.lower(setup.abstract_state(), setup.abstract_batch())
  batch_args = lowered.args_info[0][1]  # (args, kwargs) -> the batch dict
  assert set(batch_args) == set(setup.layout.features())
  assert {'position_ids', 'packed_segment_ids', 'next_sentence_weights'} <= set(batch_args)
