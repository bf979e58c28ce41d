"""User-supplied rating tables: ``csv:PATH`` and ``parquet:PATH`` files, and pandas DataFrames.

One row per rating: a user column, an item column and (for explicit feedback) a rating column.
The file loaders read the file into a DataFrame (pandas' C parser for CSV, every cell as text;
pyarrow for parquet) and hand it to the same checks as :func:`dataset_from_pandas`, so a file
and the DataFrame it holds load to identical data sets.

Options (strings in a data spec, see :func:`parse_options`; keyword arguments of
:func:`dataset_from_pandas`):

* ``user``, ``item``, ``rating``: column names (defaults ``user``, ``item``, ``rating``).
* ``sep`` (CSV only, default ``,``; ``tab`` for a tab), ``header`` (``1``/``0``, default 1;
  with ``header=0`` the columns are positional: user, item, rating, and the names are ignored).
* ``rating_range=LO,HI``: required for explicit ratings; the declared, public range of the rating
  scale (it bounds each user's contribution, so it must not be read off the private data).
  Every rating must lie in it.
* ``implicit=1``: implicit feedback; each row is one interaction of value 1, no rating column.
* ``duplicates=error|last`` (default ``error``): a repeated (user, item) pair is an error, or
  keeps the last rating of the pair (with a warning; counted in ``Dataset.duplicates_dropped``).
* ``items=PATH``: the item catalogue, declared without features: a file with a header line,
  then one item id per line (CSV with the same ``sep``; parquet for ``.parquet``/``.pq``). A
  file of one column is read whatever its header says; with several columns the ids are in the
  ``feature_item`` column (default the ``item`` name) and the others are ignored. In Python
  (:func:`dataset_from_pandas`, ``fedpriv.load_data`` / ``fedpriv.train``) ``items`` may also be
  a sequence or array of raw item ids. It lists the item catalogue as the features table does
  (below): every item listed gets a dense id, rated or not; a rated item not listed, an item
  listed twice, an empty id are errors naming the file and line (``items: row N`` for a
  sequence). Give it or a features table, not both.
* Item features from a second table: ``features=PATH`` (parquet for ``.parquet``/``.pq``, else
  CSV with the same ``sep``, always with a header line), ``feature_item`` (its item column;
  default the ``item`` name), ``categorical=A;B`` and ``numeric=C`` (the feature columns, ``;``-
  or ``,``-separated; when
  either is given only the listed columns are used, else every other column: text columns are
  categorical, numeric ones numeric), ``multi_sep`` (default ``|``: a categorical cell may hold
  several values, ``Comedy|Drama``; empty: no splitting), ``name`` (display names of the items,
  ``ItemFeatures.names``), ``bins`` (default 5: numeric columns are cut into this many quantile
  buckets over the features table, ``year=1990-1994`` for whole numbers, ``price=[2.5, 7.1)``
  otherwise, plus ``year=unknown`` for a missing value). Categorical columns give one feature
  column per value (``genre=Comedy``; an empty cell activates none). The features table lists
  the item catalogue: every item it lists gets a dense id, rated or not, and a rated item it
  does not list is an error.

The item catalogue must not depend on the ratings: a catalogue read off the ratings changes
when a user who is an item's only rater joins (``n_items`` 20 -> 21), so add/remove-one-user
privacy would not hold. Without ``items`` or ``features`` the rated items are the catalogue,
with a warning and ``interactions.meta["catalogue"] == "ratings"``; a private run refuses such a
data set (:func:`fedpriv.data.spec.require_declared_catalogue`), a non-private one trains on it.

Ids are read as text and stripped of surrounding blanks; when every id of a column is an integer
written plainly (``42``, ``-7``, ``42.0``; not ``007`` nor ``+7``) the column becomes int64, so a
MovieLens CSV gives the raw ids of the built-in loader; otherwise the ids stay strings (a numpy
unicode array). The item ids of the ratings and of the features table are converted together.

Every problem is a :class:`~fedpriv.errors.DataError` naming where it is: ``file.csv:LINE:`` for
CSV (1-based physical line, the header is line 1), ``file.parquet: row N (0-based):`` for parquet
and ``DataFrame: row N (0-based):`` (the position, which is the index label of a default index)
for a DataFrame. When several rows are bad the first one is reported. Nothing is written.

This module reads the files and builds the data set and its item features; the checks of the
rating rows themselves (ids, ratings, duplicate pairs, error locations) are in
:mod:`fedpriv.data.frames`, which :meth:`Interactions.from_pandas` uses too.
"""

