"""User-supplied rating tables: ``csv:PATH`` / ``parquet:PATH`` data specs with ``--data-opt``
options, :func:`dataset_from_pandas` and :meth:`Interactions.from_pandas`."""

from __future__ import annotations

import importlib.util
import io
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedpriv.data.interactions import Interactions
from fedpriv.data.loaders import load_dataset
from fedpriv.data.spec import DataSpec, load_spec, parse_data_spec
from fedpriv.data.tabular import dataset_from_pandas, load_tabular
from fedpriv.errors import ConfigError, DataError

pytestmark = pytest.mark.filterwarnings("ignore:.*the item catalogue is taken from the ratings")

ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-100k" / "ml-100k.zip"

RATINGS = "user,item,rating,timestamp\n3,20,4,100\n1,10,5,101\n1,20,3.5,102\n2,30,1,103\n3,10,2,104\n"
FEATURES = (
    "item,title,genre,year,price\n"
    "10,Alpha,Comedy|Drama,1990,2.5\n"
    "20,Beta,Drama,1994,\n"
    "30,Gamma,,2001,9.75\n"
    "40,Delta,Comedy| Horror ,,4.0\n"
)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def load(path: Path, **options: str):
    """Load ``csv:PATH`` through the data spec, as the CLI does; warnings silenced."""
    kind = "parquet" if path.suffix == ".parquet" else "csv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_spec(parse_data_spec(f"{kind}:{path}", options))


def assert_same(a: Interactions, b: Interactions) -> None:
    assert (a.n_users, a.n_items) == (b.n_users, b.n_items)
    assert np.array_equal(a.user_ids, b.user_ids) and a.user_ids.dtype == b.user_ids.dtype
    assert np.array_equal(a.item_ids, b.item_ids) and a.item_ids.dtype == b.item_ids.dtype
    for name in ("indptr", "indices", "data"):
        assert np.array_equal(getattr(a.by_user, name), getattr(b.by_user, name)), name


def active(features, item: int, field: str) -> list[str]:
    row = features.matrix[item, features.fields[field]].toarray().ravel()
    return [features.columns[features.fields[field].start + j] for j in np.flatnonzero(row)]


# --------------------------------------------------------------------------- happy paths


def test_csv_loads_ratings_with_dense_ids(tmp_path: Path) -> None:
    path = write(tmp_path, "r.csv", RATINGS)
    with pytest.warns(UserWarning, match="item catalogue is taken from the ratings"):
        ds = load_spec(parse_data_spec(f"csv:{path}", {"rating_range": "1,5"}))
    inter = ds.interactions
    assert ds.rating_range == (1.0, 5.0) and not ds.implicit and ds.duplicates_dropped == 0
    assert inter.user_ids.tolist() == [1, 2, 3] and inter.user_ids.dtype == np.int64
    assert inter.item_ids.tolist() == [10, 20, 30] and inter.meta["catalogue"] == "ratings"
    assert ds.item_features is None and ds.source == str(path)
    assert inter.by_user.row(0)[1].tolist() == [5.0, 3.5]  # user 1 rated items 10 and 20


def test_parquet_equals_csv(tmp_path: Path) -> None:
    csv_path = write(tmp_path, "r.csv", RATINGS)
    pq_path = tmp_path / "r.parquet"
    pd.read_csv(csv_path).to_parquet(pq_path)
    features_pq = tmp_path / "f.parquet"
    pd.read_csv(io.StringIO(FEATURES)).to_parquet(features_pq)
    a = load(csv_path, rating_range="1,5", features=str(write(tmp_path, "f.csv", FEATURES)), name="title")
    b = load(pq_path, rating_range="1,5", features=str(features_pq), name="title")
    assert_same(a.interactions, b.interactions)
    assert a.item_features.columns == b.item_features.columns and a.item_features.names == b.item_features.names
    assert (a.item_features.matrix != b.item_features.matrix).nnz == 0


