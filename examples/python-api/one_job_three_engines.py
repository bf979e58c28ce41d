"""One job, checked once, run on three engines: the same epsilon and, under a noise seed, the
same model from each.

    python examples/python-api/one_job_three_engines.py [--data SPEC] [--flwr]

``Job(...).prepare()`` validates the job, loads and splits the data and calibrates nothing yet:
it returns a frozen plan (how many nodes a Flower run needs, the budget plan). ``plan.execute``
then trains on an engine: in this process over user shards, on Flower's runtime over an
in-memory grid of nodes, and (``--flwr``) with ``flwr run`` on Flower's local simulation
federation in a subprocess, as ``fedpriv run --engine flower`` does. Each returns a typed report
(``report.summary()``, ``report.to_json()`` is metrics.json), the ledger and the released model.

The noise seed makes the three runs comparable; leave it out for real use (the noise is then
secret OS randomness).
"""

from __future__ import annotations

import argparse

from fedpriv.ops.launcher import FlwrRun
from fedpriv.run import FlowerGrid, InProcess, Job
from fedpriv.testing.local_grid import LocalGrid


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="synthetic-mf:users=200,items=60,ratings=6000,seed=4")
    p.add_argument("--users-per-node", type=int, default=20)
    p.add_argument("--flwr", action="store_true", help="also run with `flwr run` in a subprocess (about half a minute)")
    args = p.parse_args()

    job = Job("adadpals", args.data, epsilon=3.0, noise_seed=7, params={"rank": 2, "steps": 2})
    plan = job.prepare()  # checked and split; nothing trained
    nodes = plan.partitions(args.users_per_node)
    print(f"{plan.n_users} training users -> {nodes} nodes of {args.users_per_node}")
    print(plan.budget().to_markdown())

    engines = {
        "in process": InProcess(users_per_shard=args.users_per_node),
        "Flower grid": FlowerGrid(grid=LocalGrid(nodes), users_per_node=args.users_per_node),
    }
    if args.flwr:
        engines["flwr run"] = FlwrRun(users_per_node=args.users_per_node, quiet=True)
    for name, engine in engines.items():
        out = plan.execute(engine)
        print(f"\n== {name}")
        print(out.report.summary())
        print(f"ledger: {[r['name'] for r in out.ledger]}")


if __name__ == "__main__":
    main()
