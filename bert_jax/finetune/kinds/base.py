"""What a fine-tuning task kind is: everything that differs between classification, tagging,
span extraction, ... lives in one `TaskKind` subclass, so adding a kind is one module plus a
`kinds.register` call, and the run, the step and the configs never test a kind's name.

A kind owns
- its batch schema (`BatchSchema`: the arrays a training batch sends to the devices, their
  axes and dtypes; the one place those names exist, as `BatchLayout` is for pre-training),
- its head (`make_head`) and featurisation (records -> numpy arrays, `featurize`),
- its loss (`loss_sums`, traced inside the jitted step; `value_and_grad` differentiates it,
  over the whole batch at once unless the kind knows a cheaper way) and what the predict step
  returns (`readout`),
- predictions, scores, the input-blind baseline, the headline metric's name and the files an
  unlabelled split's predictions go to,
- its export (an HF `AutoModelFor<Task>` directory by default).

Methods that score take the featurized task (`bert_jax.finetune.tasks.Task`) for what the run
settled: the label order, the training arrays (majority baselines), the tokenizer and the data
config.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.convert import hf_heads
from bert_jax.finetune import metrics
from bert_jax.model import heads
from input_pipeline import fs
from input_pipeline.finetune import glue

# The encoder's inputs: every kind's model reads these three, in this order.
MODEL_INPUTS = ('input_ids', 'input_mask', 'segment_ids')


@dataclasses.dataclass(frozen=True)
class ArraySpec:
  """One batch array: its name, axes (`batch` first; `tokens` marks the axis a length bucket
  cuts; other names are sizes the data fixes, such as `choices`) and dtype."""
  name: str
  axes: tuple[str, ...]
  dtype: type

  def shape(self, batch: int, tokens: int, sizes: dict[str, int]) -> tuple[int, ...]:
    lookup = {'batch': batch, 'tokens': tokens, **sizes}
    return tuple(lookup[a] for a in self.axes)


@dataclasses.dataclass(frozen=True)
class BatchSchema:
  """The arrays of a kind's training batch. Featurized splits may hold more arrays (word ids,
  SQuAD's feature indices); those stay on the host."""
  arrays: tuple[ArraySpec, ...]
  sizes: tuple[tuple[str, int], ...] = ()  # defaults of the data-fixed axes, for AOT shapes

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(a.name for a in self.arrays)

  def token_axis(self, name: str) -> bool:
    """Whether array `name` has a token axis (last), which a length bucket cuts."""
    return any(a.name == name and a.axes[-1] == 'tokens' for a in self.arrays)

  def shapes(self, max_seq_length: int):
    """`global_batch -> {array: (shape, dtype)}`: what an AOT compilation lowers the step
    for."""
    sizes = dict(self.sizes)
    return lambda b: {a.name: (a.shape(b, max_seq_length, sizes), a.dtype) for a in self.arrays}


def rows_schema(*extra: ArraySpec, row_axes: tuple[str, ...] = ('batch', 'tokens'),
                sizes: tuple[tuple[str, int], ...] = ()) -> BatchSchema:
  """The encoder's inputs over `row_axes` plus a kind's targets."""
  inputs = tuple(ArraySpec(name, row_axes, jnp.int32) for name in MODEL_INPUTS)
  return BatchSchema(inputs + extra, sizes)


