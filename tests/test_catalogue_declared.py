"""Your own data declares its item catalogue (issue 30): ``--data-opt items=FILE`` or ``items=[ids]``.

A catalogue read off the ratings breaks add/remove-one-user privacy: a new user who is the only
rater of an item adds that item (``n_items`` 20 -> 21). So the items list (or a features table)
gives every listed item a dense id, rated or not; a private run refuses data whose catalogue
came from the ratings (exit 2, nothing written), a non-private run trains on it with a warning.
The neighbouring check loads D and D' = D plus one user, the only rater of an item, through the
real loaders and compares ``n_items`` and the item ids.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedpriv
from fedpriv.cli import main
from fedpriv.data.spec import load_spec, parse_data_spec
from fedpriv.data.tabular import dataset_from_pandas, load_tabular
from fedpriv.errors import ConfigError, DataError
from fedpriv.run import run

NO_CATALOGUE = "the item catalogue is taken from the ratings"
N_ITEMS = 20  # items i0..i19 are rated in D; i20 is rated only by the new user of D'
NEW_USER, ITS_ITEM = "newcomer", "i20"


def ratings_rows(n_users: int = 300, seed: int = 1) -> list[tuple[str, str, int]]:
    """Every user rates 8 of the items i0..i19 (so each of them is rated by someone)."""
    rng = np.random.default_rng(seed)
    return [(f"u{u}", f"i{i}", int(rng.integers(1, 6))) for u in range(n_users) for i in rng.choice(N_ITEMS, 8, replace=False)]


def write_csv(path: Path, rows) -> Path:
    path.write_text("user,item,rating\n" + "".join(f"{u},{i},{r}\n" for u, i, r in rows))
    return path


def write_items(path: Path, ids, header: str = "item") -> Path:
    path.write_text(f"{header}\n" + "".join(f"{i}\n" for i in ids))
    return path


CATALOGUE = [f"i{i}" for i in range(N_ITEMS + 1)]  # the public catalogue: i20 too


def neighbours(tmp_path: Path) -> tuple[list, list]:
    """D and D' = D plus one user, the only rater of item i20."""
    d = ratings_rows()
    return d, [*d, (NEW_USER, ITS_ITEM, 4), (NEW_USER, "i3", 2)]


def load_quiet(spec: str, **options: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_spec(parse_data_spec(spec, options))


# --------------------------------------------------------------------------- loading an items list


def test_items_file_lists_the_catalogue(tmp_path: Path) -> None:
    ratings = write_csv(tmp_path / "r.csv", [("1", "10", 4), ("2", "20", 3), ("1", "20", 5)])
    items = write_items(tmp_path / "items.csv", [30, 10, 20, 40])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a declared catalogue: no warning
        ds = load_spec(parse_data_spec(f"csv:{ratings}", {"rating_range": "1,5", "items": str(items)}))
    inter = ds.interactions
    assert inter.item_ids.tolist() == [10, 20, 30, 40] and inter.item_ids.dtype == np.int64  # sorted raw ids
    assert inter.n_items == 4 and inter.meta["catalogue"] == "metadata"
    assert inter.item_counts().tolist() == [1, 2, 0, 0]  # 30 and 40 are items, unrated
    assert ds.item_features is None


def test_items_file_shapes(tmp_path: Path) -> None:
    ratings = write_csv(tmp_path / "r.csv", [("1", "a", 4), ("2", "b", 3)])
    expected = ["a", "b", "c"]
    # one column: read whatever its header says
    one = load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(write_items(tmp_path / "one.csv", "abc", header="movie_id")))
    assert one.interactions.item_ids.tolist() == expected
    # several columns: the item column (the ratings' item name, or feature_item=); the others are ignored
    (tmp_path / "many.csv").write_text("title,item\nAlpha,a\nBeta,b\nGamma,c\n")
    assert load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(tmp_path / "many.csv")).interactions.item_ids.tolist() == expected
    (tmp_path / "named.csv").write_text("title,movie\nAlpha,a\nBeta,b\nGamma,c\n")
    with pytest.raises(DataError, match=r"named\.csv:1: no item column 'item' \(set it with feature_item=NAME\); columns found: title, movie"):
        load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(tmp_path / "named.csv"))
    named = load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(tmp_path / "named.csv"), feature_item="movie")
    assert named.interactions.item_ids.tolist() == expected
    # parquet, and a tab-separated list with the ratings' separator; blank lines are skipped
    pd.DataFrame({"item": expected}).to_parquet(tmp_path / "items.parquet")
    assert load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(tmp_path / "items.parquet")).interactions.item_ids.tolist() == expected
    tsv = tmp_path / "r.tsv"
    tsv.write_text(ratings.read_text().replace(",", "\t"))
    (tmp_path / "items.tsv").write_text("item\tnote\na\tx\n\nb\ty\nc\tz\n")
    assert load_quiet(f"csv:{tsv}", rating_range="1,5", sep="tab", items=str(tmp_path / "items.tsv")).interactions.item_ids.tolist() == expected


