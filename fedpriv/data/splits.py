"""Train / validation / test splits of an :class:`Interactions` set.

* :func:`random_split` — ratings assigned at random (the ML-10M protocol).
* :func:`heldout_users_split` — strong generalization over held-out users, the ML-20M protocol
  of Liang et al., "Variational Autoencoders for Collaborative Filtering" (WWW 2018).

Every part keeps the id space (``n_users``, ``n_items``, raw ids) of the input.

Neighbour stability: the randomness is keyed by *raw* ids (:mod:`fedpriv.data.ids`), never by a
dense index or a shared random stream. A rating's part depends only on the seed and its (raw
user, raw item) pair, a user's held-out group only on the seed and its raw id, and a held-out
user's history / targets only on the seed and that user's own positives. So removing one user
(a neighbouring data set, renumbered densely) moves no other user's rating to another part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedpriv.data.ids import id_keys, mix_uniform, public_key
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
    split into ``*_history`` (the model's input) and ``*_targets`` (to be predicted).
    ``items`` is the whole item catalogue ``0..n_items-1``: no item is dropped (choosing items
    from the training counts would make the item set depend on private data).
    """

    train: Interactions
    valid_history: Interactions
    valid_targets: Interactions
    test_history: Interactions
    test_targets: Interactions
    train_users: np.ndarray  # sorted user ids
    valid_users: np.ndarray
    test_users: np.ndarray
    items: np.ndarray  # all item ids, np.arange(n_items)


def rating_uniforms(inter: Interactions, key: bytes) -> np.ndarray:
    """One uniform in [0, 1) per rating, a keyed function of its (raw user id, raw item id)."""
    user_keys = id_keys(key, "user", inter.user_ids)[inter.users]
    item_keys = id_keys(key, "item", inter.item_ids)[inter.items]
    return mix_uniform(user_keys, item_keys)


def random_split(
    inter: Interactions, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 1234
) -> RatingSplit:
    """Assign each rating to train / valid / test at random, in the given proportions.

    Each rating draws its own uniform ``u`` keyed by the seed and its (raw user id, raw item id):
    train when ``u < fractions[0]``, valid when ``u < fractions[0] + fractions[1]``, else test.
    So the split covers every rating exactly once, is deterministic for a seed, and a rating's
    part does not depend on the other ratings (removing a user moves nobody else's ratings).
    Part sizes are binomial: about ``fraction * n``, within a few ``sqrt(n f (1 - f))``.
    """
    _check_fractions(fractions)
    u = rating_uniforms(inter, public_key(seed, "split"))
    f_train, f_valid = float(fractions[0]), float(fractions[1])
    part = np.where(u < f_train, 0, np.where(u < f_train + f_valid, 1, 2))
    train, valid, test = (inter.subset(np.flatnonzero(part == k)) for k in range(3))
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
    valid_fraction: float,
    test_fraction: float,
    positive_threshold: float | None = 3.5,
    min_ratings: int = 5,
    history_fraction: float = 0.8,
    seed: int = 98765,
) -> HeldoutSplit:
    """Split positives by user, as Liang et al. do for ML-20M.

    1. Positives are ratings ``> positive_threshold`` (every pair when it is None); they get
       rating 1.0. Users with fewer than ``min_ratings`` positives are dropped.
    2. Each kept user draws a uniform ``u`` keyed by the seed and its raw id: a validation user
       when ``u < valid_fraction``, a test user when ``u < valid_fraction + test_fraction``,
       else a training user. All positives of the training users form ``train``. The group
       sizes are binomial (about the fractions of the kept users).
    3. Each held-out user's positives are ordered by a uniform keyed by the seed and the (raw
       user, raw item) pair; the first ``floor((1 - history_fraction) * n)`` (at least 1, and
       at least one history item) are targets, the rest history. A held-out user with a single
       positive keeps it as history (no target), as in Liang et al.

    Every item is kept (``items`` is the whole catalogue), including held-out positives on items
    no training user likes. A user's group and its history / targets depend only on the seed
    and that user's own ratings. Raises :class:`ConfigError` (naming the field) on bad settings
    or when no training user would remain.
    """
    _check_heldout_args(valid_fraction, test_fraction, min_ratings, history_fraction)
    positives = _positives(inter, positive_threshold)
    eligible = np.flatnonzero(positives.user_counts() >= min_ratings)
    u = mix_uniform(id_keys(public_key(seed, "heldout"), "user", inter.user_ids[eligible]))
    is_valid = u < valid_fraction
    is_test = ~is_valid & (u < valid_fraction + test_fraction)
    train_users = eligible[~is_valid & ~is_test]
    _check_train_users(len(train_users), len(eligible), int(is_valid.sum()), min_ratings)
    valid_users, test_users = eligible[is_valid], eligible[is_test]
    train = positives.subset(np.flatnonzero(np.isin(positives.users, train_users)))
    history_key = public_key(seed, "heldout-history")
    valid_history, valid_targets = _history_targets(
        history_key, positives, np.isin(positives.users, valid_users), history_fraction
    )
    test_history, test_targets = _history_targets(
        history_key, positives, np.isin(positives.users, test_users), history_fraction
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
        items=np.arange(inter.n_items),
    )


def _check_heldout_args(valid_fraction: float, test_fraction: float, min_ratings: int, history_fraction: float) -> None:
    """Reject out-of-range settings of :func:`heldout_users_split`."""
    for name, value in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
            raise ConfigError(f"must be a number in [0, 1), got {value!r}", field=name)
        if not 0 <= value < 1:
            raise ConfigError(f"must be in [0, 1), got {value}", field=name)
    if not valid_fraction + test_fraction < 1:
        raise ConfigError(
            f"valid_fraction + test_fraction must be < 1 (training users must remain), got "
            f"{valid_fraction} + {test_fraction}",
            field="test_fraction",
        )
    if min_ratings < 2:
        raise ConfigError(f"must be >= 2 (one history and one target item), got {min_ratings}", field="min_ratings")
    if not 0 < history_fraction < 1:
        raise ConfigError(f"must be in (0, 1), got {history_fraction}", field="history_fraction")


def _check_train_users(n_train: int, n_eligible: int, n_valid: int, min_ratings: int) -> None:
    """Held-out users must leave at least one training user."""
    if n_eligible == 0:
        raise ConfigError(f"no user has {min_ratings} positives, so no training user remains", field="min_ratings")
    if n_train == 0:
        field = "valid_fraction" if n_valid == n_eligible else "test_fraction"
        raise ConfigError(
            f"every one of the {n_eligible} users with enough positives is held out: no training user remains",
            field=field,
        )


def _positives(inter: Interactions, threshold: float | None) -> Interactions:
    """Pairs rated above ``threshold`` (all pairs when None), with rating 1.0."""
    keep = np.ones(len(inter), dtype=bool) if threshold is None else inter.ratings > threshold
    positives = inter.subset(keep)
    return replace(positives, ratings=np.ones(len(positives), dtype=np.float32))


def _history_targets(
    key: bytes, positives: Interactions, mask: np.ndarray, history_fraction: float
) -> tuple[Interactions, Interactions]:
    """Split the selected positives of each user into history and targets, in the order of a
    uniform keyed by (raw user id, raw item id)."""
    index = np.flatnonzero(mask)
    selected = positives.subset(index)
    users = selected.users
    order = np.lexsort((rating_uniforms(selected, key), users))  # by user, keyed order within
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
