#!/usr/bin/env bash
# Run bert_jax.main on this worker so that it needs nobody to read its output, and keep its log
# in the workdir, which on a pod is shared storage (gs://). Run from the checkout's root, after
# setup_worker.sh:
#
#   bash launch/run_worker.sh --detach --tpu --config=configs/bert_base.py:phase1 \
#       --workdir=gs://B/p1 ...                  # start the run, return
#   bash launch/run_worker.sh --follow [LINES]   # print the log (from line 1, or its last LINES)
#                                                # until the run ends, then its exit status
#   bash launch/run_worker.sh --status           # running, finished (exit status) or no run
#   bash launch/run_worker.sh --stop [--follow]  # SIGTERM: every process saves one agreed step,
#                                                # exits 0 (--follow: print that, as --follow)
#   bash launch/run_worker.sh --tpu --config=... --workdir=...   # the run itself, in the foreground
#
# --detach starts the run in its own session (setsid nohup, stdin from /dev/null, output to a
# file) and returns: a dropped ssh connection, a closed terminal or a killed launcher does not
# reach it. bert_jax.main writes to RUN_DIR/log, never to a pipe, so no reader can make a write
# fail (MaxText's multihost_job.py runs its job from a startup script, logging to a file, for
# the same reason); the log is copied to WORKDIR/logs/<hostname>.<UTC start>.log (e.g.
# t1v-n-0-w-0.20260102T030405Z.log) every LOG_EVERY seconds and at the end, so every worker's
# log survives the worker, and each attempt's under its own name: a rerun on a reused slice
# (a resume after --stop, a crash) starts a new file rather than overwriting the log of the
# attempt before, which may be what tells why that one ended. The names sort by start time;
# the log's first line names its copy. --follow and --status read RUN_DIR/log, this
# attempt's. RUN_DIR also holds job.pid (this script), pid (bert_jax.main, what --stop
# signals), args (the run's arguments, NUL-separated) and, once the run has ended,
# exit_status. --detach while a run with the same arguments is going says so and exits 0:
# gcloud reruns the command on a worker whose ssh connection failed (exit 255), and that
# second --detach must not fail the launch. Other arguments: exit 3.
# A foreground run prints its log as it goes (a reader that goes away stops only the printing)
# and turns Ctrl-C into the same agreed stop as --stop.
#
# Env: PYTHON (.venv/bin/python), RUN_DIR (~/bert_jax_run; launch/tpu_pod.sh looks there
# too), LOG_EVERY (60 seconds).
set -uo pipefail
py=${PYTHON:-.venv/bin/python}
run_dir=${RUN_DIR:-$HOME/bert_jax_run}
log=$run_dir/log
host=$(hostname)

alive() {  # alive PID NAME: PID is a live process whose command line mentions NAME
  [ -n "$1" ] && grep -aqs -- "$2" "/proc/$1/cmdline"
}
running() {  # a run started here has not ended
  [ ! -e "$run_dir/exit_status" ] && alive "$(cat "$run_dir/job.pid" 2>/dev/null)" run_worker.sh
}
workdir_of() {  # the --workdir flag's value, or an error
  local w; w=$(printf '%s\n' "$@" | sed -n 's/^--workdir=//p' | tail -1)
  [ -n "$w" ] || { echo "$0: --workdir=... is required" >&2; return 2; }
  echo "$w"
}
report_end() {  # the line launch/tpu_pod.sh counts; returns the run's exit status
  if [ -e "$run_dir/exit_status" ]; then
    local status; status=$(cat "$run_dir/exit_status")
    echo "run_worker.sh: $host: finished, exit status $status"
    return "$status"
  fi
  echo "run_worker.sh: $host: ended without an exit status (killed, or the worker restarted)"
  return 4
}

follow() {  # follow TAIL_START: print the log from there until the run ends, then how it ended
  [ -e "$run_dir/job.pid" ] || { echo "run_worker.sh: $host: no run here"; return 3; }
  if running; then  # --pid: tail ends (after printing the rest) when this script's run does
    tail "$@" -F --pid="$(cat "$run_dir/job.pid")" "$log" 2>/dev/null
  else
    tail "$@" "$log" 2>/dev/null
  fi
  report_end
}

