"""One setup path: (config, objective) -> mesh, rules, optimizer, schedule, state shardings,
jitted steps and batch shapes, computed once and shared by pre-training, fine-tuning, eval,
export, AOT, the tests and the benchmarks.

The objective (what is trained and how it is scored) comes from the caller:
`bert_jax.pretrain.step.objective` (MLM + NSP/SOP) or `bert_jax.finetune.step.objective` (a
task head and its loss). Everything else about a run is built here, from the config blocks
both families share (`model`, `optimizer`, `train`, `mesh`, `sharding_rules`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from absl import logging
import jax
import optax

from bert_jax.model import families
from bert_jax.model.encoder import BertConfig
from bert_jax.training import optim, sharding as shd, state as state_lib
from bert_jax.training.state import TrainState


# Architecture switches a config may set one by one (None: the arch's value).
ARCH_SWITCHES = ('norm_position', 'use_bias', 'mlp', 'positions', 'global_attention_every',
                 'local_window', 'global_rope_theta', 'local_rope_theta')
# Shape fields a config may set beside its size (None: the size's or the family's); a run with
# `model.size=init_from` has them all, copied from its start point's checkpoint.
SHAPE_FIELDS = ('hidden_size', 'num_heads', 'max_position_embeddings', 'type_vocab_size',
                'position_offset', 'layer_norm_eps', 'initializer_range', 'classifier_pooling')
# Sizes > 0 change the size's (0: the size's).
SIZE_FIELDS = ('num_layers', 'intermediate_size', 'embedding_size')
# `model.size` of a run whose shape is its start point's (train.init_from): any released
# checkpoint, preset-shaped or not (ELECTRA-small, MiniLM-L6, an 8,194-position XLM-R).
INIT_FROM = 'init_from'


# How the encoder computes, whatever its shape: what a run's `config.model` sets on a start
# point's stored config (and dropout, when the run sets it).
RUNTIME_FIELDS = ('dtype', 'scan_layers', 'remat_policy', 'attention_impl')


def model_config(config, stored: BertConfig | None = None) -> BertConfig:
  """The run's encoder: the one route from `config.model` to a BertConfig, for pre-training
  and fine-tuning alike.

  With `stored` (a start point's config as its checkpoint holds it; fine-tuning, AOT of a
  fine-tuning run): that config with the run's runtime choices (RUNTIME_FIELDS) and the
  dropout rates the run sets (None: the start point's).

  Without (pre-training): the size, `arch`'s switches and
  any switch or shape field set alone; `model.num_layers` / `model.intermediate_size` /
  `model.embedding_size` > 0 change the size's depth / MLP width / embedding width (ELECTRA).
  `model.size=init_from` builds the shape the fields give, which
  `start_points.with_start_shape` copied from the start point when the run started.
  A config.json of an earlier run passes configs/upgrade.py `upgrade_config` first, which
  fills the fields it predates (the size's, BERT's)."""
  m = config.model
  if stored is not None:
    runtime = {f: m[f] for f in RUNTIME_FIELDS}
    runtime.update({f: m[f] for f in ('hidden_dropout', 'attention_dropout')
                    if m.get(f) is not None})
    return stored.replace(**runtime)
  fields = {f: m.get(f) for f in ARCH_SWITCHES + SHAPE_FIELDS if m.get(f) is not None}
  for name in SIZE_FIELDS:
    if m[name] > 0:
      fields[name] = m[name]
  runtime = dict(vocab_size=m.vocab_size, hidden_dropout=m.hidden_dropout,
                 attention_dropout=m.attention_dropout, hidden_act=m.hidden_act, dtype=m.dtype,
                 scan_layers=m.scan_layers, remat_policy=m.remat_policy,
                 attention_impl=m.attention_impl)
  if m.size != INIT_FROM:
    return BertConfig.from_preset(m.size, arch=m.arch, **runtime, **fields)
  missing = [f for f in ('hidden_size', 'num_heads', 'num_layers', 'intermediate_size')
             if f not in fields]
  if missing:
    raise ValueError(f'model.size={INIT_FROM} takes the shape of train.init_from when the run '
                     f'starts (start_points.with_start_shape), but model.{missing[0]} is not '
                     'filled in; start the run through bert_jax.main, or name a size')
  return BertConfig(**{**families.get(m.arch).defaults, **fields, **runtime, 'arch': m.arch})


def start_shape_fields(cfg: BertConfig) -> dict:
  """`config.model` fields that make `model_config` build `cfg`'s shape and family (the
  inverse of the above, for `model.size=init_from`)."""
  fields = {f: getattr(cfg, f) for f in ARCH_SWITCHES + SHAPE_FIELDS + SIZE_FIELDS}
  fields['embedding_size'] = 0 if cfg.embedding_width == cfg.hidden_size else cfg.embedding_size
  return {**fields, 'arch': cfg.arch, 'vocab_size': cfg.vocab_size,
          'hidden_act': cfg.hidden_act}


def warn_scanned_on_gpu(model_cfg: BertConfig, mesh) -> None:
  """Scanned layers are the default (compile time independent of depth, the right trade on
  TPU and CPU), but on GPUs XLA copies the scan's stacked activations every step: BERT-base
  128 x 256 bf16 ran 110.5 ms scanned against 73.7 ms unrolled on an H100, and BERT-large
  128 x 128 ran out of memory scanned (benchmarks/RESULTS.md, "One H100"). Say so once."""
  if model_cfg.scan_layers and mesh.devices.flat[0].platform == 'gpu':
    logging.warning('model.scan_layers=True on GPU: XLA copies the scanned activations every '
                    'step (BERT-base bf16 on an H100: 1.5x slower than unrolled, and BERT-large '
                    '128 x 128 does not fit). Pass --config.model.scan_layers=False on GPUs.')


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """What a run trains and how it reads out: the model's params and logical specs, the loss
  step `train_step(state, batch, *, tx, schedule) -> (state, metrics)`, the readout
  `eval_step(params, batch)` (eval sums or predictions) and the global batch it compiles for,
  `batch_shapes(global_batch) -> {feature: (shape, dtype)}`. Pre-training's also bring
  `summarize` (eval sums -> metrics) and `train_flops(rows, seq_len, predictions)`."""
  name: str
  model_cfg: BertConfig
  init_params: Callable[[jax.Array], Any]
  logical_specs: Any
  train_step: Callable
  eval_step: Callable
  batch_shapes: Callable[[int], dict]
  layout: Any = None  # pre-training's BatchLayout (reader fields, all-padding eval batches)
  summarize: Callable | None = None
  train_flops: Callable[[int, int, int], float] | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class RunSetup:
  config: Any
  objective: Objective
  mesh: jax.sharding.Mesh
  rules: tuple
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  shardings: TrainState  # NamedSharding per state leaf
  _jitted: dict = dataclasses.field(default_factory=dict, repr=False)

  @property
  def model_cfg(self) -> BertConfig:
    return self.objective.model_cfg

  @property
  def layout(self):
    return self.objective.layout

  def abstract_state(self) -> TrainState:
    """Shapes, dtypes and target shardings of the state: restore targets, AOT arguments."""
    shapes = state_lib.abstract_state(self.objective.init_params, self.tx)
    return jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
        self.shardings)

  def fresh_state(self, seed: int | None = None) -> TrainState:
    seed = self.config.seed if seed is None else seed
    return state_lib.fresh_state(self.objective.init_params, self.tx, seed, self.shardings)

  def state_from_params(self, params, seed: int | None = None) -> TrainState:
    seed = self.config.seed if seed is None else seed
    return state_lib.state_from_params(params, self.tx, seed, self.shardings)

  def place_params(self, params):
    """Host params (a checkpoint's, say) onto the run's parameter shardings."""
    return jax.device_put(params, self.shardings.params)

  def train_step(self):
    """The objective's step, jitted once per setup with the state donated."""
    if 'train' not in self._jitted:
      step = _with_optimizer(self.objective.train_step, self.tx, self.schedule)
      self._jitted['train'] = state_lib.jit_update(step, self.shardings, self.mesh, self.rules)
    return self._jitted['train']

  def eval_step(self):
    """The objective's readout, jitted once per setup, outputs on every process."""
    if 'eval' not in self._jitted:
      self._jitted['eval'] = state_lib.jit_readout(self.objective.eval_step,
                                                   self.shardings.params, self.mesh, self.rules)
    return self._jitted['eval']

  def abstract_batch(self, global_batch: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch a step of this run receives, sharded over the batch axes."""
    b = global_batch or self.config.train.global_batch_size
    sharding = shd.batch_sharding(self.mesh)
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
            for k, (shape, dtype) in self.objective.batch_shapes(b).items()}


def _with_optimizer(train_step, tx, schedule):
  def step(state, batch):
    return train_step(state, batch, tx=tx, schedule=schedule)
  return step


def build(config, objective: Objective, total_steps: int, devices=None) -> RunSetup:
  """Everything a run derives from its config and objective, once: `config.mesh` over
  `devices` (default all), `config.sharding_rules`, `config.optimizer` over `total_steps`."""
  mesh = shd.make_mesh(tuple(config.mesh), devices)
  rules = shd.normalize_rules(config.sharding_rules)
  warn_scanned_on_gpu(objective.model_cfg, mesh)
  tx, schedule = optim.from_config(config.optimizer, total_steps)
  abstract_params = jax.eval_shape(objective.init_params, jax.random.key(0))
  shardings = state_lib.shardings_for(abstract_params, objective.logical_specs, tx, mesh, rules)
  return RunSetup(config=config, objective=objective, mesh=mesh, rules=rules, tx=tx,
                  schedule=schedule, shardings=shardings)
