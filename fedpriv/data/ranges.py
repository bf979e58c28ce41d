"""The one rule for a declared rating range, shared by the built-in loaders and the csv/parquet
reader: two numbers LO < HI, both finite; only an implicit data set's preset may leave HI open
(Last.fm's listening counts: [0, inf))."""

from __future__ import annotations

import math

from ..errors import ConfigError


def check_rating_range(rating_range, *, key: str = "rating_range", field: str | None = None, open_above: bool = False) -> tuple[float, float]:
    """(low, high) as floats, or a ConfigError naming ``field`` (default ``key``)."""
    try:
        low, high = (float(v) for v in rating_range)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected two numbers LO,HI such as 1,5, got {rating_range!r}", field=field or key) from None
    finite_high = math.isfinite(high) or (open_above and high == math.inf)
    if not (math.isfinite(low) and finite_high) or low >= high:
        raise ConfigError(f"{key}: expected finite numbers LO < HI, got {low:g},{high:g}", field=field or key)
    return low, high
