"""fedpriv's Python API: load data, train at (epsilon, delta), plan a budget, keep the model.

    import fedpriv

    data = fedpriv.load_data("ml-100k:../shared/data/ml-100k")          # or a pandas DataFrame
    result = fedpriv.train("adadpals", data, epsilon=5.0)              # noise-aware defaults; rank=8, steps=3 to override
    print(result.epsilon, result.metrics["test_rmse"])                  # dp-accounting, from the ledger
    result.save_model("model/")
    fedpriv.load_model("model/").recommend(items=[1, 50, 181], ratings=[5, 4, 5], k=10)

The command line is a thin layer over these functions (``fedpriv run`` calls :func:`train`,
``fedpriv privacy plan`` calls :func:`plan`, ``fedpriv recommend`` calls
:meth:`fedpriv.model.Model.recommend`): the same arguments give the same ``metrics.json``, and
bad input raises the same :class:`fedpriv.errors.FedprivError` with the same message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from .data.loaders import Dataset
    from .data.spec import DataSpec
    from .model import Model
    from .privacy.plan import BudgetPlan, TuningPlan

__all__ = ["Result", "load_data", "train", "plan"]


@dataclass
class Result:
    """What :func:`train` returns: the metrics (as in ``metrics.json``), the ledger records (as
    in ``ledger.json``) and the released model (None for the personalization algorithms, whose
    personal vectors never leave the clients)."""

    metrics: dict
    ledger: list[dict]
    model: Model | None = field(default=None, repr=False)

    @property
    def epsilon(self) -> float | None:
        """Epsilon spent, computed by dp-accounting from the ledger (None for non-private runs)."""
        return self.metrics.get("epsilon_spent")

    def save_model(self, path: str | os.PathLike) -> os.PathLike:
        """Write the released model to the folder ``path`` (:meth:`fedpriv.model.Model.save`)."""
        if self.model is None:
            raise ConfigError(f"{self.metrics.get('algorithm')} releases no shared item model to save", field="save_model")
        return self.model.save(path)

    def write(self, out: str | os.PathLike) -> None:
        """``metrics.json`` and ``ledger.json`` in ``out`` (both or neither), as the CLI writes them."""
        from .run import write_outputs

        write_outputs(out, self.metrics, self.ledger)


def _spec_and_dataset(data: Any, options: dict[str, Any] | None) -> tuple[DataSpec, Dataset | None]:
    """(spec, dataset or None to load) of a spec string, a DataSpec, a Dataset or a DataFrame."""
    from .data.loaders import Dataset
    from .data.spec import DataSpec, parse_data_spec

    options = {k: v for k, v in (options or {}).items() if v is not None}
    if isinstance(data, str):
        items = options.get("items")
        if items is not None and not isinstance(items, (str, os.PathLike)):
            return _spec_with_item_list(data, options, items)
        return parse_data_spec(data, {k: _text(v) for k, v in options.items()} or None), None
    if isinstance(data, DataSpec):
        if options:
            raise ConfigError("options go with a spec string, not a parsed DataSpec", field="data")
        return data, None
    if isinstance(data, Dataset):
        if options:
            raise ConfigError("a loaded Dataset takes no options", field="data")
        return DataSpec("dataset", path=data.source or "Dataset"), data
    if type(data).__name__ == "DataFrame":
        from .data.tabular import dataset_from_pandas

        ds = dataset_from_pandas(data, **options)
        return DataSpec("dataframe", path=ds.source or "DataFrame"), ds
    raise ConfigError(f"expected a data spec string, a DataSpec, a Dataset or a pandas DataFrame, got {type(data).__name__}", field="data")


def _spec_with_item_list(data: str, options: dict[str, Any], items: Any) -> tuple[DataSpec, Dataset]:
    """A csv/parquet spec string whose catalogue is given as a sequence of item ids: the other
    options are parsed as strings (a placeholder stands for the list in the checks), the file is
    loaded with the ids."""
    from .data.spec import TABULAR_KINDS, DataSpec, parse_data_spec
    from .data.tabular import load_tabular

    text = {k: _text(v) for k, v in options.items() if k != "items"}
    spec = parse_data_spec(data, {**text, "items": "<list>"})
    if spec.kind not in TABULAR_KINDS:
        raise ConfigError(f"items= applies to csv:/parquet: data and DataFrames, not {spec.kind}: data", field="items")
    params = {k: v for k, v in spec.params.items() if k != "items"}
    ds = load_tabular(spec.kind, spec.path, **params, items=items)
    return DataSpec(spec.kind, path=spec.path, params=params), ds


def _text(value: Any) -> str:
    """A keyword value as the CLI would have written it (``rating_range=(1, 5)`` -> ``1,5``)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def load_data(data: str | DataSpec | pd.DataFrame, **options: Any) -> Dataset:
    """Load a data set: a spec string (``"ml-100k:PATH"``, ``"csv:PATH"``, ``"parquet:PATH"``,
    ``"synthetic-mf:users=...,items=...,ratings=..."``; ``options`` are the ``--data-opt``
    options of csv/parquet, e.g. ``user="uid", rating_range=(1, 5), items="items.csv"``) or a
    pandas DataFrame (``options``: those of :func:`fedpriv.data.tabular.dataset_from_pandas`).
    ``items`` (a file, or a sequence of raw item ids) declares the item catalogue, which the
    private algorithms need when there is no features table."""
    from .data.spec import load_spec

    spec, ds = _spec_and_dataset(data, options)
    return ds if ds is not None else load_spec(spec)


