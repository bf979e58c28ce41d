"""Alternating least squares with user-level DP on the item side: ALS, DPALS (uniform and
tail-biased sampling) and AdaDPALS (adaptive weights).

The algorithm is split into pure functions by who runs them:

- client functions take one :class:`~fedpriv.algorithms.shards.UserShard` (one user or many)
  and public values (the broadcast item embeddings, the released mean, counts and weights),
  and return per-shard contributions that are already clipped per user;
- aggregator functions sum contributions and add the calibrated noise through the ledger (the
  only code that sees un-noised sums);
- server functions post-process noised releases (PSD projection, item solve).

Both engines (in-process, Flower) call these same functions.

Sensitivities (add/remove one user, all of their ratings), with user vectors clipped to norm
``user_clip`` (G_u), centred ratings clipped to ``rating_clip`` (G_y) and per-user weights
with sum_i w_ij^2 <= beta:

- item statistics A (upper triangles of sum_j w_ij u_j u_j^T): sqrt(beta) G_u^2
- item statistics b (sum_j w_ij y_ij u_j): sqrt(beta) G_u G_y
- gravity sum_j u_j u_j^T (implicit data): G_u^2
- counts (each user adds min(1, sqrt(K / n_j)) to each of its n_j items): sqrt(K)
- mean (each user adds a_j (sum_i y_ij, n_j) with a_j = min(1, C / n_j)): C sqrt(y_max^2 + 1)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from ..privacy.clipping import clip_values
from ..privacy.ledger import PrivacyLedger, public_gaussian
from ..privacy.target import ADD_REMOVE
from ..privacy.weights import adaptive_omega, uniform_user_weights
from . import options, registry
from .config import ALSConfig  # noqa: F401 - the family's config, re-exported
from .kernels import (
    Targets,
    project_psd,
    project_psd_solve,
    released_rows,
    segment_solve,
    segment_stats,
    solve_spd,
    stack_rows,
    sum_rows,
)
from .shards import UserShard

if TYPE_CHECKING:
    from ..privacy.accounting import PlannedRelease


# ---------------------------------------------------------------------------- public state
@dataclass
class PublicState:
    """Everything the server broadcasts: released (noised) values and public choices only."""

    algorithm: str
    config: ALSConfig
    n_items: int
    n_users: int  # private runs that use it: the released (noised) number of users
    rating_range: tuple[float, float]
    implicit: bool = False
    mean: float = 0.0
    counts_hat: np.ndarray | None = None
    omega: np.ndarray | None = None
    item_factors: np.ndarray | None = None
    item_bias: np.ndarray | None = None
    item_support: np.ndarray | None = None  # bias stage: the released per-item weight sums W
    encoder_params: np.ndarray | None = None  # am-dpsgd: the public encoder, broadcast to clients
    # topk / ease: the item-item model over the head items (post-processing of the released statistic)
    item_item: np.ndarray | None = field(default=None, repr=False)
    # the AM-SSP family's released encoder, flattened (kept for saved models; never broadcast)
    encoder_release: np.ndarray | None = field(default=None, repr=False)
    multipliers: dict[str, float] = field(default_factory=dict)
    # the noise-aware rule's choice and its reason (public numbers; server only, never broadcast)
    choice: dict | None = field(default=None, repr=False)

    @property
    def spec(self) -> registry.AlgorithmSpec:
        return registry.get(self.algorithm)

    @property
    def private(self) -> bool:
        return self.spec.private


def validate_algorithm(name: str) -> None:
    registry.get(name)


def needs_counts(algorithm: str, cfg: ALSConfig | None = None) -> bool:
    """The weights need released item counts (not when the run is the bias stage alone)."""
    return registry.get(algorithm).needs_counts and (cfg is None or cfg.steps > 0)


def needs_user_count(algorithm: str, cfg: ALSConfig | None = None) -> bool:
    """The server step uses the number of users n (eq. 16's normalisation, DP-SGD's expected
    batch q*n), the noise-aware defaults read it, or the bias stage of implicit data (gravity)
    weighs the unobserved entries by it: private runs release it (sensitivity 1) instead of
    reading it off the data."""
    if registry.get(algorithm).needs_user_count:
        return True
    return cfg is not None and (cfg.defaults == "noise-aware" or (cfg.gravity > 0 and has_bias_stage(algorithm, cfg)))


def has_bias_stage(algorithm: str, cfg: ALSConfig) -> bool:
    """The run starts with the private bias model (``bias_stage``): algorithms whose clients send
    per-item statistics (the ALS family and the AM-SSP family)."""
    if not cfg.bias_stage:
        return False
    spec = registry.get(algorithm)
    if spec.contribution != "stats" and cfg.steps > 0:  # its steps estimate their own biases
        raise ConfigError(
            f"{algorithm} has no bias stage before its steps "
            "(the ALS and AM-SSP families only; with steps=0 it is the bias model alone)",
            field="bias_stage",
        )
    return True


def item_bias_coordinate(cfg: ALSConfig) -> bool:
    """Released user vectors carry the fixed bias coordinate: the steps estimate item biases
    (not when the bias stage has fixed them)."""
    return cfg.item_bias and not cfg.bias_stage


def needs_mean(algorithm: str, implicit: bool) -> bool:
    """Explicit ratings are centred by a released mean (the logistic model needs none)."""
    return not implicit and registry.get(algorithm).centred


def resamples(algorithm: str, cfg: ALSConfig) -> int:
    """Independent noise draws of the item statistics per alternating step (SSP1 vs SSP2)."""
    return registry.get(algorithm).noisings(cfg)


def plan_releases(algorithm: str, cfg: ALSConfig, implicit: bool) -> list[PlannedRelease]:
    """The releases a private run will make, with their budget shares (see ``calibrate``): the
    pre-processing releases its spec asks for, then its step releases."""
    from ..privacy.accounting import PlannedRelease  # the server's planning: dp-accounting, never on a client

    spec = registry.get(algorithm)
    if not spec.private:
        return []
    plan: list[PlannedRelease] = []
    rest = 1.0
    for name, wanted, share in (
        ("users", needs_user_count(algorithm, cfg), cfg.share_users),
        ("mean", needs_mean(algorithm, implicit), cfg.share_mean),
        ("counts", needs_counts(algorithm, cfg), cfg.share_counts),
        ("bias", has_bias_stage(algorithm, cfg), cfg.share_bias),
    ):
        if wanted:
            plan.append(PlannedRelease(name, 1, share))
            rest -= share
    if cfg.steps > 0:
        plan += list(spec.step_releases(cfg, rest / cfg.steps))
    elif plan and plan[-1].name == "bias":  # the bias model alone: the stage takes the rest
        plan[-1] = PlannedRelease("bias", 1, cfg.share_bias + rest)
    if cfg.aggregation.secure:
        # distributed Skellam noise has no subsampled accountant event: no amplification credit
        plan = [PlannedRelease(p.name, p.count, p.share) for p in plan]
    return plan


def calibrate_plan(
    algorithm: str, cfg: ALSConfig, implicit: bool, epsilon: float, delta: float, relation: str = ADD_REMOVE
) -> dict[str, float]:
    """The noise multipliers of the plan, calibrated to (epsilon, delta) under the neighbouring
    ``relation`` (:mod:`fedpriv.privacy.target`)."""
    from ..privacy.accounting import calibrate

    plan = plan_releases(algorithm, cfg, implicit)
    if not plan:
        return {}
    # secure mode: the releases carry Skellam noise, whose RDP bound holds at integer orders only
    secure = cfg.aggregation.secure
    if (
        cfg.defaults == "noise-aware"
        and registry.get(algorithm).resamples is not None
        and needs_user_count(algorithm, cfg)
    ):
        # SSP1 noises each step's statistics once per server step (hundreds of releases): the
        # user count that the noise-aware rule reads is calibrated as if each step were noised
        # once (as for SSP2), then pinned, so that its noise does not grow with the resampling
        import dataclasses

        once_cfg = dataclasses.replace(
            cfg, options=dataclasses.replace(options.of(cfg, options.SSPOptions), ssp_resamples=1)
        )
        once = calibrate(
            plan_releases(algorithm, once_cfg, implicit), epsilon, delta, integer_orders=secure, relation=relation
        ).multipliers
        return calibrate(
            plan, epsilon, delta, pinned={"users": once["users"]}, integer_orders=secure, relation=relation
        ).multipliers
    return calibrate(plan, epsilon, delta, integer_orders=secure, relation=relation).multipliers


# ---------------------------------------------------------------------------- sensitivities
def mean_bound(rating_range: tuple[float, float]) -> float:
    lo, hi = rating_range
    return max(abs(lo), abs(hi))


def sensitivity(name: str, cfg: ALSConfig, rating_range: tuple[float, float]) -> float:
    """The per-user L2 sensitivity a release declared (:func:`fedpriv.algorithms.registry.register_release`)."""
    return registry.release_sensitivity(name, cfg, rating_range)


# the built-in releases and their sensitivities (one user's contribution, L2)
registry.register_release("users", lambda cfg, rr: 1.0)
registry.register_release("mean", lambda cfg, rr: cfg.mean_cap * math.sqrt(mean_bound(rr) ** 2 + 1.0))
registry.register_release("counts", lambda cfg, rr: math.sqrt(cfg.count_cap))
registry.register_release(
    "bias", lambda cfg, rr: math.sqrt(2.0 * cfg.beta)
)  # per item (sum w, sum w clip(y) / c), sum_i w_i^2 <= beta
registry.register_release("item_stats_A", lambda cfg, rr: math.sqrt(cfg.beta) * cfg.user_clip**2)
registry.register_release("item_stats_b", lambda cfg, rr: math.sqrt(cfg.beta) * cfg.user_clip * cfg.rating_clip)
registry.register_release("gravity", lambda cfg, rr: cfg.user_clip**2)
registry.register_release(
    "item_stats_H", lambda cfg, rr: math.sqrt(cfg.beta) * cfg.user_clip**2 / 4.0
)  # logistic: d2l <= 1/4
registry.register_release("item_stats_g", lambda cfg, rr: math.sqrt(cfg.beta) * cfg.user_clip)  # logistic: |dl| <= 1
registry.register_release("dpsgd_grad", lambda cfg, rr: options.of(cfg, options.Sampled).sgd_clip)
registry.register_release("encoder_grad", lambda cfg, rr: options.of(cfg, options.Sampled).sgd_clip)


# ---------------------------------------------------------------------------- client side
def client_user_count(shard: UserShard) -> np.ndarray:
    """Per-shard contribution to the user count: one per user."""
    return np.array([float(shard.n_users)])


def client_mean(shard: UserShard, cfg: ALSConfig, rating_range: tuple[float, float], private: bool) -> np.ndarray:
    """Per-shard contribution (sum of ratings, number of ratings), each user capped at C ratings."""
    lo, hi = rating_range
    y = np.clip(np.nan_to_num(shard.ratings.astype(np.float64), nan=lo), lo, hi)
    n = np.diff(shard.indptr).astype(np.float64)
    per_user = np.bincount(shard.local_user_of_rating, weights=y, minlength=shard.n_users)  # no ratings: 0
    a = np.minimum(1.0, cfg.mean_cap / np.maximum(n, 1.0)) if private else np.ones_like(n)
    return np.array([np.sum(a * per_user), np.sum(a * n)])


def client_counts(shard: UserShard, cfg: ALSConfig, n_items: int, private: bool) -> np.ndarray:
    """Per-shard item-count contribution; each user's vector has L2 norm <= sqrt(count_cap)."""
    n = np.diff(shard.indptr).astype(np.float64)
    a = np.minimum(1.0, np.sqrt(cfg.count_cap / np.maximum(n, 1.0))) if private else np.ones_like(n)
    return np.bincount(shard.items, weights=np.repeat(a, np.diff(shard.indptr)), minlength=n_items)


