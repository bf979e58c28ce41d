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
# The Docker test (tests/test_docker.py, deployment suite) builds the images of docker/ on a
# debootstrap base and runs docker/compose.yml: as root with apt (CI), install Debian's docker.io,
# docker-compose and debootstrap, and start dockerd (log: build/dockerd.log) unless a daemon
# answers. Once a daemon answers the test is required (FEDPRIV_REQUIRE_DOCKER=1); where dockerd
# cannot start it skips, naming why.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker-compose >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
        echo "installing Debian's docker.io, docker-compose and debootstrap for the Docker test" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null; } \
            || echo "could not install docker.io, docker-compose and debootstrap: the Docker test will skip" >&2
    fi
    if command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
        mkdir -p build
        echo "starting dockerd (log: build/dockerd.log)" >&2
        nohup dockerd >build/dockerd.log 2>&1 &
        for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    fi
    if docker info >/dev/null 2>&1; then
        export FEDPRIV_REQUIRE_DOCKER=1
    else
        echo "no Docker daemon (see build/dockerd.log): the Docker test will skip" >&2
    fi
fi
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -m "not deployment and not experiments"
.venv/bin/python -m pytest -q -m experiments
exec .venv/bin/python -m pytest -q -m deployment
