r"""BERT-large (L24 H1024 A16, 335M parameters) as in the paper, or NVIDIA's LAMB recipe.

Hardware: TPU v4-64 (paper: 64 TPU chips, 4 days). Same two phases as bert_base.py.

  python -m bert_jax.main --config=configs/bert_large.py:phase2 --workdir=... \
    --config.train.init_from=<phase1 workdir>

`:lamb_phase1` / `:lamb_phase2` are NVIDIA's large-batch recipe (NVIDIA DeepLearningExamples,
PyTorch/LanguageModeling/BERT), choice by choice:

- optimizer apex `FusedLAMB` (run_pretraining.py `prepare_model_and_optimizer`), built with
  only `lr` given, so apex/optimizers/fused_lamb.py's defaults hold: betas (0.9, 0.999),
  eps 1e-6, bias correction on, decoupled decay (`adam_w_mode=True`), `max_grad_norm=1.0`
  (global-norm clipping before the moments), `use_nvlamb=False` (no trust ratio where weight
  decay is 0); one trust ratio per tensor (csrc/multi_tensor_lamb.cu). See training/optim.py;
- weight decay 0.01, and 0 for names containing 'bias', 'gamma', 'beta' or 'LayerNorm'
  (run_pretraining.py `no_decay`): our `optim.decay_mask` (biases, LayerNorm scale and bias);
- schedule `PolyWarmUpScheduler` (schedulers.py; degree 0.5) with `--warmup_proportion`
  0.2843 (phase 1) and 0.128 (phase 2), i.e. 2000.9 and 200.06 steps: `poly_warmup`;
- steps 7,038 and 1,563, lr 6e-3 and 4e-3, global batch 65,536 (8 GPUs x 8,192) and 32,768
  (8 x 4,096), sequence length 128 / 20 predictions then 512 / 80
  (scripts/run_pretraining.sh defaults);
- phase 2 starts from phase 1's last checkpoint with its optimizer moments and the step count
  reset to 0, so bias correction and the schedule restart (run_pretraining.py with
  --phase2 --resume_from_checkpoint: `global_step -= args.phase1_end_step`, every optimizer
  'step' set to it before `optimizer.load_state_dict`): `train.init_opt_state_from=True`.

  python -m bert_jax.main --config=configs/bert_large.py:lamb_phase1 --workdir=<p1> \
    --config.train.accum_steps=<fit the batch>
  python -m bert_jax.main --config=configs/bert_large.py:lamb_phase2 --workdir=<p2> \
    --config.train.init_from=<p1> --config.train.accum_steps=<fit the batch>

Expected: MLM accuracy >= 0.720 on held-out 512-token Wikipedia (MLPerf's quality target).
"""

from configs import common

# (global batch, learning rate, warmup proportion, steps) of scripts/run_pretraining.sh.
NVIDIA_LAMB = {'phase1': (65_536, 6e-3, 0.2843, 7_038), 'phase2': (32_768, 4e-3, 0.128, 1_563)}


def get_config(phase: str = 'phase1'):
  c = common.base_config()
  c.model.size = 'large'
  # The paper's phases: 8 rows a v4 chip (256 over a v4-64's 32): no remat, whole loss.
  common.tpu_preset(c)
  if phase.startswith('lamb_'):
    phase = phase[len('lamb_'):]
    common.set_phase(c, phase, steps1=NVIDIA_LAMB['phase1'][3], steps2=NVIDIA_LAMB['phase2'][3])
    batch, lr, warmup, _ = NVIDIA_LAMB[phase]
    c.train.global_batch_size, c.optimizer.learning_rate = batch, lr
    c.optimizer.name, c.optimizer.schedule = 'lamb', 'poly_warmup'
    c.optimizer.warmup_proportion, c.optimizer.warmup_steps = warmup, 0
    c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.999, 1e-6
    c.optimizer.weight_decay, c.optimizer.clip_norm = 0.01, 1.0
    c.train.init_opt_state_from = phase == 'phase2'
    return c
  common.set_phase(c, phase, steps1=900_000, steps2=100_000)
  return c
