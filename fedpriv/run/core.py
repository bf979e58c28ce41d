"""One training run, end to end: :func:`prepare` validates, loads and splits (no training);
:func:`execute` trains on an engine, evaluates and builds ``metrics.json`` and the ledger
records; :func:`write_outputs` writes both files (both or neither). :class:`fedpriv.run.job.Job`
and its :class:`~fedpriv.run.job.Plan` are the public face of these functions."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..algorithms import evaluation
from ..algorithms import als, registry
from ..algorithms import protocol as algorithm_protocol
from ..algorithms.names import is_private
from ..data.spec import (
    HELDOUT_KINDS,
    DataSpec,
    load_spec,
    parse_data_spec,
    require_declared_catalogue,
)
from ..data.splits import HeldoutSplit, heldout_users_split, random_split
from ..engine.inprocess import train_inprocess
from ..errors import ConfigError, did_you_mean
from ..algorithms.metrics import run_header
from ..privacy.accounting import ADD_REMOVE, current_relation, epsilon_bounds, epsilon_pld_second_opinion, epsilon_spent
from ..privacy.randomness import RunSecrets
from .nodes import SECURE_USERS_PER_NODE, node_layout

ENGINES = ("inprocess", "flower")


@dataclass
class RunOptions:
    """Run-level settings (not hyperparameters of the algorithm)."""

    split: str = "auto"  # 'random' (RMSE), 'heldout' (Recall@k) or 'auto' (by data set)
    split_seed: int = 1234
    heldout_fraction: float = 0.0  # share of users per held-out group (a public hash of the raw user id decides); 0 = 0.0722 for ML-20M/25M (about 10,000 users), else 0.1
    users_per_shard: int = 0  # in-process engine: users per shard (0: by the node layout)
    users_per_node: int = 0  # users held by each node, every engine (0: not given; fedpriv.run.nodes)
    nodes: int = 0  # number of nodes, every engine (0: not given; fedpriv.run.nodes)
    round_timeout: float = 0.0  # flower engine: seconds to wait for replies per round (0 = no limit)
    node_wait: float = 120.0  # flower engine: seconds to wait for the nodes to register
    tune: str = ""  # private tuning grid "key=v1/v2;key2=..." (fedpriv.run.tuning); "" = no tuning
    tune_mean: float = 5.0  # expected number of tuning runs E[K]
    tune_shape: float = 1.0  # truncated negative binomial shape (1 geometric, 0 logarithmic)
    tune_share: float = 0.05  # share of one run's budget for its private validation score
    tune_score_clip: float = 0.0  # per-user validation MSE clip (0: (half the rating range)^2)
    tune_view: str = "auto"  # what the tuning's epsilon covers: selected (K hidden; in process only), all (every run, K seen), auto (flower: all)
    recommend: str = ""  # private recommendation after training: a selection mechanism ("" = none)
    rec_epsilon: float = 1.0  # per-user pure epsilon of the reported item
    rec_candidates: int = 100
    rec_sensitivity: str = "quantile"  # quantile (private histogram), norm (public bound) or range
    rec_hist_epsilon: float = 1.0  # histogram release of the quantile source, at rec_hist_delta
    rec_hist_delta: float = 1e-6
    rec_bins: int = 40
    rec_user_clip: float = 1.0
    rec_params: str = ""  # mechanism parameters "beta:0.1;lam:0.25" (fedpriv.privacy.selection)
    rec_exclude_rated: int = 1  # 1: a user's training items score lo_a (recommend unseen items)

    @classmethod
    def pop_from(cls, overrides: dict) -> RunOptions:
        opts = cls()
        for key in list(overrides):
            if key in cls.__dataclass_fields__:
                raw = overrides.pop(key)
                typ = type(getattr(opts, key))
                try:
                    setattr(opts, key, typ(float(raw)) if typ is int else typ(raw))
                except ValueError:
                    raise ConfigError(f"expected {typ.__name__}, got {raw!r}", field=key) from None
        if opts.split not in ("auto", "random", "heldout"):
            raise ConfigError(f"must be auto, random or heldout, got {opts.split!r}", field="split")
        if opts.recommend:
            opts.recommend_config().validate()
        return opts

    def recommend_config(self):
        """The :class:`~fedpriv.algorithms.recommend.RecommendConfig` of ``recommend`` and ``rec_*``."""
        from ..algorithms.recommend import RecommendConfig

        params: dict = {}
        for part in filter(None, (p.strip() for p in self.rec_params.split(";"))):
            key, colon, value = part.partition(":")
            if not colon or not key.strip():
                raise ConfigError(f"expected key:value, got {part!r}", field="rec_params")
            try:
                params[key.strip()] = float(value)
            except ValueError:
                params[key.strip()] = value.strip()
        return RecommendConfig(
            mechanism=self.recommend, epsilon=self.rec_epsilon, candidates=self.rec_candidates, sensitivity=self.rec_sensitivity,
            bins=self.rec_bins, hist_epsilon=self.rec_hist_epsilon, hist_delta=self.rec_hist_delta, user_clip=self.rec_user_clip,
            params=params, exclude_rated=bool(self.rec_exclude_rated),
        )


def parse_overrides(pairs: list[str], field: str = "--set", form: str = "key=value") -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"expected {form}, got {p!r}", field=field)
        out[key.strip()] = value.strip()
    return out


REPRODUCIBLE_WARNING = (
    "reproducible noise: every noise value and every user's random choice of this run can be "
    "regenerated from the noise seed; its privacy holds only against those who do not hold that seed"
)


def noise_statement(secrets: RunSecrets) -> dict:
    """What ``metrics.json`` says about the run's randomness (never the seed itself)."""
    if secrets.reproducible:
        return {"noise": "reproducible", "noise_warning": REPRODUCIBLE_WARNING}
    return {"noise": "secret (OS CSPRNG; users' choices from their own secret keys)"}