def client_bias_stats(shard: UserShard, state: PublicState) -> np.ndarray:
    """The shard's contribution to the bias stage: each user solves its bias c_j locally
    (against the released mean; on implicit data c_j = 0), and adds, on each item i it rated,
    the weight w_ij = min(1, sqrt(beta / n_j)) and w_ij clip(r_ij - mean - c_j) / rating_clip
    (private runs clip; the vector is (2, n_items) flattened, sum_i w_ij^2 <= beta per user)."""
    cfg = state.config
    y = np.ones(shard.n_ratings) if state.spec.implicit_targets else shard.ratings.astype(np.float64) - state.mean
    n = np.diff(shard.indptr).astype(np.float64)
    per_user = np.bincount(shard.local_user_of_rating, weights=y, minlength=shard.n_users)
    reg = cfg.reg_user * (np.maximum(n, 1.0) if cfg.weighted_reg else 1.0)
    # implicit data (gravity > 0): every observed entry is 1, so a user's own bias would absorb
    # it and leave no signal; the items' sums of weights (their weighted popularity) are the signal
    c = per_user / np.maximum(n + reg, 1e-12) if cfg.user_bias and cfg.gravity == 0 else np.zeros(shard.n_users)
    y = y - c[shard.local_user_of_rating]
    if state.private:
        y = clip_values(y, cfg.rating_clip) / cfg.rating_clip
    w = uniform_user_weights(shard.indptr, cfg.beta)
    return np.concatenate(
        [
            np.bincount(shard.items, weights=w, minlength=state.n_items),
            np.bincount(shard.items, weights=w * y, minlength=state.n_items),
        ]
    )


