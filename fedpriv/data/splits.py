"""Train / validation / test splits of an :class:`Interactions` set.

* :func:`random_split` — ratings assigned at random (the ML-10M protocol).
* :func:`heldout_users_split` — strong generalization over held-out users, the ML-20M protocol
  of Liang et al., "Variational Autoencoders for Collaborative Filtering" (WWW 2018).

Every part keeps the id space (``n_users``, ``n_items``, raw ids) of the input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fedpriv.data.interactions import Interactions
from fedpriv.errors import ConfigError

_SUM_TOLERANCE = 1e-9


@dataclass
class RatingSplit:
    """Disjoint parts of one rating set that together hold all its ratings."""

    train: Interactions
    valid: Interactions
    test: Interactions


@dataclass
class HeldoutSplit:
    """Implicit positives (rating 1.0) split by users.

    ``train`` holds all positives of the training users; each held-out user's positives are
    split into ``*_history`` (the model's input) and ``*_targets`` (to be predicted). Only
    ``items`` (the items with a training positive) appear in any part.
    """

    train: Interactions
    valid_history: Interactions
    valid_targets: Interactions
    test_history: Interactions
    test_targets: Interactions
    train_users: np.ndarray  # sorted user ids
    valid_users: np.ndarray
    test_users: np.ndarray
    items: np.ndarray  # sorted ids of the items kept


def random_split(
    inter: Interactions, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 1234
) -> RatingSplit:
    """Assign each rating to train / valid / test at random, in the given proportions.

    Part sizes are ``floor(fraction * n)`` for train and valid (test takes the rest), so the
    split is exact, deterministic for a seed, and covers every rating exactly once.
    """
    _check_fractions(fractions)
    n = len(inter)
    order = np.random.default_rng(seed).permutation(n)
    n_train = int(math.floor(fractions[0] * n))
    n_valid = min(int(math.floor(fractions[1] * n)), n - n_train)
    parts = np.split(order, [n_train, n_train + n_valid])
    train, valid, test = (inter.subset(np.sort(p)) for p in parts)
    return RatingSplit(train=train, valid=valid, test=test)


def _check_fractions(fractions: tuple[float, float, float]) -> None:
    """Three non-negative fractions summing to 1."""
    if len(fractions) != 3:
        raise ConfigError(f"need three fractions (train, valid, test), got {fractions}", field="fractions")
    if min(fractions) < 0:
        raise ConfigError(f"must be non-negative, got {fractions}", field="fractions")
    if abs(sum(fractions) - 1.0) > _SUM_TOLERANCE:
        raise ConfigError(f"must sum to 1, got {fractions} (sum {sum(fractions)})", field="fractions")


def heldout_users_split(
    inter: Interactions,
    *,
    n_valid_users: int,
    n_test_users: int,
    positive_threshold: float | None = 3.5,
    min_ratings: int = 5,
    history_fraction: float = 0.8,
    top_items_fraction: float | None = None,
    seed: int = 98765,
) -> HeldoutSplit:
    """Split positives by user, as Liang et al. do for ML-20M.

    1. Positives are ratings ``> positive_threshold`` (every pair when it is None); they get
       rating 1.0. Users with fewer than ``min_ratings`` positives are dropped.
    2. ``n_valid_users`` and ``n_test_users`` disjoint users are drawn at random; all other
       kept users are training users, whose positives form ``train``.
    3. With ``top_items_fraction``, only that fraction of the training items, the most
       frequent in ``train``, is kept (ties broken by item id).
    4. Held-out positives on items absent from ``train`` are removed; then each held-out
       user's positives are split at random: ``floor((1 - history_fraction) * n)`` targets
       (at least 1, and at least one history item), the rest history. A held-out user left
       with a single positive keeps it as history (no target), as in Liang et al.
    """
    _check_heldout_args(n_valid_users, n_test_users, min_ratings, history_fraction, top_items_fraction)
    rng = np.random.default_rng(seed)
    positives = _positives(inter, positive_threshold)
    eligible = np.flatnonzero(positives.user_counts() >= min_ratings)
    _check_user_counts(n_valid_users, n_test_users, len(eligible))
    chosen = rng.permutation(eligible)
    valid_users = np.sort(chosen[:n_valid_users])
    test_users = np.sort(chosen[n_valid_users:n_valid_users + n_test_users])
    train_users = np.sort(chosen[n_valid_users + n_test_users:])
    train = positives.subset(np.isin(positives.users, train_users))
    items = _train_items(train, top_items_fraction)
    train = train.subset(np.isin(train.items, items))
    on_train_items = np.isin(positives.items, items)
    valid_history, valid_targets = _history_targets(
        rng, positives, on_train_items & np.isin(positives.users, valid_users), history_fraction
    )
    test_history, test_targets = _history_targets(
        rng, positives, on_train_items & np.isin(positives.users, test_users), history_fraction
    )
    return HeldoutSplit(
        train=train,
        valid_history=valid_history,
        valid_targets=valid_targets,
        test_history=test_history,
        test_targets=test_targets,
        train_users=train_users,
        valid_users=valid_users,
        test_users=test_users,
        items=items,
    )


def _check_heldout_args(
    n_valid_users: int,
    n_test_users: int,
    min_ratings: int,
    history_fraction: float,
    top_items_fraction: float | None,
) -> None:
    """Reject out-of-range settings of :func:`heldout_users_split`."""
    if n_valid_users < 0:
        raise ConfigError(f"must be >= 0, got {n_valid_users}", field="n_valid_users")
    if n_test_users < 0:
        raise ConfigError(f"must be >= 0, got {n_test_users}", field="n_test_users")
    if min_ratings < 2:
        raise ConfigError(f"must be >= 2 (one history and one target item), got {min_ratings}",
                          field="min_ratings")
    if not 0 < history_fraction < 1:
        raise ConfigError(f"must be in (0, 1), got {history_fraction}", field="history_fraction")
    if top_items_fraction is not None and not 0 < top_items_fraction <= 1:
        raise ConfigError(f"must be in (0, 1], got {top_items_fraction}", field="top_items_fraction")


def _check_user_counts(n_valid_users: int, n_test_users: int, n_eligible: int) -> None:
    """Held-out users must leave at least one training user."""
    if n_valid_users >= n_eligible:
        raise ConfigError(f"{n_valid_users} validation users leave no training user: only "
                          f"{n_eligible} users have enough positives", field="n_valid_users")
    if n_valid_users + n_test_users >= n_eligible:
        raise ConfigError(f"{n_valid_users} validation + {n_test_users} test users leave no "
                          f"training user: only {n_eligible} users have enough positives",
                          field="n_test_users")


def _positives(inter: Interactions, threshold: float | None) -> Interactions:
    """Pairs rated above ``threshold`` (all pairs when None), with rating 1.0."""
    keep = np.ones(len(inter), dtype=bool) if threshold is None else inter.ratings > threshold
    positives = inter.subset(keep)
    return replace(positives, ratings=np.ones(len(positives), dtype=np.float32))


def _train_items(train: Interactions, top_items_fraction: float | None) -> np.ndarray:
    """Sorted ids of the items in ``train``; only the most frequent fraction if one is given."""
    counts = train.item_counts()
    present = np.flatnonzero(counts)
    if top_items_fraction is None:
        return present
    n_keep = max(1, math.ceil(top_items_fraction * len(present)))
    by_count = present[np.argsort(-counts[present], kind="stable")]
    return np.sort(by_count[:n_keep])


def _history_targets(
    rng: np.random.Generator, positives: Interactions, mask: np.ndarray, history_fraction: float
) -> tuple[Interactions, Interactions]:
    """Split the selected positives of each user at random into history and targets."""
    index = np.flatnonzero(mask)
    users = positives.users[index]
    order = np.lexsort((rng.random(len(index)), users))  # by user, random within a user
    index, users = index[order], users[order]
    counts = np.bincount(users, minlength=positives.n_users)
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(index)) - starts[users]
    n_targets = _n_targets(counts, history_fraction)
    is_target = rank < n_targets[users]
    return positives.subset(np.sort(index[~is_target])), positives.subset(np.sort(index[is_target]))


def _n_targets(counts: np.ndarray, history_fraction: float) -> np.ndarray:
    """Targets per user: ``floor((1 - history_fraction) * n)`` clipped to ``[1, n - 1]``; 0 if n < 2."""
    raw = np.floor((1.0 - history_fraction) * counts + 1e-9).astype(np.int64)
    return np.where(counts < 2, 0, np.clip(raw, 1, np.maximum(counts - 1, 1)))
