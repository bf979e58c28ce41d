"""Tests for fedpriv.data.loaders: every format from a folder and from a zip, bad input, real data.

Fixtures are tiny files written in tmp_path in the official layouts. Real-data tests read
``../shared/data`` (relative to the repository root) and skip when it is absent.
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedpriv.data import tables
from fedpriv.data.loaders import ML100K_GENRES, Dataset, load_dataset, load_jester
from fedpriv.errors import ConfigError, DataError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
NO_CATALOGUE = "item catalogue is taken from the ratings"

# Several fixtures hold only a ratings file: the loader then warns that the item catalogue comes
# from the ratings (tested in test_ratings_only_gives_no_features and tests/test_catalogue.py).
pytestmark = pytest.mark.filterwarnings(f"ignore:.*{NO_CATALOGUE}:UserWarning")


# --------------------------------------------------------------------------- helpers


def make_source(tmp_path: Path, prefix: str, files: dict[str, bytes], layout: str) -> Path:
    """Write ``files`` as ``tmp_path/prefix/`` (layout "folder") or ``tmp_path/prefix.zip`` with
    every member under ``prefix/`` like the official archives (layout "zip")."""
    if layout == "zip":
        path = tmp_path / f"{prefix}.zip"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{prefix}/", b"")
            for name, data in files.items():
                archive.writestr(f"{prefix}/{name}", data)
        return path
    folder = tmp_path / prefix
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def text(lines: list[str], eol: str = "\n", encoding: str = "utf-8") -> bytes:
    """Join lines with ``eol`` (trailing one included) and encode."""
    return "".join(line + eol for line in lines).encode(encoding)


def triples(ds: Dataset) -> dict[tuple[int, int], float]:
    """{(raw user, raw item): rating} of a data set."""
    inter = ds.interactions
    return {
        (int(inter.user_ids[u]), int(inter.item_ids[i])): float(r)
        for u, i, r in zip(inter.users, inter.items, inter.ratings)
    }


def active(ds: Dataset, field: str, raw_item: int) -> list[str]:
    """Names of the active columns of ``field`` for an item given by its raw id."""
    f = ds.item_features
    row = int(np.flatnonzero(ds.interactions.item_ids == raw_item)[0])
    cols = f.item_field_ids(field)[row] + f.fields[field].start
    return [f.columns[c] for c in cols]


def flags(*on: int) -> str:
    """ML-100K genre flags with the given genre indices set."""
    return "|".join("1" if g in on else "0" for g in range(19))


LAYOUTS = ["folder", "zip"]
EOLS = ["\n", "\r\n"]


# --------------------------------------------------------------------------- fixtures per format


def ml100k_files(eol: str = "\n") -> dict[str, bytes]:
    """3 rated movies (242, 302, 377) plus one unrated (999); latin-1 u.item."""
    return {
        "u.data": text(
            [
                "196\t242\t3\t881250949",
                "186\t302\t3\t891717742",
                "196\t302\t4\t881250940",
                "22\t377\t1\t878887116",
                "196\t302\t5\t881250950",
            ],
            eol,
        ),
        "u.item": text(
            [
                f"242|Kolya (1996)|24-Jan-1997||http://us.imdb.com/M/title-exact?Kolya%20(1996)|{flags(5)}",
                f"302|L.A. Confidential (1997)|01-Jan-1997||http://x|{flags(6, 13, 16)}",
                f"377|Café Noir (1994)|||http://x|{flags(0)}",
                f"999|Unrated (1980)|01-Jan-1980||http://x|{flags(8)}",
            ],
            eol,
            "latin-1",
        ),
        "u.genre": text([f"{g}|{i}" for i, g in enumerate(ML100K_GENRES)] + [""], eol),
    }


def ml1m_files(eol: str = "\n", encoding: str = "latin-1") -> dict[str, bytes]:
    """ML-1M layout (``::`` separated, latin-1 movies.dat)."""
    return {
        "ratings.dat": text(["1::10::5::978300760", "1::20::3::978302109", "2::10::4::978301968"], eol),
        "movies.dat": text(
            [
                "10::GoldenEye (1995)::Action|Adventure|Thriller",
                "20::Café (1996)::Comedy",
                "30::Unrated (2000)::Drama",
            ],
            eol,
            encoding,
        ),
    }


def ml10m_files(eol: str = "\n") -> dict[str, bytes]:
    """ML-10M layout: half-star ratings, utf-8 movies.dat and tags.dat."""
    files = ml1m_files(eol, "utf-8")
    files["ratings.dat"] = text(["1::10::4.5::978300760", "1::20::0.5::978302109", "2::10::3::978301968"], eol)
    files["tags.dat"] = text(
        [f"{u}::10::Bond::97830{u}" for u in range(1, 6)] + ["1::20::rare tag::978300760"], eol
    )
    return files


def mlcsv_files(eol: str = "\r\n") -> dict[str, bytes]:
    """ML-20M/25M/latest layout: CSV with headers, quoted titles, tags.csv (CRLF like the zip)."""
    return {
        "ratings.csv": text(
            ["userId,movieId,rating,timestamp", "1,1,4.0,964982703", "1,3,0.5,964981247", "6,1,5.0,964982224"], eol
        ),
        "movies.csv": text(
            [
                "movieId,title,genres",
                "1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy",
                '3,"American President, The (1995)",Comedy|Drama|Romance',
                "5,Hyena Road,(no genres listed)",
            ],
            eol,
        ),
        "tags.csv": text(
            ["userId,movieId,tag,timestamp"] + [f"{u},3,Funny,144571499{u}" for u in range(5)] + ['2,1,"a, b",1'],
            eol,
        ),
    }


def lastfm_files(eol: str = "\r\n") -> dict[str, bytes]:
    """HetRec 2011 Last.fm layout (tab separated, headers, CRLF, latin-1 tags.dat); artist 53
    has no listener."""
    return {
        "user_artists.dat": text(["userID\tartistID\tweight", "2\t51\t13883", "2\t52\t11690", "3\t51\t7"], eol),
        "artists.dat": text(
            ["id\tname\turl\tpictureURL"]
            + [f"{a}\tArtist {a}\thttp://www.last.fm/music/{a}\thttp://x/{a}.jpg" for a in (51, 52, 53)],
            eol,
        ),
        "user_taggedartists.dat": text(
            ["userID\tartistID\ttagID\tday\tmonth\tyear"] + [f"{u}\t51\t1\t1\t4\t2009" for u in range(2, 7)]
            + ["2\t52\t2\t1\t4\t2009"],
            eol,
        ),
        "tags.dat": text(["tagID\ttagValue", "1\tMetal", "2\tmúsica"], eol, "latin-1"),
    }


# --------------------------------------------------------------------------- every format loads


@pytest.mark.parametrize("eol", EOLS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ml100k(tmp_path: Path, layout: str, eol: str) -> None:
    with pytest.warns(UserWarning, match="u.data: dropped 1 duplicate"):
        ds = load_dataset("ml-100k", make_source(tmp_path, "ml-100k", ml100k_files(eol), layout))
    inter = ds.interactions
    assert (len(inter), inter.n_users, inter.n_items) == (4, 3, 4)  # 999 is in u.item, unrated
    assert inter.user_ids.tolist() == [22, 186, 196] and inter.item_ids.tolist() == [242, 302, 377, 999]
    assert inter.meta["catalogue"] == "metadata" and inter.item_counts().tolist() == [1, 2, 1, 0]
    assert inter.users.tolist() == [2, 1, 0, 2] and inter.items.tolist() == [0, 1, 2, 1]  # dense ids
    assert triples(ds) == {(196, 242): 3.0, (186, 302): 3.0, (22, 377): 1.0, (196, 302): 5.0}  # keeps the last
    assert ds.duplicates_dropped == 1 and ds.rating_range == (1.0, 5.0) and not ds.implicit
    f = ds.item_features
    assert f.matrix.shape[0] == 4 and f.fields["genre"] == slice(0, 19)
    assert f.columns[:19] == [f"genre={g}" for g in ML100K_GENRES]
    assert active(ds, "genre", 302) == ["genre=Crime", "genre=Mystery", "genre=Thriller"]
    assert active(ds, "genre", 377) == ["genre=unknown"]
    assert active(ds, "year", 242) == ["year=1995-1999"]  # release date 24-Jan-1997
    assert active(ds, "year", 377) == ["year=1990-1994"]  # no release date: title year
    assert active(ds, "genre", 999) == ["genre=Drama"] and active(ds, "year", 999) == ["year=1980-1984"]
    assert f.columns[f.fields["year"]] == [
        "year=1980-1984", "year=1985-1989", "year=1990-1994", "year=1995-1999", "year=unknown"
    ]  # fmt: skip


@pytest.mark.filterwarnings("ignore:.*duplicate")
def test_ml100k_without_u_genre_uses_standard_names(tmp_path: Path) -> None:
    files = ml100k_files()
    del files["u.genre"]
    ds = load_dataset("ml-100k", make_source(tmp_path, "ml-100k", files, "folder"))
    assert ds.item_features.columns[:19] == [f"genre={g}" for g in ML100K_GENRES]


@pytest.mark.parametrize("eol", EOLS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ml1m(tmp_path: Path, layout: str, eol: str) -> None:
    ds = load_dataset("ml-1m", make_source(tmp_path, "ml-1m", ml1m_files(eol), layout))
    assert triples(ds) == {(1, 10): 5.0, (1, 20): 3.0, (2, 10): 4.0}
    assert ds.interactions.item_ids.tolist() == [10, 20, 30]  # movie 30 has no rating: still an item
    assert ds.interactions.n_items == 3 and ds.interactions.meta["catalogue"] == "metadata"
    f = ds.item_features
    assert f.columns == [
        "genre=Action", "genre=Adventure", "genre=Comedy", "genre=Drama", "genre=Thriller",
        "year=1995-1999", "year=2000-2004", "year=unknown",
    ]  # fmt: skip
    assert active(ds, "genre", 20) == ["genre=Comedy"] and "tag" not in f.fields
    assert active(ds, "genre", 30) == ["genre=Drama"] and f.matrix.shape[0] == 3
    assert ds.duplicates_dropped == 0


@pytest.mark.parametrize("eol", EOLS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ml10m(tmp_path: Path, layout: str, eol: str) -> None:
    ds = load_dataset("ml-10m", make_source(tmp_path, "ml-10M100K", ml10m_files(eol), layout))
    assert triples(ds) == {(1, 10): 4.5, (1, 20): 0.5, (2, 10): 3.0}
    assert ds.rating_range == (0.5, 5.0)
    assert active(ds, "tag", 10) == ["tag=bond"] and active(ds, "tag", 20) == []  # "rare tag": 1 use < 5
    assert active(ds, "year", 20) == ["year=1995-1999"]


@pytest.mark.parametrize("kind", ["ml-20m", "ml-25m", "ml-latest"])
@pytest.mark.parametrize("eol", EOLS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ml_csv(tmp_path: Path, layout: str, eol: str, kind: str) -> None:
    ds = load_dataset(kind, make_source(tmp_path, "ml-latest-small", mlcsv_files(eol), layout))
    assert triples(ds) == {(1, 1): 4.0, (1, 3): 0.5, (6, 1): 5.0}
    assert ds.interactions.user_ids.tolist() == [1, 6]
    assert ds.interactions.item_ids.tolist() == [1, 3, 5]  # 5 (Hyena Road) is unrated
    f = ds.item_features
    assert active(ds, "genre", 3) == ["genre=Comedy", "genre=Drama", "genre=Romance"]  # quoted title
    assert active(ds, "year", 3) == ["year=1995-1999"]
    assert active(ds, "tag", 3) == ["tag=funny"] and f.columns[f.fields["tag"]] == ["tag=funny"]


@pytest.mark.parametrize("eol", EOLS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_lastfm(tmp_path: Path, layout: str, eol: str) -> None:
    ds = load_dataset("lastfm", make_source(tmp_path, "hetrec2011-lastfm-2k", lastfm_files(eol), layout))
    assert triples(ds) == {(2, 51): 13883.0, (2, 52): 11690.0, (3, 51): 7.0}
    assert ds.interactions.item_ids.tolist() == [51, 52, 53]  # every artist of artists.dat
    assert ds.item_features.matrix.shape[0] == 3
    assert ds.implicit and ds.rating_range == (0.0, math.inf)
    assert list(ds.item_features.fields) == ["tag"]
    assert active(ds, "tag", 51) == ["tag=metal"] and active(ds, "tag", 52) == []


def test_ratings_only_gives_no_features(tmp_path: Path) -> None:
    files = {"ratings.csv": mlcsv_files()["ratings.csv"]}
    with pytest.warns(UserWarning, match=f"has no movies.csv: the {NO_CATALOGUE}"):
        ds = load_dataset("ml-latest", make_source(tmp_path, "ml", files, "zip"))
    assert ds.item_features is None and len(ds.interactions) == 3
    assert ds.interactions.item_ids.tolist() == [1, 3] and ds.interactions.meta["catalogue"] == "ratings"
    assert ds.source == str(tmp_path / "ml.zip")


def test_duplicates_keep_last_and_are_reported(tmp_path: Path) -> None:
    files = {"ratings.dat": text(["1::10::5::1", "2::10::1::1", "1::10::2::2", "1::10::4::3", "2::20::3::1"])}
    path = make_source(tmp_path, "ml-1m", files, "folder")
    with pytest.warns(UserWarning, match="dropped 2 duplicate"):
        ds = load_dataset("ml-1m", path)
    assert ds.duplicates_dropped == 2
    assert triples(ds) == {(1, 10): 4.0, (2, 10): 1.0, (2, 20): 3.0}


def test_rating_range_override(tmp_path: Path) -> None:
    files = {"u.data": text(["1\t1\t0\t1", "1\t2\t10\t1"])}
    path = make_source(tmp_path, "ml-100k", files, "folder")
    ds = load_dataset("ml-100k", path, rating_range=(0, 10))
    assert ds.rating_range == (0.0, 10.0) and sorted(triples(ds).values()) == [0.0, 10.0]
    with pytest.raises(DataError, match=r"u.data:1: rating 0 is outside the rating range \[1, 5\]"):
        load_dataset("ml-100k", path)
    with pytest.raises(ConfigError, match="rating_range"):
        load_dataset("ml-100k", path, rating_range=(5, 1))


def test_blank_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    files = {"u.data": b"\n1\t1\t3\t1\n  \n\n1\t2\t9\t1\n"}
    with pytest.raises(DataError) as info:
        load_dataset("ml-100k", make_source(tmp_path, "ml-100k", files, "folder"))
    assert info.value.line == 5


# --------------------------------------------------------------------------- bad input

BAD_RATINGS = [
    # (kind, file, content, line, message fragment)
    ("ml-100k", "u.data", "1\t1\t3\t1\n1\t2\t3\n", 2, "expected 4 fields"),
    ("ml-100k", "u.data", "1\t1\t3\t1\t7\n1\t2\t3\t1\n", 1, "expected 4 fields"),
    ("ml-100k", "u.data", "1\t1\t3\t1\n1\t2\t3\t1\t7\n", 2, "expected 4 fields"),
    ("ml-100k", "u.data", "1\t1\t3\t1\n1\t2\t6\t1\n", 2, "rating 6 is outside the rating range [1, 5]"),
    ("ml-100k", "u.data", "1\t1\t3\t1\n1\t2\t3\tnoon\n", 2, "timestamp 'noon' is not an integer"),
    ("ml-100k", "u.data", "1\t1\t3\t1\n99999999999999999999\t2\t3\t1\n", 2, "user id '99999999999999999999'"),
    ("ml-1m", "ratings.dat", "1::10::5::1\n1::20::5::1\n1::x::3::4\n", 3, "MovieID 'x' is not an integer"),
    ("ml-1m", "ratings.dat", "1::10::5::1\n1::20:5::1\n", 2, "expected 4 fields"),
    ("ml-1m", "ratings.dat", "1::10::5::1\n1::20::0::1\n", 2, "Rating 0 is outside"),
    ("ml-10m", "ratings.dat", "1::10::5::1\n1::20::0.25::1\n", 2, "Rating 0.25 is outside the rating range [0.5, 5]"),
    ("ml-latest", "ratings.csv", "userId,movieId,rating,timestamp\n1,2,abc,3\n", 2, "rating 'abc' is not a number"),
    ("ml-latest", "ratings.csv", "userId,movieId,rating,timestamp\r\n1,1,4,1\r\n1,2,nan,3\r\n", 3, "not a finite"),
    ("ml-latest", "ratings.csv", "userId,movieId,rating,timestamp\n1,1,4,1\n1,2,inf,3\n", 3, "not a finite"),
    ("ml-latest", "ratings.csv", "userId,movieId,rating,timestamp\n1,1,4,1\n1,2,,3\n", 3, "rating '' is not a number"),
    ("ml-latest", "ratings.csv", "userId,movieId,rating\n1,1,4\n", 1, "expected the header"),
    ("ml-latest", "ratings.csv", "1,1,4,1\n", 1, "expected the header"),
    ("lastfm", "user_artists.dat", "userID\tartistID\tweight\n2\t51\t-3\n", 2, "weight -3 is outside"),
    ("lastfm", "user_artists.dat", "userID\tartistID\tweight\n2\t51\t1.5\n", 2, "weight '1.5' is not an integer"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("kind", "name", "content", "line", "fragment"), BAD_RATINGS)
def test_bad_ratings_name_file_and_line(
    tmp_path: Path, layout: str, kind: str, name: str, content: str, line: int, fragment: str
) -> None:
    path = make_source(tmp_path, "data", {name: content.encode()}, layout)
    with pytest.raises(DataError) as info:
        load_dataset(kind, path)
    assert info.value.line == line
    assert f"{name}:{line}: " in str(info.value) and fragment in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("kind", "name", "content"),
    [
        ("ml-100k", "u.data", ""),
        ("ml-100k", "u.data", "\n \n"),
        ("ml-latest", "ratings.csv", "userId,movieId,rating,timestamp\r\n"),
        ("lastfm", "user_artists.dat", "userID\tartistID\tweight\n\n"),
    ],
)
def test_empty_ratings_file(tmp_path: Path, kind: str, name: str, content: str) -> None:
    path = make_source(tmp_path, "data", {name: content.encode()}, "folder")
    with pytest.raises(DataError, match=f"{name}: no ratings"):
        load_dataset(kind, path)


BAD_METADATA = [
    # (kind, fixture, file, content, line, fragment)
    ("ml-100k", ml100k_files, "u.item", f"242|Kolya (1996)|||x|{flags(5)}\n302|Bad|||x|{flags(2)}|1\n", 2, "fields"),
    ("ml-100k", ml100k_files, "u.item", f"242|Kolya (1996)|||x|{flags(5).replace('1', '2')}\n", 1, "0 or 1"),
    ("ml-100k", ml100k_files, "u.genre", "unknown|0\nAction|2\n", 2, "without gaps"),
    ("ml-1m", ml1m_files, "movies.dat", "10::GoldenEye (1995)::Action\n20::Comedy\n", 2, "expected 3 fields"),
    ("ml-10m", ml10m_files, "tags.dat", "1::10::Bond::1\n1::ten::Bond::1\n", 2, "MovieID 'ten'"),
    ("ml-latest", mlcsv_files, "movies.csv", "movieId,title,genres\n1,A (1995),Drama\nx,B,Drama\n", 3, "movieId 'x'"),
    ("ml-latest", mlcsv_files, "tags.csv", "userId,movieId,tag\n", 1, "expected the header"),
    (
        "lastfm",
        lastfm_files,
        "user_taggedartists.dat",
        "userID\tartistID\ttagID\tday\tmonth\tyear\n2\t51\t9\t1\t1\t1\n",
        2,
        "tagID 9 is not listed in tags.dat",
    ),
]


@pytest.mark.filterwarnings("ignore:.*duplicate")
@pytest.mark.parametrize(("kind", "fixture", "name", "content", "line", "fragment"), BAD_METADATA)
def test_bad_metadata_names_file_and_line(
    tmp_path: Path, kind: str, fixture, name: str, content: str, line: int, fragment: str
) -> None:
    files = fixture()
    files[name] = content.encode("latin-1")
    with pytest.raises(DataError) as info:
        load_dataset(kind, make_source(tmp_path, "data", files, "zip"))
    assert info.value.line == line
    assert f"{name}:{line}: " in str(info.value) and fragment in str(info.value)


def test_lastfm_tags_need_tags_dat(tmp_path: Path) -> None:
    files = lastfm_files()
    del files["tags.dat"]
    with pytest.raises(DataError, match="no file named 'tags.dat'"):
        load_dataset("lastfm", make_source(tmp_path, "lastfm", files, "folder"))


def test_zip_without_expected_member(tmp_path: Path) -> None:
    files = ml1m_files()
    del files["ratings.dat"]
    path = make_source(tmp_path, "ml-1m", files, "zip")
    with pytest.raises(DataError) as info:
        load_dataset("ml-1m", path)
    assert str(path) in str(info.value) and "'ratings.dat'" in str(info.value)


def test_corrupt_zip(tmp_path: Path) -> None:
    path = tmp_path / "ml-100k.zip"
    path.write_bytes(b"this is not a zip archive")
    with pytest.raises(DataError, match="not a data folder nor a valid zip archive") as info:
        load_dataset("ml-100k", path)
    assert info.value.path == str(path)


def test_corrupt_zip_member(tmp_path: Path) -> None:
    path = tmp_path / "ml-100k.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("ml-100k/u.data", b"1\t1\t3\t881250949\n")
    path.write_bytes(path.read_bytes().replace(b"881250949", b"881250948"))  # breaks the CRC
    with pytest.raises(DataError, match="cannot read ml-100k/u.data"):
        load_dataset("ml-100k", path)


def test_missing_path_and_unknown_kind(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match="no such file or folder") as info:
        load_dataset("ml-100k", missing)
    assert info.value.path == str(missing)
    with pytest.raises(DataError, match="'ml-5m'.*ml-100k, ml-1m, ml-10m, ml-20m, ml-25m, ml-latest, lastfm"):
        load_dataset("ml-5m", tmp_path)


def test_ambiguous_zip_member(tmp_path: Path) -> None:
    path = tmp_path / "two.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a/u.data", b"1\t1\t3\t1\n")
        archive.writestr("b/u.data", b"1\t1\t3\t1\n")
    with pytest.raises(DataError, match="several members named 'u.data'"):
        load_dataset("ml-100k", path)


def test_chunked_rescan_keeps_line_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a fast-path failure the file is re-parsed in chunks; rows and line numbers stay right."""
    monkeypatch.setattr(tables, "_CHUNK_BYTES", 40)
    lines = [f"{u}::{u + 1}::3::1" for u in range(1, 200)]
    lines[150] = "\t\t\t"  # the C parser rejects this blank-ish line; the careful scan skips it
    path = make_source(tmp_path, "ml-1m", {"ratings.dat": text(lines)}, "folder")
    ds = load_dataset("ml-1m", path)
    assert len(ds.interactions) == 198 and (151, 152) not in triples(ds) and (152, 153) in triples(ds)
    lines[180] = "181::182::three::1"
    (path / "ratings.dat").write_bytes(text(lines))
    with pytest.raises(DataError, match=r"ratings.dat:181: Rating 'three' is not a number"):
        load_dataset("ml-1m", path)


