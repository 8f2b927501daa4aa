"""Mesh construction, rule resolution, and: the same losses on 1 device and on 8."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax.model.encoder import BertConfig
from bert_jax.pretrain import step as pretrain_step, synthetic
from bert_jax.training import sharding as shd
from configs import bert_tiny, common

TINY = BertConfig.from_preset('tiny')


def tiny_setup(mesh_shape, devices=None, **overrides):
  """A configured run's setup (configs/bert_tiny.py) for the preset's model: its vocabulary
  (30522, which 8 does not divide) and layer layout, unless `overrides` say otherwise."""
  config = bert_tiny.get_config()
  config.mesh = mesh_shape
  config.model.vocab_size = TINY.vocab_size
  config.model.scan_layers = TINY.scan_layers
  return pretrain_step.setup(common.override(config, overrides), devices)


# The loss runs' model and optimizer: bert_tiny's (two unrolled layers, dropout 0.1,
# adamw_bert), a 2,000-word vocabulary (the claims are about how the mesh splits the
# computation, not its size) and a constant schedule (so that a run's length is not part of
# its program). test_mlm_loss.py and test_train.py's mesh test run these same programs (the
# same config, batch 16 of 64 tokens and 10 predictions): the suite's compilation cache
# serves them.
LOSS_RUN = {'model.vocab_size': 2000, 'model.scan_layers': False,
            'data.max_seq_length': 64, 'data.max_predictions_per_seq': 10,
            'train.global_batch_size': 16, 'optimizer.learning_rate': 1e-3,
            'optimizer.warmup_steps': 5, 'optimizer.schedule': 'constant'}
VOCAB = LOSS_RUN['model.vocab_size']


def synthetic_losses(setup, steps, seed=0):
  """`steps` steps of `setup`'s train step on synthetic batches (16 rows of 64 tokens, 10
  predictions); the losses."""
  mesh, state, step = setup.mesh, setup.fresh_state(), setup.train_step()
  rng = np.random.default_rng(seed)
  losses = []
  for _ in range(steps):
    batch = synthetic.random_batch(rng, 16, 64, 10, setup.config.model.vocab_size)
    state, metrics = step(state, shd.global_batch(batch, mesh))
    losses.append(float(metrics['loss']))
  return np.array(losses)


def test_mesh_shape_resolves_minus_one_and_checks_the_product():
  assert shd.mesh_shape({'data': -1, 'fsdp': 2, 'tensor': 1}, 8) == (4, 2, 1)
  assert shd.mesh_shape((1, -1, 2), 8) == (1, 4, 2)
  with pytest.raises(ValueError, match='at most one axis may be -1'):
    shd.mesh_shape((-1, -1, 1), 8)
  with pytest.raises(ValueError, match='has 6 slots for 8 devices'):
    shd.mesh_shape((2, 3, 1), 8)


@pytest.mark.multi_device
def test_rules_shard_params_but_not_activation_embed():
  rules = shd.DEFAULT_RULES
  shardings = tiny_setup((2, 2, 2), **{'optimizer.name': 'adamw'}).shardings
  assert shardings.params['encoder']['layers']['intermediate']['kernel'].spec == P(None, 'fsdp', 'tensor')
  assert shardings.params['embeddings']['word_embeddings']['embedding'].spec == P('tensor', 'fsdp')
  # Adam moments follow their parameters.
  mu = shardings.opt_state[1].mu
  assert mu['encoder']['layers']['intermediate']['kernel'].spec == P(None, 'fsdp', 'tensor')
  import flax.linen as nn
  assert nn.logical_to_mesh_axes(('batch', 'length', 'embed'), shd.normalize_rules(rules)) == \
      P(('data', 'fsdp'), None, None)


@pytest.mark.multi_device
def test_indivisible_dimension_is_replicated_not_an_error():
  # vocab 30522 is not divisible by 8
  shardings = tiny_setup((1, 1, 8), **{'optimizer.name': 'adamw'}).shardings
  assert shardings.params['embeddings']['word_embeddings']['embedding'].spec == P(None, 'fsdp')
  assert shardings.params['encoder']['layers']['intermediate']['kernel'].spec == P(None, 'fsdp', 'tensor')


def test_bad_rule_names_the_mesh_axis():
  with pytest.raises(ValueError, match="'vocab' -> unknown mesh axis 'model'"):
    shd.normalize_rules([('vocab', 'model')])


MODERN = {'model.arch': 'modern', 'model.num_layers': 3, 'model.local_window': 16,
          'data.sentence_objective': 'none', 'optimizer.name': 'stable_adamw',
          'optimizer.fuse_qkv_rms': True, 'optimizer.clip_norm': 0.0, 'optimizer.schedule': 'wsd',
          'optimizer.decay_shape': '1-sqrt', 'optimizer.warmup_steps': 2,
          'model.hidden_dropout': 0.1, 'model.attention_dropout': 0.1}


@functools.cache
def _losses(mesh_shape, n_devices, steps=20, accum=1, run=None, **extra):
  """The losses of `run` (default: all `steps`) steps of a `steps`-step run of LOSS_RUN
  (updated by `extra`). Cached: the 20-step BERT run on one device serves two tests in a
  worker."""
  setup = tiny_setup(mesh_shape, jax.devices()[:n_devices], **{
      **LOSS_RUN, 'train.num_steps': steps, 'train.accum_steps': accum, **extra})
  return synthetic_losses(setup, steps if run is None else run)


@pytest.mark.multi_device
def test_one_device_and_a_2x2x2_mesh_give_the_same_losses_for_20_steps():
  """Dropout on. Tolerance 2e-6 of the loss (~8): float32 reduction order only, which
  differs between meshes and between CPU kinds' kernels, so the bound scales with the value.

  This also guards an XLA partitioner bug (wrong mlm_transform gradient on 3-axis meshes)
  that the model's MLM-head sharding constraint works around.
  """
  single = _losses((1, 1, 1), 1)
  mesh = _losses((2, 2, 2), 8)
  np.testing.assert_allclose(single, mesh, rtol=2e-6, atol=0)
  assert single[-1] < single[0]


@pytest.mark.multi_device
def test_modern_block_and_recipe_shard_and_give_the_same_losses_on_a_2x2x2_mesh():
  """arch=modern (GeGLU kernels [H, 2, I], RoPE, local layers over 64-token rows), StableAdamW
  and WSD, dropout on: 1 device and 8 agree as BERT's do."""
  shardings = tiny_setup((2, 2, 2), **{**MODERN, 'model.vocab_size': VOCAB}).shardings
  layers = shardings.params['encoder']['layers']
  assert layers['intermediate']['kernel'].spec == P(None, 'fsdp', None, 'tensor')
  assert layers['attention']['query']['kernel'].spec == P(None, 'fsdp', 'tensor', None)
  assert 'bias' not in layers['intermediate']
  modern = {**MODERN, 'model.scan_layers': True}
  single = _losses((1, 1, 1), 1, steps=10, **modern)
  mesh = _losses((2, 2, 2), 8, steps=10, **modern)
  np.testing.assert_allclose(single, mesh, rtol=2e-6, atol=0)
  assert single[-1] < single[0]