from __future__ import annotations

import importlib.util
import itertools
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError, did_you_mean
from .features import ItemFeatures, assemble_fields
from .frames import NA_MARKERS, read_ratings, require_frame, stripped_text
from .interactions import from_raw_ids
from .loaders import Dataset
from .ranges import check_rating_range
from .tables import Layout, Source, Table, read_table

#: Data spec kinds read by this module.
KINDS = ("csv", "parquet")
#: The CLI flag that carries the options (named in option errors).
OPTION_FLAG = "--data-opt"

_PARQUET_SUFFIXES = (".parquet", ".pq")
_UNKNOWN = "unknown"


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class TabularOptions:
    """The options of a rating table, with their defaults (see the module docstring)."""

    user: str = "user"
    item: str = "item"
    rating: str = "rating"
    sep: str = ","
    header: bool = True
    rating_range: tuple[float, float] | None = None
    implicit: bool = False
    duplicates: str = "error"
    items: object = None  # a file path (str), or a sequence of raw item ids (Python)
    features: str | None = None
    feature_item: str | None = None
    categorical: tuple[str, ...] | None = None
    numeric: tuple[str, ...] | None = None
    multi_sep: str | None = "|"
    name: str | None = None
    bins: int = 5


#: Option names accepted by :func:`parse_options`, in documentation order.
OPTION_NAMES = tuple(f.name for f in fields(TabularOptions))
_CSV_ONLY = ("sep", "header")
_FEATURE_OPTIONS = ("feature_item", "categorical", "numeric", "multi_sep", "name", "bins")
_FLAGS = {"1": True, "0": False, "true": True, "false": False, "yes": True, "no": False}
_SEP_WORDS = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "space": " ", "pipe": "|"}


def _column_name(key: str, value: str) -> str:
    name = value.strip()
    if not name:
        raise ConfigError(f"{key}= needs a column name", field=OPTION_FLAG)
    return name


def _flag(key: str, value: str) -> bool:
    flag = _FLAGS.get(value.strip().lower())
    if flag is None:
        raise ConfigError(f"{key}={value!r}: expected 1 or 0", field=OPTION_FLAG)
    return flag


def _separator(key: str, value: str) -> str:
    sep = _SEP_WORDS.get(value.lower(), value)
    if len(sep) != 1 or sep in '"\r\n':
        raise ConfigError(f"{key}={value!r}: expected one character, or the word tab", field=OPTION_FLAG)
    return sep


def _range_text(key: str, value: str) -> tuple[float, float]:
    parts = value.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        low, high = (float(p) for p in parts)
    except ValueError:
        raise ConfigError(f"{key}={value!r}: expected two numbers LO,HI such as 1,5", field=OPTION_FLAG) from None
    return _check_range(low, high, key, OPTION_FLAG)


def _check_range(low: float, high: float, key: str, field: str | None) -> tuple[float, float]:
    return check_rating_range((low, high), key=key, field=field)


def _duplicates(key: str, value: str) -> str:
    if value.strip() not in ("error", "last"):
        raise ConfigError(f"{key}={value!r}: expected error or last", field=OPTION_FLAG)
    return value.strip()


def _path(key: str, value: str) -> str:
    if not value.strip():
        raise ConfigError(f"{key}= needs a file path", field=OPTION_FLAG)
    return value.strip()