# --------------------------------------------------------------------------- Jester


def jester_line(*ratings: float) -> str:
    """A Jester line: count of rated jokes, then 100 ratings (99 = not rated)."""
    values = list(ratings) + [99] * (100 - len(ratings))
    return ",".join([str(sum(v != 99 for v in values))] + [str(v) for v in values])


def test_jester(tmp_path: Path) -> None:
    files = {"jester-data-1.csv": text([jester_line(-7.82, 99, 10), jester_line(99, 0.5)], "\r\n")}
    ds = load_jester(make_source(tmp_path, "jester", files, "zip"))
    assert triples(ds) == {(1, 1): pytest.approx(-7.82), (1, 3): 10.0, (2, 2): 0.5}
    assert ds.interactions.item_ids.tolist() == list(range(1, 101))  # all 100 jokes, rated or not
    assert ds.interactions.meta["catalogue"] == "metadata"
    assert ds.rating_range == (-10.0, 10.0) and ds.item_features is None and not ds.implicit


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (jester_line(11), "ratings must lie in [-10, 10]"),
        ("5," + jester_line(1).split(",", 1)[1], "count 5 does not match the 1 rated jokes"),
        (jester_line(1) + ",3", "expected 101 fields"),
    ],
)
def test_bad_jester(tmp_path: Path, line: str, fragment: str) -> None:
    files = {"jester-data-1.csv": text([jester_line(1), line])}
    with pytest.raises(DataError, match="jester-data-1.csv:2: ") as info:
        load_jester(make_source(tmp_path, "jester", files, "folder"))
    assert fragment in str(info.value)


