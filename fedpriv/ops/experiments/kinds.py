"""Experiment kinds other than ``grid``.

- ``time_evolution``: test RMSE against training seconds (the public-features paper's
  Figure 3). Every method of the config trains in-process on each data set at each epsilon;
  after every ``eval_every`` steps (per method, ``[settings.eval_every]``) the test RMSE on a fixed
  sample of ``eval_ratings`` test ratings is measured and its time excluded from training
  seconds; a method stops after ``budget_seconds`` (per method) of training.
- ``selection_scenarios``: the private-selection paper's synthetic scenarios
  (:mod:`fedpriv.studies.selection.scenarios`), MSE to the optimum per mechanism and epsilon.
- ``selection_bandit``: the two-armed bandit under a distribution shift
  (:mod:`fedpriv.studies.selection.bandit`).

Each returns tidy rows, tables and plots like the grid kind; finished cells are stored under
``cells/`` by a hash of their definition.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from .grid import BASE_SEED, _atomic_json, stable_hash, write_csv


def run_kind(exp, out: Path, cache: dict, *, log=print, require_data: bool = False) -> dict:
    fn = {
        "time_evolution": time_evolution,
        "selection_scenarios": selection_scenarios,
        "selection_bandit": selection_bandit,
    }[exp.kind]
    return fn(exp, out, cache, log=log, require_data=require_data)


def _cached(out: Path, definition: dict, compute, log, label: str) -> dict:
    key = stable_hash(definition)
    path = out / "cells" / f"{key}.json"
    if path.exists():
        log(f"  {label}: done before")
        return json.loads(path.read_text())
    t = time.perf_counter()
    doc = compute(key)
    doc.update({"key": key, "definition": definition, "seconds": time.perf_counter() - t})
    _atomic_json(path, doc)
    log(f"  {label}: {doc['seconds']:.1f} s")
    return doc


def _positive_int_setting(exp, key, default) -> int:
    val = exp.settings.get(key, default)
    if not isinstance(val, (int, float)) or isinstance(val, bool) or not val > 0:
        raise ConfigError(f"must be a positive int, got {val!r}", field=f"{exp.path}: settings.{key}")
    return int(val)


# ------------------------------------------------------------------------------ time evolution
def time_curve(
    algorithm, split, test, features, cfg, epsilon, delta, rating_range, eval_every: int, budget: float, on_point=None
):
    """(points, ledger): test RMSE on ``test`` after every ``eval_every`` steps (and the last),
    with the training seconds so far (evaluation time excluded); training stops after the first
    evaluation past ``budget`` training seconds (the ledger then holds the releases made so far,
    and the run spends less than its target epsilon). ``on_point(point)`` sees each point."""
    from ...engine.inprocess import train_inprocess
    from ...algorithms.evaluation import predict_ratings
    from ...algorithms.metrics import rmse

    points: list[dict] = []
    eval_seconds = [0.0]

    def on_step(step, state, seconds):
        if (step + 1) % eval_every and step + 1 != cfg.steps:
            return False
        train_seconds = seconds - eval_seconds[0]
        t = time.perf_counter()
        point = {
            "step": step + 1,
            "train_seconds": train_seconds,
            "test_rmse": rmse(predict_ratings(state, split.train, test), test.ratings),
        }
        eval_seconds[0] += time.perf_counter() - t
        points.append(point)
        if on_point is not None:
            on_point(point)
        return train_seconds > budget

    res = train_inprocess(
        algorithm,
        split.train,
        cfg,
        rating_range=rating_range,
        epsilon=epsilon,
        delta=delta,
        item_features=features,
        progress=False,
        on_step=on_step,
    )
    return points, res.ledger


def time_evolution(exp, out: Path, cache: dict, *, log=print, require_data: bool = False) -> dict:
    from ...algorithms.als import ALSConfig
    from ...data.splits import random_split
    from ...privacy.accounting import epsilon_bounds
    from ...run import write_outputs
    from .grid import GridRunner, cell_params, cells

    runner = GridRunner(exp, out, cache, log, require_data)
    eval_every = exp.settings.get("eval_every", {})
    budgets = exp.settings.get("budget_seconds", {})
    n_eval = _positive_int_setting(exp, "eval_ratings", 200_000)
    for name, tbl in (("eval_every", eval_every), ("budget_seconds", budgets)):
        if not isinstance(tbl, dict) or any(
            not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0 for v in tbl.values()
        ):
            raise ConfigError("must be a table of method = positive number", field=f"{exp.path}: settings.{name}")
    rows, curves, skipped = [], [], []
    todo = cells(exp)
    for c in todo:
        reason = runner.missing_reason(c.dataset)
        if reason:
            skipped.append({"cell": c.label, "reason": reason})
            continue
        params = cell_params(exp, c)
        for s in range(1, exp.seeds + 1):
            definition = {
                "kind": "time_evolution",
                "spec": exp.datasets[c.dataset].spec,
                "algorithm": c.method.algorithm,
                "params": params,
                "epsilon": c.epsilon,
                "delta": exp.delta,
                "seed": BASE_SEED + s,
                "eval_every": eval_every.get(c.method.name, 1),
                "budget": budgets.get(c.method.name),
                "eval_ratings": n_eval,
            }

            def compute(key, c=c, params=params, s=s, definition=definition):
                ds = runner.load(exp.datasets[c.dataset].spec)
                split = random_split(ds.interactions, seed=1234)
                keep = np.sort(
                    np.random.default_rng(0).choice(len(split.test), size=min(n_eval, len(split.test)), replace=False)
                )
                test = split.test.subset(np.isin(np.arange(len(split.test)), keep))
                cfg = ALSConfig.from_overrides(
                    {**{k: str(v) for k, v in params.items()}, "seed": str(BASE_SEED + s)}, c.method.algorithm
                )
                t = time.perf_counter()
                pts, ledger = time_curve(
                    c.method.algorithm,
                    split,
                    test,
                    ds.item_features,
                    cfg,
                    c.epsilon,
                    exp.delta,
                    tuple(float(x) for x in ds.rating_range),
                    int(definition["eval_every"]),
                    float(definition["budget"] or math.inf),
                )
                pts = [{**p, "train_seconds": round(p["train_seconds"], 3)} for p in pts]
                eps_spent = epsilon_bounds(ledger, exp.delta)[0] if c.method.private else None
                metrics = {
                    "algorithm": c.method.algorithm,
                    "dataset": c.dataset,
                    "epsilon": c.epsilon,
                    "delta": exp.delta,
                    "epsilon_spent": eps_spent,
                    "test_rmse_sample": pts[-1]["test_rmse"] if pts else None,
                    "curve": pts,
                    "wall_seconds": time.perf_counter() - t,
                    "config": cfg.to_dict(),
                }
                write_outputs(out / "runs" / f"{key}", metrics, ledger.to_list())
                return {"points": pts, "epsilon_spent": eps_spent, "wall": metrics["wall_seconds"]}

            doc = _cached(out, definition, compute, log, f"{c.label} seed {s}")
            pts = doc["points"]
            rows.append(
                {
                    "experiment": exp.name,
                    "cell": f"{c.dataset}|{c.method.name}|{c.epsilon}",
                    "method": c.method.name,
                    "algorithm": c.method.algorithm,
                    "dataset": c.dataset,
                    "epsilon": c.epsilon,
                    "delta": exp.delta,
                    "seed": BASE_SEED + s,
                    "engine": "inprocess",
                    "params": json.dumps(params, sort_keys=True),
                    "run_dir": f"runs/{doc['key']}",
                    "epsilon_spent": doc["epsilon_spent"],
                    "seconds": round(doc["wall"], 3),
                    "steps_done": pts[-1]["step"] if pts else 0,
                    "train_seconds": pts[-1]["train_seconds"] if pts else None,
                    "test_rmse": pts[-1]["test_rmse"] if pts else None,
                    "best_test_rmse": min(p["test_rmse"] for p in pts) if pts else None,
                }
            )
            curves += [
                {"dataset": c.dataset, "method": c.method.name, "epsilon": c.epsilon, "seed": BASE_SEED + s, **p}
                for p in pts
            ]

    tables, plots, headline = [], [], []
    if curves:
        write_csv(
            out / "tables/curves.csv",
            curves,
            first=("dataset", "method", "epsilon", "seed", "step", "train_seconds", "test_rmse"),
        )
        tables.append(
            {
                "file": "tables/curves.csv",
                "title": "Test RMSE after each evaluated step",
                "caption": "train_seconds excludes evaluation time; RMSE on a fixed sample of test ratings.",
            }
        )
        ratios = _ratios(curves)
        if ratios:
            write_csv(out / "tables/time_to_target.csv", ratios, first=("dataset", "epsilon", "seed", "target_rmse"))
            tables.append(
                {
                    "file": "tables/time_to_target.csv",
                    "title": "Training seconds to a common RMSE",
                    "caption": "target = the worse of the methods' best RMSE, so that every method reaches it.",
                }
            )
            for r in ratios:
                secs = {k[: -len("_seconds")]: v for k, v in r.items() if k.endswith("_seconds")}
                headline.append(
                    f"{r['dataset']}, ε = {r['epsilon']:g}, seed {r['seed']}: seconds to RMSE {r['target_rmse']:.4f}: "
                    + ", ".join(f"{m} {v:.1f}" if v is not None else f"{m} never" for m, v in secs.items())
                )
        png = out / "plots" / "time_evolution.png"
        _plot_curves(curves, png)
        plots.append(
            {
                "file": "plots/time_evolution.png",
                "caption": "Test RMSE against training seconds (one line per method and seed).",
            }
        )
    return {
        "rows": rows,
        "search_rows": [],
        "skipped": skipped,
        "tables": tables,
        "plots": plots,
        "headline": headline,
        "run_seconds": sum(r["seconds"] for r in rows),
        "cells": {"total": len(todo), "done": len(todo) - len(skipped), "skipped": len(skipped)},
    }


def _ratios(curves: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(c["dataset"], c["epsilon"], c["seed"]) for c in curves}, key=str)
    for d, e, s in keys:
        by = {}
        for c in curves:
            if (c["dataset"], c["epsilon"], c["seed"]) == (d, e, s):
                by.setdefault(c["method"], []).append(c)
        if len(by) < 2:
            continue
        target = max(min(p["test_rmse"] for p in pts) for pts in by.values())
        row = {"dataset": d, "epsilon": e, "seed": s, "target_rmse": target}
        for m, pts in by.items():
            row[f"{m}_seconds"] = next((p["train_seconds"] for p in pts if p["test_rmse"] <= target), None)
        out.append(row)
    return out


def _plot_curves(curves, png: Path) -> None:
    from .plots import _figure, _save

    dsets = list(dict.fromkeys((c["dataset"], c["epsilon"]) for c in curves))
    fig, axes, plt = _figure(len(dsets), panel=(5.2, 3.6))
    for ax, (d, e) in zip(axes, dsets):
        lines = {}
        for c in curves:
            if (c["dataset"], c["epsilon"]) == (d, e):
                lines.setdefault((c["method"], c["seed"]), []).append(c)
        methods = list(dict.fromkeys(m for m, _ in lines))
        for (m, s), pts in lines.items():
            ax.plot(
                [p["train_seconds"] for p in pts],
                [p["test_rmse"] for p in pts],
                marker="o",
                ms=3,
                color=f"C{methods.index(m)}",
                label=f"{m} (seed {s})",
            )
        ax.set_xscale("log")
        ax.set_xlabel("training seconds (log)")
        ax.set_ylabel("test RMSE")
        ax.set_title(f"{d}, ε = {e:g}" if e else d, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, plt, png, "")


# ------------------------------------------------------------------------------ selection
def selection_scenarios(exp, out: Path, cache: dict, *, log=print, require_data: bool = False) -> dict:
    from ...studies.selection import scenarios as sc

    eps = exp.settings.get("epsilons", list(sc.DEFAULT_EPSILONS))
    trials = exp.settings.get("trials", sc.DEFAULT_TRIALS)
    names = exp.settings.get("scenarios")
    mechs = exp.settings.get("mechanisms")
    seed = exp.settings.get("seed", 0)
    try:
        sc._check(eps, trials, names, mechs)
    except ConfigError as exc:
        raise ConfigError(str(exc), field=f"{exp.path}: settings") from None
    definition = {
        "kind": "selection_scenarios",
        "epsilons": eps,
        "trials": trials,
        "scenarios": names,
        "mechanisms": mechs,
        "seed": seed,
    }
    doc = _cached(
        out, definition, lambda key: {"rows": sc.run_scenarios(eps, trials, seed, names, mechs)}, log, "scenarios"
    )
    srows = doc["rows"]
    (out / "plots").mkdir(parents=True, exist_ok=True)
    files = sc.write_scenario_outputs(srows, out / "plots")
    plots = [
        {"file": f"plots/{Path(f).name}", "caption": _scenario_caption(Path(f).name)}
        for f in files
        if str(f).endswith(".png")
    ]
    rows = [
        {
            "experiment": exp.name,
            "cell": r["scenario"],
            "method": r["mechanism"],
            "algorithm": r["mechanism"],
            "dataset": r["scenario"],
            "epsilon": r["epsilon"],
            "seed": seed,
            "engine": "inprocess",
            "params": json.dumps({"trials": r["trials"]}),
            "run_dir": "",
            # the mechanism's ε parameter is the epsilon column; each cell's ledger stays inside
            # fedpriv.studies.selection.scenarios, so no spent epsilon is claimed here
            "epsilon_spent": None,
            "mse": r["mse"],
            "mse_se": r["mse_se"],
            "spearman": r["spearman"],
            "weighted_correlation": r["weighted_correlation"],
        }
        for r in srows
    ]

    tables, headline = [], []
    for e in [x for x in (0.1, 1.0, 8.0) if any(math.isclose(x, r["epsilon"]) for r in srows)]:
        mech = list(dict.fromkeys(r["mechanism"] for r in srows))
        table = []
        for s in dict.fromkeys(r["scenario"] for r in srows):
            row = {"scenario": s, "spearman": next(r["spearman"] for r in srows if r["scenario"] == s)}
            for m in mech:
                hit = [r for r in srows if r["scenario"] == s and r["mechanism"] == m and math.isclose(r["epsilon"], e)]
                if hit:
                    row[m] = hit[0]["mse"]
            table.append(row)
            priv = {m: v for m, v in row.items() if m in mech and m not in ("rnmh",)}
            if math.isclose(e, 1.0) and priv:
                best = min(priv, key=priv.get)
                headline.append(
                    f"{s} (Spearman {row['spearman']:+.2f}), ε = 1: best private {best} (MSE {priv[best]:.4f}); "
                    f"RNM {priv.get('rnm', float('nan')):.4f}"
                )
        name = f"tables/mse_eps{e:g}.csv"
        write_csv(out / name, table, first=("scenario", "spearman"))
        tables.append(
            {
                "file": name,
                "title": f"MSE to the optimum at ε = {e:g}",
                "caption": f"{trials} trials per cell; rnmh is the non-private reference.",
            }
        )
    return {
        "rows": rows,
        "search_rows": [],
        "skipped": [],
        "tables": tables,
        "plots": plots,
        "headline": headline,
        "cells": {"total": 1, "done": 1, "skipped": 0},
        "run_seconds": doc["seconds"],
    }


def _scenario_caption(name: str) -> str:
    group = name.removeprefix("selection_").removesuffix(".png").replace("_", " ")
    if group == "correlation relative":
        return "MSE relative to RNM against the mean Spearman correlation of scores and sensitivities"
    return f"{group} scenarios: MSE to the optimum against ε (±2 standard errors)"


def selection_bandit(exp, out: Path, cache: dict, *, log=print, require_data: bool = False) -> dict:
    from ...studies.selection import bandit as bd

    kw = {k: exp.settings[k] for k in ("eps_select", "eps_mean", "eps_quantile", "window", "seed") if k in exp.settings}
    T = exp.settings.get("horizon", bd.DEFAULTS["horizon"])
    reps = exp.settings.get("reps", bd.DEFAULTS["reps"])
    policies = exp.settings.get("policies", list(bd.DEFAULT_POLICIES))
    ucb_c = exp.settings.get("ucb_c", list(bd.DEFAULT_UCB_C))
    definition = {"kind": "selection_bandit", "T": T, "reps": reps, "policies": policies, "ucb_c": ucb_c, **kw}
    art = out / "artifacts" / "bandit"

    def compute(key):
        try:
            doc = bd.run_bandit(art, policies, T, reps, ucb_c=ucb_c, **kw)
        except ConfigError as exc:
            raise ConfigError(str(exc), field=f"{exp.path}: settings") from None
        return {"rows": doc["rows"], "summary": doc["summary"]}

    doc = _cached(out, definition, compute, log, "bandit")
    if not (art / "bandit.png").exists():  # a resumed run whose artifacts were removed
        bd.run_bandit(art, policies, T, reps, ucb_c=ucb_c, **kw)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(art / "bandit.png", out / "plots" / "bandit.png")
    rows = []
    for r in doc["rows"]:
        rows.append(
            {
                "experiment": exp.name,
                "cell": r["label"],
                "method": r["label"],
                "algorithm": r["policy"],
                "dataset": "two-armed bandit",
                "epsilon": r.get("epsilon_total"),
                "seed": kw.get("seed", bd.DEFAULTS["seed"]),
                "engine": "inprocess",
                "params": json.dumps({"T": T, "reps": reps}),
                "run_dir": "",
                "epsilon_spent": r.get("epsilon_total"),
                "seconds": r.get("seconds"),
                **{
                    k: r.get(k)
                    for k in (
                        "final_regret_mean",
                        "final_regret_std",
                        "post_shift_regret_mean",
                        "post_shift_regret_std",
                        "epsilon_per_action",
                    )
                },
            }
        )

    write_csv(
        out / "tables/regret.csv",
        [
            {
                k: r.get(k)
                for k in (
                    "method",
                    "epsilon_spent",
                    "final_regret_mean",
                    "final_regret_std",
                    "post_shift_regret_mean",
                    "post_shift_regret_std",
                )
            }
            for r in rows
        ],
        first=("method",),
    )
    s = doc["summary"]
    headline = [
        f"best policy {s['best']}; best private {s['best_private']}; "
        f"best private after the shift {s['best_private_after_shift']}"
    ]
    return {
        "rows": rows,
        "search_rows": [],
        "skipped": [],
        "tables": [
            {
                "file": "tables/regret.csv",
                "title": "Regret",
                "caption": f"T = {T}, {reps} repetitions; arms swap at T/2.",
            }
        ],
        "plots": [{"file": "plots/bandit.png", "caption": "Cumulative regret, mean ± std over repetitions"}],
        "headline": headline,
        "run_seconds": doc["seconds"],
        "cells": {"total": 1, "done": 1, "skipped": 0},
    }
