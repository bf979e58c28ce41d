"""Data specs of the CLI: ``KIND:PATH`` for files, ``synthetic-mf:key=value,...`` for generated
data, ``csv:PATH`` / ``parquet:PATH`` for a user's own rating table (its options, such as the
column names and the rating range, come separately: ``--data-opt KEY=VALUE``; see
:mod:`fedpriv.data.tabular`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError

FILE_KINDS = ("ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "ml-latest", "lastfm", "jester")
SYNTHETIC_KINDS = {
    "synthetic-mf": {"users": int, "items": int, "ratings": int, "seed": int, "rank": int, "skew": float, "noise": float},
    "synthetic-personal": {"users": int, "samples": int, "d": int, "k": int, "noise": float, "seed": int},
}
# data sets evaluated with the held-out-users protocol (Recall@k) unless told otherwise
HELDOUT_KINDS = ("ml-20m", "ml-25m", "lastfm")
# ``public:DIR``: the public folder of a partitioned deployment (metadata, no ratings)
PUBLIC_KIND = "public"
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
    known = (*FILE_KINDS, *SYNTHETIC_KINDS, PUBLIC_KIND, *TABULAR_KINDS)
    if kind in known and options:
        raise ConfigError(
            f"{kind}: data takes no options (got {', '.join(options)}); they apply to csv: and parquet: data",
            field="--data-opt",
        )
    if kind in FILE_KINDS or kind == PUBLIC_KIND:
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


def load_spec(spec: DataSpec):
    """Load or generate the data set of a spec: a :class:`fedpriv.data.loaders.Dataset`."""
    from .loaders import Dataset, load_dataset, load_jester

    if spec.kind in TABULAR_KINDS:
        from .tabular import load_tabular

        return load_tabular(spec.kind, spec.path, **spec.params)
    if spec.kind == PUBLIC_KIND:  # a deployment's public metadata: no ratings
        from .public import load_public

        return load_public(spec.path)
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
