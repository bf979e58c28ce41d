"""Multi-task linear regression under user-level DP with task weights (Krichene et al.,
"Multi-Task Differential Privacy Under Distribution Skew", ICML 2023).

The privacy unit is one user j = all of its (task, sample) pairs. Every user has one feature
vector x_j (shared by its samples, as in the paper's Appendix C) and a label y_ij per task i it
contributes to; each (task, user) pair occurs at most once.

Pipeline of :func:`run_multitask`:

1. private task counts: each user adds min(1, sqrt(K / n_j)) to each of its n_j tasks (its count
   vector has L2 norm <= sqrt(K)), released once through the ledger -> n̂;
2. weights: omega_i ∝ n̂_i^(-mu) normalised as in eq. 16, clipped per user by eq. 12 so that
   sum_i w_ij^2 <= beta (mu = 0: uniform weights, up to the per-user clip);
3. one of
   - ``ssp`` (Alg. 1, task-weighted sufficient statistics perturbation): A_i = sum_j w_ij x_j x_j^T
     and b_i = sum_j w_ij y_ij x_j (|x_j| <= G_x, |y_ij| <= G_y) noised once each;
     theta_i = solve(PSD(Â_i) + lambda I, b̂_i);
   - ``noisy_gd`` (Alg. 2, task-weighted noisy gradient descent): T full-batch steps on
     sum_ij w_ij (x_j^T theta_i - y_ij)^2 / 2 + lambda / 2 |theta|^2, the per-sample gradients
     clipped to norm Gamma, the weighted sum noised at every step (T Gaussian releases).

Sensitivities (add/remove one user; L2 over all tasks stacked), with sum_i w_ij^2 <= beta:
counts sqrt(K); A (upper triangles) sqrt(beta) G_x^2; b sqrt(beta) G_x G_y; gradient
sqrt(beta) Gamma. The absolute scale of beta cancels (statistics and noise both scale with
sqrt(beta)); what matters is lambda relative to sqrt(beta) and beta_bar / beta, the share of
users left unclipped.

All noise comes from :class:`~fedpriv.privacy.ledger.PrivacyLedger`; multipliers come from
:func:`~fedpriv.privacy.accounting.calibrate` so that the whole run spends (epsilon, delta).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError
from ..privacy.accounting import PlannedRelease, calibrate, epsilon_rdp
from ..privacy.clipping import clip_rows
from ..privacy.ledger import PrivacyLedger
from ..privacy.weights import adaptive_omega, clip_user_weights
from ..algorithms.kernels import project_psd

METHODS = ("ssp", "noisy_gd")
WEIGHT_MODES = ("clip", "normalize")


@dataclass(frozen=True)
class MultiTaskConfig:
    """Hyperparameters of both algorithms (``steps``, ``lr``, ``grad_clip``, ``average``: noisy GD)."""

    lam: float = 1.0  # ridge lambda
    beta: float = 1.0  # per-user budget: sum_i w_ij^2 <= beta
    beta_bar_ratio: float = 1.0  # eq. 16 normalisation: sum_i n̂_i omega_i^2 = n * beta_bar_ratio * beta
    weight_mode: str = "clip"  # 'clip' (eq. 12) or 'normalize' (every user rescaled to sum = beta)
    count_cap: float = 20.0  # K: a user's count vector has L2 norm <= sqrt(K)
    share_counts: float = 0.1  # RDP share of the counts release
    share_b: float = 0.5  # ssp: share of b within the SSP budget (A gets the rest)
    x_clip: float = 1.0  # G_x
    y_clip: float = 1.0  # G_y
    theta_radius: float | None = 1.0  # domain C: ball of this radius (None: unconstrained)
    steps: int = 20  # T
    lr: float = 2.0  # step lr / L_i, L_i = omega_i n̂_i G_x^2 + lambda
    grad_clip: float = 1.0  # Gamma: per-sample gradient norm bound
    average: bool = True  # noisy GD: return the mean of the last half of the iterates

    def validate(self) -> None:
        for name in ("lam",):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"must be >= 0, got {getattr(self, name)}", field=name)
        for name in ("beta", "beta_bar_ratio", "count_cap", "x_clip", "y_clip", "lr", "grad_clip"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"must be a finite number > 0, got {v}", field=name)
        for name in ("share_counts", "share_b"):
            v = getattr(self, name)
            if not 0 < v < 1:
                raise ConfigError(f"must be in (0, 1), got {v}", field=name)
        if self.weight_mode not in WEIGHT_MODES:
            raise ConfigError(f"must be one of {WEIGHT_MODES}, got {self.weight_mode!r}", field="weight_mode")
        if self.theta_radius is not None and not self.theta_radius > 0:
            raise ConfigError(f"must be > 0 or None, got {self.theta_radius}", field="theta_radius")
        if int(self.steps) != self.steps or self.steps < 1:
            raise ConfigError(f"must be an integer >= 1, got {self.steps}", field="steps")


@dataclass
class MultiTaskResult:
    """Output of :func:`run_multitask`."""

    rmse: float  # on the evaluation pairs
    theta: np.ndarray  # (m, d)
    ledger: PrivacyLedger
    epsilon: float | None  # epsilon spent (RDP accountant), None if non-private
    counts_hat: np.ndarray
    omega: np.ndarray
    clipped_share: float  # share of training samples whose weight eq. 12 scaled down
    config: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------- helpers
def _check_pairs(tasks: np.ndarray, users: np.ndarray, m: int, n: int) -> None:
    """(task, user) pairs must be in range and distinct (one sample per pair)."""
    if len(tasks) != len(users):
        raise ConfigError("tasks and users must have the same length", field="tasks")
    if len(tasks) and (tasks.min() < 0 or tasks.max() >= m or users.min() < 0 or users.max() >= n):
        raise ConfigError("task or user index out of range", field="tasks")
    keys = users.astype(np.int64) * m + tasks
    if len(np.unique(keys)) != len(keys):
        raise ConfigError("each (task, user) pair may occur at most once", field="tasks")


def project_ball(theta: np.ndarray, radius: float | None) -> np.ndarray:
    """Euclidean projection of each row onto the ball of ``radius`` (identity if None)."""
    return theta if radius is None else clip_rows(theta, radius)


def _task_matrix(tasks: np.ndarray, values: np.ndarray, m: int) -> sp.csr_matrix:
    """Sparse (m, N) matrix with ``values[k]`` at (tasks[k], k): left-multiplying sums per task."""
    return sp.csr_matrix((values, (tasks, np.arange(len(tasks)))), shape=(m, len(tasks)))


# ---------------------------------------------------------------------------- statistics
def count_statistic(tasks: np.ndarray, users: np.ndarray, m: int, n_users: int, count_cap: float) -> np.ndarray:
    """Sum over users of their clipped count vectors: user j adds min(1, sqrt(K / n_j)) per task."""
    n_j = np.bincount(users, minlength=n_users).astype(np.float64)
    a = np.minimum(1.0, np.sqrt(count_cap / np.maximum(n_j, 1.0)))
    return np.bincount(tasks, weights=a[users], minlength=m).astype(np.float64)


def user_weights(
    omega: np.ndarray, tasks: np.ndarray, users: np.ndarray, n_users: int, beta: float, mode: str
) -> np.ndarray:
    """Per-sample weights w_ij (eq. 12, in the samples' order): sum_i w_ij^2 <= beta per user."""
    order = np.argsort(users, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(users, minlength=n_users))])
    w = np.empty(len(tasks), dtype=np.float64)
    w[order] = clip_user_weights(omega, tasks[order], indptr, beta, mode)
    return w