def test_items_and_ratings_ids_are_converted_together(tmp_path: Path) -> None:
    ratings = write_csv(tmp_path / "r.csv", [("1", "10", 4), ("2", "20", 3)])
    ds = load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(write_items(tmp_path / "i.csv", ["10", "20", "x"])))
    assert ds.interactions.item_ids.tolist() == ["10", "20", "x"]  # one text id: all ids stay text


def test_items_from_python_equal_the_file(tmp_path: Path) -> None:
    rows = [("1", "10", 4), ("2", "20", 3), ("1", "20", 5)]
    ratings = write_csv(tmp_path / "r.csv", rows)
    file_ds = load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(write_items(tmp_path / "i.csv", [10, 20, 30])))
    frame = pd.DataFrame(rows, columns=["user", "item", "rating"]).astype({"user": int, "item": int})
    for items in ([10, 20, 30], (30, 20, 10), np.array([10, 20, 30]), pd.Series([10, 20, 30]), ["10", "20", "30"]):
        ds = dataset_from_pandas(frame, rating_range=(1, 5), items=items)
        assert ds.interactions.item_ids.tolist() == file_ds.interactions.item_ids.tolist() == [10, 20, 30]
        assert ds.interactions.meta["catalogue"] == "metadata"
    # the API: a DataFrame or a spec string, with a list or a file
    assert fedpriv.load_data(frame, rating_range=(1, 5), items=[10, 20, 30]).interactions.n_items == 3
    listed = fedpriv.load_data(f"csv:{ratings}", rating_range=(1, 5), items=[10, 20, 30, 40])
    assert listed.interactions.item_ids.tolist() == [10, 20, 30, 40]
    assert fedpriv.load_data(f"csv:{ratings}", rating_range=(1, 5), items=tmp_path / "i.csv").interactions.n_items == 3
    with pytest.raises(ConfigError, match=r"options: ml-100k: data takes no options"):
        fedpriv.load_data("ml-100k:/nowhere", items=[1, 2])


ITEMS_FILE_ERRORS = [
    # (items file text, expected message)
    ("", r"items\.csv: the file is empty; expected a header line naming the columns, then one item id per line"),
    ("item\n", r"items\.csv: the items list has no item rows"),
    ("item\na\nb\nc\na\n", r"items\.csv:5: item 'a' is listed twice in the items list \(first at line 2\)"),
    ("item,title\na,A\n,B\nb,C\n", r"items\.csv:3: empty item id \(column 'item'\)"),
    ("item\na\nNaN\nb\n", r"items\.csv:3: item id 'NaN' marks a missing value"),
    ("item\na\n\"b\n", r'items\.csv:3: a quoted field \(starting with "\) is never closed'),
    ("item\na\nc\n", r"r\.csv:3: item 'b' is not listed in the items list \(.*items\.csv\)"),
]


@pytest.mark.parametrize(("text", "message"), ITEMS_FILE_ERRORS)
def test_bad_items_file(tmp_path: Path, text: str, message: str) -> None:
    ratings = write_csv(tmp_path / "r.csv", [("1", "a", 4), ("2", "b", 3)])
    (tmp_path / "items.csv").write_text(text)
    with pytest.raises(DataError, match=message):
        load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(tmp_path / "items.csv"))


