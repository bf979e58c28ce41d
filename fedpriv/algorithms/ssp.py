"""Private learning with public features (Krichene et al. 2023): alternating minimisation with
user vectors solved on the clients and a torch item encoder over public item features trained
on the server.

Item updates:

- ``am-ssp`` (SSP2, Alg. 3/5): the aggregator noises the per-item statistics A_j, b_j once per
  alternating step; the server then takes ``ssp_steps`` Adam steps of the encoder on
  sum_j J_j^T (A_j e_j - b_j + lambda e_j), over mini-batches of items (``ssp_batch_items``).
- ``am-ssp1`` (SSP1, Alg. 2): the same, with an independent noise draw for each server step,
  or ``ssp_resamples`` draws shared round-robin (the resampling sweep of the paper's Fig. 4).
- ``am-ssp-convex`` (Alg. 7): logistic loss on binarised ratings; clients solve their user
  vector by Newton steps and send H_j = sum w l'' x x^T, g_j = sum w l' x at the current item
  embeddings; the server minimises the quadratic model around them.
- ``am-dpsgd`` (Alg. 6, user level): Poisson-sampled users send their encoder gradient clipped
  per user; the aggregator sums and noises; the server takes an Adam step.

The encoder output has the rank coordinates plus (with ``item_bias``) one coordinate whose
product with the fixed coordinate kappa of the released user vectors is the item bias, exactly
as in :mod:`fedpriv.algorithms.als`: every client function of ALS applies unchanged.
"""

from __future__ import annotations

import numpy as np

try:  # torch is an extra: the encoder family (am-ssp, am-dpsgd, ...) and the GPU need it
    import torch
except ImportError as exc:  # pragma: no cover - a machine without the extra
    raise ImportError(
        "the encoder family (am-ssp, am-ssp-convex, am-dpsgd) needs torch: pip install 'fedpriv[torch]' "
        "(on a machine without a GPU, install a CPU build of torch first: PyTorch's install page gives the command)"
    ) from exc

from ..errors import ConfigError
from ..privacy.ledger import PrivacyLedger
from ..util import device
from . import als
from .encoder import FeatureTable, ItemEncoder, parse_fields, per_user_clipped_gradient
from .kernels import project_psd
from .options import EncoderDPSGDOptions, EncoderOptions, Sampled, ServerSteps, of
from .shards import UserShard, sub_shard
from .ssp_client import _sigmoid, client_convex_stats, item_outputs, labels, logistic_user_vectors  # noqa: F401 - the client side, re-exported


def out_dim(cfg: als.ALSConfig) -> int:
    """The encoder's outputs: the rank coordinates, plus the item bias's unless the bias stage
    has released the item biases already."""
    return cfg.rank + (1 if als.item_bias_coordinate(cfg) else 0)


def feature_table(features, n_items: int, cfg: als.ALSConfig) -> FeatureTable:
    return FeatureTable.build(features, n_items, parse_fields(of(cfg, EncoderOptions).features))


def build_encoder(table: FeatureTable, cfg: als.ALSConfig) -> ItemEncoder:
    d = out_dim(cfg)
    return ItemEncoder(table, d, of(cfg, EncoderOptions).enc_hidden or d, seed=cfg.seed, init_scale=cfg.init_scale)


def ssp_objective(
    E: torch.Tensor, A: torch.Tensor, b: torch.Tensor, reg: float, G: torch.Tensor | None = None
) -> torch.Tensor:
    """sum_j (1/2 e_j^T A_j e_j - b_j^T e_j + reg/2 |e_j|^2) (+ 1/2 e_j^T G e_j): its gradient is
    sum_j J_j^T (A_j e_j - b_j + reg e_j), the SSP gradient of Proposition 1."""
    quad = 0.5 * torch.einsum("ni,nij,nj->", E, A, E) - (b * E).sum() + 0.5 * reg * (E * E).sum()
    if G is not None:
        quad = quad + 0.5 * torch.einsum("ni,ij,nj->", E, G, E)
    return quad


