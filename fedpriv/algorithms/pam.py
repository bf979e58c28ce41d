"""DP model personalization (Jain, Rush, Smith, Song and Thakurta, NeurIPS 2021): a shared
d x k embedding U learned with private alternating minimization; each user's personal vector
v_j is solved on its client and never leaves it (billboard model).

Client, aggregator and server functions, as for the ALS family:

- private initialization (Alg. 3): each user sums, over pairs of its samples,
  sym(x_a x_b^T / (|x_a| |x_b|)) clip(y_a) clip(y_b); the sum is noised (symmetric) and the
  top-k eigenvectors of the release are U_0;
- alternating step (Alg. 1 with the SSP instantiation of Alg. 2): each user solves v_j for the
  broadcast U, then sends A_j = sum_i W_i W_i^T and b_j = sum_i clip(y_i) W_i with
  W_i = clip(vec(x_i v_j^T); eta) (dk-vectors); the sums are noised; the server solves
  Z = (PSD(A) + lambda I)^-1 b and returns U = Q of the QR decomposition of Z (d x k);
- schedules: ``full`` (every user in every epoch: the full-batch multi-epoch variant of the
  paper's experiments, ``epochs`` releases composed) or ``disjoint`` (users split into
  ``epochs`` disjoint groups, one step each, as in Alg. 1: parallel composition, one release per
  user; v on the first quarter of a user's samples, statistics on the second, the
  initialization on the second half);
- ``pam-exp`` (Alg. 4, the information-theoretic reference, for small d and k): the exponential
  mechanism over a finite net of orthonormal d x k matrices (public, seeded Haar draws) with
  score(U) = sum_j min_{|v| <= C} mean_i (<clip(U^T x_ij; L_f), v> - clip(y_ij; zeta))^2 over
  the first half of each user's samples; each per-user term lies in [0, (L_f C + zeta)^2]
  (the sensitivity) and adding a user never lowers a score, so the monotone mechanism
  exp(-epsilon score / sensitivity) is epsilon-DP (pure); the ledger accounts it as
  epsilon^2/8-zCDP (bounded range) and also reports the pure epsilon;
- baselines: ``pam-own-data`` (each user alone: ridge regression in d dimensions),
  ``pam-single-model`` (one private global regression vector by SSP), ``pam-nonprivate``.

User-level L2 sensitivities (add/remove one user; P pairs, M samples used per user):
init P zeta^2; A M eta^2 (upper triangle); b M zeta eta; single model A M g_x^2, b M zeta g_x.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from .config import PAMConfig  # noqa: F401 - re-exported
from ..privacy.clipping import clip_rows
from ..privacy.ledger import PrivacyLedger
from ..privacy.target import ADD_REMOVE
from ..privacy.randomness import PURPOSE_GROUP, user_uniform
from .families import Family, ReplyPart, register_family
from .kernels import from_upper, upper

if TYPE_CHECKING:
    from ..privacy.accounting import PlannedRelease

PAM_ALGORITHMS = ("pam", "pam-own-data", "pam-single-model", "pam-nonprivate", "pam-exp")
PRIVATE = ("pam", "pam-single-model", "pam-exp")


@dataclass
class PAMState:
    """The broadcast public state: released values and public choices only."""

    algorithm: str
    config: PAMConfig
    d: int
    k: int
    samples: int
    multipliers: dict
    U: np.ndarray | None = None  # (d, k) orthonormal
    theta: np.ndarray | None = None  # single model: (d,)
    step: int = 0
    exp_epsilon: float | None = None  # pam-exp: epsilon of the exponential mechanism

    @property
    def private(self) -> bool:
        return self.algorithm in PRIVATE

    # public clip defaults: x ~ N(0, I_d) and v ~ N(0, I_k) are part of the public model;
    # the non-private baselines do not clip (clipping biases the least-squares solution)
    @property
    def eta(self) -> float:
        if not self.private:
            return math.inf
        return self.config.clip_w or math.sqrt(self.d * self.k)

    @property
    def zeta(self) -> float:
        if not self.private:
            return math.inf
        return self.config.clip_y or 2.0 * math.sqrt(self.k)

    @property
    def exp_radius(self) -> float:
        return self.config.exp_radius or 2.5 * math.sqrt(self.k)

    @property
    def exp_clip(self) -> float:
        return self.config.exp_clip or 2.0 * math.sqrt(self.k)

    @property
    def g_x(self) -> float:
        return self.config.clip_x or math.sqrt(self.d)


# ---------------------------------------------------------------------------- sample usage
def init_samples(state: PAMState) -> slice:
    """Samples of each user used by the initialization (disjoint schedule: the second half)."""
    m = state.samples
    return slice(m // 2, m) if state.config.schedule == "disjoint" else slice(0, m)


def am_samples(state: PAMState) -> tuple[slice, slice]:
    """(samples for v_j, samples for the statistics)."""
    m = state.samples
    if state.config.schedule == "disjoint":
        q = max(1, m // 4)
        return slice(0, q), slice(q, 2 * q)
    return slice(0, m), slice(0, m)


def _count(s: slice, m: int) -> int:
    return len(range(*s.indices(m)))


def pam_sensitivity(name: str, state: PAMState) -> float:
    m = state.samples
    if name == "init_M":
        return (_count(init_samples(state), m) // 2) * state.zeta**2
    if name == "am_A":
        return _count(am_samples(state)[1], m) * state.eta**2
    if name == "am_b":
        return _count(am_samples(state)[1], m) * state.zeta * state.eta
    if name == "single_A":
        return m * state.g_x**2
    if name == "single_b":
        return m * state.zeta * state.g_x
    if name == "exp_U":  # one user's score term: a mean of squared errors, each <= (L_f C + zeta)^2
        return (state.exp_clip * state.exp_radius + state.zeta) ** 2
    raise KeyError(name)


def plan_pam_releases(algorithm: str, cfg: PAMConfig) -> list[PlannedRelease]:
    from ..privacy.accounting import PlannedRelease  # the server's planning only

    if algorithm == "pam-single-model":
        return [PlannedRelease("single_A", 1, 0.5), PlannedRelease("single_b", 1, 0.5)]
    if algorithm != "pam":
        return []
    per_user = cfg.epochs if cfg.schedule == "full" else 1  # disjoint groups: one step per user
    rest = (1.0 - cfg.share_init) / per_user
    return [
        PlannedRelease("init_M", 1, cfg.share_init),
        PlannedRelease("am_b", per_user, rest / 2),
        PlannedRelease("am_A", per_user, rest / 2),
    ]


def new_pam_state(
    algorithm: str,
    cfg: PAMConfig,
    d: int,
    k: int,
    samples: int,
    epsilon: float | None,
    delta: float,
    ledger_seed: int | None = None,
    *,
    relation: str = ADD_REMOVE,
) -> tuple[PAMState, PrivacyLedger]:
    """Validated state and the run's ledger; ``ledger_seed``: None (noise from the OS CSPRNG)
    unless the run asked for reproducible noise; ``relation``: the neighbouring relation the
    target holds under (calibrated under it; the ledger carries it)."""
    if algorithm not in PAM_ALGORITHMS:
        raise ConfigError(f"unknown algorithm {algorithm!r} (known: {', '.join(PAM_ALGORITHMS)})", field="algorithm")
    k = cfg.rank or k
    if k > d:
        raise ConfigError(f"must be <= d={d}, got {k}", field="rank")
    if samples < 4 and cfg.schedule == "disjoint":
        raise ConfigError(
            "the disjoint schedule splits each user's samples in quarters: needs >= 4 samples", field="schedule"
        )
    from ..privacy.accounting import BestOfAccountant, calibrate  # server side: a client never plans

    state = PAMState(algorithm, cfg, d, k, samples, {})
    budget = None
    if state.private:
        if epsilon is None:
            raise ConfigError(f"algorithm {algorithm!r} is private: give --epsilon", field="--epsilon")
        if algorithm == "pam-exp":  # pure epsilon-DP: the whole budget goes to the one selection
            if not (epsilon > 0 and math.isfinite(epsilon)):
                raise ConfigError(f"must be a finite number > 0, got {epsilon}", field="--epsilon")
            state.exp_epsilon = float(epsilon)
        else:
            state.multipliers = calibrate(
                plan_pam_releases(algorithm, cfg),
                epsilon,
                delta,
                integer_orders=cfg.aggregation.secure,
                relation=relation,
            ).multipliers  # Skellam: integer orders
        budget = (epsilon, delta)  # the ledger refuses any release beyond it (pure bound included)
    return state, PrivacyLedger(
        seed=ledger_seed, budget=budget, accountant=BestOfAccountant() if budget else None, relation=relation
    )


# ---------------------------------------------------------------------------- client side
def client_init_stats(X: np.ndarray, y: np.ndarray, state: PAMState) -> np.ndarray:
    """Upper triangle of sum over users and pairs of sym(x_a x_b^T/(|x_a||x_b|)) clip(y_a)clip(y_b)."""
    sl = init_samples(state)
    Xs, ys = X[:, sl].astype(np.float64), y[:, sl].astype(np.float64)
    p = Xs.shape[1] // 2
    if p == 0:
        return np.zeros(state.d * (state.d + 1) // 2)
    xa, xb = Xs[:, 0 : 2 * p : 2], Xs[:, 1 : 2 * p : 2]
    xa = xa / np.maximum(np.linalg.norm(xa, axis=-1, keepdims=True), 1e-30)
    xb = xb / np.maximum(np.linalg.norm(xb, axis=-1, keepdims=True), 1e-30)
    c = np.clip(ys[:, 0 : 2 * p : 2], -state.zeta, state.zeta) * np.clip(ys[:, 1 : 2 * p : 2], -state.zeta, state.zeta)
    S = np.einsum("npa,np,npb->ab", xa, c, xb)
    return upper(S)  # sym(S) replicates the upper triangle: this vector determines it


def client_personal_vectors(
    X: np.ndarray, y: np.ndarray, U: np.ndarray, ridge: float, samples: slice | None = None
) -> np.ndarray:
    """v_j = argmin |y_j - X_j U v|^2 + ridge * tr/k |v|^2, for every user of the block."""
    sl = samples if samples is not None else slice(None)
    Z = np.einsum("nmd,dk->nmk", X[:, sl].astype(np.float64), U)
    G = np.einsum("nmk,nml->nkl", Z, Z)
    k = U.shape[1]
    lam = ridge * np.trace(G, axis1=1, axis2=2) / k + 1e-12
    G = G + lam[:, None, None] * np.eye(k)
    r = np.einsum("nmk,nm->nk", Z, y[:, sl].astype(np.float64))
    return np.linalg.solve(G, r[..., None])[..., 0]


def client_am_stats(X: np.ndarray, y: np.ndarray, state: PAMState, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """(upper triangle of sum W W^T, sum clip(y) W) over the block's users; v_j stays here."""
    sv, ss = am_samples(state)
    dk = state.d * state.k
    A = np.zeros((dk, dk))
    b = np.zeros(dk)
    for u0 in range(0, X.shape[0], chunk):
        Xc, yc = X[u0 : u0 + chunk], y[u0 : u0 + chunk]
        V = client_personal_vectors(Xc, yc, state.U, state.config.user_ridge, sv)
        Xs = Xc[:, ss].astype(np.float64)
        # W = vec(x v^T) with columns stacked: index c * d + a holds v_c x_a
        W = (V[:, None, :, None] * Xs[:, :, None, :]).reshape(-1, dk)
        W = clip_rows(W, state.eta)
        yy = np.clip(yc[:, ss].astype(np.float64), -state.zeta, state.zeta).reshape(-1)
        A += W.T @ W
        b += W.T @ yy
    return upper(A), b


