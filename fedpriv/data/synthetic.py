"""Synthetic data sets with known ground truth.

* :func:`make_mf` — a MovieLens-like explicit-rating matrix: heavy-tailed item popularity and
  user activity, ratings from a low-rank model with biases, and public item features (genres,
  year bucket) correlated with the true item factors.
* :func:`make_multitask` — the linear-regression multi-task benchmark of Krichene et al.,
  "Multi-Task Differential Privacy Under Distribution Skew" (ICML 2023), Appendix C.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedpriv.data.features import ItemFeatures
from fedpriv.data.interactions import Interactions
from fedpriv.errors import ConfigError

GLOBAL_MEAN = 3.5
RATING_RANGE = (1.0, 5.0)
# Standard deviations of the three signal terms; their variances add up to ~1, about the
# rating variance of MovieLens.
_ITEM_BIAS_STD = 0.6
_USER_BIAS_STD = 0.45
_INTERACTION_STD = 0.66
_MIN_RATINGS_PER_USER = 5
_GENRES_PER_ITEM = 2.0  # expected number of genres per item
_CHUNK = 1 << 20  # ratings computed per chunk
_MAX_DRAW = 1 << 25  # pairs drawn per sampling round
_LOW_YIELD = 0.1  # below this share of new pairs per round, mix in uniform draws


@dataclass
class SyntheticMF:
    """A synthetic rating data set and the ground truth it was drawn from.

    ``rating = global_mean + user_bias[u] + item_bias[i] + <user_factors[u], item_factors[i]>
    + noise``, clipped to ``rating_range``.
    """

    interactions: Interactions
    item_features: ItemFeatures
    user_factors: np.ndarray  # float32, (n_users, rank)
    item_factors: np.ndarray  # float32, (n_items, rank)
    user_bias: np.ndarray  # float32, (n_users,)
    item_bias: np.ndarray  # float32, (n_items,)
    global_mean: float = GLOBAL_MEAN
    rating_range: tuple[float, float] = RATING_RANGE


def make_mf(
    users: int,
    items: int,
    ratings: int,
    *,
    rank: int = 10,
    skew: float = 1.0,
    user_skew: float = 0.5,
    noise: float = 0.5,
    seed: int = 0,
    n_genres: int = 18,
    n_year_buckets: int = 10,
    select: float = 0.0,
) -> SyntheticMF:
    """Build a MovieLens-like rating matrix with exactly ``ratings`` distinct (user, item) pairs.

    Item popularity follows ``p_i ∝ rank_i^(-skew)`` and user activity ``w_u ∝ rank_u^(-user_skew)``
    over random orderings (0 = uniform). Pairs are the distinct pairs of draws from ``w x p``
    (popular items saturate naturally, as no item can have more than ``users`` raters); every
    user first gets ``min(5, ratings // users)`` items drawn by popularity.

    The id spaces are fixed by the arguments, not by the ratings: exactly ``users`` users and
    ``items`` items (an item without ratings is still an item), raw ids ``0..users-1`` and
    ``0..items-1`` equal to the dense ids (``meta["catalogue"] == "metadata"``).

    Item features: ``n_genres`` multi-hot genres (about 2 per item, at least 1) and
    ``n_year_buckets`` one-hot year buckets, thresholds / quantiles of random projections of
    the true item factors. Raises :class:`ConfigError` (naming the field) on impossible input,
    e.g. ``ratings`` outside ``[users, users * items]``.

    ``select`` (default 0: which items a user rates depends on popularity and activity alone):
    with ``select > 0`` what a user rates depends on their preferences too, as in real data
    (people mostly watch what they expect to like): about twice the pairs are drawn from
    activity x popularity, and the extras dropped are chosen with weights
    ``exp(-select * a_ui)``, ``a_ui`` the standardized true affinity
    ``<user_factors[u], item_factors[i]> + item_bias[i]`` (the first pairs of every user kept).
    """
    _check_mf_args(users, items, ratings, rank, skew, user_skew, noise, n_genres, n_year_buckets)
    _require(select >= 0 and np.isfinite(select), f"must be a finite number >= 0, got {select}", "select")
    pair_rng, truth_rng, feature_rng, noise_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    user_factors, item_factors, user_bias, item_bias = _ground_truth(truth_rng, users, items, rank)
    affinity = None
    if select > 0:

        def affinity(keys: np.ndarray) -> np.ndarray:
            return _affinity(keys, items, user_factors, item_factors, item_bias)

    keys = _sample_pairs(pair_rng, users, items, ratings, skew, user_skew, affinity=affinity, select=select)
    user_idx = keys // items
    item_idx = keys - user_idx * items
    del keys
    values = _ratings(noise_rng, user_idx, item_idx, user_factors, item_factors, user_bias, item_bias, noise)
    inter = Interactions(
        users=user_idx,
        items=item_idx,
        ratings=values,
        n_users=users,
        n_items=items,
        user_ids=np.arange(users, dtype=np.int64),
        item_ids=np.arange(items, dtype=np.int64),
        name="synthetic-mf",
        meta={
            "generator": "make_mf",
            "rank": rank,
            "skew": skew,
            "user_skew": user_skew,
            "noise": noise,
            "seed": seed,
            "catalogue": "metadata",
            **({"select": select} if select else {}),
        },
    )
    return SyntheticMF(
        interactions=inter,
        item_features=_item_features(feature_rng, item_factors, n_genres, n_year_buckets),
        user_factors=user_factors,
        item_factors=item_factors,
        user_bias=user_bias,
        item_bias=item_bias,
    )


def _require(ok: bool, message: str, field: str) -> None:
    """Raise :class:`ConfigError` naming ``field`` unless ``ok``."""
    if not ok:
        raise ConfigError(message, field=field)


def _check_mf_args(
    users: int,
    items: int,
    ratings: int,
    rank: int,
    skew: float,
    user_skew: float,
    noise: float,
    n_genres: int,
    n_year_buckets: int,
) -> None:
    """Reject impossible :func:`make_mf` settings."""
    _require(users >= 1, f"must be >= 1, got {users}", "users")
    _require(items >= 1, f"must be >= 1, got {items}", "items")
    _require(ratings >= users, f"must be >= users ({users}) so every user has a rating, got {ratings}", "ratings")
    _require(
        ratings <= users * items,
        f"at most users * items = {users * items} distinct pairs exist, got {ratings}",
        "ratings",
    )
    _require(rank >= 1, f"must be >= 1, got {rank}", "rank")
    _require(skew >= 0, f"must be >= 0, got {skew}", "skew")
    _require(user_skew >= 0, f"must be >= 0, got {user_skew}", "user_skew")
    _require(noise >= 0, f"must be >= 0, got {noise}", "noise")
    _require(n_genres >= 1, f"must be >= 1, got {n_genres}", "n_genres")
    _require(n_year_buckets >= 1, f"must be >= 1, got {n_year_buckets}", "n_year_buckets")


# --- pair sampling -------------------------------------------------------------------------


def _power_law(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Probabilities ``p ∝ rank^(-exponent)``, ranks assigned by a random permutation."""
    weights = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    return weights[rng.permutation(n)] / weights.sum()


def _mix_uniform(p: np.ndarray, uniform_share: float) -> np.ndarray:
    """The mixture ``(1 - uniform_share) * p + uniform_share * uniform``."""
    return (1.0 - uniform_share) * p + uniform_share / len(p)


def _draw_sorted(rng: np.random.Generator, p: np.ndarray, size: int) -> np.ndarray:
    """``size`` i.i.d. draws from ``p``, in increasing order (multinomial counts, repeated)."""
    return np.repeat(np.arange(len(p), dtype=np.int64), rng.multinomial(size, p))


def _draw(rng: np.random.Generator, p: np.ndarray, size: int) -> np.ndarray:
    """``size`` i.i.d. draws from ``p``, in random order."""
    return rng.permutation(_draw_sorted(rng, p, size))


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort based: much faster than ``np.unique`` on large int64)."""
    keys = np.sort(keys)
    keep = np.empty(len(keys), dtype=bool)
    keep[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _more_uniform(uniform_share: float) -> float:
    """Next uniform share after a low-yield round (0 -> 0.1 -> 0.2 -> 0.4 -> 0.8 -> 1)."""
    return min(1.0, max(0.1, 2 * uniform_share))


def _sample_pairs(
    rng: np.random.Generator,
    users: int,
    items: int,
    ratings: int,
    skew: float,
    user_skew: float,
    *,
    affinity=None,
    select: float = 0.0,
) -> np.ndarray:
    """Sorted int64 keys ``u * items + i`` of exactly ``ratings`` distinct pairs (with
    ``affinity``: twice as many drawn, the extras dropped by low affinity, see :func:`make_mf`)."""
    user_p = _power_law(rng, users, user_skew)
    item_p = _power_law(rng, items, skew)
    per_user = min(_MIN_RATINGS_PER_USER, ratings // users, items)
    base = _base_pairs(rng, users, items, per_user, item_p)
    if affinity is None:
        taken = _fill_pairs(rng, items, ratings, user_p, item_p, base)
        return _drop_random_extras(rng, taken, len(taken) - ratings, base)
    drawn = min(2 * ratings, (users * items + ratings) // 2) if 2 * ratings <= users * items else ratings
    taken = _fill_pairs(rng, items, drawn, user_p, item_p, base)
    return _drop_by_affinity(rng, taken, len(taken) - ratings, base, affinity(taken), select)


def _affinity(keys: np.ndarray, items: int, user_factors, item_factors, item_bias) -> np.ndarray:
    """Standardized true affinity of the pairs ``keys`` (in chunks)."""
    out = np.empty(len(keys), dtype=np.float64)
    for start in range(0, len(keys), _CHUNK):
        k = keys[start : start + _CHUNK]
        u, i = k // items, k % items
        out[start : start + len(k)] = np.einsum("ij,ij->i", user_factors[u], item_factors[i]) + item_bias[i]
    return (out - out.mean()) / max(out.std(), 1e-12)


def _drop_by_affinity(
    rng: np.random.Generator, keys: np.ndarray, count: int, base: np.ndarray, affinity: np.ndarray, select: float
) -> np.ndarray:
    """Remove ``count`` keys not in ``base``, drawn without replacement with weights
    ``exp(-select * affinity)`` (Efraimidis-Spirakis keys)."""
    if count <= 0:
        return keys
    pos = np.minimum(np.searchsorted(base, keys), len(base) - 1)
    extras = np.flatnonzero(base[pos] != keys)
    log_key = np.log(rng.random(len(extras))) * np.exp(select * affinity[extras])  # log(u) / w, w = exp(-select a)
    drop = extras[np.argpartition(-log_key, count - 1)[:count]]
    keep = np.ones(len(keys), dtype=bool)
    keep[drop] = False
    return keys[keep]


def _base_pairs(rng: np.random.Generator, users: int, items: int, per_user: int, item_p: np.ndarray) -> np.ndarray:
    """Sorted keys giving every user exactly ``per_user`` distinct items drawn by popularity."""
    keys = np.empty(0, dtype=np.int64)
    need = np.full(users, per_user, dtype=np.int64)
    uniform_share = 0.0
    while (missing := int(need.sum())) > 0:
        draw_users = np.repeat(np.arange(users, dtype=np.int64), 2 * need)
        drawn = draw_users * items + _draw(rng, _mix_uniform(item_p, uniform_share), len(draw_users))
        keys = _sorted_unique(np.concatenate([keys, drawn]))
        need = np.maximum(per_user - np.bincount(keys // items, minlength=users), 0)
        if missing - need.sum() < _LOW_YIELD * len(drawn):
            uniform_share = _more_uniform(uniform_share)
    return _trim_per_user(rng, keys, items, per_user)


def _trim_per_user(rng: np.random.Generator, keys: np.ndarray, items: int, per_user: int) -> np.ndarray:
    """Keep a random ``per_user`` of each user's keys; returns sorted keys."""
    keys = keys[rng.permutation(len(keys))]
    owner = keys // items
    order = np.argsort(owner, kind="stable")
    owner = owner[order]
    within = np.arange(len(owner)) - np.searchsorted(owner, owner, side="left")
    return np.sort(keys[order][within < per_user])


