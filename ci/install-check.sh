#!/usr/bin/env bash
# The documented install on another Python (default python3.13), as a user makes it: a fresh venv,
# `pip install -c ci/constraints-newest.txt .` (no torch extra), then checks that no torch or
# nvidia package came with it and that the main job runs there (in process, a small synthetic set).
#
#   bash ci/install-check.sh [PYTHON] [VENV]      (defaults: python3.13, .venv-install-check)
#
# Skips (exit 0, one line) where that Python is not installed. About a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3.13}
venv=${2:-.venv-install-check}
mkdir -p "$(dirname "$venv")"; venv=$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")
if ! "$py" -c 'import venv' >/dev/null 2>&1; then  # not on PATH (or a pyenv shim of a version not selected): pyenv's own build
    minor=${py#python}
    for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$minor".*/bin/python3; do
        [ -x "$cand" ] && py=$cand
    done
fi
if ! "$py" -c 'import venv' >/dev/null 2>&1; then
    echo "install check: $py is not installed here: skipped" >&2
    exit 0
fi
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c ci/constraints-newest.txt . 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/python" -c 'import fedpriv' || { echo "install check: fedpriv did not install on $py" >&2; exit 1; }
heavy=$("$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE '^(torch|nvidia-)' || true)
if [ -n "$heavy" ]; then
    echo "install check: the main job's install on $py pulled: $heavy" >&2
    exit 1
fi
(cd "$venv" && "$venv/bin/python" - <<'PY'
import sys
import fedpriv
data = fedpriv.load_data("synthetic-mf:users=120,items=60,ratings=3000,seed=1")
r = fedpriv.train("adadpals", data, epsilon=5.0, steps=1)
assert "torch" not in sys.modules and r.epsilon <= 5.0 * 1.001, (sorted(m for m in sys.modules if m.startswith("torch"))[:3], r.epsilon)
print(f"install check: Python {sys.version.split()[0]}: fedpriv installed without torch or nvidia packages; adadpals eps {r.epsilon:.4f}, "
      f"test RMSE {r.metrics['test_rmse']:.4f}")
PY
)
rm -rf "$venv"