class EncoderServer:
    """Server side of the encoder algorithms: the encoder, its optimiser, and publication of
    its outputs (public state only ever holds post-processed values)."""

    def __init__(self, state: als.PublicState, table: FeatureTable):
        cfg = state.config
        self.state = state
        # the device path (fedpriv.util.device): the encoder's parameters and its fits live
        # there; the initialisation is drawn on the CPU first, so it is the same on every device
        self.dev = device.torch_device() or torch.device("cpu")
        self.encoder = build_encoder(table, cfg).to(self.dev)
        lr = (
            of(cfg, EncoderDPSGDOptions).encoder_sgd_lr
            if state.spec.clients_need_encoder
            else of(cfg, ServerSteps).ssp_lr
        )
        self.opt = torch.optim.Adam(
            self.encoder.parameters(), lr=lr, weight_decay=of(cfg, EncoderOptions).enc_weight_decay
        )
        self.steps_done = 0

    def publish(self) -> None:
        state, cfg = self.state, self.state.config
        E = self.encoder.outputs()
        state.item_factors = E[:, : cfg.rank].astype(np.float32)
        if als.item_bias_coordinate(cfg):
            state.item_bias = E[:, cfg.rank] * als.bias_coordinate(state)
        elif not cfg.bias_stage:
            state.item_bias = None  # (with the bias stage, the released item biases stay)
        state.encoder_release = self.encoder.get_flat()
        if state.spec.clients_need_encoder:
            state.encoder_params = state.encoder_release

    def _batches(self, step: int):
        cfg, n = self.state.config, self.state.n_items
        opts = of(cfg, ServerSteps)
        gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + step)  # public randomness
        size = opts.ssp_batch_items if 0 < opts.ssp_batch_items < n else n
        for _ in range(opts.ssp_steps):
            yield None if size == n else torch.randperm(n, generator=gen)[:size].to(self.dev)

    def _fit(self, loss_of) -> None:
        """``ssp_steps`` Adam steps; ``loss_of(t, items, E)`` is the quadratic model's value on
        the encoder outputs E of ``items`` (None: all items), scaled to the full item set."""
        n = self.state.n_items
        for t, items in enumerate(self._batches(self.steps_done)):
            E = self.encoder(items)
            scale = n / (len(items) if items is not None else n)
            loss = scale * loss_of(t, items, E)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        self.steps_done += 1

    def ssp_update(self, copies: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]) -> None:
        """SSP item update from R noised copies of (A, b, gravity); step t uses copy t R / T."""
        cfg = self.state.config
        reg = cfg.reg_item_private
        T, R = of(cfg, ServerSteps).ssp_steps, len(copies)
        tens = []
        for A, b, g in copies:
            # a release on the device (fedpriv.util.device.DeviceArray) is read there
            A = device.as_tensor(project_psd(A, cfg.psd_floor), self.dev, torch.float32)
            b = device.as_tensor(b, self.dev, torch.float32)
            G = (
                device.as_tensor(project_psd(g[None], 0.0)[0], self.dev, torch.float32) * cfg.gravity
                if g is not None
                else None
            )
            tens.append((A, b, G))

        def loss_of(t, items, E):
            A, b, G = tens[min(R - 1, t * R // T)]
            if items is not None:
                A, b = A[items], b[items]
            return ssp_objective(E, A, b, reg, G)

        self._fit(loss_of)
        self.publish()

    def convex_update(self, H: np.ndarray, g: np.ndarray) -> None:
        """Minimise the quadratic model of the logistic loss around the current outputs E0."""
        cfg = self.state.config
        reg = cfg.reg_item_private
        E0 = torch.from_numpy(item_outputs(self.state).astype(np.float32)).to(self.dev)
        Ht = device.as_tensor(project_psd(H, cfg.psd_floor), self.dev, torch.float32)
        gt = device.as_tensor(g, self.dev, torch.float32)

        def loss_of(t, items, E):
            e0, h, gg = (E0, Ht, gt) if items is None else (E0[items], Ht[items], gt[items])
            dE = E - e0
            return (gg * dE).sum() + 0.5 * torch.einsum("ni,nij,nj->", dE, h, dE) + 0.5 * reg * (E * E).sum()

        self._fit(loss_of)
        self.publish()

    def sgd_update(self, G_noisy: np.ndarray) -> None:
        """One Adam step on the noised, summed per-user gradient, normalised by the expected
        number of sampled users."""
        expected = max(of(self.state.config, Sampled).sgd_sampling_rate * self.state.n_users, 1.0)
        flat = torch.from_numpy(np.asarray(G_noisy / expected, dtype=np.float32)).to(self.dev)
        self.opt.zero_grad(set_to_none=True)
        offset = 0
        for p in self.encoder.parameters():
            k = p.numel()
            p.grad = flat[offset : offset + k].view_as(p).clone()
            offset += k
        self.opt.step()
        self.steps_done += 1
        self.publish()


def init_server(state: als.PublicState, features, table: FeatureTable | None = None) -> EncoderServer:
    """Validated encoder server with its first (data-independent) outputs published."""
    if not state.spec.encoder:
        raise ConfigError(f"{state.algorithm} has no item encoder", field="algorithm")
    if state.spec.logistic and state.implicit:
        raise ConfigError(f"{state.algorithm} needs explicit ratings (it binarises them)", field="algorithm")
    server = EncoderServer(state, table if table is not None else feature_table(features, state.n_items, state.config))
    server.publish()
    return server


# ---------------------------------------------------------------------------- aggregator
def release_ssp_stats(A, b, g, state: als.PublicState, ledger: PrivacyLedger):
    """R independent noised copies of the exact sums (R = 1: SSP2; R = T: SSP1)."""
    return [als.release_item_stats(A, b, g, state, ledger) for _ in range(als.resamples(state.algorithm, state.config))]


def release_convex_stats(H, g, state: als.PublicState, ledger: PrivacyLedger):
    H = als.release_gaussian("item_stats_H", H, state, ledger, symmetric=True)
    g = als.release_gaussian("item_stats_g", g, state, ledger)
    return H, g


def release_encoder_gradient(G: np.ndarray, state: als.PublicState, ledger: PrivacyLedger) -> np.ndarray:
    cfg = state.config
    return ledger.gaussian(
        "encoder_grad",
        G,
        sensitivity=als.sensitivity("encoder_grad", cfg, state.rating_range),
        noise_multiplier=state.multipliers["encoder_grad"],
        sampling_rate=of(cfg, Sampled).sgd_sampling_rate,
    )


# ---------------------------------------------------------------------------- clients


def client_encoder_gradient(
    shard: UserShard, state: als.PublicState, round_index: int, encoder: ItemEncoder
) -> np.ndarray:
    """AM-DPSGD client: the shard's Poisson-sampled users solve their vectors from the broadcast
    item embeddings, then each user's gradient of its weighted squared error with respect to the
    encoder parameters is clipped to ``sgd_clip``; returns the sum (flat)."""
    from .dpsgd import sampled_users

    cfg = state.config
    take = sampled_users(shard, state, round_index)
    if not take.any():
        return np.zeros(encoder.n_params())
    sub = sub_shard(shard, take)
    U, ubias = als.split_user_vectors(als.client_user_vectors(sub, state), state)
    X = U
    if cfg.item_bias:
        X = np.hstack([U, np.full((len(U), 1), als.bias_coordinate(state))])
    E = item_outputs(state)
    rows, items = sub.local_user_of_rating, sub.items
    y = als.client_targets(sub, state, minus_item_bias=False) - ubias[rows]
    r = np.einsum("nd,nd->n", X[rows], E[items]) - y
    w = als.client_rating_weights(sub, state)
    grads = (w * r)[:, None] * X[rows]
    lengths = np.diff(sub.indptr)
    L = int(lengths.max())
    pos = np.arange(len(items)) - np.repeat(sub.indptr[:-1], lengths)
    user_items = np.full((sub.n_users, L), -1, dtype=np.int64)
    user_items[rows, pos] = items
    user_grads = np.zeros((sub.n_users, L, X.shape[1]), dtype=np.float32)
    user_grads[rows, pos] = grads
    total, _ = per_user_clipped_gradient(encoder, user_items, user_grads, of(cfg, Sampled).sgd_clip)
    return total
