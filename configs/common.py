"""Every field of a bert_jax run, commented. Size files (bert_tiny.py, ...) override these.

Phases follow the paper: phase1 = 128 tokens, 20 predictions, 90% of the steps; phase2 = 512
tokens, 80 predictions, 10% of the steps, initialised from phase1's params.
"""

import ml_collections
from ml_collections.config_dict import placeholder


def base_config() -> ml_collections.ConfigDict:
  """A pre-training run: the shared blocks plus pre-training's data and checkpoint fields."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = model_block()
  # tiny | mini | small | medium | base | large | modernbert-base | modernbert-large
  # (encoder.PRESETS), or init_from: train.init_from's own shape (any released checkpoint)
  c.model.size = 'base'
  c.model.vocab_size = 30522  # must equal the tokenizer's
  c.model.hidden_act = 'gelu'  # exact erf GELU (HF "gelu"); gelu_tanh = the original TF code
  c.model.num_layers = 0  # 0: the size's depth; N: the size's width with N layers
  # bert | modern: ModernBERT's block (pre-norm, no biases, GeGLU, RoPE, local/global
  # attention, final norm; no pooler or sentence head: data.sentence_objective=none) |
  # roberta, xlm-roberta: BERT's block with RoBERTa's positions, one token type and eps 1e-5;
  # no pooler or sentence head either (continued pre-training of a released RoBERTa / XLM-R) |
  # electra: BERT's block on embedding_size-wide embeddings, ELECTRA's generator MLM head; no
  # pooler or sentence head (continued pre-training of an ELECTRA discriminator or generator).
  c.model.arch = 'bert'
  # Each architecture switch alone (None = the arch's value; bert_jax/model/encoder.py):
  c.model.norm_position = placeholder(str)  # post | pre
  c.model.use_bias = placeholder(bool)  # biases in linear layers and norms
  c.model.mlp = placeholder(str)  # mlp | glu (GeGLU)
  c.model.positions = placeholder(str)  # learned | rope
  c.model.global_attention_every = placeholder(int)  # 1 = all global; N: local between
  c.model.local_window = placeholder(int)  # tokens a local layer sees (half each side)
  c.model.global_rope_theta = placeholder(float)  # phase 2 of long context raises it
  c.model.local_rope_theta = placeholder(float)
  c.model.intermediate_size = 0  # 0: the size's (a GLU on a BERT size: same parameters)
  c.model.embedding_size = 0  # 0: the size's (hidden_size); narrower: arch electra only
  # Shape fields beside the size (None: the size's or the family's). `model.size=init_from`
  # fills them all (and arch, vocab_size, the switches) from train.init_from's checkpoint when
  # the run starts, so any released encoder continues in its own shape; the workdir's
  # config.json keeps them.
  c.model.hidden_size = placeholder(int)
  c.model.num_heads = placeholder(int)
  c.model.max_position_embeddings = placeholder(int)
  c.model.type_vocab_size = placeholder(int)
  c.model.position_offset = placeholder(int)  # RoBERTa's 2
  c.model.layer_norm_eps = placeholder(float)
  c.model.initializer_range = placeholder(float)
  c.model.classifier_pooling = placeholder(str)  # ModernBERT's heads: cls | mean
  # MLM loss in chunks of this many masked positions a row under jax.checkpoint, so the
  # [rows, predictions, vocab] float32 logits are never whole (bert_jax/pretrain/mlm_loss.py):
  # the same loss and gradients, one more decoder matmul in the backward. 0 = off.
  c.model.mlm_loss_chunk = 0

  c.data = ml_collections.ConfigDict()
  c.data.train_files = ''  # comma-separated globs of TFRecords (create_pretraining_data)
  c.data.eval_files = ''  # held-out TFRecords; empty = no eval
  c.data.max_seq_length = 128
  c.data.max_predictions_per_seq = 20
  c.data.packed = False  # records written with create_pretraining_data --pack
  c.data.max_instances_per_row = 3  # K of the packed rows
  c.data.shuffle_buffer = 10_000
  c.data.dynamic_masking = False  # RoBERTa-style fresh masks (unpacked records only)
  # Share of tokens dynamic masking predicts (80/10/10 as always); 0.3 is ModernBERT's. Records
  # carry the rate create_pretraining_data --masked_lm_prob wrote them with.
  c.data.masked_lm_prob = 0.15
  c.data.whole_word_masking = False  # with dynamic_masking (needs the data's tokenizer)
  c.data.pack = False  # pack unpacked records on the fly into rows of K instances
  c.data.pack_window = 1024  # records the on-the-fly packer sees at once
  c.data.vocab_file = ''  # WordPiece vocab.txt used for the data (exported with the model)
  c.data.spm_model = ''  # or a SentencePiece .model
  # or a tokenizer.json / vocab.json + merges.txt, or a model directory holding one (RoBERTa,
  # ModernBERT, XLM-R...: create_pretraining_data --tokenizer); special ids and casing its own
  c.data.tokenizer = ''
  c.data.do_lower_case = True
  c.data.threads = 0  # tf.data threads per process; 0 = all cores (1 leaves XLA room on CPUs)
  # What the records hold, as create_pretraining_data --next_sentence wrote them: nsp (BERT),
  # sop (ALBERT sentence order) or none (RoBERTa full sentences: MLM only, no NSP loss).
  # The reader refuses records of another objective.
  c.data.sentence_objective = 'nsp'

  c.optimizer = optimizer_block(learning_rate=1e-4, warmup_steps=10_000)

  c.train = train_block(global_batch_size=256, log_every=100)
  # mlm: masked LM (+ data.sentence_objective) | rtd: replaced-token detection (ELECTRA): the
  # model is the discriminator, the `rtd` block sizes its generator (bert_jax/pretrain/rtd.py)
  c.train.objective = 'mlm'
  c.train.accum_steps = 1  # micro-batches per step: batch 256 on any machine
  # Batch-size warmup (ModernBERT; bert_jax/training/batch_schedule.py): the global batch
  # grows from min_size by increment (0 = min_size) to global_batch_size, each size held for
  # an equal share of the warmup steps, each compiled once. 0 steps = off.
  c.train.batch_warmup_steps = 0
  c.train.batch_warmup_min_size = 0  # global rows of the first steps
  c.train.batch_warmup_increment = 0  # divides min_size and global_batch_size
  c.train.num_steps = 900_000
  c.train.eval_every = 10_000
  c.train.eval_steps = 100  # batches per eval (fewer if the eval files end first)
  c.train.checkpoint_every = 10_000
  c.train.keep_checkpoints = 3
  c.train.keep_every = 0  # also keep every N-th step forever; 0 = off
  c.train.async_checkpoint = True
  # Resume a checkpoint written by another process count: keep the model and optimizer state,
  # restart the data in a new order (a warning says so). False: refuse, saying what to do.
  c.train.allow_process_count_change = False
  c.train.init_from = ''  # phase2: a phase1 workdir; params only, fresh optimizer (by default)
  c.train.init_opt_state_from = False  # with init_from: also its Adam moments, fresh step count
  # with init_from: accept a start point whose vocabulary or casing differs from data.*
  c.train.init_from_allow_vocab_change = False
  c.train.profile_steps = ''  # "a,b": jax.profiler trace of steps a..b into workdir/profile
  c.train.peak_flops_per_device = 0.0  # for MFU; 0 = known accelerator table or measured (CPU)

  c.rtd = rtd_block()
  add_parallelism(c)
  return c


def rtd_block() -> ml_collections.ConfigDict:
  """Replaced-token detection (train.objective=rtd); google-research/electra's names and
  defaults (configure_pretraining.py) unless said."""
  r = ml_collections.ConfigDict()
  r.generator_hidden_fraction = 0.25  # generator width / discriminator's (base: 1/3)
  r.generator_layers_fraction = 1.0  # generator depth / discriminator's
  r.disc_weight = 50.0  # loss = generator MLM + disc_weight x discriminator BCE
  # tied: one set of embeddings both networks train (ELECTRA) | gdes: the discriminator's are
  # stop_gradient(generator's) + its own residual from zero (DeBERTa-v3)
  r.embedding_sharing = 'tied'
  # A generator to continue from (an ElectraForMaskedLM directory, or the generator of a
  # released pair) while train.init_from names the discriminator; '' = fresh generator
  r.generator_init_from = ''
  return r


# ------------------------------------------------------------ blocks both config families use


def model_block() -> ml_collections.ConfigDict:
  """How the encoder runs (not its shape, which pre-training sets and a start point brings)."""
  m = ml_collections.ConfigDict()
  m.dtype = 'float32'  # compute dtype: float32 | bfloat16 (params stay float32)
  m.hidden_dropout = 0.1
  m.attention_dropout = 0.1  # 0 lets accelerators use fused (flash) attention in training
  m.scan_layers = True  # compile time flat in depth (pods); unrolled is faster on GPUs
  m.remat_policy = 'none'  # none | full | dots | dots_no_batch | projections (encoder.py)
  # xla | splash (TPU) | cudnn (GPU) | auto: splash on TPU, cudnn on GPU, xla elsewhere (CPU
  # runs are unchanged); calls a kernel cannot run (attention dropout in training) use xla
  m.attention_impl = ml_collections.FieldReference('auto', field_type=str)  # or None: jax picks
  return m


def optimizer_block(**defaults) -> ml_collections.ConfigDict:
  """The optimizer and its schedule (bert_jax/training/optim.py); `defaults` set the family's."""
  o = ml_collections.ConfigDict()
  # adamw_bert (the paper's code) | adamw | lamb (apex FusedLAMB) | stable_adamw (ModernBERT's
  # optimi StableAdamW: per-tensor update clipping, decay scaled by lr / learning_rate)
  o.name = 'adamw_bert'
  o.learning_rate = 1e-4  # peak
  # bert (reference) | warmup_linear | constant | poly_warmup | wsd (warmup, constant, decay)
  o.schedule = 'bert'
  o.warmup_steps = 10_000
  o.warmup_proportion = 0.0  # > 0: warmup = this x the run's steps (NVIDIA's flag)
  o.decay_proportion = 0.1  # wsd: the last share of the run spent decaying (ModernBERT t_decay)
  o.decay_shape = 'linear'  # wsd: linear | 1-sqrt (lr = peak (1 - sqrt(progress)))
  o.final_lr_ratio = 0.0  # wsd: lr at the end of the decay / learning_rate (ModernBERT alpha_f)
  o.weight_decay = 0.01  # not on biases and norms
  o.b1 = 0.9
  o.b2 = 0.999
  o.eps = 1e-6
  o.clip_norm = 1.0  # 0 disables (stable_adamw clips its own updates: ModernBERT uses 0)
  o.fuse_qkv_rms = False  # stable_adamw: one clip over a layer's q, k, v (ModernBERT's Wqkv)
  o.update(defaults)
  return o


