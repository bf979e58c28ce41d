"""``fedpriv experiment [--quick] --out DIR CONFIG...``: run experiment configs, resumably.

Each config writes ``DIR/NAME/``: ``experiment.json`` (metadata, plots, tables, skipped cells,
headline results), ``results.csv`` (tidy: one row per run), ``search.csv`` (every search trial,
the chosen one marked), ``tables/*.csv``, ``plots/*.png`` and ``runs/ID/{metrics,ledger}.json``.
Finished cells are kept under ``cells/`` and ``search/`` and are not recomputed. Every config is
validated before anything runs. ``fedpriv report DIR --out FILE.html`` renders the folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from . import config as config_mod
from .grid import (
    BASE_SEED,
    FIRST_COLUMNS,
    GridRunner,
    _atomic_json,
    as_number,
    cells,
    metric_direction,
    write_csv,
)

SUMMARY_METRICS = (
    "test_rmse",
    "test_recall_at_20",
    "test_mse",
    "test_logloss",
    "subspace_error",
    "rec_mse_to_best",
    "rec_hit_rate",
    "nn_overlap",
    "final_regret_mean",
    "post_shift_regret_mean",
    "mse",
    "test_ranking_recall_at_10",
    "test_ranking_ndcg_at_10",
)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def summary_rows(rows: list[dict], keys=("dataset", "method", "epsilon")) -> list[dict]:
    """Mean and std over seeds of the headline metrics, per (dataset, method, epsilon)."""
    groups: dict = defaultdict(list)
    for r in rows:
        groups[tuple(r.get(k) for k in keys)].append(r)
    out = []
    for key, rs in groups.items():
        row = dict(zip(keys, key))
        row["n"] = len(rs)
        for m in SUMMARY_METRICS:
            vals = [v for v in (as_number(r.get(m)) for r in rs) if v is not None]
            if vals:
                row[f"{m}_mean"] = float(np.mean(vals))
                row[f"{m}_std"] = float(np.std(vals))
        eps = [v for v in (as_number(r.get("epsilon_spent")) for r in rs) if v is not None]
        if eps:
            row["epsilon_spent"] = max(eps)
        for m in ("rounds", "bytes_up", "bytes_down", "seconds"):
            vals = [v for v in (as_number(r.get(m)) for r in rs) if v is not None]
            if vals:
                row[m] = float(np.mean(vals))
        out.append(row)
    return out


def primary_metrics(exp) -> list[str]:
    """Candidate headline metrics: the plotted ones first, then the usual test metrics."""
    return [p["y"] for p in exp.plots if p["type"] in ("curve", "sweep") and isinstance(p.get("y"), str)] + list(
        SUMMARY_METRICS
    )


def grid_headline(exp, summary: list[dict]) -> list[str]:
    """Per (dataset, epsilon): the best private method by the data set's primary metric (the
    first candidate it reports), and the non-private reference. A swept method's rows are
    summarised per value of the sweep (its method name carries it)."""
    lines = []
    for d in dict.fromkeys(r["dataset"] for r in summary):
        rows_d = [r for r in summary if r["dataset"] == d]
        metric = next((m for m in primary_metrics(exp) if any(f"{m}_mean" in r for r in rows_d)), None)
        if metric is None:
            continue
        direction = metric_direction(metric)
        ref = [r for r in rows_d if r.get("epsilon") is None and f"{metric}_mean" in r]
        ref_txt = "; ".join(f"{r['method']} (no ε) {r[f'{metric}_mean']:.4g}" for r in ref)
        for e in sorted({r["epsilon"] for r in rows_d if r.get("epsilon") is not None}):
            cand = [r for r in rows_d if r.get("epsilon") == e and f"{metric}_mean" in r]
            if not cand:
                continue
            best = (min if direction == "min" else max)(cand, key=lambda r: r[f"{metric}_mean"])
            lines.append(
                f"{d}, ε = {e:g}: best {best['method']} with {metric} "
                f"{best[f'{metric}_mean']:.4g} ± {best[f'{metric}_std']:.2g} "
                f"(n = {best['n']})" + (f"; {ref_txt}" if ref_txt else "")
            )
    return lines


def neighbours_table(exp, runner: GridRunner, out: Path) -> list[dict]:
    """Qualitative table: the first few neighbours of some well-known items under the
    non-private model and each private method (first seed, at ``neighbours_epsilon``)."""
    titles = exp.analysis.get("titles") or []
    if not titles:
        return []
    tables = []
    eps_cfg = exp.analysis.get("neighbours_epsilon")
    for d in exp.grid_datasets:
        if runner.missing_reason(d):
            continue
        ds = runner.load(exp.datasets[d].spec)
        names = getattr(ds.item_features, "names", None) if ds.item_features is not None else None
        if not names:
            continue
        found = [(t, names.index(t)) for t in titles if t in names]
        rows = []
        eps_avail = sorted({r["epsilon"] for r in runner.rows if r["dataset"] == d and r["epsilon"] is not None})
        eps = eps_cfg if eps_cfg is not None else (eps_avail[-1] if eps_avail else None)
        for r in runner.rows:
            if r["dataset"] != d or r["seed"] != BASE_SEED + 1 or r["epsilon"] not in (None, eps):
                continue
            path = out / "models" / f"{Path(r['run_dir']).name.rsplit('-s', 1)[0]}-nn.npy"
            if not path.exists():
                continue
            nn = np.load(path)
            for title, idx in found:
                rows.append(
                    {
                        "item": title,
                        "model": r["method"] + ("" if r["epsilon"] is None else f" (ε={r['epsilon']:g})"),
                        "neighbours": "; ".join(names[j] for j in nn[idx]),
                    }
                )
        if rows:
            rows.sort(key=lambda x: (titles.index(x["item"]), x["model"]))
            name = f"tables/neighbours_{d}.csv"
            write_csv(out / name, rows, first=("item", "model", "neighbours"))
            tables.append(
                {
                    "file": name,
                    "title": f"Nearest neighbours on {d}",
                    "caption": (
                        f"The {exp.analysis.get('neighbours_shown', 5)} most cosine-similar items under each model "
                        f"(first seed; private models at ε = {eps:g})."
                    )
                    if eps
                    else "",
                }
            )
    return tables


def run_grid(exp, out: Path, cache: dict, *, log=print, require_data: bool = False, progress=None) -> dict:
    """The cells of a grid experiment, then its tables, headline and plots: the same result
    shape as :func:`fedpriv.ops.experiments.kinds.run`."""
    runner = GridRunner(exp, out, cache, log, require_data)
    todo = cells(exp)
    counts = {"total": len(todo), "done": 0, "skipped": 0}
    for i, c in enumerate(todo):
        log(f" [{i + 1}/{len(todo)}] {c.label}")
        done = runner.run_cell(c)
        counts["done" if done is not None else "skipped"] += 1
        if progress is not None:
            progress(dict(counts), runner.skipped)
    rows = runner.rows
    # a reference-scope search serves several cells: list each trial once, with the epsilons it served
    merged: dict = {}
    for r in runner.search_rows:
        key = (r["search_key"], r["trial"])
        if key in merged:
            merged[key]["for_epsilon"] = f"{merged[key]['for_epsilon']};{r['for_epsilon']}"
        else:
            merged[key] = dict(r)
    search_rows = list(merged.values())
    summary = summary_rows(rows)
    tables = []
    if summary:
        write_csv(out / "tables/summary.csv", summary, first=("dataset", "method", "epsilon", "n"))
        tables.append(
            {
                "file": "tables/summary.csv",
                "title": "Summary",
                "caption": (
                    "Mean ± std over noise seeds of the configuration chosen on validation; "
                    "epsilon_spent is the largest over the seeds, from each run's ledger."
                ),
            }
        )
    chosen = {}
    for r in rows:
        chosen.setdefault(
            (r["dataset"], r["method"], r["epsilon"]),
            {
                "dataset": r["dataset"],
                "method": r["method"],
                "epsilon": r["epsilon"],
                "search_metric": r.get("search_metric"),
                "validation_at_selection": r.get("search_value_at_selection"),
                "params": r["params"],
            },
        )
    if chosen:
        write_csv(
            out / "tables/chosen.csv",
            list(chosen.values()),
            first=("dataset", "method", "epsilon", "search_metric", "validation_at_selection", "params"),
        )
        tables.append(
            {
                "file": "tables/chosen.csv",
                "title": "Chosen configurations",
                "caption": (
                    "The configuration each cell chose on its validation metric (every trial is in the search listing)."
                ),
            }
        )
    if exp.analysis.get("neighbours"):
        tables += neighbours_table(exp, runner, out)
    plots = []
    labels = {d: exp.datasets[d].labels for d in exp.datasets}
    from .plots import draw

    chance = {}
    for d in exp.grid_datasets:  # overlap of k random neighbours among n - 1 items: k / (n - 1)
        ref = out / "models" / f"{d}.npz"
        if exp.analysis.get("neighbours") and ref.exists():
            n = int(np.load(ref)["nn"].shape[0])
            chance[d] = min(1.0, int(exp.analysis.get("neighbours_k", 10)) / max(1, n - 1))
    for spec in exp.plots:
        if spec["type"] == "overlap":
            spec = {**spec, "chance": chance}
        png = out / "plots" / f"{spec['file']}.png"
        cap = draw(spec, rows, png, labels)
        if cap is not None:
            plots.append({"file": f"plots/{spec['file']}.png", "caption": cap})
    return {
        "rows": rows,
        "search_rows": search_rows,
        "skipped": runner.skipped,
        "tables": tables,
        "plots": plots,
        "headline": grid_headline(exp, summary),
        "cells": counts,
        "run_seconds": sum(as_number(r.get("seconds")) or 0.0 for r in [*rows, *search_rows]),
    }


def run_experiment(exp, out: Path, cache: dict, *, require_data: bool = False, log=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    meta = {
        "name": exp.name,
        "title": exp.title,
        "description": exp.description,
        "kind": exp.kind,
        "config_file": str(exp.path),
        "config_text": exp.text,
        "quick": exp.quick,
        "engine": exp.engine,
        "order": exp.order,
        "started": _now(),
        "finished": None,
        "seconds": None,
        "cells": {"total": 0, "done": 0, "skipped": 0},
        "skipped": [],
        "plots": [],
        "tables": [],
        "headline": [exp.headline] if exp.headline else [],
        "commands": exp.commands,
    }
    log(f"experiment {exp.name} ({exp.kind}{', quick' if exp.quick else ''}) -> {out}")

    def progress(cells_done: dict, skipped: list) -> None:  # experiment.json after every cell
        meta.update({"cells": cells_done, "skipped": skipped, "seconds": time.perf_counter() - t0})
        _atomic_json(out / "experiment.json", meta)

    if exp.kind == "grid":
        res = run_grid(exp, out, cache, log=log, require_data=require_data, progress=progress)
    else:
        from . import kinds

        if exp.engine != "inprocess":
            log(
                f"  note: {exp.kind} runs in-process (it times or simulates on one machine); "
                f"--engine {exp.engine} does not apply"
            )
        meta["engine"] = "inprocess"
        res = kinds.run_kind(exp, out, cache, log=log, require_data=require_data)
    rows, search_rows, skipped, tables, plots, headline = (
        res[k] for k in ("rows", "search_rows", "skipped", "tables", "plots", "headline")
    )
    meta["cells"] = res["cells"]
    write_csv(out / "results.csv", rows)
    if search_rows:
        write_csv(
            out / "search.csv",
            search_rows,
            first=(
                *FIRST_COLUMNS,
                "search_key",
                "for_epsilon",
                "trial",
                "candidate",
                "search_metric",
                "search_value",
                "selected",
            ),
        )
    elif (out / "search.csv").exists():
        (out / "search.csv").unlink()
    meta.update(
        {
            "skipped": skipped,
            "plots": plots,
            "tables": tables,
            "headline": meta["headline"] + headline,
            "finished": _now(),
            "seconds": time.perf_counter() - t0,
            "runs": len(rows),
            "search_trials": len(search_rows),
            # the runs' own wall time, whether computed now or in an earlier (resumed) invocation
            "run_seconds": res["run_seconds"],
        }
    )
    _atomic_json(out / "experiment.json", meta)
    log(f"experiment {exp.name}: {len(rows)} runs, {len(skipped)} cells skipped, {meta['seconds']:.1f} s")
    for h in headline:
        log(f"  {h}")
    return meta


def parse_dataset_specs(items: list[str] | None) -> dict[str, str]:
    from ...run import parse_overrides

    out = parse_overrides(items or [], field="--dataset", form="NAME=SPEC")
    empty = next((name for name, spec in out.items() if not spec), None)
    if empty is not None:
        raise ConfigError(f"expected NAME=SPEC, got {empty + '='!r}", field="--dataset")
    return out


def run_configs(
    configs: list[str],
    out: str | Path,
    *,
    quick: bool = False,
    engine: str | None = None,
    data_root: str | None = None,
    require_data: bool = False,
    only: list[str] | None = None,
    dataset_specs: dict[str, str] | None = None,
    only_datasets: list[str] | None = None,
    log=print,
) -> list[dict]:
    if not configs:
        raise ConfigError("give at least one config file", field="CONFIG")
    exps = [
        config_mod.load(
            c, quick=quick, data_root=data_root, engine=engine, dataset_specs=dataset_specs, only_datasets=only_datasets
        )
        for c in configs
    ]
    seen: dict = {}
    for e in exps:
        if e.name in seen:
            raise ConfigError(
                f"experiment name {e.name!r} is used by {seen[e.name]} too", field=f"{e.path}: experiment.name"
            )
        seen[e.name] = e.path
    if only:
        unknown = [n for n in only if n not in seen]
        if unknown:
            raise ConfigError(f"no experiment named {unknown[0]!r} (known: {', '.join(seen)})", field="--only")
        exps = [e for e in exps if e.name in only]
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a folder", field="--out")
    cache: dict = {}
    metas = []
    t0 = time.perf_counter()
    for e in sorted(exps, key=lambda e: (e.order, e.name)):
        metas.append(run_experiment(e, out / e.name, cache, require_data=require_data, log=log))
    log(f"{len(metas)} experiments in {time.perf_counter() - t0:.1f} s -> {out}")
    return metas


def add_experiment_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "configs", nargs="+", metavar="CONFIG", help="experiment configs (TOML), e.g. simulations/experiments/*.toml"
    )
    p.add_argument(
        "--out", required=True, help="results folder (one subfolder per experiment; finished cells are reused)"
    )
    p.add_argument(
        "--quick", action="store_true", help="each config's [quick] values: small data and grids (CI runs this)"
    )
    p.add_argument("--engine", default=None, help="inprocess or flower: overrides every config's engine")
    p.add_argument(
        "--data-root",
        default=None,
        help="folder of the downloaded data sets ({data} in the configs; default: $FEDPRIV_DATA, else ./data)",
    )
    p.add_argument(
        "--require-data",
        action="store_true",
        help="a missing data set is an error (default: its cells are skipped and listed)",
    )
    p.add_argument(
        "--only", default=None, metavar="NAME[,NAME...]", help="run only these experiments (by name, comma-separated)"
    )
    p.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="add or replace a data set of every config, e.g. ml-20m=ml-20m:/data/ml-20m.zip (repeatable)",
    )
    p.add_argument(
        "--datasets",
        default=None,
        metavar="NAME[,NAME...]",
        help="run these data sets (comma-separated) instead of each config's grid.datasets",
    )


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def experiment_command(args) -> int:
    metas = run_configs(
        args.configs,
        args.out,
        quick=args.quick,
        engine=args.engine,
        data_root=args.data_root,
        require_data=args.require_data,
        only=_names(args.only),
        dataset_specs=parse_dataset_specs(args.dataset),
        only_datasets=_names(args.datasets),
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )
    print(
        json.dumps(
            {
                "experiments": [
                    {
                        "name": m["name"],
                        "runs": m["runs"],
                        "skipped": len(m["skipped"]),
                        "seconds": round(m["seconds"], 1),
                    }
                    for m in metas
                ]
            }
        )
    )
    return 0