def ssp_statistics(
    x: np.ndarray,
    tasks: np.ndarray,
    users: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    m: int,
    x_clip: float,
    y_clip: float,
) -> tuple[np.ndarray, np.ndarray]:
    """A_i = sum_j w_ij x_j x_j^T (m, d, d) and b_i = sum_j w_ij y_ij x_j (m, d), clipped inputs."""
    xs = clip_rows(np.asarray(x, dtype=np.float64), x_clip)[users]
    ys = np.clip(y, -y_clip, y_clip)
    d = xs.shape[1]
    W = _task_matrix(tasks, w, m)
    A = np.asarray(W @ (xs[:, :, None] * xs[:, None, :]).reshape(len(xs), d * d)).reshape(m, d, d)
    b = np.asarray(W @ (ys[:, None] * xs))
    return A, b


def gd_gradient(
    theta: np.ndarray,
    x: np.ndarray,
    tasks: np.ndarray,
    users: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    m: int,
    x_clip: float,
    y_clip: float,
    grad_clip: float,
) -> np.ndarray:
    """sum_j w_ij clip((x_j^T theta_i - y_ij) x_j, Gamma) per task (m, d): the data part of the gradient."""
    xs = clip_rows(np.asarray(x, dtype=np.float64), x_clip)[users]
    ys = np.clip(y, -y_clip, y_clip)
    resid = np.einsum("kd,kd->k", xs, theta[tasks]) - ys
    g = clip_rows(resid[:, None] * xs, grad_clip)
    return np.asarray(_task_matrix(tasks, w, m) @ g)


