"""Evaluation of released item embeddings: each evaluated user re-projects from its own history
(the same local solve as training, never released), then RMSE or Recall@k, sliced by item
frequency."""

from __future__ import annotations

import numpy as np

from . import metrics
from .algorithms import als
from .algorithms.shards import shard_users
from .data.interactions import Interactions


def predict_ratings(state: als.PublicState, history: Interactions, pairs: Interactions) -> np.ndarray:
    """Predicted ratings for the (user, item) pairs of ``pairs``, users solved from ``history``."""
    users = np.unique(pairs.users)
    U = als.client_user_vectors(shard_users(history, users), state)
    row = np.searchsorted(users, pairs.users)
    V = als.user_design(state).astype(np.float64)
    pred = state.mean + np.einsum("nd,nd->n", U[row], V[pairs.items])
    if state.item_bias is not None:
        pred = pred + state.item_bias[pairs.items]
    lo, hi = state.rating_range
    return np.clip(pred, lo, hi)


def evaluate_rmse(state: als.PublicState, history: Interactions, target: Interactions, item_counts: np.ndarray) -> tuple[float, list[dict]]:
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
    U = als.client_user_vectors(h, state)
    V = als.user_design(state).astype(np.float64)
    bias = state.item_bias if state.item_bias is not None else 0.0
    return metrics.recall_at_k(
        lambda rows: U[rows] @ V.T + bias,
        users,
        (h.indptr, h.items),
        (t.indptr, t.items),
        item_counts,
        k=k,
    )
