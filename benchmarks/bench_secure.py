"""Secure against central aggregation: the cost of the SecAgg+ rounds with distributed noise.

Usage:
  python benchmarks/bench_secure.py                       # 100 and 1,000 single-user nodes, 20 nodes of 50 users
  python benchmarks/bench_secure.py --setups 100x1 --ray  # one setup, on the Ray simulation instead

Each setup runs one AdaDPALS job (users, mean and counts releases, then one alternating step) in
central mode and in secure mode, one run each, over the real ClientApp: by default on the
in-process grid (fedpriv.testing.local_grid: every message handled in this process, so the
seconds are the protocol's computation, not Ray's messaging), with ``--ray`` on Flower's
simulation. Prints one JSON object per setup and mode: protocol rounds, rounds per release,
bytes up and down per node of the step's release (and of the whole job), seconds per release,
and the ratio of the step's bytes up per node to the dense statistics vector (float64 words).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from fedpriv.algorithms import secure
from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.engine.inprocess import new_state
from fedpriv.testing.local_grid import LocalGrid
from fedpriv.flower.node_policy import NodePolicy
from fedpriv.flower.server_app import FlowerJob, run_job
from fedpriv.privacy.accounting import BestOfAccountant


def _setup(spec: str) -> tuple[int, int]:
    nodes, users = spec.lower().split("x")
    return int(nodes), int(users)


def _release_rounds(log: list[dict], name: str) -> list[dict]:
    """The rounds of one release: its own round and, in secure mode, its share/unmask rounds."""
    return [r for r in log if r["round"] == name or r["round"].startswith(f"{name}:")]


def run_one(nodes: int, users_per_node: int, mode: str, items: int, ratings_per_user: int, rank: int, ray: bool) -> dict:
    users = nodes * users_per_node
    # every user keeps at least a few ratings in train: ratings_per_user / 0.8 before the split
    syn = make_mf(users, items, int(users * ratings_per_user / 0.8), seed=0)
    split = random_split(syn.interactions, seed=1234)
    cfg = ALSConfig.from_overrides({"rank": str(rank), "steps": "1", "aggregation": mode})
    job = FlowerJob("adadpals", 5.0, 1e-5, cfg, split.train, None, None, (1.0, 5.0), Path(tempfile.mkdtemp()),
                    users_per_node=users_per_node, checkpoint=False, node_wait_seconds=600)
    n_nodes = -(-split.train.n_users // users_per_node)
    t0 = time.perf_counter()
    if ray:
        from fedpriv.flower.simulation import simulate

        res = simulate(job, n_nodes, cpus_per_node=0.5)
    else:
        # the nodes' own policy from the run's options (as the launcher writes it): in secure mode
        # every node counts its peers and checks every member's and survivor's signature
        policy = NodePolicy.for_config(cfg, epsilon=5.0, delta=1e-5, nodes=n_nodes, reproducible=False)
        res = run_job(LocalGrid(n_nodes, node_policy=policy), job)
    wall = time.perf_counter() - t0
    state, _ = new_state("adadpals", cfg, split.train, (1.0, 5.0), False, 5.0, 1e-5)
    dense_words = sum(p.length for p in secure.declared("step", state))  # the step's statistics, dense
    releases = {}
    for name in ("users", "mean", "counts", "step1"):
        rr = _release_rounds(res.round_log, name)
        releases[name] = {
            "rounds": len(rr),
            "seconds": sum(r["seconds"] for r in rr),
            "bytes_up_per_node": sum(r["bytes_up"] for r in rr) / n_nodes,
            "bytes_down_per_node": sum(r["bytes_down"] for r in rr) / n_nodes,
        }
    step = releases["step1"]
    return {
        "mode": mode, "nodes": n_nodes, "users_per_node": users_per_node, "items": items, "rank": rank,
        "grid": "ray simulation" if ray else "in-process LocalGrid (real ClientApp)",
        "protocol_rounds": res.rounds, "releases": releases,
        "step_rounds": step["rounds"], "step_seconds": step["seconds"],
        "step_bytes_up_per_node": step["bytes_up_per_node"], "step_bytes_down_per_node": step["bytes_down_per_node"],
        "dense_step_statistics_bytes": 8 * dense_words,
        "step_bytes_up_over_dense": step["bytes_up_per_node"] / (8 * dense_words),
        "job_bytes_up_per_node": res.bytes_up / n_nodes, "job_bytes_down_per_node": res.bytes_down / n_nodes,
        "wall_seconds": wall, "rejected": len(res.rejected),
        "epsilon_spent": BestOfAccountant().epsilon(res.ledger.releases, 1e-5),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--setups", nargs="*", default=["100x1", "1000x1", "20x50"], help="NODESxUSERS_PER_NODE")
    p.add_argument("--items", type=int, default=300)
    p.add_argument("--ratings-per-user", type=int, default=20)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--ray", action="store_true")
    args = p.parse_args()
    out = []
    for spec in args.setups:
        nodes, upn = _setup(spec)
        pair = {m: run_one(nodes, upn, m, args.items, args.ratings_per_user, args.rank, args.ray) for m in ("central", "secure")}
        pair["secure"]["extra_rounds_per_release"] = pair["secure"]["step_rounds"] - pair["central"]["step_rounds"]
        pair["secure"]["key_rounds_per_run"] = pair["secure"]["protocol_rounds"] - sum(r["rounds"] for r in pair["secure"]["releases"].values()) - (pair["central"]["protocol_rounds"] - sum(r["rounds"] for r in pair["central"]["releases"].values()))
        pair["secure"]["seconds_per_release_ratio"] = pair["secure"]["step_seconds"] / pair["central"]["step_seconds"]
        out.append({"setup": spec, **pair})
        print(json.dumps(out[-1]), flush=True)


if __name__ == "__main__":
    main()
