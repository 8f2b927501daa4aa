#!/usr/bin/env bash
# Rehearse a multi-host pod on one machine: N CPU processes on localhost, each with
# DEVICES emulated devices, all running the same bert_jax.main (or MODULE) command.
#
#   launch/local_pod.sh 2 --config=configs/bert_tiny.py --workdir=/tmp/pod \
#       --config.data.train_files='data/train-*'
#   MODULE=bert_jax.finetune launch/local_pod.sh 2 --config=configs/finetune.py:mrpc \
#       --init=/tmp/pod --workdir=/tmp/mrpc --config.data.glue_dir=glue_data/MRPC
#
# Env: DEVICES (per process, default 4), PORT (coordinator, default 12355), PYTHON, MODULE
# (bert_jax.main or bert_jax.finetune, default bert_jax.main); your XLA_FLAGS are kept, with
# the device count appended (the last of a repeated XLA flag wins).
# Process 0 prints to the console; every process logs to WORKDIR/logs/process_<i>.log (a gs://
# WORKDIR gets them when the processes end).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: [MODULE=bert_jax.finetune] $0 NUM_PROCESSES [the module's flags...]" >&2
  exit 2
fi
num=$1; shift
devices=${DEVICES:-4}
port=${PORT:-12355}
py=${PYTHON:-.venv/bin/python}
module=${MODULE:-bert_jax.main}
case "$module" in
  bert_jax.main|bert_jax.finetune) ;;
  *) echo "$0: MODULE=$module: expected bert_jax.main or bert_jax.finetune" >&2; exit 2 ;;
esac
workdir=$(printf '%s\n' "$@" | sed -n 's/^--workdir=//p' | tail -1)
[ -n "$workdir" ] || { echo "$0: --workdir=... is required" >&2; exit 2; }
case "$workdir" in
  *://*) logs=$(mktemp -d -t bert_jax_pod_logs.XXXXXX) ;;  # copied to WORKDIR/logs at the end
  *) logs="$workdir/logs"; mkdir -p "$logs" ;;
esac
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup INT TERM
for ((i = num - 1; i >= 0; i--)); do
  env XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=$devices" JAX_PLATFORMS=cpu \
    JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo \
    "$py" -m "$module" "$@" --coordinator_address="localhost:$port" \
    --num_processes="$num" --process_id="$i" > "$logs/process_$i.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
if [ "$logs" != "$workdir/logs" ]; then
  for ((i = 0; i < num; i++)); do
    "$py" -m input_pipeline.fs cp "$logs/process_$i.log" "$workdir/logs/process_$i.log" || true
  done
fi
cat "$logs/process_0.log"
exit $status
