r"""BERT-tiny (L2 H128 A2) on the embedded corpus: the CPU demo default.

  bash scripts/demo.sh   # data creation, 2-core CPU training, eval, export, fill-mask

The demo trains a WordPiece vocabulary of 8,192 on the Python standard library's docstrings,
writes 128-token instances, and trains for `train.num_steps` steps of batch 32 (about 7
minutes on 2 cores; 2,100 steps: 1,800 reached 3.04-3.16x the majority token's held-out MLM
accuracy and 1,200 2.7x, so 2,100 keeps a margin over 3x in the time the faster CPU loop saved). Expected: held-out MLM accuracy well above the majority-token baseline
(the demo prints both) and NSP accuracy above chance.
"""

from configs import common


def get_config(phase: str = 'phase1'):
  c = common.base_config()
  c.model.size = 'tiny'
  c.model.vocab_size = 8192
  common.set_phase(c, phase, steps1=2_100, steps2=200)
  c.train.global_batch_size = 32
  c.train.log_every = 50
  c.train.eval_every = 700
  c.train.eval_steps = 20
  c.train.checkpoint_every = 700
  c.optimizer.learning_rate = 5e-4  # 1e-3 stalls at the unigram plateau at batch 32
  c.optimizer.warmup_steps = 100
  c.data.shuffle_buffer = 2_000
  return c
