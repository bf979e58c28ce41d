"""Top-k figures of the ``topk`` family: Recall@10 and NDCG@10 of private ``topk`` (EASE) and ``topk-lowrank`` beside private
``popular`` and the private bias model ``bias`` at the same epsilon, the non-private ``ease``,
``ials``, ``als`` and most-popular list,
on the project's default split (random 80/10/10, public seed 1234). A user's relevant items are
their held-out ratings >= 4 on a 1-5 scale (the top 20% of the scale otherwise); every item the
user did not rate in training is a candidate; the lists come from the released model's own
ranking (the one ``Model.recommend`` uses). Means over ``--seeds`` noise seeds.

    python benchmarks/topk.py --data ml-100k:PATH --data ml-latest-small:PATH [--part valid]

``--part valid`` scores the validation ratings (how the rule's constants were chosen: pass
``--set topk_reg=...`` etc. to try others); the default ``test`` is the reported figure. Prints
one JSON line per (data set, model, epsilon) and a summary line per data set with the ratios
topk / popular.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fedpriv  # noqa: E402
from fedpriv.algorithms import ranking  # noqa: E402
from fedpriv.data.splits import random_split  # noqa: E402


def threshold_of(rating_range) -> float:
    lo, hi = (float(x) for x in rating_range)
    return 4.0 if (lo, hi) == (1.0, 5.0) else ranking.relevance_threshold((lo, hi))


def figures(data_spec: str, epsilons: list[float], seeds: int, part: str, overrides: dict, models=("popular", "bias", "topk", "topk-lowrank")) -> list[dict]:
    data = fedpriv.load_data(data_spec)
    inter = data.interactions if hasattr(data, "interactions") else data.ratings
    split = random_split(inter, seed=1234)
    held = split.valid if part == "valid" else split.test
    rows = []

    def score(model_name, eps, seed, overrides_=None):
        t = time.perf_counter()
        kw = {"epsilon": eps, "noise_seed": seed} if eps is not None else {}
        res = fedpriv.train(model_name, data, second_opinion=False, **(overrides_ or {}), **kw)
        state = res.model.state
        r = ranking.evaluate_ranking(state, split.train, held, threshold=threshold_of(state.rating_range))
        return r, time.perf_counter() - t, (state.choice or {}).get("model")

    r, secs, _ = score("ease", None, 0)
    thr = r["threshold"]
    popular = ranking.popular_reference(split.train, held, threshold=thr)
    rows.append({"data": data_spec.split(":")[0], "model": "most popular (non-private)", "epsilon": None, "recall": popular["recall"], "ndcg": popular["ndcg"]})
    rows.append({"data": data_spec.split(":")[0], "model": "ease (non-private)", "epsilon": None, "recall": r["recall"], "ndcg": r["ndcg"], "seconds": round(secs, 1)})
    for name in ("als", "ials"):
        r_ref, secs, _ = score(name, None, 0)
        rows.append({"data": data_spec.split(":")[0], "model": f"{name} (non-private)", "epsilon": None, "recall": r_ref["recall"], "ndcg": r_ref["ndcg"], "seconds": round(secs, 1)})
    for eps in epsilons:
        for name in models:
            got = [score(name, eps, seed, overrides if name.startswith("topk") else None) for seed in range(1, seeds + 1)]
            rows.append({"data": data_spec.split(":")[0], "model": name, "epsilon": eps, "recall": float(np.mean([g[0]["recall"] for g in got])),
                         "ndcg": float(np.mean([g[0]["ndcg"] for g in got])), "recall_per_seed": [round(g[0]["recall"], 4) for g in got],
                         "seconds": round(float(np.mean([g[1] for g in got])), 1), "rule": got[0][2]})
    for row in rows:
        row.update(part=part, threshold=thr, users=r["users"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", action="append", required=True, help="a data spec (repeatable)")
    p.add_argument("--epsilon", type=float, action="append", help="default: 1, 5, 20")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--part", choices=("valid", "test"), default="test")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="topk overrides (e.g. topk_reg=8)")
    a = p.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in a.set)
    for spec in a.data:
        rows = figures(spec, a.epsilon or [1.0, 5.0, 20.0], a.seeds, a.part, overrides)
        for row in rows:
            print(json.dumps(row), flush=True)
        pop = {row["epsilon"]: row["recall"] for row in rows if row["model"] == "popular"}
        for name in ("topk", "topk-lowrank"):
            ratios = {str(row["epsilon"]): round(row["recall"] / pop[row["epsilon"]], 3) for row in rows if row["model"] == name and pop.get(row["epsilon"])}
            print(json.dumps({"data": rows[0]["data"], "part": a.part, f"{name}_over_popular": ratios}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
