#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite in two pytest sessions at once: the tests marked
# multi_device (meshes of several devices) in one worker on 8 emulated CPU devices, and the rest
# in two workers on one device each (tests/conftest.py says why), each worker taking the next
# test module when it is free (so that a module's shared fixtures, a trained workdir, a pod's
# runs, a libtpu process, are built once). Side by side, the 8-device worker fills what the
# other session's workers leave idle (their start, a last long module), which one session after
# the other left empty. Both with XLA's CPU buffers kept mapped between steps
# (bert_jax/training/host_malloc.py) as the CLIs run, and the test processes' XLA settings
# (tests/cpu_env.py). The 8-device session's output follows the other's. Exits non-zero if
# either fails; arguments go to both.
# From a clean clone with an empty compilation cache on an idle 2-core AVX-512 VM: 48.1
# minutes of pytest for 717 tests (2026-11-27), then 31.1 for 716 (57 CPU-minutes), 24.4 for
# 715 (45 CPU-minutes) and, one session after the other, 2.3 + 18.9 = 21.2 for 716 (38
# CPU-minutes; all 2026-11-28). The target is 15. The slowest are the pod, GCS, resume and
# ModernBERT end-to-end runs and the TPU AOT compiles (`--durations=30`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --with-beam
session() {  # WORKERS DEVICES MARKER FILES... -- PYTEST_ARGS...
  local workers=$1 devices=$2 marker=$3 files=()
  shift 3
  while [[ $1 != -- ]]; do files+=("$1"); shift; done
  shift
  BERT_JAX_TEST_DEVICES=$devices .venv/bin/python -m bert_jax.training.host_malloc \
    .venv/bin/python -m pytest -n "$workers" --dist loadfile -q -m "$marker" "${files[@]}" "$@"
}
status=0
record() {  # a session's exit status 5: the arguments select none of its tests
  (($1 == 0 || $1 == 5)) || status=$1
}
multi_log=$(mktemp)
# The 8-device session collects only the modules that mark a test (collecting all imports
# torch, transformers and every test module in each worker).
session 1 8 'multi_device' $(grep -l 'mark.multi_device' tests/test_*.py) -- "$@" \
  >"$multi_log" 2>&1 &
multi=$!
rc=0
session 2 1 'not multi_device' tests -- "$@" || rc=$?
record $rc
rc=0
wait $multi || rc=$?
echo "--- the multi_device session (8 devices):"
cat "$multi_log"
rm -f "$multi_log"
record $rc
exit $status
