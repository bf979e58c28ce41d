"""Secure against central aggregation on a real data set: test RMSE and epsilon spent of one
algorithm over Flower messages, both modes, at several epsilons and noise seeds.

Usage:
  python simulations/secure_vs_central.py --data ml-100k:../shared/data/ml-100k/ml-100k.zip \
      --epsilons 1 5 20 --seeds 1 2 3 --users-per-node 20 --out results/secure_vs_central

Each run is `fedpriv run ALGORITHM --engine flower --aggregation MODE` (fedpriv.run.run) with the
real ClientApp and ServerApp; ``--grid local`` (default) delivers the messages in process
(fedpriv.testing.local_grid), ``--grid ray`` on Flower's simulation. The same noise seed in both
modes gives both the same split and initialisation, not the same noise (central draws Gaussian
noise in the ledger; secure mode's nodes draw Skellam shares). Writes runs.csv and summary.json
(per epsilon: mean and standard deviation of test RMSE per mode, their difference, epsilon spent),
beside the non-private ALS and the private bias-free baseline of the same split.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
from pathlib import Path

from fedpriv.util import atomic
from fedpriv.testing.local_grid import LocalGrid
from fedpriv.flower.server_app import run_job
from fedpriv.run import run


def _one(algorithm: str, data: str, epsilon: float | None, mode: str | None, seed: int, upn: int, grid: str, extra: dict) -> dict:
    overrides = {"users_per_node": str(upn), **extra}
    if mode is not None:
        overrides["aggregation"] = mode
    runner = None if grid == "ray" else (lambda job, n_nodes: run_job(LocalGrid(n_nodes), job))
    metrics, _ = run(algorithm, data, epsilon=epsilon, overrides=overrides, engine="flower", progress=False, flower_runner=runner, noise_seed=seed, second_opinion=False)
    return {"algorithm": algorithm, "mode": mode or "-", "epsilon": epsilon, "seed": seed, "test_rmse": metrics["test_rmse"],
            "valid_rmse": metrics["valid_rmse"], "epsilon_spent": metrics.get("epsilon_spent"), "rounds": metrics.get("rounds"),
            "bytes_up": metrics.get("bytes_up"), "bytes_down": metrics.get("bytes_down"), "wall_seconds": metrics.get("wall_seconds")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--algorithm", default="adadpals")
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 5.0, 20.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--users-per-node", type=int, default=20)
    p.add_argument("--grid", choices=("local", "ray"), default="local")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.overrides)
    rows = [_one("als", args.data, None, None, args.seeds[0], args.users_per_node, args.grid, {})]
    print(json.dumps(rows[-1]), flush=True)
    for eps in args.epsilons:
        for seed in args.seeds:
            for mode in ("central", "secure"):
                rows.append(_one(args.algorithm, args.data, eps, mode, seed, args.users_per_node, args.grid, extra))
                print(json.dumps(rows[-1]), flush=True)
    summary = {"data": args.data, "algorithm": args.algorithm, "users_per_node": args.users_per_node, "grid": args.grid,
               "nonprivate_als_test_rmse": rows[0]["test_rmse"], "by_epsilon": {}}
    for eps in args.epsilons:
        per = {}
        for mode in ("central", "secure"):
            r = [x for x in rows if x["epsilon"] == eps and x["mode"] == mode]
            per[mode] = {"test_rmse_mean": statistics.mean(x["test_rmse"] for x in r), "test_rmse_sd": statistics.stdev(x["test_rmse"] for x in r) if len(r) > 1 else 0.0,
                         "epsilon_spent": sorted({round(x["epsilon_spent"], 6) for x in r}), "rounds": r[0]["rounds"],
                         "bytes_up": statistics.mean(x["bytes_up"] for x in r), "wall_seconds": statistics.mean(x["wall_seconds"] for x in r)}
        per["secure_minus_central"] = per["secure"]["test_rmse_mean"] - per["central"]["test_rmse_mean"]
        summary["by_epsilon"][str(eps)] = per
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[1]))
    w.writeheader()
    w.writerows(rows)
    atomic.write_text(out / "runs.csv", buf.getvalue())
    atomic.write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
