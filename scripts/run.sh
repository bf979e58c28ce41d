#!/usr/bin/env bash
# Creates the virtual environment (if needed), installs fedpriv and runs the main job with
# `flwr run .`: AdaDPALS at epsilon = 5 on Flower's simulation runtime (20 nodes) over the
# embedded synthetic MovieLens-like data set -> runs/default/{metrics,ledger}.json
# Extra arguments are run-config overrides, e.g. `bash scripts/run.sh "epsilon=1"`.
#
# Ctrl-C (SIGINT), SIGTERM and SIGHUP stop the run and every process it started (the local
# SuperLink, SuperExec, the simulation and Ray: found by the run's own FLWR_HOME), remove the
# run's temporary folder, print one line and exit 128 + n.
#
# Each run has a local SuperLink of its own (free ports, a FLWR_HOME in its temporary folder) and
# a run token its nodes must report: it never runs in another federation, and two runs at once
# (RUN_OUT=other/folder for the second) do not meet. A rerun skips pip when nothing changed.
# RUN_MAX_REJECTED=F: the share of rejected replies above which the run exits 3 (default 0.5).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
. scripts/steps.sh  # step / stop_step: a stop reaches the step running (venv, pip, flwr run)
# the run's own temporary folder (every process it starts writes there: pip's builds, the job's
# copy of the node data, Ray's session files, and Flower's home), removed with the run however it
# ends; short enough for Ray's socket paths (fedpriv.ops.launcher.RAY_TMPDIR_MAX)
RUN_TMP=$(mktemp -d /tmp/fedpriv-run.XXXXXX)
# offline, quiet Flower with a home of this run's own (flwr starts flower-superlink from PATH).
# A private FLWR_HOME and free ports (below) give the run a local SuperLink of its own: Flower's
# fixed 127.0.0.1:39091 would send the run into whatever SuperLink already answers there
# (another user's, another clone's, a test's) and its nodes
export PATH="$PWD/.venv/bin:$PATH" FLWR_HOME="$RUN_TMP/home" FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
export TMPDIR="$RUN_TMP" RAY_TMPDIR="$RUN_TMP"
OUT=${RUN_OUT:-$PWD/runs/default}  # RUN_OUT: another output folder (two runs at once)

# `flwr run` leaves its local SuperLink running, and a stopped `flwr run` leaves the whole run:
# stop every process started under this FLWR_HOME, found by PID through the FLWR_HOME in its
# environment (SuperLink, SuperExec, simulation, Ray: fedpriv.util.processes, standard library
# only), then remove the run's folder (Flower's home with its installed apps in it)
FLOWER=0  # set once the Flower run starts
stop_flower() {
    if [ "$FLOWER" = 1 ]; then
        .venv/bin/python -c 'import sys; from fedpriv.util.processes import pids_with_env, stop_all; stop_all(lambda: pids_with_env("FLWR_HOME", sys.argv[1]), 2.0)' "$FLWR_HOME" || true
    fi
    rm -rf "$RUN_TMP"  # after the processes that wrote there are gone
}
stop_on_signals run.sh 10 stop_flower  # the step: pip (and what it built with), or `flwr run`
trap stop_flower EXIT

# the environment: a venv that a stop left half-made (python, no pip) is made again
.venv/bin/python -c "import pip" 2>/dev/null || step "$PY" -m venv --clear .venv
# fedpriv within the versions CI tests (ci/constraints-oldest.txt; any version in the declared
# ranges works), without torch: the main job needs none (torch is the extra fedpriv[torch], for
# the encoder family and the GPU). Python 3.11 to 3.13, refused by name (setup.py). Skipped when nothing changed: a stamp in .venv holds a hash of the Python
# version, pyproject.toml and the constraints; a rerun installs again when it differs or when
# the installed fedpriv does not import
STAMP=.venv/fedpriv-install.stamp
WANT=$(.venv/bin/python -c 'import hashlib, os, sys
h = hashlib.sha256(sys.version.encode())
for f in ("pyproject.toml", "ci/constraints-oldest.txt"):
    h.update(f.encode() + b"\0" + (open(f, "rb").read() if os.path.exists(f) else b"-") + b"\0")
print(h.hexdigest())')
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && .venv/bin/python -I -c "import fedpriv, flwr" 2>/dev/null; then
    echo "run.sh: fedpriv is installed and pyproject.toml is unchanged: no pip install ($STAMP)"
else
    rm -f "$STAMP"
    CONSTRAINTS=()
    [ -f ci/constraints-oldest.txt ] && CONSTRAINTS=(-c ci/constraints-oldest.txt)
    step .venv/bin/python -m pip install --quiet --disable-pip-version-check "${CONSTRAINTS[@]}" -e .
    echo "$WANT" > "$STAMP"
fi

# free loopback ports for the local SuperLink (FLWR_LOCAL_SUPERLINK_HTTP_API_PORT and
# FLWR_LOCAL_CONTROL_API_PORT: the only ports it binds in simulation) and a fresh run token:
# the simulated nodes inherit FEDPRIV_RUN_TOKEN, the ServerApp gets it in the run config and
# refuses to run on any node that reports another (fedpriv.flower.server_app)
eval "$(.venv/bin/python -m fedpriv.ops.first_run env)"
mkdir -p "$FLWR_HOME"
STARTED="$RUN_TMP/run-started"
touch "$STARTED"
echo "run.sh: a local SuperLink of its own on 127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT (FLWR_HOME=$FLWR_HOME)"
FLOWER=1
set +e
step flwr run . --stream --federation-config "num-supernodes=20" --run-config "out='$OUT' run-token='$FEDPRIV_RUN_TOKEN' $*"
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
from fedpriv.run.report import TooManyRejected, check_rejections
try:  # a run with most of its replies rejected is no result (RUN_MAX_REJECTED: the limit, default 0.5)
    import os
    check_rejections(m, float(os.environ.get("RUN_MAX_REJECTED", "0.5")))
except TooManyRejected as exc:
    print(f"run.sh: {exc}", file=sys.stderr)
    sys.exit(3)
PY
