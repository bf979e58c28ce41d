"""Tests of the train / validation / test splits."""

from __future__ import annotations

import numpy as np
import pytest

from fedpriv.data.interactions import Interactions
from fedpriv.data.splits import heldout_users_split, random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.errors import ConfigError


@pytest.fixture(scope="module")
def ratings() -> Interactions:
    return make_mf(1_500, 400, 40_000, seed=7).interactions


def keys(inter: Interactions) -> np.ndarray:
    return inter.users.astype(np.int64) * inter.n_items + inter.items


def same_id_space(part: Interactions, full: Interactions) -> bool:
    return (part.n_users, part.n_items) == (full.n_users, full.n_items) and part.item_ids is full.item_ids


# --- random_split ------------------------------------------------------------------------


def test_random_split_disjoint_and_complete(ratings):
    split = random_split(ratings)
    parts = (split.train, split.valid, split.test)
    all_keys = np.concatenate([keys(p) for p in parts])
    assert len(all_keys) == len(ratings) == len(np.unique(all_keys))
    assert np.array_equal(np.sort(all_keys), np.sort(keys(ratings)))
    assert all(same_id_space(p, ratings) for p in parts)
    # each rating keeps its value
    full = dict(zip(keys(ratings).tolist(), ratings.ratings.tolist()))
    assert all(full[k] == r for k, r in zip(keys(split.test).tolist(), split.test.ratings.tolist()))


@pytest.mark.parametrize("fractions", [(0.8, 0.1, 0.1), (0.9, 0.0, 0.1), (0.5, 0.25, 0.25)])
def test_random_split_fractions(ratings, fractions):
    split = random_split(ratings, fractions=fractions, seed=3)
    sizes = np.array([len(split.train), len(split.valid), len(split.test)]) / len(ratings)
    assert np.allclose(sizes, fractions, atol=0.01)


def test_random_split_deterministic(ratings):
    a, b, c = random_split(ratings, seed=5), random_split(ratings, seed=5), random_split(ratings, seed=6)
    assert np.array_equal(keys(a.test), keys(b.test))
    assert np.array_equal(keys(a.train), keys(b.train))
    assert not np.array_equal(keys(a.test), keys(c.test))


@pytest.mark.parametrize("fractions", [(0.8, 0.1, 0.2), (0.8, 0.2), (1.1, -0.1, 0.0)])
def test_random_split_rejects_bad_fractions(ratings, fractions):
    with pytest.raises(ConfigError) as info:
        random_split(ratings, fractions=fractions)
    assert info.value.field == "fractions"


# --- heldout_users_split -----------------------------------------------------------------


@pytest.fixture(scope="module")
def heldout(ratings):
    return heldout_users_split(ratings, n_valid_users=150, n_test_users=150, seed=1)


def positive_keys(inter: Interactions, threshold: float = 3.5) -> np.ndarray:
    return keys(inter)[inter.ratings > threshold]


def test_heldout_user_groups_disjoint(heldout):
    groups = [heldout.train_users, heldout.valid_users, heldout.test_users]
    assert len(heldout.valid_users) == len(heldout.test_users) == 150
    assert len(np.unique(np.concatenate(groups))) == sum(len(g) for g in groups)
    assert set(np.unique(heldout.train.users)) <= set(heldout.train_users)
    assert set(np.unique(heldout.valid_history.users)) | set(np.unique(heldout.valid_targets.users)) \
        <= set(heldout.valid_users)
    assert set(np.unique(heldout.test_history.users)) | set(np.unique(heldout.test_targets.users)) \
        <= set(heldout.test_users)


def test_heldout_parts_are_implicit_positives_in_same_id_space(heldout, ratings):
    parts = [heldout.train, heldout.valid_history, heldout.valid_targets,
             heldout.test_history, heldout.test_targets]
    positives = set(positive_keys(ratings).tolist())
    for part in parts:
        assert same_id_space(part, ratings)
        assert np.all(part.ratings == 1.0)
        assert set(keys(part).tolist()) <= positives


def test_heldout_users_eligible_and_train_complete(heldout, ratings):
    pos_users = ratings.users[ratings.ratings > 3.5]
    counts = np.bincount(pos_users, minlength=ratings.n_users)
    eligible = np.flatnonzero(counts >= 5)
    held = np.concatenate([heldout.train_users, heldout.valid_users, heldout.test_users])
    assert np.array_equal(np.sort(held), eligible)
    # every positive of a training user is in train
    train_pos = np.isin(pos_users, heldout.train_users)
    assert len(heldout.train) == int(train_pos.sum())


