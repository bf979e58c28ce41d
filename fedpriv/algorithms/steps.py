"""The alternating steps of the rating-algorithm family, one object per kind of step, each split
by party so that both engines (in-process and Flower) run the same code:

- :meth:`AlternatingStep.client`: one shard's clipped contribution (item statistics, or a
  clipped gradient sum);
- :meth:`AlternatingStep.aggregate`: the secure-aggregator step, sum then noise through the
  ledger (the only code that sees exact sums);
- :meth:`AlternatingStep.server`: post-processing of the noised release (item solve, or encoder
  steps);
- :meth:`AlternatingStep.setup`: the server's initial model, after the pre-processing releases.

An algorithm names its step in its :class:`~fedpriv.algorithms.registry.AlgorithmSpec`
(``step="module:attribute"``); an algorithm with a new kind of step defines it in its own module.
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
    return cfg.rank + (1 if (cfg.item_bias or state.spec.bias_column) else 0)


def client_encoder(state: als.PublicState, table: FeatureTable):
    """The broadcast encoder, rebuilt on a client from public features and parameters."""
    enc = ssp.build_encoder(table, state.config)
    enc.set_flat(state.encoder_params)
    return enc


class AlternatingStep:
    """ALS-family step: local user solves, per-item statistics A, b; the server solves the items."""

    def setup(self, state: als.PublicState, features) -> ssp.EncoderServer | None:
        als.server_init(state)
        return None

    def client(self, shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
        return als.client_item_stats(shard, state)

    def sums(self, parts: list, state: als.PublicState):
        return als.sum_item_stats(parts, state.n_items, stats_dim(state))

    def aggregate(self, parts: list, state: als.PublicState, ledger: PrivacyLedger | None):
        return als.release_item_stats(*self.sums(parts, state), state, ledger)

    def server(self, release, state: als.PublicState, server) -> None:
        als.server_item_update(*release, state)


class EncoderStep(AlternatingStep):
    """The encoder family: the item side is a torch encoder over public item features."""

    def setup(self, state: als.PublicState, features) -> ssp.EncoderServer:
        return ssp.init_server(state, features)


class SSPStep(EncoderStep):
    """AM-SSP (SSP2 / SSP1): noised item statistics, then many encoder steps on the server."""

    def aggregate(self, parts: list, state: als.PublicState, ledger: PrivacyLedger | None):
        return ssp.release_ssp_stats(*self.sums(parts, state), state, ledger)

    def server(self, release, state: als.PublicState, server: ssp.EncoderServer) -> None:
        server.ssp_update(release)


class ConvexStep(EncoderStep):
    """AM-SSP for the logistic model: per-item Hessian and gradient statistics."""

    def client(self, shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
        return ssp.client_convex_stats(shard, state)

    def aggregate(self, parts: list, state: als.PublicState, ledger: PrivacyLedger | None):
        A, b, _ = self.sums(parts, state)
        return ssp.release_convex_stats(A, b, state, ledger)

    def server(self, release, state: als.PublicState, server: ssp.EncoderServer) -> None:
        server.convex_update(*release)


class DPSGDStep(AlternatingStep):
    """Federated DP-SGD: Poisson-sampled users' clipped gradients of their item rows."""

    def client(self, shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
        return dpsgd.client_gradient(shard, state, step)

    def aggregate(self, parts: list, state: als.PublicState, ledger: PrivacyLedger | None):
        return dpsgd.release_gradient(dpsgd.sum_gradients(parts, state.n_items, stats_dim(state)), state, ledger)

    def server(self, release, state: als.PublicState, server) -> None:
        dpsgd.server_update(release, state)


class EncoderDPSGDStep(EncoderStep):
    """AM-DPSGD: clients rebuild the broadcast encoder and send clipped parameter gradients."""

    def client(self, shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
        return ssp.client_encoder_gradient(shard, state, step, client_encoder(state, table))

    def aggregate(self, parts: list, state: als.PublicState, ledger: PrivacyLedger | None):
        total = np.zeros(len(state.encoder_params))
        for p in parts:
            total += p
        return ssp.release_encoder_gradient(total, state, ledger)

    def server(self, release, state: als.PublicState, server: ssp.EncoderServer) -> None:
        server.sgd_update(release)


ITEM_STATS = AlternatingStep()
SSP = SSPStep()
CONVEX = ConvexStep()
DPSGD = DPSGDStep()
ENCODER_DPSGD = EncoderDPSGDStep()