PRE_RELEASES = ("users", "mean", "counts", "bias")


def pre_release_length(kind: str, state: PublicState) -> int:
    """The length of a pre-processing release's summed vector (what a reply must carry)."""
    return {"users": 1, "mean": 2, "counts": state.n_items, "bias": 2 * state.n_items}[kind]


def client_vector(kind: str, shard: UserShard, state: PublicState) -> np.ndarray:
    """The shard's clipped contribution to a pre-processing release ('users', 'mean' or
    'counts'), in any engine and aggregation mode."""
    cfg = state.config
    if kind == "users":
        return client_user_count(shard)
    if kind == "mean":
        return client_mean(shard, cfg, state.rating_range, state.private)
    if kind == "counts":
        return client_counts(shard, cfg, state.n_items, state.private)
    if kind == "bias":
        return client_bias_stats(shard, state)
    raise ValueError(f"unknown pre-processing release {kind!r}")


def client_targets(shard: UserShard, state: PublicState, *, minus_item_bias: bool = True) -> np.ndarray:
    """Ratings minus the released mean (implicit data: mean 0) and, for the user solve, minus
    the item biases (the item solve re-estimates them, unless the bias stage fixed them)."""
    return client_target_terms(shard, state, minus_item_bias=minus_item_bias).values()


