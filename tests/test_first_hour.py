"""The first hour: ``bash scripts/run.sh`` runs on a SuperLink of its own (free ports, a private
FLWR_HOME, a run token its nodes must report), a plain ``flwr run .`` adapts its users per node to
the nodes that register, and a rerun of run.sh skips pip when nothing changed."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedpriv.errors import ConfigError
from fedpriv.ops.first_run import PORT_VARIABLES, free_ports, run_env
from fedpriv.ops.flwr_app import job_of_run_config
from fedpriv.run import FlowerGrid
from fedpriv.testing.local_grid import LocalGrid
from fedpriv.util.processes import pids_with_env, stop_all

ROOT = Path(__file__).resolve().parents[1]
SMALL = "synthetic-mf:users=60,items=40,ratings=1500,seed=1"
FLOWER_DEFAULT_PORTS = (39091, 39093)  # flwr.cli.constant: the local SuperLink's HTTP and Control API ports


def _run_config(**values) -> dict:
    """A run config as the ServerApp of ``flwr run .`` reads it (pyproject's defaults, small data)."""
    rc = {"algorithm": "adadpals", "data": SMALL, "epsilon": 5.0, "delta": 1e-5, "users-per-node": 0, "set": "steps=1",
          "round-timeout": 0.0, "node-wait": 5.0, "run-token": ""}
    rc.update(values)
    return rc


def _execute(rc: dict, grid):
    job, engine = job_of_run_config(rc)
    return job.prepare().execute(FlowerGrid(grid=grid, **engine))


# ------------------------------------------------------------------------------ units (LocalGrid)
def test_first_run_env_gives_distinct_free_ports_and_a_fresh_token():
    a, b = run_env(), run_env()
    assert set(PORT_VARIABLES) < set(a) and a["FEDPRIV_RUN_TOKEN"] != b["FEDPRIV_RUN_TOKEN"] and len(a["FEDPRIV_RUN_TOKEN"]) >= 32
    ports = [int(a[k]) for k in PORT_VARIABLES]
    assert len(set(ports)) == 2 and not set(ports) & set(FLOWER_DEFAULT_PORTS)
    assert len(set(free_ports(5))) == 5


def test_users_per_node_zero_splits_the_users_over_the_registered_nodes():
    grid = LocalGrid(2)
    t0 = time.monotonic()
    out = _execute(_run_config(), grid)
    m = out.report.to_json() if hasattr(out.report, "to_json") else out.report
    n_train = m["n_users"]
    assert m["nodes"] == 2 and m["users_per_node"] == math.ceil(n_train / 2), {k: m.get(k) for k in ("nodes", "users_per_node", "n_users")}
    assert m["rounds"] >= 2 and abs(m["epsilon_spent"] - 5.0) < 5e-3
    assert time.monotonic() - t0 < 60


def test_an_explicit_users_per_node_still_needs_its_nodes():
    """The positive control of the adaptation: users-per-node given, 2 nodes are too few (today's error)."""
    with pytest.raises(ConfigError, match="need .* nodes; 2 registered"):
        _execute(_run_config(**{"users-per-node": 20, "node-wait": 0.5}), LocalGrid(2))


def test_a_job_with_a_run_token_refuses_nodes_that_report_another(monkeypatch):
    monkeypatch.setenv("FEDPRIV_RUN_TOKEN", "the-nodes-token")
    grid = LocalGrid(3)
    with pytest.raises(ConfigError, match="these nodes were not started by this run's launcher") as err:
        _execute(_run_config(**{"run-token": "the-jobs-token"}), grid)
    assert "3 of 3 serving node(s)" in str(err.value) and "node 1000" in str(err.value)
    assert set(grid.message_types) == {"query.info"}, grid.message_types  # refused before any release


def test_a_job_with_a_run_token_refuses_nodes_that_report_none(monkeypatch):
    monkeypatch.delenv("FEDPRIV_RUN_TOKEN", raising=False)
    grid = LocalGrid(2)
    with pytest.raises(ConfigError, match="these nodes were not started by this run's launcher.*no run token"):
        _execute(_run_config(**{"run-token": "the-jobs-token"}), grid)
    assert set(grid.message_types) == {"query.info"}


def test_a_job_runs_on_nodes_with_its_token_and_without_a_token_checks_nothing(monkeypatch):
    monkeypatch.setenv("FEDPRIV_RUN_TOKEN", "same-token")
    m = _execute(_run_config(**{"run-token": "same-token"}), LocalGrid(2)).report.to_json()
    assert m["nodes"] == 2 and m["rounds"] >= 2
    monkeypatch.setenv("FEDPRIV_RUN_TOKEN", "whatever-the-nodes-say")  # no token in the run config: no check
    m = _execute(_run_config(), LocalGrid(2)).report.to_json()
    assert m["nodes"] == 2


# ------------------------------------------------------------------------------ run.sh (Flower)
def _listen(port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    s.listen(16)
    return s


def _foreign_superlink(home: Path, env: dict) -> subprocess.Popen:
    """A `flower-superlink` on Flower's default local ports under another FLWR_HOME, as another
    user's `flwr run .` leaves it."""
    home.mkdir(parents=True, exist_ok=True)
    cmd = [str(Path(sys.executable).parent / "flower-superlink"), "--insecure", "--simulation", "--control-api-address",
           f"127.0.0.1:{FLOWER_DEFAULT_PORTS[1]}", "--host", "127.0.0.1", "--port", str(FLOWER_DEFAULT_PORTS[0]),
           "--database", str(home / "local-superlink" / "state.db")]
    (home / "local-superlink").mkdir(exist_ok=True)
    return subprocess.Popen(cmd, env={**env, "FLWR_HOME": str(home)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _run_sh(out: Path, log: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RUN_OUT": str(out)}
    with log.open("w") as f:
        return subprocess.Popen(["bash", "scripts/run.sh", *overrides], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _homes_of(text: str) -> list[str]:
    return [line.split("FLWR_HOME=", 1)[1].rstrip(")") for line in text.splitlines() if "a local SuperLink of its own" in line]


def _finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=60)


SMALL_RUN = (f"data='{SMALL}'", "set='steps=1'")


@pytest.mark.flower
def test_run_sh_runs_on_its_own_superlink_beside_a_foreign_one(tmp_path):
    """A SuperLink already answers on Flower's default local ports (another FLWR_HOME): run.sh
    still runs on a SuperLink and nodes of its own and writes its metrics; the foreign SuperLink
    gets no run."""
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}  # it starts flower-superexec from PATH
    foreign_home = tmp_path / "foreign-home"
    foreign, listeners = None, []
    if not any(_port_open(p) for p in FLOWER_DEFAULT_PORTS):
        foreign = _foreign_superlink(foreign_home, env)
        deadline = time.monotonic() + 30
        while not all(_port_open(p) for p in FLOWER_DEFAULT_PORTS[:1]) and time.monotonic() < deadline:
            assert foreign.poll() is None, "the foreign SuperLink did not start"
            time.sleep(0.2)
    listeners = [s for p in FLOWER_DEFAULT_PORTS if (s := _listen(p)) is not None]  # whatever the SuperLink left free: a plain listener
    assert _port_open(FLOWER_DEFAULT_PORTS[0])  # the positive control: the default address is taken
    out, log = tmp_path / "out", tmp_path / "run.log"
    proc = _run_sh(out, log, *SMALL_RUN)
    try:
        code = _finish(proc, 500)
        text = log.read_text()
        assert code == 0, text[-4000:]
        m = json.loads((out / "metrics.json").read_text())
        assert m["engine"] == "flower" and m["nodes"] == 20 and m["users_per_node"] == math.ceil(m["n_users"] / 20), text[-2000:]
        homes = _homes_of(text)
        assert len(homes) == 1 and homes[0].startswith("/tmp/fedpriv-run.") and not Path(homes[0]).exists()  # removed with the run
        assert f"127.0.0.1:{FLOWER_DEFAULT_PORTS[0]}" not in text
        if foreign is not None:  # the foreign SuperLink got no run: no app was installed under its home
            assert foreign.poll() is None
            assert not (foreign_home / "apps").exists() or not any((foreign_home / "apps").iterdir())
        assert pids_with_env("FLWR_HOME", homes[0]) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for s in listeners:
            s.close()
        if foreign is not None:
            stop_all(lambda: [foreign.pid] if foreign.poll() is None else [], 10.0)
            stop_all(lambda: pids_with_env("FLWR_HOME", str(foreign_home)), 5.0)


@pytest.mark.flower
def test_two_runs_at_once_each_finish_on_their_own_federation(tmp_path):
    """Two run.sh at once: different ports and homes, both finish with their own metrics. The
    second starts once the first has passed its install step (one pip at a time in one venv)."""
    outs = [tmp_path / "a", tmp_path / "b"]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    first = _run_sh(outs[0], logs[0], *SMALL_RUN)
    procs = [first]
    try:
        deadline = time.monotonic() + 300
        while not _homes_of(logs[0].read_text()):
            assert first.poll() is None, logs[0].read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        procs.append(_run_sh(outs[1], logs[1], *SMALL_RUN))
        codes = [_finish(p, 600) for p in procs]
        texts = [log.read_text() for log in logs]
        for code, text, out in zip(codes, texts, outs):
            assert code == 0, text[-4000:]
            assert json.loads((out / "metrics.json").read_text())["nodes"] == 20
        homes = [_homes_of(t)[0] for t in texts]
        assert homes[0] != homes[1]
        ports = [t.split("a local SuperLink of its own on 127.0.0.1:", 1)[1].split()[0] for t in texts]
        assert ports[0] != ports[1]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.flower
def test_a_rerun_of_run_sh_skips_pip_when_nothing_changed(tmp_path):
    """After a run the stamp in .venv matches: the next run says it skips pip (it still runs)."""
    stamp = ROOT / ".venv" / "fedpriv-install.stamp"
    if not stamp.exists():
        pytest.skip("no run of scripts/run.sh yet in this checkout (the other Flower tests of this file make one)")
    out, log = tmp_path / "out", tmp_path / "run.log"
    proc = _run_sh(out, log, *SMALL_RUN, "epsilon=1")
    code = _finish(proc, 500)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "no pip install" in text


@pytest.mark.flower
def test_plain_flwr_run_on_flowers_default_federation_finishes_and_its_stop_leaves_no_process(tmp_path):
    """Item 2: `flwr run .` as a Flower user types it (the venv's flwr, Flower's default local
    federation of 2 simulated nodes, no run-config override but the output folder), with the one
    documented setting (no runtime dependency installation) and, so as not to meet another test's
    SuperLink, free ports and its own FLWR_HOME. The app spreads the users over the 2 nodes and
    prints its summary; `python -m fedpriv.ops.first_run stop HOME` (the README's stop) leaves no
    process under that home (flwr itself leaves its SuperLink running)."""
    home = tmp_path / "home"
    env = {**os.environ, **run_env(), "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FEDPRIV_RUN_TOKEN", None)  # plain flwr run: no launcher, no token
    out = tmp_path / "out"
    try:
        run = subprocess.run(["flwr", "run", ".", "--stream", "--run-config", f"out='{out}'"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
        text = run.stdout + run.stderr
        assert run.returncode == 0, text[-3000:]
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["nodes"] == 2 and metrics["config"]["users_per_node"] == math.ceil(metrics["n_users"] / 2), (metrics["nodes"], metrics["config"])
        assert "epsilon spent" in text
    finally:
        stop = subprocess.run([sys.executable, "-m", "fedpriv.ops.first_run", "stop", str(home)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert pids_with_env("FLWR_HOME", str(home)) == []


def test_run_sh_exits_non_zero_when_most_replies_were_rejected(tmp_path):
    """Item 3: the main job's closing step (run.sh's summary block, run as run.sh runs it) exits 3
    on a metrics.json with 80% of the replies rejected, names why, and passes a clean one (the
    positive control) and the same with the limit raised (RUN_MAX_REJECTED)."""
    import re

    block = re.search(r"<<'PY'\n(.*?)\nPY\n", (ROOT / "scripts" / "run.sh").read_text(), re.S).group(1)
    log = [{"round": r, "nodes": 5} for r in ("info", "users", "mean", "bias")]
    doc = {"algorithm": "bias", "engine": "flwr run", "dataset": "synthetic", "round_log": log, "rejected_replies": []}
    clean, bad = tmp_path / "clean.json", tmp_path / "bad.json"
    clean.write_text(json.dumps(doc))
    bad.write_text(json.dumps({**doc, "rejected_replies": [{"round": "users", "node": 1, "reason": "malformed: junk"}] * 16}))

    def run(path, **env):
        return subprocess.run([sys.executable, "-", str(path)], input=block, capture_output=True, text=True, env={**os.environ, **env}, timeout=120)

    out = run(bad)
    assert out.returncode == 3 and "16 replies rejected" in out.stderr and "80.0%" in out.stderr, out.stderr
    assert run(clean).returncode == 0
    assert run(bad, RUN_MAX_REJECTED="0.9").returncode == 0
