"""fedpriv's Python API: load data, train at (epsilon, delta), plan a budget, keep the model.

    import fedpriv

    data = fedpriv.load_data("ml-100k:data/ml-100k")          # or a pandas DataFrame
    result = fedpriv.train("adadpals", data, epsilon=5.0)  # noise-aware defaults; rank=8, steps=3 to override
    print(result.epsilon, result.metrics["test_rmse"])                  # dp-accounting, from the ledger
    result.save_model("model/")
    fedpriv.load_model("model/").recommend(items=[1, 50, 181], ratings=[5, 4, 5], k=10)

The command line is a thin layer over these functions (``fedpriv run`` calls :func:`train`,
``fedpriv privacy plan`` calls :func:`plan`, ``fedpriv recommend`` calls
:meth:`fedpriv.run.model.Model.recommend`): the same arguments give the same ``metrics.json``, and
bad input raises the same :class:`fedpriv.errors.FedprivError` with the same message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .privacy.target import ADD_REMOVE

if TYPE_CHECKING:
    import pandas as pd

    from .algorithms.typed import AlgorithmConfig
    from .data.loaders import Dataset
    from .data.spec import DataSpec
    from .run.model import Model
    from .privacy.plan import BudgetPlan, TuningPlan
    from .run import RunReport

__all__ = ["Result", "load_data", "train", "plan"]


@dataclass
class Result:
    """What :func:`train` returns: the metrics (as in ``metrics.json``), the ledger records (as
    in ``ledger.json``) and the released model (None for the personalization algorithms, whose
    personal vectors never leave the clients)."""

    metrics: dict
    ledger: list[dict]
    model: Model | None = field(default=None, repr=False)
    report: RunReport | None = field(default=None, repr=False)  # the typed report (metrics is its to_json())

    @property
    def epsilon(self) -> float | None:
        """Epsilon spent, computed by dp-accounting from the ledger (None for non-private runs)."""
        return self.metrics.get("epsilon_spent")

    def __repr__(self) -> str:
        m = self.metrics
        eps = f"epsilon {m['epsilon_spent']:.3g}" if isinstance(m.get("epsilon_spent"), (int, float)) else "non-private"
        shown = [
            f"{label} {m[key]:.4f}"
            for key, label in (("test_rmse", "test RMSE"), ("test_mse", "test MSE"))
            if isinstance(m.get(key), (int, float))
        ]
        rank = m.get("ranking") or {}
        if isinstance(rank.get("recall"), (int, float)):
            shown.append(f"Recall@{rank['k']} {rank['recall']:.4f}")
        return f"Result({m.get('algorithm')}, {eps}{', ' + ', '.join(shown) if shown else ''})"

    def save_model(self, path: str | os.PathLike, *, overwrite: bool = False) -> os.PathLike:
        """Write the released model to the folder ``path`` (:meth:`fedpriv.run.model.Model.save`;
        an earlier model there is replaced only with ``overwrite``)."""
        if self.model is None:
            raise ConfigError(
                f"{self.metrics.get('algorithm')} releases no shared item model to save", field="save_model"
            )
        with _keywords(save_model="path", overwrite="overwrite"):
            return self.model.save(path, overwrite=overwrite)

    def write(self, out: str | os.PathLike) -> None:
        """``metrics.json`` and ``ledger.json`` in ``out`` (both or neither), as the CLI writes them."""
        from .run import write_outputs

        write_outputs(out, self.metrics, self.ledger)


#: a command-line flag named by an error, and the keyword a Python caller gave instead
FLAG_KEYWORDS = {
    "--epsilon": "epsilon",
    "--delta": "delta",
    "--noise-seed": "noise_seed",
    "--engine": "engine",
    "--data": "data",
    "--data-opt": "data_options",
    "--data-opt items": "items",
    "--nodes": "nodes",
    "--users-per-node": "users_per_node",
    "users-per-node": "users_per_node",
    "--save-model": "save_model",
    "--set": "params",
    "--aggregation": "aggregation",
}


class _keywords:
    """Re-raise a ConfigError naming a flag as one naming the keyword (Python callers gave
    keywords); ``names``: this function's own keywords for some flags."""

    def __init__(self, **names: str):
        self.names = {**FLAG_KEYWORDS, **{f"--{k.replace('_', '-')}": v for k, v in names.items()}}

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, ConfigError) and exc.field in self.names:
            raise exc.renamed(self.names) from None
        return False


def _engine(engine, options: dict[str, Any]):
    """An engine object of ``engine`` (a name or an Engine) and its keyword options."""
    from .ops.engines import engine_named
    from .run import Engine

    if isinstance(engine, Engine):
        if options:
            raise ConfigError(f"give {', '.join(options)} to the engine object", field="engine")
        return engine
    return engine_named(engine, "engine", **options)