def _column_list(key: str, value: str) -> tuple[str, ...]:
    """``A;B`` (or ``A,B``, as a Python list is written by the API) -> ("A", "B")."""
    return tuple(c.strip() for c in value.replace(",", ";").split(";") if c.strip())


def _multi_sep(key: str, value: str) -> str | None:
    return value or None


def _bins(key: str, value: str) -> int:
    try:
        bins = int(value)
    except ValueError:
        raise ConfigError(f"{key}={value!r}: expected a whole number >= 1", field=OPTION_FLAG) from None
    if not 1 <= bins <= 1000:
        raise ConfigError(f"{key}={value!r}: expected a whole number from 1 to 1000", field=OPTION_FLAG)
    return bins


_PARSERS: dict[str, Callable[[str, str], object]] = {
    "user": _column_name, "item": _column_name, "rating": _column_name, "sep": _separator, "header": _flag,
    "rating_range": _range_text, "implicit": _flag, "duplicates": _duplicates, "items": _path, "features": _path,
    "feature_item": _column_name, "categorical": _column_list, "numeric": _column_list, "multi_sep": _multi_sep,
    "name": _column_name, "bins": _bins,
}  # fmt: skip


def parse_options(kind: str, options: Mapping[str, str] | None) -> dict:
    """Validate the string options of a ``csv:``/``parquet:`` data spec (``--data-opt KEY=VALUE``).

    Returns the given options only, typed (``header=0`` -> ``{"header": False}``); the loader
    applies the defaults. Raises :class:`ConfigError` (field ``--data-opt``) on an unknown key or
    a bad value, and (field ``rating_range``) when explicit ratings have no declared range.
    """
    typed: dict = {}
    for key, value in (options or {}).items():
        key = str(key).strip()
        if key not in _PARSERS:
            raise ConfigError(
                f"unknown option {key!r} for {kind}: data (known: {', '.join(OPTION_NAMES)})"
                f"{did_you_mean(key, OPTION_NAMES)}",
                field=OPTION_FLAG,
            )
        typed[key] = _PARSERS[key](key, str(value))
    _check_combination(kind, typed, OPTION_FLAG)
    return typed


def format_options(params: Mapping[str, object]) -> dict[str, str]:
    """The string options that :func:`parse_options` turns into ``params`` (round trip)."""
    out: dict[str, str] = {}
    for key, value in params.items():
        if isinstance(value, bool):
            out[key] = "1" if value else "0"
        elif key == "rating_range":
            out[key] = ",".join(repr(float(v)) for v in value)  # type: ignore[union-attr]
        elif key in ("categorical", "numeric"):
            out[key] = ";".join(value)  # type: ignore[arg-type]
        elif key == "sep" and value == "\t":
            out[key] = "tab"
        elif value is None:
            out[key] = ""
        else:
            out[key] = str(value)
    return out