def train_block(*, global_batch_size: int, log_every: int) -> ml_collections.ConfigDict:
  """The fields every run's train block has; each family adds its own (steps or epochs)."""
  t = ml_collections.ConfigDict()
  t.global_batch_size = global_batch_size  # over all processes and devices
  t.log_every = log_every  # steps between metrics.jsonl / TensorBoard lines
  return t


def add_parallelism(c: ml_collections.ConfigDict) -> None:
  c.mesh = (-1, 1, 1)  # (data, fsdp, tensor); -1 = the remaining devices
  # ((logical axis, mesh axes), ...); empty: bert_jax/training/sharding.py's DEFAULT_RULES
  c.sharding_rules = ()


def tpu_preset(c: ml_collections.ConfigDict, remat_policy: str = 'none',
               mlm_loss_chunk: int = 0) -> None:
  """A TPU preset's compute: bfloat16 matmuls (the MXU's rate; parameters, softmax, LayerNorm
  statistics and logits stay float32), with the remat policy and MLM loss chunk that
  `python -m bert_jax.aot --fit` picks for the preset's rows on its chip.
  `--config.model.dtype=float32` is the exact CPU run."""
  c.model.dtype = 'bfloat16'
  c.model.remat_policy = remat_policy
  c.model.mlm_loss_chunk = mlm_loss_chunk


def set_phase(c: ml_collections.ConfigDict, phase: str, steps1: int, steps2: int) -> None:
  if phase in ('', 'phase1'):
    c.train.num_steps = steps1
  elif phase == 'phase2':
    c.data.max_seq_length = 512
    c.data.max_predictions_per_seq = 80
    c.train.num_steps = steps2
  else:
    raise ValueError(f'unknown phase {phase!r}: use :phase1 or :phase2')


def override(c: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
  """Set dotted fields ('train.num_steps': 10) as `--config.train.num_steps=10` would; a
  misspelt field is a KeyError, as on the command line."""
  for key, value in values.items():
    *parents, leaf = key.split('.')
    node = c
    for part in parents:
      node = node[part]
    node[leaf] = value
  return c
