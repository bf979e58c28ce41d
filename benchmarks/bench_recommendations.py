"""Top-10 recommendations against the most-popular list: the default private recommender
(``adadpals``'s defaults, ranked by :func:`fedpriv.algorithms.ranking.ranking_scores`), the
private popularity baseline (``popular``) at the same epsilon, the non-private most-popular list
and non-private ``als``, on the random split's test ratings (relevant: the top 20% of the rating
scale). Prints one JSON object: per data set and epsilon, each noise seed's Recall@10, NDCG@10
and the median training count of the recommended items, and their means.

    python benchmarks/bench_recommendations.py --data ml-100k:../shared/data/ml-100k/ml-100k.zip \\
        --data ml-latest:../shared/data/ml-latest-small/ml-latest-small.zip [--epsilons 1,5,20] [--seeds 1,2,3]
    python benchmarks/bench_recommendations.py --data synthetic-mf:users=70000,items=10000,ratings=10000000,seed=1,select=1.5 --epsilons 5

Issue 33's targets: the default's mean Recall@10 >= the private popularity baseline's at every
epsilon, >= the non-private most-popular list's at epsilon 20; non-private als above the
most-popular list; on the preference-dependent synthetic set at epsilon 5, the default >= 1.1 x
the baseline."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings


def _row(out) -> dict:
    r = out.report["ranking"]
    return {"recall": r["recall"], "ndcg": r["ndcg"], "median_train_count": r["median_train_count"], "coverage": r["coverage"],
            "test_rmse": out.report.metrics.get("test_rmse")}


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", action="append", required=True)
    p.add_argument("--epsilons", default="1,5,20")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--algorithm", default="adadpals", help="the default private recommender's algorithm")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from fedpriv.run import InProcess, Job

    epsilons = [float(e) for e in args.epsilons.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    report: dict = {"algorithm": args.algorithm, "seeds": seeds, "data": {}}
    for data in args.data:
        t0 = time.perf_counter()
        reference = Job("als", data).prepare()
        als = reference.execute(InProcess())
        entry: dict = {"nonprivate_popular": {k: als.report["references"][f"popular_{k}"] for k in ("recall", "ndcg", "median_train_count")},
                       "nonprivate_als": _row(als), "epsilons": {}}
        for eps in epsilons:
            default = [_row(Job(args.algorithm, data, epsilon=eps, noise_seed=s, dataset=reference.dataset).prepare().execute(InProcess())) for s in seeds]
            popular = [_row(Job("popular", data, epsilon=eps, noise_seed=s, dataset=reference.dataset).prepare().execute(InProcess())) for s in seeds]
            cell = {"default": default, "popular": popular}
            for key in ("recall", "ndcg"):
                cell[f"default_mean_{key}"] = _mean(default, key)
                cell[f"popular_mean_{key}"] = _mean(popular, key)
            cell["default_over_popular"] = cell["default_mean_recall"] / cell["popular_mean_recall"]
            cell["default_at_least_popular_every_seed"] = all(d["recall"] >= q["recall"] for d, q in zip(default, popular))
            entry["epsilons"][f"{eps:g}"] = cell
        entry["seconds"] = time.perf_counter() - t0
        report["data"][data.split(":")[0] if not data.startswith("synthetic") else data] = entry
        print(json.dumps({"done": data, "seconds": round(entry["seconds"], 1)}), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
