"""Top-k recommenders from private statistics of what users rate: ``topk`` (private, the
default private recommender), ``topk-lowrank`` (private) and ``ease`` (their non-private
reference).

Implicit feedback: a rating counts as "rated" (implicit data as given). Each user's binary row
``x`` over the *head* items (the ``M`` items of largest released count, a public choice made
from the released counts on both sides) is scaled to unit L2 norm. Both private forms release a
statistic of the head's co-occurrence ``G = sum_u x_u x_u^T`` with sensitivity 1, through the
ledger (a Gaussian) or, in secure mode, as a Skellam secure sum like every other part:

- ``topk`` (:class:`TopKStep`): one release ``cooc`` of the upper triangle of G itself
  (``||x x^T||_F = ||x||^2 = 1``), and EASE (Steck 2019) on the server,
  ``P = (G + lambda I)^-1, B = -P / diag(P), diag(B) = 0``. A client sends M(M+1)/2 numbers.
- ``topk-lowrank`` (:class:`LowRankStep`): a rank-d sketch by the noisy power method (Hardt and
  Price 2014). Each of ``steps`` releases ``sketch`` is ``G Q + noise`` for the orthonormal
  basis Q (M x d) that every party computes itself from the broadcast factors (one user moves
  it by ``||x|| ||Q^T x|| <= 1``: the bound never rests on what the server sent). The server
  keeps the Nystrom approximation of G from the last sketch, shrunk by s^2 / (s^2 + lambda):
  scoring factors F (M x d) with scores ``(x F) F^T``. A client sends M x d numbers per step.

The ridge ``lambda = topk_reg * sigma * sqrt(M)`` (sigma the release's noise std) grows with the
noise's spectral norm. A user's scores come from their own row and the released model, locally
(no budget), standardized and added to ``topk_blend`` times the standardized released
log-popularity (items outside the head rank below the head, by popularity).

``ease``: EASE without privacy (exact binary rows, not normalized; ``lambda = topk_reg``), the
strong non-private reference beside which private top-k is judged.

The noise-aware rules (:class:`TopKRule`, :class:`LowRankRule`, through
:func:`fedpriv.algorithms.defaults.choose`) read only public or released numbers: epsilon,
delta, the released user count and the catalogue size. Below :data:`SIGNAL_MIN` the statistic
does not pay and the run is private popularity (the counts take the budget the statistic would
have had, exactly as ``popular``); above it, they pick the head size and the ridge. Their
constants were chosen on the validation ratings of ML-100K and ml-latest-small
(docs/how-to/recommendations.md). The low-rank form beat EASE there, but lost to private
popularity on the validation ratings of the 70,000-user preference-dependent synthetic set
(where EASE wins), so EASE stays the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..privacy.records import PlannedRelease
from ..privacy.target import ADD_REMOVE
from . import als, kernels
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
SIGNAL_MIN = 350.0  # below: private popularity (validation: ML-100K at epsilon 1, S 137: 0.06 against 0.14;
#                     Last.fm held-out users at epsilon 1, S 274: 0.094 against 0.115)
HEAD_PER_SIGNAL = 0.75  # head size M = 0.75 S (ml-latest-small: 1000 items beat 2000 at epsilon 20, 500 beat 1000 at 5)
HEAD_MAX = 2000  # at most this many head items (the statistic grows as M^2)
REG_UNITS = 8.0  # lambda in units of sigma sqrt(M) (8, 16, 32 within 0.002 on ml-latest-small)
BLEND = 0.5  # weight of the standardized released log-popularity (validation Recall@10, 3 seeds, against 1.0:
#              ML-100K eps 5 0.1948/0.1951, eps 20 0.2260/0.2238; ml-latest-small eps 5 0.1612/0.1607,
#              eps 20 0.1916/0.1892; 70k synthetic eps 5 0.1625/0.1623)
SHARE_COUNTS = 0.1  # the counts' budget share when the statistic is released
#: a rating below the top fifth of the scale (lo + LIKED_FROM (hi - lo): 4.2 on 1-5, 4.1 on 0.5-5;
#: implicit data: every item) weighs LOW_WEIGHT in the user's row, one in it 1, before the row is
#: scaled to unit norm. Validation Recall@10, 3 seeds, ML-100K eps 5 / 20, ml-latest-small eps 5 / 20:
#: every rating 1 (rated, the first rule): 0.1948 / 0.2260, 0.1612 / 0.1916; LIKED_FROM 0.8:
#: 0.2009 / 0.2326, 0.1739 / 0.1995; 0.75: 0.2022 / 0.2329, 0.1647 / 0.1949 (0.7 the same).
#: LOW_WEIGHT 0.5 beat 0.25 and 0.75 on 3 of the 4 (thresholds 4 and 4.1)
LIKED_FROM = 0.8
LOW_WEIGHT = 0.5
NONPRIVATE_REG = 200.0  # ease: lambda on the exact binary matrix

SKETCH = "sketch"
register_release(SKETCH, lambda cfg, rating_range: 1.0)  # ||x x^T Q||_F = ||x|| ||Q^T x|| <= 1 (Q orthonormal)
#: topk-lowrank's constants, chosen on the validation ratings of ML-100K and ml-latest-small (1-2
#: noise seeds, epsilon 5 and 20; heads of 50-400 items, shrinkage 2-32, keep 0.5-3, rank 16-64,
#: 2-3 steps): the best head grew more slowly than S (100-150 items at S 640 and 2100 on
#: ML-100K, 50-200 on ml-latest-small), so M = 4 sqrt(S)
LOWRANK_HEAD_PER_ROOT_SIGNAL = 4.0
LOWRANK_HEAD_MAX = 50_000
LOWRANK_REG_UNITS = 8.0  # shrinkage s^2 / (s^2 + lambda), lambda in units of sigma sqrt(M) (2 and 32 lost)
LOWRANK_KEEP_UNITS = (
    1.0  # Nystrom keeps the directions of Q^T Y above sigma sqrt(d) (3: 0.13 against 0.20 on ML-100K at epsilon 5)
)


@dataclass(frozen=True)
class TopKOptions:
    """``topk_items``: head items the model covers (0: none, private popularity); ``topk_reg``:
    the ridge (private: in units of sigma sqrt(M); ease: absolute); ``topk_blend``: weight of
    the standardized released log-popularity beside the item-item score."""

    topk_items: int = 0
    topk_reg: float = 0.0
    topk_blend: float = BLEND
    topk_low_weight: float = 1.0  # a rating below the top fifth of the scale (1: every rating counts as rated)

    def validate(self) -> None:
        if self.topk_items < 0:
            raise ConfigError(f"must be >= 0 (0: private popularity), got {self.topk_items}", field="topk_items")
        if not (self.topk_reg >= 0 and math.isfinite(self.topk_reg)):
            raise ConfigError(f"must be a finite number >= 0 (0: the rule's), got {self.topk_reg}", field="topk_reg")
        if not (self.topk_blend >= 0 and math.isfinite(self.topk_blend)):
            raise ConfigError(f"must be a finite number >= 0, got {self.topk_blend}", field="topk_blend")
        if not (0 < self.topk_low_weight <= 1):
            raise ConfigError(f"must be in (0, 1], got {self.topk_low_weight}", field="topk_low_weight")


def _options(cfg) -> TopKOptions:
    return cfg.options if isinstance(cfg.options, TopKOptions) else TopKOptions()


def head(state: als.PublicState) -> np.ndarray:
    """The head items, by released count (ties by item id): public, the same on every party."""
    m = min(_options(state.config).topk_items, state.n_items)
    counts = state.counts_hat if state.counts_hat is not None else np.zeros(state.n_items)
    return np.sort(np.argsort(-np.asarray(counts, dtype=np.float64), kind="stable")[:m])


def _rows(shard: UserShard, state: als.PublicState, items: np.ndarray):
    """The shard's rows over ``items`` (users x M, scipy CSR): 1 for a rated item,
    ``topk_low_weight`` for one rated below the top fifth of the scale; unit-normalized when
    private (a user with no head item contributes nothing)."""
    import scipy.sparse as sp

    pos = np.full(state.n_items, -1, dtype=np.int64)
    pos[items] = np.arange(len(items))
    col = pos[shard.items]
    keep = col >= 0
    rows = shard.local_user_of_rating[keep]
    weights = _weights(shard.ratings[keep], state)
    X = sp.csr_matrix((weights, (rows, col[keep])), shape=(shard.n_users, len(items)))
    X.sum_duplicates()
    X.data[:] = np.minimum(X.data, 1.0)  # a duplicate pair counts once
    if state.private:
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        X = sp.diags(1.0 / np.maximum(norms, 1.0)) @ X
    return X


def _weights(ratings: np.ndarray, state: als.PublicState) -> np.ndarray:
    """A rating's weight in its user's row: 1, or ``topk_low_weight`` below the top fifth of the
    public rating scale."""
    low = _options(state.config).topk_low_weight
    lo, hi = (float(x) for x in state.rating_range)
    return np.where(np.asarray(ratings, dtype=np.float64) >= lo + LIKED_FROM * (hi - lo), 1.0, low)


class TopKStep(AlternatingStep):
    """One release of the head's co-occurrence statistic, then EASE on the server."""

    def setup(self, state: als.PublicState, features):
        als.server_init(state)  # rank 0: no item embeddings
        return None

    def client(self, shard: UserShard, state: als.PublicState, step: int, table=None):
        X = _rows(shard, state, head(state))
        return (kernels.sparse_gram(X),)  # the shard's sums, in the order of parts()

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


