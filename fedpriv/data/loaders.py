"""Loaders for the public rating data sets, from a folder or from the official zip.

Supported: MovieLens 100K / 1M / 10M / 20M / 25M / latest(-small), Last.fm HetRec 2011 (implicit
listening counts) and Jester data set 1. Files follow the official distributions; in a zip they
are found by base name, at the top level or under one folder (``ml-100k/u.data``).

Parsing has a fast path (pandas C parser with explicit dtypes). When it fails, the file is parsed
again in chunks of lines, and a chunk the fast parser rejects is scanned line by line to report
its first bad line; so every :class:`DataError` names the file and, where one applies, the
1-based line number (the header counts as line 1) without slowing the happy path.

Item catalogue: the items of a data set are those listed in its public metadata (ML-100K
``u.item``; ML-1M/10M ``movies.dat``; ML-20M/25M/latest ``movies.csv``; Last.fm ``artists.dat``;
Jester: jokes 1..100), whether rated or not, so ``n_items`` and the dense item ids do not depend
on the ratings: removing one user (a neighbouring data set) leaves them unchanged. A rated item
missing from the metadata is a :class:`DataError` naming the ratings file and line. Without the
metadata file the rated items are used, with a warning, and ``interactions.meta["catalogue"]``
is ``"ratings"`` instead of ``"metadata"``. Users are the users with ratings, renumbered densely
in raw id order.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import itertools
import math
import os
import re
import warnings
import zipfile
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedpriv.data.features import ItemFeatures, build_item_features, parse_release_year, parse_title_year
from fedpriv.data.interactions import Interactions, from_raw_ids
from fedpriv.data.ranges import check_rating_range
from fedpriv.errors import DataError

#: Names of the standard ML-100K genres, in ``u.genre`` order (used when ``u.genre`` is absent).
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
    "War", "Western",
)  # fmt: skip

JESTER_RANGE = (-10.0, 10.0)
JESTER_NOT_RATED = 99.0

_INT_TEXT = re.compile(r"[+-]?\d{1,18}(?:\.0*)?")
_PANDAS_DTYPES = {"int": np.int64, "float": np.float64, "str": str}
_NUMPY_DTYPES = {"int": np.int64, "float": np.float64, "str": object}
_FAST_PARSE_ERRORS = (ValueError, OverflowError, pd.errors.ParserWarning)
_CHUNK_BYTES = 1 << 22  # lines are re-parsed in runs of about this size after a fast-path failure


@dataclass
class Dataset:
    """A loaded data set: the ratings, optional item features, and how they were read."""

    interactions: Interactions
    item_features: ItemFeatures | None
    rating_range: tuple[float, float]
    implicit: bool
    source: str
    duplicates_dropped: int

    def __repr__(self) -> str:
        inter = self.interactions
        kind = "implicit" if self.implicit else f"ratings {self.rating_range[0]:g}-{self.rating_range[1]:g}"
        features = f", {self.item_features.matrix.shape[1]} item features" if self.item_features is not None else ""
        return f"Dataset({inter.name or self.source}: {inter.n_users:,} users, {inter.n_items:,} items, {len(inter.ratings):,} {kind}{features})"


# --------------------------------------------------------------------------- file layouts


@dataclass(frozen=True)
class _Table:
    """Layout of one delimited text file: base name, separator, column names and kinds.

    ``kinds`` holds "int", "float" or "str" per column. With ``header`` the first line must name
    the columns (compared case-insensitively).
    """

    name: str
    sep: str
    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    header: bool = False


@dataclass
class _Parsed:
    """The parsed columns of a table, with what is needed to point at the line of a row."""

    table: _Table
    where: str
    blob: bytes
    columns: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.columns[0])

    def error_at(self, row: int, message: str) -> DataError:
        """A DataError naming the file line that holds data row ``row`` (0-based)."""
        line = next(itertools.islice(_data_line_numbers(self.blob, self.table.header), row, None))
        return DataError(message, path=self.where, line=line)


_IIFI = ("int", "int", "float", "int")
_ML100K_RATINGS = _Table("u.data", "\t", ("user id", "item id", "rating", "timestamp"), _IIFI)
_ML_DAT_RATINGS = _Table("ratings.dat", "::", ("UserID", "MovieID", "Rating", "Timestamp"), _IIFI)
_ML_CSV_RATINGS = _Table("ratings.csv", ",", ("userId", "movieId", "rating", "timestamp"), _IIFI, header=True)
_LASTFM_RATINGS = _Table("user_artists.dat", "\t", ("userID", "artistID", "weight"), ("int", "int", "int"), header=True)

_ML_DAT_MOVIES = _Table("movies.dat", "::", ("MovieID", "Title", "Genres"), ("int", "str", "str"))
_ML_DAT_TAGS = _Table("tags.dat", "::", ("UserID", "MovieID", "Tag", "Timestamp"), ("int", "int", "str", "int"))
_ML_CSV_MOVIES = _Table("movies.csv", ",", ("movieId", "title", "genres"), ("int", "str", "str"), header=True)
_ML_CSV_TAGS = _Table(
    "tags.csv", ",", ("userId", "movieId", "tag", "timestamp"), ("int", "int", "str", "int"), header=True
)
_ML100K_GENRE = _Table("u.genre", "|", ("genre", "index"), ("str", "int"))
_LASTFM_TAGGED = _Table(
    "user_taggedartists.dat", "\t", ("userID", "artistID", "tagID", "day", "month", "year"), ("int",) * 6, header=True
)
_LASTFM_TAGS = _Table("tags.dat", "\t", ("tagID", "tagValue"), ("int", "str"), header=True)
_LASTFM_ARTISTS = _Table(
    "artists.dat", "\t", ("id", "name", "url", "pictureURL"), ("int", "str", "str", "str"), header=True
)

#: Joke ids of Jester: the catalogue is always the 100 jokes.
JESTER_JOKES = np.arange(1, 101, dtype=np.int64)


# --------------------------------------------------------------------------- folder or zip


class _Source:
    """A data folder or a zip archive. Zip members are found by base name, at the top level or
    under one folder; folder files must sit directly in the folder."""

    def __init__(self, path: Path):
        self.path = path
        self._zip: zipfile.ZipFile | None = None
        self.parsed: dict[_Table, _Parsed] = {}  # tables already parsed (metadata is read twice)
        if path.is_dir():
            self._members = {p.name: [p.name] for p in path.iterdir() if p.is_file()}
        elif path.is_file():
            self._zip = _open_zip(path)
            self._members = _index_zip(self._zip)
        else:
            raise DataError("no such file or folder", path=str(path))

    def __enter__(self) -> _Source:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._zip is not None:
            self._zip.close()

    def has(self, name: str) -> bool:
        """Whether a file with this base name exists."""
        return name in self._members

    def matching(self, pattern: str) -> list[str]:
        """Base names matching a shell pattern such as ``jester-data-*.csv``, sorted."""
        return sorted(n for n in self._members if fnmatch.fnmatchcase(n, pattern))

    def where(self, name: str) -> str:
        """How a file is named in messages: its path, or ``archive.zip/member``."""
        return f"{self.path}/{self._member(name)}" if self._zip else str(self.path / name)

    def read(self, name: str) -> bytes:
        """The bytes of a file; DataError when it is missing or unreadable."""
        member = self._member(name)
        try:
            if self._zip is not None:
                return self._zip.read(member)
            return (self.path / member).read_bytes()
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
            raise DataError(f"cannot read {member}: {exc}", path=str(self.path)) from exc

    def _member(self, name: str) -> str:
        """The zip member or folder file with this base name (exactly one)."""
        members = self._members.get(name, [])
        if not members:
            what = "zip archive has no member" if self._zip else "folder has no file"
            raise DataError(f"{what} named {name!r}", path=str(self.path))
        if len(members) > 1:
            raise DataError(f"several members named {name!r}: {', '.join(members)}", path=str(self.path))
        return members[0]


def _open_zip(path: Path) -> zipfile.ZipFile:
    """Open a zip archive, or raise a DataError naming it."""
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"not a data folder nor a valid zip archive ({exc})", path=str(path)) from exc


def _index_zip(archive: zipfile.ZipFile) -> dict[str, list[str]]:
    """Base name -> members, for files at the top level or under one folder."""
    index: dict[str, list[str]] = defaultdict(list)
    for info in archive.infolist():
        parts = info.filename.split("/")
        if not info.is_dir() and len(parts) <= 2:
            index[parts[-1]].append(info.filename)
    return dict(index)


# --------------------------------------------------------------------------- table parsing


def _read_table(source: _Source, table: _Table) -> _Parsed:
    """Read and parse one table of a source (once: later calls reuse the parse)."""
    if table not in source.parsed:
        source.parsed[table] = _parse_table(source.read(table.name), table, source.where(table.name))
    return source.parsed[table]


def _parse_table(blob: bytes, table: _Table, where: str) -> _Parsed:
    """Parse a table strictly: exact column count, numeric columns numeric.

    Text columns are decoded as UTF-8, or Latin-1 when the file is not valid UTF-8.
    """
    encoding = _guess_encoding(blob) if "str" in table.kinds else "utf-8"
    if table.header:
        _check_header(blob, table, where, encoding)
    columns = _try_fast_parse(blob, table, encoding, skip_header=table.header)
    if columns is None:
        columns = _scan(blob, table, where, encoding)
    return _Parsed(table, where, blob, columns)


def _try_fast_parse(blob: bytes, table: _Table, encoding: str, *, skip_header: bool) -> list[np.ndarray] | None:
    """The fast parse, or None when it fails or does not apply.

    The C parser pads missing trailing fields with "" instead of failing, which would hide a
    short line when the last column is text: such (small, metadata) tables are always scanned.
    """
    if table.kinds[-1] == "str":
        return None
    try:
        return _fast_parse(blob, table, encoding, skip_header=skip_header)
    except _FAST_PARSE_ERRORS:
        return None


def _guess_encoding(blob: bytes) -> str:
    """UTF-8 when the bytes decode as such, else Latin-1 (older MovieLens and Last.fm files)."""
    try:
        blob.decode("utf-8")
    except UnicodeDecodeError:
        return "latin-1"
    return "utf-8"


def _check_header(blob: bytes, table: _Table, where: str, encoding: str) -> None:
    """The first line must name the table's columns."""
    end = blob.find(b"\n")
    first = blob[: end if end >= 0 else len(blob)].decode(encoding, errors="replace")
    first = first.removeprefix("\ufeff").removesuffix("\r")
    found = [f.strip().lower() for f in _split(first, table.sep)]
    if found != [c.lower() for c in table.columns]:
        expected = table.sep.join(table.columns)
        raise DataError(f"expected the header {expected!r}, found {first!r}", path=where, line=1)


