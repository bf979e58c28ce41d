"""The public item encoder (torch): one embedding bag per public feature field (genres, year
bucket, tags, and optionally the item id), mean-pooled, concatenated, then a dense layer to the
output dimension.

Everything here is a function of public data only (the feature matrix and the encoder's own
parameters); the private side enters only through the noised statistics or noised gradients
handed to :mod:`fedpriv.algorithms.ssp`. The bags are stored as padded index tables (pad index
= vocabulary size, a zero row), so the forward pass is a plain embedding lookup and a masked
mean: it works under ``torch.func.vmap`` for per-user gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

try:  # torch is an extra: the encoder family (am-ssp, am-dpsgd, ...) and the GPU need it
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - a machine without the extra
    raise ImportError(
        "the encoder family (am-ssp, am-ssp-convex, am-dpsgd) needs torch: pip install 'fedpriv[torch]' "
        "(on a machine without a GPU, install a CPU build of torch first: PyTorch's install page gives the command)"
    ) from exc

from ..data.features import ItemFeatures
from ..errors import ConfigError
from ..privacy.ledger import public_draws

ID_FIELD = "id"


@dataclass
class FeatureTable:
    """Per field: a padded (n_items, L_f) index table and its vocabulary size."""

    names: list[str]
    index: list[torch.Tensor]  # int64 (n_items, L_f), pad value == vocab_f
    vocab: list[int]
    n_items: int

    @classmethod
    def build(cls, features: ItemFeatures | None, n_items: int, fields: list[str]) -> "FeatureTable":
        """``fields``: names of ``features.fields`` plus ``"id"`` for a one-hot item id field."""
        if not fields:
            raise ConfigError("at least one feature field is needed", field="features")
        names, index, vocab = [], [], []
        for name in fields:
            if name == ID_FIELD:
                index.append(torch.arange(n_items, dtype=torch.int64)[:, None])
                vocab.append(n_items)
            else:
                if features is None:
                    raise ConfigError(
                        f"the data set has no public item features (asked for {name!r}); use features=id",
                        field="features",
                    )
                if name not in features.fields:
                    raise ConfigError(
                        f"unknown feature field {name!r} (available: {', '.join([*features.fields, ID_FIELD])})",
                        field="features",
                    )
                if features.n_items != n_items:
                    raise ConfigError(
                        f"feature matrix has {features.n_items} rows for {n_items} items", field="features"
                    )
                sl = features.fields[name]
                sub = features.matrix[:, sl].tocsr()
                sub.sort_indices()
                v = sl.stop - sl.start
                lengths = np.diff(sub.indptr)
                width = max(1, int(lengths.max(initial=0)))
                table = np.full((n_items, width), v, dtype=np.int64)
                rows = np.repeat(np.arange(n_items), lengths)
                cols = np.arange(len(sub.indices)) - np.repeat(sub.indptr[:-1], lengths)
                table[rows, cols] = sub.indices
                index.append(torch.from_numpy(table))
                vocab.append(v)
            names.append(name)
        return cls(names=names, index=index, vocab=vocab, n_items=n_items)

    def active(self, items: np.ndarray | None = None) -> list[np.ndarray]:
        """Per field, the sorted feature ids active for ``items`` (all items by default)."""
        out = []
        for idx, v in zip(self.index, self.vocab):
            sub = idx if items is None else idx[torch.as_tensor(items, dtype=torch.int64)]
            ids = torch.unique(sub)
            out.append(ids[ids < v].numpy())
        return out


def parse_fields(spec: str) -> list[str]:
    return [f.strip() for f in str(spec).replace(";", ",").split(",") if f.strip()]


class ItemEncoder(nn.Module):
    """v(x_j) = W [mean_f E_f[x_j,f]]_f + c, with E_f of shape (vocab_f + 1, h) (last row: pad,
    kept at zero) and W of shape (out_dim, h * n_fields)."""

    def __init__(self, table: FeatureTable, out_dim: int, hidden: int, seed: int, init_scale: float = 0.1):
        super().__init__()
        self.table = table
        gen = torch.Generator().manual_seed(int(seed))
        self.embeddings = nn.ParameterList()
        fan_in = hidden * len(table.vocab)
        with public_draws("encoder init"):  # data-independent initialisation
            for v in table.vocab:
                w = torch.randn((v + 1, hidden), generator=gen) * init_scale
                w[v] = 0.0
                self.embeddings.append(nn.Parameter(w))
            self.dense = nn.Parameter(torch.randn((out_dim, fan_in), generator=gen) / np.sqrt(fan_in))
        self.offset = nn.Parameter(torch.zeros(out_dim))

    def _on(self, what: str, tensors: list[torch.Tensor], dev: torch.device) -> list[torch.Tensor]:
        """``tensors`` (the table's index or the poolings) on ``dev``, copied once per device
        (the device path, fedpriv.util.device: the parameters live where the server computes)."""
        if dev.type == "cpu":
            return tensors
        cache = self.__dict__.setdefault("_device_copies", {})
        key = (what, str(dev))
        if key not in cache:
            cache[key] = [t.to(dev) for t in tensors]
        return cache[key]

    def _pooling(self) -> list[torch.Tensor]:
        """Per field, the mean pooling of all items as a sparse (n_items, vocab + 1) matrix: row j
        holds 1 / (item j's active feature count) at its features (pad entries left out). It
        depends only on the public feature table, so it is built once (on the CPU; copied to the
        parameters' device)."""
        pools = getattr(self, "_pools", None)
        if pools is None:
            pools = []
            for idx, v in zip(self.table.index, self.table.vocab):
                mask = idx < v
                count = mask.sum(-1, keepdim=True).clamp_min(1).to(torch.float32)
                rows = torch.arange(idx.shape[0]).repeat_interleave(mask.sum(-1))
                vals = (mask.to(torch.float32) / count)[mask]
                pools.append(
                    torch.sparse_coo_tensor(
                        torch.stack([rows, idx[mask]]), vals, (idx.shape[0], v + 1), check_invariants=True
                    ).coalesce()
                )
            self._pools = pools
        return self._on("pools", pools, self.offset.device)

    def hidden(self, items: torch.Tensor | None = None) -> torch.Tensor:
        parts = []
        if items is None:  # every item (the server's full-batch steps): one sparse product per field
            for emb, pool in zip(self.embeddings, self._pooling()):
                parts.append(torch.sparse.mm(pool if pool.dtype == emb.dtype else pool.to(emb.dtype), emb))
            return torch.cat(parts, dim=-1)
        dev = self.offset.device
        items = items.to(dev)
        for emb, idx, v in zip(self.embeddings, self._on("index", self.table.index, dev), self.table.vocab):
            sub = idx[items]
            mask = (sub < v).to(emb.dtype)
            pooled = (emb[sub] * mask[..., None]).sum(-2) / mask.sum(-1, keepdim=True).clamp_min(1.0)
            parts.append(pooled)
        return torch.cat(parts, dim=-1)

    def forward(self, items: torch.Tensor | None = None) -> torch.Tensor:
        return self.hidden(items) @ self.dense.T + self.offset

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def get_flat(self) -> np.ndarray:
        return torch.nn.utils.parameters_to_vector(self.parameters()).detach().cpu().numpy().astype(np.float32)

    def set_flat(self, flat: np.ndarray) -> None:
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(
                torch.as_tensor(np.asarray(flat, dtype=np.float32), device=self.offset.device), self.parameters()
            )
            for emb, v in zip(self.embeddings, self.table.vocab):
                emb[v] = 0.0

    def outputs(self) -> np.ndarray:
        with torch.no_grad():
            return self.forward().double().cpu().numpy()


def per_user_clipped_gradient(
    encoder: ItemEncoder,
    user_items: np.ndarray,
    user_grads: np.ndarray,
    clip: float,
    chunk_entries: int = 1 << 16,
) -> tuple[np.ndarray, np.ndarray]:
    """Sum over users of their encoder gradients, each clipped to L2 norm ``clip``.

    ``user_items``: (n, L) item ids per user, padded with -1; ``user_grads``: (n, L, D) the
    gradient of the user's loss with respect to each of its items' encoder outputs (zero on
    padding). A user's parameter gradient is the vector-Jacobian product sum_l J_{j_l}^T g_l,
    computed for all users at once with ``torch.func.vmap``. Returns (flat summed clipped
    gradient, per-user norms before clipping).
    """
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in encoder.named_parameters()}
    n, L = user_items.shape
    total = np.zeros(encoder.n_params())
    norms = np.zeros(n)
    if n == 0:
        return total, norms

    def user_loss(p, items, g):
        out = functional_call(encoder, p, (items.clamp_min(0),))
        return (out * g).sum()

    per_user = vmap(grad(user_loss), in_dims=(None, 0, 0))
    step = max(1, chunk_entries // max(L, 1))
    dev = encoder.offset.device  # where the parameters are (a client on a device: there)
    for s in range(0, n, step):
        items = torch.from_numpy(np.ascontiguousarray(user_items[s : s + step], dtype=np.int64)).to(dev)
        g = torch.from_numpy(np.ascontiguousarray(user_grads[s : s + step], dtype=np.float32)).to(dev)
        grads = per_user(params, items, g)
        flat = torch.cat([grads[k].reshape(len(items), -1) for k, _ in encoder.named_parameters()], dim=1).double()
        nrm = flat.norm(dim=1)
        scale = torch.clamp(clip / nrm.clamp_min(1e-12), max=1.0)
        total += (flat * scale[:, None]).sum(0).cpu().numpy()
        norms[s : s + step] = nrm.cpu().numpy()
    return total, norms
