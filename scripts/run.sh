#!/usr/bin/env bash
# Creates the virtual environment (if needed), installs fedpriv and runs the main job:
# AdaDPALS at epsilon = 5 on the embedded synthetic MovieLens-like data set.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
exec .venv/bin/fedpriv run adadpals --data synthetic-mf:users=2000,items=1000,ratings=100000,seed=1 \
    --epsilon 5 --delta 1e-5 --set rank=4 --set steps=2 --out runs/default "$@"