def _finite_or_none(x: float | None):
    return None if x is None or not math.isfinite(x) else x


def load_and_check(job) -> dict:
    """Everything before training (the fields of a :class:`~fedpriv.run.job.Plan`): validate the
    algorithm, privacy and options, load and split the data, check the catalogue. Raises
    :class:`ConfigError` / :class:`DataError`; trains nothing."""
    from ..algorithms import pam

    algorithm, epsilon = job.algorithm, job.epsilon
    if algorithm not in als.ALGORITHMS and algorithm not in pam.PAM_ALGORITHMS:
        known = (*als.ALGORITHMS, *pam.PAM_ALGORITHMS)
        raise ConfigError(f"unknown algorithm {algorithm!r} (known: {', '.join(known)}){did_you_mean(algorithm, known)}", field="algorithm")
    private = is_private(algorithm)
    if private and epsilon is None:
        raise ConfigError(f"algorithm {algorithm!r} is private: give --epsilon", field="--epsilon")
    if private:
        check_privacy_target(epsilon, job.delta)
    if job.noise_seed is not None and (isinstance(job.noise_seed, bool) or not isinstance(job.noise_seed, int)):
        raise ConfigError(f"must be an integer, got {job.noise_seed!r}", field="--noise-seed")
    spec, ds = resolve_data(job.data, job.data_options)
    if job.dataset is not None:
        ds = job.dataset
    overrides = dict(job.params)
    if algorithm in pam.PAM_ALGORITHMS:
        if spec.kind != "synthetic-personal":
            raise ConfigError(f"{algorithm} needs --data synthetic-personal:users=N,samples=M,d=D,k=K,noise=S,seed=R", field="--data")
        engine_keys = {k: overrides.pop(k) for k in ("users_per_node", "users_per_shard", "nodes") if k in overrides}
        cfg = pam.PAMConfig.from_overrides(overrides)
        ds = ds if ds is not None else load_spec(spec)
        return dict(spec=spec, dataset=ds, private=private, options=None, config=cfg, protocol="personalization", split=None,
                    rating_range=None, implicit=False, recommend=None, public=None, engine_params=engine_keys)
    opts = RunOptions.pop_from(overrides)
    cfg = als.ALSConfig.from_overrides(overrides, algorithm)
    if spec.kind == "synthetic-personal":
        raise ConfigError(f"{algorithm!r} trains on ratings; synthetic-personal data is for {', '.join(pam.PAM_ALGORITHMS)}", field="--data")
    ds = ds if ds is not None else load_spec(spec)
    rec_cfg = opts.recommend_config() if opts.recommend else None
    if ds.interactions is None:  # a partitioned deployment's public folder: the server holds no ratings
        public = ds
        if public.protocol != "random" or opts.split not in ("auto", "random"):
            raise ConfigError(f"a partitioned deployment evaluates on the nodes with the random split; got {opts.split if opts.split != 'auto' else public.protocol!r}", field="split")
        if opts.tune:
            raise ConfigError("private tuning runs on the in-process engine", field="tune")
        if opts.split_seed != RunOptions.split_seed and opts.split_seed != public.split_seed:
            raise ConfigError(f"the nodes split with the partition's public seed {public.split_seed}", field="split_seed")
        rating_range = (0.0, 1.0) if public.implicit else tuple(public.rating_range)
        return dict(spec=spec, dataset=public, private=private, options=opts, config=cfg, protocol="random", split=None,
                    rating_range=rating_range, implicit=public.implicit, recommend=rec_cfg, public=public, engine_params={})
    # a private run needs an item catalogue that does not depend on the ratings (before any training)
    if registry.get(algorithm).private:
        require_declared_catalogue(ds, spec, f"algorithm {algorithm!r}")
    elif opts.recommend:
        require_declared_catalogue(ds, spec, f"the private recommendation (recommend={opts.recommend})")
    protocol = opts.split
    if protocol == "auto":
        protocol = "heldout" if (ds.implicit or spec.kind in HELDOUT_KINDS) else "random"
    inter = ds.interactions
    if protocol == "random":
        split = random_split(inter, seed=opts.split_seed)
        implicit = ds.implicit
    else:
        frac = opts.heldout_fraction or (0.0722 if spec.kind in ("ml-20m", "ml-25m") else 0.1)
        threshold = None if ds.implicit else 3.5
        split = heldout_users_split(inter, valid_fraction=frac, test_fraction=frac, positive_threshold=threshold, seed=opts.split_seed)
        implicit = True
        if cfg.gravity == 0 and "gravity" not in overrides:
            cfg.gravity = 0.1
    rating_range = (0.0, 1.0) if implicit else tuple(float(x) for x in ds.rating_range)
    if rec_cfg is not None and (protocol != "random" or opts.tune):
        raise ConfigError("private recommendation runs after training on the random split (hits on held-out ratings), without tuning", field="recommend")
    if opts.tune and (protocol != "random" or not private):
        raise ConfigError("private tuning runs with a private algorithm on the in-process engine and the random split (RMSE)", field="tune")
    return dict(spec=spec, dataset=ds, private=private, options=opts, config=cfg, protocol=protocol, split=split,
                rating_range=rating_range, implicit=implicit, recommend=rec_cfg, public=None, engine_params={})


