"""fedpriv's Flower simulation on a Ray cluster of two hosts (``simulate(..., ray_address=...)``).

Two Linux network namespaces stand for two hosts (``tests/netns_hosts.py``: a veth pair on a
random 10.231.R.0/30, no other route). Host A runs ``ray start --head``, host B
``ray start --address A:PORT``, one CPU each, each with its own ``--temp-dir``. The driver (the
ServerApp: ``Job(...).prepare().execute(FlowerSimulation(ray_address="A:PORT"))``) runs inside A, as a Ray driver must run on a node of its cluster. The
namespaces share the filesystem, so the job's work dir is "shared storage" at the same path on
both hosts, as docs/how-to/ray-cluster.md requires.

Flower sizes its actor pool from the cluster: floor(1 CPU / 1 CPU per node) per host, so two
ClientApp actors that cannot share a host. The test checks in the cluster's actor table (and in
each host's own Ray logs) that they ran on A and on B, and that the result is the in-process
engine's under the same noise seed (ledger, valid/test RMSE, item factors and biases).

Every process of the cluster is stopped by PID (never ``ray stop``): those inside the two
namespaces and those naming the cluster's temp dir; then the namespaces (and the veth pair) are
deleted, also when the test fails, and the test asserts that nothing is left."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from netns_hosts import (Hosts, alive, cmdline, descendants, namespaces, netns_inode, netns_list, netns_pids, pid_netns_inode,
                         pids_naming, probe, terminate)

from fedpriv.flower.simulation import OFFLINE_ENV

pytestmark = pytest.mark.deployment

RAY = Path(sys.executable).parent / "ray"
DATA = "synthetic-mf:users=60,items=40,ratings=1500,seed=3"
USERS_PER_NODE, NODES = 10, 6  # 60 users: 6 partitions of 10
EPSILON, NOISE_SEED = 4.0, 31
TRAIN = {"rank": "2", "steps": "1"}  # one factor step: the nodes solve for user factors
GCS_PORT = 6379  # inside namespace A: no clash with any other Ray on the machine
START_SECONDS = 120  # per `ray start`
JOB_SECONDS = 420  # the driver script: cluster checks, the simulation, the actor table


@dataclasses.dataclass
class Cluster:
    hosts: Hosts
    address: str  # the head's GCS, A:PORT
    root: Path  # holds the two --temp-dir folders (a/ and b/)
    env: dict
    seen: set  # every PID of the cluster seen so far


# ------------------------------------------------------------------------------ processes
def _cluster_pids(hosts: Hosts, root: Path) -> list[int]:
    """Every process of this cluster: the ones in either namespace (only this test starts
    processes there), the ones naming its temp dir, and everything below them."""
    pids = set(netns_pids(hosts.ns_a)) | set(netns_pids(hosts.ns_b)) | set(pids_naming(str(root)))
    pids |= set(descendants(sorted(pids)))
    pids.discard(os.getpid())
    return sorted(pids)


def _stop(cluster: Cluster) -> None:
    """SIGTERM, then SIGKILL after 3 s (a throwaway cluster: GCS and raylet outlive SIGTERM by
    > 10 s), repeated while a raylet still starts something."""
    for _ in range(3):
        pids = _cluster_pids(cluster.hosts, cluster.root)
        cluster.seen.update(pids)
        if not pids:
            return
        terminate(pids, 3.0)


def _in_ns(ns: str, argv: list[str], env: dict, timeout: float, log: Path | None = None) -> tuple[int | None, str]:
    """Run ``argv`` inside namespace ``ns`` (``ip netns exec`` execs it: same PID, same
    environment); the exit code (None on timeout) and its output."""
    cmd = ["ip", "netns", "exec", ns, *argv]
    try:
        r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        code, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        code, out = None, f"{e.stdout or ''}{e.stderr or ''}\nno answer within {timeout} s"
        out = out if isinstance(out, str) else out.decode(errors="replace")
    if log is not None:
        log.write_text(out)
    return code, out


def _ray_start(cluster: Cluster, ns: str, args: list[str], temp_dir: Path) -> None:
    """``ray start ARGS`` in ``ns``; two attempts (on a loaded machine the raylet can miss Ray's
    fixed 30 s registration window); skips the test if Ray cannot start."""
    cmd = [str(RAY), "start", *args, "--num-cpus", "1", "--object-store-memory", str(100 * 2**20),
           "--disable-usage-stats", "--temp-dir", str(temp_dir)]
    for attempt in range(2):
        code, out = _in_ns(ns, cmd, cluster.env, START_SECONDS)
        if code == 0:
            return
        # whatever this attempt started in this namespace (the other host is left running)
        cluster.seen.update(netns_pids(ns))
        terminate(netns_pids(ns), 3.0)
    pytest.skip(f"Ray cannot start here: `ip netns exec {ns} {' '.join(cmd)}` failed twice ({code}):\n{out[-3000:]}")


@contextlib.contextmanager
def _two_host_cluster():
    """Host A (head) and host B (worker), one CPU each; everything stopped and deleted on exit."""
    if not RAY.exists() or not os.path.isdir("/proc"):
        pytest.skip("needs the `ray` CLI next to the Python interpreter and /proc (Linux)")
    # a short path, not tmp_path: Ray's Unix sockets live under it (108-byte limit)
    root = Path(tempfile.mkdtemp(prefix="fpr2-", dir="/tmp")).resolve()
    env = {**os.environ, **OFFLINE_ENV}  # the workers inherit the environment of `ray start`
    env.pop("RAY_ADDRESS", None)
    cluster = None
    try:
        with namespaces("fp-rayA", "fp-rayB", net="10.231") as hosts:
            cluster = Cluster(hosts, f"{hosts.a}:{GCS_PORT}", root, env, set())
            try:
                _ray_start(cluster, hosts.ns_a, ["--head", "--node-ip-address", hosts.a, "--port", str(GCS_PORT),
                                                 "--include-dashboard", "false"], root / "a")
                # B reaches A's GCS over the veth (a clear failure here, instead of Ray retrying)
                assert probe(hosts.ns_b, [cluster.address], wait=30.0) == {cluster.address: "open"}
                _ray_start(cluster, hosts.ns_b, ["--address", cluster.address, "--node-ip-address", hosts.b], root / "b")
                cluster.seen.update(_cluster_pids(hosts, root))
                yield cluster
            finally:
                _stop(cluster)
        # the namespaces are deleted (with them the veth pair), and nothing of the cluster runs
        assert hosts.ns_a not in netns_list() and hosts.ns_b not in netns_list(), netns_list()
        assert pids_naming(str(root)) == []
        left = [p for p in cluster.seen if alive(p)]
        assert left == [], f"processes of the Ray cluster still running: {[(p, cmdline(p)[:120]) for p in left]}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------------------ the driver
_DRIVER = r'''
import json, os, sys, time
import numpy as np

args = json.load(open(sys.argv[1]))
import ray
from fedpriv.run import FlowerSimulation, Job, _clean


def view():
    """The cluster as a fresh driver sees it: nodes, jobs (drivers) and actors (dead ones too)."""
    ray.init(address=args["address"], logging_level="ERROR", log_to_driver=False)
    try:
        return {
            "driver_ip": ray.util.get_node_ip_address(),
            "nodes": [{"id": n["NodeID"], "ip": n["NodeManagerAddress"], "alive": n["Alive"],
                       "cpus": n["Resources"].get("CPU", 0.0)} for n in ray.nodes()],
            "jobs": [{"id": j["JobID"], "pid": j.get("DriverPid"), "ip": j.get("DriverIPAddress"), "dead": j.get("IsDead")}
                     for j in ray._private.state.jobs()],
            "actors": [{"class": a["ActorClassName"], "state": a["State"], "ip": a["Address"]["IPAddress"],
                        "node": a["Address"]["NodeID"], "pid": a.get("Pid"), "job": a["JobID"]}
                       for a in ray._private.state.actors().values()],
        }
    finally:
        ray.shutdown()


before = view()
t0 = time.perf_counter()
plan = Job("adadpals", args["data"], epsilon=args["epsilon"], noise_seed=args["noise_seed"], params=args["overrides"]).prepare()
engine = FlowerSimulation(users_per_node=args["users_per_node"], nodes=args["nodes"], work_dir=args["work_dir"],
                          ray_address=args["address"], cpus_per_node=1.0)
outcome = plan.execute(engine)
metrics, ledger = outcome.report.to_json(), outcome.ledger
seconds = time.perf_counter() - t0
connected_after = ray.is_initialized()
after = view()
state = outcome.state
np.save(args["out"] + "-item_factors.npy", state.item_factors)
np.save(args["out"] + "-item_bias.npy", state.item_bias)
with open(args["out"] + ".json", "w") as f:
    json.dump({"pid": os.getpid(), "seconds": seconds, "metrics": metrics, "ledger": _clean(ledger), "before": before,
               "after": after, "connected_after": connected_after}, f)
'''


def _run_driver(cluster: Cluster, tmp_path: Path) -> dict:
    work = tmp_path / "work"  # the job's work dir: the same path on both "hosts" (one filesystem)
    work.mkdir()
    script, params, out = tmp_path / "driver.py", tmp_path / "driver-args.json", tmp_path / "driver-out"
    script.write_text(_DRIVER)
    params.write_text(json.dumps({
        "address": cluster.address, "data": DATA, "epsilon": EPSILON, "noise_seed": NOISE_SEED, "work_dir": str(work),
        "overrides": TRAIN, "users_per_node": USERS_PER_NODE, "nodes": NODES, "out": str(out),
    }))
    code, log = _in_ns(cluster.hosts.ns_a, [sys.executable, str(script), str(params)], cluster.env, JOB_SECONDS, tmp_path / "driver.log")
    assert code == 0, f"the driver in {cluster.hosts.ns_a} failed ({code}):\n{log[-6000:]}"
    res = json.loads(Path(f"{out}.json").read_text())
    res["item_factors"] = np.load(f"{out}-item_factors.npy")
    res["item_bias"] = np.load(f"{out}-item_bias.npy")
    return res


def _worker_logs(temp_dir: Path, pid: int) -> list[Path]:
    """Ray's log files of worker process ``pid`` in the sessions under ``temp_dir`` (one host's)."""
    return sorted(temp_dir.glob(f"session_*/logs/worker-*-{pid}.*"))


# ------------------------------------------------------------------------------ the test
def test_simulation_runs_its_nodes_on_two_ray_hosts(tmp_path):
    from fedpriv.run import _clean, run

    t0 = time.perf_counter()
    with _two_host_cluster() as cluster:
        hosts = cluster.hosts
        t_up = time.perf_counter() - t0
        # each host's Ray processes live in its own namespace ("on its host")
        for ns, host_dir in ((hosts.ns_a, "a"), (hosts.ns_b, "b")):
            raylets = [p for p in netns_pids(ns) if "/raylet" in cmdline(p).split(" ", 1)[0]]
            assert len(raylets) == 1, (ns, raylets)
            assert pid_netns_inode(raylets[0]) == netns_inode(ns)
            assert str(cluster.root / host_dir) in cmdline(raylets[0])

        t1 = time.perf_counter()
        res = _run_driver(cluster, tmp_path)
        t_job = time.perf_counter() - t1

        # the cluster before the run: two live nodes, A (head) and B, one CPU each
        ip_of = {n["id"]: n["ip"] for n in res["before"]["nodes"]}
        live = sorted((n["ip"], n["cpus"]) for n in res["before"]["nodes"] if n["alive"])
        assert live == sorted([(hosts.a, 1.0), (hosts.b, 1.0)]), res["before"]["nodes"]
        assert res["before"]["driver_ip"] == hosts.a

        # (1) the nodes' ClientApp actors ran on both hosts
        actors = [a for a in res["after"]["actors"] if a["class"] == "ClientAppActor"]
        where = sorted({a["ip"] for a in actors})
        assert where == sorted([hosts.a, hosts.b]), actors
        assert all(ip_of[a["node"]] == a["ip"] for a in actors), (actors, ip_of)
        # ... all of one job: the simulation's driver, the script in A (the cluster is still up
        # and the script is disconnected: a third driver listed the actors)
        (job,) = {a["job"] for a in actors}
        (sim_job,) = [j for j in res["after"]["jobs"] if j["id"] == job]
        assert sim_job["pid"] == res["pid"] and sim_job["ip"] == hosts.a and sim_job["dead"], sim_job
        assert not res["connected_after"]
        assert sorted((n["ip"], n["cpus"]) for n in res["after"]["nodes"] if n["alive"]) == live
        # ... and each actor's worker process logged into its own host's Ray temp dir
        for a in actors:
            own, other = (cluster.root / "a", cluster.root / "b") if a["ip"] == hosts.a else (cluster.root / "b", cluster.root / "a")
            assert _worker_logs(own, a["pid"]) and not _worker_logs(other, a["pid"]), (a, sorted(cluster.root.rglob("worker-*")))

        m = res["metrics"]
        assert m["engine"] == "flower" and m["nodes"] == NODES and m["users_per_node"] == USERS_PER_NODE
        assert m["rejected_replies"] == [] and "step1" in [r["round"] for r in m["round_log"]]

    # (2) the in-process engine's result under the same noise seed
    t2 = time.perf_counter()
    cap: dict = {}
    ref, ref_ledger = run("adadpals", DATA, epsilon=EPSILON, overrides={**TRAIN, "users_per_shard": str(USERS_PER_NODE)},
                          progress=False, capture=cap, noise_seed=NOISE_SEED)
    t_ref = time.perf_counter() - t2
    assert res["ledger"] == json.loads(json.dumps(_clean(ref_ledger)))
    assert np.allclose(res["item_factors"], cap["state"].item_factors, rtol=1e-4, atol=1e-5)
    assert np.allclose(res["item_bias"], cap["state"].item_bias, rtol=1e-4, atol=1e-5)
    for key in ("valid_rmse", "test_rmse", "epsilon_spent"):
        assert m[key] == pytest.approx(ref[key], rel=1e-6), key
    assert m["n_users"] == ref["n_users"] == 60 and res["item_factors"].shape == cap["state"].item_factors.shape

    by_ip = {ip: sum(a["ip"] == ip for a in actors) for ip in where}
    print(f"\nray two hosts ({hosts.ns_a} {hosts.a} head <-> {hosts.ns_b} {hosts.b}): ClientAppActor per host {by_ip}; "
          f"cluster up {t_up:.1f} s, driver {t_job:.1f} s (simulation {res['seconds']:.1f} s), in-process {t_ref:.1f} s, "
          f"total {time.perf_counter() - t0:.1f} s; test_rmse {m['test_rmse']:.5f}, epsilon {m['epsilon_spent']:.3f}, "
          f"{len(cluster.seen)} cluster processes stopped")