def test_gradient_accumulation_is_close_to_the_full_batch():
  """Micro-batches draw other dropout masks, so only statistically equal: within 1%. The
  first 6 steps: the full batch's are the 1-device run above."""
  full = _losses((1, 1, 1), 1)[:6]
  accum = _losses((1, 1, 1), 1, accum=4, run=6)
  np.testing.assert_allclose(full, accum, rtol=1e-2)


@pytest.mark.multi_device
def test_one_processs_cpu_devices_save_a_replicated_state_without_slicing_programs(tmp_path):
  """Orbax's replica-parallel save (each replica writes a slice of an array they all hold) is
  off where one process writes for every device (bert_jax/training/checkpointing.py says why):
  saving a replicated tree over 8 CPU devices compiles nothing, and restores it whole."""
  from bert_jax.training import checkpointing  # pylint: disable=g-import-not-at-top
  replicated = jax.sharding.NamedSharding(jax.make_mesh((8,), ('data',)), P())
  tree = {name: jax.device_put(np.arange(size, dtype=np.float32).reshape(shape), replicated)
          for name, size, shape in (('w', 384, (16, 24)), ('b', 24, (24,)), ('e', 640, (40, 16)))}
  compiles = []
  listener = lambda event, _, **kw: compiles.append(event) if 'backend_compile' in event else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    with checkpointing.make_manager(str(tmp_path)) as manager:
      checkpointing.save(manager, 1, tree, force=True)
      manager.wait_until_finished()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert not compiles, compiles
  abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated)
              for k, v in tree.items()}
  with checkpointing.make_manager(str(tmp_path)) as manager:
    restored = checkpointing.restore(manager, 1, abstract)
  for name, array in tree.items():
    np.testing.assert_array_equal(restored[name], array)
    assert restored[name].sharding == replicated
