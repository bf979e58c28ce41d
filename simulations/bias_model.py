"""The private bias model (algorithm ``bias``) against what costs no privacy and against the
default AdaDPALS: test RMSE on a random 80/10/10 split (seed 1234), mean over noise seeds.

Usage:
  python simulations/bias_model.py --data ml-100k:../shared/data/ml-100k/ml-100k.zip --out results/bias_model

Rows: the global mean (train ratings' mean, non-private), the non-private bias model (ALS with
rank 0), the private bias model with its defaults, the private bias model tuned on validation
(grid: ridge in noise standard deviations, rating clip, steps, constant ridge; the test set is
never used to choose), and AdaDPALS with its defaults. Writes summary.json and prints it.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

from fedpriv.util import atomic
from fedpriv.data.spec import load_spec, parse_data_spec
from fedpriv.data.splits import random_split
from fedpriv.run import InProcess, Job

GRID = {"reg_noise_units": ("0.25", "0.5", "1", "2", "3", "4"), "rating_clip": ("1", "2"), "steps": ("1", "2"), "reg_item_private": ("0", "2")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 5.0, 20.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    ds = load_spec(parse_data_spec(args.data))
    split = random_split(ds.interactions, seed=1234)

    def score(algorithm: str, overrides: dict, eps: float | None, seed: int | None = None) -> tuple[float, float]:
        """(valid, test) RMSE of one run: a Job on the loaded data (the same split, seed 1234)."""
        out = Job(algorithm, args.data, epsilon=eps, noise_seed=seed, params=overrides, dataset=ds).prepare().execute(InProcess(), second_opinion=False)
        return out.report.metrics["valid_rmse"], out.report.metrics["test_rmse"]

    def private(algorithm: str, overrides: dict, eps: float) -> tuple[float, float]:
        runs = [score(algorithm, overrides, eps, s) for s in args.seeds]
        return float(np.mean([r[0] for r in runs])), float(np.mean([r[1] for r in runs]))

    mean = float(split.train.ratings.mean())
    out = {
        "data": args.data, "seeds": args.seeds,
        "global_mean_test_rmse": float(np.sqrt(np.mean((split.test.ratings - mean) ** 2))),
        "nonprivate_bias_test_rmse": score("als", {"rank": 0, "steps": 3}, None)[1],
        "by_epsilon": {},
    }
    for eps in args.epsilons:
        best = None
        for values in itertools.product(*GRID.values()):
            o = dict(zip(GRID, values))
            v, t = private("bias", o, eps)
            if best is None or v < best["valid_rmse"]:
                best = {"valid_rmse": v, "test_rmse": t, "overrides": o}
        out["by_epsilon"][str(eps)] = {
            "bias_default_test_rmse": private("bias", {}, eps)[1],
            "bias_tuned": best,
            "adadpals_default_test_rmse": private("adadpals", {}, eps)[1],
        }
        print(json.dumps({str(eps): out["by_epsilon"][str(eps)]}), flush=True)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    atomic.write_text(folder / "summary.json", json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
