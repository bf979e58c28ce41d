"""The truncated negative binomial distribution D_{eta,gamma} on {1, 2, ...} of Papernot and
Steinke (2022), Definition 1: the random number of runs of private tuning by random stopping.

Formulas: the private-selection specification (Antonova et al. 2025), section 5. ``eta`` is dp-accounting's ``shape``
(``RepeatAndSelectDpEvent``): 0 logarithmic, 1 geometric; the mean is mapped to ``gamma``
here exactly as dp-accounting maps it (so what is sampled is what is accounted).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError


def check(eta: float, mean: float) -> None:
    if not (math.isfinite(eta) and eta >= 0):
        raise ConfigError(f"must be a finite number >= 0 (0 logarithmic, 1 geometric), got {eta}", field="tune_shape")
    if not (math.isfinite(mean) and mean >= 1):
        raise ConfigError(f"must be a finite number >= 1, got {mean}", field="tune_mean")


def mean_of(gamma: float, eta: float) -> float:
    """E[K] of D_{eta,gamma}."""
    if eta == 0:
        return (1.0 / gamma - 1.0) / math.log(1.0 / gamma) if gamma < 1 else 1.0
    if gamma == 1:
        return 1.0
    return eta * (1.0 - gamma) / (gamma * (1.0 - gamma**eta))


def gamma_for_mean(eta: float, mean: float) -> float:
    """gamma with E[K] = mean (bisection: E[K] decreases in gamma)."""
    check(eta, mean)
    if eta == 1:
        return 1.0 / mean
    if mean == 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid == 0 or mean_of(mid, eta) > mean:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def pmf(k: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """P[K = k] for integer k >= 1 (log-space product); any eta > -1.

    For -1 < eta < 0 the product prod_{l<k} (l+eta)/(l+1) and the normaliser gamma^-eta - 1 are
    both negative; ``gammaln`` gives log|Gamma(eta)|, so the ratio of absolute values is taken."""
    k = np.asarray(k, dtype=np.int64)
    if eta == 0:
        return (1.0 - gamma) ** k / (k * math.log(1.0 / gamma))
    from scipy.special import gammaln

    log_prod = gammaln(k + eta) - gammaln(eta) - gammaln(k + 1.0)
    return np.exp(k * math.log1p(-gamma) + log_prod) / abs(gamma**-eta - 1.0)


def pgf_derivative(z, eta: float, gamma: float):
    """G'(z) = E[K z^(K-1)] for 0 <= z <= 1 (spec private_selection.md section 5); G'(1) = E[K].

    eta != 0: eta (1-gamma) (1 - (1-gamma) z)^(-eta-1) / (gamma^-eta - 1);
    eta == 0: (1-gamma) / ((1 - (1-gamma) z) ln(1/gamma)). gamma == 1 (K = 1 surely): 1."""
    z = np.asarray(z, dtype=np.float64)
    if gamma >= 1.0:
        return np.ones_like(z)
    base = 1.0 - (1.0 - gamma) * z  # in [gamma, 1]
    if eta == 0:
        return (1.0 - gamma) / (base * math.log(1.0 / gamma))
    return eta * (1.0 - gamma) * np.exp((-eta - 1.0) * np.log(base)) / (gamma**-eta - 1.0)


def sample_many(rng: np.random.Generator, eta: float, gamma: float, size: int) -> np.ndarray:
    """``size`` iid draws of K ~ D_{eta,gamma} (int64, all >= 1) for any eta > -1, 0 < gamma <= 1.

    eta = 1: geometric; eta = 0: logarithmic series; eta > 0 with acceptance 1 - gamma^eta >= 1/2:
    negative binomial redrawn while 0; otherwise inverse CDF on the pmf recursion
    P[k+1]/P[k] = (1-gamma)(k+eta)/(k+1) (spec section 5)."""
    size = int(size)
    if gamma >= 1.0 or size == 0:
        return np.ones(size, dtype=np.int64)
    if eta == 1:
        return rng.geometric(gamma, size).astype(np.int64)
    if eta == 0:
        return rng.logseries(1.0 - gamma, size).astype(np.int64)
    if eta > 0 and gamma**eta <= 0.5:
        out = rng.negative_binomial(eta, gamma, size).astype(np.int64)
        bad = np.flatnonzero(out == 0)
        while bad.size:
            out[bad] = rng.negative_binomial(eta, gamma, bad.size)
            bad = bad[out[bad] == 0]
        return out
    return _inverse_cdf(rng.random(size), eta, gamma)


def _inverse_cdf(u: np.ndarray, eta: float, gamma: float, cap: int = 50_000_000) -> np.ndarray:
    """Smallest k with CDF(k) > u, the CDF grown in blocks until it exceeds max(u) (or the mass
    left is below float resolution, or ``cap`` values; the rest is put on the last value)."""
    target = float(u.max())
    cdf_parts, start, total, p = [], 1, 0.0, None
    block = 4096
    while True:
        ks = np.arange(start, start + block, dtype=np.float64)
        if p is None:
            ratios = np.concatenate([[1.0], (1.0 - gamma) * (ks[:-1] + eta) / (ks[:-1] + 1.0)])
            probs = float(pmf(np.array([1]), eta, gamma)[0]) * np.cumprod(ratios)
        else:
            ratios = (1.0 - gamma) * (ks - 1.0 + eta) / ks
            probs = p * np.cumprod(ratios)
        p = probs[-1]
        cdf = total + np.cumsum(probs)
        total = cdf[-1]
        cdf_parts.append(cdf)
        start += block
        if total > target or p < 1e-300 or start > cap:
            break
        block = min(block * 2, 1 << 22)
    cdf = np.concatenate(cdf_parts)
    k = np.searchsorted(cdf, u, side="right") + 1
    return np.minimum(k, len(cdf)).astype(np.int64)


def sample(rng: np.random.Generator, eta: float, mean: float) -> int:
    """One draw of K ~ D_{eta, gamma(mean)}."""
    gamma = gamma_for_mean(eta, mean)
    if gamma >= 1.0:
        return 1
    if eta == 0:
        return int(rng.logseries(1.0 - gamma))
    if gamma**eta <= 0.5:  # acceptance 1 - gamma^eta >= 1/2
        while True:
            k = int(rng.negative_binomial(eta, gamma))
            if k >= 1:
                return k
    # inverse CDF with the pmf recursion P[k+1]/P[k] = (1-gamma)(k+eta)/(k+1)
    u = rng.random()
    k, p = 1, float(pmf(np.array([1]), eta, gamma)[0])
    cdf = p
    while cdf < u and k < 10_000_000:
        p *= (1.0 - gamma) * (k + eta) / (k + 1)
        k += 1
        cdf += p
    return k