def _fill_pairs(
    rng: np.random.Generator,
    items: int,
    ratings: int,
    user_p: np.ndarray,
    item_p: np.ndarray,
    base: np.ndarray,
) -> np.ndarray:
    """Sorted keys: ``base`` plus distinct pairs drawn from activity x popularity, >= ``ratings``.

    Each round draws enough pairs to cover the deficit at the last round's yield of new pairs.
    When the yield collapses (the likely pairs are taken), draws are mixed with uniform ones;
    once even uniform draws hit mostly taken pairs (a nearly full matrix) the remaining free
    pairs are enumerated. So the loop always terminates.
    """
    n_pairs = len(user_p) * items
    taken = base
    yield_rate, uniform_share = 0.75, 0.0
    while (deficit := ratings - len(taken)) > 0:
        if uniform_share == 1.0 and yield_rate < _LOW_YIELD and n_pairs <= 2 * ratings:
            return _add_free_pairs(rng, n_pairs, deficit, taken)
        size = min(int(1.2 * deficit / max(yield_rate, _LOW_YIELD)) + 1024, _MAX_DRAW)
        drawn = _draw_sorted(rng, _mix_uniform(user_p, uniform_share), size) * items
        drawn += _draw(rng, _mix_uniform(item_p, uniform_share), size)
        before = len(taken)
        taken = _sorted_unique(np.concatenate([taken, drawn]))
        yield_rate = (len(taken) - before) / size
        if yield_rate < _LOW_YIELD:
            uniform_share = _more_uniform(uniform_share)
    return taken


