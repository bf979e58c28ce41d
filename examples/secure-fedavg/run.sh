#!/usr/bin/env bash
# Runs the example with `flwr run` on Flower's local simulation federation, offline and with a
# project-local FLWR_HOME (nothing is written to ~/.flwr), then stops the local SuperLink that
# `flwr run` leaves running, by PID. Extra arguments go to --run-config (e.g. "epsilon=1.0").
set -euo pipefail
cd "$(dirname "$0")"
export FLWR_HOME="$PWD/.flwr" FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
mkdir -p "$FLWR_HOME"
stop_superlink() {
    local pids
    pids=$(pgrep -f "flower-superlink.*$FLWR_HOME/local-superlink" || true)
    [ -z "$pids" ] && return 0
    kill $pids
    for _ in $(seq 30); do kill -0 $pids 2>/dev/null || return 0; sleep 0.5; done
}
trap stop_superlink EXIT
flwr run . --stream --federation-config "num-supernodes=${NODES:-10}" ${1:+--run-config "$1"}
