"""Loaders for the public rating data sets, from a folder or from the official zip.

Supported: MovieLens 100K / 1M / 10M / 20M / 25M / latest(-small), Last.fm HetRec 2011 (implicit
listening counts) and Jester data set 1. Files follow the official distributions; in a zip they
are found by base name, at the top level or under one folder (``ml-100k/u.data``).

Each data set is a preset over the one table reader (:mod:`fedpriv.data.tables`): the layouts
of its files (base name, separator, header, column names and kinds), its declared rating range,
its catalogue file and its feature files. Every :class:`DataError` names the file and, where one
applies, the 1-based line number (the header counts as line 1).

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

import math
import os
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpriv.data.features import ItemFeatures, build_item_features, parse_release_year, parse_title_year
from fedpriv.data.interactions import Interactions, from_raw_ids
from fedpriv.data.ranges import check_rating_range
from fedpriv.data.tables import Layout, Source, Table, read_table
from fedpriv.errors import DataError

#: Names of the standard ML-100K genres, in ``u.genre`` order (used when ``u.genre`` is absent).
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
    "War", "Western",
)  # fmt: skip

JESTER_RANGE = (-10.0, 10.0)
JESTER_NOT_RATED = 99.0


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
        return (
            f"Dataset({inter.name or self.source}: {inter.n_users:,} users, {inter.n_items:,} items, "
            f"{len(inter.ratings):,} {kind}{features})"
        )


# --------------------------------------------------------------------------- file layouts


_IIFI = ("int", "int", "float", "int")
_ML100K_RATINGS = Layout("u.data", "\t", ("user id", "item id", "rating", "timestamp"), _IIFI)
_ML_DAT_RATINGS = Layout("ratings.dat", "::", ("UserID", "MovieID", "Rating", "Timestamp"), _IIFI)
_ML_CSV_RATINGS = Layout("ratings.csv", ",", ("userId", "movieId", "rating", "timestamp"), _IIFI, header=True)
_LASTFM_RATINGS = Layout("user_artists.dat", "\t", ("userID", "artistID", "weight"), ("int", "int", "int"), header=True)

_ML_DAT_MOVIES = Layout("movies.dat", "::", ("MovieID", "Title", "Genres"), ("int", "str", "str"))
_ML_DAT_TAGS = Layout("tags.dat", "::", ("UserID", "MovieID", "Tag", "Timestamp"), ("int", "int", "str", "int"))
_ML_CSV_MOVIES = Layout("movies.csv", ",", ("movieId", "title", "genres"), ("int", "str", "str"), header=True)
_ML_CSV_TAGS = Layout(
    "tags.csv", ",", ("userId", "movieId", "tag", "timestamp"), ("int", "int", "str", "int"), header=True
)
_ML100K_GENRE = Layout("u.genre", "|", ("genre", "index"), ("str", "int"))
_LASTFM_TAGGED = Layout(
    "user_taggedartists.dat", "\t", ("userID", "artistID", "tagID", "day", "month", "year"), ("int",) * 6, header=True
)
_LASTFM_TAGS = Layout("tags.dat", "\t", ("tagID", "tagValue"), ("int", "str"), header=True)
_LASTFM_ARTISTS = Layout(
    "artists.dat", "\t", ("id", "name", "url", "pictureURL"), ("int", "str", "str", "str"), header=True
)

#: Joke ids of Jester: the catalogue is always the 100 jokes.
JESTER_JOKES = np.arange(1, 101, dtype=np.int64)


# --------------------------------------------------------------------------- value checks


def _check_values(parsed: Table, column: int, low: float, high: float) -> None:
    """Every value of a numeric column is finite and within [low, high]."""
    values = parsed.values(column).astype(np.float64)
    with np.errstate(over="ignore"):
        stored = values.astype(np.float32)  # ratings are stored as float32: check what is stored
    bad = ~np.isfinite(values) | ~np.isfinite(stored) | (values < low) | (values > high)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = values[row]
        name = parsed.layout.columns[column]
        if not math.isfinite(value):
            raise parsed.error(row, f"{name} {value} is not a finite number")
        if not math.isfinite(stored[row]):
            raise parsed.error(row, f"{name} {value:g} overflows a float32 rating")
        raise parsed.error(row, f"{name} {value:g} is outside the rating range [{low:g}, {high:g}]")


# --------------------------------------------------------------------------- item features


def _ml100k_items(source: Source) -> Table:
    """``u.item``, with one genre flag column (0 or 1) per genre of ``u.genre`` (the standard 19
    without it)."""
    genre_names = _ml100k_genre_names(source)
    table = Layout(
        "u.item",
        "|",
        ("movie id", "movie title", "release date", "video release date", "IMDb URL", *genre_names),
        ("int", "str", "str", "str", "str", *("int",) * len(genre_names)),
    )
    parsed = read_table(source, table)
    if genre_names:
        flags = np.column_stack(parsed.arrays()[5:])
        bad = ((flags != 0) & (flags != 1)).any(axis=1)
        if bad.any():
            raise parsed.error(int(np.flatnonzero(bad)[0]), "genre flags must be 0 or 1")
    return parsed


def _ml100k_features(source: Source, item_ids: np.ndarray) -> ItemFeatures | None:
    """Genres and release year from ``u.item`` (genre names from ``u.genre`` when present)."""
    if not source.has("u.item"):
        return None
    parsed = _ml100k_items(source)
    genre_names = parsed.layout.columns[5:]
    flags = np.column_stack(parsed.arrays()[5:]) if genre_names else np.zeros((len(parsed), 0), dtype=np.int64)
    ids, titles, dates = parsed.values(0).tolist(), parsed.values(1), parsed.values(2)
    genres = {m: [g for g, f in zip(genre_names, row) if f] for m, row in zip(ids, flags.tolist())}
    years = {m: parse_release_year(d) or parse_title_year(t) for m, t, d in zip(ids, titles, dates)}
    feats = build_item_features(len(item_ids), item_ids, genres, years, genre_vocab=genre_names)
    feats.names = _item_names(item_ids, dict(zip(ids, titles.tolist())))
    return feats


def _item_names(item_ids: np.ndarray, titles: dict) -> list[str]:
    """Display names in dense item order (the raw id where no title is known)."""
    return [str(titles.get(m, m)) for m in np.asarray(item_ids).tolist()]


def _ml100k_genre_names(source: Source) -> tuple[str, ...]:
    """Genre names ordered by their index in ``u.genre``; the standard 19 when it is absent."""
    if not source.has(_ML100K_GENRE.name):
        return ML100K_GENRES
    parsed = read_table(source, _ML100K_GENRE)
    names, index = parsed.arrays()
    order = np.argsort(index, kind="stable")
    wrong = np.flatnonzero(index[order] != np.arange(len(index)))
    if wrong.size:
        raise parsed.error(int(order[wrong[0]]), "genre indices must run 0, 1, 2, ... without gaps")
    return tuple(names[order].tolist())


def _movie_features(source: Source, item_ids: np.ndarray, movies: Layout, tags: Layout) -> ItemFeatures | None:
    """Genres and title year from the movies table, tags from the tags table (both optional)."""
    genres = years = tag_lists = names = None
    if source.has(movies.name):
        ids, titles, genre_text = read_table(source, movies).arrays()
        ids = ids.tolist()
        genres = {m: g.split("|") for m, g in zip(ids, genre_text)}
        years = {m: parse_title_year(t) for m, t in zip(ids, titles)}
        names = _item_names(item_ids, dict(zip(ids, titles.tolist())))
    if source.has(tags.name):
        _, movie_ids, tag_text, _ = read_table(source, tags).arrays()
        tag_lists = _group(movie_ids.tolist(), tag_text.tolist())
    if genres is None and tag_lists is None:
        return None
    feats = build_item_features(len(item_ids), item_ids, genres, years, tag_lists)
    feats.names = names
    return feats


def _lastfm_features(source: Source, item_ids: np.ndarray) -> ItemFeatures | None:
    """Artist tags from ``user_taggedartists.dat`` with their names from ``tags.dat``."""
    if not source.has(_LASTFM_TAGGED.name):
        return None
    tag_ids, tag_values = read_table(source, _LASTFM_TAGS).arrays()
    names = dict(zip(tag_ids.tolist(), tag_values.tolist()))
    tagged = read_table(source, _LASTFM_TAGGED)
    artists, tags = tagged.values(1).tolist(), tagged.values(2).tolist()
    missing = [row for row, t in enumerate(tags) if t not in names]
    if missing:
        raise tagged.error(missing[0], f"tagID {tags[missing[0]]} is not listed in tags.dat")
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

    ratings: Layout
    rating_range: tuple[float, float]
    features: Callable[[Source, np.ndarray], ItemFeatures | None]
    catalogue_file: str
    catalogue: Callable[[Source], Table]
    implicit: bool = False


def _dat_features(source: Source, item_ids: np.ndarray) -> ItemFeatures | None:
    """ML-1M / ML-10M metadata: ``movies.dat`` and ``tags.dat``."""
    return _movie_features(source, item_ids, _ML_DAT_MOVIES, _ML_DAT_TAGS)


def _csv_features(source: Source, item_ids: np.ndarray) -> ItemFeatures | None:
    """ML-20M / 25M / latest metadata: ``movies.csv`` and ``tags.csv``."""
    return _movie_features(source, item_ids, _ML_CSV_MOVIES, _ML_CSV_TAGS)


def _table_reader(table: Layout) -> Callable[[Source], Table]:
    """A catalogue reader parsing ``table``."""
    return lambda source: read_table(source, table)


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
        _LASTFM_RATINGS,
        (0.0, math.inf),
        _lastfm_features,
        "artists.dat",
        _table_reader(_LASTFM_ARTISTS),
        implicit=True,
    ),
}

#: Data set kinds accepted by :func:`load_dataset`.
KNOWN_KINDS = tuple(_FORMATS)


def load_dataset(kind: str, path: str | os.PathLike, *, rating_range: tuple[float, float] | None = None) -> Dataset:
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
    low, high = check_rating_range(
        fmt.rating_range if rating_range is None else rating_range,
        open_above=fmt.implicit,
        unbounded=rating_range is not None,
    )
    with Source(Path(os.fspath(path))) as source:
        parsed = read_table(source, fmt.ratings)
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
    with Source(Path(os.fspath(path))) as source:
        names = source.matching("jester-data-*.csv")
        if len(names) != 1:
            found = f"found {', '.join(names)}" if names else "found none"
            raise DataError(f"expected exactly one jester-data-*.csv file, {found}", path=str(path))
        columns = ("count", *(f"joke {j}" for j in range(1, 101)))
        parsed = read_table(source, Layout(names[0], ",", columns, ("int",) + ("float",) * 100))
    if not len(parsed):
        raise DataError("no ratings (the file has no data rows)", path=parsed.where)
    scores = np.column_stack(parsed.arrays()[1:])
    _check_jester(parsed, scores)
    users, jokes = np.nonzero(scores != JESTER_NOT_RATED)
    interactions, n_dup = from_raw_ids(
        users + 1, jokes + 1, scores[users, jokes], name="jester", item_universe=JESTER_JOKES
    )
    return Dataset(interactions, None, JESTER_RANGE, False, str(path), n_dup)


def _check_jester(parsed: Table, scores: np.ndarray) -> None:
    """Ratings are 99 or within [-10, 10]; the count column matches the rated jokes."""
    rated = scores != JESTER_NOT_RATED
    low, high = JESTER_RANGE
    bad = (rated & ~((scores >= low) & (scores <= high))).any(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise parsed.error(row, f"ratings must lie in [{low:g}, {high:g}] or be {JESTER_NOT_RATED:g} (not rated)")
    mismatch = np.flatnonzero(parsed.values(0) != rated.sum(axis=1))
    if mismatch.size:
        row = int(mismatch[0])
        raise parsed.error(row, f"count {parsed.values(0)[row]} does not match the {rated[row].sum()} rated jokes")


def _item_catalogue(source: Source, fmt: _Format, ratings: Table) -> np.ndarray | None:
    """Sorted raw ids of the items listed in the metadata file, checking that it lists every
    rated item; None (with a warning) when the source has no metadata file."""
    if not source.has(fmt.catalogue_file):
        warnings.warn(
            f"{source.path} has no {fmt.catalogue_file}: the item catalogue is taken from the ratings "
            f"({ratings.layout.name}), so n_items depends on the ratings (removing a user can remove items)",
            stacklevel=3,
        )
        return None
    metadata = fmt.catalogue(source)
    catalogue = np.unique(metadata.values(0))
    items = ratings.values(1)
    listed = np.zeros(len(items), dtype=bool)
    if len(catalogue):
        listed = catalogue[np.minimum(np.searchsorted(catalogue, items), len(catalogue) - 1)] == items
    if not listed.all():
        row = int(np.flatnonzero(~listed)[0])
        raise ratings.error(
            row, f"{ratings.layout.columns[1]} {items[row]} is not listed in the item catalogue {metadata.where}"
        )
    return catalogue


def _interactions(parsed: Table, name: str, catalogue: np.ndarray | None) -> tuple[Interactions, int]:
    """Remap ids (items over ``catalogue`` when given), keep the last of duplicate pairs, and
    warn about them."""
    users, items, ratings = parsed.arrays()[:3]
    interactions, n_dup = from_raw_ids(users, items, ratings.astype(np.float32), name=name, item_universe=catalogue)
    if n_dup:
        warnings.warn(
            f"{parsed.where}: dropped {n_dup} duplicate (user, item) pairs, keeping the last rating of each",
            stacklevel=3,
        )
    return interactions, n_dup
