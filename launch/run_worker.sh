#!/usr/bin/env bash
# Run bert_jax.main on this worker and keep its log in the workdir, which on a pod is shared
# storage (gs://): WORKDIR/logs/<hostname>.log, copied every minute and at the end, so the log
# of every worker survives the worker. Run from the checkout's root, after setup_worker.sh:
#
#   bash launch/run_worker.sh --tpu --config=configs/bert_base.py:phase1 --workdir=gs://B/p1 ...
#
# Exits with bert_jax.main's status. Env: PYTHON (.venv/bin/python), LOG_EVERY (60 seconds).
set -uo pipefail
py=${PYTHON:-.venv/bin/python}
workdir=$(printf '%s\n' "$@" | sed -n 's/^--workdir=//p' | tail -1)
[ -n "$workdir" ] || { echo "$0: --workdir=... is required" >&2; exit 2; }
log=$(mktemp -t bert_jax_worker.XXXXXX.log)
target="${workdir%/}/logs/$(hostname).log"
copy() { "$py" -m input_pipeline.fs cp "$log" "$target" || echo "$0: could not copy the log to $target" >&2; }
# The loop's sleep runs in the background so that stopping the loop stops it too: an orphaned
# sleep would hold this script's output open (and ssh with it) for up to LOG_EVERY seconds.
( trap 'kill $sleeper 2>/dev/null; exit 0' TERM
  while true; do sleep "${LOG_EVERY:-60}" & sleeper=$!; wait $sleeper; copy; done ) &
uploader=$!
"$py" -m bert_jax.main "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
kill "$uploader" 2>/dev/null
copy
exit "$status"
