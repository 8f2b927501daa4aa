#!/usr/bin/env bash
# Run bert_jax.main on every worker of a Cloud TPU VM slice.
#
#   launch/tpu_pod.sh --tpu NAME --accelerator v4-64 --zone us-central2-b [--project P] \
#       [--spot] [--queued] [--version tpu-ubuntu2204-base] [--keep] [--dry-run] \
#       -- --config=configs/bert_base.py:phase1 --workdir=gs://BUCKET/base_p1 \
#          --config.data.train_files='gs://BUCKET/wiki128/train-*' --config.data.vocab_file=gs://BUCKET/vocab.txt
#
# Creates the slice (or reuses it if it exists; --queued goes through a queued resource and
# waits until it is ACTIVE), copies this checkout to every worker, runs launch/setup_worker.sh
# there (a Python >= 3.11 venv with requirements.txt and jax[tpu], on images that ship 3.10),
# starts the same command on all workers through launch/run_worker.sh (--worker=all; JAX's
# distributed runtime finds its peers by itself on TPU; each worker's log lands in
# WORKDIR/logs/), streams the logs, then deletes the slice unless --keep. --dry-run prints
# every gcloud command instead of running it.
# Phase 2: run again with --config=configs/bert_base.py:phase2, a new --workdir and
# --config.train.init_from=gs://BUCKET/base_p1. A preempted run resumes by running the same
# command again (checkpoints and data positions live in the gs:// workdir).
set -euo pipefail
cd "$(dirname "$0")/.."

tpu="" accelerator="" zone="" project="" version="tpu-ubuntu2204-base" spot=0 queued=0
keep=0 dry=0
usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tpu) tpu=$2; shift 2 ;;
    --accelerator) accelerator=$2; shift 2 ;;
    --zone) zone=$2; shift 2 ;;
    --project) project=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --spot) spot=1; shift ;;
    --queued) queued=1; shift ;;
    --keep) keep=1; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    *) echo "$0: unknown option $1" >&2; usage ;;
  esac
done
[ -n "$tpu" ] && [ -n "$accelerator" ] && [ -n "$zone" ] || { echo "$0: --tpu, --accelerator and --zone are required" >&2; usage; }
[ $# -gt 0 ] || { echo "$0: give the bert_jax.main flags after --" >&2; usage; }
printf '%s\n' "$@" | grep -q '^--workdir=gs://' || echo "warning: --workdir is not on gs://; workers will not share checkpoints" >&2

common=(--zone="$zone")
[ -n "$project" ] && common+=(--project="$project")
main_flags=$(printf '%q ' "$@")

run() {  # run or (with --dry-run) print a command
  if [ $dry = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

# 1. The slice.
if [ $dry = 0 ] && gcloud compute tpus tpu-vm describe "$tpu" "${common[@]}" >/dev/null 2>&1; then
  echo "reusing TPU VM $tpu"
elif [ $queued = 1 ]; then
  extra=(); [ $spot = 1 ] && extra+=(--spot)
  run gcloud compute tpus queued-resources create "$tpu-qr" --node-id="$tpu" \
    --accelerator-type="$accelerator" --runtime-version="$version" "${common[@]}" "${extra[@]}"
  if [ $dry = 0 ]; then
    until gcloud compute tpus queued-resources describe "$tpu-qr" "${common[@]}" \
        --format='value(state.state)' | grep -q ACTIVE; do sleep 30; done
  else
    echo "+ (wait until queued resource $tpu-qr is ACTIVE)"
  fi
else
  extra=(); [ $spot = 1 ] && extra+=(--spot)
  run gcloud compute tpus tpu-vm create "$tpu" --accelerator-type="$accelerator" \
    --version="$version" "${common[@]}" "${extra[@]}"
fi

# 2. Code and requirements on every worker.
archive=$(mktemp -t bert_jax.XXXXXX.tgz)
trap 'rm -f "$archive"' EXIT
run git archive --format=tar.gz -o "$archive" HEAD
run gcloud compute tpus tpu-vm scp "$archive" "$tpu:bert_jax.tgz" --worker=all "${common[@]}"
run gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" --command="\
rm -rf bert_jax && mkdir bert_jax && tar xzf bert_jax.tgz -C bert_jax && cd bert_jax && \
bash launch/setup_worker.sh"

# 3. Train on all workers; logs stream back (worker 0 prints the progress bar and metrics) and
# every worker's log is kept in WORKDIR/logs/<hostname>.log.
status=0
run gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" --command="\
cd bert_jax && bash launch/run_worker.sh --tpu $main_flags" || status=$?

# 4. Clean up.
if [ $keep = 0 ]; then
  if [ $queued = 1 ]; then
    run gcloud compute tpus queued-resources delete "$tpu-qr" "${common[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$tpu" "${common[@]}" --quiet
  fi
fi
exit $status
