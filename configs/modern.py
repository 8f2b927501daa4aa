r"""A ModernBERT-class encoder pre-trained with ModernBERT's recipe (Warner et al. 2024).

  --config=configs/modern.py:SIZE,PHASE   SIZE: tiny | mini | base | large, PHASE: phase1 | phase2

The block (`model.arch=modern`): pre-norm, no biases, GeGLU, RoPE, global attention every third
layer and a 128-token sliding window between, a final norm, no sentence head. base and large
are ModernBERT-base (22 x 768, GLU 1152) and ModernBERT-large (28 x 1024, GLU 2624); tiny and
mini are BERT's widths with a GLU of the same parameter count, for CPUs.

The recipe, from the paper (sec. 2.2, appendix) and its training configs
(AnswerDotAI/ModernBERT yamls/): 30% masking, no sentence objective (RoBERTa's full sentences),
StableAdamW (betas 0.9/0.98, eps 1e-6, weight decay 1e-5 scaled by lr/peak), peak lr 8e-4
(base; large 5e-4), a warmup-stable-decay schedule with a 1-sqrt decay, batch-size warmup.
- phase1: 1,024-token rows, RoPE theta 10,000 in every layer;
- phase2: context extension to 8,192-token rows from phase1's params (train.init_from) with
  the global layers' theta raised to 160,000 (the local layers keep 10,000), lower peak lr.
Token counts follow the paper at base and large (phase 1: 1.7T tokens of 4.7M-token batches;
phase 2: 250B); tiny and mini are sized for this repository's CPU runs.

Data: `python -m input_pipeline.pretrain.create_pretraining_data --next_sentence=none
--masked_lm_prob=0.3 --max_seq_length=1024 --max_predictions_per_seq=308` (8192 and 2458 for
phase 2), or any records with dynamic masking (`data.dynamic_masking=True`, which masks
`data.masked_lm_prob` of the tokens afresh).
"""

import math

from configs import common

# size -> (encoder.PRESETS name, rows per batch at 1,024 tokens, batch-warmup start, peak lr,
# phase-1 steps, phase-2 steps). ModernBERT's batch warmup: 768 -> 4,608 rows.
SIZES = {
    'tiny': ('tiny', 16, 4, 1e-3, 2_000, 200),
    'mini': ('mini', 32, 8, 1e-3, 10_000, 1_000),
    'base': ('modernbert-base', 4_608, 768, 8e-4, 360_000, 53_000),
    'large': ('modernbert-large', 4_608, 768, 5e-4, 360_000, 53_000),
}
MASKED_LM_PROB = 0.3
PHASES = {'phase1': (1024, 10_000.0), 'phase2': (8192, 160_000.0)}


def max_predictions(seq_len: int) -> int:
  return math.ceil(seq_len * MASKED_LM_PROB)


def get_config(spec: str = 'tiny,phase1'):
  size, _, phase = spec.partition(',')
  phase = phase or 'phase1'
  if size not in SIZES or phase not in PHASES:
    raise ValueError(f'configs/modern.py:{spec}: expected SIZE,PHASE with SIZE one of '
                     f'{list(SIZES)} and PHASE one of {list(PHASES)}')
  preset, rows_1k, warm_rows, peak, steps1, steps2 = SIZES[size]
  seq_len, global_theta = PHASES[phase]
  c = common.base_config()
  c.model.size = preset
  c.model.arch = 'modern'
  c.model.hidden_dropout = 0.0
  c.model.attention_dropout = 0.0
  c.model.global_rope_theta = global_theta
  c.model.local_rope_theta = 10_000.0
  c.model.vocab_size = 50_368 if size in ('base', 'large') else 8_192

  c.data.max_seq_length = seq_len
  c.data.masked_lm_prob = MASKED_LM_PROB
  c.data.max_predictions_per_seq = max_predictions(seq_len)
  c.data.sentence_objective = 'none'

  c.optimizer = common.optimizer_block(
      name='stable_adamw', learning_rate=peak, b1=0.9, b2=0.98, eps=1e-6, weight_decay=1e-5,
      clip_norm=0.0, fuse_qkv_rms=True, schedule='wsd', decay_shape='1-sqrt',
      decay_proportion=0.1, warmup_proportion=0.01)  # shares of the run: any --num_steps
  # The same tokens per batch in both phases: 8x longer rows, 8x fewer of them.
  rows = rows_1k if phase == 'phase1' else max(1, rows_1k * 1024 // seq_len)
  c.train.global_batch_size = rows
  if phase == 'phase1':
    c.train.num_steps = steps1
    c.train.batch_warmup_steps = max(1, steps1 * 3 // 100)  # the first 3% of the steps
    c.train.batch_warmup_min_size = warm_rows
    c.train.batch_warmup_increment = warm_rows
  else:
    c.train.num_steps = steps2
    c.optimizer.learning_rate = peak * 3 / 8  # ModernBERT-base: 8e-4 -> 3e-4
  if size in ('base', 'large'):  # TPU presets; tiny and mini compute in float32 on CPUs
    if phase == 'phase2' and size == 'base':  # 4 rows of 8,192 tokens a v5e chip: 13.90 GiB
      common.tpu_preset(c, remat_policy='projections', mlm_loss_chunk=512)
    else:
      common.tpu_preset(c)
  if size in ('tiny', 'mini'):
    c.train.log_every = 10
    c.train.eval_every = 500
    c.train.eval_steps = 10
    c.train.checkpoint_every = 500
    c.data.shuffle_buffer = 2_000
  return c
