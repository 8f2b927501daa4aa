#!/usr/bin/env bash
# Sets up .venv and runs the main job: BERT-tiny pre-trained on the embedded corpus on CPU
# (data creation, training, held-out eval, HF export, fill-mask), then MR fine-tuning from it,
# from random init and from MiniLM-L6 (recipes: configs/demo.py). Extra flags go to the demo,
# e.g. --workdir=runs/other --steps=2000 --nominilm.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m bert_jax.demo "$@"
