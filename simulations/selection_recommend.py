"""Private recommendation per selection mechanism on rating data (ML-100K by default).

Trains once (AdaDPALS at --train-epsilon, or non-private ALS), then every user of the
federation reports one item from the public candidate set, chosen by each private selection
mechanism at each --epsilons value, with per-candidate sensitivities from the private score
histogram (quantile source; its release is part of the reported epsilon) or the public norm
bound. Table: MSE of the reported item's score to the user's best score, hit rate on held-out
ratings, with the measured distribution of per-user Spearman correlations of scores and
sensitivities.

    python simulations/selection_recommend.py --data ml-100k:../shared/data/ml-100k/ml-100k.zip --out results/selection_recommend
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedpriv.algorithms import recommend  # noqa: E402
from fedpriv.algorithms.als import ALSConfig  # noqa: E402
from fedpriv.data.spec import load_spec, parse_data_spec  # noqa: E402
from fedpriv.data.splits import random_split  # noqa: E402
from fedpriv.engine.inprocess import recommend_inprocess, train_inprocess  # noqa: E402
from fedpriv.errors import FedprivError  # noqa: E402
from fedpriv.privacy.accounting import epsilon_bounds  # noqa: E402

MECHANISMS = ("rnm", "em", "gem", "mgem", "cgem", "rs", "krr", "uniform")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="ml-100k:../shared/data/ml-100k/ml-100k.zip")
    p.add_argument("--out", required=True)
    p.add_argument("--algorithm", default="adadpals", help="adadpals (private training) or als")
    p.add_argument("--train-epsilon", type=float, default=5.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0, 4.0])
    p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    p.add_argument("--sources", nargs="+", default=["quantile", "norm"])
    p.add_argument("--candidates", type=int, default=100)
    p.add_argument("--hist-epsilon", type=float, default=1.0)
    p.add_argument("--user-clip", type=float, default=1.0)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--include-rated", action="store_true", help="score the users' training items like the others (default: they score lo_a)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    a = p.parse_args(argv)
    try:
        rows, meta = run(a)
    except FedprivError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write(Path(a.out), rows, meta)
    print(table(rows, meta))
    return 0


def run(a):
    from fedpriv.run import parse_overrides

    t0 = time.perf_counter()
    spec = parse_data_spec(a.data)
    ds = load_spec(spec)
    split = random_split(ds.interactions, seed=1234)
    cfg = ALSConfig.from_overrides({"rank": "8", "steps": "5", **parse_overrides(a.overrides)})
    eps_train = a.train_epsilon if a.algorithm != "als" else None
    res = train_inprocess(a.algorithm, split.train, cfg, rating_range=tuple(ds.rating_range), epsilon=eps_train, delta=a.delta, progress=False)
    rows = []
    meta = {"data": str(spec), "algorithm": a.algorithm, "train_epsilon": eps_train, "delta": a.delta, "candidates": a.candidates,
            "hist_epsilon": a.hist_epsilon, "user_clip": a.user_clip, "seeds": a.seeds, "exclude_rated": not a.include_rated, "config": cfg.to_dict()}
    for source in a.sources:
        for eps in a.epsilons:
            for mech in a.mechanisms:
                per_seed = []
                for seed in range(a.seeds):
                    rcfg = recommend.RecommendConfig(mechanism=mech, epsilon=eps, candidates=a.candidates, sensitivity=source,
                                                     hist_epsilon=a.hist_epsilon, hist_delta=a.delta, user_clip=a.user_clip,
                                                     exclude_rated=not a.include_rated)
                    summary, rec_ledger, _ = recommend_inprocess(res.state, split.train, split.test, rcfg)
                    if seed == 0:  # the same releases for every seed: account once
                        combined = [*res.ledger.releases, *rec_ledger.releases] if eps_train else rec_ledger
                        summary["epsilon_recommendation"] = epsilon_bounds(rec_ledger, a.delta)[0]
                        summary["epsilon_total"] = epsilon_bounds(combined, a.delta)[0]
                    per_seed.append(summary)
                mse = np.array([s["mse_to_best"] for s in per_seed])
                hit = np.array([s["hit_rate"] for s in per_seed])
                first = per_seed[0]
                rows.append({
                    "source": source, "mechanism": mech, "epsilon": eps, "mse": float(mse.mean()), "mse_std": float(mse.std(ddof=1)) if len(mse) > 1 else 0.0,
                    "hit_rate": float(hit.mean()), "hit_rate_std": float(hit.std(ddof=1)) if len(hit) > 1 else 0.0,
                    "argmax_hit_rate": first["argmax_hit_rate"], "uniform_hit_rate": first["uniform_hit_rate"],
                    "epsilon_recommendation": first["epsilon_recommendation"], "epsilon_total": first["epsilon_total"],
                    "spearman_hist": first["spearman_hist"], "spearman_mean_binned": first["spearman_mean_binned"],
                    "spearman_positive_share": first["spearman_positive_share"], "users": first["users"],
                    "sensitivity_min": first["sensitivity_min"], "sensitivity_max": first["sensitivity_max"],
                })
    meta["seconds"] = time.perf_counter() - t0
    if eps_train:
        meta["epsilon_training"] = epsilon_bounds(res.ledger, a.delta)[0]
    return rows, meta


def table(rows, meta) -> str:
    out = [f"data {meta['data']}, training {meta['algorithm']} (epsilon {meta.get('epsilon_training')}), {meta['candidates']} candidates ({'training items excluded' if meta['exclude_rated'] else 'training items included'}), {meta['seeds']} seeds, {meta['seconds']:.0f} s"]
    for source in dict.fromkeys(r["source"] for r in rows):
        sub = [r for r in rows if r["source"] == source]
        eps = sorted({r["epsilon"] for r in sub})
        out.append(f"\n### sensitivity source: {source}; per-user Spearman(score, sensitivity): mean {sub[0]['spearman_mean_binned']:.2f}, positive for {100 * sub[0]['spearman_positive_share']:.0f}% of users")
        out.append("| mechanism | " + " | ".join(f"MSE eps={e:g}" for e in eps) + " | " + " | ".join(f"hit eps={e:g}" for e in eps) + " |")
        out.append("|---|" + "---|" * (2 * len(eps)))
        for mech in dict.fromkeys(r["mechanism"] for r in sub):
            cells = {r["epsilon"]: r for r in sub if r["mechanism"] == mech}
            out.append(f"| {mech} | " + " | ".join(f"{cells[e]['mse']:.4f} ± {cells[e]['mse_std']:.4f}" for e in eps) + " | " + " | ".join(f"{cells[e]['hit_rate']:.3f}" for e in eps) + " |")
        out.append(f"argmax (non-private) hit rate {sub[0]['argmax_hit_rate']:.3f}; uniform {sub[0]['uniform_hit_rate']:.3f}; "
                   f"epsilon of the recommendation phase " + ", ".join(f"{r['epsilon_recommendation']:.3g}" for r in sub if r["mechanism"] == sub[0]["mechanism"])
                   + "; with training " + ", ".join(f"{r['epsilon_total']:.3g}" for r in sub if r["mechanism"] == sub[0]["mechanism"]))
    return "\n".join(out)


def write(out: Path, rows, meta) -> None:
    """recommend.json, table.md and the Spearman histogram plot, moved in place together."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    (tmp / "recommend.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (tmp / "table.md").write_text(table(rows, meta) + "\n")
    sources = list(dict.fromkeys(r["source"] for r in rows))
    fig, axes = plt.subplots(1, len(sources), figsize=(5 * len(sources), 3.5), squeeze=False)
    for ax, source in zip(axes[0], sources):
        h = next(r for r in rows if r["source"] == source)["spearman_hist"]
        edges = np.asarray(h["edges"])
        ax.bar(0.5 * (edges[1:] + edges[:-1]), h["counts"], width=np.diff(edges), edgecolor="k")
        ax.set_xlabel("per-user Spearman(score, sensitivity)")
        ax.set_ylabel("users")
        ax.set_title(f"{meta['data'].split(':')[0]}, {source} sensitivities")
    fig.tight_layout()
    fig.savefig(tmp / "spearman.png", dpi=120)
    plt.close(fig)
    out.mkdir(parents=True, exist_ok=True)
    for f in tmp.iterdir():
        os.replace(f, out / f.name)
    tmp.rmdir()


if __name__ == "__main__":
    raise SystemExit(main())
