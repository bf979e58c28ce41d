#!/usr/bin/env bash
# Creates the virtual environments (if needed), installs fedpriv with its test and lint extras, runs the tests
# on the oldest and the newest supported Flower (pyproject.toml: flwr>=1.39,<1.43):
#
#   .venv         the OLDEST stack, ci/constraints-oldest.txt (Flower 1.39.0, torch 2.13.0)
#   .venv-newest  the NEWEST stack, ci/constraints-newest.txt (Flower 1.42.0, torch 2.13.0)
#
# `bash scripts/test.sh` (what CI runs through .ci/run; about 80 minutes on a 2-core machine):
#   1. the default suite on 1.39 (under 10 minutes);
#   2. lint and types (ci/lint.sh: `ruff check fedpriv`, then mypy on the run and engine layers,
#      pyproject.toml [tool.mypy]);
#   3. the deployment suite, each test once, split over the two Fleet API transports: on 1.39
#      (gRPC-rere) the loopback deployments of tests/test_deploy.py, the Runtime API attack
#      (tests/test_hostnet.py) and the Ray-cluster tests; on 1.42 (HTTP) the rest: the Docker
#      test, the two-host namespaces, replace-one accounting and the Flower example (the
#      documented walk-throughs of docs/how-to/deployment.md and docker/README.md, which repeat
#      tests/test_deploy.py and tests/test_docker.py, under --all);
#   4. the documented install on Python 3.13 in a fresh venv (ci/install-check.sh: no torch or
#      nvidia package, the main job runs), and `pip install .` resolving beside Flower 1.42.0;
#   5. the Flower-engine tests (marker `flower`: `flwr run`, the Flower simulation, a Flower grid) on 1.42.
# `bash scripts/test.sh --all` (about 3 hours) adds the slow suite (the default suite's slowest
# tests, tests/conftest.py SLOW_TESTS), the experiments suite (every config in
# simulations/experiments/ in --quick mode, its HTML report checked in headless Chromium) and
# the whole deployment suite on BOTH Flower versions.
#
# Both environments get torch 2.13.0 from this machine's disk first (ci/venv.sh), so no CUDA build
# is downloaded. The whole run (no arguments, or --all) first sets up what its suites need from
# the system, as root with apt: Debian's chromium, docker.io, docker-compose and debootstrap, and
# a Docker daemon; it prints each suite's wall time. With other arguments it sets up nothing of
# the system (no package, no daemon), lints nothing and runs pytest once with them in .venv (e.g.
# `bash scripts/test.sh tests/test_ledger.py`); run one in the newest stack with
# `bash ci/venv.sh .venv-newest ci/constraints-newest.txt && .venv-newest/bin/python -m pytest ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Ctrl-C, SIGTERM and SIGHUP stop the step running with SIGTERM (pip; pytest, which takes its
# Ctrl-C path on it (tests/conftest.py), so the tests' own clean-ups run) and wait for it, then
# exit 128 + n with one line
. scripts/steps.sh
stop_on_signals test.sh 120
step bash ci/venv.sh .venv ci/constraints-oldest.txt
# System set-up for the whole run (no arguments, or --all: what CI runs): a filtered run
# (`bash scripts/test.sh ARGS...`) installs no package and starts no daemon.
system_setup() {
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
}
ALL=0
if [ "${1:-}" = "--all" ]; then
    ALL=1
    shift
fi
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
system_setup
# each suite's wall time, printed when it ends (the default suite's target: under 10 minutes on an idle 2-core machine)
SUITE_NAME="" SUITE_START=0
suite() {
    [ -z "$SUITE_NAME" ] || echo "== $SUITE_NAME: $((SECONDS - SUITE_START)) s" >&2
    SUITE_NAME=$1 SUITE_START=$SECONDS
    echo "== $1 (${2}: $("$2/bin/python" -c 'import importlib.metadata as m; print("flwr", m.version("flwr"))'))" >&2
}
suite "default suite" .venv
step .venv/bin/python -m pytest -q -m "not deployment and not experiments and not flower and not slow" --durations=15
suite "lint and types (ci/lint.sh: ruff, mypy)" .venv
step bash ci/lint.sh .venv
# the deployment tests that run on Flower 1.39's gRPC-rere Fleet API (the others on 1.42's HTTP);
# --all runs every one on both
ON_OLDEST=(tests/test_deploy.py tests/test_hostnet.py tests/test_ray_cluster.py tests/test_ray_two_hosts.py)
# the two documented deployment walk-throughs (about 7 minutes each) repeat what tests/test_deploy.py
# and tests/test_docker.py run step by step: --all runs them (on both versions), to keep CI in 90 minutes
WALKTHROUGHS=("tests/test_doc_snippets.py::test_shell_block[docs/how-to/deployment.md#1]"
              "tests/test_doc_snippets.py::test_shell_block[docker/README.md#7]")
if [ "$ALL" = 1 ]; then
    suite "slow suite (the default suite's slowest tests: tests/conftest.py SLOW_TESTS)" .venv
    step .venv/bin/python -m pytest -q -m "slow and not deployment and not experiments and not flower"
    suite "experiments suite" .venv
    step .venv/bin/python -m pytest -q -m experiments
    suite "deployment suite on gRPC-rere, without Docker" .venv
    step .venv/bin/python -m pytest -q -m "deployment and not experiments" --ignore=tests/test_docker.py --durations=10
else
    suite "deployment suite on gRPC-rere: loopback deployments, Runtime API attack, Ray clusters" .venv
    step .venv/bin/python -m pytest -q -m "deployment and not experiments" "${ON_OLDEST[@]}" --durations=10
fi
suite "the documented install on Python 3.13 (no torch, the main job runs)" .venv
step bash ci/install-check.sh python3.13
step bash ci/venv.sh .venv-newest ci/constraints-newest.txt
suite "pip install . beside the newest Flower" .venv-newest
step .venv-newest/bin/python -m pytest -q tests/test_packaging.py -k "pip_install_keeps_the_installed_flower or dependencies_are_ranges"
if [ "$ALL" = 1 ]; then
    suite "Flower-engine tests and deployment suite (with Docker) on the HTTP Fleet API" .venv-newest
    step .venv-newest/bin/python -m pytest -q -m "(flower or deployment) and not experiments" --durations=10
else
    suite "Flower-engine tests and the rest of the deployment suite (with Docker) on the HTTP Fleet API" .venv-newest
    step .venv-newest/bin/python -m pytest -q -m "(flower or deployment) and not experiments" "${ON_OLDEST[@]/#/--deselect=}" "${WALKTHROUGHS[@]/#/--deselect=}" --durations=10
fi
echo "== $SUITE_NAME: $((SECONDS - SUITE_START)) s; all: $SECONDS s" >&2