def basis(state: als.PublicState) -> np.ndarray:
    """The orthonormal basis (M x d', d' = min(M, rank)) of the broadcast item factors on the
    head. Each party computes it itself from the broadcast: a node's sensitivity bound (Q^T Q =
    I) never rests on what the server sent."""
    F = np.asarray(state.item_factors, dtype=np.float64)[head(state)]
    if not np.all(np.isfinite(F)):
        raise ValueError("topk-lowrank: the broadcast item factors are not finite")
    return np.linalg.qr(F)[0] if F.size else np.zeros((len(F), 0))


def nystrom(Y: np.ndarray, Q: np.ndarray, lam: float, keep: float) -> np.ndarray:
    """Scoring factors F (M x d') from a released sketch Y = G Q + noise: the Nystrom
    approximation G ~ Y C^-1 Y^T (C = Q^T Y symmetrized, only its eigen-directions above
    ``keep``), its eigen-decomposition U s^2 U^T, then F = U sqrt(s^2 / (s^2 + lam)) so that a
    user's scores (x F) F^T are the low-rank ridge regression of their row on itself.
    Post-processing of the release."""
    C = Q.T @ Y
    c, W = np.linalg.eigh((C + C.T) / 2)
    on = c > keep
    F = np.zeros_like(Q)
    if not on.any():
        return F
    U, s, _ = np.linalg.svd(Y @ (W[:, on] / np.sqrt(c[on])), full_matrices=False)
    F[:, : len(s)] = canonical_signs(U) * np.sqrt(s**2 / (s**2 + lam))
    return F


