"""A run's inputs before anything is loaded or trained: the run options (:class:`RunOptions`),
the ``--set`` pairs, the privacy target's checks, the data argument resolved to a spec, and what
``metrics.json`` says about the run's randomness."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..data.spec import DataSpec, parse_data_spec
from ..errors import ConfigError
from ..privacy.randomness import RunSecrets

#: the split protocols of the ``split`` option (``auto``: by data set)
SPLITS = ("auto", "random", "heldout")


@dataclass(frozen=True)
class RunOptions:
    """Run-level settings (not hyperparameters of the algorithm); frozen: an engine's layout
    returns a changed copy (``dataclasses.replace``)."""

    split: str = "auto"  # 'random' (RMSE), 'heldout' (Recall@k) or 'auto' (by data set)
    split_seed: int = 1234
    # share of users per held-out group (a public hash of the raw user id decides); 0 = 0.0722 for ML-20M/25M (about
    # 10,000 users), else 0.1
    heldout_fraction: float = 0.0
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
    # what the tuning's epsilon covers: selected (K hidden; in process only), all (every run, K seen), auto (flower:
    # all)
    tune_view: str = "auto"
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
        defaults, values = cls(), {}
        for key in list(overrides):
            if key in cls.__dataclass_fields__:
                raw = overrides.pop(key)
                typ = type(getattr(defaults, key))
                try:
                    values[key] = typ(float(raw)) if typ is int else typ(raw)
                except ValueError:
                    raise ConfigError(f"expected {typ.__name__}, got {raw!r}", field=key) from None
        opts = cls(**values)
        if opts.split not in SPLITS:
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
            mechanism=self.recommend,
            epsilon=self.rec_epsilon,
            candidates=self.rec_candidates,
            sensitivity=self.rec_sensitivity,
            bins=self.rec_bins,
            hist_epsilon=self.rec_hist_epsilon,
            hist_delta=self.rec_hist_delta,
            user_clip=self.rec_user_clip,
            params=params,
            exclude_rated=bool(self.rec_exclude_rated),
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

        warnings.warn(
            f"epsilon {eps:g} protects nothing: one user's data may change the odds of any outcome by a factor "
            f"e^epsilon; "
            f"compare with a non-private algorithm instead (above epsilon {TRIVIAL_EPSILON:g} the PLD second opinion "
            f"is not computed)",
            FedprivWarning,
            stacklevel=2,
        )


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
    raise ConfigError(
        f"expected a data spec string, a DataSpec, a Dataset or a pandas DataFrame, got {type(data).__name__}",
        field="data",
    )


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
    if spec.path is None:
        raise ConfigError(f"{spec.kind}: data needs a file", field="data")
    ds = load_tabular(spec.kind, spec.path, **params, items=items)
    return DataSpec(spec.kind, path=spec.path, params=params), ds


def _option_text(value) -> str:
    """A data option as the command line writes it (``rating_range=(1, 5)`` -> ``1,5``)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)
