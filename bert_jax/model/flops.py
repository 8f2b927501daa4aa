"""Model FLOPs of a train step and the device peak they are compared against (MFU).

FLOPs = 6·N·T + 12·H·T·Σ_layers span + 6·B·P·(H² + H·V) [+ 6·B·(H² + 2H)], with T = B·S
tokens, N = encoder (non-embedding) parameters, span = S in global layers and min(S, window + 1)
in local ones, P = MLM positions actually computed, and the last term the pooler and NSP head
of a family with a sentence head (BERT): the definition of the performance issue, counting
only useful work (the MLM head at the labelled positions, the keys a local layer may see).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from bert_jax.model import attention
from bert_jax.model.encoder import BertConfig

# Dense peak FLOP/s per device for MFU, by device_kind substring (bf16 where the chip has it).
KNOWN_PEAKS = {'H100': 989e12, 'H200': 989e12, 'A100': 312e12, 'TPU v4': 275e12,
               'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12, 'TPU v6': 918e12}


def encoder_params(cfg: BertConfig) -> int:
  h, i = cfg.hidden_size, cfg.intermediate_size
  bias = 1 if cfg.use_bias else 0
  attention = 4 * h * h + bias * 4 * h
  mlp = (3 * h * i + bias * (2 * i + h) if cfg.mlp == 'glu'
         else 2 * h * i + bias * (i + h))
  norms = 2 * h * (1 + bias)
  return cfg.num_layers * (attention + mlp + norms)


def attention_span(cfg: BertConfig, layer: int, seq_len: int, computed: bool = False) -> int:
  """Keys one query may attend to in `layer`; `computed`: the keys the xla core scores for
  it (attention.py: a dense band below MIN_CHUNKS chunks, else each chunk of window/2
  queries against its three neighbouring key chunks, 3 * window/2 keys)."""
  if cfg.global_attention_every == 1 or cfg.is_global(layer):
    return seq_len
  if computed:
    half = cfg.half_window
    return seq_len if seq_len < attention.MIN_CHUNKS * half else 3 * half
  return min(seq_len, 2 * cfg.half_window + 1)


def train_flops_per_step(cfg: BertConfig, batch: int, seq_len: int, predictions: int,
                         computed: bool = False) -> float:
  """Useful FLOPs (MFU's numerator); `computed=True` counts the keys the local core scores
  instead, the cost an equal-compute comparison must charge (benchmarks/modern_ablation.py)."""
  h, v = cfg.hidden_size, cfg.vocab_size
  tokens = batch * seq_len
  spans = sum(attention_span(cfg, layer, seq_len, computed) for layer in range(cfg.num_layers))
  sentence_head = 6 * batch * (h * h + 2 * h) if cfg.family.sentence_head else 0
  return (6 * encoder_params(cfg) * tokens + 12 * h * spans * tokens +
          6 * batch * predictions * (h * h + h * v) + sentence_head)


@functools.lru_cache(maxsize=None)
def measured_matmul_peak(n: int = 2048, dtype: str = 'float32', repeats: int = 5) -> float:
  """Best-of-`repeats` FLOP/s of an n×n matmul on device 0, in this process."""
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float('inf')
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best


def peak_flops_per_device() -> float:
  kind = jax.devices()[0].device_kind
  for name, peak in KNOWN_PEAKS.items():
    if name.lower() in kind.lower():
      return peak
  return measured_matmul_peak()


def rtd_train_flops_per_step(generator: BertConfig, discriminator: BertConfig, batch: int,
                             seq_len: int, predictions: int) -> float:
  """Replaced-token detection's useful FLOPs: the generator's MLM step (above) plus the
  discriminator's encoder and its per-token head (dense H x H and H x 1, every token), so an
  equal-compute comparison with MLM charges the generator too (as ELECTRA's paper does)."""
  h, tokens = discriminator.hidden_size, batch * seq_len
  spans = sum(attention_span(discriminator, layer, seq_len)
              for layer in range(discriminator.num_layers))
  return (train_flops_per_step(generator, batch, seq_len, predictions) +
          6 * encoder_params(discriminator) * tokens + 12 * h * spans * tokens +
          6 * tokens * (h * h + h))
