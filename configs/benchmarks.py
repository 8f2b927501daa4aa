r"""The speed benchmarks' pre-training recipe: a run of one model size, as configs/common.py
sets it up, at the batch of the peer benchmark (issue 5).

  python benchmarks/train_step.py --sizes=tiny,mini,small,base   # times get_config(size)

`get_config(size)`: `model.size=size` with everything else common.py's defaults, so the step
timed is the one a user's run of that size executes: optimizer `adamw_bert` with the BERT
schedule and clipping, the default sharding rules, float32, scanned layers, vocab 30,522, 128
tokens with 20 predictions; batch 32 rows (8 for base and large: the peer benchmark's
definition). The scripts change a field through the config (`--dtype` is `model.dtype`,
`--unrolled` is `model.scan_layers=False`), never by building the step themselves. The size
files (bert_tiny.py, ...) are the recipes of real runs: time one of those with
`benchmarks/train_step.py --config=configs/bert_tiny.py`.
"""

from configs import common

# Rows per step by size: the peer benchmark's (benchmarks/peers.py, RESULTS.md).
BATCH = {'tiny': 32, 'mini': 32, 'small': 32, 'medium': 32, 'base': 8, 'large': 8}


def get_config(size: str = 'tiny'):
  if size not in BATCH:
    raise ValueError(f'configs/benchmarks.py:{size}: unknown size; expected one of '
                     f'{sorted(BATCH)}')
  c = common.base_config()
  c.model.size = size
  c.train.global_batch_size = BATCH[size]
  return c