def _fast_parse(blob: bytes, table: _Table, encoding: str, *, skip_header: bool) -> list[np.ndarray]:
    """pandas C parser; raises one of ``_FAST_PARSE_ERRORS`` on anything irregular (except
    missing trailing text fields, see :func:`_try_fast_parse`)."""
    sep = table.sep
    if len(sep) > 1:  # the C parser needs a one-character separator
        blob = blob.replace(sep.encode(), b"\t")
        sep = "\t"
    names = [f"c{i}" for i in range(len(table.columns))]
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)  # e.g. extra fields on line 1
        frame = pd.read_csv(
            io.BytesIO(blob),
            sep=sep,
            header=None,
            names=names,
            index_col=False,
            skiprows=1 if skip_header else 0,
            dtype={n: _PANDAS_DTYPES[k] for n, k in zip(names, table.kinds)},
            encoding=encoding,
            na_filter=False,
            quoting=csv.QUOTE_MINIMAL if sep == "," else csv.QUOTE_NONE,
            engine="c",
        )
    return [frame[n].to_numpy() for n in names]


def _scan(blob: bytes, table: _Table, where: str, encoding: str) -> list[np.ndarray]:
    """Chunk by chunk: the fast parser where it works, else a careful line-by-line parse that
    raises a DataError at the first bad line."""
    parts = [
        _parse_chunk(chunk, first_line, table, where, encoding) for first_line, chunk in _chunks(blob, table.header)
    ]
    return [np.concatenate([p[i] for p in parts]) for i in range(len(table.columns))]


