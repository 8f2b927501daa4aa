r"""BERT-mini (L4 H256 A4, 11M parameters): quick experiments on one accelerator or a CPU.

  python -m bert_jax.main --config=configs/bert_mini.py --workdir=/tmp/mini \
    --config.data.train_files='data/train-*' --config.data.vocab_file=vocab.txt

Hardware: one GPU/TPU chip for the full 900k-step schedule; a CPU for smoke runs.
"""

from configs import common


def get_config(phase: str = 'phase1'):
  c = common.base_config()
  c.model.size = 'mini'
  common.set_phase(c, phase, steps1=900_000, steps2=100_000)
  return c