def test_from_pandas_equals_csv(tmp_path: Path) -> None:
    path = write(tmp_path, "r.csv", RATINGS)
    frame = pd.read_csv(path)
    ds = load(path, rating_range="1,5")
    assert_same(Interactions.from_pandas(frame), ds.interactions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = dataset_from_pandas(frame, rating_range=(1, 5))
    assert_same(other.interactions, ds.interactions)
    assert other.rating_range == ds.rating_range and other.source == "DataFrame"
    # text ids in the frame (as the CSV reader sees them) give the same int64 raw ids
    assert_same(Interactions.from_pandas(frame.astype(str)), ds.interactions)


def test_string_ids_stay_strings(tmp_path: Path) -> None:
    path = write(tmp_path, "r.csv", "user,item,rating\nbob,007,4\nalice,7,3\nbob,x,2\n")
    inter = load(path, rating_range="1,5").interactions
    assert inter.user_ids.tolist() == ["alice", "bob"] and inter.user_ids.dtype.kind == "U"
    assert inter.item_ids.tolist() == ["007", "7", "x"]  # 007 is not written plainly: all stay text


def test_mostly_integer_ids_warn_with_the_line(tmp_path: Path) -> None:
    rows = "".join(f"{u},{u % 7},3\n" for u in range(1, 300))
    path = write(tmp_path, "r.csv", "user,item,rating\n" + rows.replace("150,3,3", "15O,3,3"))
    with pytest.warns(UserWarning, match=r"user ids \(column 'user'\) are kept as strings because line 151 holds '15O'"):
        load_tabular("csv", path, rating_range=(1.0, 5.0))


def test_implicit_without_rating_column(tmp_path: Path) -> None:
    path = write(tmp_path, "r.csv", "user,item\n1,10\n2,10\n1,20\n")
    ds = load(path, implicit="1")
    assert ds.implicit and ds.rating_range == (0.0, 1.0)
    assert ds.interactions.ratings.tolist() == [1.0, 1.0, 1.0] and len(ds.interactions) == 3


def test_header_0_positional_columns(tmp_path: Path) -> None:
    with_header = load(write(tmp_path, "a.csv", RATINGS), rating_range="1,5")
    no_header = write(tmp_path, "b.csv", RATINGS.split("\n", 1)[1])
    ds = load(no_header, header="0", rating_range="1,5", user="ignored")
    assert_same(ds.interactions, with_header.interactions)


@pytest.mark.parametrize(("sep", "char"), [("tab", "\t"), (";", ";")])
def test_separators(tmp_path: Path, sep: str, char: str) -> None:
    reference = load(write(tmp_path, "a.csv", RATINGS), rating_range="1,5")
    ds = load(write(tmp_path, "b.csv", RATINGS.replace(",", char)), sep=sep, rating_range="1,5")
    assert_same(ds.interactions, reference.interactions)


def test_column_names_options_and_blank_lines(tmp_path: Path) -> None:
    text = "uid,movie,stars\n1,10,5\n\n2,10,4\n,,\n"
    ds = load(write(tmp_path, "r.csv", text), user="uid", item="movie", rating="stars", rating_range="0.5,5")
    assert len(ds.interactions) == 2 and ds.rating_range == (0.5, 5.0)


def test_duplicates_last_keeps_the_last_rating(tmp_path: Path) -> None:
    path = write(tmp_path, "r.csv", "user,item,rating\n1,10,2\n1,10,4\n2,10,3\n")
    with pytest.warns(UserWarning, match="dropped 1 duplicate"):
        ds = load_tabular("csv", path, rating_range=(1.0, 5.0), duplicates="last")
    assert ds.duplicates_dropped == 1 and ds.interactions.by_user.row(0)[1].tolist() == [4.0]


def test_latin1_file(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_bytes("user,item,rating\nJosé,Café,4\n".encode("latin-1"))
    inter = load(path, rating_range="1,5").interactions
    assert inter.user_ids.tolist() == ["José"] and inter.item_ids.tolist() == ["Café"]


def test_spec_round_trip() -> None:
    options = {"rating_range": "1,5", "sep": "tab", "header": "0", "features": "f.csv", "categorical": "a;b", "bins": "3"}
    spec = parse_data_spec("csv:r.tsv", options)
    assert str(spec) == "csv:r.tsv"
    assert spec.params == {"rating_range": (1.0, 5.0), "sep": "\t", "header": False, "features": "f.csv", "categorical": ("a", "b"), "bins": 3}
    assert parse_data_spec(str(spec), spec.options()).params == spec.params
    assert parse_data_spec("csv:r.csv", {**options, "categorical": "a,b"}).params["categorical"] == ("a", "b")


# --------------------------------------------------------------------------- item features


def features_ds(tmp_path: Path, ratings: str = RATINGS, **options: str):
    ratings_path = write(tmp_path, "r.csv", ratings)
    features_path = write(tmp_path, "f.csv", FEATURES)
    return load(ratings_path, rating_range="1,5", features=str(features_path), **options)


def test_features_categorical_numeric_names_unknown(tmp_path: Path) -> None:
    ds = features_ds(tmp_path, name="title", bins="2")
    feats, inter = ds.item_features, ds.interactions
    # the catalogue is the features table: item 40 is unrated but has a dense id
    assert inter.item_ids.tolist() == [10, 20, 30, 40] and inter.meta["catalogue"] == "metadata"
    assert inter.item_counts().tolist() == [2, 2, 1, 0]
    assert feats.names == ["Alpha", "Beta", "Gamma", "Delta"]
    assert list(feats.fields) == ["genre", "year", "price"]
    assert feats.columns[feats.fields["genre"]] == ["genre=Comedy", "genre=Drama", "genre=Horror"]
    assert active(feats, 0, "genre") == ["genre=Comedy", "genre=Drama"]  # multi-valued cell
    assert active(feats, 2, "genre") == []  # empty cell
    assert active(feats, 3, "genre") == ["genre=Comedy", "genre=Horror"]  # blanks around values stripped
    # whole numbers: inclusive ranges; missing -> unknown
    assert feats.columns[feats.fields["year"]] == ["year=1990-1993", "year=1994-2001", "year=unknown"]
    assert [active(feats, i, "year") for i in range(4)] == [["year=1990-1993"], ["year=1994-2001"], ["year=1994-2001"], ["year=unknown"]]
    # fractions: half-open quantile intervals, the last closed
    assert feats.columns[feats.fields["price"]] == ["price=[2.5, 4)", "price=[4, 9.75]", "price=unknown"]
    assert [active(feats, i, "price") for i in range(4)] == [["price=[2.5, 4)"], ["price=unknown"], ["price=[4, 9.75]"], ["price=[4, 9.75]"]]


def test_features_explicit_columns_and_quantile_buckets(tmp_path: Path) -> None:
    ds = features_ds(tmp_path, categorical="year", numeric="price", multi_sep="")
    feats = ds.item_features
    assert list(feats.fields) == ["year", "price"]  # only the listed columns; title is not used
    assert feats.columns[feats.fields["year"]] == ["year=1990", "year=1994", "year=2001"]
    table = "item,size\n" + "".join(f"{i},{i}\n" for i in range(1, 101))
    ratings = write(tmp_path, "r2.csv", "user,item,rating\n1,1,1\n")
    five = load(ratings, rating_range="1,5", features=str(write(tmp_path, "f2.csv", table))).item_features
    assert five.columns == ["size=1-20", "size=21-40", "size=41-60", "size=61-80", "size=81-100", "size=unknown"]
    assert five.matrix.sum(axis=0).A1.tolist() == [20, 20, 20, 20, 20, 0]


def test_features_from_pandas_equal_csv(tmp_path: Path) -> None:
    reference = features_ds(tmp_path, name="title")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = dataset_from_pandas(pd.read_csv(io.StringIO(RATINGS)), rating_range=(1, 5), features=pd.read_csv(io.StringIO(FEATURES)), name="title")
    assert_same(ds.interactions, reference.interactions)
    assert ds.item_features.columns == reference.item_features.columns
    assert (ds.item_features.matrix != reference.item_features.matrix).nnz == 0


def test_rated_item_missing_from_features_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"r\.csv:4: item 50 is not listed in the features table \(.*f\.csv\)"):
        features_ds(tmp_path, ratings="user,item,rating\n1,10,4\n1,20,4\n2,50,3\n")


def test_duplicate_feature_row_is_an_error(tmp_path: Path) -> None:
    features = write(tmp_path, "f.csv", "item,genre\n10,Comedy\n20,Drama\n10,Horror\n")
    with pytest.raises(DataError, match=r"f\.csv:4: item 10 is listed twice in the features table \(first at line 2\)"):
        load(write(tmp_path, "r.csv", RATINGS), rating_range="1,5", features=str(features))


def test_features_without_item_column_is_an_error(tmp_path: Path) -> None:
    features = write(tmp_path, "f.csv", "movie,genre\n10,Comedy\n")
    with pytest.raises(DataError, match=r"f\.csv:1: no item column 'item' \(set it with feature_item=NAME\); columns found: movie, genre"):
        load(write(tmp_path, "r.csv", RATINGS), rating_range="1,5", features=str(features))
    ds = load(write(tmp_path, "r.csv", "user,item,rating\n1,10,4\n"), rating_range="1,5", features=str(features), feature_item="movie")
    assert ds.item_features.columns == ["genre=Comedy"]


def test_non_number_in_numeric_feature_column(tmp_path: Path) -> None:
    features = write(tmp_path, "f.csv", "item,year\n10,1990\n20,soon\n")
    with pytest.raises(DataError, match=r"f\.csv:3: year value 'soon' is not a finite number"):
        load(write(tmp_path, "r.csv", "user,item,rating\n1,10,4\n"), rating_range="1,5", features=str(features), numeric="year")


# --------------------------------------------------------------------------- bad files


BAD_CASES = [
    # (file text, expected message)
    ("", r"bad\.csv: the file is empty; expected a header line naming the columns"),
    ("user,item,rating\n", r"bad\.csv: no ratings: the file has no data rows"),
    ("user,item,score\n1,2,3\n", r"bad\.csv:1: no rating column 'rating' \(set it with rating=NAME, or give implicit=1\); columns found: user, item, score"),
    ("user,item,rating\n1,2,3\n ,2,3\n", r"bad\.csv:3: empty user id \(column 'user'\)"),
    ("user,item,rating\n1,2,3\n2,,3\n", r"bad\.csv:3: empty item id \(column 'item'\)"),
    ("user,item,rating\n1,2,3\n2,NaN,3\n", r"bad\.csv:3: item id 'NaN' marks a missing value \(column 'item'\)"),
    ("user,item,rating\n1,2,3\n\n2,3,four\n", r"bad\.csv:4: rating 'four' is not a number"),
    ("user,item,rating\n1,2,3\n2,3,\n", r"bad\.csv:3: empty rating"),
    ("user,item,rating\n1,2,3\n2,3,7\n", r"bad\.csv:3: rating 7 is outside the rating range \[1, 5\]"),
    ("user,item,rating\n1,2,3\n2,3,0.5\n", r"bad\.csv:3: rating 0.5 is outside the rating range \[1, 5\]"),
    ("user,item,rating\n1,2,3\n2,3,nan\n", r"bad\.csv:3: rating nan is not a finite number"),
    ("user,item,rating\n1,2,3\n2,3,inf\n", r"bad\.csv:3: rating inf is not a finite number"),
    (
        'user,item,rating,note\n1,2,3,"two\nlines"\n2,3,4,\n1,2,5,\n',
        r"bad\.csv:5: duplicate \(user, item\) pair \(1, 2\), first given at line 2; give duplicates=last",
    ),
    ("user,item,rating\n1,2,3\n2,3,4,5\n", r"bad\.csv:3: expected 3 fields \(as on the header\), found 4"),
    ('user,item,rating\n1,2,3\n"2,3,4\n5,6,7\n', r'bad\.csv:3: a quoted field \(starting with "\) is never closed'),
    # the first bad line is reported, whatever the check
    ("user,item,rating\n1,2,3\n2,3,9\n,4,4\n", r"bad\.csv:3: rating 9 is outside"),
    ("user,item,rating\n1,2,3\n,3,4\n2,4,x\n", r"bad\.csv:3: empty user id"),
]


@pytest.mark.parametrize(("text", "message"), BAD_CASES)
def test_bad_csv(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(DataError, match=message):
        load(path, rating_range="1,5")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.csv: no such file"):
        load(tmp_path / "nope.csv", rating_range="1,5")
    with pytest.raises(DataError, match="is a folder"):
        load(tmp_path, rating_range="1,5")


def test_bad_parquet_rows_are_named_by_position(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pd.DataFrame({"user": [1, 2, 3], "item": [1, 2, 3], "rating": [4.0, 6.0, 3.0]}).to_parquet(path)
    with pytest.raises(DataError, match=r"bad\.parquet: row 1 \(0-based\): rating 6 is outside the rating range \[1, 5\]"):
        load(path, rating_range="1,5")
    pd.DataFrame({"user": [1.0, None], "item": [1, 2], "rating": [4.0, 3.0]}).to_parquet(path)
    with pytest.raises(DataError, match=r"bad\.parquet: row 1 \(0-based\): empty user id"):
        load(path, rating_range="1,5")
    pd.DataFrame({"user": [1, 2], "item": [1, 2]}).to_parquet(path)
    with pytest.raises(DataError, match=r"bad\.parquet: no rating column 'rating' .*columns found: user, item"):
        load(path, rating_range="1,5")
    path.write_text("not parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: cannot read as a parquet file"):
        load(path, rating_range="1,5")


def test_parquet_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    with pytest.raises(ConfigError, match="needs pyarrow: pip install pyarrow"):
        load(tmp_path / "r.parquet", rating_range="1,5")


def test_bad_dataframe_rows(tmp_path: Path) -> None:
    frame = pd.DataFrame({"user": [1, 2, 1], "item": [5, 6, 5], "rating": [1.0, np.nan, 2.0]})
    with pytest.raises(DataError, match=r"DataFrame: row 1 \(0-based\): rating nan is not a finite number"):
        Interactions.from_pandas(frame)
    frame.loc[1, "rating"] = 3.0
    with pytest.raises(DataError, match=r"DataFrame: row 2 \(0-based\): duplicate \(user, item\) pair \(1, 5\), first given at row 0"):
        Interactions.from_pandas(frame)
    with pytest.raises(DataError, match=r"DataFrame: row 1 \(0-based\): item id 2.5 is not a whole number"):
        Interactions.from_pandas(pd.DataFrame({"user": [1, 2], "item": [1.0, 2.5], "rating": [1.0, 2.0]}))
    with pytest.raises(DataError, match=r"mine: row 0 \(0-based\): rating 9 is outside the rating range \[1, 5\]"):
        dataset_from_pandas(frame.assign(rating=9.0), rating_range=(1, 5), source="mine")


# --------------------------------------------------------------------------- options


def test_unknown_option() -> None:
    with pytest.raises(ConfigError, match=r"--data-opt: unknown option 'colour' for csv: data \(known: user, item, rating, sep"):
        parse_data_spec("csv:r.csv", {"colour": "red", "rating_range": "1,5"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"header": "maybe"}, r"--data-opt: header='maybe': expected 1 or 0"),
        ({"rating_range": "abc"}, r"--data-opt: rating_range='abc': expected two numbers LO,HI"),
        ({"rating_range": "5,1"}, r"--data-opt: rating_range: expected finite numbers LO < HI"),
        ({"sep": "::"}, r"--data-opt: sep='::': expected one character, or the word tab"),
        ({"duplicates": "first"}, r"--data-opt: duplicates='first': expected error or last"),
        ({"bins": "0"}, r"--data-opt: bins='0': expected a whole number from 1 to 1000"),
        ({"categorical": "genre"}, r"--data-opt: categorical: only with a features table \(give features=PATH\)"),
        ({"implicit": "1", "rating_range": "1,5"}, r"--data-opt: implicit=1 data has no rating scale"),
    ],
)
def test_bad_option_values(options: dict, message: str) -> None:
    options = {"rating_range": "1,5", **options}
    with pytest.raises(ConfigError, match=message):
        parse_data_spec("csv:r.csv", options)


def test_explicit_ratings_need_a_declared_range() -> None:
    with pytest.raises(ConfigError, match=r"rating_range: explicit ratings need their declared rating range.*must not be read off the private data") as info:
        parse_data_spec("csv:r.csv")
    assert info.value.field == "rating_range"
    with pytest.raises(ConfigError, match=r"rating_range: explicit ratings need"):
        dataset_from_pandas(pd.DataFrame({"user": [1], "item": [1], "rating": [1.0]}))
    assert parse_data_spec("csv:r.csv", {"implicit": "1"}).params == {"implicit": True}


def test_options_on_kinds_without_options() -> None:
    with pytest.raises(ConfigError, match=r"--data-opt: ml-100k: data takes no options \(got rating_range\)"):
        parse_data_spec("ml-100k:/data", {"rating_range": "1,5"})
    with pytest.raises(ConfigError, match=r"--data-opt: header applies to csv: data only"):
        parse_data_spec("parquet:r.parquet", {"rating_range": "1,5", "header": "0"})
    assert parse_data_spec("ml-100k:/data", {}) == DataSpec("ml-100k", path="/data")


# --------------------------------------------------------------------------- ML-100K


@pytest.mark.skipif(not ML100K.exists(), reason=f"ML-100K not present at {ML100K}")
def test_ml100k_csv_equals_builtin_loader(tmp_path: Path) -> None:
    from fedpriv.run import run

    with zipfile.ZipFile(ML100K) as archive:
        ratings = pd.read_csv(io.BytesIO(archive.read("ml-100k/u.data")), sep="\t", header=None, names=["user", "item", "rating", "timestamp"])
        items = pd.read_csv(io.BytesIO(archive.read("ml-100k/u.item")), sep="|", header=None, encoding="latin-1")
        genres = pd.read_csv(io.BytesIO(archive.read("ml-100k/u.genre")), sep="|", header=None)[0].tolist()
    flags = items.iloc[:, 5:].to_numpy()
    table = pd.DataFrame({"item": items[0], "title": items[1], "genre": ["|".join(g for g, f in zip(genres, row) if f) for row in flags]})
    ratings.to_csv(tmp_path / "ratings.csv", index=False)
    table.to_csv(tmp_path / "movies.csv", index=False)

    spec = parse_data_spec(f"csv:{tmp_path / 'ratings.csv'}", {"rating_range": "1,5", "features": str(tmp_path / "movies.csv"), "name": "title"})
    ds = load_spec(spec)
    ref = load_dataset("ml-100k", ML100K)
    assert_same(ds.interactions, ref.interactions)
    assert (ds.interactions.n_users, ds.interactions.n_items) == (943, 1682)
    assert ds.item_features.names == [n.strip() for n in ref.item_features.names]  # cells are stripped
    for i in (0, 1, 500, 1681):  # the same genres (the built-in loader keeps u.genre's order)
        assert sorted(active(ds.item_features, i, "genre")) == sorted(active(ref.item_features, i, "genre"))

    overrides = {"steps": "2", "rank": "4"}
    ours, _ = run("als", spec, overrides=overrides, progress=False, second_opinion=False)
    builtin, _ = run("als", f"ml-100k:{ML100K}", overrides=overrides, progress=False, second_opinion=False)
    assert ours["test_rmse"] == pytest.approx(builtin["test_rmse"], abs=1e-9)
    assert (ours["n_users"], ours["n_items"], ours["n_ratings"]) == (builtin["n_users"], builtin["n_items"], builtin["n_ratings"])


# --------------------------------------------------------------------------- more shapes


def test_header_0_needs_three_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.csv", "1,2\n3,4\n")
    with pytest.raises(DataError, match=r"bad\.csv:1: expected at least 3 columns with header=0 \(rating is column 3\), found 2"):
        load(path, header="0", rating_range="1,5")
    assert load(path, header="0", implicit="1").interactions.item_ids.tolist() == [2, 4]


def test_dataframe_index_level_and_list_cells() -> None:
    ratings = pd.DataFrame({"user": ["b", "a"], "item": [1, 2], "rating": [1.0, 2.0]}).set_index("user")
    assert Interactions.from_pandas(ratings).user_ids.tolist() == ["a", "b"]
    features = pd.DataFrame({"item": [1, 2, 3], "genre": [["A", "B"], [], None], "flag": [True, False, True]})
    ds = dataset_from_pandas(ratings, rating_range=(1, 2), features=features)
    assert ds.item_features.columns == ["genre=A", "genre=B", "flag=False", "flag=True"]
    assert ds.item_features.matrix.toarray().tolist() == [[1, 1, 0, 1], [0, 0, 1, 0], [0, 0, 0, 1]]
    with pytest.raises(DataError, match=r"DataFrame: row 0 \(0-based\): item 9 is not listed in the features table \(DataFrame features\)"):
        dataset_from_pandas(ratings.assign(item=[9, 1]), rating_range=(1, 2), features=features)


def test_ids_of_ratings_and_features_are_converted_together(tmp_path: Path) -> None:
    ratings = write(tmp_path, "r.csv", "user,item,rating\n1,10,3\n2,a,4\n")
    features = write(tmp_path, "f.csv", "item,genre\n10,x\na,y\n11,z\n")
    ds = load(ratings, rating_range="1,5", features=str(features))
    assert ds.interactions.item_ids.tolist() == ["10", "11", "a"]
    assert ds.item_features.columns == ["genre=x", "genre=y", "genre=z"]


def test_parquet_ratings_with_csv_features_and_sep(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    pd.read_csv(io.StringIO(RATINGS)).to_parquet(path)
    features = write(tmp_path, "f.csv", FEATURES.replace(",", ";"))
    ds = load(path, rating_range="1,5", features=str(features), sep=";", name="title")
    assert ds.item_features.names == ["Alpha", "Beta", "Gamma", "Delta"]
