r"""BERT-large (L24 H1024 A16, 335M parameters) as in the paper, or NVIDIA's LAMB recipe.

Hardware: TPU v4-64 (paper: 64 TPU chips, 4 days). Same two phases as bert_base.py.
`:lamb_phase1` / `:lamb_phase2` are NVIDIA's large-batch recipe: LAMB, global batch 65,536
then 32,768, 7,038 + 1,563 steps, lr 6e-3 / 4e-3, warmup 2,000 / 200 steps (use
--config.train.accum_steps to fit the batch).

  python -m bert_jax.main --config=configs/bert_large.py:phase2 --workdir=... \
    --config.train.init_from=<phase1 workdir>

Expected: MLM accuracy >= 0.720 on held-out 512-token Wikipedia (MLPerf's quality target).
"""

from configs import common


def get_config(phase: str = 'phase1'):
  c = common.base_config()
  c.model.size = 'large'
  if phase.startswith('lamb_'):
    phase = phase[len('lamb_'):]
    common.set_phase(c, phase, steps1=7_038, steps2=1_563)
    c.optimizer.name = 'lamb'
    c.optimizer.schedule = 'warmup_linear'
    if phase == 'phase1':
      c.train.global_batch_size, c.optimizer.learning_rate = 65_536, 6e-3
      c.optimizer.warmup_steps = 2_000
    else:
      c.train.global_batch_size, c.optimizer.learning_rate = 32_768, 4e-3
      c.optimizer.warmup_steps = 200
    c.optimizer.weight_decay = 0.01
    return c
  common.set_phase(c, phase, steps1=900_000, steps2=100_000)
  return c
