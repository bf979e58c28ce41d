"""Experiment configs (TOML): parsing and validation.

One file describes one experiment: what to run (``kind``), on which data sets, with which
methods, epsilons, seeds and hyperparameter search, and which plots to draw. ``[quick]`` lists
the values that ``--quick`` replaces. Every error names the file and the field
(``curves.toml: methods.adadpals.search.mu: ...``) and is raised before anything runs.

Schema of the ``grid`` kind (the others are in :mod:`fedpriv.ops.experiments.kinds`)::

    [experiment]
    name = "curves"            # folder name under --out
    title = "..."; description = "..."; kind = "grid"; engine = "inprocess"; order = 1
    headline = "..."           # optional: what the experiment is meant to show

    [datasets]                 # name -> data spec ({data} is --data-root) or a table (spec, validation, label,
                               #   options = { rating_range = "1,5", items = "{data}/items.csv" } for csv/parquet)
    ml-100k = "ml-100k:{data}/ml-100k/ml-100k.zip"
    personal = { spec = "synthetic-personal:users=5000,seed=0", validation = "synthetic-personal:users=5000,seed=1" }

    [grid]
    datasets = ["ml-100k"]; epsilons = [1, 5, 10, 20]; seeds = 3; delta = 1e-5
    params = { users_per_node = 50 }             # run options and hyperparameters of every run

    [search]                   # hyperparameter search on validation (random, seeded)
    trials = 6; scope = "cell"                   # or "reference": search at reference_epsilon only
    mode = "random"                              # or "grid": every combination of the space
    reference_epsilon = 5.0; metric = "auto"     # auto: valid_rmse / valid_recall_at_20 / valid_logloss
    include_defaults = true                      # trial 0: the method's own params, no candidate keys

    [methods.adadpals-mu0.25]
    algorithm = "adadpals"; params = { mu = 0.25 }; search = { rank = [1, 2, 4] }
    sweep = { mu = [0, 0.25, 0.5] }              # optional: one method per value (x axis of "sweep" plots)
    datasets = ["ml-100k"]                       # optional: only these data sets
    dataset_params = { ml-100k = { features = "genre,year" } }

    [analysis]
    neighbours = true; neighbours_k = 10; reference_method = "als"; titles = ["Star Wars (1977)"]

    [[plots]]
    type = "curve"; y = "test_rmse"; x = "epsilon"; file = "rmse_vs_epsilon"; title = "..."

    [quick]                    # what --quick replaces (same keys as [grid] and [search], plus params)
    datasets = ["synthetic-small"]; epsilons = [1, 10]; seeds = 1; trials = 2
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError
from ..engines import ENGINE_NAMES as ENGINES  # the one table of engines

KINDS = ("grid", "time_evolution", "selection_scenarios", "selection_bandit")
PLOT_TYPES = ("curve", "sweep", "buckets", "bars", "overlap")
_GRID_KEYS = {"datasets", "epsilons", "seeds", "delta", "params", "methods"}
_SEARCH_KEYS = {"trials", "scope", "reference_epsilon", "metric", "seed", "mode", "include_defaults"}
_QUICK_KEYS = _GRID_KEYS | _SEARCH_KEYS | {"dataset_params", "settings", "method_params"}


@dataclass
class Method:
    name: str
    algorithm: str
    params: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)  # key -> list of candidate values
    datasets: list[str] | None = None
    dataset_params: dict = field(default_factory=dict)  # dataset -> params
    sweep_key: str | None = None
    sweep_value: object = None
    base: str = ""  # the method's name before a sweep expanded it
    private: bool = True
    label: str = ""
    forced: dict = field(default_factory=dict)  # [quick] method_params: win over the search and the data set's params


@dataclass
class DatasetEntry:
    name: str
    spec: str
    validation: str | None = None  # a second data set for the search (no validation split of its own)
    labels: str = ""
    options: dict = field(default_factory=dict)  # csv/parquet options of spec and validation (--data-opt), as strings


@dataclass
class Experiment:
    path: Path
    text: str
    name: str
    title: str
    description: str
    kind: str
    engine: str
    order: int
    headline: str
    datasets: dict[str, DatasetEntry]
    grid_datasets: list[str]
    epsilons: list[float | None]
    seeds: int
    delta: float
    params: dict
    methods: list[Method]
    search: dict
    analysis: dict
    plots: list[dict]
    settings: dict  # kind-specific settings ([settings] table)
    quick: bool
    commands: list[str] = field(default_factory=list)

    def where(self, key: str) -> str:
        return f"{self.path.name}: {key}"


def _err(path: Path, key: str, msg: str) -> ConfigError:
    return ConfigError(msg, field=f"{path}: {key}")


def _table(path: Path, doc: dict, key: str, required: bool = False) -> dict:
    val = doc.get(key, None)
    if val is None:
        if required:
            raise _err(path, key, "missing table")
        return {}
    if not isinstance(val, dict):
        raise _err(path, key, f"must be a table, got {type(val).__name__}")
    return val


def _str(path: Path, tbl: dict, key: str, where: str, default: str | None = None) -> str:
    val = tbl.get(key, default)
    if val is None:
        raise _err(path, f"{where}.{key}", "missing (a string is required)")
    if not isinstance(val, str):
        raise _err(path, f"{where}.{key}", f"must be a string, got {val!r}")
    return val


def _number(path: Path, key: str, val, *, positive=True, integer=False, allow_none=False):
    if val is None and allow_none:
        return None
    ok = isinstance(val, int if integer else (int, float)) and not isinstance(val, bool)
    if not ok or (positive and not val > 0) or not math.isfinite(val):
        kind = "a positive integer" if integer else ("a positive number" if positive else "a number")
        raise _err(path, key, f"must be {kind}, got {val!r}")
    return val


def _scalar_params(path: Path, key: str, params) -> dict:
    if not isinstance(params, dict):
        raise _err(path, key, f"must be a table of key = value, got {params!r}")
    for k, v in params.items():
        if not isinstance(v, (str, int, float, bool)):
            raise _err(path, f"{key}.{k}", f"must be a string, number or boolean, got {v!r}")
    return dict(params)


def _lists(path: Path, key: str, space) -> dict:
    if not isinstance(space, dict):
        raise _err(path, key, f"must be a table of key = [values], got {space!r}")
    for k, v in space.items():
        if not isinstance(v, list) or not v:
            raise _err(path, f"{key}.{k}", f"must be a non-empty list of values, got {v!r}")
        for x in v:
            if not isinstance(x, (str, int, float, bool)):
                raise _err(path, f"{key}.{k}", f"values must be strings, numbers or booleans, got {x!r}")
    return {k: list(v) for k, v in space.items()}


def _check_keys(path: Path, where: str, tbl: dict, allowed: set[str]) -> None:
    unknown = sorted(set(tbl) - allowed)
    if unknown:
        raise _err(
            path,
            f"{where}.{unknown[0]}" if where else unknown[0],
            f"unknown key (allowed: {', '.join(sorted(allowed))})",
        )


def default_data_root() -> str:
    """``$FEDPRIV_DATA``, else ``data`` (relative to the working folder): the library names no
    folder outside the project."""
    import os

    return os.environ.get("FEDPRIV_DATA") or "data"


def load(
    path: str | Path,
    *,
    quick: bool = False,
    data_root: str | None = None,
    engine: str | None = None,
    dataset_specs: dict[str, str] | None = None,
    only_datasets: list[str] | None = None,
) -> Experiment:
    """Parse and validate one config; ``quick`` applies its ``[quick]`` table.
    ``dataset_specs`` (``--dataset NAME=SPEC``) adds or replaces data sets; ``only_datasets``
    (``--datasets``) replaces the grid's list (e.g. a paper-scale ``ml-20m``). ``data_root``:
    the folder of the downloaded data sets (``{data}`` in the configs; default
    :func:`default_data_root`)."""
    data_root = default_data_root() if data_root is None else str(data_root)
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the config: {exc.strerror}", field=str(path)) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", field=str(path)) from None
    _check_keys(
        path, "", doc, {"experiment", "datasets", "grid", "search", "methods", "analysis", "plots", "quick", "settings"}
    )
    exp = _table(path, doc, "experiment", required=True)
    _check_keys(
        path, "experiment", exp, {"name", "title", "description", "kind", "engine", "order", "headline", "commands"}
    )
    name = _str(path, exp, "name", "experiment")
    if not name or any(c in name for c in "/\\ ") or name.startswith("."):
        raise _err(path, "experiment.name", f"must be a plain folder name, got {name!r}")
    kind = _str(path, exp, "kind", "experiment", "grid")
    if kind not in KINDS:
        raise _err(path, "experiment.kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    eng = engine or _str(path, exp, "engine", "experiment", "inprocess")
    if eng not in ENGINES:
        raise _err(
            path,
            "experiment.engine" if engine is None else "--engine",
            f"unknown engine {eng!r} (known: {', '.join(ENGINES)})",
        )
    order = exp.get("order", 100)
    if not isinstance(order, int) or isinstance(order, bool):
        raise _err(path, "experiment.order", f"must be an integer, got {order!r}")
    commands = exp.get("commands", [])
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        raise _err(path, "experiment.commands", "must be a list of strings")

    grid = dict(_table(path, doc, "grid"))
    _check_keys(path, "grid", grid, _GRID_KEYS)
    search = dict(_table(path, doc, "search"))
    _check_keys(path, "search", search, _SEARCH_KEYS)
    settings = dict(_table(path, doc, "settings"))
    quick_tbl = _table(path, doc, "quick")
    _check_keys(path, "quick", quick_tbl, _QUICK_KEYS)
    quick_dataset_params: dict = {}
    quick_method_params: dict = {}
    if quick:
        for k, v in quick_tbl.items():
            if k in _GRID_KEYS:
                grid[k] = v
            elif k in _SEARCH_KEYS:
                search[k] = v
            elif k == "settings":
                settings.update(_table(path, quick_tbl, "settings"))
            elif k == "method_params":
                quick_method_params = _table(path, quick_tbl, "method_params")
            else:
                quick_dataset_params = _table(path, quick_tbl, "dataset_params")

    datasets: dict[str, DatasetEntry] = {}
    for dname, val in _table(path, doc, "datasets").items():
        key = f"datasets.{dname}"
        if isinstance(val, str):
            val = {"spec": val}
        if not isinstance(val, dict):
            raise _err(path, key, "must be a data spec string or a table with spec (and validation)")
        _check_keys(path, key, val, {"spec", "validation", "label", "options"})
        spec = _str(path, val, "spec", key).replace("{data}", data_root)
        valid = val.get("validation")
        if valid is not None and not isinstance(valid, str):
            raise _err(path, f"{key}.validation", "must be a data spec string")
        options = _table(path, val, "options")
        if not all(isinstance(v, (str, int, float, bool)) for v in options.values()):
            raise _err(
                path,
                f"{key}.options",
                'must map option names to strings or numbers (e.g. rating_range = "1,5", items = "{data}/items.csv")',
            )
        options = {
            str(k): (str(int(v)) if isinstance(v, bool) else str(v)).replace("{data}", data_root)
            for k, v in options.items()
        }
        datasets[dname] = DatasetEntry(
            dname, spec, valid.replace("{data}", data_root) if valid else None, str(val.get("label", dname)), options
        )
    for dname, spec in (dataset_specs or {}).items():
        old = datasets.get(dname)
        datasets[dname] = DatasetEntry(dname, spec.replace("{data}", data_root), None, old.labels if old else dname)
    if only_datasets:
        if kind in ("selection_scenarios", "selection_bandit"):
            raise _err(path, "--datasets", f"a {kind} experiment has no data sets")
        grid["datasets"] = list(only_datasets)
    for dname, spec, options in [(d.name, d.spec, d.options) for d in datasets.values()] + [
        (d.name, d.validation, d.options) for d in datasets.values() if d.validation
    ]:
        from ...data.spec import parse_data_spec

        try:
            parse_data_spec(spec, options or None)
        except ConfigError as exc:
            raise _err(path, f"datasets.{dname}", str(exc)) from None

    grid_datasets = grid.get("datasets", list(datasets))
    if not isinstance(grid_datasets, list) or not all(isinstance(d, str) for d in grid_datasets):
        raise _err(path, "grid.datasets", "must be a list of data set names")
    for d in grid_datasets:
        if d not in datasets:
            raise _err(
                path,
                "grid.datasets" if not only_datasets else "--datasets",
                f"unknown data set {d!r} (defined in [datasets]: {', '.join(datasets) or 'none'}; "
                "add one with --dataset NAME=SPEC)",
            )
    for d, p in quick_dataset_params.items():
        if d not in datasets:
            raise _err(path, "quick.dataset_params", f"unknown data set {d!r}")
        _scalar_params(path, f"quick.dataset_params.{d}", p)
    eps_raw = grid.get("epsilons")
    if eps_raw is not None and (not isinstance(eps_raw, list) or not eps_raw):
        raise _err(path, "grid.epsilons", "must be a non-empty list of positive numbers")
    epsilons = [None] if eps_raw is None else [_number(path, "grid.epsilons", e) for e in eps_raw]
    seeds = _number(path, "grid.seeds", grid.get("seeds", 1), integer=True)
    delta = _number(path, "grid.delta", grid.get("delta", 1e-5))
    if not delta < 1:
        raise _err(path, "grid.delta", f"must be in (0, 1), got {delta!r}")
    params = _scalar_params(path, "grid.params", grid.get("params", {}))

    s_trials = _number(path, "search.trials", search.get("trials", 1), integer=True)
    scope = search.get("scope", "cell")
    if scope not in ("cell", "reference"):
        raise _err(path, "search.scope", f"must be cell or reference, got {scope!r}")
    ref_eps = _number(path, "search.reference_epsilon", search.get("reference_epsilon", 5.0))
    metric = search.get("metric", "auto")
    if not isinstance(metric, str):
        raise _err(path, "search.metric", "must be a metric name or auto")
    search_seed = _number(path, "search.seed", search.get("seed", 2024), positive=False, integer=True)
    mode = search.get("mode", "random")
    if mode not in ("random", "grid"):
        raise _err(path, "search.mode", f"must be random (trials draws) or grid (every combination), got {mode!r}")
    include_defaults = search.get("include_defaults", False)
    if not isinstance(include_defaults, bool):
        raise _err(path, "search.include_defaults", f"must be true or false, got {include_defaults!r}")
    search_cfg = {
        "trials": s_trials,
        "scope": scope,
        "reference_epsilon": float(ref_eps),
        "metric": metric,
        "seed": search_seed,
        "mode": mode,
        "include_defaults": include_defaults,
    }

    from ...algorithms.families import all_algorithms
    from ...algorithms.names import is_private

    known_algs = all_algorithms()
    methods: list[Method] = []
    only = grid.get("methods")
    if only is not None and (not isinstance(only, list) or not all(isinstance(m, str) for m in only)):
        raise _err(path, "grid.methods", "must be a list of method names")
    method_tbl = _table(path, doc, "methods", required=(kind == "grid"))
    for mname, p in quick_method_params.items():
        if mname not in method_tbl:
            raise _err(path, "quick.method_params", f"unknown method {mname!r}")
        _scalar_params(path, f"quick.method_params.{mname}", p)
    if only is not None:
        for m in only:
            if m not in method_tbl:
                raise _err(path, "grid.methods", f"unknown method {m!r} (defined: {', '.join(method_tbl)})")
    for mname, m in method_tbl.items():
        key = f"methods.{mname}"
        if not isinstance(m, dict):
            raise _err(path, key, "must be a table")
        _check_keys(path, key, m, {"algorithm", "params", "search", "datasets", "dataset_params", "sweep", "label"})
        alg = _str(path, m, "algorithm", key)
        if alg not in known_algs:
            raise _err(path, f"{key}.algorithm", f"unknown algorithm {alg!r} (known: {', '.join(known_algs)})")
        mp = _scalar_params(path, f"{key}.params", m.get("params", {}))
        ms = _lists(path, f"{key}.search", m.get("search", {}))
        mds = m.get("datasets")
        if mds is not None and (not isinstance(mds, list) or any(d not in datasets for d in mds)):
            raise _err(path, f"{key}.datasets", f"must list data sets defined in [datasets], got {mds!r}")
        dps = _table(path, m, "dataset_params")
        for d, p in dps.items():
            if d not in datasets:
                raise _err(path, f"{key}.dataset_params", f"unknown data set {d!r}")
            _scalar_params(path, f"{key}.dataset_params.{d}", p)
        dps = {d: dict(p) for d, p in dps.items()}
        for d, p in quick_dataset_params.items():
            dps[d] = {**dps.get(d, {}), **p}
        private = is_private(alg)
        label = str(m.get("label", mname))
        if only is not None and mname not in only:
            continue
        sweep = m.get("sweep")
        forced = dict(quick_method_params.get(mname, {}))
        if sweep is None:
            methods.append(
                Method(mname, alg, mp, ms, mds, dps, base=mname, private=private, label=label, forced=forced)
            )
            continue
        sweep = _lists(path, f"{key}.sweep", sweep)
        if len(sweep) != 1:
            raise _err(path, f"{key}.sweep", "must have exactly one key")
        ((skey, values),) = sweep.items()
        for v in values:
            methods.append(
                Method(
                    f"{mname} {skey}={v}",
                    alg,
                    {**mp, skey: v},
                    ms,
                    mds,
                    dps,
                    skey,
                    v,
                    base=mname,
                    private=private,
                    label=f"{label} {skey}={v}",
                    forced=forced,
                )
            )
    if kind == "grid" and not methods:
        raise _err(path, "methods", "no method to run")
    if kind == "grid" and any(m.private for m in methods) and epsilons == [None]:
        raise _err(path, "grid.epsilons", "private methods need epsilons")

    analysis = dict(_table(path, doc, "analysis"))
    _check_keys(
        path,
        "analysis",
        analysis,
        {"neighbours", "neighbours_k", "reference_method", "titles", "neighbours_epsilon", "neighbours_shown"},
    )
    if analysis.get("neighbours"):
        ref = analysis.get("reference_method")
        if not isinstance(ref, str) or ref not in {m.name for m in methods}:
            raise _err(path, "analysis.reference_method", f"must name a method of this experiment, got {ref!r}")
        _number(path, "analysis.neighbours_k", analysis.setdefault("neighbours_k", 10), integer=True)
        titles = analysis.setdefault("titles", [])
        if not isinstance(titles, list) or not all(isinstance(t, str) for t in titles):
            raise _err(path, "analysis.titles", "must be a list of strings")

    plots = doc.get("plots", [])
    if not isinstance(plots, list):
        raise _err(path, "plots", "must be an array of tables ([[plots]])")
    for i, p in enumerate(plots):
        key = f"plots[{i}]"
        if not isinstance(p, dict):
            raise _err(path, key, "must be a table")
        _check_keys(
            path,
            key,
            p,
            {"type", "x", "y", "file", "title", "epsilon", "logx", "logy", "datasets", "methods", "ylabel", "dataset"},
        )
        if p.get("type") not in PLOT_TYPES:
            raise _err(path, f"{key}.type", f"must be one of {', '.join(PLOT_TYPES)}, got {p.get('type')!r}")
        _str(path, p, "file", key)
        if p["type"] != "overlap":
            y = p.get("y")
            if not (isinstance(y, str) or (isinstance(y, list) and y and all(isinstance(v, str) for v in y))):
                raise _err(path, f"{key}.y", "must be a metric name or a list of them")

    desc = exp.get("description", "")
    if not isinstance(desc, str):
        raise _err(path, "experiment.description", "must be a string")
    return Experiment(
        path=path,
        text=text,
        name=name,
        title=_str(path, exp, "title", "experiment", name),
        description=desc,
        kind=kind,
        engine=eng,
        order=order,
        headline=str(exp.get("headline", "")),
        datasets=datasets,
        grid_datasets=grid_datasets,
        epsilons=[None if e is None else float(e) for e in epsilons],
        seeds=int(seeds),
        delta=float(delta),
        params=params,
        methods=methods,
        search=search_cfg,
        analysis=analysis,
        plots=plots,
        settings=settings,
        quick=quick,
        commands=list(commands),
    )
