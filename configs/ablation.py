r"""What each ModernBERT piece buys: classic BERT, then the pieces added one at a time, ending
at the full modern recipe, every cell trained for the same FLOPs (benchmarks/modern_ablation.py).

  --config=configs/ablation.py:CELL   CELL: one of CELLS (e.g. bert, +rope, +wsd)

Every cell is a tiny encoder (3 layers x 128 hidden, 2 heads) on 128-token full-sentence rows
(no sentence objective), batch 16, dynamically masked, peak lr 5e-4 with 5% warmup; the
benchmark sets the data files and each cell's step count so that steps x
`bert_jax.model.flops.train_flops_per_step(computed=True)` equals the classic cell's budget. The local
window is 32 tokens (a quarter of the row; ModernBERT's 128 is an eighth of its 1,024-token
phase 1).
Cell k is cell k-1 plus:
"""

import ml_collections

from configs import common

CUMULATIVE = (
    ('bert', {}),  # post-norm, biases, GELU MLP, learned positions, all global, dropout 0.1,
    # 15% masking, AdamW without bias correction, BERT's linear decay
    ('+pre_norm', {'model.norm_position': 'pre'}),
    ('+no_bias', {'model.use_bias': False}),
    ('+geglu', {'model.mlp': 'glu'}),  # inner width with the MLP's parameter count
    ('+rope', {'model.positions': 'rope'}),
    ('+local_global', {'model.global_attention_every': 3}),
    ('+no_dropout', {'model.hidden_dropout': 0.0, 'model.attention_dropout': 0.0}),
    ('+mask30', {'data.masked_lm_prob': 0.3}),
    ('+stable_adamw', {'optimizer.name': 'stable_adamw', 'optimizer.b2': 0.98,
                       'optimizer.weight_decay': 1e-5, 'optimizer.clip_norm': 0.0,
                       'optimizer.fuse_qkv_rms': True}),
    ('+wsd', {'optimizer.schedule': 'wsd', 'optimizer.decay_shape': '1-sqrt',
              'optimizer.decay_proportion': 0.1}),
)
CELLS = tuple(name for name, _ in CUMULATIVE)
SEQ_LEN = 128
MAX_PREDICTIONS = 39  # 30% of 128: every cell reads the same records (dynamic masking)


def overrides(cell: str) -> dict:
  """The dotted fields cell `cell` sets: its own and every earlier cell's."""
  if cell not in CELLS:
    raise ValueError(f'configs/ablation.py:{cell}: expected one of {CELLS}')
  out = {}
  for name, fields in CUMULATIVE[:CELLS.index(cell) + 1]:
    out.update(fields)
  return out


def get_config(cell: str = 'bert') -> ml_collections.ConfigDict:
  c = common.base_config()
  c.model.size = 'tiny'
  c.model.num_layers = 3
  c.model.scan_layers = False  # 3 layers: unrolled is the faster CPU step
  c.model.vocab_size = 8192
  c.model.local_window = 32
  c.data.max_seq_length = SEQ_LEN
  c.data.max_predictions_per_seq = MAX_PREDICTIONS
  c.data.sentence_objective = 'none'
  c.data.dynamic_masking = True
  c.data.shuffle_buffer = 2_000
  c.optimizer.learning_rate = 5e-4
  c.optimizer.warmup_proportion = 0.05
  c.train.global_batch_size = 16
  c.train.num_steps = 500  # the classic cell's; the benchmark scales it to equal FLOPs
  c.train.log_every = 25
  c.train.eval_every = 1_000_000  # evaluated once, after training, by the benchmark
  c.train.checkpoint_every = 1_000_000
  c.train.async_checkpoint = False
  return common.override(c, overrides(cell))
