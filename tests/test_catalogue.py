"""The item catalogue comes from public metadata, so neighbouring data sets share it.

D' is D without all the lines of one user, written again in the official layout and loaded
through the real loaders. Removing the single rater of an item must not change ``n_items`` nor
the dense item ids (``item_ids``), and item features stay aligned with them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from neighbour_data import (
    KINDS,
    load,
    neighbouring,
    neighbouring_ml100k,
    synthetic_ratings,
    write_dataset,
    write_ml100k,
)
from test_loaders import shared

from fedpriv.data.loaders import Dataset, load_dataset
from fedpriv.errors import DataError

# A tiny data set: item 13 has a single rater (user 1014), item 21 has none.
USERS = np.array([1000, 1000, 1000, 1007, 1007, 1014, 1014, 1021])
ITEMS = np.array([3, 5, 8, 3, 5, 3, 13, 8])
RATINGS = np.array([5, 3, 4, 2, 1, 4, 5, 3])
CATALOGUE = np.array([3, 5, 8, 13, 21])
SINGLE_RATER, ITS_ITEM, UNRATED = 1014, 13, 21


def triples(ds: Dataset) -> dict[tuple[int, int], float]:
    """{(raw user, raw item): rating}."""
    inter = ds.interactions
    return {
        (int(inter.user_ids[u]), int(inter.item_ids[i])): float(r)
        for u, i, r in zip(inter.users, inter.items, inter.ratings)
    }


def assert_same_catalogue(d: Dataset, d_prime: Dataset) -> None:
    """Same items, dense ids and item features; one user fewer."""
    a, b = d.interactions, d_prime.interactions
    assert a.n_items == b.n_items and np.array_equal(a.item_ids, b.item_ids)
    assert a.meta["catalogue"] == b.meta["catalogue"] == "metadata"
    assert b.n_users == a.n_users - 1
    if d.item_features is not None:
        assert d.item_features.matrix.shape[0] == a.n_items
        assert (d.item_features.matrix != d_prime.item_features.matrix).nnz == 0
        assert d.item_features.columns == d_prime.item_features.columns


@pytest.mark.parametrize("kind", KINDS)
def test_removing_the_single_rater_keeps_the_catalogue(tmp_path: Path, kind: str) -> None:
    d, d_prime = neighbouring(kind, tmp_path, USERS, ITEMS, RATINGS, CATALOGUE, SINGLE_RATER)
    assert_same_catalogue(d, d_prime)
    a, b = d.interactions, d_prime.interactions
    expected = np.arange(1, 101) if kind == "jester" else CATALOGUE
    assert a.item_ids.tolist() == expected.tolist()
    counts_a = dict(zip(a.item_ids.tolist(), a.item_counts().tolist()))
    counts_b = dict(zip(b.item_ids.tolist(), b.item_counts().tolist()))
    assert counts_a[ITS_ITEM] == 1 and counts_b[ITS_ITEM] == 0  # still an item once unrated
    assert counts_a[UNRATED] == counts_b[UNRATED] == 0
    if kind != "jester":  # Jester users are data rows: later rows get new raw ids in D'
        assert SINGLE_RATER in a.user_ids and SINGLE_RATER not in b.user_ids
        assert triples(d_prime) == {k: v for k, v in triples(d).items() if k[0] != SINGLE_RATER}


def test_neighbouring_ml100k_on_synthetic_ratings(tmp_path: Path) -> None:
    raw_users, raw_items, ratings = synthetic_ratings(40, 60, 500, seed=3)
    assert np.all(np.bincount(np.unique(raw_users, return_inverse=True)[1]) >= 5)
    assert set(np.diff(np.unique(raw_users)).tolist()) == {7}  # raw ids 1000, 1007, ...
    assert set(np.unique(ratings).tolist()) <= {1, 2, 3, 4, 5}
    catalogue = np.arange(1, 71)  # items 61..70 have no rating at all
    counts = np.bincount(raw_items, minlength=71)
    sole = np.flatnonzero(counts == 1)
    remove = int(raw_users[np.isin(raw_items, sole)][0]) if sole.size else int(raw_users[0])
    d, d_prime = neighbouring_ml100k(tmp_path, raw_users, raw_items, ratings, catalogue, remove)
    assert_same_catalogue(d, d_prime)
    assert d.interactions.item_ids.tolist() == catalogue.tolist()
    assert d_prime.interactions.user_ids.tolist() == [u for u in d.interactions.user_ids.tolist() if u != remove]
    assert triples(d_prime) == {k: v for k, v in triples(d).items() if k[0] != remove}


def test_write_ml100k_layout(tmp_path: Path) -> None:
    folder = write_ml100k(tmp_path / "ml", USERS, ITEMS, RATINGS, CATALOGUE)
    assert (folder / "u.data").read_text().splitlines()[0] == "1000\t3\t5\t881250949"
    line = (folder / "u.item").read_text().splitlines()[0].split("|")
    assert line[0] == "3" and line[2] == "01-Jan-1983" and len(line) == 5 + 19
    ds = load_dataset("ml-100k", folder)
    genres = ds.item_features.matrix[:, ds.item_features.fields["genre"]]
    assert genres.shape == (5, 19) and genres.sum(axis=1).tolist() == [[1.0]] * 5  # one genre each
    assert ds.item_features.names == [f"Movie {m} ({1980 + m % 20})" for m in CATALOGUE.tolist()]


# --------------------------------------------------------------------------- policy


def first_line_of(folder: Path, name: str, item: int, sep: str, header: bool) -> int:
    """1-based line number of the first rating of ``item`` in a ratings file."""
    lines = (folder / name).read_text().splitlines()
    for number, line in enumerate(lines[1:] if header else lines, start=2 if header else 1):
        if int(line.split(sep)[1]) == item:
            return number
    raise AssertionError(f"no rating of {item}")


RATINGS_FILES = {
    # kind: (ratings file, separator, header, metadata file)
    "ml-100k": ("u.data", "\t", False, "u.item"),
    "ml-1m": ("ratings.dat", "::", False, "movies.dat"),
    "ml-10m": ("ratings.dat", "::", False, "movies.dat"),
    "ml-20m": ("ratings.csv", ",", True, "movies.csv"),
    "ml-latest": ("ratings.csv", ",", True, "movies.csv"),
    "lastfm": ("user_artists.dat", "\t", True, "artists.dat"),
}


@pytest.mark.parametrize("kind", sorted(RATINGS_FILES))
def test_rated_item_missing_from_metadata_names_file_and_line(tmp_path: Path, kind: str) -> None:
    name, sep, header, metadata = RATINGS_FILES[kind]
    catalogue = CATALOGUE[CATALOGUE != 8]  # item 8 is rated (lines 3 and 8) but not listed
    folder = write_dataset(kind, tmp_path / "data", USERS, ITEMS, RATINGS, catalogue)
    line = first_line_of(folder, name, 8, sep, header)
    assert line == (4 if header else 3)
    with pytest.raises(DataError) as info:
        load_dataset(kind, folder)
    assert info.value.line == line and info.value.path == str(folder / name)
    message = str(info.value)
    assert f"{name}:{line}: " in message and " 8 is not listed in the item catalogue" in message
    assert metadata in message


@pytest.mark.parametrize("kind", sorted(RATINGS_FILES))
def test_without_metadata_the_catalogue_falls_back_to_the_ratings(tmp_path: Path, kind: str) -> None:
    _, _, _, metadata = RATINGS_FILES[kind]
    folder = write_dataset(kind, tmp_path / "data", USERS, ITEMS, RATINGS, CATALOGUE)
    (folder / metadata).unlink()
    with pytest.warns(UserWarning, match=f"has no {metadata}: the item catalogue is taken from the ratings"):
        ds = load_dataset(kind, folder)
    inter = ds.interactions
    assert inter.meta["catalogue"] == "ratings" and inter.item_ids.tolist() == [3, 5, 8, 13]
    assert ds.item_features is None


# --------------------------------------------------------------------------- real data


def copy_without_user(
    source: Path, folder: Path, names: tuple[str, ...], ratings: str, sep: str, header: bool, user: int
) -> Path:
    """Copy the files ``names`` of a data folder or zip into ``folder``, dropping the lines of raw
    ``user`` from the ratings file."""
    folder.mkdir()
    for name in names:
        if source.is_dir():
            data = (source / name).read_bytes()
        else:
            with zipfile.ZipFile(source) as archive:
                (member,) = [m for m in archive.namelist() if m.rsplit("/", 1)[-1] == name]
                data = archive.read(member)
        if name == ratings:
            lines = data.splitlines(keepends=True)
            head, body = (lines[:1], lines[1:]) if header else ([], lines)
            data = b"".join(head + [line for line in body if int(line.split(sep.encode())[0]) != user])
        (folder / name).write_bytes(data)
    return folder


def most_sole_rated_user(ds: Dataset) -> int:
    """Raw id of the user who is the single rater of the most items."""
    inter = ds.interactions
    sole = inter.item_counts()[inter.items] == 1
    return int(inter.user_ids[np.bincount(inter.users[sole], minlength=inter.n_users).argmax()])


REAL = [
    # (kind, path under shared/data, files to copy, ratings file, separator, header, user or None)
    ("ml-100k", ("ml-100k", "ml-100k.zip"), ("u.data", "u.item", "u.genre"), "u.data", "\t", False, 181),
    ("ml-latest", ("ml-latest-small", "ml-latest-small.zip"), ("ratings.csv", "movies.csv", "tags.csv"),
     "ratings.csv", ",", True, None),
    ("lastfm", ("hetrec2011-lastfm-2k",), ("user_artists.dat", "artists.dat", "tags.dat"),
     "user_artists.dat", "\t", True, None),
]


@pytest.mark.parametrize(("kind", "where", "names", "ratings", "sep", "header", "user"), REAL, ids=[r[0] for r in REAL])
def test_real_neighbour_keeps_the_catalogue(
    tmp_path: Path, kind: str, where: tuple[str, ...], names, ratings: str, sep: str, header: bool, user
) -> None:
    source = shared(*where)
    d = load_dataset(kind, source)
    user = most_sole_rated_user(d) if user is None else user
    d_prime = load_dataset(kind, copy_without_user(source, tmp_path / "D_prime", names, ratings, sep, header, user))
    a, b = d.interactions, d_prime.interactions
    # the removed user was the only rater of some items: with a ratings-based catalogue they would go
    assert np.count_nonzero(b.item_counts()) < np.count_nonzero(a.item_counts())
    assert a.n_items == b.n_items and np.array_equal(a.item_ids, b.item_ids)
    assert b.n_users == a.n_users - 1 and len(b) == len(a) - int((a.user_ids[a.users] == user).sum())
    if kind == "ml-100k":
        assert user == 181 and a.n_items == b.n_items == 1_682
        assert (d.item_features.matrix != d_prime.item_features.matrix).nnz == 0


def test_real_ml100k_from_zip_and_folder_agree(tmp_path: Path) -> None:
    """The folder copy used above loads like the official zip."""
    source = shared("ml-100k", "ml-100k.zip")
    folder = copy_without_user(source, tmp_path / "D", ("u.data", "u.item", "u.genre"), "u.data", "\t", False, -1)
    a, b = load("ml-100k", source).interactions, load("ml-100k", folder).interactions
    assert np.array_equal(a.item_ids, b.item_ids) and np.array_equal(a.user_ids, b.user_ids) and len(a) == len(b)
