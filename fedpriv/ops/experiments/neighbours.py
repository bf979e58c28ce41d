"""Item nearest neighbours by cosine similarity of item embeddings, and their overlap with a
reference model's neighbours by item-frequency bucket (the multi-task paper's Figure 10)."""

from __future__ import annotations

import numpy as np


def neighbours(V: np.ndarray, k: int, chunk: int = 2048) -> np.ndarray:
    """(n_items, k) indices of each item's k most cosine-similar other items, most similar first."""
    V = np.asarray(V, dtype=np.float64)
    n = V.shape[0]
    k = min(k, n - 1)
    norm = np.linalg.norm(V, axis=1, keepdims=True)
    U = np.divide(V, norm, out=np.zeros_like(V), where=norm > 0)
    out = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk))
        sim = U[rows] @ U.T
        sim[np.arange(len(rows)), rows] = -np.inf  # not its own neighbour
        top = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sim, top, axis=1), axis=1, kind="stable")
        out[rows] = np.take_along_axis(top, order, axis=1)
    return out


def overlap_per_item(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|N_a(i) ∩ N_b(i)| / k for every item i (both (n, k) neighbour lists)."""
    return (a[:, :, None] == b[:, None, :]).any(axis=2).mean(axis=1)


def overlap_by_bucket(a: np.ndarray, b: np.ndarray, buckets: np.ndarray, n_buckets: int = 5) -> list[float]:
    per = overlap_per_item(a, b)
    return [float(per[buckets == q].mean()) if np.any(buckets == q) else float("nan") for q in range(n_buckets)]
