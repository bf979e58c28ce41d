"""The ``grid`` kind: data sets × methods × epsilons, each cell tuned on validation and re-run
with several noise seeds.

Protocol of one cell (dataset, method, epsilon):

1. Search: ``search.trials`` configurations drawn at random from the method's search space
   (the draws depend on the search seed and the method's base name only, so the methods of one
   sweep, and the epsilons of one method, see the same candidates). Each is trained with the
   search seed and scored on the validation metric: ``valid_rmse`` (min), ``valid_recall_at_20``
   (max), ``valid_logloss`` (min), or, for a data set given with a separate ``validation`` data
   set, the test metric of a run on that data set. With ``scope = "reference"`` the search runs
   once per (dataset, method) at ``reference_epsilon`` and its choice serves every epsilon. The
   test metric is never looked at by the search. Like the literature's protocol, the search is
   not itself private (private tuning is ``fedpriv run --tune``); every trial is listed. With
   ``include_defaults = true`` trial 0 is the method's own parameters with nothing drawn (what
   ``fedpriv run`` does with no ``--set``), so a tuned result is never chosen over the default
   unless a drawn configuration scores better on validation.
2. Final runs: the chosen configuration with ``seeds`` noise seeds (1235, 1236, ...); each run
   writes ``runs/ID/metrics.json`` and ``ledger.json`` and one row of ``results.csv``.

Finished searches and cells are stored under ``search/`` and ``cells/`` by a hash of everything
that defines them, so a re-run (after an interruption, or with more data sets) recomputes only
what is missing.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...util import atomic
from ...errors import ConfigError
from .config import Experiment, Method

BASE_SEED = 1234
FIRST_COLUMNS = (
    "experiment",
    "cell",
    "method",
    "algorithm",
    "dataset",
    "epsilon",
    "delta",
    "seed",
    "engine",
    "params",
    "run_dir",
    "epsilon_spent",
    "rounds",
    "bytes_up",
    "bytes_down",
    "seconds",
)
_REC_KEYS = (
    "mse_to_best",
    "hit_rate",
    "argmax_hit_rate",
    "uniform_hit_rate",
    "spearman_mean_binned",
    "spearman_positive_share",
)
_AUTO_METRICS = (("valid_rmse", "min"), ("valid_recall_at_20", "max"), ("valid_logloss", "min"))
_VALIDATION_METRICS = (("test_rmse", "min"), ("test_recall_at_20", "max"), ("test_mse", "min"), ("test_logloss", "min"))


def stable_hash(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class Cell:
    dataset: str
    method: Method
    epsilon: float | None

    @property
    def label(self) -> str:
        return f"{self.dataset} / {self.method.name} / eps={self.epsilon}"


def cells(exp: Experiment) -> list[Cell]:
    """Non-private methods (one cell per data set) first: they are the reference of the
    neighbour analysis."""
    out = []
    for d in exp.grid_datasets:
        for m in sorted(exp.methods, key=lambda m: m.private):
            if m.datasets is not None and d not in m.datasets:
                continue
            for e in exp.epsilons if m.private else [None]:
                out.append(Cell(d, m, e))
    return out


def candidates(space: dict, search: dict, base_name: str = "") -> list[dict]:
    """The configurations a search tries: every combination (mode grid) or ``trials`` random
    draws (mode random; the draws depend on the search seed and the method's base name)."""
    keys = sorted(space)
    first = [{}] if search.get("include_defaults") else []
    if search.get("mode") == "grid":
        import itertools

        return first + [dict(zip(keys, combo)) for combo in itertools.product(*(space[k] for k in keys))]
    rng = np.random.default_rng([search["seed"], int(stable_hash(base_name), 16) % (2**32)])
    drawn = [{k: space[k][int(rng.integers(len(space[k])))] for k in keys} for _ in range(search["trials"])]
    return first + drawn


def cell_params(exp: Experiment, cell: Cell, candidate: dict | None = None) -> dict:
    """A run's parameters: the grid's, the method's, a search candidate's, then the data set's
    own and the quick mode's, which win (e.g. the only feature field a data set has)."""
    m = cell.method
    return {**exp.params, **m.params, **(candidate or {}), **m.dataset_params.get(cell.dataset, {}), **m.forced}


def as_number(v) -> float | None:
    """A finite float from a value or CSV cell; None for anything else (missing, text, nan)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


#: Metrics where higher is better (recall, accuracy, hit rates, neighbour overlap); every other
#: metric (RMSE, MSE, log-loss, subspace error) is better when lower. The one rule of the search,
#: the summaries and the headlines.
HIGHER_IS_BETTER = ("recall", "accuracy", "hit", "overlap")


def metric_direction(metric: str) -> str:
    """ "max" for a metric where higher is better, else "min"."""
    return "max" if any(word in metric for word in HIGHER_IS_BETTER) else "min"


def flatten_metrics(metrics: dict) -> dict:
    """The numeric results of one run as flat columns."""
    row: dict = {}
    for k, v in metrics.items():
        if k.startswith(("valid_", "test_")) and not k.endswith("sliced") and isinstance(v, (int, float)):
            row[k] = v
    for k in ("subspace_error", "epsilon_training", "epsilon_spent_pld", "rho_zcdp"):
        if isinstance(metrics.get(k), (int, float)):
            row[k] = metrics[k]
    for part, prefix in (("sliced", "test_bucket_"), ("valid_sliced", "valid_bucket_")):
        for b in metrics.get(part) or []:
            val = next((b[k] for k in ("rmse", "recall", "logloss") if k in b), None)
            if isinstance(val, (int, float)) and "bucket" in b:
                row[f"{prefix}{b['bucket']}"] = val
    rank, refs = metrics.get("ranking"), metrics.get("references") or {}
    if isinstance(rank, dict) and isinstance(rank.get("recall"), (int, float)):  # top-k lists (issue 33)
        k = rank["k"]
        row[f"test_ranking_recall_at_{k}"], row[f"test_ranking_ndcg_at_{k}"] = rank["recall"], rank["ndcg"]
        row["ranking_median_train_count"], row["ranking_coverage"] = rank["median_train_count"], rank["coverage"]
        if isinstance(refs.get("popular_recall"), (int, float)):
            row[f"popular_recall_at_{k}"] = refs["popular_recall"]
    rec = metrics.get("recommendation")
    if isinstance(rec, dict):
        for k in _REC_KEYS:
            if isinstance(rec.get(k), (int, float)):
                row[f"rec_{k}"] = rec[k]
        if isinstance(rec.get("epsilon"), (int, float)):
            row["rec_epsilon_spent"] = rec["epsilon"]
    return row


class GridRunner:
    """Runs the cells of one grid experiment into ``out`` (see :mod:`fedpriv.ops.experiments.runner`)."""

    def __init__(self, exp: Experiment, out: Path, data_cache: dict, log, require_data: bool = False):
        self.exp, self.out, self.cache, self.log = exp, out, data_cache, log
        self.require_data = require_data
        self.skipped: list[dict] = []
        self.search_rows: list[dict] = []
        self.rows: list[dict] = []
        self._missing: dict[str, str] = {}

    # ------------------------------------------------------------------ data
    def missing_reason(self, dname: str) -> str | None:
        if dname in self._missing:
            return self._missing[dname]
        from ...data.spec import parse_data_spec

        ds = self.exp.datasets[dname]
        reason = None
        for spec in filter(None, (ds.spec, ds.validation)):
            s = parse_data_spec(spec, ds.options or None)
            if s.path is not None and not Path(s.path).exists():
                reason = f"data not found: {s.path} (give --data-root, or download it)"
                if self.require_data:
                    raise ConfigError(reason, field=f"{self.exp.path}: datasets.{dname}")
        self._missing[dname] = reason
        return reason

    def options(self, spec: str) -> dict:
        """The csv/parquet options the config gives with ``spec`` ([datasets] NAME.options)."""
        for d in self.exp.datasets.values():
            if spec in (d.spec, d.validation):
                return dict(d.options)
        return {}

    def load(self, spec: str):
        if spec not in self.cache:
            from ...data.spec import load_spec, parse_data_spec

            t = time.perf_counter()
            self.cache[spec] = load_spec(parse_data_spec(spec, self.options(spec) or None))
            self.log(f"  loaded {spec} in {time.perf_counter() - t:.1f} s")
        return self.cache[spec]

    # ------------------------------------------------------------------ one run
    def run_one(
        self,
        cell: Cell,
        params: dict,
        seed: int,
        *,
        spec: str,
        run_dir: str | None,
        epsilon,
        capture: dict | None = None,
    ) -> dict:
        from ...run import Job, write_outputs
        from ..engines import engine_named

        exp, m = self.exp, cell.method
        t = time.perf_counter()
        job = Job(
            m.algorithm,
            spec,
            epsilon=epsilon if m.private else None,
            delta=exp.delta,
            params={**params, "seed": seed},
            data_options=self.options(spec),
            dataset=self.load(spec),
        )
        # the RDP epsilon is reported; the PLD cross-check costs a second per run
        outcome = job.prepare().execute(engine_named(exp.engine), second_opinion=False)
        metrics, ledger = outcome.report.to_json(), outcome.ledger
        if capture is not None:
            capture.update(state=outcome.state, train=outcome.train, dataset=outcome.dataset)
        seconds = time.perf_counter() - t
        if run_dir:
            write_outputs(self.out / run_dir, metrics, ledger)
        row = {
            "experiment": exp.name,
            "method": m.name,
            "algorithm": m.algorithm,
            "dataset": cell.dataset,
            "epsilon": epsilon if m.private else None,
            "delta": exp.delta,
            "seed": seed,
            "engine": exp.engine,
            "params": json.dumps(params, sort_keys=True),
            "run_dir": run_dir or "",
            "epsilon_spent": metrics.get("epsilon_spent"),
            "rounds": metrics.get("rounds"),
            "bytes_up": metrics.get("bytes_up"),
            "bytes_down": metrics.get("bytes_down"),
            "seconds": round(seconds, 3),
        }
        if m.sweep_key:
            row["sweep_key"], row["sweep_value"] = m.sweep_key, m.sweep_value
        row["method_base"] = m.base
        row.update(flatten_metrics(metrics))
        return row

    # ------------------------------------------------------------------ search
    def search(self, cell: Cell) -> tuple[dict, dict | None]:
        """(chosen params, the chosen trial's row); stored under search/KEY.json."""
        exp, m = self.exp, cell.method
        base = cell_params(exp, cell)
        if not m.search or exp.search["trials"] < 1:
            return base, None
        ds = exp.datasets[cell.dataset]
        eps = cell.epsilon
        if exp.search["scope"] == "reference" and m.private:
            eps = exp.search["reference_epsilon"]
        spec = ds.validation or ds.spec
        key_doc = {
            "spec": spec,
            "algorithm": m.algorithm,
            "base": base,
            "space": m.search,
            "trials": exp.search["trials"],
            "seed": exp.search["seed"],
            "metric": exp.search["metric"],
            "mode": exp.search["mode"],
            "epsilon": eps,
            "delta": exp.delta,
            "engine": exp.engine,
            "draws": m.base,
            **({"include_defaults": True} if exp.search.get("include_defaults") else {}),
        }
        key = stable_hash(key_doc)
        path = self.out / "search" / f"{key}.json"
        if path.exists():
            doc = json.loads(path.read_text())
        else:
            trials = []
            for i, cand in enumerate(candidates(m.search, exp.search, m.base)):
                row = self.run_one(cell, cell_params(exp, cell, cand), BASE_SEED, spec=spec, run_dir=None, epsilon=eps)
                row.update({"trial": i, "candidate": json.dumps(cand, sort_keys=True)})
                trials.append(row)
            metric, direction = self._search_metric(trials[0], validation=ds.validation is not None)
            for r in trials:
                v = r.get(metric)
                r["search_metric"] = metric
                r["search_value"] = v
            best = min(range(len(trials)), key=lambda i: _score(trials[i].get(metric), direction))
            for i, r in enumerate(trials):
                r["selected"] = int(i == best)
            doc = {
                "key": key,
                "definition": key_doc,
                "trials": trials,
                "best": best,
                "metric": metric,
                "direction": direction,
            }
            _atomic_json(path, doc)
        best = doc["trials"][doc["best"]]
        chosen = cell_params(exp, cell, json.loads(best["candidate"]))
        for r in doc["trials"]:
            self.search_rows.append(
                {**r, "cell": f"{cell.dataset}|{m.name}|{cell.epsilon}", "search_key": key, "for_epsilon": cell.epsilon}
            )
        return chosen, best

    def _search_metric(self, row: dict, validation: bool) -> tuple[str, str]:
        metric = self.exp.search["metric"]
        if metric != "auto":
            if metric not in row:
                raise ConfigError(
                    f"the runs report no metric {metric!r} "
                    f"(they report: {', '.join(k for k in row if k.startswith(('valid_', 'test_')))})",
                    field=f"{self.exp.path}: search.metric",
                )
            return metric, metric_direction(metric)
        for name, direction in _VALIDATION_METRICS if validation else _AUTO_METRICS:
            if name in row:
                return name, direction
        raise ConfigError(
            "no validation metric in the runs: set search.metric, or give the data set a validation data set",
            field=f"{self.exp.path}: search.metric",
        )

    # ------------------------------------------------------------------ cells
    def run_cell(self, cell: Cell) -> list[dict] | None:
        exp, m = self.exp, cell.method
        reason = self.missing_reason(cell.dataset)
        if reason:
            self.skipped.append({"cell": cell.label, "reason": reason})
            return None
        chosen, best = self.search(cell)
        key_doc = {
            "spec": exp.datasets[cell.dataset].spec,
            "method": m.name,
            "algorithm": m.algorithm,
            "params": chosen,
            "epsilon": cell.epsilon,
            "delta": exp.delta,
            "seeds": exp.seeds,
            "engine": exp.engine,
            "neighbours": bool(exp.analysis.get("neighbours")),
        }
        key = stable_hash(key_doc)
        path = self.out / "cells" / f"{key}.json"
        if path.exists():
            doc = json.loads(path.read_text())
            self.log(f"  {cell.label}: done before ({len(doc['rows'])} runs)")
        else:
            rows, t0 = [], time.perf_counter()
            for s in range(1, exp.seeds + 1):
                cap: dict = {}
                row = self.run_one(
                    cell,
                    chosen,
                    BASE_SEED + s,
                    spec=exp.datasets[cell.dataset].spec,
                    run_dir=f"runs/{key}-s{s}",
                    epsilon=cell.epsilon,
                    capture=cap,
                )
                if best is not None:
                    row["search_value_at_selection"] = best.get("search_value")
                    row["search_metric"] = best.get("search_metric")
                if exp.analysis.get("neighbours"):
                    row.update(self._neighbours(cell, cap, s, key))
                rows.append(row)
            doc = {"key": key, "definition": key_doc, "rows": rows, "seconds": time.perf_counter() - t0}
            _atomic_json(path, doc)
            self.log(f"  {cell.label}: {len(rows)} runs in {doc['seconds']:.1f} s")
        for r in doc["rows"]:
            r["cell"] = f"{cell.dataset}|{m.name}|{cell.epsilon}"
        self.rows.extend(doc["rows"])
        return doc["rows"]

    # ------------------------------------------------------------------ neighbours
    def _neighbours(self, cell: Cell, cap: dict, s: int, key: str) -> dict:
        """Overlap of every item's top-k cosine neighbours with those of the reference
        (non-private) model of this data set, by item-frequency bucket; the reference's own
        embeddings are stored under models/."""
        from ...algorithms.metrics import frequency_buckets
        from .neighbours import neighbours, overlap_by_bucket, overlap_per_item

        exp = self.exp
        k = int(exp.analysis.get("neighbours_k", 10))
        state, train = cap["state"], cap["train"]
        V = np.asarray(state.item_factors, dtype=np.float64)
        models = self.out / "models"
        models.mkdir(parents=True, exist_ok=True)
        ref_name = exp.analysis["reference_method"]
        ref_path = models / f"{cell.dataset}.npz"
        nn = neighbours(V, k)
        counts = train.item_counts()
        buckets = frequency_buckets(counts)
        out: dict = {}
        if cell.method.name == ref_name and s == 1:
            tmp = ref_path.with_suffix(".tmp.npz")
            np.savez(tmp, V=V, nn=nn, counts=counts)
            tmp.replace(ref_path)
        if ref_path.exists():
            ref = np.load(ref_path)
            ov = overlap_by_bucket(nn, ref["nn"], buckets)
            out = {f"nn_overlap_bucket_{b}": v for b, v in enumerate(ov)}
            out["nn_overlap"] = float(overlap_per_item(nn, ref["nn"]).mean())
        if s == 1:
            np.save(models / f"{key}-nn.npy", nn[:, : int(exp.analysis.get("neighbours_shown", 5))])
        return out


def _score(v, direction: str) -> float:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return math.inf
    return v if direction == "min" else -v


def _atomic_json(path: Path, doc) -> None:
    atomic.write_text(path, json.dumps(doc, indent=1, default=_json_default, allow_nan=False) + "\n")


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(type(o).__name__)


def _cell_value(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else repr(v)
    return v


def write_csv(path: Path, rows: list[dict], first: tuple = FIRST_COLUMNS) -> None:
    cols = list(first) + sorted({k for r in rows for k in r} - set(first))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: _cell_value(r.get(c)) for c in cols})
    atomic.write_text(path, buf.getvalue())