#: above this target epsilon a run is warned about: the guarantee says nothing any more
TRIVIAL_EPSILON = 100.0


def check_privacy_target(epsilon, delta) -> None:
    """A private run's (epsilon, delta) before anything is loaded: a finite epsilon > 0 and a
    delta in (0, 1) (ConfigError naming the flag); a warning when epsilon is so large that the
    run is private in name only."""
    try:
        eps, dlt = float(epsilon), float(delta)
    except (TypeError, ValueError):
        raise ConfigError(f"expected numbers, got epsilon {epsilon!r} and delta {delta!r}", field="--epsilon") from None
    if not (math.isfinite(eps) and eps > 0):
        raise ConfigError(f"must be a finite number > 0, got {epsilon!r}", field="--epsilon")
    if not (0.0 < dlt < 1.0):
        raise ConfigError(f"must be in (0, 1), got {delta!r}", field="--delta")
    if eps > TRIVIAL_EPSILON:
        import warnings

        from ..errors import FedprivWarning

        warnings.warn(f"epsilon {eps:g} protects nothing: one user's data may change the odds of any outcome by a factor e^epsilon; "
                      f"compare with a non-private algorithm instead (above epsilon {TRIVIAL_EPSILON:g} the PLD second opinion is not computed)",
                      FedprivWarning, stacklevel=2)


def resolve_data(data, options=None):
    """(spec, dataset or None to load) of a spec string, a DataSpec, a Dataset or a DataFrame;
    ``options``: the csv/parquet options of a spec string (typed or as strings), or
    :func:`fedpriv.data.tabular.dataset_from_pandas` keywords for a DataFrame."""
    from ..data.loaders import Dataset

    options = {k: v for k, v in (options or {}).items() if v is not None}
    if isinstance(data, os.PathLike):
        data = os.fspath(data)
    if isinstance(data, str):
        items = options.get("items")
        if items is not None and not isinstance(items, (str, os.PathLike)):
            return _spec_with_item_list(data, options, items)
        return parse_data_spec(data, {k: _option_text(v) for k, v in options.items()} or None), None
    if isinstance(data, DataSpec):
        if options:
            raise ConfigError("options go with a spec string, not a parsed DataSpec", field="data")
        return data, None
    if isinstance(data, Dataset):
        if options:
            raise ConfigError("a loaded Dataset takes no options", field="data")
        return DataSpec("dataset", path=data.source or "Dataset"), data
    if type(data).__name__ == "DataFrame":
        from ..data.tabular import dataset_from_pandas

        ds = dataset_from_pandas(data, **options)
        return DataSpec("dataframe", path=ds.source or "DataFrame"), ds
    raise ConfigError(f"expected a data spec string, a DataSpec, a Dataset or a pandas DataFrame, got {type(data).__name__}", field="data")


