"""The truncated negative binomial distribution D_{eta,gamma} on {1, 2, ...} of Papernot and
Steinke (2022), Definition 1: the random number of runs of private tuning by random stopping.

Formulas: ../shared/specs/private_selection.md, section 5. ``eta`` is dp-accounting's ``shape``
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
    """P[K = k] for integer k >= 1 (log-space product)."""
    k = np.asarray(k, dtype=np.int64)
    if eta == 0:
        return (1.0 - gamma) ** k / (k * math.log(1.0 / gamma))
    from scipy.special import gammaln

    log_prod = gammaln(k + eta) - gammaln(eta) - gammaln(k + 1.0)
    return np.exp(k * math.log1p(-gamma) + log_prod) / (gamma**-eta - 1.0)


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
