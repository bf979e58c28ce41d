"""Load on Flower's deployment runtime: one SuperLink and many SuperNodes on loopback (gRPC,
insecure: no TLS and no node authentication), one AdaDPALS job with a single alternating step.

Usage:
  python benchmarks/bench_deploy_load.py                       # 50 SuperNodes, 10 users each
  python benchmarks/bench_deploy_load.py --nodes 10 --users-per-node 20
Prints one JSON object: nodes, seconds to start the deployment (`deploy up`: SuperLink, nodes
online), seconds of every round of the job (metrics.json round_log; every round starts one
`flwr-clientapp` process per node), wall seconds of `flwr run` and of the whole benchmark, and
the lowest available memory seen. Every process is stopped at the end, also on failure.

Each SuperNode keeps two Python processes (SuperNode, SuperExec, about 0.18 GB together) and
each message starts a `flwr-clientapp` process that imports flwr and fedpriv (about 2 + 4.5 s of
CPU and 0.2 GB of private memory; all nodes at once). Flower 1.39 returns a claimed task to
pending when its process has not started within 30 s and starts another process for it: on a
host with too few cores for the node count the processes pile up (``clientapp_launches`` above
``messages_to_nodes``). The run is stopped when available memory falls below --min-free-gb.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from fedpriv.flower import deploy, launcher


def _mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=50)
    p.add_argument("--users-per-node", type=int, default=10)
    p.add_argument("--items", type=int, default=100)
    p.add_argument("--ratings-per-user", type=int, default=20)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--run-dir", default=None, help="deployment folder (default: a temporary one, removed)")
    p.add_argument("--min-free-gb", type=float, default=2.5, help="stop everything when available memory falls below this")
    p.add_argument("--timeout", type=float, default=3600.0)
    args = p.parse_args()

    users = args.nodes * args.users_per_node
    data = f"synthetic-mf:users={users},items={args.items},ratings={users * args.ratings_per_user},seed=1"
    tmp = None if args.run_dir else tempfile.TemporaryDirectory(prefix="fedpriv-bench-deploy-")
    run_dir = Path(args.run_dir or tmp.name) / "run"
    cfg = deploy.DeployConfig(run_dir=run_dir, nodes=args.nodes, tls=False, auth=False, data=data, users_per_node=args.users_per_node, fleet_port=0, control_port=0, node_port_base=0)

    low = {"gb": _mem_available_gb(), "clientapps": 0, "aborted": False}
    done = threading.Event()

    def watch():
        while not done.wait(0.5):
            low["gb"] = min(low["gb"], _mem_available_gb())
            low["clientapps"] = max(low["clientapps"], len(launcher._pids_matching("flwr-clientapp")))  # noqa: SLF001
            if low["gb"] < args.min_free_gb and not low["aborted"]:
                low["aborted"] = True
                deploy.stop(cfg.run_dir, 5.0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    result: dict = {"nodes": args.nodes, "users_per_node": args.users_per_node, "data": data, "tls": False, "auth": False}
    try:
        deploy.up(cfg, wait=900)
        result["up_seconds"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        m = deploy.run_job(cfg, "adadpals", epsilon=1.0, overrides={"steps": "1", "rank": str(args.rank)}, node_wait=600, quiet=True, timeout=args.timeout)
        result["run_wall_seconds"] = time.perf_counter() - t1
        result["round_seconds"] = {r["round"]: round(r["seconds"], 2) for r in m["round_log"]}
        result["replies"] = {r["round"]: r["replies"] for r in m["round_log"]}
        result["seconds_per_round"] = sum(r["seconds"] for r in m["round_log"]) / len(m["round_log"])
        result["step_round_seconds"] = result["round_seconds"].get("step1")
        result["server_wall_seconds"] = m["wall_seconds"]
        result["rejected_replies"] = len(m["rejected_replies"])
        result["test_rmse"] = m.get("test_rmse")
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        t_stop = time.perf_counter()
        deploy.stop(cfg.run_dir)
        result["down_seconds"] = time.perf_counter() - t_stop
        # ClientApp processes the SuperNodes started: one per message, more when Flower relaunched
        # tasks whose process did not start within its 30 s claim window (an overloaded host)
        launches = 0
        for log in cfg.logs_dir.glob("supernode-*.log"):
            launches += log.read_text(errors="replace").count("Start `flwr-clientapp` process")
        result["clientapp_launches"] = launches
        result["messages_to_nodes"] = sum(result.get("replies", {}).values()) if "replies" in result else None
        done.set()
        watcher.join()
        if tmp is not None:
            tmp.cleanup()
    result["total_wall_seconds"] = time.perf_counter() - t0
    result["min_mem_available_gb"] = round(low["gb"], 2)
    result["max_concurrent_clientapps"] = low["clientapps"]
    result["aborted_low_memory"] = low["aborted"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
