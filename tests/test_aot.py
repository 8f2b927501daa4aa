"""Ahead-of-time compilation for a TPU topology (skipped where libtpu is not installed)."""

import importlib.util
import os

import pytest

from bert_jax import aot
from configs import bert_tiny

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                                  reason="libtpu absent: pip install 'jax[tpu]' to run")


@needs_libtpu
def test_tiny_compiles_for_a_small_v4_slice_and_fits():
  os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
  devices = aot.topology_devices('v4:2x2x1')
  config = bert_tiny.get_config()
  config.mesh = (-1, 1, 1)
  result = aot.compile_for(config, devices)
  assert result['device_kind'].startswith('TPU v4') and result['chips'] == 4
  assert result['fits'] and 0 < result['per_chip_gib'] < 1


def test_hbm_table():
  assert aot.hbm_bytes('TPU v5 lite') == 16 << 30
  assert aot.hbm_bytes('TPU v4') == 32 << 30
  assert aot.hbm_bytes('cpu') is None
