"""Tests for fedpriv.data.features: year parsing and the multi-hot item feature matrix."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fedpriv.data.features import ItemFeatures, build_item_features, parse_release_year, parse_title_year


@pytest.mark.parametrize(
    ("title", "year"),
    [
        ("Toy Story (1995)", 1995),
        ("City of Lost Children, The (Cité des enfants perdus, La) (1995)", 1995),
        ("Babylon 5 (1994-1998)", 1994),
        ("Stranger Things (2016-)", 2016),
        ("Trailing space (2006) ", 2006),
        ("Babylon 5", None),
        ("1984 (not a year)", None),
        ("", None),
    ],
)
def test_parse_title_year(title: str, year: int | None) -> None:
    assert parse_title_year(title) == year


@pytest.mark.parametrize(
    ("date", "year"),
    [("01-Jan-1995", 1995), ("1-Sep-1977", 1977), ("", None), ("unknown", None), ("1995", None)],
)
def test_parse_release_year(date: str, year: int | None) -> None:
    assert parse_release_year(date) == year


def _dense(features: ItemFeatures, field: str) -> np.ndarray:
    return features.matrix[:, features.fields[field]].toarray()


def test_genres_multi_hot_sorted_and_no_genre_marker() -> None:
    genres = {10: ["Comedy", "Drama"], 20: ["(no genres listed)"], 30: ["Action", "Comedy"]}
    f = build_item_features(3, [10, 20, 30], genres, None)
    assert f.columns == ["genre=Action", "genre=Comedy", "genre=Drama"]
    assert f.fields == {"genre": slice(0, 3)}
    np.testing.assert_array_equal(_dense(f, "genre"), [[0, 1, 1], [0, 0, 0], [1, 1, 0]])
    assert isinstance(f.matrix, sp.csr_matrix)
    assert f.matrix.dtype == np.float32


def test_genre_vocab_fixes_columns_and_rejects_unknown_genres() -> None:
    f = build_item_features(2, [1, 2], {1: ["B"], 2: []}, None, genre_vocab=["A", "B", "C"])
    assert f.columns == ["genre=A", "genre=B", "genre=C"]
    np.testing.assert_array_equal(_dense(f, "genre"), [[0, 1, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="Z"):
        build_item_features(1, [1], {1: ["Z"]}, None, genre_vocab=["A"])


def test_year_buckets_cover_the_range_plus_unknown() -> None:
    years = {1: 1990, 2: 1994, 3: 2001, 4: None}  # item 5 is missing: unknown too
    f = build_item_features(5, [1, 2, 3, 4, 5], None, years, year_bucket=5)
    assert f.columns == ["year=1990-1994", "year=1995-1999", "year=2000-2004", "year=unknown"]
    np.testing.assert_array_equal(
        _dense(f, "year"), [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 1]]
    )


def test_one_year_buckets_and_no_known_year() -> None:
    assert build_item_features(2, [1, 2], None, {1: 1999, 2: 2000}, year_bucket=1).columns == [
        "year=1999",
        "year=2000",
        "year=unknown",
    ]
    assert build_item_features(1, [1], None, {}).columns == ["year=unknown"]
    with pytest.raises(ValueError, match="year_bucket"):
        build_item_features(1, [1], None, {}, year_bucket=0)


def test_tags_normalised_thresholded_and_capped() -> None:
    tags = {1: ["Funny", " funny ", "dark"], 2: ["FUNNY", "Dark", "rare"], 3: ["dark", ""]}
    f = build_item_features(3, [1, 2, 3], None, None, tags, min_tag_count=2)
    # funny: 3 uses, dark: 3 uses (ties by name), rare: 1 use (dropped)
    assert f.columns == ["tag=dark", "tag=funny"]
    np.testing.assert_array_equal(_dense(f, "tag"), [[1, 1], [1, 1], [1, 0]])
    capped = build_item_features(3, [1, 2, 3], None, None, {1: ["a", "a", "a", "b", "b"]}, min_tag_count=1, max_tags=1)
    assert capped.columns == ["tag=a"]


def test_fields_are_stacked_and_item_field_ids() -> None:
    f = build_item_features(
        2,
        np.array([7, 8]),
        {7: ["X"], 8: ["X", "Y"]},
        {7: 2000},
        {8: ["t"] * 5},
    )
    assert list(f.fields) == ["genre", "year", "tag"]
    assert f.fields["year"] == slice(2, 4) and f.fields["tag"] == slice(4, 5)
    assert f.matrix.shape == (2, 5) and len(f.columns) == 5 and f.n_items == 2
    ids = f.item_field_ids("genre")
    assert [list(a) for a in ids] == [[0], [0, 1]]
    assert [list(a) for a in f.item_field_ids("year")] == [[0], [1]]
    assert [list(a) for a in f.item_field_ids("tag")] == [[], [0]]
    assert ids[0].dtype == np.int64
    with pytest.raises(KeyError):
        f.item_field_ids("nope")


def test_item_count_must_match_ids() -> None:
    with pytest.raises(ValueError, match="expected 3 item ids"):
        build_item_features(3, [1, 2], None, None)