def _check_combination(kind: str, given: Mapping[str, object], field: str | None) -> None:
    """Cross-checks of the given options. ``field``: the ConfigError field (None: the key)."""

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(message, field=field or key)

    if kind != "csv":
        side_csv = any(isinstance(given.get(k), str) and not _is_parquet(given[k]) for k in ("features", "items"))
        for key in _CSV_ONLY:
            if key in given and not (key == "sep" and side_csv):
                raise fail(key, f"{key} applies to csv: data only (and sep to a CSV features table or items list)")
    implicit = bool(given.get("implicit", False))
    if implicit and given.get("rating_range") is not None:
        raise fail("rating_range", "implicit=1 data has no rating scale: leave out rating_range (it is [0, 1])")
    if not implicit and given.get("rating_range") is None:
        raise ConfigError(
            "explicit ratings need their declared rating range, rating_range=LO,HI (e.g. 1,5 for one to five "
            "stars): the range is public knowledge of the rating scale and bounds what one user contributes, "
            "so it must not be read off the private data; give implicit=1 for data without ratings",
            field="rating_range",
        )
    if given.get("duplicates", "error") not in ("error", "last"):
        raise fail("duplicates", f"expected error or last, got {given['duplicates']!r}")
    if given.get("items") is not None and given.get("features") is not None:
        raise fail(
            "items", "give items=PATH or features=PATH, not both: the features table already lists the item catalogue"
        )
    if given.get("features") is None:
        allowed = ("feature_item",) if given.get("items") is not None else ()  # the items list's item column
        extra = [
            k
            for k in _FEATURE_OPTIONS
            if k not in allowed and given.get(k) is not None and given[k] != getattr(TabularOptions, k)
        ]
        if extra:
            raise fail(extra[0], f"{', '.join(extra)}: only with a features table (give features=PATH)")
        return
    categorical = tuple(given.get("categorical") or ())
    numeric = tuple(given.get("numeric") or ())
    both = sorted(set(categorical) & set(numeric))
    if both:
        raise fail("numeric", f"column {both[0]!r} is listed as both categorical and numeric")
    feature_item = given.get("feature_item") or given.get("item") or TabularOptions.item
    for key, column in (("feature_item", feature_item), ("name", given.get("name"))):
        if column is not None and column in categorical + numeric:
            raise fail(key, f"column {column!r} is the {key} column: it cannot also be a feature")
    bins = given.get("bins", TabularOptions.bins)
    if not isinstance(bins, (int, np.integer)) or isinstance(bins, bool) or not 1 <= bins <= 1000:
        raise fail("bins", f"expected a whole number from 1 to 1000, got {bins!r}")


def _options(kind: str, given: Mapping[str, object], field: str | None) -> TabularOptions:
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r} (known: {', '.join(OPTION_NAMES)}){did_you_mean(unknown[0], OPTION_NAMES)}",
            field=field or unknown[0],
        )
    _check_combination(kind, given, field)
    given = dict(given)
    if given.get("rating_range") is not None:  # typed options given by hand (load_tabular)
        try:
            low, high = (float(v) for v in given["rating_range"])  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise ConfigError(
                f"expected two numbers (LO, HI), got {given['rating_range']!r}", field=field or "rating_range"
            ) from None
        given["rating_range"] = _check_range(low, high, "rating_range", field)
    return TabularOptions(**given)


def _is_parquet(path: str) -> bool:
    return Path(path).suffix.lower() in _PARQUET_SUFFIXES


# --------------------------------------------------------------------------- public entry points


def load_tabular(kind: str, path: str | Path, **params) -> Dataset:
    """Load a ``csv`` or ``parquet`` rating file with the typed options of :func:`parse_options`."""
    if kind not in KINDS:
        raise ConfigError(f"unknown table kind {kind!r} (known: {', '.join(KINDS)})", field="--data")
    opts = _options(kind, params, OPTION_FLAG)
    table = _read_csv(path, opts.sep, opts.header) if kind == "csv" else _read_parquet(path)
    features = None
    if opts.features is not None:
        features = (
            _read_parquet(opts.features) if _is_parquet(opts.features) else _read_csv(opts.features, opts.sep, True)
        )
    items = None if opts.items is None else _items_table(opts.items, opts.sep, "items")
    return _dataset(table, opts, features, items, source=str(path), name=kind)


