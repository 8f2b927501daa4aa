"""One setup path: a config -> mesh, rules, model config, optimizer, schedule, state shardings
and batch layout, computed once and shared by training, eval, export, AOT and the tests.

Before this module each entry point rebuilt these from the config on its own (and the state
shardings up to four times per run), and AOT compiled an unpacked step for packed configs.
Now a run, its eval, its export and its AOT compilation all hold the same `RunSetup`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging
import jax
import optax

from bert_jax import optim, sharding as shd, train_step as ts
from bert_jax.model import BertConfig
from input_pipeline.features import BatchLayout


def model_config(config) -> BertConfig:
  """The encoder of a pre-training config (`config.model`)."""
  m = config.model
  return BertConfig.from_preset(
      m.size, vocab_size=m.vocab_size, hidden_dropout=m.hidden_dropout,
      attention_dropout=m.attention_dropout, hidden_act=m.hidden_act, dtype=m.dtype,
      scan_layers=m.scan_layers, remat_policy=m.remat_policy, attention_impl=m.attention_impl)


def mesh_and_rules(config, devices=None):
  """`config.mesh` over `devices` (default all) and `config.sharding_rules` as tuples."""
  return (shd.make_mesh(tuple(config.mesh), devices),
          shd.normalize_rules(config.sharding_rules))


def warn_scanned_on_gpu(model_cfg: BertConfig, mesh) -> None:
  """Scanned layers are the default (compile time independent of depth, the right trade on
  TPU and CPU), but on GPUs XLA copies the scan's stacked activations every step: BERT-base
  128 x 256 bf16 ran 110.5 ms scanned against 73.7 ms unrolled on an H100, and BERT-large
  128 x 128 ran out of memory scanned (benchmarks/RESULTS.md, "One H100"). Say so once."""
  if model_cfg.scan_layers and mesh.devices.flat[0].platform == 'gpu':
    logging.warning('model.scan_layers=True on GPU: XLA copies the scanned activations every '
                    'step (BERT-base bf16 on an H100: 1.5x slower than unrolled, and BERT-large '
                    '128 x 128 does not fit). Pass --config.model.scan_layers=False on GPUs.')


@dataclasses.dataclass(frozen=True)
class RunSetup:
  config: Any
  model_cfg: BertConfig
  mesh: jax.sharding.Mesh
  rules: tuple
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  shardings: ts.TrainState  # NamedSharding per state leaf
  layout: BatchLayout  # what the reader yields and the step compiles for

  @property
  def objective(self) -> str:
    return self.config.data.sentence_objective

  def abstract_state(self) -> ts.TrainState:
    """Shapes, dtypes and target shardings of the state: restore targets, AOT arguments."""
    shapes = ts.abstract_train_state(self.model_cfg, self.tx)
    return jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
        self.shardings)

  def fresh_state(self) -> ts.TrainState:
    return ts.create_train_state(self.model_cfg, self.tx, self.config.seed, self.shardings)

  def state_from_params(self, params) -> ts.TrainState:
    return ts.state_from_params(params, self.tx, self.config.seed, self.shardings)

  def place_params(self, params):
    """Host params (a checkpoint's, say) onto the run's parameter shardings."""
    return jax.device_put(params, self.shardings.params)

  def train_step(self):
    return ts.jit_train_step(self.model_cfg, self.tx, self.schedule, self.shardings, self.mesh,
                             self.rules, self.config.train.accum_steps, self.objective)

  def eval_step(self):
    return ts.jit_eval_step(self.model_cfg, self.shardings.params, self.mesh, self.rules,
                            self.objective)

  def abstract_batch(self, global_batch: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch a step of this run receives, sharded over the batch axes."""
    b = global_batch or self.config.train.global_batch_size
    sharding = shd.batch_sharding(self.mesh)
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
            for k, (shape, dtype) in self.layout.shapes(b).items()}


def from_config(config, devices=None) -> RunSetup:
  """Everything a pre-training run derives from its config, once."""
  model_cfg = model_config(config)
  mesh, rules = mesh_and_rules(config, devices)
  warn_scanned_on_gpu(model_cfg, mesh)
  tx, schedule = optim.from_config(config.optimizer, config.train.num_steps)
  return RunSetup(config=config, model_cfg=model_cfg, mesh=mesh, rules=rules, tx=tx,
                  schedule=schedule,
                  shardings=ts.state_shardings(model_cfg, tx, mesh, rules),
                  layout=BatchLayout.from_data_config(config.data))