def sensitivities(cfg: MultiTaskConfig) -> dict[str, float]:
    """L2 sensitivity (add/remove one user) of every release."""
    sb = math.sqrt(cfg.beta)
    return {
        "mt_counts": math.sqrt(cfg.count_cap),
        "mt_ssp_A": sb * cfg.x_clip**2,
        "mt_ssp_b": sb * cfg.x_clip * cfg.y_clip,
        "mt_gd_grad": sb * cfg.grad_clip,
    }


# ---------------------------------------------------------------------------- accounting
def plan_multitask(method: str, cfg: MultiTaskConfig) -> list[PlannedRelease]:
    """The releases of one run; shares are of the total RDP (GD: split evenly over T steps)."""
    rest = 1.0 - cfg.share_counts
    out = [PlannedRelease("mt_counts", 1, cfg.share_counts)]
    if method == "ssp":
        out += [
            PlannedRelease("mt_ssp_A", 1, rest * (1 - cfg.share_b)),
            PlannedRelease("mt_ssp_b", 1, rest * cfg.share_b),
        ]
    elif method == "noisy_gd":
        out.append(PlannedRelease("mt_gd_grad", int(cfg.steps), rest / cfg.steps))
    else:
        raise ConfigError(f"must be one of {METHODS}, got {method!r}", field="method")
    return out


@lru_cache(maxsize=256)
def _multipliers(plan_key: tuple, epsilon: float, delta: float) -> tuple[tuple[str, float], ...]:
    cal = calibrate([PlannedRelease(*p) for p in plan_key], epsilon, delta)
    return tuple(cal.multipliers.items())


def noise_multipliers(method: str, cfg: MultiTaskConfig, epsilon: float, delta: float) -> dict[str, float]:
    """Calibrated noise multiplier of every release (cached: it depends on the plan only)."""
    key = tuple((p.name, p.count, p.share) for p in plan_multitask(method, cfg))
    return dict(_multipliers(key, float(epsilon), float(delta)))


# ---------------------------------------------------------------------------- algorithms
def _release(
    ledger: PrivacyLedger | None,
    name: str,
    value: np.ndarray,
    cfg: MultiTaskConfig,
    z: dict[str, float] | None,
    symmetric: bool = False,
) -> np.ndarray:
    if ledger is None or z is None:
        return value
    return ledger.gaussian(
        name, value, sensitivity=sensitivities(cfg)[name], noise_multiplier=z[name], symmetric=symmetric
    )


def fit_ssp(
    x, tasks, users, y, w, m: int, cfg: MultiTaskConfig, ledger: PrivacyLedger | None, z: dict[str, float] | None
) -> np.ndarray:
    """Alg. 1: theta_i = (PSD(Â_i) + lambda I)^-1 b̂_i, projected on the domain ball."""
    A, b = ssp_statistics(x, tasks, users, y, w, m, cfg.x_clip, cfg.y_clip)
    A_hat = _release(ledger, "mt_ssp_A", A, cfg, z, symmetric=True)
    b_hat = _release(ledger, "mt_ssp_b", b, cfg, z)
    A_psd = project_psd(A_hat, 0.0).astype(np.float64)
    d = A.shape[-1]
    theta = np.linalg.solve(A_psd + cfg.lam * np.eye(d), b_hat[..., None])[..., 0]
    return project_ball(theta, cfg.theta_radius)


