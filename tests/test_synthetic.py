"""Tests of the synthetic data generators."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fedpriv.data.features import ItemFeatures
from fedpriv.data.synthetic import SyntheticMF, make_mf, make_multitask
from fedpriv.errors import ConfigError

USERS, ITEMS, RATINGS = 2_000, 500, 50_000


@pytest.fixture(scope="module")
def mf() -> SyntheticMF:
    return make_mf(USERS, ITEMS, RATINGS, seed=3)


def top_decile_share(counts: np.ndarray) -> float:
    """Share of the ratings held by the 10% most rated items."""
    top = len(counts) // 10
    return float(np.sort(counts)[::-1][:top].sum() / counts.sum())


def keys(inter) -> np.ndarray:
    return inter.users.astype(np.int64) * inter.n_items + inter.items


# --- make_mf -----------------------------------------------------------------------------


def test_mf_exact_count_and_distinct_pairs(mf):
    inter = mf.interactions
    assert len(inter) == RATINGS
    assert (inter.n_users, inter.n_items) == (USERS, ITEMS)
    assert len(np.unique(keys(inter))) == RATINGS
    assert inter.name == "synthetic-mf"


def test_mf_ratings_in_range_and_movielens_like(mf):
    r = mf.interactions.ratings
    assert r.dtype == np.float32
    assert r.min() >= 1.0 and r.max() <= 5.0
    assert mf.rating_range == (1.0, 5.0)
    assert 3.2 < r.mean() < 3.8
    assert 0.8 < r.std() < 1.2


def test_mf_ratings_follow_ground_truth(mf):
    inter = mf.interactions
    u, i = inter.users, inter.items
    truth = (mf.global_mean + mf.user_bias[u] + mf.item_bias[i]
             + np.einsum("ij,ij->i", mf.user_factors[u], mf.item_factors[i]))
    inside = (truth > 2.0) & (truth < 4.5)  # rarely clipped
    resid = inter.ratings[inside] - truth[inside]
    assert abs(resid.mean()) < 0.02
    assert 0.45 < resid.std() < 0.55  # noise = 0.5
    assert mf.user_factors.shape == (USERS, 10) and mf.item_factors.shape == (ITEMS, 10)


def test_every_user_has_at_least_five_ratings(mf):
    assert mf.interactions.user_counts().min() >= 5


def test_users_get_at_least_one_rating_when_ratings_equal_users():
    inter = make_mf(300, 50, 300, seed=1).interactions
    assert np.array_equal(inter.user_counts(), np.ones(300))


def test_catalogue_keeps_unrated_items_and_fixed_raw_ids():
    """Exactly ``items`` items whatever the ratings (most of the 1,000 items here are unrated),
    with raw ids equal to the dense ids, so a neighbouring data set keeps the same id spaces."""
    syn = make_mf(30, 1_000, 150, seed=4)
    inter = syn.interactions
    assert np.count_nonzero(inter.item_counts()) < 1_000  # some items have no rating ...
    assert inter.n_items == 1_000 and np.array_equal(inter.item_ids, np.arange(1_000))  # ... yet are items
    assert inter.n_users == 30 and np.array_equal(inter.user_ids, np.arange(30))
    assert syn.item_features.n_items == 1_000 and syn.item_factors.shape[0] == 1_000
    assert inter.meta["catalogue"] == "metadata"
    other = make_mf(30, 1_000, 300, seed=5).interactions
    assert np.array_equal(other.item_ids, inter.item_ids) and np.array_equal(other.user_ids, inter.user_ids)


def test_user_activity_heavy_tailed(mf):
    counts = mf.interactions.user_counts()
    assert counts.max() > 5 * np.median(counts)


def test_popularity_skew_visible(mf):
    assert top_decile_share(mf.interactions.item_counts()) > 0.35


def test_no_skew_is_about_uniform():
    counts = make_mf(USERS, ITEMS, RATINGS, skew=0.0, seed=3).interactions.item_counts()
    assert top_decile_share(counts) < 0.15


def test_saturated_items_and_dense_matrix():
    inter = make_mf(40, 30, 1_150, skew=4.0, user_skew=3.0, seed=2).interactions
    assert len(np.unique(keys(inter))) == 1_150
    assert inter.item_counts().max() <= 40
    full = make_mf(7, 5, 35, seed=0).interactions
    assert len(np.unique(keys(full))) == 35


def test_features_shape_and_fields(mf):
    feats = mf.item_features
    assert isinstance(feats, ItemFeatures)
    assert sp.isspmatrix_csr(feats.matrix) and feats.matrix.dtype == np.float32
    assert feats.matrix.shape == (ITEMS, 18 + 10) == (ITEMS, len(feats.columns))
    dense = feats.matrix.toarray()
    genres, year = dense[:, feats.fields["genre"]], dense[:, feats.fields["year"]]
    assert genres.shape[1] == 18 and year.shape[1] == 10
    assert genres.sum(axis=1).min() >= 1
    assert 1.5 < genres.sum(axis=1).mean() < 3.0
    assert np.array_equal(year.sum(axis=1), np.ones(ITEMS))
    assert year.sum(axis=0).min() >= ITEMS // 10 - 1  # quantile buckets are balanced


def test_features_correlated_with_item_factors(mf):
    x = np.hstack([mf.item_features.matrix.toarray(), np.ones((ITEMS, 1))])
    v = mf.item_factors
    coef, *_ = np.linalg.lstsq(x, v, rcond=None)
    r2 = 1 - ((v - x @ coef) ** 2).sum() / ((v - v.mean(axis=0)) ** 2).sum()
    assert r2 > 0.3


def test_mf_deterministic_per_seed(mf):
    again = make_mf(USERS, ITEMS, RATINGS, seed=3)
    assert np.array_equal(again.interactions.users, mf.interactions.users)
    assert np.array_equal(again.interactions.items, mf.interactions.items)
    assert np.array_equal(again.interactions.ratings, mf.interactions.ratings)
    assert (again.item_features.matrix != mf.item_features.matrix).nnz == 0
    other = make_mf(USERS, ITEMS, RATINGS, seed=4)
    assert not np.array_equal(keys(other.interactions), keys(mf.interactions))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"users": 0}, "users"),
        ({"items": 0}, "items"),
        ({"ratings": 10 * 5 + 1}, "ratings"),
        ({"ratings": 9}, "ratings"),
        ({"rank": 0}, "rank"),
        ({"skew": -1.0}, "skew"),
        ({"user_skew": -0.5}, "user_skew"),
        ({"noise": -0.1}, "noise"),
        ({"n_genres": 0}, "n_genres"),
        ({"n_year_buckets": 0}, "n_year_buckets"),
    ],
)
def test_mf_rejects_impossible_settings(kwargs, field):
    args = {"users": 10, "items": 5, "ratings": 20} | kwargs
    with pytest.raises(ConfigError) as info:
        make_mf(args.pop("users"), args.pop("items"), args.pop("ratings"), **args)
    assert info.value.field == field


# --- make_multitask ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mt():
    return make_multitask(seed=5)


def test_multitask_shapes(mt):
    n_obs = len(mt.y)
    assert mt.x.shape == (10_000, 5) and mt.theta.shape == (100, 5) and mt.q.shape == (100,)
    assert mt.tasks.shape == mt.users.shape == mt.train_mask.shape == (n_obs,)
    assert mt.tasks.max() < 100 and mt.users.max() < 10_000
    pairs = mt.users.astype(np.int64) * 100 + mt.tasks
    assert len(np.unique(pairs)) == n_obs


def test_multitask_weights_and_tasks_per_user(mt):
    assert mt.q.sum() == pytest.approx(20.0)
    assert mt.q.min() >= 0
    assert len(mt.y) / 10_000 == pytest.approx(20.0, rel=0.02)


def test_multitask_labels_within_noise(mt):
    clean = np.einsum("ij,ij->i", mt.x[mt.users], mt.theta[mt.tasks])
    resid = mt.y - clean
    assert np.abs(resid).max() < 6e-3
    assert resid.std() == pytest.approx(1e-3, rel=0.05)


def test_multitask_unit_ball(mt):
    assert np.linalg.norm(mt.x, axis=1).max() <= 1 + 1e-12
    assert np.linalg.norm(mt.theta, axis=1).max() <= 1 + 1e-12


def test_multitask_split_is_80_20(mt):
    assert mt.train_mask.sum() == int(0.8 * len(mt.y))
    assert np.array_equal(mt.test_mask, ~mt.train_mask)
    other = mt.split(seed=1)
    assert other.sum() == mt.train_mask.sum() and not np.array_equal(other, mt.train_mask)
    assert np.array_equal(mt.split(seed=1), other)


def test_multitask_skew_a2_vs_a1():
    """q has pdf a x^(a-1): for a=2 the task weights (and task sizes) are skewed, with a long left
    tail (negative skewness), while a=1 (uniform) is symmetric; a=2 also has fewer tiny tasks."""

    def skewness(x):
        z = (x - x.mean()) / x.std()
        return float((z**3).mean())

    one, two = (make_multitask(m=2_000, n=2_000, a=a, seed=11) for a in (1.0, 2.0))
    assert abs(skewness(one.q)) < 0.2
    assert skewness(two.q) < -0.4
    sizes_one, sizes_two = (np.bincount(d.tasks, minlength=2_000) for d in (one, two))
    low_tail = [np.quantile(s, 0.1) / np.median(s) for s in (sizes_one, sizes_two)]
    assert low_tail[1] > low_tail[0]


def test_multitask_deterministic_and_validates():
    a, b = make_multitask(n=500, seed=2), make_multitask(n=500, seed=2)
    assert np.array_equal(a.y, b.y) and np.array_equal(a.train_mask, b.train_mask)
    for kwargs, field in [({"m": 0}, "m"), ({"a": 0.0}, "a"), ({"tasks_per_user": 101}, "tasks_per_user"),
                          ({"noise": -1.0}, "noise"), ({"d": 0}, "d"), ({"n": 0}, "n")]:
        with pytest.raises(ConfigError) as info:
            make_multitask(**kwargs)
        assert info.value.field == field
