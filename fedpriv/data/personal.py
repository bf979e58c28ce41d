"""The personalization generator of Jain et al. (NeurIPS 2021), "Differentially Private Model
Personalization", Section 6: n users with m samples each, x ~ N(0, I_d),
y = <U*^T x, v*_j> + N(0, sigma_F^2), U* a d x k matrix with orthonormal columns shared by all
users, v*_j ~ N(0, I_k) the user's own model (so a random model has population MSE ~ 2k).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..util.draws import public_draws


@dataclass
class PersonalData:
    X: np.ndarray  # (n, m, d) float32 features
    y: np.ndarray  # (n, m) float32 responses
    U_star: np.ndarray  # (d, k) orthonormal ground-truth subspace
    V_star: np.ndarray  # (n, k) ground-truth user models (measurement only: never used by training)
    noise: float
    user_ids: np.ndarray | None = None  # raw user ids (the generator's index unless a subset)

    def __post_init__(self) -> None:
        if self.user_ids is None:
            self.user_ids = np.arange(self.X.shape[0], dtype=np.int64)

    def without(self, index: int) -> "PersonalData":
        """The neighbouring data set: one user (dense index) removed, the others renumbered
        densely but keeping their raw ids."""
        keep = np.arange(self.n_users) != index
        return PersonalData(self.X[keep], self.y[keep], self.U_star, self.V_star[keep], self.noise, self.user_ids[keep])

    @property
    def n_users(self) -> int:
        return self.X.shape[0]

    @property
    def samples(self) -> int:
        return self.X.shape[1]

    @property
    def d(self) -> int:
        return self.X.shape[2]

    @property
    def k(self) -> int:
        return self.U_star.shape[1]


def make_personal(
    users: int = 50_000, samples: int = 10, d: int = 50, k: int = 2, noise: float = 0.01, seed: int = 0
) -> PersonalData:
    """Generate the data set (synthetic: every draw is public randomness, not noise)."""
    for name, v, lo in (("users", users, 1), ("samples", samples, 2), ("d", d, 1), ("k", k, 1)):
        if int(v) < lo:
            raise ConfigError(f"must be an integer >= {lo}, got {v}", field=name)
    if k > d:
        raise ConfigError(f"must be <= d={d}, got {k}", field="k")
    if not (noise >= 0 and np.isfinite(noise)):
        raise ConfigError(f"must be a finite number >= 0, got {noise}", field="noise")
    rng = np.random.default_rng([int(seed), 4242])
    with public_draws("synthetic personalization data"):
        U, _ = np.linalg.qr(rng.standard_normal((d, k)))
        V = rng.standard_normal((users, k))
        X = rng.standard_normal((users, samples, d), dtype=np.float32)
        z = rng.standard_normal((users, samples), dtype=np.float32) * np.float32(noise)
    y = np.einsum("nmd,nd->nm", X, (V @ U.T).astype(np.float32)) + z
    return PersonalData(X=X, y=y.astype(np.float32), U_star=U, V_star=V, noise=float(noise))
