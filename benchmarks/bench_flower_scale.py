"""Simulation scale on Flower: one AdaDPALS alternating step with many nodes.

Usage:
  python benchmarks/bench_flower_scale.py --users 2000 --users-per-node 1          # 2,000 single-user nodes
  python benchmarks/bench_flower_scale.py --users 70000 --items 10700 --ratings 10000000 --users-per-node 100
Prints one JSON object: nodes, seconds of each round (the info round also starts the workers),
seconds and milliseconds per client message of the alternating step, bytes, and wall time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.flower.server_app import FlowerJob
from fedpriv.flower.simulation import simulate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--users", type=int, default=2000)
    p.add_argument("--items", type=int, default=1000)
    p.add_argument("--ratings", type=int, default=0, help="default: 50 per user")
    p.add_argument("--users-per-node", type=int, default=1)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--cpus-per-node", type=float, default=0.5)
    args = p.parse_args()
    ratings = args.ratings or 50 * args.users
    t0 = time.perf_counter()
    syn = make_mf(args.users, args.items, ratings, seed=0)
    split = random_split(syn.interactions, seed=1234)
    nodes = -(-split.train.n_users // args.users_per_node)
    cfg = ALSConfig(rank=args.rank, steps=1)
    job = FlowerJob("adadpals", 5.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), Path(tempfile.mkdtemp()), users_per_node=args.users_per_node, node_wait_seconds=600)
    t1 = time.perf_counter()
    res = simulate(job, nodes, cpus_per_node=args.cpus_per_node)
    wall = time.perf_counter() - t1
    step = next(r for r in res.round_log if r["round"] == "step1")
    # Flower's own per-message cost: the pre-processing rounds carry a few numbers per node
    small = [r for r in res.round_log if r["round"] in ("users", "mean", "counts")]
    floor = min((r["seconds"] for r in small), default=float("nan"))
    print(json.dumps({
        "users": args.users, "items": args.items, "ratings": ratings, "users_per_node": args.users_per_node, "nodes": nodes,
        "prepare_seconds": t1 - t0, "simulation_wall_seconds": wall,
        "rounds": res.round_log,
        "step_seconds": step["seconds"], "step_ms_per_client_message": 1000 * step["seconds"] / nodes,
        "small_round_ms_per_client_message": 1000 * floor / nodes,  # Flower's floor on this machine
        "step_bytes_up": step["bytes_up"], "step_bytes_down": step["bytes_down"],
        "rejected": len(res.rejected), "valid_rmse": res.valid_rmse,
    }, indent=2))


if __name__ == "__main__":
    main()
