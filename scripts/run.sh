#!/usr/bin/env bash
# Creates the virtual environment (if needed), installs fedpriv and runs the main job with
# `flwr run .`: AdaDPALS at epsilon = 5 on Flower's simulation runtime (20 nodes) over the
# embedded synthetic MovieLens-like data set -> runs/default/{metrics,ledger}.json
# Extra arguments are run-config overrides, e.g. `bash scripts/run.sh "epsilon=1"`.
#
# Ctrl-C (SIGINT), SIGTERM and SIGHUP stop the run and every process it started (the local
# SuperLink, SuperExec, the simulation and Ray: found by this project's FLWR_HOME), remove the
# run's temporary folder, print one line and exit 128 + n.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
. scripts/steps.sh  # step / stop_step: a stop reaches the step running (venv, pip, flwr run)
# offline, quiet Flower with a project-local home (flwr starts flower-superlink from PATH)
export PATH="$PWD/.venv/bin:$PATH" FLWR_HOME="$PWD/.flwr" FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
OUT="$PWD/runs/default"
# the run's own temporary folder (every process it starts writes there: pip's builds, the job's
# copy of the node data, Ray's session files), removed with the run however it ends; short
# enough for Ray's socket paths (fedpriv.ops.launcher.RAY_TMPDIR_MAX)
RUN_TMP=$(mktemp -d /tmp/fedpriv-run.XXXXXX)
export TMPDIR="$RUN_TMP" RAY_TMPDIR="$RUN_TMP"

# `flwr run` leaves its local SuperLink running, and a stopped `flwr run` leaves the whole run:
# stop every process started under this FLWR_HOME, found by PID through the FLWR_HOME in its
# environment (SuperLink, SuperExec, simulation, Ray: fedpriv.util.processes, standard library only)
# Flower installs the app by copying it file by file into $FLWR_HOME/apps/<app>.<hash>, and a
# later run of the same code reuses any folder of that name: a stop during the copy left a
# half-installed app (no pyproject.toml) that every later run failed on. The installed apps are
# a cache: removed once this run's processes are gone, and before it starts unless another run
# under this FLWR_HOME is using them.
FLOWER=0  # set once the Flower run starts
stop_flower() {
    if [ "$FLOWER" = 1 ]; then
        .venv/bin/python -c 'import sys; from fedpriv.util.processes import pids_with_env, stop_all; stop_all(lambda: pids_with_env("FLWR_HOME", sys.argv[1]), 2.0)' "$FLWR_HOME" || true
        rm -rf "$FLWR_HOME/apps"  # after the processes that wrote there are gone
    fi
    rm -rf "$RUN_TMP"
}
stop_on_signals run.sh 10 stop_flower  # the step: pip (and what it built with), or `flwr run`
trap stop_flower EXIT

# the environment: a venv that a stop left half-made (python, no pip) is made again
.venv/bin/python -c "import pip" 2>/dev/null || step "$PY" -m venv --clear .venv
# torch from the CPU wheel first (a plain `pip install torch` may pull a multi-GB CUDA build), then
# fedpriv within the versions CI tests (ci/constraints-oldest.txt; any version in the declared
# ranges works)
CONSTRAINTS=()
[ -f ci/constraints-oldest.txt ] && CONSTRAINTS=(-c ci/constraints-oldest.txt)
.venv/bin/python -c "import torch" 2>/dev/null || step .venv/bin/python -m pip install --quiet --disable-pip-version-check "${CONSTRAINTS[@]}" torch
step .venv/bin/python -m pip install --quiet --disable-pip-version-check "${CONSTRAINTS[@]}" -e .

mkdir -p "$FLWR_HOME"
.venv/bin/python -c 'import sys; from fedpriv.util.processes import pids_with_env; sys.exit(1 if pids_with_env("FLWR_HOME", sys.argv[1]) else 0)' "$FLWR_HOME" \
    && rm -rf "$FLWR_HOME/apps"
STARTED="$FLWR_HOME/run-started"
touch "$STARTED"
FLOWER=1
set +e
step flwr run . --stream --federation-config "num-supernodes=20" --run-config "out='$OUT' $*"
code=$?
set -e
if [ "$code" -ne 0 ] || [ ! "$OUT/metrics.json" -nt "$STARTED" ]; then
    echo "run.sh: the run failed (flwr run exited $code) and wrote no new $OUT/metrics.json; see its output above" >&2
    exit 1
fi
echo "metrics: $OUT/metrics.json"
.venv/bin/python - "$OUT/metrics.json" <<'PY'
import json, sys
from fedpriv.run import RunReport
print(RunReport.read(sys.argv[1]).summary(out=sys.argv[1]))  # the same summary as every engine's
m = json.load(open(sys.argv[1]))
print(json.dumps({k: m.get(k) for k in ("algorithm", "engine", "dataset", "epsilon", "epsilon_spent", "valid_rmse", "test_rmse", "rounds", "bytes_up", "bytes_down", "nodes")}))
PY
