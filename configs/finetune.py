r"""Fine-tuning configs, one per task: `--config=configs/finetune.py:<task>`.

  python -m bert_jax.finetune --config=configs/finetune.py:mrpc --init=uncased_L-12_H-768_A-12 \
      --workdir=runs/mrpc --config.data.glue_dir=glue_data/MRPC [--config.seeds=5]

Tasks: the GLUE tasks (cola sst2 mrpc qqp stsb mnli qnli rte wnli), mr and mr_regression
(movie reviews, input_pipeline/tasks/mr.py), conll (CoNLL-2003 NER, or any word-per-line tagging
such as POS), squad and squad_v2, swag (multiple choice), and generic (your own
.csv/.tsv/.jsonl). Only the data fields a task reads exist in its config, so a misspelt or
irrelevant override is an error, not silently ignored.

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

GLUE = ('cola', 'sst2', 'mrpc', 'qqp', 'stsb', 'mnli', 'qnli', 'rte', 'wnli')
TASKS = GLUE + ('mr', 'mr_regression', 'conll', 'squad', 'squad_v2', 'swag', 'generic')


def get_config(task: str = 'mrpc') -> ml_collections.ConfigDict:
  task = task.lower().replace('-', '')
  if task not in TASKS:
    raise ValueError(f'configs/finetune.py:{task}: unknown task; expected one of {TASKS}')
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

  c.data = _data_config(task)

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
  _task_defaults(c, task)
  return c


def _data_config(task: str) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.max_seq_length = 128  # tokens with [CLS]/[SEP]; longer inputs are truncated
  # Batches are padded to the smallest of this many evenly spaced lengths (the last is
  # max_seq_length) that holds their longest row: short inputs stop paying for 128 tokens,
  # at one compiled step per length. 1 = always max_seq_length.
  d.length_buckets = 4
  # Train on the first N training records as read (sentences, rows, SQuAD questions), 0 = all.
  d.max_train_examples = 0
  if task in GLUE:
    d.glue_dir = ''  # the task's directory of the GLUE download (glue_data/MRPC) or its root
    d.skip_bad_lines = False  # skip rows with the wrong column count instead of failing
    if task == 'mnli':
      # GLUE's diagnostic test set (AX.tsv), predicted for the leaderboard; empty: looked for
      # beside glue_dir (glue_data/AX/AX.tsv, glue_data/diagnostic/diagnostic.tsv) and under it.
      d.ax_file = ''
  elif task in ('mr', 'mr_regression'):
    # vaderSentiment-3.3.2.tar.gz, hutto_ICWSM_2014.tar.gz or the ratings .txt; empty:
    # download the sdist with pip into mr_cache_dir (SHA-256 checked).
    d.mr_file = ''
    d.mr_cache_dir = 'runs/cache/mr'  # where fetch_mr keeps the sdist
    d.split_seed = 0  # the 80/10/10 split's shuffle (input_pipeline/tasks/mr.py)
  elif task == 'conll':
    # Column files, one word a line: `word TAG`, CoNLL-2003's `word POS chunk NER`, or any
    # other column count (each file's first line sets it). Entity tags (B-/I-/E-/S-X and O)
    # are scored by entity F1, bare tags (POS: NN, VBZ) by token accuracy.
    d.train_file = ''
    d.dev_file = ''
    d.test_file = ''  # optional; labelled, so the best-dev epoch's test score is reported
    d.label_column = -1  # the tag column, 0-based; negative counts from the end (-1: last)
    d.labels = ''  # comma list of tags; empty: CoNLL-2003's if the data fits, else the train's
  elif task in ('squad', 'squad_v2'):
    d.train_file = ''  # train-v1.1.json / train-v2.0.json
    d.dev_file = ''  # dev-v1.1.json / dev-v2.0.json
    d.test_file = ''  # optional, same JSON with answers: scored (EM, F1) at the best epoch
    d.max_seq_length = 384  # window length: [CLS] question [SEP] context [SEP]
    d.doc_stride = 128  # context tokens between window starts
    d.max_query_length = 64  # question tokens kept
    d.n_best_size = 20  # candidate starts and ends per window
    d.max_answer_length = 30  # tokens
    d.null_score_diff_threshold = 0.0  # squad_v2: answer "" when null beats spans by this
    # Refuse a training file in which more than this fraction of the answers cannot be
    # aligned (answer_start not at the answer text, or no window holds it): they are dropped,
    # and many of them means offsets in other units (bytes) or a different context.
    d.max_misaligned_fraction = 0.01
  elif task == 'swag':
    # rowanz/swagaf data/: sent1, sent2, ending0..3, label (input_pipeline/tasks/swag.py); each
    # choice is `[CLS] sent1 [SEP] sent2 ending_i [SEP]`, cut to max_seq_length (128).
    d.train_file = ''  # train.csv
    d.dev_file = ''  # val.csv
    d.test_file = ''  # optional test.csv: no labels, so predicted (predictions/test.tsv)
  else:  # generic
    d.train_file = ''  # .csv / .tsv (header names the columns) / .jsonl
    d.dev_file = ''
    d.test_file = ''  # optional; scored if it has the label column, else predicted (predictions/)
    d.text_a = 'sentence'  # column names
    d.text_b = ''  # empty: single sentences
    d.label = 'label'  # the label column (classification or, with regression, a number)
    d.labels = ''  # comma list fixing the label order; empty: sorted train labels
    d.regression = False  # labels are numbers: MSE loss, Pearson/Spearman
    d.skip_bad_lines = False  # skip rows with the wrong column count instead of failing
  return d


def _task_defaults(c: ml_collections.ConfigDict, task: str) -> None:
  if task in ('conll', 'squad', 'squad_v2'):
    c.optimizer.learning_rate = 5e-5
  if task == 'squad_v2':  # the paper: 2 epochs, batch 48 for SQuAD 2.0
    c.train.num_epochs = 2
    c.train.global_batch_size = 48
  if task == 'swag':  # the paper, section 4.4: 3 epochs, learning rate 2e-5, batch 16
    c.train.global_batch_size = 16