def canonical_signs(U: np.ndarray) -> np.ndarray:
    """``U`` with each column's sign chosen so that its largest entry in absolute value is
    positive: a singular vector's sign is arbitrary, and two back ends (a GPU's float32 sketch, a
    CPU's) may return opposite ones for the same sketch. The scores (x F) F^T do not change."""
    if U.size == 0:
        return U
    top = U[np.argmax(np.abs(U), axis=0), np.arange(U.shape[1])]
    return U * np.where(top < 0, -1.0, 1.0)


class LowRankStep(TopKStep):
    """One power-iteration step of a private randomized low-rank sketch of the head's
    co-occurrence (the noisy power method, Hardt and Price 2014): each user sends x x^T Q
    (M x d, unit-norm x, sensitivity 1), the server releases the sum and updates the scoring
    factors by :func:`nystrom`; their span is the next step's basis."""

    def setup(self, state: als.PublicState, features):
        """The start: the released popularity's square root (close to the statistic's top
        direction) beside public random directions (config seed): released and public only."""
        als.server_init(state)
        if state.counts_hat is not None and state.config.rank > 0:
            state.item_factors[:, 0] = np.sqrt(np.maximum(np.asarray(state.counts_hat, dtype=np.float64), 0.0))
        return None

    def client(self, shard: UserShard, state: als.PublicState, step: int, table=None):
        X = _rows(shard, state, head(state))
        return (kernels.sparse_sketch(X, basis(state)),)

    def parts(self, state: als.PublicState) -> list[Part]:
        m = len(head(state))
        return [Part(SKETCH, 0, (m, min(m, state.config.rank)))]

    def sums(self, parts: list, state: als.PublicState) -> tuple:
        total = 0.0
        for (Y,) in parts:
            total = total + np.asarray(Y, dtype=np.float64)
        return (np.zeros(self.parts(state)[0].shape) + total,)

    def release(self, sums: tuple, state: als.PublicState, ledger) -> object:
        return als.release_gaussian(SKETCH, sums[0], state, ledger)

    def server(self, release, state: als.PublicState, server) -> None:
        Q = basis(state)
        items = head(state)
        sigma = als.noise_std(SKETCH, state) if state.private else 0.0
        lam = (
            (_options(state.config).topk_reg or LOWRANK_REG_UNITS) * sigma * math.sqrt(max(len(items), 1))
            if state.private
            else _options(state.config).topk_reg
        )
        keep = LOWRANK_KEEP_UNITS * sigma * math.sqrt(max(Q.shape[1], 1)) if state.private else 1e-9
        F = nystrom(np.asarray(release, dtype=np.float64), Q, lam, keep)
        factors = np.zeros((state.n_items, state.config.rank), dtype=np.float32)
        factors[items, : F.shape[1]] = F
        state.item_factors = factors


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
    P = kernels.inverse(G + lam * np.eye(m))
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
    row = prior if prior is not None else np.zeros(state.n_items)
    items = head(state)
    raw = _head_scores(shard, state, items)
    if raw is not None:  # the per-item parts made once, on one row: the same sums as on every row
        row = row * _options(state.config).topk_blend
        outside = np.ones(state.n_items, dtype=bool)
        outside[items] = False
        row[outside] -= 1e6  # below every head item, in popularity order
    candidates = np.asarray(candidates, dtype=np.int64)
    every = len(candidates) == state.n_items and np.array_equal(candidates, np.arange(state.n_items))
    out = np.broadcast_to(row, (shard.n_users, state.n_items)).copy()
    if raw is not None:
        out[:, items] += standardized(raw, axis=1, overwrite=True)
    return out if every else out[:, candidates]