def _spec_with_item_list(data: str, options: dict, items) -> tuple[DataSpec, object]:
    """A csv/parquet spec string whose catalogue is given as a sequence of item ids: the other
    options are parsed as strings (a placeholder stands for the list in the checks), the file is
    loaded with the ids."""
    from ..data.spec import TABULAR_KINDS
    from ..data.tabular import load_tabular

    text = {k: _option_text(v) for k, v in options.items() if k != "items"}
    spec = parse_data_spec(data, {**text, "items": "<list>"})
    if spec.kind not in TABULAR_KINDS:
        raise ConfigError(f"items= applies to csv:/parquet: data and DataFrames, not {spec.kind}: data", field="items")
    params = {k: v for k, v in spec.params.items() if k != "items"}
    ds = load_tabular(spec.kind, spec.path, **params, items=items)
    return DataSpec(spec.kind, path=spec.path, params=params), ds


def _option_text(value) -> str:
    """A data option as the command line writes it (``rating_range=(1, 5)`` -> ``1,5``)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def train_and_evaluate(plan, engine, *, progress: bool = False, second_opinion: bool = True):
    """Train ``plan`` on ``engine`` and evaluate: (metrics, ledger records, state, train)."""
    t0 = time.perf_counter()
    job = plan.job
    algorithm, epsilon, delta, private, spec, ds = job.algorithm, job.epsilon, job.delta, plan.private, plan.spec, plan.dataset
    secrets = RunSecrets(job.noise_seed)
    engine_name = engine.name
    refuse_options_of_other_engines({**job.params, **engine.run_options()}, engine_name)
    if plan.protocol == "personalization":
        from ..engine.personal import run_personal

        params = {**plan.engine_params, **{k: str(v) for k, v in engine.run_options().items()}}
        params.update(_personal_layout(params, ds.n_users, plan.config.aggregation.secure, in_process=engine_name != "flower"))
        overrides = {**{k: v for k, v in job.params.items() if k not in ("users_per_node", "users_per_shard", "nodes")}, **params}
        metrics, records, state = run_personal(algorithm, spec, ds, epsilon=epsilon, delta=delta, overrides=overrides, engine=engine_name,
                                               work_dir=engine.work_dir, flower_runner=engine.flower_runner(), secrets=secrets, progress=progress)
        metrics.update(noise_statement(secrets))
        return _clean(metrics), records, state, None
    opts = dataclasses.replace(plan.options, **engine.run_options())
    cfg = copy.deepcopy(plan.config)
    if engine_name != "flower" and plan.split is not None:  # the in-process engine's nodes: shards of users
        opts.users_per_shard = inprocess_shard_size(opts, plan.split.train.n_users, cfg.aggregation.secure) or 0
        if opts.users_per_shard:  # recorded as on every engine: the nodes the shards play
            opts.users_per_node, opts.nodes = opts.users_per_shard, -(-plan.split.train.n_users // opts.users_per_shard)
    elif engine_name == "flower":  # resolved once (fedpriv.run.nodes): every later use reads it back
        given = opts.users_per_node or (plan.public.users_per_node if plan.public is not None else None)
        layout = node_layout(plan.n_users, nodes=opts.nodes, users_per_node=given)
        opts.nodes, opts.users_per_node = layout.nodes, layout.users_per_node
    rec_cfg = plan.recommend
    if opts.tune and engine_name == "flower" and cfg.aggregation.mode != "central":
        raise ConfigError("private tuning on the Flower engine runs in central mode (its score round is not a secure sum yet)", field="tune")
    if plan.public is not None:
        if engine_name != "flower":
            raise ConfigError("public:DIR holds no ratings: it is the server side of a partitioned deployment (--engine flower)", field="--data")
        public = plan.public
        if not opts.users_per_node:
            opts.users_per_node = int(public.users_per_node)
        if opts.users_per_node != public.users_per_node:
            raise ConfigError(f"the partition put {public.users_per_node} users on each node, got {opts.users_per_node}", field="users-per-node")
        metrics: dict = {
            **run_header(algorithm, spec, engine_name, cfg.seed, epsilon, delta, private, "random"),
            "n_users": int(public.n_users),
            "n_items": int(public.n_items),
            "n_ratings": None,  # held by the nodes only
            "data_source": public.source,
            "server_holds_ratings": False,
            "duplicates_dropped": None,
            **noise_statement(secrets),
            "aggregation": cfg.aggregation.mode,
        }
        state, ledger, timings, rec_ledger = _train_flower(
            algorithm, None, cfg, opts, plan.rating_range, public.implicit, epsilon, delta, engine.work_dir, metrics, engine.flower_runner(),
            public.item_features, rec_cfg, secrets, public=public, progress=progress,
        )
        metrics, records = _finish(metrics, state, ledger, rec_ledger, rec_cfg, timings, algorithm=algorithm, spec=spec, engine=engine_name, epsilon=epsilon,
                                   delta=delta, private=private, opts=opts, t0=t0, protocol="random", second_opinion=second_opinion)
        return metrics, records, state, None
    split, protocol, rating_range, implicit = plan.split, plan.protocol, plan.rating_range, plan.implicit
    inter, train = ds.interactions, split.train
    metrics = {
        **run_header(algorithm, spec, engine_name, cfg.seed, epsilon, delta, private, protocol),
        "n_users": int(inter.n_users),
        "n_items": int(inter.n_items),
        "n_ratings": len(inter),
        "duplicates_dropped": int(ds.duplicates_dropped),
        **noise_statement(secrets),
        # who saw exact sums: the ServerApp's aggregator step (central) or nobody (secure)
        "aggregation": cfg.aggregation.mode,
    }
    rec_ledger = None
    if opts.tune:
        from ..privacy.plan import TuningPlan
        from . import tuning as tuning_mod

        base = dict(job.params)
        for key in RunOptions.__dataclass_fields__:
            base.pop(key, None)
        candidate, cleanup = (None, None) if engine_name != "flower" else _flower_candidate(plan, engine, opts)
        view = tuning_mod.view_of(opts.tune_view, engine_name)
        try:
            result, ledger, tuning_report, _ = tuning_mod.tune(
                algorithm, split, base, tuning_mod.parse_grid(opts.tune),
                TuningPlan(opts.tune_mean, opts.tune_shape, opts.tune_share, opts.tune_score_clip),
                rating_range=rating_range, epsilon=epsilon, delta=delta, item_features=ds.item_features, progress=progress and candidate is None,
                secrets=secrets, train_candidate=candidate, view=view,
            )
        finally:
            if cleanup is not None:
                cleanup()
        state = result.state
        if candidate is not None:  # the selected run's own evaluation on the nodes, rounds and bytes
            timings = {"rounds": result.round_log}
            _flower_metrics(metrics, result, opts, split.train.n_users, evaluated=True)
        else:
            timings = result.timings
            item_counts = train.item_counts()
            metrics["valid_rmse"], metrics["valid_sliced"] = evaluation.evaluate_rmse(state, train, split.valid, item_counts)
            metrics["test_rmse"], metrics["sliced"] = evaluation.evaluate_rmse(state, train, split.test, item_counts)
        _ranking_metrics(metrics, state, train, split)
        metrics["tuning"] = {**tuning_report, "accounting": tuning_mod.VIEWS[view]}
    elif engine_name == "flower":
        state, ledger, timings, rec_ledger = _train_flower(algorithm, split, cfg, opts, rating_range, implicit, epsilon, delta, engine.work_dir, metrics,
                                                           engine.flower_runner(), ds.item_features, rec_cfg, secrets, progress=progress)
        if protocol == "heldout":
            _recall_metrics(metrics, state, train, split, cfg.eval_k)
        elif not algorithm_protocol.is_logistic(algorithm):
            _ranking_metrics(metrics, state, train, split)
    else:
        result = train_inprocess(
            algorithm,
            train,
            cfg,
            rating_range=rating_range,
            implicit=implicit,
            epsilon=epsilon,
            delta=delta,
            users_per_shard=opts.users_per_shard or None,
            item_features=ds.item_features,
            progress=progress,
            secrets=secrets,
        )
        state, ledger, timings = result.state, result.ledger, result.timings
        item_counts = train.item_counts()
        if protocol == "random" and algorithm_protocol.is_logistic(algorithm):
            for part in ("valid", "test"):
                loss, acc, sliced = evaluation.evaluate_logistic(state, train, getattr(split, part), item_counts)
                metrics[f"{part}_logloss"], metrics[f"{part}_accuracy"] = loss, acc
                metrics["valid_sliced" if part == "valid" else "sliced"] = sliced
        elif protocol == "random":
            metrics["valid_rmse"], metrics["valid_sliced"] = evaluation.evaluate_rmse(state, train, split.valid, item_counts)
            metrics["test_rmse"], metrics["sliced"] = evaluation.evaluate_rmse(state, train, split.test, item_counts)
            _ranking_metrics(metrics, state, train, split)
        else:
            _recall_metrics(metrics, state, train, split, cfg.eval_k)
        if rec_cfg is not None:
            from ..engine.inprocess import recommend_inprocess

            metrics["recommendation"], rec_ledger, _ = recommend_inprocess(
                state, train, split.test, rec_cfg, users_per_shard=opts.users_per_shard or None, secrets=secrets
            )
    metrics, records = _finish(metrics, state, ledger, rec_ledger, rec_cfg, timings, algorithm=algorithm, spec=spec, engine=engine_name, epsilon=epsilon,
                               delta=delta, private=private, opts=opts, t0=t0, protocol=protocol, second_opinion=second_opinion)
    return metrics, records, state, train


#: run options that only one kind of engine honours: given to another, they are refused, never ignored
ENGINE_ONLY_OPTIONS = {"round_timeout": "flower", "node_wait": "flower", "users_per_shard": "inprocess"}


def refuse_options_of_other_engines(options, engine_name: str) -> None:
    """ConfigError naming the first option given (a non-default value) that ``engine_name``
    cannot honour."""
    defaults = RunOptions()
    for key, owner in ENGINE_ONLY_OPTIONS.items():
        value = options.get(key)
        if value is None or owner == engine_name:
            continue
        try:
            unchanged = float(value) == float(getattr(defaults, key))
        except (TypeError, ValueError):
            unchanged = False
        if not unchanged:
            other = "the Flower engines" if owner == "flower" else "the in-process engine"
            raise ConfigError(f"applies to {other} only; the {engine_name} engine cannot honour it", field=key)


def delta_warning(delta: float, n_users) -> str | None:
    """A warning when delta exceeds 1/n (n: the released user count, else the data's): a
    mechanism may then publish one user's whole data with probability delta and still be
    (epsilon, delta)-DP, so delta should stay well below 1/n (docs/explanations/privacy.md, "Choosing δ")."""
    if not n_users or delta is None or delta <= 1.0 / float(n_users):
        return None
    return f"delta {delta:g} is larger than 1/n = {1.0 / float(n_users):.3g} for n = {int(n_users):,} users: choose delta well below 1/n (e.g. 1e-5 or 1/n^1.1)"


def _finish(metrics, state, ledger, rec_ledger, rec_cfg, timings, *, algorithm, spec, engine, epsilon, delta, private, opts, t0, protocol, second_opinion):
    """The run's epsilon (dp-accounting, from the ledger), noise multipliers, timings and
    config in ``metrics``; returns (metrics, ledger records)."""
    cfg = state.config
    records = ledger.to_list()
    if rec_ledger is not None:
        # the recommendation phase: its own ledger, composed with training for the run's epsilon
        metrics["recommendation"].update(
            {"mechanism": rec_cfg.mechanism, "sensitivity_source": rec_cfg.sensitivity, "epsilon_select": rec_cfg.epsilon,
             "epsilon": epsilon_bounds(rec_ledger, delta)[0], "params": rec_cfg.params,
             # the score histogram (quantile source) is a secure sum in secure mode
             "aggregation": cfg.aggregation.mode}
        )
        metrics["epsilon_training"] = epsilon_bounds(ledger, delta)[0] if private else None
        records = records + rec_ledger.to_list()
        ledger = [*ledger.releases, *rec_ledger.releases] if private else rec_ledger
        private = True
    if private:
        metrics["epsilon_spent"] = epsilon_spent(ledger, delta)  # a tuning seen by the nodes: every run, over the law of K
        metrics["epsilon_spent_pld"] = epsilon_pld_second_opinion(ledger, delta, metrics["epsilon_spent"]) if second_opinion else None
        if current_relation() != ADD_REMOVE:  # a deployment (its enrolled count is public): the relation every epsilon here holds under
            metrics["neighbouring_relation"] = current_relation()
    else:
        metrics["epsilon_spent"] = None
        metrics["epsilon_spent_pld"] = None
    metrics["noise_multipliers"] = dict(state.multipliers)
    metrics["released_mean"] = state.mean
    metrics["released_n_users"] = int(state.n_users) if private and als.needs_user_count(algorithm, state.config) else None
    if state.choice is not None:
        metrics["noise_aware"] = state.choice
    warning = delta_warning(delta, metrics["released_n_users"] or metrics.get("n_users")) if private else None
    if warning:
        metrics["delta_warning"] = warning
    metrics["timings"] = timings
    # a tuned run's total time would tell how many runs K were drawn: K stays hidden
    metrics["wall_seconds"] = None if opts.tune else time.perf_counter() - t0
    metrics["config"] = {
        "algorithm": algorithm,
        "data": str(spec),
        "engine": engine,
        "epsilon": epsilon,
        "delta": delta,
        **asdict(opts),
        "protocol": protocol,
        **state.config.to_dict(),  # noise-aware runs: what the rule chose
    }
    return _clean(metrics), records


def _ranking_metrics(metrics: dict, state, train, split) -> None:
    """Random split, explicit ratings: the released model's top-10 lists on the test ratings
    (:mod:`fedpriv.algorithms.ranking`), beside two non-private references measured on the same
    held-out ratings: the most-popular list and the global-mean predictor's test RMSE. Like the
    test RMSE, measurements outside the privacy guarantee; computed from the released model on
    either engine."""
    from ..algorithms import ranking

    private = state.private
    blend = ranking.blend_for(metrics.get("epsilon") if private else None, metrics.get("delta"), state.n_items, state.n_users)
    rank = ranking.evaluate_ranking(state, train, split.test, blend=blend)
    popular = ranking.popular_reference(train, split.test, k=rank["k"], threshold=rank["threshold"])
    metrics["ranking"] = {**rank, "blend": blend, "score": f"released popularity + {blend:g} x predicted rating (standardized)"}
    mean = float(np.mean(train.ratings)) if len(train.ratings) else 0.0
    test = split.test.ratings.astype(np.float64)
    metrics["references"] = {
        "global_mean_test_rmse": float(np.sqrt(np.mean((test - mean) ** 2))) if len(test) else None,
        "popular_recall": popular["recall"],
        "popular_ndcg": popular["ndcg"],
        "popular_median_train_count": popular["median_train_count"],
        "rating_range": [float(x) for x in state.rating_range],
    }


def _recall_metrics(metrics: dict, state, train, split, k: int) -> None:
    """Held-out-users protocol: the held-out users are not members of the federation; their
    fold-in (a user solve on the history part) and Recall@k use only the released item
    embeddings, on either engine."""
    item_counts = train.item_counts()
    metrics[f"valid_recall_at_{k}"], metrics["valid_sliced"] = evaluation.evaluate_recall(
        state, split.valid_history, split.valid_targets, split.valid_users, item_counts, k
    )
    metrics[f"test_recall_at_{k}"], metrics["sliced"] = evaluation.evaluate_recall(
        state, split.test_history, split.test_targets, split.test_users, item_counts, k
    )


def _flower_nodes(opts, n_users: int) -> tuple[int, int]:
    """(nodes, users per node) of a Flower run (:func:`fedpriv.run.nodes.node_layout`; default one
    node per user)."""
    if opts.nodes and opts.users_per_node:  # resolved by train_and_evaluate
        return int(opts.nodes), int(opts.users_per_node)
    layout = node_layout(n_users, nodes=opts.nodes, users_per_node=opts.users_per_node)
    return layout.nodes, layout.users_per_node


def inprocess_shard_size(opts, n_users: int, secure: bool) -> int | None:
    """Users per shard of the in-process engine: ``users_per_shard`` when given, else the node
    layout of ``nodes`` / ``users_per_node`` (:mod:`fedpriv.run.nodes`); with neither, one shard
    in central mode and :data:`~fedpriv.run.nodes.SECURE_USERS_PER_NODE` users per node in secure
    mode. None: one shard."""
    if opts.users_per_shard:
        return int(opts.users_per_shard)
    if not (opts.nodes or opts.users_per_node or secure):
        return None
    layout = node_layout(n_users, nodes=opts.nodes, users_per_node=opts.users_per_node, default_users_per_node=SECURE_USERS_PER_NODE)
    return None if layout.nodes == 1 else layout.users_per_node


def _personal_layout(params: dict, n_users: int, secure: bool, *, in_process: bool) -> dict:
    """The personalization runs' node keys (``users_per_shard`` in process, ``users_per_node``
    and ``nodes`` on Flower) resolved by the same rule as the rating runs'."""
    get = lambda key: params.get(key) or None  # noqa: E731
    if in_process:
        opts = RunOptions(users_per_shard=int(float(get("users_per_shard") or 0)), users_per_node=int(float(get("users_per_node") or 0)),
                          nodes=int(float(get("nodes") or 0)))
        size = inprocess_shard_size(opts, n_users, secure)
        return {"users_per_shard": str(size)} if size else {}
    layout = node_layout(n_users, nodes=get("nodes"), users_per_node=get("users_per_node"))
    return {"users_per_node": str(layout.users_per_node), "nodes": str(layout.nodes)}