def test_bad_items_option_and_sequence(tmp_path: Path) -> None:
    ratings = write_csv(tmp_path / "r.csv", [("1", "a", 4)])
    with pytest.raises(DataError, match=r"nope\.csv: no such file"):
        load_quiet(f"csv:{ratings}", rating_range="1,5", items=str(tmp_path / "nope.csv"))
    with pytest.raises(ConfigError, match=r"--data-opt: items= needs a file path"):
        parse_data_spec(f"csv:{ratings}", {"rating_range": "1,5", "items": " "})
    with pytest.raises(ConfigError, match=r"--data-opt: give items=PATH or features=PATH, not both"):
        parse_data_spec(f"csv:{ratings}", {"rating_range": "1,5", "items": "i.csv", "features": "f.csv"})
    with pytest.raises(ConfigError, match=r"--data-opt: categorical: only with a features table"):
        parse_data_spec(f"csv:{ratings}", {"rating_range": "1,5", "items": "i.csv", "categorical": "genre"})
    assert parse_data_spec(f"csv:{ratings}", {"rating_range": "1,5", "items": "i.csv", "feature_item": "movie"}).params["feature_item"] == "movie"
    spec = parse_data_spec(f"csv:{ratings}", {"rating_range": "1,5", "items": "i.csv"})
    assert parse_data_spec(str(spec), spec.options()).params == spec.params == {"rating_range": (1.0, 5.0), "items": "i.csv"}
    frame = pd.DataFrame({"user": [1, 2], "item": [5, 6], "rating": [1.0, 2.0]})
    with pytest.raises(DataError, match=r"DataFrame: row 1 \(0-based\): item 6 is not listed in the items list \(DataFrame items\)"):
        dataset_from_pandas(frame, rating_range=(1, 5), items=[5, 7])
    with pytest.raises(DataError, match=r"DataFrame items: row 2 \(0-based\): item 5 is listed twice in the items list \(first at row 0\)"):
        dataset_from_pandas(frame, rating_range=(1, 5), items=[5, 6, 5])
    with pytest.raises(DataError, match=r"DataFrame items: row 1 \(0-based\): item id 6.5 is not a whole number"):
        dataset_from_pandas(frame, rating_range=(1, 5), items=[5.0, 6.5])
    with pytest.raises(DataError, match=r"DataFrame items: the items list has no item rows"):
        dataset_from_pandas(frame, rating_range=(1, 5), items=[])
    with pytest.raises(ConfigError, match=r"items: expected a flat sequence of raw item ids"):
        dataset_from_pandas(frame, rating_range=(1, 5), items=np.array([[5, 6]]))
    with pytest.raises(ConfigError, match=r"items: expected a sequence or array of raw item ids"):
        dataset_from_pandas(frame, rating_range=(1, 5), items=5)
    with pytest.raises(ConfigError, match=r"items: give items=PATH or features=PATH, not both"):
        dataset_from_pandas(frame, rating_range=(1, 5), items=[5, 6], features=pd.DataFrame({"item": [5, 6], "genre": ["a", "b"]}))


# --------------------------------------------------------------------------- neighbouring data sets


def test_adding_the_only_rater_of_an_item_keeps_the_declared_catalogue(tmp_path: Path) -> None:
    """D' = D plus one user who is the only rater of i20, loaded through the real loaders: with the
    items list (a CSV or parquet file, or ids in Python) n_items and the item ids are the same;
    without it n_items grows from 20 to 21, which is why private runs refuse such data."""
    d_rows, d_prime_rows = neighbours(tmp_path)
    d_path, d_prime_path = write_csv(tmp_path / "d.csv", d_rows), write_csv(tmp_path / "d_prime.csv", d_prime_rows)
    items_csv = write_items(tmp_path / "items.csv", CATALOGUE)
    pd.DataFrame({"item": CATALOGUE}).to_parquet(tmp_path / "items.parquet")
    for path in (d_prime_path.with_suffix(".parquet"), d_path.with_suffix(".parquet")):
        pd.read_csv(path.with_suffix(".csv")).to_parquet(path)

    loaded = {
        "csv + items.csv": [load_quiet(f"csv:{p}", rating_range="1,5", items=str(items_csv)) for p in (d_path, d_prime_path)],
        "parquet + items.parquet": [
            load_quiet(f"parquet:{p.with_suffix('.parquet')}", rating_range="1,5", items=str(tmp_path / "items.parquet")) for p in (d_path, d_prime_path)
        ],
        "DataFrame + items=[...]": [
            dataset_from_pandas(pd.DataFrame(rows, columns=["user", "item", "rating"]), rating_range=(1, 5), items=CATALOGUE) for rows in (d_rows, d_prime_rows)
        ],
    }
    for how, (d, d_prime) in loaded.items():
        a, b = d.interactions, d_prime.interactions
        assert a.n_items == b.n_items == N_ITEMS + 1, how
        assert a.item_ids.tolist() == b.item_ids.tolist() == sorted(CATALOGUE), how
        assert b.n_users == a.n_users + 1 and NEW_USER in b.user_ids and NEW_USER not in a.user_ids, how
        j = a.item_ids.tolist().index(ITS_ITEM)
        assert a.item_counts()[j] == 0 and b.item_counts()[j] == 1, how  # an item in D, unrated
    # the gap this closes: without a catalogue the new user adds an item
    with pytest.warns(UserWarning, match=NO_CATALOGUE):
        bare = [load_tabular("csv", p, rating_range=(1.0, 5.0)).interactions for p in (d_path, d_prime_path)]
    assert (bare[0].n_items, bare[1].n_items) == (N_ITEMS, N_ITEMS + 1)
    assert bare[0].meta["catalogue"] == bare[1].meta["catalogue"] == "ratings"


# --------------------------------------------------------------------------- private runs need it


