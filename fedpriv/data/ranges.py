"""The one rule for a declared rating range, shared by the built-in loaders and the csv/parquet
reader: two numbers LO < HI (neither NaN), both finite unless the caller reads without a bound
on that side: an implicit preset's open top (Last.fm's listening counts: [0, inf)), or a range
given to :func:`fedpriv.data.loaders.load_dataset` only to read the file (infinite bounds check
nothing but finiteness; a private run needs a finite range, which the csv reader requires)."""

from __future__ import annotations

import math

from ..errors import ConfigError


def check_rating_range(
    rating_range,
    *,
    key: str = "rating_range",
    field: str | None = None,
    open_above: bool = False,
    unbounded: bool = False,
) -> tuple[float, float]:
    """(low, high) as floats, or a ConfigError naming ``field`` (default ``key``).
    ``open_above``: HI may be +inf; ``unbounded``: either bound may be infinite."""
    try:
        low, high = (float(v) for v in rating_range)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{key}: expected two numbers LO,HI such as 1,5, got {rating_range!r}", field=field or key
        ) from None
    ok_low = math.isfinite(low) or (unbounded and low == -math.inf)
    ok_high = math.isfinite(high) or ((open_above or unbounded) and high == math.inf)
    if not (ok_low and ok_high) or not low < high:
        raise ConfigError(f"{key}: expected finite numbers LO < HI, got {low:g},{high:g}", field=field or key)
    return low, high