def dataset_from_pandas(
    df,
    *,
    user: str = "user",
    item: str = "item",
    rating: str = "rating",
    rating_range: tuple[float, float] | None = None,
    implicit: bool = False,
    duplicates: str = "error",
    items=None,
    features=None,
    feature_item: str | None = None,
    categorical: Sequence[str] | str | None = None,
    numeric: Sequence[str] | str | None = None,
    multi_sep: str | None = "|",
    name: str | None = None,
    bins: int = 5,
    source: str = "DataFrame",
) -> Dataset:
    """A data set from a DataFrame of ratings (one row per rating), with the checks of the file
    loaders (``csv:``/``parquet:``): see the module docstring for the options. ``items``: the
    item catalogue, a sequence or array of raw item ids (or the path of an items file);
    ``features``: an optional DataFrame of item features (one row per item of the catalogue;
    it then lists the catalogue); ``categorical`` / ``numeric`` are lists of its columns (or
    ``"a;b"`` strings). Errors name ``source`` and the 0-based row position. A named index level
    can stand for a column.
    """
    require_frame(df, "df")
    if features is not None:
        require_frame(features, "features")
    given: dict = {"user": user, "item": item, "rating": rating, "implicit": bool(implicit), "duplicates": duplicates}
    if rating_range is not None:
        given["rating_range"] = rating_range  # checked by _options
    if items is not None:
        given["items"] = items
    if features is not None:
        given.update(
            features="<DataFrame>", feature_item=feature_item, name=name, bins=bins, multi_sep=multi_sep or None
        )
        for key, value in (("categorical", categorical), ("numeric", numeric)):
            if value is not None:
                given[key] = _column_list(key, value) if isinstance(value, str) else tuple(str(c) for c in value)
    else:
        given.update(
            {
                k: v
                for k, v in (
                    ("feature_item", feature_item),
                    ("categorical", categorical),
                    ("numeric", numeric),
                    ("name", name),
                )
                if v is not None
            }
        )
        if bins != TabularOptions.bins:
            given["bins"] = bins
        if multi_sep != TabularOptions.multi_sep:
            given["multi_sep"] = multi_sep
    opts = _options("DataFrame", given, None)
    table = Table(df, source, "frame")
    ftable = None if features is None else Table(features, f"{source} features", "frame")
    itable = None if items is None else _items_table(items, ",", f"{source} items")
    return _dataset(table, opts, ftable, itable, source=source, name=source)


# --------------------------------------------------------------------------- reading


def _existing_file(path: str | Path) -> Path:
    """The file at ``path`` (a DataError naming it when it is missing or a folder)."""
    return Source.file(path).path


def _read_csv(path: str | Path, sep: str, header: bool, rows: str = "one rating per line") -> Table:
    """Every cell as text, through the one table reader (:func:`fedpriv.data.tables.read_table`);
    blank lines (and lines of empty fields) dropped. ``rows``: what the lines after the header
    hold (for the message about an empty file)."""
    source = Source.file(path)
    return read_table(source, Layout(source.path.name, sep, header=header, rows=rows))


def _read_parquet(path: str | Path) -> Table:
    if importlib.util.find_spec("pyarrow") is None:
        raise ConfigError("reading parquet files needs pyarrow: pip install pyarrow", field="--data")
    p = _existing_file(path)
    try:
        frame = pd.read_parquet(p, engine="pyarrow")
    except (OSError, ValueError, TypeError, NotImplementedError) as exc:  # pyarrow's errors derive from these
        raise DataError(f"cannot read as a parquet file: {exc}", path=str(path)) from None
    frame.columns = [str(c) for c in frame.columns]
    return Table(frame, str(path), "parquet")


def _items_table(items, sep: str, where: str) -> Table:
    """The items list as a table: a file (``str`` or path: parquet, else CSV with a header line),
    a DataFrame, or a sequence of raw item ids (one column ``item``; rows named ``where``)."""
    if isinstance(items, (str, Path)):
        return _read_parquet(items) if _is_parquet(str(items)) else _read_csv(items, sep, True, "one item id per line")
    if isinstance(items, pd.DataFrame):
        return Table(items, where, "frame")
    if isinstance(items, (pd.Series, pd.Index)):
        values = items.to_numpy()
    elif isinstance(items, (Sequence, np.ndarray)) and not isinstance(items, (bytes, bytearray)):
        values = np.asarray(items)
    else:
        raise ConfigError(
            f"expected a sequence or array of raw item ids, or the path of an items file; got {type(items).__name__}",
            field="items",
        )
    if values.ndim != 1:
        raise ConfigError(
            f"expected a flat sequence of raw item ids, got an array of shape {values.shape}", field="items"
        )
    return Table(pd.DataFrame({"item": pd.Series(values)}), where, "frame")