def load_data(data: str | DataSpec | pd.DataFrame, **options: Any) -> Dataset:
    """Load a data set: a spec string (``"ml-100k:PATH"``, ``"csv:PATH"``, ``"parquet:PATH"``,
    ``"synthetic-mf:users=...,items=...,ratings=..."``; ``options`` are the ``--data-opt``
    options of csv/parquet, e.g. ``user="uid", rating_range=(1, 5), items="items.csv"``) or a
    pandas DataFrame (``options``: those of :func:`fedpriv.data.tabular.dataset_from_pandas`).
    ``items`` (a file, or a sequence of raw item ids) declares the item catalogue, which the
    private algorithms need when there is no features table."""
    from .data.spec import load_spec
    from .run import resolve_data

    with _keywords(data_opt="options"):
        spec, ds = resolve_data(data, options)
        return ds if ds is not None else load_spec(spec)


def train(
    algorithm: str | AlgorithmConfig,
    data: str | DataSpec | Dataset | pd.DataFrame,
    *,
    epsilon: float | None = None,
    delta: float = 1e-5,
    engine: str | Any = "inprocess",
    noise_seed: int | None = None,
    progress: bool = False,
    second_opinion: bool = True,
    data_options: dict[str, Any] | None = None,
    engine_options: dict[str, Any] | None = None,
    **params: Any,
) -> Result:
    """Train ``algorithm`` on ``data`` and evaluate it; private algorithms need ``epsilon``.
    A short convenience over ``Job(...).prepare().execute(engine)`` (:mod:`fedpriv.run`).

    ``algorithm``: a name, or a typed configuration (``AdaDPALS(rank=8)``,
    :mod:`fedpriv.algorithms.typed`). ``params``: hyperparameters and run options as Python
    values (``rank=8``, ``steps=3``, ``aggregation="secure"``, ``recommend="mgem"``, ...). ``engine``: ``"inprocess"``
    (this
    process), ``"flower"`` (``flwr run`` on Flower's local simulation federation, as
    ``fedpriv run --engine flower``), or an engine object (:class:`fedpriv.run.InProcess`,
    :class:`~fedpriv.run.FlowerSimulation`, :class:`~fedpriv.ops.launcher.FlwrRun`, ...);
    ``engine_options``: the named engine's options (``{"users_per_node": 20}``).
    ``noise_seed``: reproducible noise (privacy then holds only against those who do not know
    it); by default all noise comes from the OS CSPRNG. ``data_options``: csv/parquet options
    for a spec string, or :func:`fedpriv.data.tabular.dataset_from_pandas` keywords for a
    DataFrame; a private algorithm on your own data needs its item catalogue declared there
    (``items``: a file or a sequence of item ids, or ``features``). Errors name the keyword.
    """
    from .run import Job

    with _keywords():
        plan = Job(
            algorithm,
            data,
            epsilon=epsilon,
            delta=delta,
            noise_seed=noise_seed,
            params=params,
            data_options=data_options or {},
        ).prepare()
        outcome = plan.execute(
            _engine(engine, dict(engine_options or {})), progress=progress, second_opinion=second_opinion
        )
    return Result(metrics=outcome.report.to_json(), ledger=outcome.ledger, model=outcome.model, report=outcome.report)


def plan(
    algorithm: str | AlgorithmConfig,
    *,
    epsilon: float,
    delta: float = 1e-5,
    rating_range: tuple[float, float] = (1.0, 5.0),
    implicit: bool = False,
    tuning: TuningPlan | None = None,
    relation: str = ADD_REMOVE,
    **params: Any,
) -> BudgetPlan:
    """The calibrated budget plan of ``algorithm`` at (epsilon, delta), without training:
    every release with its share, noise multiplier and sensitivity (``fedpriv privacy plan``).
    ``params``: hyperparameters, as for :func:`train`; ``tuning``: plan private tuning too;
    ``relation``: the neighbouring relation of the target (``"replace_one"``: a deployment's,
    ``fedpriv privacy plan --deployment``)."""
    from .algorithms.als import ALSConfig
    from .algorithms.plans import budget_plan
    from .privacy.target import check_relation

    from .run.job import typed_params

    with _keywords():
        if not isinstance(algorithm, str):
            algorithm, params = typed_params(algorithm, dict(params))
        cfg = ALSConfig.from_overrides(dict(params), algorithm)
        return budget_plan(
            algorithm,
            cfg,
            epsilon,
            delta,
            implicit=implicit,
            rating_range=tuple(float(x) for x in rating_range),
            tuning=tuning,
            relation=check_relation(relation, field="relation"),
        )
