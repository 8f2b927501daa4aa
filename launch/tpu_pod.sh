#!/usr/bin/env bash
# Run bert_jax.main on every worker of a Cloud TPU VM slice, as a run that does not need this
# script, its terminal or its ssh connection to keep going.
#
#   launch/tpu_pod.sh --tpu NAME --accelerator v4-64 --zone us-central2-b [--project P] \
#       [--spot] [--queued] [--version RUNTIME] [--keep] [--dry-run] [--allow-dirty] \
#       -- --config=configs/bert_base.py:phase1 --workdir=gs://BUCKET/base_p1 \
#          --config.data.train_files='gs://BUCKET/wiki128/train-*' --config.data.vocab_file=gs://BUCKET/vocab.txt
#   launch/tpu_pod.sh --tpu NAME --zone us-central2-b [--project P] [--queued] \
#       --status | --logs | --stop
#
# 1. The slice, read from Cloud TPU's states: a READY TPU VM NAME of the --accelerator type is
#    reused (another type is refused); a PREEMPTED, TERMINATED, SUSPENDED or FAILED one, and
#    with --queued a FAILED or SUSPENDED queued resource NAME-qr (what a preempted spot slice
#    leaves), is deleted and re-created; a slice on its way up is waited for. Waits (queued
#    resource until ACTIVE, VM until READY) stop with an error on any state that is not on its
#    way there (FAILED, SUSPENDED, STOPPED, HIDDEN, UNKNOWN, ...). The runtime version
#    follows the accelerator (v2, v3, v4: tpu-ubuntu2204-base; v5litepod/v5e:
#    v2-alpha-tpuv5-lite; v5p: v2-alpha-tpuv5; v6e: v2-alpha-tpuv6e); --version overrides it.
# 2. Copies this checkout's last commit (git archive HEAD, printed as "deploying commit ...")
#    to every worker and runs launch/setup_worker.sh there. Uncommitted changes and untracked
#    files would not reach the workers, so a checkout that has any is refused before anything
#    starts; --allow-dirty deploys HEAD without them (and lists them).
# 3. Starts launch/run_worker.sh --detach on every worker (--worker=all; JAX's distributed
#    runtime finds its peers by itself on TPU): the run lives in its own session there, logging
#    to ~/bert_jax_run/log, copied to WORKDIR/logs/<hostname>.<UTC start>.log (one per
#    attempt). Every worker must report its start; if one does not, the script says so and
#    stops, keeping the slice: the workers that did start wait for their peer (see them with
#    --status, end them with --stop).
# 4. Follows the workers' logs until every run has ended, reports their exit statuses, and
#    then deletes the slice unless --keep. Ctrl-C or a dropped connection stops the following,
#    never the run, and the slice stays. A failed step never deletes the slice.
# --status: the slice's state and each worker's run. --logs: follow the logs again. --stop:
# SIGTERM to every worker's bert_jax.main (all save the same step and exit 0), then follow
# them to their end. Neither deletes the slice. A preempted or stopped run resumes by running
# the first command again (checkpoints and data positions live in the gs:// workdir).
# --dry-run prints the gcloud commands of a start on a fresh slice. Env: POLL_SECONDS (30),
# how often a wait asks for the state.
# Phase 2: run again with --config=configs/bert_base.py:phase2, a new --workdir and
# --config.train.init_from=gs://BUCKET/base_p1.
set -euo pipefail
cd "$(dirname "$0")/.."

tpu="" accelerator="" zone="" project="" version="" spot=0 queued=0 keep=0 dry=0 dirty_ok=0
action=start
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
    --allow-dirty) dirty_ok=1; shift ;;
    --status|--logs|--stop) action=${1#--}; shift ;;
    --) shift; break ;;
    *) echo "$0: unknown option $1" >&2; usage ;;
  esac
