"""Hyperparameter search on ML-100K validation RMSE at a fixed epsilon (issue 2's comparison).

Random search with the same budget and the same shared search space for every DP method (plus
each method's own parameters), selection on validation RMSE only; the best configuration is
then re-run with several noise seeds and its test RMSE reported as mean and standard deviation.
The search itself is written out in full.

Note: this search looks at the validation data many times and is not itself private; it is the
usual non-private tuning protocol of the DP recommendation literature (private tuning is a
separate option, see issue 5).

Usage: python simulations/tune_ml100k.py --data ml-100k:../shared/data/ml-100k/ml-100k.zip \
           --epsilon 5 --trials 40 --out results/tune_ml100k
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from fedpriv.data.spec import load_spec, parse_data_spec
from fedpriv.run import run

SHARED = {
    "rank": [1, 2, 3, 5],
    "steps": [1, 2, 3],
    "reg_item_private": [0.5, 1.0, 2.0, 5.0, 10.0, 20.0],
    "reg_user": [0.05, 0.1, 0.2],
    "rating_clip": [0.5, 1.0, 2.0],
    "share_b": [0.3, 0.5, 0.7],
    "bias_share": [0.1, 0.25, 0.5],
}
OWN = {
    "dpals-uniform": {"k": [10, 20, 50, 100, 200]},
    "dpals-tail": {"k": [10, 20, 50, 100, 200]},
    "adadpals": {"mu": [0.0, 0.25, 0.5, 1.0], "weight_mode": ["clip", "normalize"], "beta_bar_ratio": [0.5, 1.0, 2.0]},
}
ALS_GRID = [{"rank": r, "reg_user": g, "reg_item": g, "steps": 10} for r in (5, 10, 20) for g in (0.05, 0.1, 0.15, 0.2)]


def sample(space: dict, rng: np.random.Generator) -> dict:
    return {k: v[int(rng.integers(len(v)))] for k, v in space.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="ml-100k:../shared/data/ml-100k/ml-100k.zip")
    p.add_argument("--epsilon", type=float, default=5.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", default="results/tune_ml100k")
    args = p.parse_args()
    spec = parse_data_spec(args.data)
    ds = load_spec(spec)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    search: list[dict] = []
    best: dict[str, dict] = {}

    def trial(alg: str, params: dict, eps: float | None, seed: int = 1234) -> dict:
        m, _ = run(alg, spec, dataset=ds, epsilon=eps, delta=args.delta, overrides={**params, "seed": seed}, progress=False)
        row = {"algorithm": alg, "params": params, "seed": seed, "valid_rmse": m["valid_rmse"], "test_rmse": m["test_rmse"], "epsilon_spent": m["epsilon_spent"]}
        search.append(row)
        print(json.dumps(row), flush=True)
        return row

    t0 = time.time()
    rows = [trial("als", g, None) for g in ALS_GRID]
    best["als"] = min(rows, key=lambda r: r["valid_rmse"])
    for alg, own in OWN.items():
        rng = np.random.default_rng(2024)  # same shared draws for every method
        rows = [trial(alg, {**sample(SHARED, rng), **sample(own, np.random.default_rng([2024, i]))}, args.epsilon) for i in range(args.trials)]
        best[alg] = min(rows, key=lambda r: r["valid_rmse"])

    summary = []
    for alg, b in best.items():
        eps = None if alg == "als" else args.epsilon
        reruns = [trial(alg, b["params"], eps, seed=1234 + s) for s in range(args.seeds)] if eps else [b]
        tests = np.array([r["test_rmse"] for r in reruns])
        summary.append({
            "algorithm": alg,
            "epsilon": eps,
            "best_params": b["params"],
            "valid_rmse_at_selection": b["valid_rmse"],
            "test_rmse_mean": float(tests.mean()),
            "test_rmse_std": float(tests.std()),
            "test_rmse_runs": tests.tolist(),
            "epsilon_spent": [r["epsilon_spent"] for r in reruns],
        })
    result = {"data": str(spec), "epsilon": args.epsilon, "delta": args.delta, "trials_per_method": args.trials, "seconds": time.time() - t0, "summary": summary, "search": search}
    (out / "tune.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| algorithm | epsilon | test RMSE (mean ± std over seeds) | valid RMSE at selection | best parameters |", "|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['algorithm']} | {s['epsilon']} | {s['test_rmse_mean']:.4f} ± {s['test_rmse_std']:.4f} | {s['valid_rmse_at_selection']:.4f} | {json.dumps(s['best_params'])} |")
    (out / "tune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
