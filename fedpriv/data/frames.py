"""Checks of a rating table held in a DataFrame: ids, rating values and duplicate pairs.

The table is a :class:`~fedpriv.data.tables.Table` (a DataFrame and where each row came from),
from a ``csv:`` file (read by the one table reader, :mod:`fedpriv.data.tables`), a ``parquet:``
file (:mod:`fedpriv.data.tabular`) or given by the user (:func:`fedpriv.data.tabular.dataset_from_pandas`,
:meth:`fedpriv.data.interactions.Interactions.from_pandas`). :func:`read_ratings` checks its
user, item and rating columns and returns plain arrays (:class:`RawRatings`: raw ids and float32
ratings, not yet renumbered); the callers turn them into interactions with
:func:`fedpriv.data.interactions.from_raw_ids`. This module imports no other module of
``fedpriv.data`` but :mod:`~fedpriv.data.tables`, so both the interactions type and the file
loaders can use it.

Ids are read as text and stripped of surrounding blanks; when every id of a column is an integer
written plainly (``42``, ``-7``, ``42.0``; not ``007`` nor ``+7``) the column becomes int64;
otherwise the ids stay strings (a numpy unicode array). An empty id, a missing-value marker
(``NaN``, ``null``, ...), an id with a control character, a float id that is not a whole number,
a rating that is empty, not a number, not finite, too large for a float32 or outside the declared
rating range, and (with ``duplicates="error"``) a repeated (user, item) pair are each a
:class:`~fedpriv.errors.DataError` naming where it is (see :class:`Table`): ``file.csv:LINE:``
for CSV, ``NAME: row N (0-based):`` otherwise. When several rows are bad the first one is reported.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from .tables import Table  # where a row is: one location class for every table reader

_INT_ID = r"-?(?:0|[1-9]\d{0,17})(?:\.0*)?"  # plainly written integers that fit an int64
#: pandas' missing-value spellings (compared lower-case).
NA_MARKERS = ("na", "n/a", "nan", "null", "none", "<na>")
_CONTROL = r"[\x00-\x1f\x7f]"


def require_frame(obj, field: str) -> pd.DataFrame:
    """``obj`` when it is a DataFrame, else a :class:`ConfigError` naming ``field``."""
    if not isinstance(obj, pd.DataFrame):
        raise ConfigError(f"expected a pandas DataFrame, got {type(obj).__name__}", field=field)
    return obj


@dataclass
class RawRatings:
    """The checked ratings of a table, one entry per row, ids not yet renumbered.

    ``users`` / ``items``: raw ids (int64, or a unicode array); ``ratings``: float32;
    ``duplicates_dropped``: the number of repeated (user, item) pairs that renumbering will drop
    (keeping the last rating of each; 0 with ``duplicates="error"``); ``catalogue``: with a
    table listing the items (a features table or an items list), the raw item id of each of its
    rows (the item catalogue), else None.
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    duplicates_dropped: int = 0
    catalogue: np.ndarray | None = None


# --------------------------------------------------------------------------- locations


# --------------------------------------------------------------------------- checks


@dataclass
class _Ids:
    """Raw ids of a column: int64 when all are plain integers, else a unicode array."""

    values: np.ndarray
    is_int: bool
    problem: tuple[int, str] | None = None
    stray: int | None = None  # first non-integer row of a mostly integer column (for a warning)

    def as_text(self) -> np.ndarray:
        return self.values.astype(str) if self.is_int else self.values


def _first(*candidates: tuple[np.ndarray, Callable[[int], str]]) -> tuple[int, str] | None:
    """(row, message) of the earliest flagged row over several masks (ties: the first mask)."""
    best: tuple[int, Callable[[int], str]] | None = None
    for mask, message in candidates:
        hits = np.flatnonzero(mask)
        if hits.size and (best is None or hits[0] < best[0]):
            best = (int(hits[0]), message)
    return None if best is None else (best[0], best[1](best[0]))


