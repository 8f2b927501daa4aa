#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite in two sessions of 2 workers, each taking the
# next test module when it is free (so that a module's shared fixtures, a trained workdir, a
# pod's runs, a libtpu process, are built once, not once per worker): the tests marked
# multi_device (meshes of several devices) on 8 emulated CPU devices, then the rest on one
# (tests/conftest.py says why). Both with XLA's CPU buffers kept mapped between steps
# (bert_jax/training/host_malloc.py) as the CLIs run, and the test processes' XLA settings
# (tests/cpu_env.py). Exits non-zero if either session fails; arguments go to both.
# From a clean clone with an empty compilation cache on an idle 2-core AVX-512 VM (2026-11-28):
# 2.5 + 18.9 = 21.5 minutes for 725 tests, 39 CPU-minutes, two thirds of them JAX tracing and
# XLA compiling ~2,000 distinct programs (the VM's speed moves +-15% between such runs). The
# target is 15 and not met. The slowest are the TPU AOT compiles and the pod, GCS, resume and
# ModernBERT end-to-end runs (`--durations=30`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --with-beam
session() {  # DEVICES MARKER FILES... -- PYTEST_ARGS...
  local devices=$1 marker=$2 files=()
  shift 2
  while [[ $1 != -- ]]; do files+=("$1"); shift; done
  shift
  BERT_JAX_TEST_DEVICES=$devices .venv/bin/python -m bert_jax.training.host_malloc \
    .venv/bin/python -m pytest -n 2 --dist loadfile -q -m "$marker" "${files[@]}" "$@"
}
status=0
both() {  # a session's exit status 5: the arguments select none of its tests
  local rc=0
  session "$@" || rc=$?
  ((rc == 0 || rc == 5)) || status=$rc
}
# The 8-device session collects only the modules that mark a test (collecting all imports
# torch, transformers and every test module in each worker).
both 8 'multi_device' $(grep -l 'mark.multi_device' tests/test_*.py) -- "$@"
both 1 'not multi_device' tests -- "$@"
exit $status
