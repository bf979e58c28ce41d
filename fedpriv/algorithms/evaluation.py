"""Evaluation of released item embeddings: each evaluated user re-projects from its own history
(the same local solve as training, never released), then RMSE or Recall@k, sliced by item
frequency."""

from __future__ import annotations

import numpy as np

from . import metrics
from . import als
from .shards import shard_users, sub_shard
from ..data.interactions import Interactions


def _predict(state: als.PublicState, U: np.ndarray, rows: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Ratings predicted for solved user vectors ``U[rows]`` and ``items``, clipped to the range."""
    V = als.user_design(state).astype(np.float64)
    pred = state.mean + np.einsum("nd,nd->n", U[rows], V[items])
    if state.item_bias is not None:
        pred = pred + state.item_bias[items]
    return np.clip(pred, *state.rating_range)


def clipped_score_sum(state: als.PublicState, history: Interactions, valid: Interactions, clip: float) -> np.ndarray:
    """Private tuning's score contributions, summed: over the users with validation ratings,
    min(user's validation MSE, clip) (one user's term is at most ``clip``: the L2 sensitivity).
    Users solved from ``history``: the computation a node makes over its own users
    (:func:`shard_clipped_score_sum`), here over every user at once."""
    users = np.unique(valid.users)
    return shard_clipped_score_sum(state, shard_users(history, users), shard_users(valid, users), clip)


def shard_clipped_score_sum(state: als.PublicState, history, target, clip: float) -> np.ndarray:
    """:func:`clipped_score_sum` of one node's users (``history`` and ``target``: the
    :class:`~fedpriv.algorithms.shards.UserShard` of its training and validation ratings)."""
    if target.n_ratings == 0:
        return np.zeros(1)
    U = als.client_user_vectors(history, state)
    local = np.asarray(target.local_user_of_rating)
    se = (_predict(state, U, local, target.items) - target.ratings.astype(np.float64)) ** 2
    users, inv = np.unique(local, return_inverse=True)
    per_user = np.bincount(inv, weights=se, minlength=len(users)) / np.bincount(inv, minlength=len(users))
    return np.array([float(np.sum(np.minimum(per_user, clip)))])


def predict_ratings(state: als.PublicState, history: Interactions, pairs: Interactions) -> np.ndarray:
    """Predicted ratings for the (user, item) pairs of ``pairs``, users solved from ``history``."""
    users = np.unique(pairs.users)
    U = als.client_user_vectors(shard_users(history, users), state)
    return _predict(state, U, np.searchsorted(users, pairs.users), pairs.items)


def evaluate_rmse(
    state: als.PublicState, history: Interactions, target: Interactions, item_counts: np.ndarray
) -> tuple[float, list[dict]]:
    pred = predict_ratings(state, history, target)
    truth = target.ratings.astype(np.float64)
    return metrics.rmse(pred, truth), metrics.sliced_rmse(pred, truth, target.items, item_counts)


def evaluate_recall(
    state: als.PublicState,
    history: Interactions,
    targets: Interactions,
    users: np.ndarray,
    item_counts: np.ndarray,
    k: int = 20,
) -> tuple[float, list[dict]]:
    users = np.asarray(users, dtype=np.int64)
    h = shard_users(history, users)
    t = shard_users(targets, users)
    if (
        state.spec.ranker is not None
    ):  # an algorithm with a ranking of its own (topk, ease): its scores of the user's history
        everything = np.arange(state.n_items)

        def scores(rows):
            keep = np.zeros(h.n_users, dtype=bool)
            keep[rows] = True  # contiguous, increasing rows: sub_shard keeps their order
            return state.spec.ranker(sub_shard(h, keep), state, everything)
    else:
        U = als.client_user_vectors(h, state)
        V = als.user_design(state).astype(np.float64)
        bias = state.item_bias if state.item_bias is not None else 0.0

        def scores(rows):
            return U[rows] @ V.T + bias

    return metrics.recall_at_k(
        scores,
        users,
        (h.indptr, h.items),
        (t.indptr, t.items),
        item_counts,
        k=k,
    )


def shard_squared_errors(
    state: als.PublicState, history, target, item_bucket: np.ndarray, n_buckets: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bucket (sum of squared errors, count) of one node's target ratings, its users solved
    from their history (both :class:`~fedpriv.algorithms.shards.UserShard` of the same users)."""
    sse = np.zeros(n_buckets)
    cnt = np.zeros(n_buckets)
    if target.n_ratings == 0:
        return sse, cnt
    U = als.client_user_vectors(history, state)
    pred = _predict(state, U, target.local_user_of_rating, target.items)
    err2 = (pred - target.ratings.astype(np.float64)) ** 2
    bucket = item_bucket[target.items]
    return np.bincount(bucket, weights=err2, minlength=n_buckets), np.bincount(bucket, minlength=n_buckets).astype(
        float
    )


