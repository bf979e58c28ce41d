"""One table reader (fedpriv.data.tables): the built-in data sets are presets over it and the
``csv:`` tables are read by it, so a file's lines are numbered one way and a bad line is named
the same way whichever door the file came in by."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from fedpriv.data import tables
from fedpriv.data.loaders import load_dataset
from fedpriv.data.tabular import load_tabular
from fedpriv.errors import DataError

MOVIES = "movieId,title,genres\n1,Toy Story (1995),Comedy\n2,Heat (1995),Action\n3,\"Sabrina, The (1995)\",Romance\n"


def _ratings(bad: str = "4.0") -> str:
    # line 1 header, line 3 blank, line 5 holds the rating under test
    return f"userId,movieId,rating,timestamp\n1,1,4.0,10\n\n1,2,3.5,11\n2,3,{bad},12\n2,1,5.0,13\n"


def _ml_latest(folder: Path, ratings: str) -> Path:
    folder.mkdir()
    (folder / "ratings.csv").write_text(ratings)
    (folder / "movies.csv").write_text(MOVIES)
    return folder


def test_both_doors_go_through_the_one_reader(tmp_path, monkeypatch):
    """A built-in loader and a csv: table each read their files with tables.read_table, as a
    preset (named, typed columns) and as a user table (names from the header, text cells)."""
    seen: list[tables.Layout] = []
    real = tables.read_table

    def spy(source, layout):
        seen.append(layout)
        return real(source, layout)

    monkeypatch.setattr(tables, "read_table", spy)
    import fedpriv.data.loaders as loaders
    import fedpriv.data.tabular as tabular

    monkeypatch.setattr(loaders, "read_table", spy)
    monkeypatch.setattr(tabular, "read_table", spy)
    folder = _ml_latest(tmp_path / "ml", _ratings())
    ds = load_dataset("ml-latest", folder)
    assert [layout.name for layout in seen] == ["ratings.csv", "movies.csv", "movies.csv"]  # catalogue, then features (cached)
    assert all(layout.preset for layout in seen) and seen[0].columns == ("userId", "movieId", "rating", "timestamp")
    seen.clear()
    table = load_tabular("csv", folder / "ratings.csv", user="userId", item="movieId", rating="rating", rating_range=(0.5, 5.0), items=str(folder / "movies.csv"))
    assert [layout.name for layout in seen] == ["ratings.csv", "movies.csv"]
    assert not any(layout.preset for layout in seen) and seen[1].rows == "one item id per line"
    # the same ratings and catalogue through both doors
    assert len(table.interactions.ratings) == len(ds.interactions.ratings) == 4
    assert list(table.interactions.item_ids) == list(ds.interactions.item_ids) == [1, 2, 3]


@pytest.mark.parametrize("bad", ["x", "9.5"])
def test_a_bad_rating_is_named_at_the_same_line_by_both_doors(tmp_path, bad):
    """Line 5 (after a blank line 3) holds the bad rating: the preset and the user table both
    name the file and line 5, whatever the check that catches it."""
    folder = _ml_latest(tmp_path / "ml", _ratings(bad))
    with pytest.raises(DataError) as preset:
        load_dataset("ml-latest", folder)
    with pytest.raises(DataError) as user:
        load_tabular("csv", folder / "ratings.csv", user="userId", item="movieId", rating="rating", rating_range=(0.5, 5.0), items=str(folder / "movies.csv"))
    for err in (preset.value, user.value):
        assert err.line == 5 and str(err.path).endswith("ratings.csv"), str(err)


def test_a_zip_member_and_a_folder_file_read_alike(tmp_path):
    """The source is one abstraction: the same preset read from a folder and from a zip gives
    the same rows, and an error names ``archive.zip/member`` and the line."""
    folder = _ml_latest(tmp_path / "ml", _ratings())
    archive = tmp_path / "ml.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in ("ratings.csv", "movies.csv"):
            z.write(folder / name, f"ml/{name}")
    layout = tables.Layout("ratings.csv", ",", ("userId", "movieId", "rating", "timestamp"), ("int", "int", "float", "int"), header=True)
    with tables.Source(folder) as a, tables.Source(archive) as b:
        ta, tb = tables.read_table(a, layout), tables.read_table(b, layout)
        assert [list(x) for x in ta.arrays()] == [list(x) for x in tb.arrays()]
        assert [ta.line(i) for i in range(len(ta))] == [2, 4, 5, 6]
        assert str(tb.error(2, "test")) == f"{archive}/ml/ratings.csv:5: test"


def test_a_quoted_field_spanning_lines_keeps_the_user_tables_line_numbers(tmp_path):
    """User tables number CSV records (a quoted field may span lines); the error names the line
    where the bad record starts."""
    path = tmp_path / "r.csv"
    path.write_text('user,item,rating,note\n1,1,4,"two\nlines"\n\n2,1,zz,x\n')
    with pytest.raises(DataError) as err:
        load_tabular("csv", path, rating_range=(1.0, 5.0))
    assert err.value.line == 5, str(err.value)


def test_a_folder_holding_only_the_official_zip_reads_as_the_zip(tmp_path):
    """``ml-100k:FOLDER`` where FOLDER holds just ``ml-100k.zip`` (as downloaded) reads the zip;
    a folder with other files beside a zip is read as a folder."""
    folder = _ml_latest(tmp_path / "ml", _ratings())
    download = tmp_path / "download"
    download.mkdir()
    with zipfile.ZipFile(download / "ml-latest-small.zip", "w") as z:
        for name in ("ratings.csv", "movies.csv"):
            z.write(folder / name, f"ml-latest-small/{name}")
    assert len(load_dataset("ml-latest", download).interactions.ratings) == len(load_dataset("ml-latest", folder).interactions.ratings) == 4
    (download / "notes.txt").write_text("x")
    with pytest.raises(DataError):
        load_dataset("ml-latest", download)