def train(
    algorithm: str,
    data: str | DataSpec | Dataset | pd.DataFrame,
    *,
    epsilon: float | None = None,
    delta: float = 1e-5,
    engine: str = "inprocess",
    noise_seed: int | None = None,
    progress: bool = False,
    second_opinion: bool = True,
    data_options: dict[str, Any] | None = None,
    **params: Any,
) -> Result:
    """Train ``algorithm`` on ``data`` and evaluate it; private algorithms need ``epsilon``.

    ``params``: hyperparameters and run options, the keys of ``--set KEY=VALUE`` (``rank=8``,
    ``steps=3``, ``aggregation="secure"``, ``users_per_node=10``, ``recommend="mgem"``, ...).
    ``engine``: ``"inprocess"`` or ``"flower"`` (Flower's simulation runtime in this process).
    ``noise_seed``: reproducible noise (privacy then holds only against those who do not know
    it); by default all noise comes from the OS CSPRNG. ``data_options``: csv/parquet options
    for a spec string, or :func:`fedpriv.data.tabular.dataset_from_pandas` keywords for a
    DataFrame; a private algorithm on your own data needs its item catalogue declared there
    (``items``: a file or a sequence of item ids, or ``features``).
    """
    from .model import Model
    from .run import run

    spec, ds = _spec_and_dataset(data, data_options)
    overrides = {k: _text(v) for k, v in params.items()}
    capture: dict = {}
    metrics, ledger = run(algorithm, spec, epsilon=epsilon, delta=delta, overrides=overrides, engine=engine, progress=progress,
                          dataset=ds, capture=capture, second_opinion=second_opinion, noise_seed=noise_seed)
    model = None
    state = capture.get("state")
    if state is not None and getattr(state, "item_factors", None) is not None:
        features = capture["dataset"].item_features  # the data set the run trained on (given or loaded)
        names = features.names if features is not None else None
        model = Model.from_run(state, capture["train"], ledger, metrics, names)
    return Result(metrics=metrics, ledger=ledger, model=model)


def plan(
    algorithm: str,
    *,
    epsilon: float,
    delta: float = 1e-5,
    rating_range: tuple[float, float] = (1.0, 5.0),
    implicit: bool = False,
    tuning: TuningPlan | None = None,
    **params: Any,
) -> BudgetPlan:
    """The calibrated budget plan of ``algorithm`` at (epsilon, delta), without training:
    every release with its share, noise multiplier and sensitivity (``fedpriv privacy plan``).
    ``params``: hyperparameters, as for :func:`train`; ``tuning``: plan private tuning too."""
    from .algorithms.als import ALSConfig
    from .algorithms.plans import budget_plan

    cfg = ALSConfig.from_overrides({k: _text(v) for k, v in params.items()}, algorithm)
    return budget_plan(algorithm, cfg, epsilon, delta, implicit=implicit, rating_range=tuple(float(x) for x in rating_range), tuning=tuning)