def _add_free_pairs(rng: np.random.Generator, n_pairs: int, count: int, taken: np.ndarray) -> np.ndarray:
    """``taken`` plus ``count`` random pairs not in it (enumerates all ``n_pairs`` pairs)."""
    free = np.ones(n_pairs, dtype=bool)
    free[taken] = False
    picked = rng.choice(np.flatnonzero(free), size=count, replace=False)
    return np.sort(np.concatenate([taken, picked]))


def _drop_random_extras(rng: np.random.Generator, keys: np.ndarray, count: int, base: np.ndarray) -> np.ndarray:
    """Remove ``count`` random keys of the sorted ``keys`` that are not in the sorted ``base``."""
    if count == 0:
        return keys
    pos = np.minimum(np.searchsorted(base, keys), len(base) - 1)
    extras = np.flatnonzero(base[pos] != keys)
    keep = np.ones(len(keys), dtype=bool)
    keep[rng.choice(extras, size=count, replace=False, shuffle=False)] = False
    return keys[keep]


# --- ratings and features -------------------------------------------------------------------


def _ground_truth(
    rng: np.random.Generator, users: int, items: int, rank: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """User/item factors (``<U_u, V_i>`` has std ``_INTERACTION_STD``) and biases, float32."""
    scale = (_INTERACTION_STD**2 / rank) ** 0.25
    user_factors = (scale * rng.standard_normal((users, rank))).astype(np.float32)
    item_factors = (scale * rng.standard_normal((items, rank))).astype(np.float32)
    user_bias = (_USER_BIAS_STD * rng.standard_normal(users)).astype(np.float32)
    item_bias = (_ITEM_BIAS_STD * rng.standard_normal(items)).astype(np.float32)
    return user_factors, item_factors, user_bias, item_bias


def _ratings(
    rng: np.random.Generator,
    user_idx: np.ndarray,
    item_idx: np.ndarray,
    user_factors: np.ndarray,
    item_factors: np.ndarray,
    user_bias: np.ndarray,
    item_bias: np.ndarray,
    noise: float,
) -> np.ndarray:
    """Noisy, clipped model ratings for the given pairs (float32), computed in chunks."""
    out = np.empty(len(user_idx), dtype=np.float32)
    for start in range(0, len(out), _CHUNK):
        u = user_idx[start : start + _CHUNK]
        i = item_idx[start : start + _CHUNK]
        value = np.einsum("ij,ij->i", user_factors[u], item_factors[i])
        value += GLOBAL_MEAN + user_bias[u] + item_bias[i]
        value += np.float32(noise) * rng.standard_normal(len(u), dtype=np.float32)
        out[start : start + len(u)] = value
    return np.clip(out, *RATING_RANGE, out=out)


def _item_features(
    rng: np.random.Generator, item_factors: np.ndarray, n_genres: int, n_year_buckets: int
) -> ItemFeatures:
    """Multi-hot genres and a one-hot year bucket, both projections of the item factors."""
    genres = _genres(rng, item_factors, n_genres)
    year = _year_bucket(rng, item_factors, n_year_buckets)
    n_items = len(item_factors)
    rows = np.concatenate([np.nonzero(genres)[0], np.arange(n_items)])
    cols = np.concatenate([np.nonzero(genres)[1], n_genres + year])
    matrix = sp.csr_matrix(
        (np.ones(len(rows), dtype=np.float32), (rows, cols)),
        shape=(n_items, n_genres + n_year_buckets),
    )
    matrix.sort_indices()
    columns = [f"genre=g{g:02d}" for g in range(n_genres)]
    columns += [f"year=q{b:02d}" for b in range(n_year_buckets)]
    fields = {"genre": slice(0, n_genres), "year": slice(n_genres, n_genres + n_year_buckets)}
    return ItemFeatures(matrix=matrix, fields=fields, columns=columns)


def _genres(rng: np.random.Generator, item_factors: np.ndarray, n_genres: int) -> np.ndarray:
    """Boolean (n_items, n_genres): genre ``g`` when projection ``g`` is in its top quantile.

    The quantile gives ``_GENRES_PER_ITEM`` genres per item on average; an item with none
    gets the genre of its largest projection, so each item has at least one.
    """
    proj = item_factors.astype(np.float64) @ rng.standard_normal((item_factors.shape[1], n_genres))
    share = min(_GENRES_PER_ITEM / n_genres, 0.5)
    genres = proj > np.quantile(proj, 1.0 - share, axis=0)
    none = ~genres.any(axis=1)
    genres[none, np.argmax(proj[none], axis=1)] = True
    return genres


def _year_bucket(rng: np.random.Generator, item_factors: np.ndarray, n_buckets: int) -> np.ndarray:
    """Quantile bucket (0..n_buckets-1) of a random projection of the item factors."""
    proj = item_factors.astype(np.float64) @ rng.standard_normal(item_factors.shape[1])
    edges = np.quantile(proj, np.linspace(0.0, 1.0, n_buckets + 1)[1:-1])
    return np.searchsorted(edges, proj, side="right")


# --- multi-task linear regression ------------------------------------------------------------

_TRAIN_FRACTION = 0.8


@dataclass
class SyntheticMultiTask:
    """Observations ``(task, user, y)`` with ``y = <x[user], theta[task]> + N(0, noise^2)``.

    ``x[j]`` is user ``j``'s vector (the features of all its samples); ``q`` is the normalized
    task weight vector (sums to ``tasks_per_user``; inclusion probability is ``min(q, 1)``);
    ``train_mask`` selects a random 80% of the observations.
    """

    tasks: np.ndarray  # int32, (N,)
    users: np.ndarray  # int32, (N,)
    y: np.ndarray  # float64, (N,)
    x: np.ndarray  # float64, (n, d)
    theta: np.ndarray  # float64, (m, d)
    q: np.ndarray  # float64, (m,)
    train_mask: np.ndarray  # bool, (N,)

    @property
    def test_mask(self) -> np.ndarray:
        """Complement of ``train_mask``."""
        return ~self.train_mask

    def split(self, seed: int) -> np.ndarray:
        """A fresh random 80/20 train mask over the observations."""
        return _train_mask(np.random.default_rng(seed), len(self.y))


def make_multitask(
    m: int = 100,
    d: int = 5,
    n: int = 10_000,
    a: float = 1.0,
    tasks_per_user: float = 20,
    noise: float = 1e-3,
    seed: int = 0,
) -> SyntheticMultiTask:
    """The synthetic benchmark of Krichene et al. (ICML 2023), Appendix C.

    ``theta_i`` and ``u_j`` are N(0, I_d) projected to the unit ball; ``q_i`` has pdf
    ``a x^(a-1)`` on [0, 1], normalized to sum to ``tasks_per_user``; user ``j`` contributes to
    task ``i`` with probability ``min(q_i, 1)``, with sample ``(u_j, <u_j, theta_i> + N(0, noise^2))``.
    """
    _check_multitask_args(m, d, n, a, tasks_per_user, noise)
    rng = np.random.default_rng(seed)
    theta = _unit_ball(rng.standard_normal((m, d)))
    x = _unit_ball(rng.standard_normal((n, d)))
    q = rng.power(a, size=m)
    q *= tasks_per_user / q.sum()
    users, tasks = np.nonzero(rng.random((n, m)) < np.minimum(q, 1.0))
    y = np.einsum("ij,ij->i", x[users], theta[tasks]) + noise * rng.standard_normal(len(users))
    return SyntheticMultiTask(
        tasks=tasks.astype(np.int32),
        users=users.astype(np.int32),
        y=y,
        x=x,
        theta=theta,
        q=q,
        train_mask=_train_mask(rng, len(y)),
    )


def _check_multitask_args(m: int, d: int, n: int, a: float, tasks_per_user: float, noise: float) -> None:
    """Reject impossible :func:`make_multitask` settings."""
    _require(m >= 1, f"must be >= 1, got {m}", "m")
    _require(d >= 1, f"must be >= 1, got {d}", "d")
    _require(n >= 1, f"must be >= 1, got {n}", "n")
    _require(a > 0, f"must be > 0, got {a}", "a")
    _require(0 < tasks_per_user <= m, f"must be in (0, m={m}], got {tasks_per_user}", "tasks_per_user")
    _require(noise >= 0, f"must be >= 0, got {noise}", "noise")


def _unit_ball(v: np.ndarray) -> np.ndarray:
    """Project each row onto the unit ball."""
    return v / np.maximum(1.0, np.linalg.norm(v, axis=1, keepdims=True))


def _train_mask(rng: np.random.Generator, size: int) -> np.ndarray:
    """A mask selecting a random ``floor(0.8 * size)`` of ``size`` positions."""
    mask = np.zeros(size, dtype=bool)
    mask[rng.permutation(size)[: int(_TRAIN_FRACTION * size)]] = True
    return mask
