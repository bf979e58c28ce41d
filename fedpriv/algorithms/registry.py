"""The registry of the rating algorithms (the ALS family and the encoder family): one
:class:`AlgorithmSpec` per algorithm, holding what the engines and the config parser need to
know about it, so that they look an algorithm up instead of comparing its name.

Adding an algorithm of the family is one module that registers its spec, plus the import of
that module in ``fedpriv/algorithms/__init__.py`` (``dpals_uniform.py`` is the example). The
built-in members register in :mod:`fedpriv.algorithms.als`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class AlgorithmSpec:
    """What the engines know of one algorithm.

    ``rating_weights(shard, state)``: the per-rating weights of a shard's users, with
    sum_i w_ij^2 <= beta for every user (computed on the client, from public values and the
    user's own secret randomness). ``keys``: the configuration keys that only some algorithms
    read and this one does (any other algorithm refuses them).
    """

    name: str
    rating_weights: Callable
    private: bool = True
    needs_counts: bool = False
    needs_user_count: bool = False
    keys: tuple[str, ...] = ()
    summary: str = ""


_SPECS: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec``; a name registered twice is an error."""
    if spec.name in _SPECS:
        raise ValueError(f"algorithm {spec.name!r} is registered twice")
    _SPECS[spec.name] = spec
    return spec


def get(name: str) -> AlgorithmSpec:
    """The spec of ``name``; an unknown name is a ConfigError listing the known ones."""
    try:
        return _SPECS[name]
    except KeyError:
        raise ConfigError(f"unknown algorithm {name!r} (known: {', '.join(_SPECS)})", field="algorithm") from None


def names() -> tuple[str, ...]:
    """Every registered algorithm, in registration order."""
    return tuple(_SPECS)


def readers(key: str) -> tuple[str, ...] | None:
    """The algorithms that read ``key`` when only some do, else None (a key every one reads)."""
    found = tuple(name for name, spec in _SPECS.items() if key in spec.keys)
    return found or None