def _flower_job(algorithm, epsilon, delta, cfg, split, opts, rating_range, implicit, work_dir, item_features, secrets, **extra):
    """The :class:`~fedpriv.flower.server_app.FlowerJob` of a split (None: a partitioned
    deployment's server, ``public=`` in ``extra``); ``extra``: the job's other fields."""
    from ..flower.server_app import FlowerJob

    if split is None:
        train, valid, test = None, None, None
    else:
        train = split.train
        valid, test = (None, None) if isinstance(split, HeldoutSplit) else (split.valid, split.test)
    n_users = train.n_users if train is not None else extra["public"].n_users
    return FlowerJob(
        algorithm, epsilon, delta, cfg, train, valid, test, rating_range, work_dir, users_per_node=_flower_nodes(opts, n_users)[1], implicit=implicit,
        item_features=item_features, round_timeout=opts.round_timeout or None, node_wait_seconds=opts.node_wait, secrets=secrets, **extra,
    )


def _flower_metrics(metrics: dict, res, opts, n_users: int, *, evaluated: bool) -> None:
    """A Flower run's node-side evaluation (``evaluated``: the random split or a deployment),
    nodes, rounds, bytes and rejected replies, into ``metrics``."""
    if res.logistic:
        for part in ("valid", "test"):
            metrics[f"{part}_logloss"], metrics[f"{part}_accuracy"] = res.logistic[part]["logloss"], res.logistic[part]["accuracy"]
        metrics["valid_sliced"], metrics["sliced"] = res.logistic["valid"]["sliced"], res.logistic["test"]["sliced"]
    elif evaluated:
        metrics.update({"valid_rmse": res.valid_rmse, "valid_sliced": res.valid_sliced, "test_rmse": res.test_rmse, "sliced": res.test_sliced})
    n_nodes, upn = _flower_nodes(opts, n_users)
    metrics.update(
        {
            "nodes": n_nodes,
            "users_per_node": upn,
            "rounds": res.rounds,
            "bytes_up": res.bytes_up,
            "bytes_down": res.bytes_down,
            "round_log": res.round_log,
            "rejected_replies": res.rejected,
        }
    )


