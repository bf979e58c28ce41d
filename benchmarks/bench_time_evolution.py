"""Time evolution of test RMSE for AM-SSP and AM-DPSGD (the public-features paper's Figure 3) on
the 10M-rating synthetic set with public item features (genres, year buckets).

Both algorithms run in-process on one machine at the same epsilon. After every alternating
step (AM-SSP) or every ``--eval-every`` rounds (AM-DPSGD), test RMSE is measured on a fixed
sample of test ratings; evaluation time is excluded from the training seconds. The figure of
merit is the ratio of training seconds each needs to reach the same RMSE: the best RMSE both
reach (the worse of the two best values).

Usage: python benchmarks/bench_time_evolution.py [--users 70000 --items 10700 --ratings 10000000]
           [--epsilon 5] [--dpsgd-seconds 900] [--out results/time_evolution.json]
Prints one JSON object (curves, times to target, ratio).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from fedpriv.algorithms.als import ALSConfig
from fedpriv.algorithms.options import EncoderDPSGDOptions, SSPOptions
from fedpriv.data.interactions import Interactions
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.ops.experiments.kinds import time_curve


def curve(algorithm: str, split, test: Interactions, features, cfg: ALSConfig, epsilon: float, eval_every: int, budget: float) -> list[dict]:
    """(training seconds, test RMSE) points, printed as they come; stops once ``budget`` training
    seconds are spent (the experiments' time curve, :func:`fedpriv.ops.experiments.kinds.time_curve`)."""
    points, _ = time_curve(algorithm, split, test, features, cfg, epsilon, 1e-5, (1.0, 5.0), eval_every, budget,
                           on_point=lambda p: print(json.dumps({"algorithm": algorithm, **p}), flush=True))
    return points


def seconds_to(points: list[dict], target: float) -> float | None:
    for p in points:
        if p["test_rmse"] <= target:
            return p["train_seconds"]
    return None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=70_000)
    ap.add_argument("--items", type=int, default=10_700)
    ap.add_argument("--ratings", type=int, default=10_000_000)
    ap.add_argument("--epsilon", type=float, default=5.0)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--ssp-steps", type=int, default=3, help="alternating steps of AM-SSP")
    ap.add_argument("--dpsgd-rounds", type=int, default=400)
    ap.add_argument("--dpsgd-seconds", type=float, default=900.0, help="training-time budget of AM-DPSGD")
    ap.add_argument("--sampling-rate", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--eval-ratings", type=int, default=200_000)
    ap.add_argument("--features", default="genre,year", help="public feature fields of the encoder (add ',id' for an item-id embedding)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    t = time.perf_counter()
    syn = make_mf(args.users, args.items, args.ratings, seed=7)
    split = random_split(syn.interactions, seed=1234)
    rng = np.random.default_rng(0)
    keep = np.sort(rng.choice(len(split.test), size=min(args.eval_ratings, len(split.test)), replace=False))
    test = split.test.subset(np.isin(np.arange(len(split.test)), keep))
    data_seconds = time.perf_counter() - t

    common = {"rank": args.rank, "mu": 0.25, "bias_share": 0.5}
    ssp_cfg = ALSConfig(**common, steps=args.ssp_steps, rating_clip=1.0, reg_item_private=10.0, options=SSPOptions(features=args.features, ssp_steps=200, ssp_lr=0.05))
    sgd_cfg = ALSConfig(**common, steps=args.dpsgd_rounds, options=EncoderDPSGDOptions(features=args.features, sgd_sampling_rate=args.sampling_rate, sgd_clip=1.0, encoder_sgd_lr=0.01))
    ssp = curve("am-ssp", split, test, syn.item_features, ssp_cfg, args.epsilon, 1, float("inf"))
    sgd = curve("am-dpsgd", split, test, syn.item_features, sgd_cfg, args.epsilon, args.eval_every, args.dpsgd_seconds)

    target = max(min(p["test_rmse"] for p in ssp), min(p["test_rmse"] for p in sgd))
    t_ssp, t_sgd = seconds_to(ssp, target), seconds_to(sgd, target)
    result = {
        "data": {"users": args.users, "items": args.items, "ratings": args.ratings, "features": args.features, "build_seconds": data_seconds, "eval_ratings": len(test)},
        "epsilon": args.epsilon,
        "am_ssp": {"config": {k: v for k, v in ssp_cfg.to_dict().items() if k in ("rank", "steps", "ssp_steps", "ssp_lr", "rating_clip", "reg_item_private")}, "curve": ssp},
        "am_dpsgd": {"config": {k: v for k, v in sgd_cfg.to_dict().items() if k in ("rank", "steps", "sgd_sampling_rate", "sgd_clip", "encoder_sgd_lr")}, "curve": sgd, "budget_seconds": args.dpsgd_seconds},
        "target_rmse": target,
        "am_ssp_seconds_to_target": t_ssp,
        "am_dpsgd_seconds_to_target": t_sgd,
        "ratio_dpsgd_over_ssp": (t_sgd / t_ssp) if (t_ssp and t_sgd) else None,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
