#!/usr/bin/env bash
# Creates the virtual environment (if needed), installs fedpriv with its test extras, runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
