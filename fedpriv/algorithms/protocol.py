"""What the engines call for one alternating step of any rating algorithm: the algorithm's
registered step (:mod:`fedpriv.algorithms.steps`), looked up in the registry, never by
comparing names.

- :func:`client_step`: one shard's clipped contribution;
- :func:`aggregate`: the secure-aggregator step, sum then noise through the ledger (the only
  code that sees exact sums);
- :func:`server_step`: post-processing of the noised release;
- :func:`server_setup`: the weights and the initial model after the pre-processing releases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..privacy.ledger import PrivacyLedger
from . import als, registry
from .shards import UserShard
from .steps import client_encoder, stats_dim  # noqa: F401 - re-exported for the engines and the tests

if TYPE_CHECKING:
    from .encoder import FeatureTable


def contribution_kind(algorithm: str) -> str:
    """'stats' (per-item A, b), 'convex' (per-item H, g), 'gradient' (item rows), 'flat'."""
    return registry.get(algorithm).contribution


def clients_need_encoder(algorithm: str) -> bool:
    """True when the clients rebuild the encoder from the public feature table (their
    contribution is a gradient of its parameters)."""
    return registry.get(algorithm).clients_need_encoder


def is_logistic(algorithm: str) -> bool:
    """True for the logistic model (binarised ratings; evaluated by log-loss and accuracy)."""
    return registry.get(algorithm).logistic


def client_step(shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
    return state.spec.alternating_step().client(shard, state, step, table)


def aggregate(parts: list, state: als.PublicState, ledger: PrivacyLedger | None):
    return state.spec.alternating_step().aggregate(parts, state, ledger)


def server_step(release, state: als.PublicState, server) -> None:
    state.spec.alternating_step().server(release, state, server)


def server_setup(state: als.PublicState, features):
    """Post-processing after the pre-processing releases: weights, then the initial model
    (random item embeddings, or a random encoder and its outputs)."""
    als.server_weights(state)
    if state.config.bias_prior and als.has_bias_stage(state.algorithm, state.config):
        als.bias_feature_prior(state, features)
    return state.spec.alternating_step().setup(state, features)
