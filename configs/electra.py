r"""ELECTRA pre-training (Clark et al. 2020): replaced-token detection, a discriminator trained
beside a small MLM generator that shares its embeddings.

  --config=configs/electra.py:SIZE   SIZE: tiny | small | base

    python -m input_pipeline.pretrain.create_pretraining_data --next_sentence=none \
        --input_file='corpus/*.txt' --output_file=data/train --vocab_file=vocab.txt \
        --max_seq_length=128 --max_predictions_per_seq=20
    python -m bert_jax.main --config=configs/electra.py:small --workdir=runs/electra-small \
        --config.data.train_files='data/train-*' --config.data.vocab_file=vocab.txt
    python -m bert_jax.export --workdir=runs/electra-small --output=exports/electra-small
    # -> exports/electra-small/discriminator (ElectraForPreTraining),
    #    exports/electra-small/generator (ElectraForMaskedLM)

small and base are the paper's recipes (Table 6, appendix A; google-research/electra
configure_pretraining.py): 15% masking, disc_weight 50, generator 1/4 (small) or 1/3 (base)
of the discriminator's width at full depth, BERT's AdamW (eps 1e-6, weight decay 0.01, linear
decay after 10,000 warmup steps), dropout 0.1.
- small: 12 x 256 (4 heads, MLP 1024) on 128-wide embeddings, 128-token rows, batch 128,
  lr 5e-4, 1M steps; expect GLUE dev ~79.9 (the paper's Table 1, 4 days on one V100);
- base: 12 x 768 on 768-wide embeddings, 512-token rows, batch 256, lr 2e-4, 766k steps (BERT-
  base's compute); expect GLUE dev ~85.1 (Table 1).
tiny (2 x 128 on 128-wide tables, generator half as wide) is for this CPU and the tests.

DeBERTa-v3's gradient-disentangled embedding sharing: --config.rtd.embedding_sharing=gdes.
Continue from a released pair (transformers' google/electra-small-discriminator and
-generator layouts): --config.model.size=init_from --config.train.init_from=DISCRIMINATOR_DIR
--config.rtd.generator_init_from=GENERATOR_DIR and the generator's width fraction
(--config.rtd.generator_hidden_fraction=1.0 for the released small pair, whose generator is
as wide as its discriminator).
"""

from configs import common

# size -> (preset, layers (0: the preset's), embedding_size (0: hidden), generator fraction,
#          tokens a row, batch, lr, steps, predictions a row)
SIZES = {
    'tiny': ('tiny', 0, 0, 0.5, 128, 32, 5e-4, 2_500, 20),
    'small': ('mini', 12, 128, 0.25, 128, 128, 5e-4, 1_000_000, 20),
    'base': ('base', 0, 0, 1 / 3, 512, 256, 2e-4, 766_000, 80),
}


def get_config(size: str = 'small'):
  if size not in SIZES:
    raise ValueError(f'configs/electra.py:{size}: expected one of {list(SIZES)}')
  preset, layers, embedding, fraction, seq_len, batch, lr, steps, predictions = SIZES[size]
  c = common.base_config()
  c.model.size = preset  # 'mini' is 256 wide with 4 heads: ELECTRA-small at 12 layers
  c.model.num_layers = layers
  c.model.arch = 'electra'
  c.model.embedding_size = embedding
  c.model.vocab_size = 8192 if size == 'tiny' else 30522
  c.train.objective = 'rtd'
  c.rtd.generator_hidden_fraction = fraction
  c.data.sentence_objective = 'none'
  c.data.max_seq_length = seq_len
  c.data.max_predictions_per_seq = predictions
  c.optimizer.learning_rate = lr
  c.optimizer.warmup_steps = 100 if size == 'tiny' else 10_000
  c.train.global_batch_size = batch
  c.train.num_steps = steps
  if size == 'tiny':
    c.model.scan_layers = False
    c.train.log_every = 50
    c.train.eval_every = 500
    c.train.eval_steps = 20
    c.train.checkpoint_every = 500
    c.data.shuffle_buffer = 2_000
  else:
    c.train.log_every = 1_000
    c.train.eval_every = 50_000
    c.train.checkpoint_every = 50_000
  return c
