"""Tests of the train / validation / test splits."""

from __future__ import annotations

import numpy as np
import pytest
from neighbour_data import synthetic_ratings

from fedpriv.data.interactions import Interactions, from_raw_ids
from fedpriv.data.splits import HeldoutSplit, heldout_users_split, random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.errors import ConfigError

SIGMAS = 5  # binomial part sizes are checked within this many standard deviations


@pytest.fixture(scope="module")
def ratings() -> Interactions:
    return make_mf(1_500, 400, 40_000, seed=7).interactions


def keys(inter: Interactions) -> np.ndarray:
    return inter.users.astype(np.int64) * inter.n_items + inter.items


def raw_pairs(inter: Interactions) -> set[tuple[int, int]]:
    """The (raw user id, raw item id) pairs of a part."""
    return set(zip(inter.user_ids[inter.users].tolist(), inter.item_ids[inter.items].tolist()))


def same_id_space(part: Interactions, full: Interactions) -> bool:
    return (part.n_users, part.n_items) == (full.n_users, full.n_items) and part.item_ids is full.item_ids


def near(count: int, n: int, fraction: float) -> bool:
    """``count`` is within SIGMAS binomial standard deviations of ``fraction * n``."""
    return abs(count - fraction * n) <= SIGMAS * np.sqrt(n * fraction * (1 - fraction)) + 1


@pytest.fixture(scope="module")
def neighbours() -> tuple[Interactions, Interactions, int]:
    """D (through from_raw_ids, raw user ids 1000, 1007, ...) and D' = D minus one raw user,
    renumbered densely by from_raw_ids again; and the removed raw user id."""
    raw_users, raw_items, values = synthetic_ratings(300, 80, 8_000, seed=11)
    catalogue = np.arange(1, 81)
    d, _ = from_raw_ids(raw_users, raw_items, values.astype(np.float32), item_universe=catalogue)
    gone = int(np.unique(raw_users)[37])
    keep = raw_users != gone
    d_prime, _ = from_raw_ids(
        raw_users[keep], raw_items[keep], values[keep].astype(np.float32), item_universe=catalogue
    )
    assert d_prime.n_users == d.n_users - 1 and not np.array_equal(d.user_ids[37:-1], d_prime.user_ids[37:])
    return d, d_prime, gone


# --- random_split ------------------------------------------------------------------------


def test_random_split_disjoint_and_complete(ratings):
    split = random_split(ratings)
    parts = (split.train, split.valid, split.test)
    all_keys = np.concatenate([keys(p) for p in parts])
    assert len(all_keys) == len(ratings) == len(np.unique(all_keys))  # every rating in exactly one part
    assert np.array_equal(np.sort(all_keys), np.sort(keys(ratings)))
    assert all(same_id_space(p, ratings) for p in parts)
    # each rating keeps its value
    full = dict(zip(keys(ratings).tolist(), ratings.ratings.tolist()))
    assert all(full[k] == r for k, r in zip(keys(split.test).tolist(), split.test.ratings.tolist()))


@pytest.mark.parametrize("fractions", [(0.8, 0.1, 0.1), (0.9, 0.0, 0.1), (0.5, 0.25, 0.25), (1.0, 0.0, 0.0)])
def test_random_split_fractions(ratings, fractions):
    split = random_split(ratings, fractions=fractions, seed=3)
    sizes = [len(split.train), len(split.valid), len(split.test)]
    assert sum(sizes) == len(ratings)
    assert all(near(size, len(ratings), f) for size, f in zip(sizes, fractions)), sizes
    assert all(size == 0 for size, f in zip(sizes, fractions) if f == 0)


def test_random_split_deterministic(ratings):
    a, b, c = random_split(ratings, seed=5), random_split(ratings, seed=5), random_split(ratings, seed=6)
    assert np.array_equal(keys(a.test), keys(b.test))
    assert np.array_equal(keys(a.train), keys(b.train))
    assert not np.array_equal(keys(a.test), keys(c.test))


def test_random_split_ignores_row_order(ratings):
    """A rating's part depends on its (raw user, raw item) pair only, not on its position."""
    order = np.random.default_rng(0).permutation(len(ratings))
    shuffled = ratings.subset(order)
    a, b = random_split(ratings, seed=5), random_split(shuffled, seed=5)
    for part_a, part_b in [(a.train, b.train), (a.valid, b.valid), (a.test, b.test)]:
        assert raw_pairs(part_a) == raw_pairs(part_b)


