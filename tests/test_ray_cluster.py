"""fedpriv's Flower simulation on an existing Ray cluster (``simulate(..., ray_address=...)``).

A private Ray head is started for this module with ``ray start --head`` on this host: its own
``--temp-dir`` (so it does not become the "current cluster" that a plain ``ray.init()`` elsewhere
on the machine would join), its own free ports, 2 CPUs. It is stopped by PID at the end (never
``ray stop``, which would stop every Ray instance on the machine). See docs/how-to/ray-cluster.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_agreement import assert_same_as_inprocess

from fedpriv.errors import FedprivError
from fedpriv.flower.simulation import OFFLINE_ENV, check_ray_address, simulate
from fedpriv.privacy.randomness import RunSecrets

pytestmark = pytest.mark.deployment

RAY = Path(sys.executable).parent / "ray"
START_SECONDS = 120


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ process helpers
from fedpriv.ops.launcher import descendant_pids, process_cmdline, terminate_pids  # noqa: E402


def _head_pids(temp_dir: Path, gcs_port: int) -> list[int]:
    """The processes of our head: those naming its temp dir (GCS, raylet, monitors, dashboard),
    the Ray Client proxy (names its GCS address), and everything below them (workers, agents)."""
    gcs = re.compile(rf"--(?:gcs-)?address=\S+:{gcs_port}\b")
    me = os.getpid()
    roots = []
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        cmd = process_cmdline(pid)
        if pid != me and cmd and (str(temp_dir) in cmd or ("ray" in cmd and gcs.search(cmd))):
            roots.append(pid)
    return sorted(set(roots) | set(descendant_pids(roots)))


def _stop_head(temp_dir: Path, gcs_port: int) -> None:
    # a throwaway head: GCS and raylet outlive SIGTERM by > 10 s, so SIGKILL after 3 s
    terminate_pids(_head_pids(temp_dir, gcs_port), 3.0)


# ------------------------------------------------------------------------------ the head
@dataclass
class Head:
    address: str  # as a user would pass it: 127.0.0.1:PORT
    port: int
    temp_dir: Path
    env: dict


def _cluster_info(head: Head) -> dict:
    """Connect a fresh driver to the cluster (in a subprocess): its CPUs and the PIDs of every
    driver (job) it has seen, with whether that job has ended."""
    code = (
        "import json, ray\n"
        f"ray.init(address={head.address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "jobs = [{'pid': j.get('DriverPid'), 'dead': j.get('IsDead'), 'entrypoint': j.get('Entrypoint', '')} for j in ray._private.state.jobs()]\n"
        "print('INFO' + json.dumps({'cpus': ray.cluster_resources().get('CPU'), 'nodes': len([n for n in ray.nodes() if n['Alive']]), 'jobs': jobs}))\n"
        "ray.shutdown()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=head.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("INFO")][-1]
    return json.loads(line[4:])


@pytest.fixture(scope="module")
def ray_head():
    if not RAY.exists() or not os.path.isdir("/proc"):
        pytest.skip("needs the `ray` CLI next to the Python interpreter and /proc (Linux)")
    # short path: Ray's Unix sockets live under it (108-byte limit)
    temp_dir = Path(tempfile.mkdtemp(prefix="fpray-", dir="/tmp")).resolve()
    env = {**os.environ, **OFFLINE_ENV}  # the workers inherit the environment of `ray start`
    env.pop("RAY_ADDRESS", None)
    ports: list[int] = []
    try:
        # two attempts: on a loaded machine the raylet can miss Ray's fixed 30 s registration
        # window ("The current node timed out during startup")
        for _ in range(2):
            port = _free_port()
            ports.append(port)
            cmd = [
                str(RAY), "start", "--head",
                "--node-ip-address", "127.0.0.1",
                "--port", str(port),
                "--ray-client-server-port", str(_free_port()),  # default 10001: would clash with another head
                "--dashboard-agent-listen-port", str(_free_port()),
                "--num-cpus", "2",
                "--include-dashboard", "false",
                "--disable-usage-stats",
                "--temp-dir", str(temp_dir),
            ]  # fmt: skip
            try:
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=START_SECONDS)
                code, log = r.returncode, f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
            except subprocess.TimeoutExpired:
                code, log = None, f"no answer within {START_SECONDS} s"
            if code == 0:
                break
            _stop_head(temp_dir, port)  # whatever this attempt started
        else:
            pytest.fail(f"`ray start --head` failed twice ({code}):\n{log}")
        yield Head(f"127.0.0.1:{port}", port, temp_dir, env)
    finally:
        left = []
        for port in ports:
            _stop_head(temp_dir, port)
            left += _head_pids(temp_dir, port)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert left == [], f"Ray head processes still running: {left}"


@pytest.fixture(scope="module")
def small_job():
    from fedpriv.algorithms.als import ALSConfig
    from fedpriv.data.splits import random_split
    from fedpriv.data.synthetic import make_mf

    syn = make_mf(20, 60, 20 * 25, seed=4)
    split = random_split(syn.interactions, seed=1234)
    cfg = ALSConfig(rank=3, steps=2)  # adadpals (it reads no sampling rate)
    return split, cfg


def _make_job(small_job, work_dir):
    from fedpriv.flower.server_app import FlowerJob

    split, cfg = small_job
    return FlowerJob("adadpals", 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), work_dir, users_per_node=1, secrets=RunSecrets(31))


def _assert_same_as_inprocess(res, small_job):
    from fedpriv.engine.inprocess import train_inprocess

    split, cfg = small_job
    ref = train_inprocess("adadpals", split.train, cfg, rating_range=(1.0, 5.0), epsilon=4.0, users_per_shard=1, progress=False, secrets=RunSecrets(31))
    assert_same_as_inprocess(res, ref, split)
    assert res.rounds == 6 and res.rejected == []


def _our_jobs(info: dict) -> int:
    return sum(1 for j in info["jobs"] if j["pid"] == os.getpid())


# ------------------------------------------------------------------------------ tests
def test_simulation_runs_on_the_cluster_and_leaves_it_running(ray_head, small_job, tmp_path, monkeypatch):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    before = _cluster_info(ray_head)
    assert before["cpus"] == 2.0 and before["nodes"] == 1
    res = simulate(_make_job(small_job, tmp_path), num_nodes=20, ray_address=ray_head.address)
    _assert_same_as_inprocess(res, small_job)
    assert not ray.is_initialized()  # Flower's ray.shutdown() disconnected this process ...
    after = _cluster_info(ray_head)  # ... and the cluster is still up, with the same resources
    assert after["cpus"] == 2.0 and after["nodes"] == 1
    # the simulation really was a driver of this cluster (not a private local Ray): one more job
    # from this process, finished
    assert _our_jobs(after) == _our_jobs(before) + 1
    assert all(j["dead"] for j in after["jobs"] if j["pid"] == os.getpid())
    status = subprocess.run([str(RAY), "status", "--address", ray_head.address], env=ray_head.env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and re.search(r"Active:\s*\n\s*1 node_", status.stdout), status.stdout + status.stderr


def test_ray_address_environment_variable_is_honoured(ray_head, small_job, tmp_path, monkeypatch):
    """Without ``ray_address``, Ray's own rule applies: ``RAY_ADDRESS`` names the cluster."""
    monkeypatch.setenv("RAY_ADDRESS", ray_head.address)
    before = _our_jobs(_cluster_info(ray_head))
    res = simulate(_make_job(small_job, tmp_path), num_nodes=20)
    _assert_same_as_inprocess(res, small_job)
    assert _our_jobs(_cluster_info(ray_head)) == before + 1