class TaskKind:
  """The base: defaults every kind shares; subclasses say what differs."""

  name: str = ''
  baseline_name: str = ''  # results' name for `baseline` (majority-class, chance, ...)
  head_task: str = ''  # bert_jax.model.heads' task of the head it trains
  headline: str = 'accuracy'  # the headline metric's name (GLUE splits: GLUE's)
  has_label_list = True  # its head's outputs are named labels the run may reorder
  # Predictions per token ([batch, tokens, ...]): padded back to max_seq_length when a
  # prediction batch was cut to a length bucket.
  token_outputs = False
  # Training rows may be cut to a length bucket (not where the loss reads every position).
  cut_training_rows = True
  # The first checkpoint progress version (finetune/resume.py) whose scores compare with
  # today's: a resumed run refuses older ones rather than pick its best epoch across scales.
  scores_version = 1

  def configure(self, d) -> 'TaskKind':
    """The kind with a run's settings (the task's data block `d`), for kinds that have any
    (the embedding's pooling and loss scale); kinds compare equal when their settings do."""
    return self

  def schema(self) -> BatchSchema:
    raise NotImplementedError

  def make_head(self, labels: tuple[str, ...], classifier_dropout: float | None) -> heads.Head:
    return heads.Head(self.head_task, num_labels=len(labels), labels=labels,
                      classifier_dropout=classifier_dropout)

  def featurize(self, records: list, labels: tuple[str, ...], tokenizer, d, training: bool,
                source: str = '') -> tuple[dict[str, np.ndarray], list | None]:
    """(arrays, per-row features kept for decoding, or None)."""
    raise NotImplementedError

  def check_train(self, arrays: dict[str, np.ndarray], d) -> None:
    """Refuse training arrays the kind cannot learn from."""

  # ------------------------------------------------------------------- in the step

  def loss_sums(self, outputs, batch) -> tuple[jax.Array, jax.Array]:
    """(weighted loss sum, weight sum) of a batch; padding rows weigh 0."""
    raise NotImplementedError

  def mean_loss(self, outputs, batch) -> jax.Array:
    """The batch's weighted mean loss (an all-padding batch: 0)."""
    total, weight = self.loss_sums(outputs, batch)
    return total / jnp.maximum(weight, 1.0)

  def value_and_grad(self, forward, params, batch, key: jax.Array) -> tuple[jax.Array, Any]:
    """(mean loss, parameter gradients) of a training batch; `forward(params, inputs, key)`
    is the model's training pass over `inputs` (the batch, or some of its rows). One pass over
    the whole batch here; the embedding kind may embed it in chunks (finetune/grad_cache.py)."""
    return jax.value_and_grad(lambda p: self.mean_loss(forward(p, batch, key), batch))(params)

  def readout(self, outputs) -> dict[str, jax.Array]:
    """What the predict step returns of the model's outputs."""
    return {'logits': outputs}

  # ------------------------------------------------------------------- scoring

  def headline_name(self, task, split) -> str:
    if split.glue_name:
      return metrics.GLUE_METRICS[split.glue_name].headline
    return self.headline

  def predictions(self, task, split, outputs: dict[str, np.ndarray]):
    raise NotImplementedError

  def score(self, task, split, outputs: dict[str, np.ndarray]) -> dict[str, float]:
    return self.score_predictions(task, split, self.predictions(task, split, outputs))

  def score_predictions(self, task, split, predictions) -> dict[str, float]:
    raise NotImplementedError

  def baseline(self, task, split) -> dict[str, float]:
    raise NotImplementedError

  def write_predictions(self, task, split, outputs: dict[str, np.ndarray],
                        directory: str) -> str:
    """An unlabelled split's predictions under `directory`, where the kind has a file for
    them."""
    raise ValueError(f'{split.name}: unlabelled {self.name} splits are not predicted')

  # ------------------------------------------------------------------- export

  def export(self, directory: str, start, head: heads.Head, params) -> None:
    """The trained model as an HF `AutoModelFor<Task>` directory with its tokenizer."""
    hf_heads.save_finetuned(directory, start.cfg, head, params, tokenizer=start.tokenizer,
                            overwrite=True)


def write_index_predictions(split, predictions, directory: str) -> str:
  """`glue_submission/<name>.tsv` for a GLUE split (the leaderboard's file), else
  `predictions/<split>.tsv` (`index<TAB>prediction`, the row's index in its file)."""
  indices = [e.index for e in split.records]
  if split.glue_name:
    target = fs.join(directory, 'glue_submission')
    with fs.staged_dir(target) as local:
      glue.write_glue_submission(local, split.glue_name, indices, predictions)
    return fs.join(target, f'{split.glue_name}.tsv')
  path = fs.join(directory, 'predictions', f'{split.name}.tsv')
  fs.makedirs(fs.dirname(path))
  fs.write_text(path, 'index\tprediction\n' + ''.join(
      f'{i}\t{p if isinstance(p, str) else f"{float(p):.6g}"}\n'
      for i, p in zip(indices, predictions)))
  return path
