"""The held-out-users protocol (implicit data such as Last.fm): the private defaults' test
Recall@20 against the popularity ranking and non-private ALS, on the same held-out users.
Prints one JSON object (per algorithm, one value per noise seed; the noise-aware rule's snr).

    python benchmarks/bench_heldout.py --data lastfm:../shared/data/hetrec2011-lastfm-2k [--epsilon 5] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--epsilon", type=float, default=5.0)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--algorithms", default="adadpals,dpals-tail,bias")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from fedpriv.algorithms import metrics
    from fedpriv.algorithms.shards import shard_users
    from fedpriv.run import InProcess, Job

    plan = Job("als", args.data).prepare()
    split = plan.split
    counts = split.train.item_counts().astype(np.float64)
    h, t = shard_users(split.test_history, split.test_users), shard_users(split.test_targets, split.test_users)
    popular, _ = metrics.recall_at_k(lambda rows: np.broadcast_to(counts, (len(rows), len(counts))), split.test_users, (h.indptr, h.items), (t.indptr, t.items), counts, k=20)
    out = {"data": args.data.split(":")[0], "epsilon": args.epsilon, "popularity_recall_at_20": popular,
           "nonprivate_als_recall_at_20": plan.execute(InProcess()).report.metrics["test_recall_at_20"], "private": {}}
    for alg in args.algorithms.split(","):
        runs = [Job(alg, args.data, epsilon=args.epsilon, noise_seed=int(s), dataset=plan.dataset).prepare().execute(InProcess()) for s in args.seeds.split(",")]
        out["private"][alg] = {"recall_at_20": [r.report.metrics["test_recall_at_20"] for r in runs],
                               "snr": (runs[0].report.get("noise_aware") or {}).get("snr"), "model": (runs[0].report.get("noise_aware") or {}).get("model")}
    best = max(float(np.mean(v["recall_at_20"])) for v in out["private"].values())
    out["best_private_mean"] = best
    out["gap_to_popularity"] = best - popular
    out["gap_to_nonprivate_als"] = best - out["nonprivate_als_recall_at_20"]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
