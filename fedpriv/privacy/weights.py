"""Task-user weights that bound each user's budget: sum_i w_ij^2 <= beta for every user j.

- Adaptive weights (multitask paper, eq. 16 then eq. 12): omega_i ∝ n̂_i^(-mu) from private
  counts, normalised so that sum_i n̂_i omega_i^2 = n * beta_bar, then clipped per user.
- Sampling weights (DPALS, Chien et al. 2021): w = sqrt(beta / k) on k items kept per user,
  chosen uniformly at random or the k least popular (tail-biased).

All functions take rating arrays grouped by user (a CSR view) and return one weight per
rating in the CSR order. They depend only on public values (omega, counts released through the
ledger) and on the user's own items, so each user's clipping can run on its own client.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError


def adaptive_omega(
    counts_hat: np.ndarray, mu: float, n_users: int, beta: float, beta_bar_ratio: float = 1.0
) -> np.ndarray:
    """Eq. 16: omega_i = n̂_i^(-mu) / sqrt(sum_i' n̂_i'^(1 - 2 mu) / (n beta_bar)), beta_bar = ratio * beta.

    Noisy counts are floored at 1 (post-processing of the released counts).
    """
    if mu < 0:
        raise ConfigError(f"must be >= 0, got {mu}", field="mu")
    if not beta > 0 or not beta_bar_ratio > 0:
        raise ConfigError("beta and beta_bar_ratio must be > 0", field="beta")
    n_hat = np.maximum(np.asarray(counts_hat, dtype=np.float64), 1.0)
    beta_bar = beta * beta_bar_ratio
    norm = np.sqrt(np.sum(n_hat ** (1.0 - 2.0 * mu)) / (max(n_users, 1) * beta_bar))
    return n_hat ** (-mu) / norm


def _per_user_sum(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    counts = np.diff(indptr)
    out = np.zeros(len(counts), dtype=np.float64)
    rated = counts > 0
    if rated.any():  # reduceat over the non-empty users (an empty one would read its neighbour)
        out[rated] = np.add.reduceat(np.asarray(values, dtype=np.float64), indptr[:-1][rated])
    return out


def uniform_user_weights(indptr: np.ndarray, beta: float) -> np.ndarray:
    """w_ij = min(1, sqrt(beta / n_j)) on each of user j's n_j ratings: eq. 12 with omega = 1
    (:func:`clip_user_weights`, whose guard keeps sum_i w_ij^2 <= beta exactly)."""
    n_ratings = int(indptr[-1])
    return clip_user_weights(np.ones(n_ratings), np.arange(n_ratings), indptr, beta)


def clip_user_weights(
    omega: np.ndarray, items: np.ndarray, indptr: np.ndarray, beta: float, mode: str = "clip"
) -> np.ndarray:
    """Eq. 12: w_ij = omega_i * min(1, sqrt(beta / sum_{i' in user j} omega_i'^2)).

    ``mode="normalize"`` rescales every user to sum_i w_ij^2 = beta exactly (the reference code's
    per-user normalisation). ``items``/``indptr``: the user-grouped CSR of the user's items.
    """
    if mode not in ("clip", "normalize"):
        raise ConfigError(f"must be 'clip' or 'normalize', got {mode!r}", field="weight_mode")
    w = np.asarray(omega, dtype=np.float64)[items]
    sq = _per_user_sum(w * w, indptr)
    with np.errstate(divide="ignore"):
        factor = np.sqrt(beta / np.maximum(sq, 1e-300))
    if mode == "clip":
        factor = np.minimum(1.0, factor)
    w = w * np.repeat(factor, np.diff(indptr))
    # guard against rounding: the bound must hold exactly, whatever the data
    sq = _per_user_sum(w * w, indptr)
    over = sq > beta
    if over.any():
        w = w * np.repeat(np.where(over, np.sqrt(beta / np.maximum(sq, 1e-300)) * (1 - 1e-12), 1.0), np.diff(indptr))
    return w


def sampled_user_weights(
    key: np.ndarray,
    items: np.ndarray,
    indptr: np.ndarray,
    k: int,
    beta: float,
    *,
    mode: str,
    counts_hat: np.ndarray | None = None,
) -> np.ndarray:
    """DPALS sampling: keep at most ``k`` items per user, weight sqrt(beta / k) each.

    ``key``: one uniform per rating drawn by the rating's user from its own secret randomness
    (:func:`fedpriv.privacy.randomness.user_uniform`): never a function of public values or of
    dense ids; ``items``/``indptr``: the user-grouped CSR. ``mode="uniform"``: a uniformly random
    subset; ``mode="tail"``: the k items with the smallest released counts (ties broken at random).
    """
    if k < 1:
        raise ConfigError(f"must be >= 1, got {k}", field="k")
    key = np.asarray(key, dtype=np.float64)
    if mode == "tail":
        if counts_hat is None:
            raise ConfigError("tail-biased sampling needs released counts", field="counts")
        key = np.asarray(counts_hat, dtype=np.float64)[items] + key  # ties in counts broken at random
    elif mode != "uniform":
        raise ConfigError(f"must be 'uniform' or 'tail', got {mode!r}", field="sampling")
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    order = np.lexsort((key, rows))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order)) - indptr[rows[order]]
    return np.where(rank < k, np.sqrt(beta / k), 0.0)