def client_target_terms(shard: UserShard, state: PublicState, *, minus_item_bias: bool = True) -> Targets:
    """:func:`client_targets` as a :class:`~fedpriv.algorithms.kernels.Targets`: the kernels
    make the values where they compute (on a device, from the shard's ratings kept there)."""
    if state.spec.implicit_targets:
        y = Targets(shard.n_ratings)
    else:
        y = Targets(shard.n_ratings, shard.ratings, float(state.mean))
    if (minus_item_bias or state.config.bias_stage) and state.item_bias is not None:
        y = y.minus(state.item_bias, shard.items)
    return y


def bias_coordinate(state: PublicState) -> float:
    """The fixed last coordinate of released user vectors (0 without ``item_bias``)."""
    cfg = state.config
    if not item_bias_coordinate(cfg):
        return 0.0
    return math.sqrt(cfg.bias_share) * cfg.user_clip if state.private else 1.0


def released_user_vectors(U: np.ndarray, state: PublicState) -> np.ndarray:
    """User factors as they enter the item statistics: clipped (private runs) so that the
    vector, with its fixed bias coordinate, has norm <= user_clip."""
    cfg = state.config
    kappa = bias_coordinate(state)
    return released_rows(
        U,
        math.sqrt(cfg.user_clip**2 - kappa**2) if state.private else None,
        kappa if item_bias_coordinate(cfg) else None,
    )