def _train_flower(algorithm, split, cfg, opts, rating_range, implicit, epsilon, delta, work_dir, metrics, runner=None, item_features=None, rec_cfg=None, secrets=None, public=None, progress=False):
    """Train over Flower (by default a new simulation); adds rounds, bytes and (random split)
    the node-side RMSE evaluation to ``metrics``. ``public``: a partitioned deployment (no
    ratings here; ``split`` is None)."""
    if runner is None:
        from ..flower.simulation import simulate as runner

    n_users = split.train.n_users if public is None else public.n_users
    tmp = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="fedpriv-flower-"))
    job = _flower_job(algorithm, epsilon, delta, cfg, split, opts, rating_range, implicit, tmp, item_features, secrets if secrets is not None else RunSecrets(),
                      recommend=rec_cfg, public=public, progress=bool(progress))
    try:
        res = runner(job, _flower_nodes(opts, n_users)[0])
    finally:
        if not work_dir:
            shutil.rmtree(tmp, ignore_errors=True)
    _flower_metrics(metrics, res, opts, n_users, evaluated=job.valid is not None or public is not None)
    if rec_cfg is not None:
        metrics["recommendation"] = res.recommendation
    return res.state, res.ledger, {"rounds": res.round_log}, res.rec_ledger


def _flower_candidate(plan, engine, opts):
    """One run of private tuning as a Flower job (central mode): trained with the tuning plan's
    multipliers, then scored on the nodes (each sends its users' clipped validation MSEs, summed
    here; the tuning adds the noise). Returns (run_candidate, cleanup)."""
    runner = engine.flower_runner()
    if runner is None:
        from ..flower.simulation import simulate as runner
    split = plan.split
    n_nodes = _flower_nodes(opts, split.train.n_users)[0]
    own = not engine.work_dir
    root = Path(engine.work_dir) if engine.work_dir else Path(tempfile.mkdtemp(prefix="fedpriv-tune-"))

    def run_candidate(cfg, multipliers, run_secrets, clip, index):
        # a folder of its own, named by no index and removed after the run: none is left to count K
        root.mkdir(parents=True, exist_ok=True)
        run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=root))
        try:
            job = _flower_job(plan.algorithm, plan.job.epsilon, plan.job.delta, cfg, split, opts, plan.rating_range, plan.implicit, run_dir,
                              plan.dataset.item_features, run_secrets, multipliers=multipliers, tune_score_clip=clip, checkpoint=False)
            res = runner(job, n_nodes)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        return res, res.ledger, res.score_total

    return run_candidate, ((lambda: shutil.rmtree(root, ignore_errors=True)) if own else None)


def _clean(obj):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return _finite_or_none(float(obj))
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def check_results_folder(out_dir: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Refuse ``--out`` when it holds an earlier run's results, unless ``overwrite``."""
    out = Path(out_dir)
    if not overwrite and out.is_dir() and any((out / name).exists() for name in ("metrics.json", "ledger.json")):
        raise ConfigError(f"{out} holds an earlier run's results (metrics.json, ledger.json); give --overwrite to replace them, or choose a new folder", field="--out")


def write_outputs(out_dir: str | os.PathLike, metrics: dict, ledger: list[dict]) -> None:
    """Write both files into a temporary folder next to ``out_dir``, then move them in place:
    a failure leaves nothing half-written."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, allow_nan=False) + "\n")
        (tmp / "ledger.json").write_text(json.dumps(_clean(ledger), indent=2, allow_nan=False) + "\n")
        if not out.exists():
            os.replace(tmp, out)
            return
        for name in ("ledger.json", "metrics.json"):
            os.replace(tmp / name, out / name)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
