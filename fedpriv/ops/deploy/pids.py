"""The processes ``up`` recorded in ``RUN_DIR/pids.json`` (with their start times, against PID
reuse): which are still ours and running, and stopping them with their children."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...util import atomic
from ...errors import FedprivError
from .. import launcher
from .config import PIDS_FILE, STOP_SECONDS, DeployConfig


def _start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot, Linux): guards against PID reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _ours(entry: dict) -> bool:
    pid = int(entry["pid"])
    if not launcher.pid_alive(pid):
        return False
    ticks = entry.get("start")
    return ticks is None or _start_ticks(pid) in (None, ticks)


def _read_pids(cfg: DeployConfig) -> list[dict]:
    path = cfg.run_dir / PIDS_FILE
    if not path.is_file():
        return []
    try:
        return list(json.loads(path.read_text())["processes"])
    except (ValueError, KeyError, TypeError):
        raise FedprivError(f"{path} is not a pids file written by `fedpriv deploy up`") from None


def _write_pids(cfg: DeployConfig, entries: list[dict]) -> None:
    atomic.write_text(cfg.run_dir / PIDS_FILE, json.dumps({"processes": entries}, indent=2) + "\n")


def running(cfg: DeployConfig) -> list[dict]:
    """The recorded processes of ``cfg`` that are still alive."""
    return [e for e in _read_pids(cfg) if _ours(e)]


def stop(run_dir: str | os.PathLike, seconds: float = STOP_SECONDS, *, also: list[dict] = ()) -> list[int]:
    """Stop every process ``up`` recorded in ``run_dir`` (and the entries ``also``), then what
    they started (SuperExec, ServerApp, ClientApp processes): SIGTERM, SIGKILL after
    ``seconds``. Returns the PIDs stopped; removes ``pids.json``."""
    run_dir = Path(run_dir).expanduser().resolve()
    cfg = DeployConfig(run_dir=run_dir, nodes=1)
    live = list(dict.fromkeys(int(e["pid"]) for e in [*running(cfg), *(e for e in also if _ours(e))]))
    below = launcher.descendant_pids(live)  # taken first: children get re-parented
    if live:
        launcher.terminate_pids(live, seconds)
    left = [p for p in below if launcher.pid_alive(p)]
    if left:
        launcher.terminate_pids(left, 5.0)
    (run_dir / PIDS_FILE).unlink(missing_ok=True)
    return live + below
