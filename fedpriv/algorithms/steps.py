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

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..privacy.ledger import PrivacyLedger
from ..privacy.symmetric import from_upper, upper
from . import als, dpsgd, ssp_client
from .shards import UserShard

if TYPE_CHECKING:
    from . import ssp
    from .encoder import FeatureTable


def _ssp():
    """The encoder server module (torch), imported by the steps that need it only: a client of
    the ALS family or of AM-SSP's statistics never loads torch."""
    return importlib.import_module(".ssp", __package__)


def stats_dim(state: als.PublicState) -> int:
    """Width of the per-item contribution rows (user vectors with the bias coordinate)."""
    cfg = state.config
    return cfg.rank + (1 if (als.item_bias_coordinate(cfg) or state.spec.bias_column) else 0)


@dataclass(frozen=True)
class Part:
    """One declared release of a step: its name, its place in the step's sums, its shape, and
    whether it is a stack of symmetric matrices (released as upper triangles)."""

    name: str
    index: int
    shape: tuple[int, ...]
    symmetric: bool = False

    @property
    def length(self) -> int:
        """Words of the release (upper triangles for symmetric parts)."""
        if self.symmetric:
            d = self.shape[-1]
            return int(np.prod(self.shape[:-2], dtype=np.int64)) * d * (d + 1) // 2
        return int(np.prod(self.shape, dtype=np.int64))

    def flatten(self, arr) -> np.ndarray:
        """The part's sum as its :attr:`length` words (float64; upper triangles of symmetric
        parts; None: zeros): the form a secure sum encodes and a 'parts' reply carries."""
        arr = np.zeros(self.shape) if arr is None else np.asarray(arr, dtype=np.float64)
        return (upper(arr) if self.symmetric else arr).ravel()

    def unflatten(self, values) -> np.ndarray:
        """The inverse of :meth:`flatten`: the part's sum in its shape."""
        v = np.asarray(values, dtype=np.float64)
        if self.symmetric:
            d = self.shape[-1]
            return from_upper(v.reshape(*self.shape[:-2], d * (d + 1) // 2), d)
        return v.reshape(self.shape)


def client_encoder(state: als.PublicState, table: FeatureTable):
    """The broadcast encoder, rebuilt on a client from public features and parameters, on the
    current device (:mod:`fedpriv.util.device`: am-dpsgd's per-user gradients run there)."""
    from ..util import device

    enc = _ssp().build_encoder(table, state.config)
    dev = device.torch_device()
    if dev is not None:
        enc = enc.to(dev)
    enc.set_flat(state.encoder_params)
    return enc


class AlternatingStep:
    """ALS-family step: local user solves, per-item statistics A, b; the server solves the items."""

    def setup(self, state: als.PublicState, features) -> ssp.EncoderServer | None:
        als.server_init(state)
        return None

    def client(self, shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
        return als.client_item_stats(shard, state)

    def parts(self, state: als.PublicState) -> list[Part]:
        """The releases of one step, as declared to the aggregator."""
        n, d = state.n_items, stats_dim(state)
        out = [Part("item_stats_A", 0, (n, d, d), True), Part("item_stats_b", 1, (n, d))]
        if state.config.gravity > 0:
            out.append(Part("gravity", 2, (d, d), True))
        return out

    def sums(self, parts: list, state: als.PublicState) -> tuple:
        """The exact sums of the clients' contributions, in the order of :meth:`parts`."""
        return als.sum_item_stats(parts, state.n_items, stats_dim(state))

    def release(self, sums: tuple, state: als.PublicState, ledger) -> object:
        """Noise the sums through ``ledger`` (or take them as released: see
        :class:`fedpriv.algorithms.secure.Prereleased`) and shape the release for :meth:`server`."""
        A, b, *g = sums
        return als.release_item_stats(A, b, g[0] if g else None, state, ledger)

    def aggregate(self, parts: list, state: als.PublicState, ledger: PrivacyLedger | None):
        return self.release(self.sums(parts, state), state, ledger)

    def server(self, release, state: als.PublicState, server) -> None:
        als.server_item_update(*release, state)


class EncoderStep(AlternatingStep):
    """The encoder family: the item side is a torch encoder over public item features."""

    def setup(self, state: als.PublicState, features) -> ssp.EncoderServer:
        return _ssp().init_server(state, features)


class SSPStep(EncoderStep):
    """AM-SSP (SSP2 / SSP1): noised item statistics, then many encoder steps on the server."""

    def release(self, sums: tuple, state: als.PublicState, ledger) -> object:
        A, b, *g = sums
        return _ssp().release_ssp_stats(A, b, g[0] if g else None, state, ledger)

    def server(self, release, state: als.PublicState, server: ssp.EncoderServer) -> None:
        server.ssp_update(release)


class ConvexStep(EncoderStep):
    """AM-SSP for the logistic model: per-item Hessian and gradient statistics."""

    def client(self, shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
        return ssp_client.client_convex_stats(shard, state)

    def parts(self, state: als.PublicState) -> list[Part]:
        n, d = state.n_items, stats_dim(state)
        return [Part("item_stats_H", 0, (n, d, d), True), Part("item_stats_g", 1, (n, d))]

    def sums(self, parts: list, state: als.PublicState) -> tuple:
        return als.sum_item_stats(parts, state.n_items, stats_dim(state))[:2]

    def release(self, sums: tuple, state: als.PublicState, ledger) -> object:
        return _ssp().release_convex_stats(*sums, state, ledger)

    def server(self, release, state: als.PublicState, server: ssp.EncoderServer) -> None:
        server.convex_update(*release)


class DPSGDStep(AlternatingStep):
    """Federated DP-SGD: Poisson-sampled users' clipped gradients of their item rows."""

    def client(self, shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
        return dpsgd.client_gradient(shard, state, step)

    def parts(self, state: als.PublicState) -> list[Part]:
        return [Part(dpsgd.RELEASE, 0, (state.n_items, stats_dim(state)))]

    def sums(self, parts: list, state: als.PublicState) -> tuple:
        return (dpsgd.sum_gradients(parts, state.n_items, stats_dim(state)),)

    def release(self, sums: tuple, state: als.PublicState, ledger) -> object:
        return dpsgd.release_gradient(sums[0], state, ledger)

    def server(self, release, state: als.PublicState, server) -> None:
        dpsgd.server_update(release, state)


class EncoderDPSGDStep(EncoderStep):
    """AM-DPSGD: clients rebuild the broadcast encoder and send clipped parameter gradients."""

    def client(self, shard: UserShard, state: als.PublicState, step: int, table: FeatureTable | None = None):
        return _ssp().client_encoder_gradient(shard, state, step, client_encoder(state, table))

    def parts(self, state: als.PublicState) -> list[Part]:
        return [Part("encoder_grad", 0, (len(state.encoder_params),))]

    def sums(self, parts: list, state: als.PublicState) -> tuple:
        total = np.zeros(len(state.encoder_params))
        for p in parts:
            total += p
        return (total,)

    def release(self, sums: tuple, state: als.PublicState, ledger) -> object:
        return _ssp().release_encoder_gradient(sums[0], state, ledger)

    def server(self, release, state: als.PublicState, server: ssp.EncoderServer) -> None:
        server.sgd_update(release)


ITEM_STATS = AlternatingStep()
SSP = SSPStep()
CONVEX = ConvexStep()
DPSGD = DPSGDStep()
ENCODER_DPSGD = EncoderDPSGDStep()