def test_private_run_without_catalogue_exits_2_and_writes_nothing(tmp_path: Path, capsys) -> None:
    """The done-when check: no features table nor items list -> exit 2 naming the missing
    catalogue; with the items list it runs; D' (one more user, the only rater of i20) trains on
    the same n_items."""
    d_rows, d_prime_rows = neighbours(tmp_path)
    d_path, d_prime_path = write_csv(tmp_path / "d.csv", d_rows), write_csv(tmp_path / "d_prime.csv", d_prime_rows)
    base = ["run", "adadpals", "--data", f"csv:{d_path}", "--data-opt", "rating_range=1,5", "--epsilon", "5", "--quiet"]
    code = main([*base, "--out", str(tmp_path / "out"), "--save-model", str(tmp_path / "model")])
    assert code == 2
    err = capsys.readouterr().err
    assert "fedpriv: warning: " in err and re.search(NO_CATALOGUE, err)  # the loader's warning, as one line of the CLI
    assert "--data-opt items: " in err and "no item catalogue: algorithm 'adadpals' is private" in err
    assert "--data-opt items=FILE" in err and "--data-opt features=PATH" in err and "items=[ids]" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "model").exists()

    items = write_items(tmp_path / "items.csv", CATALOGUE)
    n_items = []
    for name, path in (("d", d_path), ("d_prime", d_prime_path)):
        argv = ["run", "adadpals", "--data", f"csv:{path}", "--data-opt", "rating_range=1,5", "--data-opt", f"items={items}",
                "--epsilon", "5", "--quiet", "--noise-seed", "3", "--set", "steps=1", "--set", "rank=2", "--out", str(tmp_path / name)]
        assert main(argv) == 0
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        assert metrics["epsilon_spent"] <= 5.0 + 1e-9
        n_items.append(metrics["n_items"])
    assert n_items == [N_ITEMS + 1, N_ITEMS + 1]


def test_private_api_runs_need_a_catalogue_non_private_ones_warn(tmp_path: Path) -> None:
    frame = pd.DataFrame(ratings_rows(120), columns=["user", "item", "rating"])
    with pytest.warns(UserWarning, match=NO_CATALOGUE), pytest.raises(ConfigError, match=r"^items: DataFrame: no item catalogue: algorithm 'bias' is private") as info:
        fedpriv.train("bias", frame, epsilon=5, data_options={"rating_range": (1, 5)})
    assert "data_options={'items': ids}" in str(info.value) and "features=DataFrame" in str(info.value)
    # a Dataset loaded beforehand is checked too
    with pytest.warns(UserWarning, match=NO_CATALOGUE):
        loaded = fedpriv.load_data(frame, rating_range=(1, 5))
    with pytest.raises(ConfigError, match=r"no item catalogue: algorithm 'adadpals' is private"):
        fedpriv.train("adadpals", loaded, epsilon=5)
    # a non-private algorithm trains on the rated items, with the loader's warning
    with pytest.warns(UserWarning, match=NO_CATALOGUE):
        exact = fedpriv.train("als", frame, data_options={"rating_range": (1, 5)}, steps=1, rank=2)
    assert exact.metrics["n_items"] == N_ITEMS and exact.epsilon is None
    # ... but not with a private recommendation after training
    with pytest.warns(UserWarning, match=NO_CATALOGUE), pytest.raises(ConfigError, match=r"the private recommendation \(recommend=mgem\) is private"):
        fedpriv.train("als", frame, data_options={"rating_range": (1, 5)}, steps=1, rank=2, recommend="mgem")
    # declared: items=[ids] (DataFrame) or a list with a spec string
    res = fedpriv.train("bias", frame, epsilon=5, data_options={"rating_range": (1, 5), "items": CATALOGUE}, noise_seed=1)
    assert res.metrics["n_items"] == N_ITEMS + 1 and res.epsilon <= 5.0 + 1e-9
    path = write_csv(tmp_path / "r.csv", ratings_rows(120))
    res = fedpriv.train("bias", f"csv:{path}", epsilon=5, data_options={"rating_range": (1, 5), "items": CATALOGUE}, noise_seed=1)
    assert res.metrics["n_items"] == N_ITEMS + 1 and res.metrics["dataset"] == f"csv:{path}"


def test_builtin_data_without_its_metadata_file(tmp_path: Path) -> None:
    """The same rule for a built-in data set whose metadata file (u.item) is missing."""
    folder = tmp_path / "ml"
    folder.mkdir()
    (folder / "u.data").write_text("".join(f"{u}\t{i}\t{1 + (u + i) % 5}\t0\n" for u in range(1, 40) for i in range(1, 9)))
    with pytest.warns(UserWarning), pytest.raises(ConfigError, match=r"^--data: .*no item catalogue: algorithm 'adadpals' is private.*u\.item"):
        run("adadpals", f"ml-100k:{folder}", epsilon=5.0, progress=False)
