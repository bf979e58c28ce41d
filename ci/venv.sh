#!/usr/bin/env bash
# Creates (if needed) a virtual environment and installs fedpriv (editable, with its torch, test,
# docs and lint extras) into it at the versions of a constraints file:
#
#   bash ci/venv.sh VENV CONSTRAINTS            e.g. bash ci/venv.sh .venv ci/constraints-oldest.txt
#   bash ci/venv.sh VENV CONSTRAINTS --relock   install with only the pins above the '# ---' line
#                                               (newest releases for the rest), then rewrite the
#                                               frozen part of CONSTRAINTS from that environment
#
# torch==2.13.0 is installed first, on its own: pip takes that CPU build from this machine's disk
# (see /etc/xdg/pip); asked for through fedpriv's range with no torch installed, pip would pull a
# CUDA build of several GB. Run from the repository root; PYTHON picks the interpreter (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: ci/venv.sh VENV CONSTRAINTS [--relock]}
constraints=${2:?usage: ci/venv.sh VENV CONSTRAINTS [--relock]}
relock=${3:-}
PY=${PYTHON:-python3}
pin() { sed -n "s/^$1==//p" "$constraints" | head -n1; }
torch_version=$(pin torch)
[ -n "$torch_version" ] || { echo "$constraints pins no torch" >&2; exit 2; }
# Python 3.11 to 3.13 (pyproject.toml): refused by name before anything is downloaded
"$PY" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 13) else 1)' 2>/dev/null \
    || { echo "ci/venv.sh: fedpriv needs Python 3.11, 3.12 or 3.13; $PY is $("$PY" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo missing) (set PYTHON=python3.11)" >&2; exit 2; }
"$venv/bin/python" -c "import pip" 2>/dev/null || "$PY" -m venv --clear "$venv"  # none yet, or half-made by a stop
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
extras=torch,test,docs,lint  # the stamp below covers them: another list installs again
# nothing to do when the venv was made from these very files (and extras) and still imports this
# checkout's fedpriv
stamp="$venv/.fedpriv-installed"
want=$({ cat pyproject.toml "$constraints"; echo "extras: $extras"; } \
    | "$venv/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read() + sys.version.encode()).hexdigest())')
if [ -z "$relock" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && [ "$("$venv/bin/python" -c 'import fedpriv, os; print(os.path.dirname(os.path.dirname(fedpriv.__file__)))' 2>/dev/null)" = "$PWD" ]; then
    echo "$venv: up to date (pyproject.toml, $constraints and the extras $extras unchanged)" >&2
    exit 0
fi
rm -f "$stamp"
use="$constraints"
if [ "$relock" = --relock ]; then
    use=$(mktemp)
    sed '/^# ---/,$d' "$constraints" >"$use"
fi
if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])' 2>/dev/null)" != "$torch_version" ]; then
    "${pip[@]}" install --quiet "torch==$torch_version"
fi
"${pip[@]}" install --quiet -c "$use" -e ".[$extras]"
if [ "$relock" = --relock ]; then
    rm -f "$use"
    top=$(sed '/^# ---/q' "$constraints")
    pinned=$(sed -n 's/==.*//p' <(sed '/^# ---/,$d' "$constraints") | tr 'A-Z_' 'a-z-' | paste -sd'|')
    { printf '%s\n' "$top"
      "${pip[@]}" freeze --exclude-editable | grep -v '^-e ' | grep -viE "^($pinned)==" | sed 's/+cpu$//' | sort -f
    } >"$constraints.new"
    mv "$constraints.new" "$constraints"
    echo "rewrote $constraints from $venv" >&2
fi
echo "$want" >"$stamp"
# what was installed, for the log
"$venv/bin/python" -c 'import importlib.metadata as m, sys; print(f"{sys.argv[1]}: Python {sys.version.split()[0]}, " + ", ".join(f"{d} {m.version(d)}" for d in ("flwr", "torch", "ray")))' "$venv"