def client_step_stats(X: np.ndarray, y: np.ndarray, state: PAMState) -> tuple[np.ndarray, np.ndarray]:
    """A block's contribution to one step's statistics (upper triangle of A, and b), by the
    algorithm: the single model's, or the alternating step's (zeros for an empty block)."""
    if state.algorithm == "pam-single-model":
        return client_single_stats(X, y, state)
    if len(X):
        return client_am_stats(X, y, state)
    dk = state.d * state.k
    return np.zeros(dk * (dk + 1) // 2), np.zeros(dk)


def client_single_stats(X: np.ndarray, y: np.ndarray, state: PAMState) -> tuple[np.ndarray, np.ndarray]:
    Xs = clip_rows(X.astype(np.float64).reshape(-1, state.d), state.g_x)
    ys = np.clip(y.astype(np.float64).reshape(-1), -state.zeta, state.zeta)
    return upper(Xs.T @ Xs), Xs.T @ ys


def exp_net(state: PAMState) -> np.ndarray:
    """(N, d, k) candidates with orthonormal columns: Haar draws from a public seed, the same on
    every client and on the server (data-independent, so not a release)."""
    return _net(state.config.seed, state.config.net_size, state.d, state.k)


@lru_cache(maxsize=4)
def _net(seed: int, size: int, d: int, k: int) -> np.ndarray:
    from ..privacy.ledger import public_draws

    with public_draws("exponential-mechanism net"):
        G = np.random.default_rng([seed, 29]).standard_normal((size, d, k))
    Q, R = np.linalg.qr(G)
    diag = np.diagonal(R, axis1=1, axis2=2)
    net = Q * np.sign(np.where(diag == 0, 1.0, diag))[:, None, :]
    net.setflags(write=False)  # cached and shared: read-only
    return net


def _ball_least_squares(G: np.ndarray, r: np.ndarray, radius: float, iters: int = 60) -> np.ndarray:
    """argmin_{|v| <= radius} v^T G v - 2 r^T v for a batch of PSD G (.., k, k): the
    unconstrained solution if it is inside the ball, otherwise (G + lam I)^-1 r with |v| = radius
    (lam found by bisection in the eigenbasis)."""
    w, Q = np.linalg.eigh(G)
    w = np.maximum(w, 0.0)
    c = np.einsum("...kl,...k->...l", Q, r)  # Q^T r
    scale = np.maximum(w.max(axis=-1, keepdims=True), 1e-12)
    v0 = c / np.maximum(w, 1e-9 * scale)
    inside = np.linalg.norm(v0, axis=-1) <= radius
    lo = np.zeros(w.shape[:-1])
    hi = np.linalg.norm(c, axis=-1) / radius + 1e-12  # |(G + hi I)^-1 r| <= |r| / hi = radius
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        big = np.linalg.norm(c / (w + mid[..., None]), axis=-1) > radius
        lo, hi = np.where(big, mid, lo), np.where(big, hi, mid)
    v = np.where(inside[..., None], v0, c / (w + hi[..., None]))
    v = v * np.minimum(1.0, radius / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-300))
    return np.einsum("...kl,...l->...k", Q, v)


