"""Model FLOPs of a train step and the device peak they are compared against (MFU).

FLOPs = 6·N·T + 12·L·H·S·T + 6·B·P·(H² + H·V) + 6·B·(H² + 2H), with T = B·S tokens,
N = encoder (non-embedding) parameters, P = MLM positions actually computed: the definition of
the performance issue, counting only useful work (the MLM head at the labelled positions).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from bert_jax.model.encoder import BertConfig

# Dense peak FLOP/s per device for MFU, by device_kind substring (bf16 where the chip has it).
KNOWN_PEAKS = {'H100': 989e12, 'H200': 989e12, 'A100': 312e12, 'TPU v4': 275e12,
               'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12, 'TPU v6': 918e12}


def encoder_params(cfg: BertConfig) -> int:
  h, i = cfg.hidden_size, cfg.intermediate_size
  per_layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h
  return cfg.num_layers * per_layer


def train_flops_per_step(cfg: BertConfig, batch: int, seq_len: int, predictions: int) -> float:
  h, v, l = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
  tokens = batch * seq_len
  return (6 * encoder_params(cfg) * tokens + 12 * l * h * seq_len * tokens +
          6 * batch * predictions * (h * h + h * v) + 6 * batch * (h * h + 2 * h))


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
