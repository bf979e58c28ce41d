"""Neighbouring data sets for tests (a helper module, not a test file).

The privacy unit is one user: a neighbouring data set D' is D without all the lines of one user.
Both are written in the official file layout of a data set kind and loaded through the real
loaders (:func:`fedpriv.data.loaders.load_dataset` / :func:`~fedpriv.data.loaders.load_jester`),
so users are renumbered densely exactly as in production.

* :func:`synthetic_ratings` — a small rating set with non-contiguous raw user ids.
* :func:`write_ml100k` / :func:`neighbouring_ml100k` — ML-100K (``u.data`` and ``u.item``).
* :func:`write_dataset` / :func:`neighbouring` — the same for every kind in :data:`KINDS`.

Jester has no user ids: a user is its data row (raw id = 1-based row number), so in D' the users
after the removed one get smaller raw ids. Its catalogue is always jokes 1..100.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedpriv.data import export
from fedpriv.data.loaders import Dataset, load_dataset, load_jester

#: Data set kinds :func:`write_dataset` can write.
KINDS = ("ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "ml-latest", "lastfm", "jester")

#: MovieLens 1M+ genre names (``movies.dat`` / ``movies.csv``).
ML_GENRES = (
    "Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary", "Drama", "Fantasy",
    "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip

_FIRST_TIMESTAMP = 881_250_949
_MIN_PER_USER = 5


def synthetic_ratings(
    n_users: int, n_items: int, n_ratings: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n_ratings`` distinct (user, item) pairs with integer ratings 1..5, every user with at
    least 5 ratings.

    Raw user ids are ``1000 + 7 * k`` (not contiguous, so dense and raw ids differ); raw item ids
    are ``1..n_items`` (the catalogue ``np.arange(1, n_items + 1)``; popular items follow a
    power law, some items may stay unrated). Rows are grouped by user, in raw id order.
    Returns int64 ``(raw_users, raw_items, ratings)``.
    """
    if n_items < _MIN_PER_USER:
        raise ValueError(f"need n_items >= {_MIN_PER_USER}, got {n_items}")
    if not _MIN_PER_USER * n_users <= n_ratings <= n_users * n_items:
        raise ValueError(f"need {_MIN_PER_USER} * n_users <= n_ratings <= n_users * n_items, got {n_ratings}")
    rng = np.random.default_rng(seed)
    popularity = rng.permutation(np.arange(1, n_items + 1, dtype=np.float64) ** -0.8)
    taken = np.zeros((n_users, n_items), dtype=bool)
    for u in range(n_users):
        taken[u, rng.choice(n_items, size=_MIN_PER_USER, replace=False, p=popularity / popularity.sum())] = True
    free = np.flatnonzero(~taken.ravel())
    weights = popularity[free % n_items]
    extra = rng.choice(free, size=n_ratings - _MIN_PER_USER * n_users, replace=False, p=weights / weights.sum())
    taken.ravel()[extra] = True
    users, items = np.nonzero(taken)
    raw_users = 1000 + 7 * users.astype(np.int64)
    raw_items = items.astype(np.int64) + 1
    ratings = rng.integers(1, 6, size=len(users)).astype(np.int64)
    return raw_users, raw_items, ratings


# --------------------------------------------------------------------------- writers


def _rating_text(r: float) -> str:
    return f"{float(r):g}"


def _year(item: int) -> int:
    return 1980 + item % 20


def _lines(rows: list[str]) -> bytes:
    return "".join(row + "\n" for row in rows).encode("utf-8")