def test_jester_needs_one_csv(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="found none"):
        load_jester(make_source(tmp_path, "jester", {"other.csv": b"1\n"}, "folder"))


# --------------------------------------------------------------------------- real data


def shared(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not available: {path}")
    return path


def test_real_ml100k() -> None:
    ds = load_dataset("ml-100k", shared("ml-100k", "ml-100k.zip"))
    inter = ds.interactions
    assert (len(inter), inter.n_users, inter.n_items) == (100_000, 943, 1_682)
    assert ds.item_features.fields["genre"] == slice(0, 19) and ds.item_features.matrix.shape[0] == 1_682
    assert active(ds, "genre", 1) == ["genre=Animation", "genre=Children's", "genre=Comedy"]  # Toy Story
    assert active(ds, "year", 1) == ["year=1995-1999"]


def test_real_ml_latest_small() -> None:
    ds = load_dataset("ml-latest", shared("ml-latest-small", "ml-latest-small.zip"))
    inter = ds.interactions
    assert (len(inter), inter.n_users, inter.n_items) == (100_836, 610, 9_742)  # 18 movies are unrated
    assert np.count_nonzero(inter.item_counts()) == 9_724 and ds.item_features.matrix.shape[0] == 9_742
    assert set(ds.item_features.fields) == {"genre", "year", "tag"}
    assert "genre=(no genres listed)" not in ds.item_features.columns


def test_real_lastfm() -> None:
    ds = load_dataset("lastfm", shared("hetrec2011-lastfm-2k"))
    inter = ds.interactions
    assert (len(inter), inter.n_users, inter.n_items) == (92_834, 1_892, 17_632)
    assert ds.implicit and inter.ratings.min() >= 1


def test_real_ml10m_without_ratings_names_ratings_dat() -> None:
    path = shared("ml-10m")
    with pytest.raises(DataError) as info:
        load_dataset("ml-10m", path)
    assert "ratings.dat" in str(info.value) and str(path) in str(info.value)


def test_real_ml10m_metadata(tmp_path: Path) -> None:
    """Real movies.dat / tags.dat (linked, not copied) next to a small synthetic ratings.dat."""
    real = shared("ml-10m")
    for name in ("movies.dat", "tags.dat"):
        os.symlink(real / name, tmp_path / name)
    (tmp_path / "ratings.dat").write_bytes(text(["1::1::5::1", "2::1::3.5::1", "2::4973::4::1"]))
    ds = load_dataset("ml-10m", tmp_path)
    assert active(ds, "genre", 1) == [
        "genre=Adventure", "genre=Animation", "genre=Children", "genre=Comedy", "genre=Fantasy"
    ]  # fmt: skip
    assert active(ds, "year", 1) == ["year=1995-1999"]
    assert "tag" in ds.item_features.fields


def test_real_jester() -> None:
    ds = load_jester(shared("jester-1", "jester-data-1.zip"))
    assert (ds.interactions.n_users, ds.interactions.n_items) == (24_983, 100)
    ratings = ds.interactions.ratings
    assert ratings.min() >= -10 and ratings.max() <= 10


def test_jester_is_a_data_spec_kind(tmp_path):
    """`--data jester:PATH` reaches the Jester loader (it was unreachable from the command line)."""
    from fedpriv.data.spec import load_spec, parse_data_spec

    folder = tmp_path / "jester"
    folder.mkdir()
    rows = ["3," + ",".join(["1.5", "-2", "9.9"] + ["99"] * 97), "1," + ",".join(["99", "4"] + ["99"] * 98)]
    (folder / "jester-data-1.csv").write_text("\n".join(rows) + "\n")
    ds = load_spec(parse_data_spec(f"jester:{folder}"))
    assert ds.interactions.n_users == 2 and ds.interactions.n_items == 100 and len(ds.interactions) == 4
    assert ds.rating_range == (-10.0, 10.0)


@pytest.mark.parametrize("bad", [(3, 3), (5, 1), (math.nan, 5), ("a", 5)])
def test_one_range_rule_for_built_in_and_csv_data(tmp_path: Path, bad) -> None:
    """The built-in loaders and the csv reader share one rule (fedpriv.data.ranges): LO < HI,
    neither NaN (lo == hi used to pass the built-in loaders); only an implicit preset (Last.fm's
    counts) or a read-only override leaves a side open."""
    from fedpriv.data.tabular import load_tabular

    path = make_source(tmp_path, "ml-100k", {"u.data": text(["1\t1\t3\t1"])}, "folder")
    (tmp_path / "r.csv").write_text("user,item,rating\n1,1,3\n")
    with pytest.raises(ConfigError) as built_in:
        load_dataset("ml-100k", path, rating_range=bad)
    with pytest.raises(ConfigError) as csv_file:
        load_tabular("csv", tmp_path / "r.csv", rating_range=bad)
    assert built_in.value.field == "rating_range"
    rule = "expected two numbers" if bad[0] == "a" else "expected finite numbers LO < HI"
    assert rule in str(built_in.value) and rule in str(csv_file.value)
    (tmp_path / "fm").mkdir()
    lastfm = make_source(tmp_path / "fm", "hetrec", lastfm_files(), "folder")
    assert load_dataset("lastfm", lastfm).rating_range == (0.0, math.inf)