def stripped_text(column: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """Stripped text of a column ("" where missing) and the missing mask."""
    text = column.astype("str")
    missing = text.isna().to_numpy()
    text = text.fillna("").str.strip()
    return text, missing | (text.to_numpy() == "")


def _ids(column: pd.Series, what: str, label: str) -> _Ids:
    """Parse an id column; ``problem`` is its first empty or unusable id."""
    dtype = column.dtype
    n = len(column)
    if pd.api.types.is_integer_dtype(dtype):
        missing = column.isna().to_numpy()
        problem = _first((missing, lambda r: f"empty {what} id ({label})"))
        return _Ids(column.to_numpy(dtype=np.int64, na_value=0), True, problem)
    if pd.api.types.is_float_dtype(dtype):
        v = column.to_numpy(dtype=np.float64, na_value=np.nan)
        missing = np.isnan(v)
        with np.errstate(invalid="ignore"):
            whole = np.isfinite(v) & (v == np.round(v)) & (np.abs(v) < 1e18)
        problem = _first(
            (missing, lambda r: f"empty {what} id ({label})"),
            (~missing & ~whole, lambda r: f"{what} id {float(v[r])!r} is not a whole number ({label})"),
        )
        return _Ids(np.where(whole, v, 0).astype(np.int64), True, problem)
    text, empty = stripped_text(column)
    lower = text.str.lower()
    marker = lower.isin(NA_MARKERS).to_numpy()
    control = text.str.contains(_CONTROL, regex=True).to_numpy()
    problem = _first(
        (empty, lambda r: f"empty {what} id ({label})"),
        (marker, lambda r: f"{what} id {text.iat[r]!r} marks a missing value ({label})"),
        (control, lambda r: f"{what} id {text.iat[r]!r} holds a control character such as a line break ({label})"),
    )
    plain = text.str.fullmatch(_INT_ID).to_numpy(dtype=bool)
    if n and plain.all():
        if text.str.contains(".", regex=False).any():
            text = text.str.replace(r"\.0*$", "", regex=True)
        return _Ids(text.astype(np.int64).to_numpy(), True, problem)
    stray = None
    n_stray = n - int(plain.sum())
    if problem is None and plain.any() and n_stray <= max(1, n // 100):
        stray = int(np.flatnonzero(~plain)[0])
    return _Ids(text.to_numpy(dtype=str), False, problem, stray)


def _rating_values(
    column: pd.Series, label: str, rating_range: tuple[float, float] | None
) -> tuple[np.ndarray, tuple[int, str] | None]:
    """Ratings as float64 and the first bad one (empty, not a number, not finite, out of range)."""
    text = None
    if pd.api.types.is_bool_dtype(column.dtype) or pd.api.types.is_numeric_dtype(column.dtype):
        v = column.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        text, _ = stripped_text(column)
        v = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(v)
        overflow = finite & ~np.isfinite(v.astype(np.float32))
        outside = (
            np.zeros(len(v), dtype=bool)
            if rating_range is None
            else finite & ((v < rating_range[0]) | (v > rating_range[1]))
        )

    def not_finite(r: int) -> str:
        if text is None:
            return f"{label} {float(v[r])} is not a finite number"
        t = text.iat[r]
        if t == "":
            return f"empty {label}"
        try:
            if not math.isfinite(float(t)):
                return f"{label} {t} is not a finite number"
        except ValueError:
            pass
        return f"{label} {t!r} is not a number"

    problem = _first(
        (~finite, not_finite),
        (overflow, lambda r: f"{label} {v[r]:g} overflows a float32 rating"),
        (outside, lambda r: f"{label} {v[r]:g} is outside the rating range [{rating_range[0]:g}, {rating_range[1]:g}]"),
    )
    return v, problem


def _stray_warning(table: Table, ids: _Ids, what: str, label: str) -> None:
    if ids.stray is not None:
        r = ids.stray
        warnings.warn(
            f"{table.where}: {what} ids ({label}) are kept as strings because {table.at(r)} holds "
            f"{str(ids.values[r])!r}, which is not a plain integer (the other ids are)",
            stacklevel=4,
        )


def _show(raw) -> str:
    """A raw id for messages: 42 or 'abc'."""
    return repr(raw.item() if isinstance(raw, np.generic) else raw)


# --------------------------------------------------------------------------- the ratings


def read_ratings(
    table: Table,
    *,
    user: str = "user",
    item: str = "item",
    rating: str = "rating",
    implicit: bool = False,
    rating_range: tuple[float, float] | None = None,
    duplicates: str = "error",
    features: Table | None = None,
    feature_item: str | None = None,
    listing: str = "features table",
) -> RawRatings:
    """Check the ratings of ``table`` (and the item column of a ``features`` table).

    ``user`` / ``item`` / ``rating``: the column names (CSV without header: columns 1, 2, 3);
    ``implicit``: every row is one interaction of value 1 (no rating column); ``rating_range``:
    the declared (LO, HI) every rating must lie in (None: not checked); ``duplicates``:
    ``"error"`` (a repeated (user, item) pair is a DataError) or ``"last"`` (counted, with a
    warning); ``features``: a table listing the item catalogue, one item per row (a features
    table, or an items list: ``listing`` names it in messages); ``feature_item``: its item
    column (default ``item``). Every item rated must be listed in it, and listed once. Warns
    when a mostly integer id column is kept as text.
    """
    user_col, user_label = table.column(user, 0, "user", "set it with user=NAME")
    item_col, item_label = table.column(item, 1, "item", "set it with item=NAME")
    rating_col = None
    if not implicit:
        rating_col, _ = table.column(rating, 2, "rating", "set it with rating=NAME, or give implicit=1")
    if not len(table):
        raise DataError(
            f"no ratings: the {'DataFrame' if table.style == 'frame' else 'file'} has no data rows", path=table.where
        )
    users = _ids(user_col, "user", user_label)
    items = _ids(item_col, "item", item_label)
    if implicit:
        values, bad_rating = np.ones(len(table), dtype=np.float64), None
    else:
        rating_name = rating if table.style != "csv" or table.header else "rating"
        values, bad_rating = _rating_values(rating_col, rating_name, rating_range)
    problems = [p for p in (users.problem, items.problem, bad_rating) if p is not None]
    if problems:
        raise table.error(*min(problems, key=lambda p: p[0]))

    catalogue = None
    if features is not None:
        fitem = feature_item or item
        fcol, flabel = features.column(fitem, 0, "item", "set it with feature_item=NAME")
        if not len(features):
            raise DataError(f"the {listing} has no item rows", path=features.where)
        fids = _ids(fcol, "item", flabel)
        if fids.problem is not None:
            raise features.error(*fids.problem)
        if not (fids.is_int and items.is_int):
            fids = _Ids(fids.as_text(), False)
            items = _Ids(items.as_text(), False, None, items.stray)
        dup = pd.Series(fids.values).duplicated().to_numpy()
        if dup.any():
            r = int(np.flatnonzero(dup)[0])
            first = int(np.flatnonzero(fids.values[:r] == fids.values[r])[0])
            raise features.error(
                r, f"item {_show(fids.values[r])} is listed twice in the {listing} (first at {features.at(first)})"
            )
        catalogue = fids.values

    problems = []
    if catalogue is not None:
        unlisted = pd.Index(catalogue).get_indexer(items.values) < 0
        where = features.where if features is not None else ""
        problems.append(
            _first((unlisted, lambda r: f"item {_show(items.values[r])} is not listed in the {listing} ({where})"))
        )
    u_codes = pd.factorize(users.values)[0].astype(np.int64)
    i_codes, i_uniques = pd.factorize(items.values)
    key = u_codes * max(len(i_uniques), 1) + i_codes
    dup = pd.Series(key).duplicated().to_numpy()
    if duplicates == "error":

        def duplicate(r: int) -> str:
            first = int(np.flatnonzero(key[:r] == key[r])[0])
            return (
                f"duplicate (user, item) pair ({_show(users.values[r])}, {_show(items.values[r])}), first given at "
                f"{table.at(first)}; give duplicates=last to keep the last rating of each pair"
            )

        problems.append(_first((dup, duplicate)))
    problems = [p for p in problems if p is not None]
    if problems:
        raise table.error(*min(problems, key=lambda p: p[0]))
    _stray_warning(table, users, "user", user_label)
    _stray_warning(table, items, "item", item_label)

    n_dup = int(dup.sum())
    if n_dup:
        warnings.warn(
            f"{table.where}: dropped {n_dup} duplicate (user, item) pairs, keeping the last rating of each",
            stacklevel=3,
        )
    return RawRatings(users.values, items.values, values.astype(np.float32), n_dup, catalogue)
