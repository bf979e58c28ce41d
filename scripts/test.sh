#!/usr/bin/env bash
# Creates the virtual environment (if needed), installs fedpriv with its test extras, runs the tests:
# the default suite, then the deployment suite (SuperLink/SuperNode/Ray processes on loopback).
# With arguments, runs pytest once with them (e.g. `bash scripts/test.sh tests/test_ledger.py`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -m "not deployment"
exec .venv/bin/python -m pytest -q -m deployment