def _parse_chunk(chunk: bytes, first_line: int, table: _Table, where: str, encoding: str) -> list[np.ndarray]:
    """Fast parse of whole lines when it applies and succeeds, else the careful scan."""
    columns = _try_fast_parse(chunk, table, encoding, skip_header=False)
    return _scan_lines(chunk, first_line, table, where, encoding) if columns is None else columns


def _scan_lines(chunk: bytes, first_line: int, table: _Table, where: str, encoding: str) -> list[np.ndarray]:
    """Careful parse of whole lines numbered from ``first_line``."""
    n_cols = len(table.columns)
    values: list[list] = [[] for _ in range(n_cols)]
    for line_no, raw in _nonblank(chunk, first_line):
        fields = _split(raw.decode(encoding, errors="replace").removesuffix("\r"), table.sep)
        if len(fields) != n_cols:
            raise DataError(
                f"expected {n_cols} fields ({table.sep.join(table.columns)}), found {len(fields)}",
                path=where,
                line=line_no,
            )
        for out, field, column, kind in zip(values, fields, table.columns, table.kinds):
            out.append(_convert(field, kind, column, where, line_no))
    return [np.array(v, dtype=_NUMPY_DTYPES[k]) for v, k in zip(values, table.kinds)]


def _chunks(blob: bytes, header: bool) -> Iterator[tuple[int, bytes]]:
    """(number of its first line, bytes) of consecutive runs of whole lines, after the header.

    Always yields at least one (possibly empty) chunk.
    """
    start, line_no = 0, 1
    if header:
        start = blob.find(b"\n") + 1 or len(blob)
        line_no = 2
    while True:
        end = blob.find(b"\n", min(start + _CHUNK_BYTES, len(blob)))
        end = len(blob) if end < 0 else end + 1
        chunk = blob[start:end]
        yield line_no, chunk
        if end >= len(blob):
            return
        line_no += chunk.count(b"\n")
        start = end


