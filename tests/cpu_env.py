"""XLA's settings for every process the suite runs: the pytest workers (tests/conftest.py)
and each CLI, pod or script a test starts (`cpu_env`); and a free port for the coordinator of
the processes a test starts together (`free_port`).

XLA's CPU compiler at its default LLVM optimisation (2) spends ~13 s of CPU on a tiny BERT's
train step and ~6 s on its initialiser; at level 1, ~10 s and ~4 s, and the step runs as fast
(level 0 compiles faster still but runs a step 2.5-3.5x slower, a loss for the 40-step
runs). The suite compiles such steps hundreds of times, and every test compares runs made
under the same settings (or against transformers to float32 round-off), so nothing a test
asserts depends on the level. And one thread per XLA computation: the suite keeps both cores
busy with its two workers, so Eigen's intra-op threads only wait on each other (test_train and
test_finetune under `pytest -n 2`: 8% less CPU and wall time single-threaded, 25% with one
device as well; tests/conftest.py). Users' runs keep XLA's defaults."""

import os
import socket

MULTIHOST_CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'multihost_cache')
SUITE_XLA_FLAGS = '--xla_backend_optimization_level=1 --xla_cpu_multi_thread_eigen=false'


def xla_flags(devices: int = 1) -> str:
  """XLA_FLAGS of a test process with `devices` emulated CPU devices."""
  return f'{SUITE_XLA_FLAGS} --xla_force_host_platform_device_count={devices}'


def cpu_env(devices: int = 1, base: dict | None = None, **extra: str) -> dict:
  """The environment of a CPU process a test starts: `base` (default os.environ) with CPU
  only, `devices` emulated devices, the fast compile, and `extra` (a PYTHONPATH in it keeps
  the multihost cache hook in front)."""
  env = dict(base if base is not None else os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=xla_flags(devices), **extra)
  env['PYTHONPATH'] = with_multihost_cache(env.get('PYTHONPATH'))
  return env


def with_multihost_cache(pythonpath: str | None) -> str:
  """`pythonpath` with tests/multihost_cache (its sitecustomize says why) in front, once."""
  paths = [p for p in (pythonpath or '').split(os.pathsep) if p and p != MULTIHOST_CACHE]
  return os.pathsep.join([MULTIHOST_CACHE, *paths])


def free_port() -> int:
  """A localhost port nothing listens on: xdist may run two multi-process tests at once."""
  with socket.socket() as sock:
    sock.bind(('localhost', 0))
    return sock.getsockname()[1]
