"""The client side of the encoder family (AM-SSP, AM-SSP-convex) in numpy: the broadcast item
embeddings, the local user solves and the per-item statistics. No torch: a ClientApp imports this
module, never :mod:`fedpriv.algorithms.ssp` (the encoder server), for these steps."""

from __future__ import annotations

import numpy as np

from . import als
from .kernels import segment_stats, solve_spd
from .options import ConvexOptions, of
from .shards import UserShard


def item_outputs(state: als.PublicState) -> np.ndarray:
    """The broadcast item embeddings as encoder outputs e_j = [v_j, bias_j / kappa]."""
    E = state.item_factors.astype(np.float64)
    if als.item_bias_coordinate(state.config):
        kappa = als.bias_coordinate(state)
        E = np.hstack([E, (state.item_bias / kappa)[:, None]])
    return E


def labels(shard: UserShard, state: als.PublicState) -> np.ndarray:
    return (shard.ratings >= of(state.config, ConvexOptions).convex_threshold).astype(np.float64)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def logistic_user_vectors(shard: UserShard, state: als.PublicState) -> np.ndarray:
    """Each user's regularised logistic regression on its binarised ratings (Newton steps,
    local; never released). Columns as :func:`als.client_user_vectors`."""
    cfg = state.config
    V = als.user_design(state).astype(np.float64)
    d = V.shape[1]
    ib = state.item_bias if state.item_bias is not None else np.zeros(state.n_items)
    y = labels(shard, state)
    rows, items = shard.local_user_of_rating, shard.items
    n = np.diff(shard.indptr).astype(np.float64)
    reg = cfg.reg_user * (np.maximum(n, 1.0) if cfg.weighted_reg else 1.0)
    U = np.zeros((shard.n_users, d))
    Vr = V[items]
    for _ in range(of(cfg, ConvexOptions).newton_steps):
        p = _sigmoid(np.einsum("nd,nd->n", U[rows], Vr) + ib[items])
        H = segment_stats(V, items, shard.indptr, weights=p * (1 - p)).A
        grad = np.zeros((shard.n_users, d))
        np.add.at(grad, rows, (y - p)[:, None] * Vr)
        grad -= reg[:, None] * U if np.ndim(reg) else reg * U
        U = U + solve_spd(H, grad, reg)
    return U


def client_convex_stats(shard: UserShard, state: als.PublicState) -> als.ItemStats:
    """Local logistic user solve, then H_j = sum w p(1-p) x x^T and g_j = sum w (p - y) x at the
    broadcast item embeddings (x: the clipped released user vector)."""
    U, ubias = als.split_user_vectors(logistic_user_vectors(shard, state), state)
    X = als.released_user_vectors(U, state)
    E0 = item_outputs(state)
    rows, items = shard.local_user_of_rating, shard.items
    p = _sigmoid(ubias[rows] + np.einsum("nd,nd->n", X[rows], E0[items]))
    w = als.client_rating_weights(shard, state)
    order = shard.by_item_order
    item_ids, indptr = shard.item_groups
    H = segment_stats(X, shard.by_item_local_users, indptr, weights=w * p * (1 - p), order=order).A
    g = segment_stats(X, shard.by_item_local_users, indptr, weights=w, targets=p - labels(shard, state), order=order).b
    return als.ItemStats(item_ids=item_ids.astype(np.int64), A=H, b=g)
