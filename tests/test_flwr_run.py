"""The README's main command path: ``flwr run .`` on the local simulation federation."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

pytestmark = __import__("pytest").mark.flower  # Flower's engine: scripts/test.sh runs these on the newest Flower

ROOT = Path(__file__).resolve().parents[1]


def _superlink_pids(flwr_home: Path) -> list[int]:
    r = subprocess.run(["pgrep", "-f", f"flower-superlink.*{flwr_home}/local-superlink"], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


def test_flwr_run_writes_the_contract_files(tmp_path):
    home = tmp_path / "flwr-home"
    home.mkdir()
    out = tmp_path / "out"
    env = dict(os.environ)
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
    )
    run_config = f"out='{out}' data='synthetic-mf:users=60,items=40,ratings=1500,seed=2' users-per-node=3"
    try:
        r = subprocess.run(["flwr", "run", ".", "--stream", "--federation-config", "num-supernodes=20", "--run-config", run_config], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stderr[-3000:]
        m = json.loads((out / "metrics.json").read_text())
        assert m["engine"] == "flower" and m["algorithm"] == "adadpals" and m["nodes"] == 20
        assert abs(m["epsilon_spent"] - 5.0) / 5.0 < 1e-3 and m["rounds"] == 4 and m["bytes_up"] > 0
        assert {r["name"] for r in json.loads((out / "ledger.json").read_text())} == {"users", "mean", "bias"}  # 400 users: the rule picks the bias model
    finally:
        for pid in _superlink_pids(home):  # flwr leaves its local SuperLink running
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _superlink_pids(home) and time.monotonic() < deadline:
            time.sleep(0.5)
    assert _superlink_pids(home) == []