def _folder(folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _triples(raw_users, raw_items, ratings) -> list[tuple[int, int, float, int]]:
    """(user, item, rating, timestamp) rows, in the given order."""
    raw_users, raw_items, ratings = (np.asarray(a) for a in (raw_users, raw_items, ratings))
    if not len(raw_users) == len(raw_items) == len(ratings):
        raise ValueError("raw_users, raw_items and ratings must have the same length")
    return [
        (int(u), int(i), float(r), _FIRST_TIMESTAMP + k)
        for k, (u, i, r) in enumerate(zip(raw_users.tolist(), raw_items.tolist(), ratings.tolist()))
    ]


def write_ml100k(folder: str | Path, raw_users, raw_items, ratings, catalogue_ids) -> Path:
    """``u.data`` and ``u.item`` in ``folder`` (:func:`fedpriv.data.export.write_ml100k`), loadable
    with ``load_dataset("ml-100k", folder)``. Returns the folder."""
    return export.write_ml100k(folder, raw_users, raw_items, ratings, catalogue_ids)


def _genres(item: int) -> str:
    """One or two deterministic genres."""
    first = ML_GENRES[item % len(ML_GENRES)]
    return first if item % 2 else f"{first}|{ML_GENRES[(item // 2) % len(ML_GENRES)]}"


def _write_movielens_dat(folder: Path, rows, catalogue_ids) -> None:
    (folder / "ratings.dat").write_bytes(_lines([f"{u}::{i}::{_rating_text(r)}::{t}" for u, i, r, t in rows]))
    movies = [f"{m}::Movie {m} ({_year(m)})::{_genres(m)}" for m in np.asarray(catalogue_ids).tolist()]
    (folder / "movies.dat").write_bytes(_lines(movies))


def _write_movielens_csv(folder: Path, rows, catalogue_ids) -> None:
    ratings = ["userId,movieId,rating,timestamp"] + [f"{u},{i},{_rating_text(r)},{t}" for u, i, r, t in rows]
    (folder / "ratings.csv").write_bytes(_lines(ratings))
    movies = ["movieId,title,genres"] + [
        f'{m},"Movie {m}, The ({_year(m)})",{_genres(m)}' for m in np.asarray(catalogue_ids).tolist()
    ]
    (folder / "movies.csv").write_bytes(_lines(movies))


def _write_lastfm(folder: Path, rows, catalogue_ids) -> None:
    if any(r != int(r) or r < 0 for _, _, r, _ in rows):
        raise ValueError("Last.fm weights are non-negative integers")
    listens = ["userID\tartistID\tweight"] + [f"{u}\t{i}\t{int(r)}" for u, i, r, _ in rows]
    (folder / "user_artists.dat").write_bytes(_lines(listens))
    artists = ["id\tname\turl\tpictureURL"] + [
        f"{a}\tArtist {a}\thttp://www.last.fm/music/Artist+{a}\thttp://example.org/{a}.jpg"
        for a in np.asarray(catalogue_ids).tolist()
    ]
    (folder / "artists.dat").write_bytes(_lines(artists))


def _write_jester(folder: Path, rows) -> None:
    """One line per user in raw user order (``catalogue_ids`` does not apply: always 100 jokes)."""
    by_user: dict[int, dict[int, float]] = {}
    for u, i, r, _ in rows:
        if not 1 <= i <= 100:
            raise ValueError(f"Jester jokes are 1..100, got {i}")
        by_user.setdefault(u, {})[i] = r
    lines = []
    for u in sorted(by_user):
        scores = [by_user[u].get(j, 99.0) for j in range(1, 101)]
        rated = sum(s != 99.0 for s in scores)
        lines.append(",".join([str(rated)] + [_rating_text(s) for s in scores]))
    (folder / "jester-data-1.csv").write_bytes(_lines(lines))


def write_dataset(kind: str, folder: str | Path, raw_users, raw_items, ratings, catalogue_ids) -> Path:
    """Write the ratings and the item catalogue of ``kind`` (see :data:`KINDS`) in its official
    layout in ``folder``; Jester ignores ``catalogue_ids`` (always jokes 1..100). Returns the
    folder."""
    if kind == "ml-100k":
        return write_ml100k(folder, raw_users, raw_items, ratings, catalogue_ids)
    folder = _folder(folder)
    rows = _triples(raw_users, raw_items, ratings)
    if kind in ("ml-1m", "ml-10m"):
        _write_movielens_dat(folder, rows, catalogue_ids)
    elif kind in ("ml-20m", "ml-25m", "ml-latest"):
        _write_movielens_csv(folder, rows, catalogue_ids)
    elif kind == "lastfm":
        _write_lastfm(folder, rows, catalogue_ids)
    elif kind == "jester":
        _write_jester(folder, rows)
    else:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    return folder


def load(kind: str, folder: str | Path) -> Dataset:
    """Load a folder written by :func:`write_dataset` through the real loader."""
    return load_jester(folder) if kind == "jester" else load_dataset(kind, folder)


# --------------------------------------------------------------------------- neighbours


def neighbouring(
    kind: str, tmp_path: str | Path, raw_users, raw_items, ratings, catalogue_ids, remove_user: int
) -> tuple[Dataset, Dataset]:
    """``(D, D')``: the data set written to ``tmp_path/D`` and the same without the lines of raw
    user ``remove_user`` written to ``tmp_path/D_prime``, both loaded through the real loader."""
    raw_users, raw_items, ratings = (np.asarray(a) for a in (raw_users, raw_items, ratings))
    keep = raw_users != remove_user
    if keep.all():
        raise ValueError(f"user {remove_user} has no rating to remove")
    tmp_path = Path(tmp_path)
    d = write_dataset(kind, tmp_path / "D", raw_users, raw_items, ratings, catalogue_ids)
    d_prime = write_dataset(kind, tmp_path / "D_prime", raw_users[keep], raw_items[keep], ratings[keep], catalogue_ids)
    return load(kind, d), load(kind, d_prime)


def neighbouring_ml100k(
    tmp_path: str | Path, raw_users, raw_items, ratings, catalogue_ids, remove_user: int
) -> tuple[Dataset, Dataset]:
    """``(D, D')`` in the ML-100K layout (see :func:`neighbouring`)."""
    return neighbouring("ml-100k", tmp_path, raw_users, raw_items, ratings, catalogue_ids, remove_user)