def _dataset(
    table: Table, opts: TabularOptions, features: Table | None, items: Table | None, *, source: str, name: str
) -> Dataset:
    """The data set of the ratings ``table``; its item catalogue is listed by the ``features``
    table or the ``items`` list (at most one is given), else taken from the ratings."""
    listing, what, item_column = features, "features table", opts.feature_item
    if items is not None:
        listing, what = items, "items list"
        if item_column is None and items.frame.shape[1] == 1:
            item_column = items.columns()[0]  # one column: the ids, whatever its header says
    raw = read_ratings(
        table, user=opts.user, item=opts.item, rating=opts.rating, implicit=opts.implicit,
        rating_range=opts.rating_range, duplicates=opts.duplicates, features=listing, feature_item=item_column,
        listing=what,
    )  # fmt: skip
    catalogue = raw.catalogue
    inter, n_dup = from_raw_ids(raw.users, raw.items, raw.ratings, name=name, item_universe=catalogue)
    assert n_dup == raw.duplicates_dropped
    item_features = None
    if catalogue is None:
        warnings.warn(
            f"{table.where}: no item catalogue (items=FILE listing the item ids, or features=PATH): the item catalogue "
            "is taken from the ratings, so n_items depends on the ratings (adding or removing a user can add or remove "
            "items); private algorithms refuse such data",
            stacklevel=3,
        )
    elif features is not None:
        assert catalogue is not None
        item_features = _item_features(features, opts, inter.item_ids, catalogue)
    rating_range = (0.0, 1.0) if opts.implicit else opts.rating_range
    assert rating_range is not None
    return Dataset(inter, item_features, rating_range, bool(opts.implicit), source, int(n_dup))


# --------------------------------------------------------------------------- item features


def _item_features(
    table: Table, opts: TabularOptions, item_ids: np.ndarray, raw_ids: np.ndarray
) -> ItemFeatures | None:
    """Multi-hot features of the catalogue items (rows in dense item order); ``raw_ids``: the
    raw item id of each row of the features table."""
    frame = table.frame
    fitem = opts.feature_item or opts.item
    n_items = len(item_ids)
    dense = pd.Index(item_ids).get_indexer(raw_ids)  # every listed item is in the catalogue
    names = None
    if opts.name is not None:
        column, _ = table.column(opts.name, 0, "name", "set it with name=NAME")
        text, missing = stripped_text(column)
        names_arr = np.asarray(item_ids).astype(str).astype(object)
        names_arr[dense[~missing]] = text.to_numpy(dtype=object)[~missing]
        names = [str(x) for x in names_arr]
    reserved = {fitem, opts.name}
    if opts.categorical is None and opts.numeric is None:
        chosen = [(c, None) for c in table.columns() if c not in reserved]
    else:
        listed = {c: "categorical" for c in opts.categorical or ()} | {c: "numeric" for c in opts.numeric or ()}
        for column in listed:
            if column not in frame.columns:
                found = ", ".join(table.columns())
                raise table.file_error(
                    f"no feature column {column!r} (listed in {listed[column]}=); columns found: {found}"
                )
        chosen = [(c, listed[c]) for c in table.columns() if c in listed]
    built: list[tuple[str, np.ndarray, np.ndarray, list[str]]] = []
    for column, kind in chosen:
        series = frame[column]
        if isinstance(series, pd.DataFrame):
            raise table.file_error(f"several columns are named {column!r}")
        numbers = None if kind == "categorical" else _numeric_values(table, series, column, explicit=kind == "numeric")
        if numbers is not None:
            rows, cols, labels = _buckets(numbers, opts.bins)
        else:
            rows, cols, labels = _categories(series, opts.multi_sep, column, auto=kind is None)
        built.append((column, dense[rows], cols, labels))
    if not built and names is None:
        return None
    return assemble_fields(n_items, built, names)


