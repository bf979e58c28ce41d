"""Every private algorithm's default run (no --set) against the private bias model, over a grid
of data sets x epsilons x noise seeds: test RMSE (mean and std over the seeds), the gap to the
``bias`` algorithm's default run (the reference: it applies the public-feature prior,
``bias_prior``, by default) in mean and per seed (same noise seed), what the noise-aware rule
chose (its model and snr), the epsilon spent, Recall@10 beside the private ``popular`` baseline at
the same epsilon and seed, and the seconds each cell took. Each cell also runs the plain bias
model (``bias`` with ``bias_prior=false``, key ``bias-plain``) and gives every default's gap to it
(``gap_to_plain_*``): the public-feature claim is made against that one. The summary lists the
worst gap and every cell whose mean loses to the reference by more than 0.005 (``--tolerance``),
and per data set and epsilon the best default's gain over both bias models and the prior's own
gain in the ``bias`` algorithm. Variants (``--variants``) measure the prior elsewhere: the bias
model as a bias stage (``bias_stage=true steps=0``) with and without the prior, and
``adadpals``'s default with the prior switched off (opt-in: ``bias+prior``, now the reference's
own setting, and AM-DPSGD's and AM-SSP's own settings, ``defaults=fixed``).
Prints one JSON object and writes it to ``--out`` (after every data set too).

    nice -n 19 python benchmarks/bench_defaults_grid.py --out results/defaults_grid.json
    python benchmarks/bench_defaults_grid.py --datasets ml-100k:../shared/data/ml-100k/ml-100k.zip \\
        --epsilons 5,20 --seeds 1,2,3 --algorithms adadpals,am-ssp --variants none

Defaults: ML-100K and ml-latest-small from ../shared/data, synthetic-mf:users=1500,items=400,
ratings=45000,seed=7 and synthetic-mf:users=6000,items=1000,ratings=300000,seed=11; epsilon in
{0.5, 1, 2, 5, 10, 20}; noise seeds 1, 2, 3; the seven private rating algorithms (am-ssp-convex
is a logistic model and is left out). The std is the sample std over the seeds."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

DATASETS = (
    "ml-100k:../shared/data/ml-100k/ml-100k.zip",
    "ml-latest:../shared/data/ml-latest-small/ml-latest-small.zip",
    "synthetic-mf:users=1500,items=400,ratings=45000,seed=7",
    "synthetic-mf:users=6000,items=1000,ratings=300000,seed=11",
)
ALGORITHMS = ("adadpals", "dpals-tail", "dpals-uniform", "am-ssp", "am-ssp1", "am-dpsgd", "dpsgd")
# the plain private bias model (no public-feature prior), run in every cell beside the reference
PLAIN = ("bias-plain", "bias", {"bias_prior": False})
# name -> (algorithm, --set values): not defaults, reported apart from the floor check
VARIANTS = {
    # now the reference's own setting (bias_prior is on in the bias algorithm's defaults): opt-in, as a check
    "bias+prior": ("bias", {"bias_prior": True}),
    "bias-stage": ("bias", {"bias_stage": True, "steps": 0, "bias_prior": False}),
    "bias-stage+prior": ("bias", {"bias_stage": True, "steps": 0, "bias_prior": True}),
    "adadpals-no-prior": ("adadpals", {"bias_prior": False}),
    # opt-in: the encoder models' own settings, which the rule replaces by the bias model below its threshold
    "am-dpsgd-fixed": ("am-dpsgd", {"defaults": "fixed"}),
    "am-ssp-fixed": ("am-ssp", {"defaults": "fixed"}),
}
DEFAULT_VARIANTS = ("bias-stage", "bias-stage+prior", "adadpals-no-prior")


def _name(data: str) -> str:
    return data if data.startswith("synthetic") else data.split(":")[0]


def _run(algorithm: str, data: str, epsilon: float, seed: int, dataset, params: dict | None = None) -> dict:
    from fedpriv.run import InProcess, Job

    t0 = time.perf_counter()
    out = Job(algorithm, data, epsilon=epsilon, noise_seed=seed, dataset=dataset, params=params or {}).prepare().execute(InProcess())
    r = out.report
    choice = r.get("noise_aware") or {}
    ranking = r.get("ranking") or {}
    return {"seed": seed, "test_rmse": r.metrics.get("test_rmse"), "epsilon_spent": r.epsilon_spent, "snr": choice.get("snr"),
            "model": choice.get("model"), "released_n_users": choice.get("released_n_users"), "ranking_k": ranking.get("k"),
            "recall": ranking.get("recall"), "ndcg": ranking.get("ndcg"), "ledger": [x["name"] for x in out.ledger],
            "seconds": time.perf_counter() - t0}


def _std(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _cell(runs: list[dict], bias_runs: list[dict] | None, popular_runs: list[dict], tolerance: float,
          plain_runs: list[dict] | None = None) -> dict:
    rmse = [r["test_rmse"] for r in runs]
    cell = {"test_rmse": rmse, "mean": statistics.fmean(rmse), "std": _std(rmse)}
    if bias_runs is not None:
        bias_mean = statistics.fmean(r["test_rmse"] for r in bias_runs)
        cell["gap_per_seed"] = [a["test_rmse"] - b["test_rmse"] for a, b in zip(runs, bias_runs)]
        cell["gap_mean"] = cell["mean"] - bias_mean
        cell["gap_max_seed"] = max(cell["gap_per_seed"])
        cell["loses"] = cell["gap_mean"] > tolerance
    if plain_runs is not None:  # against the plain bias model (no public-feature prior)
        cell["gap_to_plain_per_seed"] = [a["test_rmse"] - b["test_rmse"] for a, b in zip(runs, plain_runs)]
        cell["gap_to_plain_mean"] = cell["mean"] - statistics.fmean(r["test_rmse"] for r in plain_runs)
    cell["models"] = sorted({r["model"] for r in runs if r["model"] is not None})
    cell["snr"] = [r["snr"] for r in runs]
    cell["released_n_users"] = [r["released_n_users"] for r in runs]
    cell["ledger"] = runs[0]["ledger"]
    cell["epsilon_spent"] = [r["epsilon_spent"] for r in runs]
    cell["recall_at_10"] = [r["recall"] for r in runs]
    if all(r["recall"] is not None for r in runs):
        cell["recall_at_10_mean"] = statistics.fmean(r["recall"] for r in runs)
        if popular_runs and all(q["recall"] is not None for q in popular_runs):
            cell["popular_recall_at_10_mean"] = statistics.fmean(q["recall"] for q in popular_runs)
            cell["recall_at_10_over_popular"] = cell["recall_at_10_mean"] / cell["popular_recall_at_10_mean"]
    cell["seconds_per_run"] = [r["seconds"] for r in runs]
    cell["seconds"] = sum(cell["seconds_per_run"])
    return cell


def _feature_effects_rmse(plan, lam: float = 10.0, iterations: int = 15) -> dict:
    """Non-private, by least squares on the training ratings: test RMSE of mean + user bias
    (``none``), + an item effect made of the item's public features only (a ridge regression
    on the rows of the feature table scaled to sum 1: ``features``), + a free bias per item
    (``item``). How much of the item effect genre and year can explain at best, without noise."""
    import numpy as np
    import scipy.sparse as sp

    features = plan.dataset.item_features
    if features is None or plan.split is None:
        return {}
    train, test = plan.split.train, plan.split.test
    X = sp.csr_matrix(features.matrix, dtype=np.float64)
    X = sp.diags(1.0 / np.maximum(np.asarray(X.sum(axis=1)).ravel(), 1.0)) @ X
    u, i, r = train.users.astype(np.int64), train.items.astype(np.int64), train.ratings.astype(np.float64)
    mu, nu, ni = float(r.mean()), train.n_users, train.n_items
    rows = X[i]
    gram = (rows.T @ rows).toarray() + lam * np.eye(X.shape[1])
    out = {}
    for mode in ("none", "features", "item"):
        c, effect = np.zeros(nu), np.zeros(ni)
        for _ in range(iterations):
            c = np.bincount(u, r - mu - effect[i], nu) / (np.bincount(u, minlength=nu) + lam)
            res = r - mu - c[u]
            if mode == "item":
                effect = np.bincount(i, res, ni) / (np.bincount(i, minlength=ni) + lam)
            elif mode == "features":
                effect = X @ np.linalg.solve(gram, rows.T @ res)
        pred = np.clip(mu + c[test.users.astype(np.int64)] + effect[test.items.astype(np.int64)], *plan.rating_range)
        out[mode] = float(np.sqrt(np.mean((pred - test.ratings) ** 2)))
    return out


def _references(data: str, plan) -> dict:
    """Non-private references on the same split: the bias model (``als`` with rank 0) and ``als``."""
    from fedpriv.run import InProcess, Job

    als = plan.execute(InProcess()).report
    nonprivate_bias = Job("als", data, dataset=plan.dataset, params={"rank": 0}).prepare().execute(InProcess()).report
    refs = als.get("references") or {}
    features = plan.dataset.item_features
    return {"n_train_users": plan.n_users, "n_items": int(plan.dataset.interactions.n_items), "n_ratings": len(plan.dataset.interactions.ratings),
            "item_feature_columns": int(features.matrix.shape[1]) if features is not None else 0,
            "global_mean_test_rmse": refs.get("global_mean_test_rmse"), "nonprivate_bias_test_rmse": nonprivate_bias.metrics.get("test_rmse"),
            "nonprivate_als_test_rmse": als.metrics.get("test_rmse"), "nonprivate_popular_recall_at_10": refs.get("popular_recall"),
            "nonprivate_als_recall_at_10": (als.get("ranking") or {}).get("recall"), "nonprivate_item_effects_test_rmse": _feature_effects_rmse(plan)}


def _summary(report: dict, tolerance: float) -> dict:
    losing, seed_losses, worst, per_data, best = [], [], None, {}, {}
    prior = []
    for name, entry in report["data"].items():
        for eps, cells in entry["epsilons"].items():
            bias_mean = cells["bias"]["mean"]
            plain = cells.get(PLAIN[0])
            defaults = {a: c for a, c in cells.items() if a in report["algorithms"]}
            for alg, c in defaults.items():
                row = {"dataset": name, "epsilon": float(eps), "algorithm": alg, "gap_mean": c["gap_mean"], "gap_per_seed": c["gap_per_seed"],
                       "mean": c["mean"], "bias_mean": bias_mean, "models": c["models"], "snr": c["snr"]}
                if worst is None or c["gap_mean"] > worst["gap_mean"]:
                    worst = row
                if name not in per_data or c["gap_mean"] > per_data[name]["gap_mean"]:
                    per_data[name] = row
                if c["loses"]:
                    losing.append(row)
                if c["gap_max_seed"] > tolerance:
                    seed_losses.append(row)
            if defaults:
                alg = min(defaults, key=lambda a: defaults[a]["mean"])
                b = best.setdefault(name, {})[eps] = {"algorithm": alg, "mean": defaults[alg]["mean"], "bias_mean": bias_mean,
                                                      "gain_over_bias": bias_mean - defaults[alg]["mean"]}
                if plain is not None:
                    b["plain_bias_mean"] = plain["mean"]
                    b["gain_over_plain_bias"] = plain["mean"] - defaults[alg]["mean"]
                    b["gain_over_plain_bias_per_seed"] = [-g for g in defaults[alg]["gap_to_plain_per_seed"]]
            v = cells.get("variants", {})
            p = {"dataset": name, "epsilon": float(eps), "bias_mean": bias_mean}
            if plain is not None:  # the prior in the bias algorithm itself: plain minus the reference
                p["plain_bias_mean"] = plain["mean"]
                p["prior_gain_bias"] = plain["mean"] - bias_mean
                p["prior_gain_bias_per_seed"] = [a - b for a, b in zip(plain["test_rmse"], cells["bias"]["test_rmse"])]
            if "bias-stage" in v and "bias-stage+prior" in v:
                p["bias_stage_mean"], p["bias_stage_prior_mean"] = v["bias-stage"]["mean"], v["bias-stage+prior"]["mean"]
                p["prior_gain_bias_stage"] = v["bias-stage"]["mean"] - v["bias-stage+prior"]["mean"]
                p["prior_gain_bias_stage_per_seed"] = [a - b for a, b in zip(v["bias-stage"]["test_rmse"], v["bias-stage+prior"]["test_rmse"])]
            if "adadpals-no-prior" in v and "adadpals" in cells:
                p["adadpals_no_prior_mean"], p["adadpals_mean"] = v["adadpals-no-prior"]["mean"], cells["adadpals"]["mean"]
                p["prior_gain_adadpals_default"] = v["adadpals-no-prior"]["mean"] - cells["adadpals"]["mean"]
                p["prior_gain_adadpals_default_per_seed"] = [a - b for a, b in zip(v["adadpals-no-prior"]["test_rmse"], cells["adadpals"]["test_rmse"])]
            if "bias+prior" in v:
                p["bias_prior_flag_change"] = v["bias+prior"]["mean"] - bias_mean  # 0: the reference's own setting
            if len(p) > 3:
                prior.append(p)
    return {"tolerance": tolerance, "worst_gap": worst, "worst_gap_per_dataset": per_data, "losing_cells": losing,
            "cells_with_a_seed_losing": seed_losses, "best_default": best, "public_feature_prior": prior}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), help="data specs (space-separated)")
    p.add_argument("--epsilons", default="0.5,1,2,5,10,20")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS))
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}; or none")
    p.add_argument("--tolerance", type=float, default=0.005)
    p.add_argument("--references-only", action="store_true", help="only the non-private references of each data set")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from fedpriv.run import Job

    epsilons = [float(e) for e in args.epsilons.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = [a for a in args.algorithms.split(",") if a]
    variants = [] if args.variants in ("", "none") else args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}")
    report: dict = {"algorithms": algorithms, "reference": "bias", "plain_reference": {"key": PLAIN[0], "algorithm": PLAIN[1], "set": PLAIN[2]},
                    "ranking_reference": "popular", "epsilons": epsilons, "seeds": seeds,
                    "variants": {k: {"algorithm": VARIANTS[k][0], "set": VARIANTS[k][1]} for k in variants}, "data": {}}
    t_all = time.perf_counter()

    def write() -> None:
        report["seconds"] = time.perf_counter() - t_all
        report["summary"] = _summary(report, args.tolerance)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")

    for data in args.datasets:
        t0 = time.perf_counter()
        plan = Job("als", data).prepare()
        entry: dict = {"spec": data, "references": _references(data, plan), "epsilons": {}}
        report["data"][_name(data)] = entry
        for eps in [] if args.references_only else epsilons:
            te = time.perf_counter()
            bias = [_run("bias", data, eps, s, plan.dataset) for s in seeds]
            plain = [_run(PLAIN[1], data, eps, s, plan.dataset, PLAIN[2]) for s in seeds]
            popular = [_run("popular", data, eps, s, plan.dataset) for s in seeds]
            cells: dict = {"bias": _cell(bias, None, popular, args.tolerance, plain), PLAIN[0]: _cell(plain, bias, popular, args.tolerance),
                           "popular": _cell(popular, None, popular, args.tolerance)}
            for alg in algorithms:
                cells[alg] = _cell([_run(alg, data, eps, s, plan.dataset) for s in seeds], bias, popular, args.tolerance, plain)
            cells["variants"] = {}
            for v in variants:
                alg, params = VARIANTS[v]
                cells["variants"][v] = _cell([_run(alg, data, eps, s, plan.dataset, params) for s in seeds], bias, popular, args.tolerance, plain)
            cells["seconds"] = time.perf_counter() - te
            entry["epsilons"][f"{eps:g}"] = cells
            lost = [a for a in algorithms if cells[a]["loses"]]
            print(json.dumps({"data": _name(data), "epsilon": eps, "seconds": round(cells["seconds"], 1), "bias": round(cells["bias"]["mean"], 4),
                              "bias_plain": round(cells[PLAIN[0]]["mean"], 4),
                              "worst": max(((a, round(cells[a]["gap_mean"], 4)) for a in algorithms), key=lambda x: x[1], default=None), "losing": lost}),
                  file=sys.stderr, flush=True)
        entry["seconds"] = time.perf_counter() - t0
        write()
    write()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