def rmse_from_sums(sse: np.ndarray, cnt: np.ndarray, item_counts: np.ndarray) -> tuple[float, list[dict]]:
    """Overall and sliced RMSE from per-bucket sums (same bucket rows as :func:`metrics.sliced_rmse`)."""
    bucket = metrics.frequency_buckets(item_counts, len(sse))
    sliced = []
    for b in range(len(sse)):
        row = metrics.bucket_info(item_counts, bucket, b)
        row.update({"n_eval": int(cnt[b]), "rmse": float(np.sqrt(sse[b] / cnt[b])) if cnt[b] else float("nan")})
        sliced.append(row)
    total = float(np.sqrt(sse.sum() / cnt.sum())) if cnt.sum() else float("nan")
    return total, sliced


# ---------------------------------------------------------------- logistic (am-ssp-convex)
def shard_logistic_sums(
    state: als.PublicState, history, target, item_bucket: np.ndarray, n_buckets: int = 5
) -> dict[str, np.ndarray]:
    """Per-bucket (log-loss sum, correct predictions, count) of one shard's binarised target
    ratings, its users solved from their history by the local logistic solve."""
    from . import ssp_client

    out = {k: np.zeros(n_buckets) for k in ("logloss", "correct", "n")}
    if target.n_ratings == 0:
        return out
    U, ubias = als.split_user_vectors(ssp_client.logistic_user_vectors(history, state), state)
    rows, items = target.local_user_of_rating, target.items
    z = ubias[rows] + np.einsum("nd,nd->n", U[rows], state.item_factors[items].astype(np.float64))
    if state.item_bias is not None:
        z = z + state.item_bias[items]
    y = ssp_client.labels(target, state)
    loss = np.logaddexp(0.0, z) - y * z  # -log sigmoid(z) for y=1, -log(1 - sigmoid(z)) for y=0
    bucket = item_bucket[items]
    out["logloss"] = np.bincount(bucket, weights=loss, minlength=n_buckets)
    out["correct"] = np.bincount(bucket, weights=((z > 0) == (y > 0.5)).astype(float), minlength=n_buckets)
    out["n"] = np.bincount(bucket, minlength=n_buckets).astype(float)
    return out


def logistic_from_sums(sums: dict[str, np.ndarray], item_counts: np.ndarray) -> tuple[float, float, list[dict]]:
    """(mean log-loss, accuracy, sliced rows) from per-bucket sums."""
    n_buckets = len(sums["n"])
    bucket = metrics.frequency_buckets(item_counts, n_buckets)
    sliced = []
    for b in range(n_buckets):
        row = metrics.bucket_info(item_counts, bucket, b)
        n = sums["n"][b]
        row.update(
            {
                "n_eval": int(n),
                "logloss": float(sums["logloss"][b] / n) if n else float("nan"),
                "accuracy": float(sums["correct"][b] / n) if n else float("nan"),
            }
        )
        sliced.append(row)
    n = sums["n"].sum()
    if not n:
        return float("nan"), float("nan"), sliced
    return float(sums["logloss"].sum() / n), float(sums["correct"].sum() / n), sliced


def evaluate_logistic(
    state: als.PublicState, history: Interactions, target: Interactions, item_counts: np.ndarray
) -> tuple[float, float, list[dict]]:
    users = np.unique(target.users)
    sums = shard_logistic_sums(
        state, shard_users(history, users), shard_users(target, users), metrics.frequency_buckets(item_counts)
    )
    return logistic_from_sums(sums, item_counts)


def eval_keys(logistic: bool) -> tuple[str, ...]:
    """The keys of a node's evaluation sums (each an array of 5 frequency buckets)."""
    return tuple(
        f"{p}_{k}" for p in ("valid", "test") for k in (("logloss", "correct", "n") if logistic else ("sse", "n"))
    )


def node_eval_sums(
    state: als.PublicState, history, valid, test, item_bucket: np.ndarray, logistic: bool
) -> dict[str, np.ndarray]:
    """One node's per-bucket evaluation sums on its validation and test ratings (:func:`eval_keys`):
    sent in plaintext in central mode, as a secure measurement sum in secure mode."""
    out = {}
    for part, target in (("valid", valid), ("test", test)):
        if logistic:
            out.update({f"{part}_{k}": v for k, v in shard_logistic_sums(state, history, target, item_bucket).items()})
        else:
            sse, cnt = shard_squared_errors(state, history, target, item_bucket)
            out[f"{part}_sse"], out[f"{part}_n"] = sse, cnt
    return out
