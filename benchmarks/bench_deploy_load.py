"""Load on Flower's deployment runtime: one SuperLink and many SuperNodes on loopback (gRPC,
TLS and SuperNode authentication unless --insecure), each node holding only its users' ratings
(`deploy up --data`: the partition step; the server starts from the public metadata), one
AdaDPALS job with a single alternating step.

Usage:
  python benchmarks/bench_deploy_load.py                        # 50 then 100 SuperNodes, 10 users each
  python benchmarks/bench_deploy_load.py --nodes 10 --users-per-node 20 --aggregation secure
Prints one JSON object with one entry per node count: seconds to start the deployment (`deploy
up`: certificates, keys, partition, SuperLink, node registration, nodes online), seconds of every
round of the job (metrics.json round_log; every round starts one `flwr-clientapp` process per
node), the mean seconds per round, wall seconds of `flwr run`, peak memory (the rise of used
memory over the machine's level before the deployment started, sampled every 0.5 s), and the CPU
seconds per ClientApp process (user + system time of the `flwr-clientapp` processes, read from
the SuperExec processes that start and reap them, over the job, divided by the launches). Every
process is stopped at the end, also on failure.

Each SuperNode keeps two Python processes (SuperNode, SuperExec) and each message starts a
`flwr-clientapp` process. Flower 1.39 returns a claimed task to pending when its process has not
started within 30 s and starts another process for it: on a host with too few cores for the node
count the processes pile up (``clientapp_launches`` above ``messages_to_nodes``). The run is
stopped when available memory falls below --min-free-gb.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from fedpriv.ops import deploy, launcher


def _mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def _mem_used_gb() -> float:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 2**20


def _children_cpu_seconds(pids: list[int]) -> float:
    """cutime + cstime of ``pids``: the CPU of their reaped children (the ClientApp processes)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[13]) + int(fields[14])  # fields 16 and 17 of proc(5): cutime, cstime
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", default="50,100", help="comma-separated node counts, run one after the other")
    p.add_argument("--insecure", action="store_true", help="no TLS and no node authentication")
    p.add_argument("--aggregation", choices=("central", "secure"), default="central",
                   help="central (default: the runtime's cost per round) or secure (SecAgg rounds: several per release)")
    p.add_argument("--users-per-node", type=int, default=10)
    p.add_argument("--items", type=int, default=100)
    p.add_argument("--ratings-per-user", type=int, default=20)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--run-dir", default=None, help="deployment folder (default: a temporary one, removed)")
    p.add_argument("--min-free-gb", type=float, default=2.5, help="stop everything when available memory falls below this")
    p.add_argument("--timeout", type=float, default=3600.0)
    args = p.parse_args()
    runs = []
    for n in str(args.nodes).split(","):
        if n.strip():
            runs.append(_one(args, int(n)))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # each node count as it ends
    print(json.dumps({"benchmark": "deploy_load", "cores": os.cpu_count(), "runs": runs}))


def _one(args, nodes: int) -> dict:
    users = nodes * args.users_per_node
    data = f"synthetic-mf:users={users},items={args.items},ratings={users * args.ratings_per_user},seed=1"
    tmp = None if args.run_dir else tempfile.TemporaryDirectory(prefix="fedpriv-bench-deploy-")
    run_dir = Path(args.run_dir or tmp.name) / "run"
    secure = not args.insecure
    cfg = deploy.DeployConfig(run_dir=run_dir, nodes=nodes, tls=secure, auth=secure, data=data, users_per_node=args.users_per_node, fleet_port=0, control_port=0, node_port_base=0)

    base_used = _mem_used_gb()
    low = {"gb": _mem_available_gb(), "clientapps": 0, "aborted": False, "peak_used": base_used, "queued": 0}
    done = threading.Event()

    def watch():
        while not done.wait(0.5):
            low["gb"] = min(low["gb"], _mem_available_gb())
            low["peak_used"] = max(low["peak_used"], _mem_used_gb())
            low["clientapps"] = max(low["clientapps"], len(launcher.pids_matching("bin/python", "bin/flwr-clientapp")))  # running
            low["queued"] = max(low["queued"], len(launcher.pids_matching("clientapp-gate/flwr-clientapp")))  # waiting at the gate
            if low["gb"] < args.min_free_gb and not low["aborted"]:
                low["aborted"] = True
                deploy.stop(cfg.run_dir, 5.0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    result: dict = {"nodes": nodes, "users_per_node": args.users_per_node, "data": data, "tls": secure, "auth": secure, "aggregation": args.aggregation}
    try:
        deploy.up(cfg, wait=1800)
        result["up_seconds"] = time.perf_counter() - t0
        # the SuperNodes' SuperExecs (they start and reap the ClientApp processes); their command
        # lines do not name the run folder: every SuperExec on this host (the benchmark's own)
        execs = launcher.pids_matching("flower-superexec", "--parent-pid")
        cpu0 = _children_cpu_seconds(execs)
        launches0 = _launches(cfg)
        t1 = time.perf_counter()
        m = deploy.run_deployed_job(cfg, "adadpals", epsilon=1.0, overrides={"steps": "1", "rank": str(args.rank)}, node_wait=900, quiet=True,
                           timeout=args.timeout, aggregation=args.aggregation)
        result["run_wall_seconds"] = time.perf_counter() - t1
        time.sleep(2.0)  # the last ClientApp processes exit and are reaped
        launched = _launches(cfg) - launches0
        result["superexec_processes"] = len(execs)
        result["clientapp_cpu_seconds_total"] = round(_children_cpu_seconds(execs) - cpu0, 2)
        result["clientapp_cpu_seconds_per_message"] = round(result["clientapp_cpu_seconds_total"] / launched, 3) if launched else None
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
        result["clientapp_launches"] = _launches(cfg)
        result["messages_to_nodes"] = sum(result.get("replies", {}).values()) if "replies" in result else None
        done.set()
        watcher.join()
        if tmp is not None:
            tmp.cleanup()
    result["total_wall_seconds"] = time.perf_counter() - t0
    result["min_mem_available_gb"] = round(low["gb"], 2)
    result["peak_memory_gb"] = round(low["peak_used"] - base_used, 2)
    result["max_concurrent_clientapps"] = low["clientapps"]
    result["max_queued_at_gate"] = low["queued"]
    result["aborted_low_memory"] = low["aborted"]
    return result


def _launches(cfg) -> int:
    n = 0
    for log in cfg.logs_dir.glob("supernode-*.log"):
        n += log.read_text(errors="replace").count("Start `flwr-clientapp` process")
    return n


if __name__ == "__main__":
    main()
