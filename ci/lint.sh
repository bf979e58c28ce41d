#!/usr/bin/env bash
# Lint and types: ruff on the package (pyproject.toml [tool.ruff]: pycodestyle and pyflakes, 120
# characters a line), then mypy on what pyproject.toml [tool.mypy] names (the run and engine
# layers), both from a venv with the lint extra (ci/venv.sh installs it, at the versions of the
# constraints file):
#
#   bash ci/lint.sh [VENV]       (default: .venv)
#
# Each command is printed before it runs; both run even when the first finds something, and the
# exit status is 1 when either found anything. Run from anywhere: it checks this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
rc=0
run() {
    echo "ci/lint.sh: $*"
    "$@" || rc=1
}
run "$venv/bin/python" -m ruff check fedpriv
run "$venv/bin/python" -m mypy
exit "$rc"
