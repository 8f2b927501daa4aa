r"""BERT-base (L12 H768 A12, 110M parameters) as in the paper.

Hardware: a TPU v4-64 slice (or 16 Cloud TPU chips as in the paper; any mesh works). Phase 1
(128 tokens, 900k steps at batch 256) then phase 2 (512 tokens, 100k steps), Adam 1e-4 with
10k warmup and linear decay, weight decay 0.01, dropout 0.1:

  launch/tpu_pod.sh --tpu my-v4 --accelerator v4-64 --zone us-central2-b -- \
    --config=configs/bert_base.py:phase1 --workdir=gs://bucket/base_p1 \
    --config.data.train_files='gs://bucket/wiki_128/train-*' \
    --config.data.vocab_file=gs://bucket/vocab.txt
  launch/tpu_pod.sh ... -- --config=configs/bert_base.py:phase2 --workdir=gs://bucket/base_p2 \
    --config.train.init_from=gs://bucket/base_p1 --config.data.train_files='gs://bucket/wiki_512/train-*'

Expected (paper-scale Wikipedia+BookCorpus): held-out MLM accuracy ~0.70-0.72 at 512 tokens
(MLPerf's target is 0.720 for BERT-large), NSP accuracy ~0.97-0.98. Not measured here: no
accelerator or corpus of that size on this machine.
"""

from configs import common


def get_config(phase: str = 'phase1'):
  c = common.base_config()
  c.model.size = 'base'
  common.set_phase(c, phase, steps1=900_000, steps2=100_000)
  common.tpu_preset(c)  # 8 rows a v4 chip (256 over a v4-64's 32): no remat, whole loss
  return c