done
if [ $action = start ]; then
  [ -n "$tpu" ] && [ -n "$accelerator" ] && [ -n "$zone" ] || { echo "$0: --tpu, --accelerator and --zone are required" >&2; usage; }
  [ $# -gt 0 ] || { echo "$0: give the bert_jax.main flags after --" >&2; usage; }
  printf '%s\n' "$@" | grep -q '^--workdir=gs://' || echo "warning: --workdir is not on gs://; workers will not share checkpoints" >&2
else
  [ -n "$tpu" ] && [ -n "$zone" ] || { echo "$0: --$action needs --tpu and --zone" >&2; usage; }
fi

family_version() {  # the runtime (VM image) each TPU generation boots
  case "$1" in
    v2-*|v3-*|v4-*) echo tpu-ubuntu2204-base ;;
    v5litepod-*|v5e-*) echo v2-alpha-tpuv5-lite ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    *) return 1 ;;
  esac
}
if [ $action = start ] && [ -z "$version" ]; then
  version=$(family_version "$accelerator") || {
    echo "$0: no default runtime version for accelerator $accelerator; pass --version" \
      "(gcloud compute tpus tpu-vm versions list --zone=$zone lists them)" >&2; exit 2; }
fi

qr="$tpu-qr"
common=(--zone="$zone")
[ -n "$project" ] && common+=(--project="$project")
where="--tpu $tpu --zone $zone${project:+ --project $project}"
poll=${POLL_SECONDS:-30}
finished_re='run_worker\.sh: [^ ]+: finished, exit status [0-9]+'
ended_re="$finished_re|run_worker\\.sh: [^ ]+: ended without an exit status"
started_re='run_worker\.sh: [^ ]+: (started bert_jax\.main|the same run is already going)'
errors=$(mktemp)  # a describe's stderr, kept to tell NOT_FOUND from other failures
tmp=("$errors")
trap 'rm -f "${tmp[@]}"' EXIT

run() {  # run or (with --dry-run) print a command
  if [ $dry = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}
die() { echo "$0: $*" >&2; exit 1; }

state_of() {  # state_of node|qr [FIELD]: the state Cloud TPU reports, ABSENT when there is
  local out    # none; with FIELD (a node's), "STATE<tab>FIELD's value" from the same describe
  if [ "$1" = node ]; then
    out=$(gcloud compute tpus tpu-vm describe "$tpu" "${common[@]}" \
      --format="value(state${2:+,$2})" 2>"$errors")
  else
    out=$(gcloud compute tpus queued-resources describe "$qr" "${common[@]}" \
      --format='value(state.state)' 2>"$errors")
  fi && { echo "${out:-UNKNOWN}"; return; }
  grep -q NOT_FOUND "$errors" && { echo ABSENT; return; }
  cat "$errors" >&2
  return 1
}

wait_for() {  # wait_for node|qr GOAL: poll until the state is GOAL; stop on a dead end
  local kind=$1 goal=$2 state last="" name describe
  if [ "$kind" = node ]; then
    name="TPU VM $tpu" describe="tpu-vm describe $tpu"
  else
    name="queued resource $qr" describe="queued-resources describe $qr"
  fi
  while true; do
    state=$(state_of "$kind") || state=QUERY_FAILED  # a failed query is retried
    [ "$state" = "$goal" ] && return
    # Only a slice on its way up gets there by itself: any other state (STOPPED, HIDDEN,
    # UNKNOWN, one Cloud TPU adds later) would be polled forever. A slice being deleted may
    # pass through any state on its way out.
    if [ "$goal" != ABSENT ] && [ "$state" != QUERY_FAILED ] && ! coming "$state"; then
      if dead "$state"; then
        die "$name is $state, not $goal; \`gcloud compute tpus $describe --zone=$zone\` says" \
          "why. Run this command again to delete and re-create it."
      elif [ "$state" = ABSENT ]; then
        die "$name disappeared while waiting for $goal"
      fi
      die "$name is $state, not $goal, and will not get there by itself;" \
        "\`gcloud compute tpus $describe --zone=$zone\` shows it. Start or delete it with" \
        "gcloud, then run this command again."
    fi
    [ "$state" = "$last" ] || echo "$name: $state (waiting for $goal)"
    last=$state
    sleep "$poll"
  done
}

dead() {  # will not come back by itself
  case "$1" in PREEMPTED|TERMINATED|SUSPENDED|SUSPENDING|FAILED) return 0 ;; esac
  return 1
}
coming() {  # on its way up by itself
  case "$1" in
    CREATING|STARTING|RESTARTING|REIMAGING|REPAIRING) return 0 ;;  # a VM
    ACCEPTED|PROVISIONING|WAITING_FOR_RESOURCES) return 0 ;;  # a queued resource
  esac
  return 1
}
cannot() { die "$1 is $2; this script reuses READY and replaces PREEMPTED, TERMINATED," \
  "SUSPENDED or FAILED slices. Start or delete it with gcloud, then run this again."; }
