#!/usr/bin/env bash
# Prepare one worker (a Cloud TPU VM, or any Linux machine): a Python >= 3.11 virtualenv at
# .venv with requirements.txt, the accelerator's jax build and this checkout (pip install -e .
# --no-deps, pyproject.toml: bert_jax imports from any directory, not only from the checkout's
# root as `python -m bert_jax.main` there does). Run from the checkout's root:
#
#   bash launch/setup_worker.sh            # jax[tpu] matching requirements.txt
#   JAX_EXTRA='jax[cuda12]' bash launch/setup_worker.sh
#
# The pinned jax/flax/orbax need Python >= 3.11, and tpu-ubuntu2204-base (like the v5e/v5p/v6e
# images, all Ubuntu 22.04) ships 3.10. The interpreter is, in order: $PYTHON; the first of
# python3.13, python3.12, python3.11, python3 that is >= 3.11; else one installed by uv (from
# PyPI; it fetches a standalone CPython); else Ubuntu's deadsnakes PPA with apt. If none works the
# script stops and says what to do. Env: PYTHON, VENV (.venv), REQUIREMENTS (requirements.txt),
# JAX_EXTRA (jax[tpu]==<pinned jax>; empty = none).
set -euo pipefail
venv=${VENV:-.venv}
requirements=${REQUIREMENTS:-requirements.txt}
jax_version=$(sed -n 's/^jax==//p' requirements.txt)
extra=${JAX_EXTRA-"jax[tpu]==$jax_version"}

is_311() { "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }

find_python() {
  if [ -n "${PYTHON:-}" ]; then
    is_311 "$PYTHON" && { echo "$PYTHON"; return; }
    echo "setup_worker: PYTHON=$PYTHON is not a Python >= 3.11 with venv" >&2
    return 1
  fi
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && is_311 "$candidate"; then
      command -v "$candidate"
      return
    fi
  done
  return 1
}

install_python() {  # prints the path of a fresh Python 3.11, or fails
  local base
  for base in python3 python3.10; do
    if command -v "$base" >/dev/null 2>&1 && "$base" -m pip --version >/dev/null 2>&1; then
      "$base" -m pip install -q --user uv >&2 &&
        "$base" -m uv python install 3.11 >&2 &&
        "$base" -m uv python find 3.11 && return
    fi
  done
  if command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then
    sudo apt-get update -q >&2 && sudo apt-get install -y -q software-properties-common >&2 &&
      sudo add-apt-repository -y ppa:deadsnakes/ppa >&2 && sudo apt-get update -q >&2 &&
      sudo apt-get install -y -q python3.11 python3.11-venv >&2 && command -v python3.11 &&
      return
  fi
  return 1
}

if ! py=$(find_python); then
  found=$(command -v python3 >/dev/null 2>&1 && python3 --version 2>&1 || echo 'no python3')
  echo "setup_worker: no Python >= 3.11 on PATH ($found); installing one" >&2
  if ! py=$(install_python); then
    echo "setup_worker: error: bert_jax needs Python >= 3.11 (jax $jax_version requires it) and" \
         "none could be found or installed here ($found). Install one and run again:" \
         "'sudo apt-get install python3.11 python3.11-venv' (Ubuntu 24.04, or 22.04 with the" \
         "deadsnakes PPA), or 'python3 -m pip install --user uv && python3 -m uv python install" \
         "3.11', or point PYTHON=/path/to/python3.11 at one." >&2
    exit 1
  fi
fi
echo "setup_worker: $("$py" --version) at $py -> $venv" >&2
if [ ! -x "$venv/bin/python" ] || ! is_311 "$venv/bin/python"; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q -r "$requirements"
if [ -n "$extra" ]; then
  "$venv/bin/python" -m pip install -q "$extra"  # libtpu comes from PyPI with jax[tpu]
fi
"$venv/bin/python" -m pip install -q --no-deps -e .
"$venv/bin/python" -c 'import sys; print("setup_worker: ready,", sys.version.split()[0])'