def _nonblank(chunk: bytes, first_line: int) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of the lines holding more than blanks."""
    for line_no, raw in enumerate(chunk.split(b"\n"), start=first_line):
        if raw.strip(b" \t\r"):
            yield line_no, raw


def _data_line_numbers(blob: bytes, header: bool) -> Iterator[int]:
    """Line numbers of the data lines, i.e. of the parsed rows, in order."""
    for first_line, chunk in _chunks(blob, header):
        for line_no, _ in _nonblank(chunk, first_line):
            yield line_no


def _split(line: str, sep: str) -> list[str]:
    """Split one line into fields (CSV quoting rules for commas)."""
    if sep == ",":
        return next(csv.reader([line]), [])
    return line.split(sep)


def _convert(field: str, kind: str, column: str, where: str, line_no: int) -> int | float | str:
    """Convert one field, or raise a DataError naming the column and the line."""
    if kind == "str":
        return field
    text = field.strip()
    if kind == "int":
        if _INT_TEXT.fullmatch(text):
            return int(text.split(".")[0])
        raise DataError(f"{column} {field!r} is not an integer", path=where, line=line_no)
    try:
        if "_" not in text:
            return float(text)
    except ValueError:
        pass
    raise DataError(f"{column} {field!r} is not a number", path=where, line=line_no)


def _check_values(parsed: _Parsed, column: int, low: float, high: float) -> None:
    """Every value of a numeric column is finite and within [low, high]."""
    values = parsed.columns[column].astype(np.float64)
    with np.errstate(over="ignore"):
        stored = values.astype(np.float32)  # ratings are stored as float32: check what is stored
    bad = ~np.isfinite(values) | ~np.isfinite(stored) | (values < low) | (values > high)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = values[row]
        name = parsed.table.columns[column]
        if not math.isfinite(value):
            raise parsed.error_at(row, f"{name} {value} is not a finite number")
        if not math.isfinite(stored[row]):
            raise parsed.error_at(row, f"{name} {value:g} overflows a float32 rating")
        raise parsed.error_at(row, f"{name} {value:g} is outside the rating range [{low:g}, {high:g}]")


# --------------------------------------------------------------------------- item features


def _ml100k_items(source: _Source) -> _Parsed:
    """``u.item``, with one genre flag column (0 or 1) per genre of ``u.genre`` (the standard 19
    without it)."""
    genre_names = _ml100k_genre_names(source)
    table = _Table(
        "u.item",
        "|",
        ("movie id", "movie title", "release date", "video release date", "IMDb URL", *genre_names),
        ("int", "str", "str", "str", "str", *("int",) * len(genre_names)),
    )
    parsed = _read_table(source, table)
    if genre_names:
        flags = np.column_stack(parsed.columns[5:])
        bad = ((flags != 0) & (flags != 1)).any(axis=1)
        if bad.any():
            raise parsed.error_at(int(np.flatnonzero(bad)[0]), "genre flags must be 0 or 1")
    return parsed


def _ml100k_features(source: _Source, item_ids: np.ndarray) -> ItemFeatures | None:
    """Genres and release year from ``u.item`` (genre names from ``u.genre`` when present)."""
    if not source.has("u.item"):
        return None
    parsed = _ml100k_items(source)
    genre_names = parsed.table.columns[5:]
    flags = np.column_stack(parsed.columns[5:]) if genre_names else np.zeros((len(parsed), 0), dtype=np.int64)
    ids, titles, dates = parsed.columns[0].tolist(), parsed.columns[1], parsed.columns[2]
    genres = {m: [g for g, f in zip(genre_names, row) if f] for m, row in zip(ids, flags.tolist())}
    years = {m: parse_release_year(d) or parse_title_year(t) for m, t, d in zip(ids, titles, dates)}
    feats = build_item_features(len(item_ids), item_ids, genres, years, genre_vocab=genre_names)
    feats.names = _item_names(item_ids, dict(zip(ids, titles.tolist())))
    return feats


def _item_names(item_ids: np.ndarray, titles: dict) -> list[str]:
    """Display names in dense item order (the raw id where no title is known)."""
    return [str(titles.get(m, m)) for m in np.asarray(item_ids).tolist()]


def _ml100k_genre_names(source: _Source) -> tuple[str, ...]:
    """Genre names ordered by their index in ``u.genre``; the standard 19 when it is absent."""
    if not source.has(_ML100K_GENRE.name):
        return ML100K_GENRES
    parsed = _read_table(source, _ML100K_GENRE)
    names, index = parsed.columns
    order = np.argsort(index, kind="stable")
    wrong = np.flatnonzero(index[order] != np.arange(len(index)))
    if wrong.size:
        raise parsed.error_at(int(order[wrong[0]]), "genre indices must run 0, 1, 2, ... without gaps")
    return tuple(names[order].tolist())


def _movie_features(source: _Source, item_ids: np.ndarray, movies: _Table, tags: _Table) -> ItemFeatures | None:
    """Genres and title year from the movies table, tags from the tags table (both optional)."""
    genres = years = tag_lists = names = None
    if source.has(movies.name):
        ids, titles, genre_text = _read_table(source, movies).columns
        ids = ids.tolist()
        genres = {m: g.split("|") for m, g in zip(ids, genre_text)}
        years = {m: parse_title_year(t) for m, t in zip(ids, titles)}
        names = _item_names(item_ids, dict(zip(ids, titles.tolist())))
    if source.has(tags.name):
        _, movie_ids, tag_text, _ = _read_table(source, tags).columns
        tag_lists = _group(movie_ids.tolist(), tag_text.tolist())
    if genres is None and tag_lists is None:
        return None
    feats = build_item_features(len(item_ids), item_ids, genres, years, tag_lists)
    feats.names = names
    return feats


def _lastfm_features(source: _Source, item_ids: np.ndarray) -> ItemFeatures | None:
    """Artist tags from ``user_taggedartists.dat`` with their names from ``tags.dat``."""
    if not source.has(_LASTFM_TAGGED.name):
        return None
    tag_ids, tag_values = _read_table(source, _LASTFM_TAGS).columns
    names = dict(zip(tag_ids.tolist(), tag_values.tolist()))
    tagged = _read_table(source, _LASTFM_TAGGED)
    artists, tags = tagged.columns[1].tolist(), tagged.columns[2].tolist()
    missing = [row for row, t in enumerate(tags) if t not in names]
    if missing:
        raise tagged.error_at(missing[0], f"tagID {tags[missing[0]]} is not listed in tags.dat")
    return build_item_features(len(item_ids), item_ids, None, None, _group(artists, [names[t] for t in tags]))


def _group(keys: list, values: list) -> dict:
    """key -> list of its values, in order."""
    groups: dict = defaultdict(list)
    for key, value in zip(keys, values):
        groups[key].append(value)
    return dict(groups)


# --------------------------------------------------------------------------- data set kinds


@dataclass(frozen=True)
class _Format:
    """How to load one data set kind.

    ``catalogue`` parses the metadata file named ``catalogue_file``, whose first column holds
    the raw id of every item of the data set.
    """

    ratings: _Table
    rating_range: tuple[float, float]
    features: Callable[[_Source, np.ndarray], ItemFeatures | None]
    catalogue_file: str
    catalogue: Callable[[_Source], _Parsed]
    implicit: bool = False


def _dat_features(source: _Source, item_ids: np.ndarray) -> ItemFeatures | None:
    """ML-1M / ML-10M metadata: ``movies.dat`` and ``tags.dat``."""
    return _movie_features(source, item_ids, _ML_DAT_MOVIES, _ML_DAT_TAGS)


def _csv_features(source: _Source, item_ids: np.ndarray) -> ItemFeatures | None:
    """ML-20M / 25M / latest metadata: ``movies.csv`` and ``tags.csv``."""
    return _movie_features(source, item_ids, _ML_CSV_MOVIES, _ML_CSV_TAGS)


def _table_reader(table: _Table) -> Callable[[_Source], _Parsed]:
    """A catalogue reader parsing ``table``."""
    return lambda source: _read_table(source, table)


_DAT_CATALOGUE = ("movies.dat", _table_reader(_ML_DAT_MOVIES))
_CSV_CATALOGUE = ("movies.csv", _table_reader(_ML_CSV_MOVIES))

_FORMATS: dict[str, _Format] = {
    "ml-100k": _Format(_ML100K_RATINGS, (1.0, 5.0), _ml100k_features, "u.item", _ml100k_items),
    "ml-1m": _Format(_ML_DAT_RATINGS, (1.0, 5.0), _dat_features, *_DAT_CATALOGUE),
    "ml-10m": _Format(_ML_DAT_RATINGS, (0.5, 5.0), _dat_features, *_DAT_CATALOGUE),
    "ml-20m": _Format(_ML_CSV_RATINGS, (0.5, 5.0), _csv_features, *_CSV_CATALOGUE),
    "ml-25m": _Format(_ML_CSV_RATINGS, (0.5, 5.0), _csv_features, *_CSV_CATALOGUE),
    "ml-latest": _Format(_ML_CSV_RATINGS, (0.5, 5.0), _csv_features, *_CSV_CATALOGUE),
    "lastfm": _Format(
        _LASTFM_RATINGS, (0.0, math.inf), _lastfm_features, "artists.dat", _table_reader(_LASTFM_ARTISTS),
        implicit=True,
    ),
}

#: Data set kinds accepted by :func:`load_dataset`.
KNOWN_KINDS = tuple(_FORMATS)


def load_dataset(
    kind: str, path: str | os.PathLike, *, rating_range: tuple[float, float] | None = None
) -> Dataset:
    """Load a data set of the given kind from a folder or the official zip.

    ``rating_range`` overrides the declared range (ML-100K/1M: [1, 5]; ML-10M/20M/25M/latest:
    [0.5, 5]; Last.fm: [0, inf)); every rating must lie within it. Duplicate (user, item) pairs
    keep the last rating; their count is warned about and kept in ``duplicates_dropped``.

    Items are the public catalogue of the metadata file (``u.item``, ``movies.dat``,
    ``movies.csv``, ``artists.dat``), rated or not; a rated item it does not list is a
    :class:`DataError` at that rating's line. Without the metadata file the rated items are used
    (with a warning; ``interactions.meta["catalogue"] == "ratings"``).
    Raises :class:`DataError` on an unknown kind, a missing path or member, or bad data.
    """
    fmt = _FORMATS.get(kind)
    if fmt is None:
        raise DataError(f"unknown data set kind {kind!r}; known kinds: {', '.join(KNOWN_KINDS)}")
    low, high = check_rating_range(fmt.rating_range if rating_range is None else rating_range, open_above=fmt.implicit, unbounded=rating_range is not None)
    with _Source(Path(os.fspath(path))) as source:
        parsed = _read_table(source, fmt.ratings)
        if not len(parsed):
            raise DataError("no ratings (the file has no data rows)", path=parsed.where)
        _check_values(parsed, 2, low, high)
        catalogue = _item_catalogue(source, fmt, parsed)
        interactions, n_dup = _interactions(parsed, kind, catalogue)
        features = fmt.features(source, interactions.item_ids)
    return Dataset(interactions, features, (low, high), fmt.implicit, str(path), n_dup)


def load_jester(path: str | os.PathLike) -> Dataset:
    """Load Jester (``jester-data-*.csv``, from a folder or the official zip).

    Each line is one user: the number of rated jokes, then 100 ratings in [-10, 10] where 99
    means "not rated". User ids are the 1-based data row numbers, item ids the joke numbers;
    the item catalogue is always the 100 jokes, rated or not.
    """
    with _Source(Path(os.fspath(path))) as source:
        names = source.matching("jester-data-*.csv")
        if len(names) != 1:
            found = f"found {', '.join(names)}" if names else "found none"
            raise DataError(f"expected exactly one jester-data-*.csv file, {found}", path=str(path))
        columns = ("count", *(f"joke {j}" for j in range(1, 101)))
        parsed = _read_table(source, _Table(names[0], ",", columns, ("int",) + ("float",) * 100))
    if not len(parsed):
        raise DataError("no ratings (the file has no data rows)", path=parsed.where)
    scores = np.column_stack(parsed.columns[1:])
    _check_jester(parsed, scores)
    users, jokes = np.nonzero(scores != JESTER_NOT_RATED)
    interactions, n_dup = from_raw_ids(
        users + 1, jokes + 1, scores[users, jokes], name="jester", item_universe=JESTER_JOKES
    )
    return Dataset(interactions, None, JESTER_RANGE, False, str(path), n_dup)


def _check_jester(parsed: _Parsed, scores: np.ndarray) -> None:
    """Ratings are 99 or within [-10, 10]; the count column matches the rated jokes."""
    rated = scores != JESTER_NOT_RATED
    low, high = JESTER_RANGE
    bad = (rated & ~((scores >= low) & (scores <= high))).any(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise parsed.error_at(row, f"ratings must lie in [{low:g}, {high:g}] or be {JESTER_NOT_RATED:g} (not rated)")
    mismatch = np.flatnonzero(parsed.columns[0] != rated.sum(axis=1))
    if mismatch.size:
        row = int(mismatch[0])
        raise parsed.error_at(row, f"count {parsed.columns[0][row]} does not match the {rated[row].sum()} rated jokes")


def _item_catalogue(source: _Source, fmt: _Format, ratings: _Parsed) -> np.ndarray | None:
    """Sorted raw ids of the items listed in the metadata file, checking that it lists every
    rated item; None (with a warning) when the source has no metadata file."""
    if not source.has(fmt.catalogue_file):
        warnings.warn(
            f"{source.path} has no {fmt.catalogue_file}: the item catalogue is taken from the ratings "
            f"({ratings.table.name}), so n_items depends on the ratings (removing a user can remove items)",
            stacklevel=3,
        )
        return None
    metadata = fmt.catalogue(source)
    catalogue = np.unique(metadata.columns[0])
    items = ratings.columns[1]
    listed = np.zeros(len(items), dtype=bool)
    if len(catalogue):
        listed = catalogue[np.minimum(np.searchsorted(catalogue, items), len(catalogue) - 1)] == items
    if not listed.all():
        row = int(np.flatnonzero(~listed)[0])
        raise ratings.error_at(
            row, f"{ratings.table.columns[1]} {items[row]} is not listed in the item catalogue {metadata.where}"
        )
    return catalogue


def _interactions(parsed: _Parsed, name: str, catalogue: np.ndarray | None) -> tuple[Interactions, int]:
    """Remap ids (items over ``catalogue`` when given), keep the last of duplicate pairs, and
    warn about them."""
    users, items, ratings = parsed.columns[:3]
    interactions, n_dup = from_raw_ids(users, items, ratings.astype(np.float32), name=name, item_universe=catalogue)
    if n_dup:
        warnings.warn(
            f"{parsed.where}: dropped {n_dup} duplicate (user, item) pairs, keeping the last rating of each",
            stacklevel=3,
        )
    return interactions, n_dup