case "${1:-}" in
  --follow)
    follow -n "${2:-+1}"; exit ;;
  --status)
    if running; then
      echo "run_worker.sh: $host: running since $(date -r "$run_dir/job.pid" '+%F %T %Z')" \
        "(pid $(cat "$run_dir/pid" 2>/dev/null)); last line: $(tail -n 1 "$log")"
    elif [ -e "$run_dir/job.pid" ]; then
      report_end
    else
      echo "run_worker.sh: $host: no run here"
    fi
    exit 0 ;;
  --stop)  # --stop --follow: then print what the run writes from then on, until it ends
    pid=$(cat "$run_dir/pid" 2>/dev/null)
    if running && alive "$pid" bert_jax; then
      size=$(stat -c %s "$log")
      kill -TERM "$pid"
      echo "run_worker.sh: $host: sent SIGTERM to bert_jax.main (pid $pid); it saves a step" \
        "and exits"
      [ "${2:-}" = --follow ] && { follow -c "+$((size + 1))"; exit; }
    else
      echo "run_worker.sh: $host: no run going"
      [ "${2:-}" = --follow ] && { follow -n 0; exit; }
    fi
    exit 0 ;;
  --detach)
    shift
    workdir_of "$@" > /dev/null || exit
    if running; then
      if printf '%s\0' "$@" | cmp -s - "$run_dir/args"; then
        echo "run_worker.sh: $host: the same run is already going (pid" \
          "$(cat "$run_dir/pid" 2>/dev/null)), log $log; nothing to start"
        exit 0
      fi
      echo "run_worker.sh: $host: a run is still going (pid $(cat "$run_dir/pid" 2>/dev/null))" \
        "with other arguments; follow it with --follow or stop it with --stop" >&2
      exit 3
    fi
    mkdir -p "$run_dir" &&
      rm -f "$run_dir/job.pid" "$run_dir/pid" "$run_dir/args" "$run_dir/exit_status" &&
      : > "$log" || exit 1
    RUN_WORKER_DETACHED=1 setsid nohup bash "$0" "$@" >> "$log" 2>&1 < /dev/null &
    job=$!
    for _ in $(seq 300); do
      [ -e "$run_dir/pid" ] || ! kill -0 $job 2>/dev/null && break
      sleep 0.1
    done
    [ -e "$run_dir/pid" ] ||
      { echo "run_worker.sh: $host: the run did not start; see $log" >&2; exit 1; }
    echo "run_worker.sh: $host: started bert_jax.main (pid $(cat "$run_dir/pid")), log $log"
    exit 0 ;;
esac

# The run itself.
workdir=$(workdir_of "$@") || exit
if [ -z "${RUN_WORKER_DETACHED:-}" ]; then
  running && { echo "$0: a run is still going here; see --status" >&2; exit 3; }
  mkdir -p "$run_dir" && rm -f "$run_dir/pid" "$run_dir/exit_status" && : > "$log" || exit 1
fi
# args before job.pid: whoever sees this run going can read what it runs.
printf '%s\0' "$@" > "$run_dir/args"
echo $$ > "$run_dir/job.pid"
# From here on this script writes only to the log: with nobody reading its stdout it must
# still live to record the exit status.
trap '' PIPE
target="${workdir%/}/logs/$host.$(date -u +%Y%m%dT%H%M%SZ).log"
echo "run_worker.sh: $host: this attempt's log is copied to $target" >> "$log"
copy() {
  "$py" -m input_pipeline.fs cp "$log" "$target" >> "$log" 2>&1 ||
    echo "$0: could not copy the log to $target" >> "$log"
}
# The loop's sleep runs in the background so that stopping the loop stops it too.
( trap 'kill $sleeper 2>/dev/null; exit 0' TERM
  while true; do sleep "${LOG_EVERY:-60}" & sleeper=$!; wait $sleeper; copy; done ) &
uploader=$!
# SIGTERM is bert_jax.main's to handle (an agreed save); this script outlives it to record the
# exit status. Ctrl-C on a foreground run asks for the same stop.
trap ':' TERM
trap 'kill -TERM "$train" 2>/dev/null' INT
"$py" -m bert_jax.main "$@" >> "$log" 2>&1 < /dev/null &
train=$!
echo "$train" > "$run_dir/pid"
printer=
if [ -z "${RUN_WORKER_DETACHED:-}" ]; then
  tail -n +1 -F --pid="$train" "$log" 2>/dev/null &
  printer=$!
fi
# A trapped signal ends `wait` early; wait again until the process has really ended.
while true; do wait "$train"; status=$?; kill -0 "$train" 2>/dev/null || break; done
kill "$uploader" 2>/dev/null
copy
[ -n "$printer" ] && wait "$printer"
echo "$status" > "$run_dir/exit_status.tmp" && mv "$run_dir/exit_status.tmp" "$run_dir/exit_status"
exit "$status"