check_type() {  # check_type STATE TYPE QR_STATE: a VM this run would keep must be the type
  dead "$1" || [ "$1" = ABSENT ] || [ "$1" = DELETING ] && return  # it is replaced anyway
  if [ -z "$2" ]; then
    echo "warning: TPU VM $tpu reports no acceleratorType (made with --type/--topology?);" \
      "using it as $accelerator unchecked" >&2
  elif [ "$2" != "$accelerator" ]; then
    local with_qr=1; [ "$3" = ABSENT ] && with_qr=0
    die "TPU VM $tpu is a $2 ($1), not the $accelerator asked for. Pass another --tpu name," \
      "or delete it ($(use_qr=$with_qr delete_slice_command)) and run this again."
  fi
}

# 1. The slice. Sets reused (a READY one was there) and use_qr (it belongs to queued resource $qr).
create_slice() {
  local extra=(); [ $spot = 1 ] && extra+=(--spot)
  if [ $queued = 1 ]; then
    run gcloud compute tpus queued-resources create "$qr" --node-id="$tpu" \
      --accelerator-type="$accelerator" --runtime-version="$version" "${common[@]}" "${extra[@]}"
    use_qr=1
  else
    run gcloud compute tpus tpu-vm create "$tpu" --accelerator-type="$accelerator" \
      --version="$version" "${common[@]}" "${extra[@]}"
  fi
}

acquire_slice() {
  reused=0 use_qr=0
  if [ $dry = 1 ]; then
    create_slice
    [ $queued = 1 ] && echo "+ (wait until queued resource $qr is ACTIVE)"
    echo "+ (wait until TPU VM $tpu is READY)"
    return
  fi
  local node node_type qstate=ABSENT info
  info=$(state_of node acceleratorType) || exit 1
  IFS=$'\t' read -r node node_type <<< "$info"
  if [ $queued = 1 ]; then
    qstate=$(state_of qr) || exit 1
    echo "TPU VM $tpu: $node${node_type:+ ($node_type)}; queued resource $qr: $qstate"
  else
    echo "TPU VM $tpu: $node${node_type:+ ($node_type)}"
  fi
  check_type "$node" "$node_type" "$qstate"
  if [ "$node" = READY ] && { [ "$qstate" = ACTIVE ] || [ "$qstate" = ABSENT ]; }; then
    echo "reusing TPU VM $tpu"
    reused=1
    [ "$qstate" = ACTIVE ] && use_qr=1
    return 0
  fi
  if [ "$qstate" != ABSENT ]; then
    # An ACTIVE queued resource whose VM is gone or dead is as spent as a SUSPENDED one; and a
    # leftover one would make `queued-resources create` fail with ALREADY_EXISTS.
    if dead "$qstate" ||
        { [ "$qstate" = ACTIVE ] && { dead "$node" || [ "$node" = ABSENT ]; }; }; then
      run gcloud compute tpus queued-resources delete "$qr" "${common[@]}" --force --quiet
      wait_for qr ABSENT
    elif [ "$qstate" = DELETING ]; then
      wait_for qr ABSENT
    elif coming "$qstate" || { [ "$qstate" = ACTIVE ] && coming "$node"; }; then
      use_qr=1  # an earlier request on its way: wait for it
    else
      cannot "queued resource $qr" "$qstate"
    fi
    [ $use_qr = 1 ] || { node=$(state_of node) || exit 1; }
  fi
  if [ $use_qr = 0 ]; then
    if dead "$node"; then
      run gcloud compute tpus tpu-vm delete "$tpu" "${common[@]}" --quiet
      wait_for node ABSENT
      node=ABSENT
    elif [ "$node" = DELETING ]; then
      wait_for node ABSENT
      node=ABSENT
    elif [ "$node" != ABSENT ] && ! coming "$node"; then
      cannot "TPU VM $tpu" "$node"
    fi
    [ "$node" = ABSENT ] && create_slice
  fi
  [ $use_qr = 1 ] && wait_for qr ACTIVE
  wait_for node READY
}

