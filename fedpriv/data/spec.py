"""Data specs of the CLI: ``KIND:PATH`` for files, ``synthetic-mf:key=value,...`` for generated
data, ``csv:PATH`` / ``parquet:PATH`` for a user's own rating table (its options, such as the
column names and the rating range, come separately: ``--data-opt KEY=VALUE``; see
:mod:`fedpriv.data.tabular`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError

FILE_KINDS = ("ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "ml-latest", "lastfm", "jester")
SYNTHETIC_KINDS = {
    "synthetic-mf": {
        "users": int,
        "items": int,
        "ratings": int,
        "seed": int,
        "rank": int,
        "skew": float,
        "noise": float,
        "select": float,
    },
    "synthetic-personal": {"users": int, "samples": int, "d": int, "k": int, "noise": float, "seed": int},
}
# data sets evaluated with the held-out-users protocol (Recall@k) unless told otherwise
HELDOUT_KINDS = ("ml-20m", "ml-25m", "lastfm")
# ``public:DIR``: the public folder of a partitioned deployment (metadata, no ratings)
PUBLIC_KIND = "public"
# ``saved:DIR``: a loaded data set written by :func:`fedpriv.data.saved.save_dataset` (a job's
# own csv/parquet/DataFrame data, handed to a process that did not load it)
SAVED_KIND = "saved"
# a user's own rating table; the only kinds that take options (``--data-opt KEY=VALUE``)
TABULAR_KINDS = ("csv", "parquet")


@dataclass
class DataSpec:
    kind: str
    path: str | None = None
    params: dict = field(default_factory=dict)

    def __str__(self) -> str:
        if self.path is not None:
            return f"{self.kind}:{self.path}"
        return f"{self.kind}:" + ",".join(f"{k}={v}" for k, v in self.params.items())

    def options(self) -> dict[str, str]:
        """The string options (``--data-opt``) that give this spec's ``params`` back through
        :func:`parse_data_spec`; empty for kinds other than csv/parquet."""
        if self.kind not in TABULAR_KINDS:
            return {}
        from .tabular import format_options

        return format_options(self.params)


def parse_data_spec(spec: str, options: dict[str, str] | None = None) -> DataSpec:
    """Parse ``--data``; ``options`` (``--data-opt KEY=VALUE``, as strings) apply to the csv and
    parquet kinds only and are validated here (kept typed in ``params``)."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(f"expected KIND:PATH or synthetic-mf:users=N,...; got {spec!r}", field="--data")
    if kind in TABULAR_KINDS:
        from .tabular import parse_options

        return DataSpec(kind, path=rest, params=parse_options(kind, options))
    known = (*FILE_KINDS, *SYNTHETIC_KINDS, PUBLIC_KIND, SAVED_KIND, *TABULAR_KINDS)
    if kind in known and options:
        raise ConfigError(
            f"{kind}: data takes no options (got {', '.join(options)}); they apply to csv: and parquet: data",
            field="--data-opt",
        )
    if kind in FILE_KINDS or kind in (PUBLIC_KIND, SAVED_KIND):
        return DataSpec(kind, path=rest)
    if kind in SYNTHETIC_KINDS:
        types = SYNTHETIC_KINDS[kind]
        params = {}
        for part in rest.split(","):
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in types:
                raise ConfigError(f"bad parameter {part!r} for {kind} (known: {', '.join(types)})", field="--data")
            try:
                params[key] = types[key](float(value)) if types[key] is int else types[key](value)
            except ValueError:
                raise ConfigError(f"{key} must be a number, got {value!r}", field="--data") from None
        for required in ("users", "items", "ratings") if kind == "synthetic-mf" else ("users",):
            if required not in params:
                raise ConfigError(f"{kind} needs {required}=N", field="--data")
        return DataSpec(kind, params=params)
    raise ConfigError(f"unknown data kind {kind!r} (known: {', '.join(known)})", field="--data")


# what declares the item catalogue of each kind of data (see require_declared_catalogue)
_CATALOGUE_REMEDY = {
    "tabular": (
        "--data-opt items=FILE (a file with a header line, then one item id per line: every item, rated or not) "
        "or a features table --data-opt features=PATH; in Python, items=FILE or items=[ids] among the data options"
    ),
    "frame": (
        "items=[ids] (every item id, rated or not: fedpriv.train(..., data_options={'items': ids}), "
        "fedpriv.load_data(df, items=ids) or dataset_from_pandas(df, items=ids)) "
        "or a features table features=DataFrame; for a csv:/parquet: file, --data-opt items=FILE"
    ),
    "builtin": (
        "the data set's item metadata file next to its ratings (ML-100K u.item, ML-1M/10M movies.dat, "
        "ML-20M/25M/latest movies.csv, Last.fm artists.dat)"
    ),
}


def require_declared_catalogue(dataset, spec: DataSpec, why: str) -> None:
    """Refuse, for a private run, a data set whose item catalogue was read off its ratings
    (``interactions.meta["catalogue"] == "ratings"``): adding a user who is an item's only rater
    would add an item (``n_items`` 20 -> 21), so the neighbouring data sets of user-level DP would
    not share the item space. ``why``: what makes the run private (named in the message). A
    non-private run only gets the loader's warning."""
    inter = getattr(dataset, "interactions", None)
    if inter is None or inter.meta.get("catalogue") != "ratings":
        return
    if spec.kind in TABULAR_KINDS:
        remedy, field_ = _CATALOGUE_REMEDY["tabular"], "--data-opt items"
    elif spec.kind in FILE_KINDS:
        remedy, field_ = _CATALOGUE_REMEDY["builtin"], "--data"
    else:  # a DataFrame or a Dataset loaded beforehand
        remedy, field_ = _CATALOGUE_REMEDY["frame"], "items"
    where = getattr(dataset, "source", None) or spec.kind
    raise ConfigError(
        f"{where}: no item catalogue: {why} is private, but the items were taken from the ratings, so n_items and the "
        "item ids would depend on who rated what (a new user who is the only rater of an item adds an item) and the "
        f"privacy guarantee would not hold; declare the catalogue: {remedy}",
        field=field_,
    )


def load_spec(spec: DataSpec):
    """Load or generate the data set of a spec: a :class:`fedpriv.data.loaders.Dataset`."""
    from .loaders import Dataset, load_dataset, load_jester

    if spec.kind in TABULAR_KINDS:
        from .tabular import load_tabular

        return load_tabular(spec.kind, spec.path, **spec.params)
    if spec.kind == PUBLIC_KIND:  # a deployment's public metadata: no ratings
        from .public import load_public

        return load_public(spec.path)
    if spec.kind == SAVED_KIND:
        from .saved import load_saved

        return load_saved(spec.path)
    if spec.kind == "jester":
        return load_jester(spec.path)
    if spec.path is not None:
        return load_dataset(spec.kind, spec.path)
    if spec.kind == "synthetic-personal":
        from .personal import make_personal

        return make_personal(**spec.params)
    from .synthetic import make_mf

    syn = make_mf(**spec.params)
    return Dataset(
        interactions=syn.interactions,
        item_features=syn.item_features,
        rating_range=syn.rating_range,
        implicit=False,
        source=str(spec),
        duplicates_dropped=0,
    )