def test_random_split_stable_for_neighbours(neighbours):
    """Every rating of the remaining users is in the same part with or without the removed user."""
    d, d_prime, gone = neighbours
    a, b = random_split(d, seed=9), random_split(d_prime, seed=9)
    for part_a, part_b in [(a.train, b.train), (a.valid, b.valid), (a.test, b.test)]:
        assert {p for p in raw_pairs(part_a) if p[0] != gone} == raw_pairs(part_b)
    assert sum(len(p) for p in (b.train, b.valid, b.test)) == len(d_prime)


@pytest.mark.parametrize("fractions", [(0.8, 0.1, 0.2), (0.8, 0.2), (1.1, -0.1, 0.0)])
def test_random_split_rejects_bad_fractions(ratings, fractions):
    with pytest.raises(ConfigError) as info:
        random_split(ratings, fractions=fractions)
    assert info.value.field == "fractions"


# --- heldout_users_split -----------------------------------------------------------------


@pytest.fixture(scope="module")
def heldout(ratings):
    return heldout_users_split(ratings, valid_fraction=0.1, test_fraction=0.1, seed=1)


def positive_keys(inter: Interactions, threshold: float = 3.5) -> np.ndarray:
    return keys(inter)[inter.ratings > threshold]


def test_heldout_user_groups_disjoint(heldout, ratings):
    groups = [heldout.train_users, heldout.valid_users, heldout.test_users]
    n_kept = sum(len(g) for g in groups)
    assert near(len(heldout.valid_users), n_kept, 0.1) and near(len(heldout.test_users), n_kept, 0.1)
    assert len(np.unique(np.concatenate(groups))) == n_kept
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
    pos = ratings.subset(ratings.ratings > 3.5)
    for users, history, targets in [
        (heldout.valid_users, heldout.valid_history, heldout.valid_targets),
        (heldout.test_users, heldout.test_history, heldout.test_targets),
    ]:
        expected = keys(pos)[np.isin(pos.users, users)]  # every positive of the group, no item dropped
        got = np.concatenate([keys(history), keys(targets)])
        assert len(got) == len(np.unique(got))
        assert np.array_equal(np.sort(got), np.sort(expected))
        n_hist, n_targ = history.user_counts()[users], targets.user_counts()[users]
        n = n_hist + n_targ
        split_users = n >= 2
        assert np.all(n_targ[split_users] >= 1) and np.all(n_hist[split_users] >= 1)
        assert np.array_equal(n_targ[split_users], np.clip(n[split_users] // 5, 1, None))


def try_heldout(inter: Interactions, seed: int) -> HeldoutSplit | None:
    """The split with 30% validation and 30% test users, or None when no training user remains."""
    try:
        return heldout_users_split(inter, valid_fraction=0.3, test_fraction=0.3, seed=seed)
    except ConfigError:
        return None


def test_heldout_keeps_the_full_catalogue():
    """``items`` is every item; a held-out positive on an item no training user likes is kept."""
    users = np.repeat(np.arange(6), 5)
    items = np.tile(np.arange(5), 6)
    items[0] = 5  # only user 0 likes item 5
    inter = Interactions(users=users, items=items, ratings=np.full(30, 5.0), n_users=7, n_items=7)
    splits = (try_heldout(inter, seed) for seed in range(200))
    split = next(s for s in splits if s is not None and 0 in s.test_users)
    assert split.items.tolist() == list(range(7))  # items 5 (held out only) and 6 (unrated) kept
    assert 5 not in split.train.items
    held = np.concatenate([split.test_history.items[split.test_history.users == 0],
                           split.test_targets.items[split.test_targets.users == 0]])
    assert sorted(held.tolist()) == [1, 2, 3, 4, 5]


def test_threshold_behaviour():
    ratings = np.array([5.0, 4.0, 3.5, 3.0, 1.0] * 4)
    users = np.repeat(np.arange(4), 5)
    items = np.tile(np.arange(5), 4)
    inter = Interactions(users=users, items=items, ratings=ratings, n_users=4, n_items=5)
    strict = heldout_users_split(inter, valid_fraction=0.25, test_fraction=0.25, min_ratings=2, seed=0)
    kept = np.concatenate([p.items for p in (strict.train, strict.valid_history, strict.valid_targets,
                                             strict.test_history, strict.test_targets)])
    assert set(kept.tolist()) == {0, 1}  # ratings > 3.5 only; 3.5 itself is not positive
    assert len(kept) == 8
    every = heldout_users_split(inter, valid_fraction=0.25, test_fraction=0.25, positive_threshold=None, seed=0)
    total = sum(len(p) for p in (every.train, every.valid_history, every.valid_targets,
                                 every.test_history, every.test_targets))
    assert total == 20
    assert np.all(every.train.ratings == 1.0)
    with pytest.raises(ConfigError) as info:  # only users with >= 5 positives are eligible: none here
        heldout_users_split(inter, valid_fraction=0.25, test_fraction=0.25, seed=0)
    assert info.value.field == "min_ratings"


def test_heldout_deterministic(ratings, heldout):
    again = heldout_users_split(ratings, valid_fraction=0.1, test_fraction=0.1, seed=1)
    assert np.array_equal(again.test_users, heldout.test_users)
    assert np.array_equal(keys(again.test_targets), keys(heldout.test_targets))
    other = heldout_users_split(ratings, valid_fraction=0.1, test_fraction=0.1, seed=2)
    assert not np.array_equal(other.test_users, heldout.test_users)


def test_heldout_stable_for_neighbours(neighbours):
    """Removing one user changes no other user's group, history or targets, nor train."""
    d, d_prime, gone = neighbours
    a = heldout_users_split(d, valid_fraction=0.2, test_fraction=0.2, seed=4)
    b = heldout_users_split(d_prime, valid_fraction=0.2, test_fraction=0.2, seed=4)
    for users_a, users_b in [(a.train_users, b.train_users), (a.valid_users, b.valid_users),
                             (a.test_users, b.test_users)]:
        assert set(d.user_ids[users_a].tolist()) - {gone} == set(d_prime.user_ids[users_b].tolist())
    assert len(a.valid_users) > 10 and len(a.test_users) > 10 and len(a.train_users) > 10
    for part_a, part_b in [(a.train, b.train), (a.valid_history, b.valid_history),
                           (a.valid_targets, b.valid_targets), (a.test_history, b.test_history),
                           (a.test_targets, b.test_targets)]:
        assert {p for p in raw_pairs(part_a) if p[0] != gone} == raw_pairs(part_b)
    assert np.array_equal(d.item_ids[a.items], d_prime.item_ids[b.items])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"valid_fraction": -0.1, "test_fraction": 0.1}, "valid_fraction"),
        ({"valid_fraction": 1.0, "test_fraction": 0.0}, "valid_fraction"),
        ({"valid_fraction": 0.1, "test_fraction": -0.1}, "test_fraction"),
        ({"valid_fraction": 0.1, "test_fraction": 1.0}, "test_fraction"),
        ({"valid_fraction": 0.5, "test_fraction": 0.5}, "test_fraction"),
        ({"valid_fraction": float("nan"), "test_fraction": 0.1}, "valid_fraction"),
        ({"valid_fraction": "0.1", "test_fraction": 0.1}, "valid_fraction"),
        ({"valid_fraction": 0.1, "test_fraction": 0.1, "history_fraction": 1.0}, "history_fraction"),
        ({"valid_fraction": 0.1, "test_fraction": 0.1, "min_ratings": 1}, "min_ratings"),
    ],
)
def test_heldout_config_errors(ratings, kwargs, field):
    with pytest.raises(ConfigError) as info:
        heldout_users_split(ratings, **kwargs)
    assert info.value.field == field


def test_heldout_requires_a_training_user():
    """Fractions just under 1 can hold every user out: a ConfigError naming the fraction."""
    users = np.repeat(np.arange(3), 5)
    inter = Interactions(users=users, items=np.tile(np.arange(5), 3), ratings=np.full(15, 5.0), n_users=3, n_items=5)
    kwargs = {"valid_fraction": 0.5, "test_fraction": 0.49}
    outcomes = {}
    for seed in range(400):
        try:
            heldout_users_split(inter, seed=seed, **kwargs)
            outcomes.setdefault("ok", seed)
        except ConfigError as exc:
            outcomes.setdefault(exc.field, seed)
    assert set(outcomes) == {"ok", "valid_fraction", "test_fraction"}
    split = heldout_users_split(inter, seed=outcomes["ok"], **kwargs)
    assert len(split.train_users) >= 1
