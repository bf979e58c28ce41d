"""Top-k recommenders from one release of what users rate: ``topk`` (private) and ``ease``
(its non-private reference).

Implicit feedback: a rating counts as "rated" (implicit data as given). Each user's binary row
``x`` over the *head* items (the ``M`` items of largest released count, a public choice made
from the released counts on both sides) is scaled to unit L2 norm, and the user adds the outer
product ``x x^T`` to the item co-occurrence statistic ``G``: one user moves the upper triangle
of ``G`` by at most ``||x x^T||_F = ||x||^2 = 1`` (release ``cooc``, sensitivity 1, one
Gaussian through the ledger; in secure mode a Skellam secure sum like every other part). The
server solves EASE (Steck 2019) on the released matrix:

    P = (G + lambda I)^-1,   B = -P / diag(P),  diag(B) = 0

with ``lambda = topk_reg * sigma * sqrt(M)`` (sigma the release's noise std, so the ridge
grows with the noise's spectral norm, about 2 sigma sqrt(M)). A user's scores are their own
row times ``B``, computed locally from their own history (no budget), standardized and added
to ``topk_blend`` times the standardized released log-popularity (items outside the head rank
below the head, by popularity).

``ease``: the same model without privacy (exact binary rows, not normalized; ``lambda =
topk_reg``), the strong non-private reference beside which private top-k is judged.

The noise-aware rule (:class:`TopKRule`, through :func:`fedpriv.algorithms.defaults.choose`)
reads only public or released numbers: epsilon, delta, the released user count and the
catalogue size. Below :data:`SIGNAL_MIN` the item-item statistic does not pay and the run is
private popularity (the released counts take the budget the statistic would have had, exactly
as ``popular``); above it, it picks the head size and the ridge. Its constants were chosen on
the validation ratings of ML-100K and ml-latest-small (docs/how-to/recommendations.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..privacy.records import PlannedRelease
from . import als
from .popular import no_rating_weights
from .registry import AlgorithmSpec, register, register_release
from .shards import UserShard
from .steps import AlternatingStep, Part
from .typed import AlgorithmConfig

RELEASE = "cooc"
register_release(RELEASE, lambda cfg, rating_range: 1.0)  # ||upper(x x^T)||_2 <= ||x||^2 = 1

#: the rule's constants, chosen on the validation ratings of ML-100K and ml-latest-small (2-3
#: noise seeds; benchmarks/topk.py --part valid): the signal S = n_users sqrt(rho) (rho the
#: zCDP budget of epsilon, delta; halved under replace-one) decides
SIGNAL_MIN = 350.0  # below: private popularity (validation: ML-100K at epsilon 1, S 137: 0.06 against 0.14; Last.fm held-out users at epsilon 1, S 274: 0.094 against 0.115)
HEAD_PER_SIGNAL = 0.75  # head size M = 0.75 S (ml-latest-small: 1000 items beat 2000 at epsilon 20, 500 beat 1000 at 5)
HEAD_MAX = 2000  # at most this many head items (the statistic grows as M^2)
REG_UNITS = 8.0  # lambda in units of sigma sqrt(M) (8, 16, 32 within 0.002 on ml-latest-small)
BLEND = 1.0  # weight of the standardized released log-popularity
SHARE_COUNTS = 0.1  # the counts' budget share when the statistic is released
NONPRIVATE_REG = 200.0  # ease: lambda on the exact binary matrix


@dataclass
class TopKOptions:
    """``topk_items``: head items the model covers (0: none, private popularity); ``topk_reg``:
    the ridge (private: in units of sigma sqrt(M); ease: absolute); ``topk_blend``: weight of
    the standardized released log-popularity beside the item-item score."""

    topk_items: int = 0
    topk_reg: float = 0.0
    topk_blend: float = BLEND

    def validate(self) -> None:
        if self.topk_items < 0:
            raise ConfigError(f"must be >= 0 (0: private popularity), got {self.topk_items}", field="topk_items")
        if not (self.topk_reg >= 0 and math.isfinite(self.topk_reg)):
            raise ConfigError(f"must be a finite number >= 0 (0: the rule's), got {self.topk_reg}", field="topk_reg")
        if not (self.topk_blend >= 0 and math.isfinite(self.topk_blend)):
            raise ConfigError(f"must be a finite number >= 0, got {self.topk_blend}", field="topk_blend")


def _options(cfg) -> TopKOptions:
    return cfg.options if isinstance(cfg.options, TopKOptions) else TopKOptions()


def head(state: als.PublicState) -> np.ndarray:
    """The head items, by released count (ties by item id): public, the same on every party."""
    m = min(_options(state.config).topk_items, state.n_items)
    counts = state.counts_hat if state.counts_hat is not None else np.zeros(state.n_items)
    return np.sort(np.argsort(-np.asarray(counts, dtype=np.float64), kind="stable")[:m])


def _rows(shard: UserShard, state: als.PublicState, items: np.ndarray):
    """The shard's binary rows over ``items`` (users x M, scipy CSR), unit-normalized when
    private (a user with no head item contributes nothing)."""
    import scipy.sparse as sp

    pos = np.full(state.n_items, -1, dtype=np.int64)
    pos[items] = np.arange(len(items))
    col = pos[shard.items]
    keep = col >= 0
    rows = shard.local_user_of_rating[keep]
    X = sp.csr_matrix((np.ones(int(keep.sum())), (rows, col[keep])), shape=(shard.n_users, len(items)))
    X.sum_duplicates()
    X.data[:] = 1.0
    if state.private:
        norms = np.sqrt(np.asarray(X.sum(axis=1)).ravel())
        X = sp.diags(1.0 / np.maximum(norms, 1.0)) @ X
    return X


class TopKStep(AlternatingStep):
    """One release of the head's co-occurrence statistic, then EASE on the server."""

    def setup(self, state: als.PublicState, features):
        als.server_init(state)  # rank 0: no item embeddings
        return None

    def client(self, shard: UserShard, state: als.PublicState, step: int, table=None):
        X = _rows(shard, state, head(state))
        return ((X.T @ X).toarray(),)  # the shard's sums, in the order of parts()

    def parts(self, state: als.PublicState) -> list[Part]:
        m = len(head(state))
        return [Part(RELEASE, 0, (m, m), True)]

    def sums(self, parts: list, state: als.PublicState) -> tuple:
        m = len(head(state))
        total = np.zeros((m, m))
        for (G,) in parts:
            total += G
        return (total,)

    def release(self, sums: tuple, state: als.PublicState, ledger) -> object:
        return als.release_gaussian(RELEASE, sums[0], state, ledger, symmetric=True)

    def server(self, release, state: als.PublicState, server) -> None:
        state.item_item = ease(np.asarray(release, dtype=np.float64), ridge(state)).astype(np.float32)


