"""Plots of a grid experiment's tidy rows (matplotlib, Agg, PNG).

Types (``[[plots]]`` in the config):

- ``curve``: ``y`` against ``x`` (default epsilon), one panel per data set, one line per method,
  mean ± std over seeds as error bars; non-private methods as horizontal dashed lines.
- ``sweep``: ``y`` against the swept parameter, one line per (method, epsilon).
- ``buckets``: ``y`` = a bucketed metric prefix (``test_bucket``) at one ``epsilon``: grouped bars
  per item-frequency bucket (0 = rarest), one bar per method.
- ``overlap``: the same for ``nn_overlap_bucket``: neighbour overlap with the non-private model.
- ``bars``: one panel per metric in ``y`` (e.g. rounds, bytes_up, test_rmse), one bar per method.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from .grid import as_number

_LABELS = {
    "test_rmse": "test RMSE",
    "valid_rmse": "validation RMSE",
    "test_recall_at_20": "test Recall@20",
    "test_mse": "test MSE",
    "bytes_up": "bytes up",
    "bytes_down": "bytes down",
    "rounds": "rounds",
    "seconds": "seconds per run",
    "epsilon": "ε",
    "rec_mse_to_best": "MSE of the pick to the best score",
    "rec_hit_rate": "hit rate",
    "nn_overlap": "neighbour overlap",
}


def _mean_std(vals):
    vals = [v for v in (as_number(x) for x in vals) if v is not None]
    if not vals:
        return None, None
    return float(np.mean(vals)), float(np.std(vals))


def _figure(n: int, panel=(4.6, 3.4)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(n, 3)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel[0] * ncols, panel[1] * nrows + 0.4), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n]), plt


def _save(fig, plt, path: Path, title: str) -> None:
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    tmp.replace(path)


def _select(rows, spec):
    ds = spec.get("datasets")
    ms = spec.get("methods")
    return [
        r
        for r in rows
        if (ds is None or r["dataset"] in ds) and (ms is None or r["method"] in ms or r.get("method_base") in ms)
    ]


def draw(spec: dict, rows: list[dict], out_png: Path, labels: dict | None = None) -> str | None:
    """Draw one plot; returns its caption, or None when no row has the metric."""
    rows = _select(rows, spec)
    kind = spec["type"]
    fn = {"curve": _curve, "sweep": _sweep, "buckets": _buckets, "overlap": _buckets, "bars": _bars}[kind]
    return fn(spec, rows, out_png, labels or {})


def _ylabel(spec, y):
    return spec.get("ylabel") or _LABELS.get(y, y)


def _mean_line(ax, pts: dict, label: str) -> None:
    """One line of mean ± std (error bars) over the values at each x of ``pts`` (x -> values)."""
    xs = sorted(pts)
    ms = [_mean_std(pts[v]) for v in xs]
    ax.errorbar(xs, [a for a, _ in ms], yerr=[b for _, b in ms], marker="o", ms=3.5, capsize=2.5, lw=1.4, label=label)


def _finish(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _datasets(rows):
    return list(dict.fromkeys(r["dataset"] for r in rows))


def _curve(spec, rows, out_png, labels):
    y, x = spec["y"], spec.get("x", "epsilon")
    rows = [r for r in rows if as_number(r.get(y)) is not None]
    if not rows:
        return None
    dsets = _datasets(rows)
    fig, axes, plt = _figure(len(dsets))
    for ax, d in zip(axes, dsets):
        groups = defaultdict(lambda: defaultdict(list))
        flat = defaultdict(list)
        for r in rows:
            if r["dataset"] != d:
                continue
            xv = as_number(r.get(x))
            if xv is None:
                flat[r["method"]].append(r[y])
            else:
                groups[r["method"]][xv].append(r[y])
        for m, pts in groups.items():
            _mean_line(ax, pts, m)
        for m, vals in flat.items():
            mean, _ = _mean_std(vals)
            ax.axhline(mean, ls="--", color="0.3", lw=1.2, label=f"{m} (non-private)")
        if spec.get("logx", x == "epsilon"):
            ax.set_xscale("log")
            xs_all = sorted({v for pts in groups.values() for v in pts})
            if xs_all:
                ax.set_xticks(xs_all)
                ax.set_xticklabels([f"{v:g}" for v in xs_all])
        if spec.get("logy"):
            ax.set_yscale("log")
        _finish(ax, labels.get(d, d), _LABELS.get(x, x), _ylabel(spec, y))
    _save(fig, plt, out_png, spec.get("title", ""))
    return spec.get("title") or f"{_ylabel(spec, y)} against {_LABELS.get(x, x)}: mean ± std over seeds"


def _sweep(spec, rows, out_png, labels):
    y = spec["y"]
    rows = [r for r in rows if as_number(r.get(y)) is not None and as_number(r.get("sweep_value")) is not None]
    if not rows:
        return None
    dsets = _datasets(rows)
    fig, axes, plt = _figure(len(dsets))
    xkey = rows[0].get("sweep_key", "value")
    for ax, d in zip(axes, dsets):
        groups = defaultdict(lambda: defaultdict(list))
        for r in rows:
            if r["dataset"] == d:
                eps = as_number(r.get("epsilon"))
                groups[(r.get("method_base") or r["method"], eps)][as_number(r["sweep_value"])].append(r[y])
        for (m, eps), pts in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            _mean_line(ax, pts, f"{m}, ε={eps:g}" if eps else m)
        if spec.get("logx"):
            ax.set_xscale("log")
        _finish(ax, labels.get(d, d), spec.get("x") or xkey, _ylabel(spec, y))
    _save(fig, plt, out_png, spec.get("title", ""))
    return spec.get("title") or f"{_ylabel(spec, y)} against {xkey}"


def _buckets(spec, rows, out_png, labels):
    prefix = "nn_overlap_bucket" if spec["type"] == "overlap" else spec["y"]
    eps = as_number(spec.get("epsilon"))
    keep = [
        r
        for r in rows
        if (eps is None or as_number(r.get("epsilon")) in (eps, None)) and as_number(r.get(f"{prefix}_0")) is not None
    ]
    if spec["type"] == "overlap":
        keep = [r for r in keep if as_number(r.get("epsilon")) is not None]
    if not keep:
        return None
    dsets = _datasets(keep)
    fig, axes, plt = _figure(len(dsets), panel=(5.4, 3.4))
    for ax, d in zip(axes, dsets):
        methods = list(dict.fromkeys(r["method"] for r in keep if r["dataset"] == d))
        width = 0.8 / max(1, len(methods))
        for i, m in enumerate(methods):
            mr = [r for r in keep if r["dataset"] == d and r["method"] == m]
            ms = [_mean_std([r.get(f"{prefix}_{b}") for r in mr]) for b in range(5)]
            ax.bar(
                np.arange(5) + (i - (len(methods) - 1) / 2) * width,
                [a or 0 for a, _ in ms],
                width,
                yerr=[s or 0 for _, s in ms],
                capsize=2,
                label=m,
            )
        if spec.get("chance", {}).get(d) is not None:
            ax.axhline(spec["chance"][d], ls="--", color="0.2", lw=1.2, label="chance (random neighbours)")
        ax.set_xticks(range(5))
        ax.set_xticklabels(["0 (rarest)", "1", "2", "3", "4 (most rated)"], fontsize=8)
        ax.set_xlabel("item-frequency bucket")
        ax.set_ylabel(
            "top-k neighbour overlap with non-private"
            if spec["type"] == "overlap"
            else _ylabel(spec, prefix.replace("_bucket", ""))
        )
        ax.set_title(labels.get(d, d) + (f", ε={eps:g}" if eps else ""), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    _save(fig, plt, out_png, spec.get("title", ""))
    return spec.get("title") or "by item-frequency bucket (0 = rarest fifth of the items)"


def _bars(spec, rows, out_png, labels):
    ys = spec["y"] if isinstance(spec["y"], list) else [spec["y"]]
    eps = as_number(spec.get("epsilon"))
    rows = [r for r in rows if eps is None or as_number(r.get("epsilon")) in (eps, None)]
    panels = [
        (d, y)
        for d in _datasets(rows)
        for y in ys
        if any(as_number(r.get(y)) is not None for r in rows if r["dataset"] == d)
    ]
    if not panels:
        return None
    fig, axes, plt = _figure(len(panels), panel=(4.2, 3.4))
    for ax, (d, y) in zip(axes, panels):
        methods = list(
            dict.fromkeys(r["method"] for r in rows if r["dataset"] == d and as_number(r.get(y)) is not None)
        )
        ms = [_mean_std([r.get(y) for r in rows if r["dataset"] == d and r["method"] == m]) for m in methods]
        ax.bar(
            range(len(methods)),
            [a for a, _ in ms],
            yerr=[s for _, s in ms],
            capsize=3,
            color=[f"C{i}" for i in range(len(methods))],
        )
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels(methods, rotation=20, ha="right", fontsize=8)
        if spec.get("logy") or y.startswith("bytes"):
            ax.set_yscale("log")
        ax.set_ylabel(_ylabel(spec, y))
        ax.set_title(labels.get(d, d), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    _save(fig, plt, out_png, spec.get("title", ""))
    return spec.get("title") or ", ".join(_LABELS.get(y, y) for y in ys) + " per method"
