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
# Each node's own privacy policy (fedpriv.flower.node_policy), which no message can change: the
# nodes of this simulation are yours, so you write it. Secure rounds only; a budget of
# NODE_EPSILON (default 10) at delta 1e-5 over the run, with the noise counted as the shares of
# all NODES nodes, 1 of them colluding with the server. A server that asks for more is refused.
export FEDPRIV_NODE_POLICY="$FLWR_HOME/node-policy.json"
printf '{"aggregation": "secure", "max_epsilon": %s, "delta": 1e-05, "min_contributors": %s, "colluders": 1}\n' \
    "${NODE_EPSILON:-10}" "${NODES:-10}" >"$FEDPRIV_NODE_POLICY"
flwr run . --stream --federation-config "num-supernodes=${NODES:-10}" ${1:+--run-config "$1"}