def _head_scores(shard: UserShard, state: als.PublicState, items: np.ndarray) -> np.ndarray | None:
    """(users, M) raw item-item scores of the user's own head row: ``x B`` (EASE) or
    ``(x F) F^T`` (the low-rank form), None without a model."""
    if len(items) < 2:
        return None
    B = state.item_item
    if B is not None and B.shape == (len(items), len(items)):
        return np.asarray(_rows(shard, state, items) @ B.astype(np.float64))
    if (
        isinstance(state.spec.alternating_step(), LowRankStep)
        and state.item_factors is not None
        and state.item_factors.shape[0] == state.n_items
    ):
        F = np.asarray(state.item_factors[items], dtype=np.float64)
        return np.asarray((_rows(shard, state, items) @ F) @ F.T)
    return None


def step_releases(cfg, share: float) -> list[PlannedRelease]:
    """One release of the statistic (none without head items: private popularity)."""
    return [PlannedRelease(RELEASE, 1, share)] if _options(cfg).topk_items > 0 else []


def n_steps(cfg) -> int:
    return 1 if _options(cfg).topk_items > 0 else 0


def lowrank_releases(cfg, share: float) -> list[PlannedRelease]:
    """One sketch per power-iteration step (none without head items: private popularity)."""
    return [PlannedRelease(SKETCH, cfg.steps, share)] if _options(cfg).topk_items > 0 else []


def lowrank_steps(cfg) -> int:
    return int(cfg.steps) if _options(cfg).topk_items > 0 else 0


class TopKRule:
    """The noise-aware rule of ``topk`` (see the module docstring)."""

    def choose(self, epsilon: float, delta: float, n_items: int, n_users: int, *, relation: str = ADD_REMOVE) -> dict:
        S = self.signal(epsilon, delta, n_users, relation)
        if S < SIGNAL_MIN:
            return {
                "topk_items": 0,
                "share_counts": 0.96,
                "share_mean": 0.02,
            }  # the counts take what the statistic would have had
        m = int(min(n_items, HEAD_MAX, max(2, round(HEAD_PER_SIGNAL * S))))
        return {
            "topk_items": m,
            "topk_reg": REG_UNITS,
            "topk_blend": BLEND,
            "topk_low_weight": LOW_WEIGHT,
            "share_counts": SHARE_COUNTS,
            "share_mean": 0.02,
        }

    @staticmethod
    def signal(epsilon: float, delta: float, n_users: int, relation: str = ADD_REMOVE) -> float:
        """S = n_users sqrt(rho) (the per-item snr of one item: halved under replace-one)."""
        from .defaults import snr

        return snr(epsilon, delta, 1, n_users, relation)

    def explain(
        self, cfg, epsilon: float, delta: float, n_items: int, n_users: int, *, relation: str = ADD_REMOVE
    ) -> str:
        S = self.signal(epsilon, delta, n_users, relation)
        m = _options(cfg).topk_items
        if m == 0:
            return (
                f"private popularity: signal {S:.3g} = released users x sqrt(rho) < {SIGNAL_MIN:g}, "
                "the item-item statistic does not pay at this epsilon"
            )
        return (
            f"EASE on the released co-occurrence of the {m} head items (signal {S:.3g} >= {SIGNAL_MIN:g}; "
            f"head {HEAD_PER_SIGNAL:g} x signal, at most {HEAD_MAX}), "
            f"ridge {_options(cfg).topk_reg:g} noise std x sqrt(M)"
        )


