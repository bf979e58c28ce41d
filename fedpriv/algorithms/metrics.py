"""Evaluation metrics: RMSE and Recall@k, each also sliced into equal-size item-frequency buckets.

Buckets: items sorted by their training count (ascending) are cut into ``n_buckets`` groups with
the same number of items; bucket 0 is the tail, the last bucket the head.
"""

from __future__ import annotations

import sys

import numpy as np


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """(rows, min(k, columns)) column indices of each row's k largest scores, best first; ties
    go to the lower column, so the lists are the same on every back end and match
    :meth:`fedpriv.run.model.Model.recommend`'s stable sort. torch's ``topk`` selects where this
    process has loaded torch (about 10x faster than numpy's ``argpartition`` on rows of 20,000
    scores), else numpy; both then settle the ties at the boundary by the rule."""
    scores = np.asarray(scores, dtype=np.float64)
    rows, n = scores.shape
    kk = min(k, n)
    if kk <= 0 or rows == 0:
        return np.zeros((rows, max(kk, 0)), dtype=np.int64)
    torch = sys.modules.get("torch")  # never imported here: a ClientApp stays light
    if torch is not None:
        top = torch.topk(torch.from_numpy(scores), kk, dim=1, sorted=False).indices.numpy()
    else:
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
    vals = np.take_along_axis(scores, top, axis=1)
    kth = vals.min(axis=1)
    n_above = (scores > kth[:, None]).sum(axis=1)
    n_tied = (scores == kth[:, None]).sum(axis=1)
    for r in np.flatnonzero(n_above + n_tied > kk):  # more tied scores than places: the lower columns
        row = scores[r]
        top[r] = np.concatenate([np.flatnonzero(row > kth[r]), np.flatnonzero(row == kth[r])[: kk - n_above[r]]])
    vals = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -vals), axis=1)
    return np.take_along_axis(top, order, axis=1).astype(np.int64)


def frequency_buckets(item_counts: np.ndarray, n_buckets: int = 5) -> np.ndarray:
    """Bucket index (0 = rarest) of every item."""
    order = np.argsort(item_counts, kind="stable")
    bucket = np.empty(len(item_counts), dtype=np.int64)
    for b, part in enumerate(np.array_split(order, n_buckets)):
        bucket[part] = b
    return bucket


def bucket_info(item_counts: np.ndarray, bucket: np.ndarray, b: int) -> dict:
    """The first columns of a sliced-metric row: bucket ``b``, its item count and item-count range."""
    c = item_counts[bucket == b]
    return {
        "bucket": b,
        "n_items": int(len(c)),
        "item_count_min": int(c.min()) if len(c) else 0,
        "item_count_max": int(c.max()) if len(c) else 0,
    }


def rmse(pred: np.ndarray, truth: np.ndarray) -> float:
    if len(truth) == 0:
        return float("nan")
    return float(np.sqrt(np.mean((np.asarray(pred, np.float64) - truth) ** 2)))


def sliced_rmse(
    pred: np.ndarray, truth: np.ndarray, items: np.ndarray, item_counts: np.ndarray, n_buckets: int = 5
) -> list[dict]:
    bucket = frequency_buckets(item_counts, n_buckets)
    out = []
    for b in range(n_buckets):
        sel = bucket[items] == b
        row = bucket_info(item_counts, bucket, b)
        row.update({"n_eval": int(sel.sum()), "rmse": rmse(pred[sel], truth[sel])})
        out.append(row)
    return out


def recall_at_k(
    scores_fn,
    users: np.ndarray,
    history: tuple[np.ndarray, np.ndarray],
    targets: tuple[np.ndarray, np.ndarray],
    item_counts: np.ndarray,
    k: int = 20,
    n_buckets: int = 5,
    chunk: int = 2048,
) -> tuple[float, list[dict]]:
    """Recall@k normalised by min(k, |targets|), history items excluded; and per bucket (targets
    restricted to the bucket, users with at least one such target).

    ``scores_fn(user_rows) -> (len(user_rows), n_items)`` scores; ``history``/``targets``: CSR
    (indptr, item indices) with one row per entry of ``users``.
    """
    bucket = frequency_buckets(item_counts, n_buckets)
    h_ptr, h_idx = history
    t_ptr, t_idx = targets
    total, n_users = 0.0, 0
    b_sum = np.zeros(n_buckets)
    b_n = np.zeros(n_buckets)
    for c0 in range(0, len(users), chunk):
        rows = np.arange(c0, min(c0 + chunk, len(users)))
        S = np.array(scores_fn(rows), dtype=np.float64, copy=True)
        for j, r in enumerate(rows):
            S[j, h_idx[h_ptr[r] : h_ptr[r + 1]]] = -np.inf
        top = top_k(S, k)
        for j, r in enumerate(rows):
            tgt = t_idx[t_ptr[r] : t_ptr[r + 1]]
            if len(tgt) == 0:
                continue
            hit = np.isin(tgt, top[j])
            total += hit.sum() / min(k, len(tgt))
            n_users += 1
            tb = bucket[tgt]
            for b in np.unique(tb):
                sel = tb == b
                b_sum[b] += hit[sel].sum() / min(k, sel.sum())
                b_n[b] += 1
    sliced = []
    for b in range(n_buckets):
        row = bucket_info(item_counts, bucket, b)
        row.update({"n_eval": int(b_n[b]), "recall": float(b_sum[b] / b_n[b]) if b_n[b] else float("nan")})
        sliced.append(row)
    return (total / n_users if n_users else float("nan")), sliced


def run_header(
    algorithm: str, spec, engine: str, seed: int, epsilon: float | None, delta: float, private: bool, protocol: str
) -> dict:
    """The first keys of every metrics.json (the CLI contract)."""
    return {
        "algorithm": algorithm,
        "dataset": str(spec),
        "engine": engine,
        "seed": seed,
        "epsilon": epsilon if private else None,
        "delta": delta if private else None,
        "private": private,
        "protocol": protocol,
    }
