#!/usr/bin/env bash
# Creates the virtual environment (if needed), installs fedpriv with its test extras, runs the tests:
# the default suite; the experiments suite (every config in simulations/experiments/ in --quick
# mode, its HTML report checked in headless Chromium); the deployment suite (SuperLink/SuperNode/Ray
# processes on loopback). With arguments, runs pytest once with them (e.g. `bash scripts/test.sh tests/test_ledger.py`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,docs]'
# The report's screenshot tests need a headless browser: Debian's chromium. As root with apt (CI),
# install it and require it; elsewhere those tests skip when no browser is found.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if ! command -v chromium >/dev/null 2>&1; then
        echo "installing Debian's chromium for the report's browser tests" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
            || echo "could not install chromium: the browser tests will fail (FEDPRIV_REQUIRE_BROWSER=1)" >&2
    fi
    export FEDPRIV_REQUIRE_BROWSER=1
fi
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -m "not deployment and not experiments"
.venv/bin/python -m pytest -q -m experiments
exec .venv/bin/python -m pytest -q -m deployment