def test_unreachable_or_malformed_address_fails_fast():
    """Ray itself retries an unreachable GCS address for minutes (measured: > 5 min, no error)."""
    closed = _free_port()  # nothing listens there (bound and released)
    t0 = time.monotonic()
    with pytest.raises(FedprivError, match="cannot reach the Ray cluster"):
        check_ray_address(f"127.0.0.1:{closed}")
    assert time.monotonic() - t0 < 10
    for bad in ("", "10.0.0.1", "http://10.0.0.1:6379", "10.0.0.1:port", "10.0.0.1:70000"):
        with pytest.raises(FedprivError, match="ray_address"):
            check_ray_address(bad)
    assert check_ray_address("local") == "local" and check_ray_address(" auto ") == "auto"


def test_an_existing_ray_connection_is_not_silently_reused(ray_head, small_job, tmp_path, monkeypatch):
    """Flower ignores init_args (so the address) when this process is already connected."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.init(address=ray_head.address, logging_level="ERROR", log_to_driver=False)
    try:
        with pytest.raises(FedprivError, match="already initialized"):
            simulate(_make_job(small_job, tmp_path), num_nodes=20, ray_address=ray_head.address)
    finally:
        ray.shutdown()
    assert _cluster_info(ray_head)["nodes"] == 1
