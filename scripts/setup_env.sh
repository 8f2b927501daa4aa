#!/usr/bin/env bash
# Creates ./.venv with the pinned requirements (Python 3.11). Re-installs only when a
# requirements file changed, so the Quickstart commands are cheap to repeat.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt requirements-dev.txt requirements-nodeps.txt requirements-aot.txt |
  sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing requirements-dev.txt into .venv (a few minutes the first time)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  .venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
  .venv/bin/python -m pip install -q --no-deps --upgrade --target .venv/libtpu -r requirements-aot.txt
  echo "$want" > "$stamp"
fi