# 4. Following. Ctrl-C or a dropped connection ends only this; counting the workers' end lines
# tells a run that ended everywhere from following that stopped early.
stopped_following() {
  echo >&2
  echo "$0: stopped following; the run goes on on $tpu. $0 $where --status | --logs | --stop;" \
    "the slice is kept until you delete it ($(delete_slice_command))." >&2
  exit 130
}

count_workers() {  # the slice's hosts (networkEndpoints); 0 when the VM cannot be read
  gcloud compute tpus tpu-vm describe "$tpu" "${common[@]}" \
    --format='value(networkEndpoints[].ipAddress)' 2>/dev/null | tr ';' '\n' | grep -c . || true
}

# follow COMMAND: run COMMAND on every worker, echo it, then report; 0 if all ended. $workers is
# counted before: a preempted VM is gone when following ends, and 0 (unknown) never counts as
# "every worker", so nothing is deleted on a guess.
follow() {
  local out finished ended status node saved of
  out=$(mktemp); tmp+=("$out")
  trap stopped_following INT
  gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" --command="$1" |
    tee "$out" || true
  trap - INT
  finished=$(grep -Ec "$finished_re" "$out" || true)
  ended=$(grep -Ec "$ended_re" "$out" || true)
  if [ "$workers" -gt 0 ] && [ "$finished" -ge "$workers" ]; then
    status=$(grep -Eo "$finished_re" "$out" | sed 's/.* //' | sort -n | tail -1)
    echo "$0: the run ended on all $workers workers; highest exit status $status"
    all_finished=1
    saved=$(grep -Eo 'preemption notice: saved step [0-9]+' "$out" | tail -1 | sed 's/.* //' ||
      true)
    [ -z "$saved" ] || echo "$0: it stopped early (a preemption notice or --stop) and saved step" \
      "$saved; run the first command again to go on from there"
    return "$status"
  fi
  node=$(state_of node 2>/dev/null || echo UNKNOWN)
  of=$workers
  [ "$workers" -gt 0 ] || of="an unknown number of workers (their count could not be read)"
  if [ "$workers" -gt 0 ] && [ "$ended" -ge "$workers" ]; then
    echo "$0: every worker's run ended, $((ended - finished)) without an exit status; the" \
      "slice is kept" >&2
  else
    echo "$0: following stopped before every worker's run ended ($ended of $of reported);" \
      "the run was not stopped." >&2
  fi
  if dead "$node" || [ "$node" = ABSENT ]; then
    echo "$0: TPU VM $tpu is $node: run the first command again; it re-creates the slice and" \
      "resumes from the last checkpoint in the workdir." >&2
  else
    echo "$0: TPU VM $tpu is $node; see $0 $where --status | --logs | --stop" >&2
  fi
  return 1
}

worker_cmd() { echo "cd bert_jax && bash launch/run_worker.sh $*"; }
delete_slice_command() {  # a slice that came through a queued resource goes with it
  if [ "${use_qr:-$queued}" = 1 ]; then
    echo gcloud compute tpus queued-resources delete "$qr" "${common[@]}" --force --quiet
  else
    echo gcloud compute tpus tpu-vm delete "$tpu" "${common[@]}" --quiet
  fi
}
delete_slice() { read -ra cmd <<< "$(delete_slice_command)"; run "${cmd[@]}"; }
all_finished=0

case $action in
  status)
    node=$(state_of node) || exit 1
    echo "TPU VM $tpu: $node"
    if [ $queued = 1 ]; then
      qstate=$(state_of qr) || exit 1
      echo "queued resource $qr: $qstate"
    fi
    [ "$node" = READY ] || exit 0
    exec gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" \
      --command="$(worker_cmd --status)" ;;
  logs)
    workers=$(count_workers); follow "$(worker_cmd --follow 50)"; exit ;;
  stop)
    workers=$(count_workers); follow "$(worker_cmd --stop --follow)"; exit ;;
esac