def test_history_targets_partition_each_user(heldout, ratings):
    items = set(heldout.items.tolist())
    pos = ratings.subset(ratings.ratings > 3.5)
    for users, history, targets in [
        (heldout.valid_users, heldout.valid_history, heldout.valid_targets),
        (heldout.test_users, heldout.test_history, heldout.test_targets),
    ]:
        expected = keys(pos)[np.isin(pos.users, users) & np.isin(pos.items, heldout.items)]
        got = np.concatenate([keys(history), keys(targets)])
        assert len(got) == len(np.unique(got))
        assert np.array_equal(np.sort(got), np.sort(expected))
        assert set(history.items.tolist()) | set(targets.items.tolist()) <= items
        n_hist, n_targ = history.user_counts()[users], targets.user_counts()[users]
        n = n_hist + n_targ
        split_users = n >= 2
        assert np.all(n_targ[split_users] >= 1) and np.all(n_hist[split_users] >= 1)
        assert np.array_equal(n_targ[split_users], np.clip(n[split_users] // 5, 1, None))


def test_heldout_items_restricted_to_train():
    users = np.repeat(np.arange(6), 5)
    items = np.tile(np.arange(5), 6)
    items[0] = 5  # only user 0 likes item 5
    inter = Interactions(users=users, items=items, ratings=np.full(30, 5.0), n_users=6, n_items=6)
    split = heldout_users_split(inter, n_valid_users=1, n_test_users=1, seed=1)
    assert split.test_users.tolist() == [0]  # this seed holds user 0 out
    assert split.items.tolist() == [0, 1, 2, 3, 4]
    assert set(split.train.items.tolist()) == set(split.items.tolist())
    assert len(split.test_history) + len(split.test_targets) == 4  # item 5 removed
    for part in (split.valid_history, split.valid_targets, split.test_history, split.test_targets):
        assert 5 not in part.items


def test_top_items_fraction_restricts_train(ratings):
    split = heldout_users_split(ratings, n_valid_users=100, n_test_users=100, top_items_fraction=0.1, seed=2)
    full = heldout_users_split(ratings, n_valid_users=100, n_test_users=100, seed=2)
    assert np.array_equal(split.train_users, full.train_users)
    counts = full.train.item_counts()
    n_present = np.count_nonzero(counts)
    assert len(split.items) == int(np.ceil(0.1 * n_present))
    assert counts[split.items].min() >= np.sort(counts)[::-1][len(split.items) - 1]
    assert set(split.train.items.tolist()) == set(split.items.tolist())
    assert set(split.test_targets.items.tolist()) <= set(split.items.tolist())


def test_threshold_behaviour():
    ratings = np.array([5.0, 4.0, 3.5, 3.0, 1.0] * 4)
    users = np.repeat(np.arange(4), 5)
    items = np.tile(np.arange(5), 4)
    inter = Interactions(users=users, items=items, ratings=ratings, n_users=4, n_items=5)
    strict = heldout_users_split(inter, n_valid_users=1, n_test_users=1, min_ratings=2, seed=0)
    kept = np.concatenate([p.items for p in (strict.train, strict.valid_history, strict.valid_targets,
                                             strict.test_history, strict.test_targets)])
    assert set(kept.tolist()) == {0, 1}  # ratings > 3.5 only; 3.5 itself is not positive
    assert len(kept) == 8
    every = heldout_users_split(inter, n_valid_users=1, n_test_users=1, positive_threshold=None, seed=0)
    total = sum(len(p) for p in (every.train, every.valid_history, every.valid_targets,
                                 every.test_history, every.test_targets))
    assert total == 20
    assert np.all(every.train.ratings == 1.0)
    with pytest.raises(ConfigError):  # only users with >= 5 positives are eligible: none here
        heldout_users_split(inter, n_valid_users=1, n_test_users=1, seed=0)


def test_heldout_deterministic(ratings, heldout):
    again = heldout_users_split(ratings, n_valid_users=150, n_test_users=150, seed=1)
    assert np.array_equal(again.test_users, heldout.test_users)
    assert np.array_equal(keys(again.test_targets), keys(heldout.test_targets))
    other = heldout_users_split(ratings, n_valid_users=150, n_test_users=150, seed=2)
    assert not np.array_equal(other.test_users, heldout.test_users)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_valid_users": 10_000, "n_test_users": 1}, "n_valid_users"),
        ({"n_valid_users": 500, "n_test_users": 10_000}, "n_test_users"),
        ({"n_valid_users": -1, "n_test_users": 1}, "n_valid_users"),
        ({"n_valid_users": 1, "n_test_users": -1}, "n_test_users"),
        ({"n_valid_users": 1, "n_test_users": 1, "history_fraction": 1.0}, "history_fraction"),
        ({"n_valid_users": 1, "n_test_users": 1, "min_ratings": 1}, "min_ratings"),
        ({"n_valid_users": 1, "n_test_users": 1, "top_items_fraction": 0.0}, "top_items_fraction"),
    ],
)
def test_heldout_config_errors(ratings, kwargs, field):
    with pytest.raises(ConfigError) as info:
        heldout_users_split(ratings, **kwargs)
    assert info.value.field == field


def test_heldout_all_but_one_user_held_out(ratings):
    n_eligible = len(heldout_users_split(ratings, n_valid_users=1, n_test_users=1).train_users) + 2
    split = heldout_users_split(ratings, n_valid_users=n_eligible - 2, n_test_users=1)
    assert len(split.train_users) == 1
    with pytest.raises(ConfigError) as info:
        heldout_users_split(ratings, n_valid_users=n_eligible - 1, n_test_users=1)
    assert info.value.field == "n_test_users"