class LowRankRule(TopKRule):
    """The rule of ``topk-lowrank``: the same fallback as topk; a head of 4 sqrt(S) items."""

    def choose(self, epsilon: float, delta: float, n_items: int, n_users: int, *, relation: str = ADD_REMOVE) -> dict:
        out = super().choose(epsilon, delta, n_items, n_users, relation=relation)
        if out["topk_items"]:
            S = self.signal(epsilon, delta, n_users, relation)
            out.update(
                topk_items=int(
                    min(n_items, LOWRANK_HEAD_MAX, max(2, round(LOWRANK_HEAD_PER_ROOT_SIGNAL * math.sqrt(S))))
                ),
                topk_reg=LOWRANK_REG_UNITS,
            )
        return out

    def explain(
        self, cfg, epsilon: float, delta: float, n_items: int, n_users: int, *, relation: str = ADD_REMOVE
    ) -> str:
        S = self.signal(epsilon, delta, n_users, relation)
        m = _options(cfg).topk_items
        if m == 0:
            return super().explain(cfg, epsilon, delta, n_items, n_users, relation=relation)
        return (
            f"rank-{cfg.rank} sketch of the released co-occurrence of the {m} head items, {cfg.steps} power steps "
            f"(signal {S:.3g} >= {SIGNAL_MIN:g}; head {LOWRANK_HEAD_PER_ROOT_SIGNAL:g} x sqrt(signal)), "
            f"shrinkage {_options(cfg).topk_reg:g} noise std x sqrt(M)"
        )


@dataclass(frozen=True, kw_only=True)
class _TopKConfig(AlgorithmConfig):
    """The family's own keys (:class:`TopKOptions`), typed; None: the rule's or the default."""

    topk_items: int | None = None
    topk_reg: float | None = None
    topk_blend: float | None = None
    topk_low_weight: float | None = None


@dataclass(frozen=True, kw_only=True)
class TopK(_TopKConfig):
    """Private top-k by EASE (``topk``, the default private recommender): the head size, the
    ridge (in noise std x sqrt(M)) and the popularity blend; None lets the noise-aware rule
    choose."""


@dataclass(frozen=True, kw_only=True)
class TopKLowRank(_TopKConfig):
    """Private low-rank top-k (``topk-lowrank``): ``rank`` and ``steps`` (power iterations), the
    head size, the shrinkage (noise std x sqrt(M)) and the blend; None lets the rule choose."""

    rank: int | None = None
    steps: int | None = None


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
    ranker_any_thread=True,  # sparse products and numpy on released values
    n_steps=n_steps,
)

SPEC = register(
    AlgorithmSpec(
        "topk",
        no_rating_weights,
        task="top-k",
        needs_user_count=True,
        summary=(
            "private top-k (the default private recommender): EASE on one released item co-occurrence "
            "of the head items (private popularity when it does not pay; M^2/2 words per client)"
        ),
        defaults=(
            ("rank", "0"),
            ("steps", "1"),
            ("defaults", "noise-aware"),
            ("share_counts", "0.9"),
            ("share_mean", "0.08"),
            ("item_bias", "true"),
            ("user_bias", "false"),
        ),
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
        task="reference: top-k",
        private=False,
        summary="non-private EASE on the binary rating matrix (the top-k reference)",
        defaults=(
            ("rank", "0"),
            ("steps", "1"),
            ("item_bias", "true"),
            ("user_bias", "false"),
            ("topk_items", str(10**9)),
            ("topk_reg", str(NONPRIVATE_REG)),
            ("topk_blend", "0"),
        ),
        fixed=("rank", "steps"),
        typed=EASE,
        **_COMMON,
    )
)

LOWRANK = register(
    AlgorithmSpec(
        "topk-lowrank",
        no_rating_weights,
        task="top-k",
        needs_user_count=True,
        summary=(
            "private top-k, low-rank form: a rank-d sketch of the released item co-occurrence by the noisy "
            "power method, O(items x d) per client (private popularity when it does not pay)"
        ),
        defaults=(
            ("rank", "32"),
            ("steps", "3"),
            ("defaults", "noise-aware"),
            ("share_counts", "0.9"),
            ("share_mean", "0.08"),
            ("item_bias", "true"),
            ("user_bias", "false"),
        ),
        rule=LowRankRule(),
        typed=TopKLowRank,
        **{**_COMMON, "step": LowRankStep(), "step_releases": lowrank_releases, "n_steps": lowrank_steps},
    )
)