def ridge(state: als.PublicState) -> float:
    """The EASE ridge: private, ``topk_reg`` (default :data:`REG_UNITS`) times the noise std
    times sqrt(M); non-private, ``topk_reg`` (default :data:`NONPRIVATE_REG`)."""
    opts = _options(state.config)
    if not state.private:
        return opts.topk_reg or NONPRIVATE_REG
    sigma = als.noise_std(RELEASE, state)
    return (opts.topk_reg or REG_UNITS) * sigma * math.sqrt(max(len(head(state)), 1))


def ease(G: np.ndarray, lam: float) -> np.ndarray:
    """EASE's closed form on a (released) Gram matrix: B = -P / diag(P), diag 0."""
    m = G.shape[0]
    if m == 0:
        return np.zeros((0, 0))
    P = np.linalg.inv(G + lam * np.eye(m))
    B = -P / np.diag(P)[None, :]
    np.fill_diagonal(B, 0.0)
    return B


def scores(shard: UserShard, state: als.PublicState, candidates: np.ndarray) -> np.ndarray:
    """(users, candidates) ranking scores: the standardized item-item score of the user's own
    history on the head items plus ``topk_blend`` times the standardized released log-popularity;
    items outside the head (or every item, without the statistic) by popularity alone, below
    the head."""
    from .ranking import popularity_prior, standardized

    prior = popularity_prior(state)
    out = np.broadcast_to(prior if prior is not None else np.zeros(state.n_items), (shard.n_users, state.n_items)).copy()
    B = state.item_item
    items = head(state)
    if B is not None and len(items) > 1 and B.shape == (len(items), len(items)):
        raw = np.asarray(_rows(shard, state, items) @ B.astype(np.float64))
        out *= _options(state.config).topk_blend
        out[:, items] += standardized(raw, axis=1)
        outside = np.ones(state.n_items, dtype=bool)
        outside[items] = False
        out[:, outside] -= 1e6  # below every head item, in popularity order
    return out[:, np.asarray(candidates, dtype=np.int64)]