# What the workers get is `git archive HEAD`: say which commit, and refuse (before a slice is
# made or touched) a checkout whose edits would silently stay behind.
check_checkout() {
  local sha changes
  sha=$(git rev-parse --verify -q HEAD) ||
    die "$(pwd) is not a git checkout with a commit; this script deploys git HEAD (git archive)," \
      "so run it from a clone of the repository."
  changes=$(git status --porcelain --untracked-files=normal) || die "git status failed in $(pwd)"
  if [ -n "$changes" ]; then
    if [ $dirty_ok = 0 ]; then
      die "the checkout $(pwd) has uncommitted changes, which the workers would not get (they" \
        "get git HEAD, ${sha:0:12}):"$'\n'"$changes"$'\n'"Commit them (git add, git commit) and" \
        "run this again, or pass --allow-dirty to deploy HEAD without them."
    fi
    printf 'warning: --allow-dirty: deploying HEAD without these uncommitted changes:\n%s\n' \
      "$changes" >&2
  fi
  echo "deploying commit $sha ($(git log -1 --format=%s HEAD))"
}
check_checkout

acquire_slice

# 2. Code and requirements on every worker; never under a run that is still going there.
if [ $reused = 1 ]; then
  going=$(gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" --command='
    p=$(cat bert_jax_run/job.pid 2>/dev/null) && [ ! -e bert_jax_run/exit_status ] &&
      grep -aqs run_worker.sh "/proc/$p/cmdline" && echo "$(hostname): a run is still going"; true')
  [ -z "$going" ] || die "$going"$'\n'"Follow it with $0 $where --logs, or stop it with --stop," \
    "then run this again."
fi
workers=1
if [ $dry = 0 ]; then
  workers=$(count_workers)
  [ "$workers" -gt 0 ] || die "could not read TPU VM $tpu's workers (gcloud compute tpus tpu-vm" \
    "describe $tpu --zone=$zone); nothing was started. Run this command again."
fi
step() {  # step WHAT COMMAND...: a failure names the step; nothing runs yet, the slice stays
  local code=0
  run "${@:2}" || code=$?
  [ $code = 0 ] || die "$1 failed (exit $code); nothing was started. The slice is kept" \
    "($(delete_slice_command) deletes it); run this command again."
}
archive=$(mktemp -t bert_jax.XXXXXX.tgz); tmp+=("$archive")
step "packing this checkout (git archive)" git archive --format=tar.gz -o "$archive" HEAD
step "copying the checkout to every worker (scp)" \
  gcloud compute tpus tpu-vm scp "$archive" "$tpu:bert_jax.tgz" --worker=all "${common[@]}"
step "setting up every worker (launch/setup_worker.sh)" \
  gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" --command="\
rm -rf bert_jax && mkdir bert_jax && tar xzf bert_jax.tgz -C bert_jax && cd bert_jax && \
bash launch/setup_worker.sh"

# 3. Start, detached: from here on the run needs neither this script nor the connection. Every
# worker must say it started, or that this same run was already going (gcloud reruns the
# command on a worker whose connection failed, up to 10 times). A worker that did not start
# leaves the others waiting for it in jax.distributed.initialize: say so, delete nothing.
start=$(worker_cmd --detach --tpu "$(printf '%q ' "$@")")
if [ $dry = 1 ]; then
  run gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" --command="$start"
else
  said=$(mktemp); tmp+=("$said")
  code=0
  gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" --command="$start" |
    tee "$said" || code=$?
  read -ra started <<< "$(grep -Eo "$started_re" "$said" | cut -d' ' -f2 | tr -d : | sort -u |
    paste -sd' ' || true)"
  if [ $code != 0 ] || [ ${#started[@]} -lt "$workers" ]; then
    die "starting the run failed: gcloud's ssh exited $code and ${#started[@]} of $workers" \
      "workers reported a start${started[0]:+ (${started[*]})}. Workers that started wait for" \
      "the others in jax.distributed.initialize and do not train: see them with $0 $where" \
      "--status, end them with $0 $where --stop, then run this command again. The slice is" \
      "kept ($(delete_slice_command) deletes it)."
  fi
fi

# 4. Follow, report, clean up.
if [ $dry = 1 ]; then
  run gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${common[@]}" \
    --command="$(worker_cmd --follow)"
  if [ $keep = 0 ]; then echo "+ (once every worker's run has ended:)"; delete_slice; fi
  exit 0
fi
status=0
follow "$(worker_cmd --follow)" || status=$?
if [ $keep = 0 ] && [ $all_finished = 1 ]; then delete_slice; fi
exit $status
