"""One alternating step of any algorithm, split by party, so that both engines (in-process and
Flower) run the same code:

- :func:`client_step`: one shard's clipped contribution (item statistics, or a clipped
  gradient sum);
- :func:`aggregate`: the secure-aggregator step, sum then noise through the ledger (the only
  code that sees exact sums);
- :func:`server_step`: post-processing of the noised release (item solve, or encoder steps).
"""

from __future__ import annotations

import numpy as np

from ..privacy.ledger import PrivacyLedger
from . import als, dpsgd, ssp
from .encoder import FeatureTable
from .shards import UserShard


def stats_dim(state: als.PublicState) -> int:
    """Width of the per-item contribution rows (user vectors with the bias coordinate)."""
    cfg = state.config
    return cfg.rank + (1 if (cfg.item_bias or state.algorithm == "dpsgd") else 0)


def contribution_kind(algorithm: str) -> str:
    """'stats' (per-item A, b), 'convex' (per-item H, g), 'gradient' (item rows), 'flat'."""
    if algorithm == "dpsgd":
        return "gradient"
    if algorithm == "am-dpsgd":
        return "flat"
    if algorithm == "am-ssp-convex":
        return "convex"
    return "stats"


def clients_need_encoder(algorithm: str) -> bool:
    """True when the clients rebuild the encoder from the public feature table (their
    contribution is a gradient of its parameters)."""
    return contribution_kind(algorithm) == "flat"


def is_logistic(algorithm: str) -> bool:
    """True for the logistic model (binarised ratings; evaluated by log-loss and accuracy)."""
    return contribution_kind(algorithm) == "convex"


def client_encoder(state: als.PublicState, table: FeatureTable):
    """The broadcast encoder, rebuilt on a client from public features and parameters."""
    enc = ssp.build_encoder(table, state.config)
    enc.set_flat(state.encoder_params)
    return enc


def client_step(shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
    alg = state.algorithm
    if alg == "dpsgd":
        return dpsgd.client_gradient(shard, state, step)
    if alg == "am-dpsgd":
        return ssp.client_encoder_gradient(shard, state, step, client_encoder(state, table))
    if alg == "am-ssp-convex":
        return ssp.client_convex_stats(shard, state)
    return als.client_item_stats(shard, state)


def aggregate(parts: list, state: als.PublicState, ledger: PrivacyLedger | None):
    alg, n = state.algorithm, state.n_items
    if alg == "dpsgd":
        return dpsgd.release_gradient(dpsgd.sum_gradients(parts, n, stats_dim(state)), state, ledger)
    if alg == "am-dpsgd":
        total = np.zeros(len(state.encoder_params))
        for p in parts:
            total += p
        return ssp.release_encoder_gradient(total, state, ledger)
    A, b, g = als.sum_item_stats(parts, n, stats_dim(state))
    if alg == "am-ssp-convex":
        return ssp.release_convex_stats(A, b, state, ledger)
    if alg in ("am-ssp", "am-ssp1"):
        return ssp.release_ssp_stats(A, b, g, state, ledger)
    return als.release_item_stats(A, b, g, state, ledger)


def server_step(release, state: als.PublicState, server: ssp.EncoderServer | None) -> None:
    alg = state.algorithm
    if alg == "dpsgd":
        dpsgd.server_update(release, state)
    elif alg == "am-dpsgd":
        server.sgd_update(release)
    elif alg == "am-ssp-convex":
        server.convex_update(*release)
    elif alg in ("am-ssp", "am-ssp1"):
        server.ssp_update(release)
    else:
        als.server_item_update(*release, state)


def server_setup(state: als.PublicState, features) -> ssp.EncoderServer | None:
    """Post-processing after the pre-processing releases: weights, then the initial model
    (random item embeddings, or a random encoder and its outputs)."""
    als.server_weights(state)
    if state.algorithm in als.ENCODER_ALGORITHMS:
        return ssp.init_server(state, features)
    als.server_init(state)
    return None
