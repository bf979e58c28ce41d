"""Federated DP-SGD baseline (user-level DP-FedAvg) on the item parameters.

Each round:

- client: every user joins with probability ``sgd_sampling_rate`` (Poisson sampling: each user
  flips its own coin from its secret key, :mod:`fedpriv.privacy.randomness`; nobody else can
  tell who was sampled, and the sample is never published). A sampled user solves its own vector from the current
  item parameters (as in ALS; never sent), computes the gradient of its squared error with
  respect to the item parameters theta_i = [v_i, bias_i], and clips that whole gradient to L2
  norm ``sgd_clip``;
- aggregator: sums the clipped gradients and adds N(0, (z C)^2) through the ledger, recorded as
  a Poisson-sampled Gaussian release (accounted with dp-accounting's PoissonSampledDpEvent);
- server: theta <- theta - lr (g_noisy / (q n) + reg theta).

The pre-processing mean release is shared with ALS.
"""

from __future__ import annotations

import numpy as np

from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import PURPOSE_DPSGD_SAMPLE, require_keys, user_uniform
from . import als
from .kernels import clipped_gradient_rows
from .options import DPSGDOptions, Sampled, of
from .shards import UserShard, sub_shard

RELEASE = "dpsgd_grad"


def theta(state: als.PublicState) -> np.ndarray:
    """Item parameters [v_i, bias_i] as one (n_items, d + 1) array."""
    bias = state.item_bias if state.item_bias is not None else np.zeros(state.n_items)
    return np.hstack([state.item_factors.astype(np.float64), bias[:, None]])


def sampled_users(shard: UserShard, state: als.PublicState, round_index: int) -> np.ndarray:
    """Poisson sample of the shard's users for one round (boolean per local user): each user's
    own coin, from its secret key and the round."""
    u = user_uniform(require_keys(shard), PURPOSE_DPSGD_SAMPLE, np.uint64(round_index))
    return u < of(state.config, Sampled).sgd_sampling_rate


def client_gradient(shard: UserShard, state: als.PublicState, round_index: int) -> als.ItemStats:
    """Sum over the shard's sampled users of their clipped item-parameter gradients.

    Returned as :class:`ItemStats` with ``b`` the (k, d + 1) gradient rows of the k items
    touched and an empty ``A``.
    """
    cfg = state.config
    d1 = cfg.rank + 1
    take = sampled_users(shard, state, round_index)
    if not take.any():
        return als.ItemStats(item_ids=np.zeros(0, np.int64), A=np.zeros((0, 0, 0), np.float32), b=np.zeros((0, d1)))
    sub = sub_shard(shard, take)  # only the sampled users solve their vectors
    U, ubias = als.split_user_vectors(als.client_user_vectors(sub, state), state)
    rows = sub.local_user_of_rating
    y = sub.ratings.astype(np.float64) - state.mean - ubias[rows]
    X = np.hstack([U, np.ones((len(U), 1))])  # d(pred)/d(theta_i) = [u_j, 1]
    ids, out = clipped_gradient_rows(X, theta(state), rows, sub.items, y, of(cfg, DPSGDOptions).sgd_clip)
    return als.ItemStats(item_ids=ids, A=np.zeros((0, 0, 0), np.float32), b=out)


def sum_gradients(parts: list[als.ItemStats], n_items: int, d1: int) -> np.ndarray:
    G = np.zeros((n_items, d1))
    for p in parts:
        G[p.item_ids] += p.b
    return G


def release_gradient(G: np.ndarray, state: als.PublicState, ledger: PrivacyLedger) -> np.ndarray:
    opts = of(state.config, DPSGDOptions)
    return ledger.gaussian(
        RELEASE,
        G,
        sensitivity=opts.sgd_clip,
        noise_multiplier=state.multipliers[RELEASE],
        sampling_rate=opts.sgd_sampling_rate,
    )


def server_update(G_noisy: np.ndarray, state: als.PublicState) -> None:
    opts = of(state.config, DPSGDOptions)
    th = theta(state)
    expected = max(opts.sgd_sampling_rate * state.n_users, 1.0)
    th = th - opts.sgd_lr * (G_noisy / expected + opts.sgd_weight_decay * th)
    state.item_factors = th[:, :-1].astype(np.float32)
    state.item_bias = th[:, -1]