def user_design(state: PublicState) -> np.ndarray:
    """Item embeddings as seen by the user solve: with ``user_bias``, a fixed column of ones."""
    V = state.item_factors
    if state.config.user_bias:
        V = np.hstack([V, np.ones((V.shape[0], 1), dtype=V.dtype)])
    return V


#: the users' solves run in chunks of users whose Gram blocks hold at most this many floats
USER_CHUNK_FLOATS = 1 << 27


def client_user_vectors(
    shard: UserShard,
    state: PublicState,
    chunk_floats: int | None = None,
    *,
    targets: np.ndarray | Targets | None = None,
) -> np.ndarray:
    """Exact local least squares for every user of the shard (never released). ``targets``:
    :func:`client_targets` of the shard (or their :func:`client_target_terms`) when the caller
    has them already.

    Returns (n_users, d) factors, or (n_users, d + 1) with the user's bias last when
    ``user_bias`` is on, in float64; on a device, left there (a
    :class:`fedpriv.util.device.DeviceArray`, which host code reads as a numpy array).
    """
    cfg = state.config
    V = user_design(state)
    d = V.shape[1]
    y = client_target_terms(shard, state) if targets is None else targets
    pieces = []
    gravity = cfg.gravity * (V.T.astype(np.float64) @ V) if cfg.gravity > 0 else None
    step = max(1, (chunk_floats or USER_CHUNK_FLOATS) // ((d + 1) ** 2))
    counts = np.diff(shard.indptr)
    if step < shard.n_users:  # several chunks: one read-only copy, which a device copies once
        V = np.array(V)
        V.flags.writeable = False
    for u0 in range(0, shard.n_users, step):
        u1 = min(u0 + step, shard.n_users)
        s, e = shard.indptr[u0], shard.indptr[u1]
        n = counts[u0:u1].astype(np.float64)
        reg = cfg.reg_user * (np.maximum(n, 1.0) if cfg.weighted_reg else 1.0)
        pieces.append(segment_solve(V, shard.items[s:e], shard.indptr[u0 : u1 + 1] - s, y[s:e], reg, gravity))
    return stack_rows(pieces, d)  # on a device, left there (a DeviceArray) for the item statistics


def split_user_vectors(U: np.ndarray, state: PublicState) -> tuple[np.ndarray, np.ndarray]:
    """(factors, biases) of solved user vectors; biases are zero without ``user_bias``."""
    if state.config.user_bias:
        return U[:, :-1], U[:, -1]
    return U, np.zeros(len(U))


def client_rating_weights(shard: UserShard, state: PublicState) -> np.ndarray:
    """Per-rating weights with sum_i w_ij^2 <= beta for every user: the algorithm's own rule
    (:attr:`fedpriv.algorithms.registry.AlgorithmSpec.rating_weights`).

    A rule reads the shard, the configuration, the released counts and omega, all fixed for a
    run: the shard keeps the last weights with a digest of those inputs and returns them,
    read-only, while the digest holds (every step of a run after the first; on a device their
    prepared copy stays there too, :func:`fedpriv.util.device.kept`)."""
    key = _weights_key(state)
    memo = shard.__dict__.get("_rating_weights")
    if memo is not None and memo[0] == key:
        return memo[1]
    w = np.array(registry.get(state.algorithm).rating_weights(shard, state), dtype=np.float64)
    w.flags.writeable = False
    shard.__dict__["_rating_weights"] = (key, w)
    return w


def _weights_key(state: PublicState) -> bytes:
    """A digest of what a rating-weight rule reads besides the shard."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([state.algorithm, state.config.to_dict()], sort_keys=True, default=str).encode())
    for arr in (state.omega, state.counts_hat):
        h.update(b"-" if arr is None else np.ascontiguousarray(arr, dtype=np.float64).tobytes() + b"|")
    return h.digest()


@dataclass
class ItemStats:
    """A shard's contribution to the per-item statistics (only the items it rated)."""

    item_ids: np.ndarray  # (k,) int64
    A: np.ndarray  # (k, d, d)
    b: np.ndarray  # (k, d)
    gravity: np.ndarray | None = None  # (d, d): sum of the shard's u u^T


def client_item_stats(shard: UserShard, state: PublicState) -> ItemStats:
    """Local user update followed by the shard's clipped, weighted per-item statistics."""
    cfg = state.config
    y = client_target_terms(shard, state, minus_item_bias=False)
    y_user = y.minus(state.item_bias, shard.items) if (not cfg.bias_stage and state.item_bias is not None) else y
    U, bias = split_user_vectors(client_user_vectors(shard, state, targets=y_user), state)
    y = y.minus(bias, shard.local_user_of_rating)
    U = released_user_vectors(U, state)
    if state.private:
        y = y.clipped(cfg.rating_clip)
    w = client_rating_weights(shard, state)
    order = shard.by_item_order
    item_ids, indptr = shard.item_groups
    stats = segment_stats(U, shard.by_item_local_users, indptr, weights=w, targets=y, order=order)
    gravity = U.T @ U if cfg.gravity > 0 else None  # includes the bias coordinate
    return ItemStats(item_ids=item_ids.astype(np.int64), A=stats.A, b=stats.b, gravity=gravity)


# ---------------------------------------------------------------------------- aggregator
def sum_item_stats(parts: list[ItemStats], n_items: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The float64 sums of the parts' item statistics (on a device, made there:
    :func:`fedpriv.algorithms.kernels.sum_rows`)."""
    A = sum_rows((n_items, d, d), [(p.item_ids, p.A) for p in parts])
    b = sum_rows((n_items, d), [(p.item_ids, p.b) for p in parts])
    g = None
    for p in parts:
        if p.gravity is not None:
            g = p.gravity.astype(np.float64) if g is None else g + p.gravity
    return A, b, g


def noise_std(name: str, state: PublicState) -> float:
    """The standard deviation of the noise on each entry of release ``name`` (public: the
    calibrated multiplier times the sensitivity)."""
    return state.multipliers[name] * sensitivity(name, state.config, state.rating_range)


def release_gaussian(name: str, total, state: PublicState, ledger: PrivacyLedger | None, **kw):
    """Noise ``total`` through the ledger with the calibrated multiplier (non-private: as is)."""
    if not state.private:
        return total
    return ledger.gaussian(
        name,
        total,
        sensitivity=sensitivity(name, state.config, state.rating_range),
        noise_multiplier=state.multipliers[name],
        **kw,
    )


def release_user_count(total: np.ndarray, state: PublicState, ledger: PrivacyLedger | None) -> int:
    """The released number of users (at least 1); non-private runs keep the exact count."""
    total = release_gaussian("users", np.asarray(total, dtype=np.float64), state, ledger)
    return max(1, int(round(float(total[0]))))


def release_mean(total: np.ndarray, state: PublicState, ledger: PrivacyLedger | None) -> float:
    total = release_gaussian("mean", total, state, ledger)
    lo, hi = state.rating_range
    return float(np.clip(total[0] / max(total[1], 1.0), lo, hi))


def release_counts(total: np.ndarray, state: PublicState, ledger: PrivacyLedger | None) -> np.ndarray:
    return np.asarray(release_gaussian("counts", total, state, ledger), dtype=np.float64)


def release_bias(total: np.ndarray, state: PublicState, ledger: PrivacyLedger | None) -> np.ndarray:
    """The bias stage: item biases c * B_i / (max(W_i, 0) + ridge) from the (noised) per-item
    sums of weights W and of scaled residuals B (post-processing); the private ridge is
    ``reg_item_private`` plus ``bias_ridge_units`` noise standard deviations of W. On implicit
    data (``gravity`` > 0) every user's unobserved entries pull each item's bias towards 0 with
    weight ``gravity``, so the denominator gains gravity * n (n the released user count): the
    rank-0 case of the family's gravity term, and what the ``bias`` algorithm's step computes.
    Without it the residuals of all-ones data are nearly constant and the noise ranks the items."""
    cfg = state.config
    total = np.asarray(release_gaussian("bias", np.asarray(total, dtype=np.float64), state, ledger), dtype=np.float64)
    W, B = total[: state.n_items], total[state.n_items :]
    state.item_support = W
    unobserved = cfg.gravity * state.n_users
    if state.private:
        ridge = cfg.reg_item_private + cfg.bias_ridge_units * noise_std("bias", state)
        return cfg.rating_clip * B / (np.maximum(W, 0.0) + ridge + unobserved)
    return B / (W + cfg.reg_item * np.maximum(W, 1.0) + unobserved)


def bias_feature_prior(state: PublicState, features) -> None:
    """Post-processing of the bias stage's release with public item features: each item's bias
    is shrunk towards the effect of its feature groups (genres, year bucket, ...) instead of
    towards 0. A group's effect pools the released per-item sums of all its items, B_f / (W_f +
    ridge), so its noise is that of one item times sqrt(items) against a signal of many: a
    rarely rated item gets a far better prior than 0. No release and no budget: only the
    released W and B (recovered from the biases) and the public features are read."""
    cfg = state.config
    if state.item_support is None or state.item_bias is None or not state.private:
        return
    W = np.maximum(np.asarray(state.item_support, dtype=np.float64), 0.0)
    ridge = cfg.reg_item_private + cfg.bias_ridge_units * noise_std("bias", state)
    denom = W + ridge + cfg.gravity * state.n_users
    B = np.asarray(state.item_bias, dtype=np.float64) * denom / cfg.rating_clip  # the released numerator
    prior = feature_group_prior(features, state.n_items, B, W, ridge)
    if prior is not None:
        state.item_bias = cfg.rating_clip * (B + ridge * prior) / denom


def feature_group_prior(
    features, n_items: int, numerator: np.ndarray, weight: np.ndarray, ridge: float
) -> np.ndarray | None:
    """Each item's prior: the mean pooled effect of its public feature groups, where a group's
    effect is sum(numerator) / (sum(weight) + ridge) over its items (0 for an item without
    features); None without a usable feature table. Post-processing of released sums only."""
    if features is None:
        return None
    import scipy.sparse as sp

    X = sp.csr_matrix(features.matrix, dtype=np.float64)
    if X.shape[0] != n_items or X.shape[1] == 0:
        return None
    group = (X.T @ numerator) / (X.T @ weight + ridge)  # per feature: the pooled effect
    active = np.asarray(X.sum(axis=1)).ravel()
    return (X @ group) / np.maximum(active, 1.0)


#: the release function of each pre-processing release (its exact or noised sum -> the value the
#: state keeps): one table for the central aggregator, the secure rounds and the tests
PRE_RELEASE_FUNCTIONS = {
    "users": release_user_count,
    "mean": release_mean,
    "counts": release_counts,
    "bias": release_bias,
}
assert tuple(PRE_RELEASE_FUNCTIONS) == PRE_RELEASES


def release_item_stats(A, b, g, state: PublicState, ledger: PrivacyLedger | None):
    """Add the calibrated noise once per step (the only place that sees the exact sums)."""
    A = release_gaussian("item_stats_A", A, state, ledger, symmetric=True)
    b = release_gaussian("item_stats_b", b, state, ledger)
    if g is not None:
        g = release_gaussian("gravity", g, state, ledger, symmetric=True)
    return A, b, g


# ---------------------------------------------------------------------------- server side
def server_weights(state: PublicState) -> None:
    """Adaptive weights omega from the released counts (post-processing)."""
    if state.spec.adaptive:
        cfg = state.config
        state.omega = adaptive_omega(state.counts_hat, cfg.mu, state.n_users, cfg.beta, cfg.beta_bar_ratio)


def server_init(state: PublicState) -> None:
    """Random, data-independent initial item embeddings."""
    rng = np.random.default_rng([state.config.seed, 7])
    d = state.config.rank
    state.item_factors = (public_gaussian(rng, (state.n_items, d), why="item init") * state.config.init_scale).astype(
        np.float32
    )
    if not state.config.bias_stage:  # the bias stage has released them already
        state.item_bias = np.zeros(state.n_items) if state.config.item_bias else None


def private_item_ridge(state: PublicState) -> float:
    """The ridge of private item solves: ``reg_item_private`` plus ``reg_noise_units`` standard
    deviations of the noise on each diagonal entry of the released A (a public quantity: the
    calibrated multiplier times the sensitivity), so that the ridge grows with the noise."""
    cfg = state.config
    if cfg.reg_noise_units <= 0 or "item_stats_A" not in state.multipliers:
        return cfg.reg_item_private
    return cfg.reg_item_private + cfg.reg_noise_units * noise_std("item_stats_A", state)


def step_bias_prior(A: np.ndarray, b: np.ndarray, state: PublicState, features) -> None:
    """Post-processing of the bias model's rank-0 step with public item features (``bias`` with
    ``bias_prior``): each item's bias is shrunk towards the pooled effect of its feature groups
    instead of towards 0, as :func:`bias_feature_prior` does for the bias stage. The step solved
    item_bias_i = kappa b_i / (A_i + ridge) from the released A (kappa^2 times the item's weight
    sum) and b; a group's effect pools the released sums of its items, kappa sum b / (sum A +
    ridge). No release and no budget."""
    cfg = state.config
    if not state.private or cfg.rank != 0 or not item_bias_coordinate(cfg):
        return
    a = np.maximum(np.asarray(A, dtype=np.float64)[:, -1, -1], cfg.psd_floor)
    kb = bias_coordinate(state) * np.asarray(b, dtype=np.float64)[:, -1]
    ridge = private_item_ridge(state)
    prior = feature_group_prior(features, state.n_items, kb, a, ridge)
    if prior is not None:
        state.item_bias = (kb + ridge * prior) / (a + ridge)


def server_item_update(A: np.ndarray, b: np.ndarray, g: np.ndarray | None, state: PublicState) -> None:
    """Item solve from (noised) statistics: PSD projection, regularisation, batched solve;
    sets the state's item factors (and item biases)."""
    cfg = state.config
    A_released = A
    if state.private:
        reg = private_item_ridge(state)
    else:
        reg = cfg.reg_item * (np.maximum(state.counts_hat, 1.0) if cfg.weighted_reg else 1.0)
    if state.private and g is None:
        theta = project_psd_solve(A, b, cfg.psd_floor, reg)  # = solve_spd(project_psd(A), b, reg), one pass
    else:
        if state.private:
            A = project_psd(A, cfg.psd_floor)
        if g is not None:
            g = project_psd(g[None], 0.0)[0] if state.private else g
            A = A + cfg.gravity * g
        theta = solve_spd(A, b, reg)
    if state.private and state.item_support is not None and cfg.factor_floor > 0:
        # items the bias stage saw too little of keep no factors (their solve would be noise)
        theta[state.item_support < cfg.factor_floor * noise_std("bias", state), : cfg.rank] = 0.0
    if item_bias_coordinate(cfg):
        state.item_bias = theta[:, -1] * bias_coordinate(state)
        theta = theta[:, :-1]
        if cfg.rank == 0 and state.item_support is None and state.counts_hat is None:
            # the bias model released no other popularity: its released per-item weight sums
            # (the bias coordinate of A, kappa^2 * sum_j w_ij) are what the ranking reads
            state.item_support = np.asarray(A_released[:, -1, -1], dtype=np.float64) / bias_coordinate(state) ** 2
    state.item_factors = theta.astype(np.float32)


def __getattr__(name: str):
    if name == "ALGORITHMS":  # every registered algorithm of the family (a view of the registry)
        return registry.names()
    raise AttributeError(name)
