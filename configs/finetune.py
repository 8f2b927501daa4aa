r"""Fine-tuning configs, one per task: `--config=configs/finetune.py:<task>`.

  python -m bert_jax.finetune --config=configs/finetune.py:mrpc --init=uncased_L-12_H-768_A-12 \
      --workdir=runs/mrpc --config.data.glue_dir=glue_data/MRPC [--config.seeds=5]

Tasks: the GLUE tasks (cola sst2 mrpc qqp stsb mnli qnli rte wnli), mr and mr_regression
(movie reviews, input_pipeline/finetune/mr.py), conll (CoNLL-2003 NER, or any word-per-line tagging
such as POS), squad and squad_v2, swag (multiple choice), generic (your own
.csv/.tsv/.jsonl) and embedding (sentence embeddings from (query, positive[, negative]) pairs,
scored by retrieval against BM25; batch 64, lr 5e-5). Each task's kind, reader and data
fields are its entry in input_pipeline/finetune/registry.py, so a task registered there (from
any module) has a config here too; its recipe where it differs from the defaults below is
RECIPES'. Only the data fields a task reads exist in its
config, so a misspelt or irrelevant override is an error, not silently ignored.

Defaults are google-research/bert's (run_classifier.py, run_squad.py, the paper's appendix
A.3): AdamW without bias correction (eps 1e-6, weight decay 0.01 except biases and LayerNorm,
gradients clipped to norm 1.0), 10% linear warmup then linear decay to 0, batch 32, 3 epochs,
128 tokens, dropout from the start point (0.1 in every released BERT), classifier
N(0, 0.02). Learning rate: the paper searched {5e-5, 4e-5, 3e-5, 2e-5}; we default to 2e-5
for sentence tasks (run_classifier.py's README example, the most stable on the small GLUE
sets) and 5e-5 for CoNLL and SQuAD (the paper's SQuAD setting; the usual NER one).
"""

import ml_collections

from configs import common
from input_pipeline.finetune import registry


# Each task's recipe where it differs from the defaults (config field -> value).
RECIPES: dict[str, dict] = {
    'conll': {'optimizer.learning_rate': 5e-5},  # the usual NER setting
    'squad': {'optimizer.learning_rate': 5e-5},  # the paper's SQuAD v1.1 setting
    # the paper, SQuAD 2.0: 2 epochs, batch 48, lr 5e-5
    'squad_v2': {'optimizer.learning_rate': 5e-5, 'train.num_epochs': 2,
                 'train.global_batch_size': 48},
    'swag': {'train.global_batch_size': 16},  # the paper, section 4.4: 3 epochs, 2e-5, batch 16
    # sentence-transformers' trainer defaults (HF's lr 5e-5; 10% warmup here) and a larger
    # batch: every other row's texts are a query's negatives
    'embedding': {'optimizer.learning_rate': 5e-5, 'train.global_batch_size': 64},
}


def tasks() -> tuple[str, ...]:
  """Every registered task (input_pipeline/finetune/registry.py), including ones a user's module
  registered after import."""
  return tuple(registry.TASKS)


def get_config(task: str = 'mrpc') -> ml_collections.ConfigDict:
  task = task.lower().replace('-', '')
  if task not in registry.TASKS:
    raise ValueError(f'configs/finetune.py:{task}: unknown task; expected one of {tasks()}')
  spec = registry.TASKS[task]
  c = ml_collections.ConfigDict()
  c.task = task  # selects the readers, head, loss and metrics (set by :<task>)
  c.init = ''  # start point (--init): our workdir, an HF directory or a Google TF checkpoint;
  # random:<one of those>: its model config and tokenizer with fresh weights (no pre-training)
  c.seed = 0  # seed of the first run: head init, data order, dropout
  # Runs: N (seeds seed .. seed+N-1) or a list (1,5,7); results report median, min and max.
  c.seeds = ml_collections.FieldReference(1, field_type=object)
  c.do_lower_case = ml_collections.config_dict.placeholder(bool)  # None: the start point's
  c.fresh_head = False  # True: ignore a task head the start point carries (keep its encoder)
  c.export = True  # the best-dev epoch's model -> workdir/hf_export (HF BertFor<Task>)

  c.model = common.model_block()
  c.model.hidden_dropout = ml_collections.config_dict.placeholder(float)  # None: start point's
  c.model.attention_dropout = ml_collections.config_dict.placeholder(float)  # None: same
  c.model.classifier_dropout = ml_collections.config_dict.placeholder(float)  # None: hidden's
  # Unrolled: a fine-tuning step runs ~15% faster on CPU (MiniLM-L6, 32 x 64: ~620 against ~720
  # ms) and ~1.5x on GPU; its compile time, which scanning keeps flat in depth, matters less
  # in a run of minutes (benchmarks/RESULTS.md, "The CPU allocator").
  c.model.scan_layers = False

  c.data = _data_config(spec)

  # peak 2e-5; 5e-5 for conll and squad (see above); warmup 10% of all steps of the run
  c.optimizer = common.optimizer_block(learning_rate=2e-5, warmup_proportion=0.1,
                                       warmup_steps=0)

  # the last batch of an epoch is padded (zero weights)
  c.train = common.train_block(global_batch_size=32, log_every=50)
  c.train.eval_batch_size = 64  # rounded up to a multiple of the mesh's batch devices
  c.train.num_epochs = 3  # the schedule spans them all; every epoch is scored on dev
  # Stop (resumably) once this many epochs are done, 0 = all: for jobs with a time limit.
  # The schedule always spans num_epochs, so the next run continues the same run.
  c.train.stop_after_epoch = 0

  common.add_parallelism(c)
  return common.override(c, RECIPES.get(task, {}))


def _data_config(spec: registry.TaskSpec) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.max_seq_length = 128  # tokens with [CLS]/[SEP]; longer inputs are truncated
  # Batches are padded to the smallest of this many evenly spaced lengths (the last is
  # max_seq_length) that holds their longest row: short inputs stop paying for 128 tokens,
  # at one compiled step per length. 1 = always max_seq_length.
  d.length_buckets = 4
  # Train on the first N training records as read (sentences, rows, SQuAD questions), 0 = all.
  d.max_train_examples = 0
  spec.data_fields(d)  # the task's own files and settings
  return d
