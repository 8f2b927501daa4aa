#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite (2 workers that steal each other's queued tests,
# so neither finishes alone with the slow end-to-end ones), with XLA's CPU buffers kept mapped
# between steps (bert_jax/training/host_malloc.py) as the CLIs run. On 2 cores from an empty
# compilation cache it took ~25 minutes before the tests shared their model inits and trained
# workdirs (2026-11-27); the target is under 15, not yet re-timed whole on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --with-beam
exec .venv/bin/python -m bert_jax.training.host_malloc .venv/bin/python -m pytest -n 2 \
  --dist worksteal -q tests "$@"