def fit_noisy_gd(
    x,
    tasks,
    users,
    y,
    w,
    m: int,
    cfg: MultiTaskConfig,
    ledger: PrivacyLedger | None,
    z: dict[str, float] | None,
    smoothness: np.ndarray,
) -> np.ndarray:
    """Alg. 2: theta_i <- Pi_C[theta_i - lr / L_i (g_i + noise + lambda theta_i)], from theta = 0.

    ``smoothness``: public per-task L_i (from the released counts). Returns the last iterate or,
    with ``cfg.average``, the mean of the last half of the iterates (post-processing).
    """
    d = x.shape[1]
    theta = np.zeros((m, d))
    step = (cfg.lr / smoothness)[:, None]
    kept: list[np.ndarray] = []
    for t in range(cfg.steps):
        g = gd_gradient(theta, x, tasks, users, y, w, m, cfg.x_clip, cfg.y_clip, cfg.grad_clip)
        g_hat = _release(ledger, "mt_gd_grad", g, cfg, z)
        theta = project_ball(theta - step * (g_hat + cfg.lam * theta), cfg.theta_radius)
        if t >= cfg.steps // 2:
            kept.append(theta)
    return np.mean(kept, axis=0) if cfg.average else theta


def predict(theta: np.ndarray, x: np.ndarray, tasks: np.ndarray, users: np.ndarray) -> np.ndarray:
    return np.einsum("kd,kd->k", x[users], theta[tasks])


def task_rmse(theta: np.ndarray, x: np.ndarray, tasks: np.ndarray, users: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((predict(theta, x, tasks, users) - y) ** 2))) if len(y) else float("nan")


def run_multitask(
    data,
    method: str,
    mu: float,
    epsilon: float | None,
    delta: float = 1e-5,
    cfg: MultiTaskConfig | None = None,
    *,
    train: np.ndarray | None = None,
    evaluate: np.ndarray | None = None,
    seed: int = 0,
) -> MultiTaskResult:
    """Train on ``train`` (default ``data.train_mask``), report RMSE on ``evaluate`` (default the
    held-out ``~data.train_mask``). ``data``: a :class:`~fedpriv.data.synthetic.SyntheticMultiTask`.
    ``epsilon=None``: non-private (exact counts, no noise; nothing recorded).
    """
    cfg = cfg or MultiTaskConfig()
    cfg.validate()
    if method not in METHODS:
        raise ConfigError(f"must be one of {METHODS}, got {method!r}", field="method")
    if epsilon is not None and not (epsilon > 0 and math.isfinite(epsilon)):
        raise ConfigError(f"must be a finite number > 0 or None, got {epsilon}", field="epsilon")
    train = data.train_mask if train is None else np.asarray(train, dtype=bool)
    evaluate = ~data.train_mask if evaluate is None else np.asarray(evaluate, dtype=bool)
    x = np.asarray(data.x, dtype=np.float64)
    n_users, m = x.shape[0], data.theta.shape[0]
    tasks, users, y = data.tasks[train].astype(np.int64), data.users[train].astype(np.int64), np.asarray(data.y)[train]
    _check_pairs(tasks, users, m, n_users)

    ledger = PrivacyLedger(seed=seed)
    z = None if epsilon is None else noise_multipliers(method, cfg, epsilon, delta)
    # 1. counts (private unless epsilon is None) and 2. weights (post-processing + per-user clip)
    if z is None:
        counts_hat = np.bincount(tasks, minlength=m).astype(np.float64)
    else:
        counts_hat = _release(ledger, "mt_counts", count_statistic(tasks, users, m, n_users, cfg.count_cap), cfg, z)
    omega = adaptive_omega(counts_hat, mu, n_users, cfg.beta, cfg.beta_bar_ratio)
    w = user_weights(omega, tasks, users, n_users, cfg.beta, cfg.weight_mode)
    clipped = float(np.mean(w < omega[tasks] * (1 - 1e-9))) if len(w) else 0.0
    # 3. the private fit
    if method == "ssp":
        theta = fit_ssp(x, tasks, users, y, w, m, cfg, ledger, z)
    else:
        smooth = omega * np.maximum(counts_hat, 1.0) * cfg.x_clip**2 + cfg.lam
        theta = fit_noisy_gd(x, tasks, users, y, w, m, cfg, ledger, z, smooth)
    et, eu = data.tasks[evaluate].astype(np.int64), data.users[evaluate].astype(np.int64)
    return MultiTaskResult(
        rmse=task_rmse(theta, x, et, eu, np.asarray(data.y)[evaluate]),
        theta=theta,
        ledger=ledger,
        epsilon=None if z is None else epsilon_rdp(ledger, delta),
        counts_hat=counts_hat,
        omega=omega,
        clipped_share=clipped,
        config=asdict(cfg),
    )