def step_releases(cfg, share: float) -> list[PlannedRelease]:
    """One release of the statistic (none without head items: private popularity)."""
    return [PlannedRelease(RELEASE, 1, share)] if _options(cfg).topk_items > 0 else []


def n_steps(cfg) -> int:
    return 1 if _options(cfg).topk_items > 0 else 0


class TopKRule:
    """The noise-aware rule of ``topk`` (see the module docstring)."""

    def choose(self, epsilon: float, delta: float, n_items: int, n_users: int) -> dict:
        S = self.signal(epsilon, delta, n_users)
        if S < SIGNAL_MIN:
            return {"topk_items": 0, "share_counts": 0.96, "share_mean": 0.02}  # the counts take what the statistic would have had
        m = int(min(n_items, HEAD_MAX, max(2, round(HEAD_PER_SIGNAL * S))))
        return {"topk_items": m, "topk_reg": REG_UNITS, "topk_blend": BLEND, "share_counts": SHARE_COUNTS, "share_mean": 0.02}

    @staticmethod
    def signal(epsilon: float, delta: float, n_users: int) -> float:
        """S = n_users sqrt(rho) (the per-item snr of one item: halved under replace-one)."""
        from .defaults import snr

        return snr(epsilon, delta, 1, n_users)

    def explain(self, cfg, epsilon: float, delta: float, n_items: int, n_users: int) -> str:
        S = self.signal(epsilon, delta, n_users)
        m = _options(cfg).topk_items
        if m == 0:
            return (f"private popularity: signal {S:.3g} = released users x sqrt(rho) < {SIGNAL_MIN:g}, "
                    "the item-item statistic does not pay at this epsilon")
        return (f"EASE on the released co-occurrence of the {m} head items (signal {S:.3g} >= {SIGNAL_MIN:g}; "
                f"head {HEAD_PER_SIGNAL:g} x signal, at most {HEAD_MAX}), ridge {_options(cfg).topk_reg:g} noise std x sqrt(M)")


@dataclass(frozen=True, kw_only=True)
class _TopKConfig(AlgorithmConfig):
    """The family's own keys (:class:`TopKOptions`), typed; None: the rule's or the default."""

    topk_items: int | None = None
    topk_reg: float | None = None
    topk_blend: float | None = None


@dataclass(frozen=True, kw_only=True)
class TopK(_TopKConfig):
    """Private top-k (``topk``): the head size, the ridge (in noise std x sqrt(M)) and the
    popularity blend; None lets the noise-aware rule choose."""


@dataclass(frozen=True, kw_only=True)
class EASE(_TopKConfig):
    """Non-private EASE (``ease``): the head size (default every item), the ridge and the blend."""


_COMMON = dict(
    needs_counts=True,
    step=TopKStep(),
    step_releases=step_releases,
    contribution="parts",
    options=TopKOptions,
    ranker=scores,
    n_steps=n_steps,
)

SPEC = register(
    AlgorithmSpec(
        "topk",
        no_rating_weights,
        needs_user_count=True,
        summary="private top-k: EASE on one released item co-occurrence of the head items (private popularity when it does not pay)",
        defaults=(("rank", "0"), ("steps", "1"), ("defaults", "noise-aware"), ("share_counts", "0.9"), ("share_mean", "0.08"),
                  ("item_bias", "true"), ("user_bias", "false")),
        fixed=("rank", "steps"),
        rule=TopKRule(),
        typed=TopK,
        **_COMMON,
    )
)

EASE = register(
    AlgorithmSpec(
        "ease",
        no_rating_weights,
        private=False,
        summary="non-private EASE on the binary rating matrix (the top-k reference)",
        defaults=(("rank", "0"), ("steps", "1"), ("item_bias", "true"), ("user_bias", "false"), ("topk_items", str(10**9)),
                  ("topk_reg", str(NONPRIVATE_REG)), ("topk_blend", "0")),
        fixed=("rank", "steps"),
        typed=EASE,
        **_COMMON,
    )
)
