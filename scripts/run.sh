#!/usr/bin/env bash
# Creates the virtual environment (if needed), installs fedpriv and runs the main job with
# `flwr run .`: AdaDPALS at epsilon = 5 on Flower's simulation runtime (20 nodes) over the
# embedded synthetic MovieLens-like data set -> runs/default/{metrics,ledger}.json
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .

# offline, quiet Flower with a project-local home (flwr starts flower-superlink from PATH)
export PATH="$PWD/.venv/bin:$PATH" FLWR_HOME="$PWD/.flwr" FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
mkdir -p "$FLWR_HOME"

# `flwr run` leaves its local SuperLink running: stop it by PID when we are done
stop_superlink() {
    local pids
    pids=$(pgrep -f "flower-superlink.*$FLWR_HOME/local-superlink" || true)
    [ -z "$pids" ] && return
    kill $pids
    for _ in $(seq 20); do kill -0 $pids 2>/dev/null || return 0; sleep 0.5; done
}
trap stop_superlink EXIT

flwr run . --stream --federation-config "num-supernodes=20" --run-config "out='$PWD/runs/default' $*"
echo "metrics: $PWD/runs/default/metrics.json"
.venv/bin/python - "$PWD/runs/default/metrics.json" <<'PY'
import json, sys
from fedpriv.run import RunReport
print(RunReport.read(sys.argv[1]).summary(out=sys.argv[1]))  # the same summary as every engine's
m = json.load(open(sys.argv[1]))
print(json.dumps({k: m.get(k) for k in ("algorithm", "engine", "dataset", "epsilon", "epsilon_spent", "valid_rmse", "test_rmse", "rounds", "bytes_up", "bytes_down", "nodes")}))
PY