def client_exp_scores(
    X: np.ndarray, y: np.ndarray, state: PAMState, net: np.ndarray | None = None, chunk: int = 64
) -> np.ndarray:
    """(N,) sum over the block's users of their score terms, each in [0, sensitivity('exp_U')]."""
    net = exp_net(state) if net is None else net
    h = max(1, state.samples // 2)
    Xs = X[:, :h].astype(np.float64)
    ys = np.clip(y[:, :h].astype(np.float64), -state.zeta, state.zeta)
    yy = np.einsum("nh,nh->n", ys, ys)
    bound = pam_sensitivity("exp_U", state)
    out = np.zeros(len(net))
    for c0 in range(0, len(net), chunk):
        Z = np.einsum("nhd,cdk->cnhk", Xs, net[c0 : c0 + chunk])
        Z = Z * np.minimum(1.0, state.exp_clip / np.maximum(np.linalg.norm(Z, axis=-1, keepdims=True), 1e-300))
        G = np.einsum("cnhk,cnhl->cnkl", Z, Z)
        r = np.einsum("cnhk,nh->cnk", Z, ys)
        v = _ball_least_squares(G, r, state.exp_radius)
        loss = (np.einsum("cnk,cnkl,cnl->cn", v, G, v) - 2 * np.einsum("cnk,cnk->cn", v, r) + yy) / h
        out[c0 : c0 + chunk] = np.clip(loss, 0.0, bound).sum(axis=1)
    return out


# ---------------------------------------------------------------------------- aggregator
def _release(
    name: str, value: np.ndarray, state: PAMState, ledger: PrivacyLedger | None, groups: int = 1
) -> np.ndarray:
    """Noise the exact sum through the ledger (upper-triangle vectors are noised entry-wise:
    the same as symmetric noise on the matrix)."""
    if not state.private:
        return value
    return ledger.gaussian(
        name, value, sensitivity=pam_sensitivity(name, state), noise_multiplier=state.multipliers[name], groups=groups
    )


def release_init(total: np.ndarray, state: PAMState, ledger: PrivacyLedger | None) -> np.ndarray:
    return _release("init_M", total, state, ledger)


def release_am(
    A: np.ndarray, b: np.ndarray, state: PAMState, ledger: PrivacyLedger | None
) -> tuple[np.ndarray, np.ndarray]:
    groups = state.config.epochs if state.config.schedule == "disjoint" else 1
    return _release("am_A", A, state, ledger, groups=groups), _release("am_b", b, state, ledger, groups=groups)


def release_single(
    A: np.ndarray, b: np.ndarray, state: PAMState, ledger: PrivacyLedger | None
) -> tuple[np.ndarray, np.ndarray]:
    return _release("single_A", A, state, ledger), _release("single_b", b, state, ledger)


def release_exp(scores: np.ndarray, state: PAMState, ledger: PrivacyLedger | None) -> int:
    """Index of the selected net candidate (exact minimiser when not private)."""
    if not state.private:
        return int(np.argmin(scores))
    return ledger.exponential(
        "exp_U", scores, epsilon=state.exp_epsilon, sensitivity=pam_sensitivity("exp_U", state), monotone=True
    )


# ---------------------------------------------------------------------------- server side
def _psd_solve(A_upper: np.ndarray, b: np.ndarray, n: int, lam: float) -> np.ndarray:
    A = from_upper(A_upper, n)
    w, Q = np.linalg.eigh(A)
    w = np.maximum(w, 0.0) + lam
    return Q @ ((Q.T @ b) / w)


def _ridge(name: str, state: PAMState, n: int, A_upper: np.ndarray) -> float:
    if state.private:
        return state.config.ridge * state.multipliers[name] * pam_sensitivity(name, state) * math.sqrt(n)
    return 1e-9 * max(float(np.abs(A_upper).max()), 1e-12)


def pam_server_init(M_upper: np.ndarray, state: PAMState) -> None:
    """U_0: top-k eigenvectors of the (noised) symmetric M."""
    w, Q = np.linalg.eigh(from_upper(M_upper, state.d))
    state.U = Q[:, np.argsort(w)[::-1][: state.k]]


def server_am_update(A_upper: np.ndarray, b: np.ndarray, state: PAMState) -> None:
    dk = state.d * state.k
    Z = _psd_solve(A_upper, b, dk, _ridge("am_A", state, dk, A_upper))
    U = Z.reshape(state.k, state.d).T  # column-stacked vec -> d x k
    Q, R = np.linalg.qr(U)
    state.U = Q * np.sign(np.where(np.diag(R) == 0, 1.0, np.diag(R)))
    state.step += 1


def server_exp_select(index: int, state: PAMState, net: np.ndarray | None = None) -> None:
    net = exp_net(state) if net is None else net
    state.U = net[int(index)]
    state.step += 1


def server_single_update(A_upper: np.ndarray, b: np.ndarray, state: PAMState) -> None:
    state.theta = _psd_solve(A_upper, b, state.d, _ridge("single_A", state, state.d, A_upper))


# ---------------------------------------------------------------------------- evaluation
def client_eval_sums(
    X: np.ndarray, y: np.ndarray, V_star: np.ndarray, U_star: np.ndarray, state: PAMState, noise: float
) -> np.ndarray:
    """(sum over the block's users of |theta_j - theta*_j|^2, number of users): the population
    MSE of user j's final predictor is |theta_j - theta*_j|^2 + sigma_F^2 for x ~ N(0, I).
    theta_j: U v_j with v_j on all the user's samples (pam, pam-nonprivate), the single model,
    or the user's own ridge regression. The ground truth is measurement, never training input."""
    theta_star = V_star @ U_star.T
    if state.algorithm == "pam-single-model":
        theta = np.broadcast_to(state.theta, theta_star.shape)
    elif state.algorithm == "pam-own-data":
        Xd = X.astype(np.float64)
        G = np.einsum("nmd,nme->nde", Xd, Xd) + state.config.own_ridge * np.eye(state.d)
        theta = np.linalg.solve(G, np.einsum("nmd,nm->nd", Xd, y.astype(np.float64))[..., None])[..., 0]
    else:
        V = client_personal_vectors(X, y, state.U, state.config.user_ridge)
        theta = V @ state.U.T
    return np.array([float(np.sum((theta - theta_star) ** 2)), float(X.shape[0])])


def subspace_error(U: np.ndarray, U_star: np.ndarray) -> float:
    """|(I - U* U*^T) U|_F for orthonormal U."""
    return float(np.linalg.norm(U - U_star @ (U_star.T @ U)))


# ---------------------------------------------------------------------------- schedule
def step_groups(state: PAMState) -> list[int | None]:
    """The group of each alternating step: None (all users) for the full schedule; for the
    disjoint schedule group t at step t, of ``epochs`` groups (each user's group:
    :func:`user_groups`)."""
    cfg = state.config
    if state.algorithm == "pam-nonprivate":
        return [None] * cfg.nonprivate_epochs
    if cfg.schedule == "full":
        return [None] * cfg.epochs
    return list(range(cfg.epochs))


def user_groups(keys: np.ndarray, groups: int) -> np.ndarray:
    """Each user's group of the disjoint schedule, drawn by the user from its secret key: known
    to nobody else, and unmoved when another user joins or leaves (parallel composition holds)."""
    return np.minimum((user_uniform(keys, PURPOSE_GROUP) * groups).astype(np.int64), groups - 1)


# ---------------------------------------------------------------------------- secure rounds
def summed_parts(kind: str, state: PAMState) -> list[tuple[str, int]]:
    """(release, words) of a summed round: the initialization's M, or a step's statistics (the
    single model's, or the alternating step's A and b), upper triangles flattened."""
    d, dk = state.d, state.d * state.k
    if kind == "pam_init":
        return [("init_M", d * (d + 1) // 2)]
    if state.algorithm == "pam-single-model":
        return [("single_A", d * (d + 1) // 2), ("single_b", d)]
    return [("am_A", dk * (dk + 1) // 2), ("am_b", dk)]


def secure_parts(kind: str, state: PAMState) -> list[tuple[str, int, float, float]]:
    """(release, words, L2 sensitivity, z) of a secure round."""
    return [(n, length, pam_sensitivity(n, state), state.multipliers[n]) for n, length in summed_parts(kind, state)]


def client_round(kind: str, X: np.ndarray, y: np.ndarray, state: PAMState) -> tuple:
    """A block's clipped statistics of one round (its users of the step's group only), in the
    order of :func:`secure_parts`: the contribution of every engine and aggregation mode."""
    if kind == "pam_init":
        return (client_init_stats(X, y, state),)
    if kind == "pam_exp":
        return (client_exp_scores(X, y, state),)
    return client_step_stats(X, y, state)


def pam_node_values(kind: str, X: np.ndarray, y: np.ndarray, state: PAMState) -> dict[str, np.ndarray]:
    """A node's clipped statistics of a secure round, by part name."""
    return {name: np.asarray(v) for (name, _), v in zip(summed_parts(kind, state), client_round(kind, X, y, state))}


# ---------------------------------------------------------------------------- the rounds
class PersonalRounds:
    """DP model personalization's rounds (:mod:`fedpriv.algorithms.pam`): the private
    initialization, then one alternating step per epoch (the full schedule) or per disjoint
    user group; pam-single-model has one step (its regression statistics), pam-exp one
    exponential-mechanism selection, pam-own-data none (each user alone)."""

    name = "personal"

    def setup_kinds(self, state: PAMState) -> Iterator[str]:
        if state.algorithm in ("pam", "pam-nonprivate"):
            yield "pam_init"

    def take(self, kind: str, value, state: PAMState, ledger) -> None:
        pam_server_init(value, state)

    def server_setup(self, state: PAMState, features):
        return None

    def n_steps(self, state: PAMState) -> int:
        if state.algorithm in ("pam-single-model", "pam-exp"):
            return 1
        if state.algorithm in ("pam", "pam-nonprivate"):
            return len(step_groups(state))
        return 0

    def step_kind(self, state: PAMState) -> str:
        return "pam_exp" if state.algorithm == "pam-exp" else "pam_step"

    def group(self, state: PAMState, step: int) -> int | None:
        return step_groups(state)[step] if state.algorithm in ("pam", "pam-nonprivate") else None

    def groups(self, state: PAMState) -> int:
        """Disjoint groups of one step's release (parallel composition), else 1."""
        return state.config.epochs if state.algorithm == "pam" and state.config.schedule == "disjoint" else 1

    def release(self, kind: str, sums: tuple, state: PAMState, ledger):
        if kind == "pam_init":
            return release_init(sums[0], state, ledger)
        if kind == "pam_exp":
            return release_exp(sums[0], state, ledger)
        if state.algorithm == "pam-single-model":
            return release_single(*sums, state, ledger)
        return release_am(*sums, state, ledger)

    def server_step(self, release, state: PAMState, server) -> None:
        if state.algorithm == "pam-exp":
            server_exp_select(release, state)
        elif state.algorithm == "pam-single-model":
            server_single_update(*release, state)
        else:
            server_am_update(*release, state)

    def check_secure(self, state: PAMState) -> None:
        if state.algorithm not in ("pam", "pam-single-model"):
            raise ConfigError(
                f"secure aggregation adds distributed Gaussian-like noise to sums; {state.algorithm} has no such "
                f"release (use aggregation=central)",
                field="aggregation",
            )

    def secure_parts(self, kind: str, state: PAMState) -> list[tuple[str, int, float, float]]:
        return secure_parts(kind, state)

    def declared_parts(self, kind: str, state: PAMState) -> list:
        from .steps import Part

        return [Part(name, i, (length,)) for i, (name, length) in enumerate(summed_parts(kind, state))]


PERSONAL = PersonalRounds()


def evaluate_personal(state: PAMState, data, users_per_shard: int = 4096) -> dict:
    """Test MSE (plus the observation noise) and subspace error of a personalization run on the
    users' own test samples (:class:`~fedpriv.data.personal.PersonalData`)."""
    from .shards import split_users

    sums = sum(
        client_eval_sums(data.X[u], data.y[u], data.V_star[u], data.U_star, state, data.noise)
        for u in split_users(data.n_users, users_per_shard)
    )
    out = {"test_mse": float(sums[0] / max(sums[1], 1.0) + data.noise**2)}
    out["subspace_error"] = subspace_error(state.U, data.U_star) if state.U is not None else None
    return out


# ---------------------------------------------------------------------------- the family
@dataclass(frozen=True)
class PersonalBlock:
    """A node's block of users as a client holds it: their samples, and the ground truth that
    only the measurement reads (never a training input)."""

    X: np.ndarray
    y: np.ndarray
    V_star: np.ndarray
    U_star: np.ndarray
    noise: float


class PersonalFamily(Family):
    """DP model personalization as a block family: each node holds a block of users' samples,
    on synthetic tasks the ServerApp generates (``synthetic-personal``)."""

    name = "personal"
    rounds = PERSONAL
    server_generates_data = True
    protocol = "personalization"

    def algorithms(self) -> tuple[str, ...]:
        return PAM_ALGORITHMS

    def private(self, algorithm: str) -> bool:
        return algorithm in PRIVATE

    def describe(self, algorithm: str) -> tuple[str, str]:
        from .registry import PERSONALIZATION

        return PERSONALIZATION[algorithm]

    def parse(self, overrides: dict, algorithm: str) -> PAMConfig:
        return PAMConfig.from_overrides(overrides)

    def evaluation(self, cfg):
        from .evaluations import BlockEvaluation

        return BlockEvaluation(self)

    def load(self, spec, dataset, algorithm: str):
        if spec.kind != "synthetic-personal":
            raise ConfigError(
                f"{algorithm} needs --data synthetic-personal:users=N,samples=M,d=D,k=K,noise=S,seed=R", field="--data"
            )
        from ..data.spec import load_spec

        return dataset if dataset is not None else load_spec(spec)

    def user_ids(self, data) -> np.ndarray:
        return data.user_ids

    def new_state(self, algorithm: str, cfg, data, epsilon, delta, ledger_seed, relation: str):
        return new_pam_state(
            algorithm, cfg, data.d, data.k, data.samples, epsilon, delta, ledger_seed, relation=relation
        )

    def block(self, data, users: np.ndarray) -> PersonalBlock:
        return PersonalBlock(data.X[users], data.y[users], data.V_star[users], data.U_star, data.noise)

    def client_round(self, kind: str, block: PersonalBlock, state: PAMState) -> tuple:
        return client_round(kind, block.X, block.y, state)

    def reply_parts(self, kind: str, state: PAMState) -> list[ReplyPart]:
        if kind == "pam_init":
            d = state.d
            return [ReplyPart("values", d * (d + 1) // 2, pam_sensitivity("init_M", state))]
        if kind == "pam_exp":
            # every entry of a user's score vector is in [0, s]: L2 norm <= s sqrt(N) per user
            n, s_user = len(exp_net(state)), pam_sensitivity("exp_U", state)
            return [ReplyPart("scores", n, s_user * math.sqrt(n), entry_range=s_user)]
        (name_a, n_a), (name_b, n_b) = summed_parts(kind, state)
        return [
            ReplyPart("A_upper", n_a, pam_sensitivity(name_a, state)),
            ReplyPart("b", n_b, pam_sensitivity(name_b, state)),
        ]

    def part_bounds(self, kind: str, state: PAMState) -> list[tuple[str, int, float]]:
        return [(n, length, pam_sensitivity(n, state)) for n, length in summed_parts(kind, state)]

    def user_groups(self, keys: np.ndarray, state: PAMState) -> np.ndarray | None:
        return user_groups(keys, state.config.epochs) if state.config.schedule == "disjoint" else None

    def eval_sums(self, block: PersonalBlock, state: PAMState) -> np.ndarray:
        return client_eval_sums(block.X, block.y, block.V_star, block.U_star, state, block.noise)

    def evaluate_sums(self, sums: np.ndarray, data, state: PAMState) -> dict:
        out = {"test_mse": float(sums[0] / max(sums[1], 1.0) + data.noise**2)}
        out["subspace_error"] = subspace_error(state.U, data.U_star) if state.U is not None else None
        return out

    def write_node_data(self, folder, data) -> None:
        import json

        np.save(folder / "pam_X.npy", np.ascontiguousarray(data.X, dtype=np.float32))
        np.save(folder / "pam_y.npy", np.ascontiguousarray(data.y, dtype=np.float32))
        # ground truth: measurement only (population MSE on the nodes), never a training input
        np.save(folder / "pam_V_star.npy", data.V_star)
        np.save(folder / "pam_U_star.npy", data.U_star)
        (folder / "pam_meta.json").write_text(json.dumps({"n_users": data.n_users, "noise": data.noise}))

    def load_block(self, folder: str, partition_id: int, users_per_node: int):
        from .shards import user_block

        X, y, V, U, meta = _mapped(folder)
        users = user_block(partition_id, users_per_node, meta["n_users"])
        arrays = (np.asarray(X[users]), np.asarray(y[users]), np.asarray(V[users]))
        for a in arrays:
            a.setflags(write=False)
        return users, PersonalBlock(*arrays, U, meta["noise"])

    def encode_state(self, state: PAMState) -> tuple[dict, dict]:
        import json

        arrays = {name: value for name, value in (("U", state.U), ("theta", state.theta)) if value is not None}
        scalars = {
            "algorithm": state.algorithm,
            "config": json.dumps(state.config.to_dict()),
            "d": state.d,
            "k": state.k,
            "samples": state.samples,
        }
        return arrays, scalars

    def decode_state(self, arrays: dict, scalars: dict) -> PAMState:
        import json

        state = PAMState(
            str(scalars["algorithm"]),
            PAMConfig.from_overrides(json.loads(str(scalars["config"]))),
            int(scalars["d"]),
            int(scalars["k"]),
            int(scalars["samples"]),
            {},
        )
        state.U = arrays.get("U")
        state.theta = arrays.get("theta")
        return state

    def round_label(self, kind: str, step: int, state: PAMState) -> str:
        if kind in ("pam_init", "pam_exp"):
            return kind[4:]
        return "single" if state.algorithm == "pam-single-model" else f"step{step + 1}"

    def report_keys(self, data, state: PAMState) -> dict:
        return {"samples_per_user": data.samples, "d": data.d, "k": state.k}

    def references(self, data) -> dict:
        """The trivial references, as test MSEs of the same measurement (the population MSE
        |theta - theta*_j|^2 + noise^2, averaged over the users): the best shared model (one
        vector for every user: the mean of their true models, no personalization) and the zero
        predictor. Measured on the ground truth, never training input."""
        theta_star = np.asarray(data.V_star, dtype=np.float64) @ np.asarray(data.U_star, dtype=np.float64).T
        noise = float(data.noise) ** 2
        if not len(theta_star):
            return {"shared_model_test_mse": None, "zero_predictor_test_mse": None}
        shared = float(np.mean(np.sum((theta_star - theta_star.mean(axis=0)) ** 2, axis=1))) + noise
        zero = float(np.mean(np.sum(theta_star**2, axis=1))) + noise
        return {"shared_model_test_mse": shared, "zero_predictor_test_mse": zero}


@lru_cache(maxsize=4)
def _mapped(folder: str):
    import json
    from pathlib import Path

    f = Path(folder)
    return (
        np.load(f / "pam_X.npy", mmap_mode="r"),
        np.load(f / "pam_y.npy", mmap_mode="r"),
        np.load(f / "pam_V_star.npy", mmap_mode="r"),
        np.load(f / "pam_U_star.npy"),
        json.loads((f / "pam_meta.json").read_text()),
    )


FAMILY = register_family(PersonalFamily())