def _numeric_values(table: Table, series: pd.Series, column: str, *, explicit: bool) -> np.ndarray | None:
    """The values of a numeric column (NaN where missing); None when an auto-typed column is not
    numeric: in a DataFrame or parquet file a column of a non-numeric dtype, in a CSV file (all
    text) a column with a value that is not a number. A non-number or infinite value of a numeric
    column is a DataError at its row."""
    if not explicit and table.style != "csv" and not pd.api.types.is_numeric_dtype(series.dtype):
        return None
    if pd.api.types.is_bool_dtype(series.dtype):
        if explicit:
            raise table.file_error(f"numeric column {column!r} holds true/false values")
        return None
    if pd.api.types.is_numeric_dtype(series.dtype):
        values = series.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.isinf(values)
        text = None
    else:
        text, missing = stripped_text(series)
        missing |= text.str.lower().isin(NA_MARKERS).to_numpy()
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan).copy()
        values[missing] = np.nan
        bad = ~missing & ~np.isfinite(values)
        if not explicit and (bad.any() or missing.all()):
            return None  # text: a categorical column
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        shown = text.iat[r] if text is not None else float(values[r])
        raise table.error(r, f"{column} value {shown!r} is not a finite number (a numeric feature column)")
    return values


def _buckets(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """One-hot quantile bucket of each value; the last column is ``unknown`` (missing value)."""
    known = ~np.isnan(values)
    labels: list[str] = []
    cols = np.zeros(len(values), dtype=np.int64)
    if known.any():
        data = values[known]
        edges = np.quantile(data, np.linspace(0.0, 1.0, bins + 1))
        low, high = float(data.min()), float(data.max())
        if np.all(data == np.round(data)):  # whole numbers: inclusive ranges such as 1990-1994
            cuts = np.unique(np.ceil(edges[1:-1]))
            cuts = cuts[(cuts > low) & (cuts <= high)]
            starts = [low, *cuts.tolist()]
            ends = [c - 1 for c in cuts.tolist()] + [high]
            labels = [f"{a:.0f}" if a == b else f"{a:.0f}-{b:.0f}" for a, b in zip(starts, ends)]
        else:  # half-open intervals [a, b), the last one closed
            cuts = np.unique(edges)[1:-1]
            bounds = [low, *cuts.tolist(), high]
            labels = _interval_labels(bounds) if high > low else [_number(low)]
        cols[known] = np.searchsorted(cuts, data, side="right")
    cols[~known] = len(labels)
    labels.append(_UNKNOWN)
    return np.arange(len(values)), cols, labels


def _number(x: float) -> str:
    return f"{x:.6g}"


def _interval_labels(bounds: list[float]) -> list[str]:
    for fmt in (_number, repr):
        labels = [f"[{fmt(a)}, {fmt(b)})" for a, b in itertools.pairwise(bounds[:-1])]
        labels.append(f"[{fmt(bounds[-2])}, {fmt(bounds[-1])}]")
        if len(set(labels)) == len(labels):
            return labels
    return labels


def _categories(
    series: pd.Series, multi_sep: str | None, column: str, *, auto: bool
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """One column per value (sorted); cells may hold several values (``multi_sep``, or a list)."""
    values = series.reset_index(drop=True)
    if values.dtype == object and values.map(lambda v: isinstance(v, (list, tuple, set, np.ndarray))).any():
        values = values.map(lambda v: list(v) if isinstance(v, (list, tuple, set, np.ndarray)) else v).explode()
    text, missing = stripped_text(values)
    if multi_sep:
        text = text.str.split(multi_sep, regex=False).explode().str.strip()
        missing = text.to_numpy() == ""
    missing |= text.str.lower().isin(NA_MARKERS).to_numpy()
    rows = text.index.to_numpy()[~missing]
    codes, vocab = pd.factorize(text.to_numpy(dtype=str)[~missing], sort=True)
    if auto and len(vocab) > max(50, len(series) // 2):
        warnings.warn(
            f"feature column {column!r} has {len(vocab)} distinct values for {len(series)} items: is it an id or a "
            "title? Give name=COLUMN for display names, or list the feature columns with categorical=/numeric=",
            stacklevel=5,
        )
    return rows.astype(np.int64), codes.astype(np.int64), [str(v) for v in vocab]
