"""Exact output laws of the selection mechanisms of :mod:`fedpriv.privacy.selection` for ONE
score vector (k,) — test oracles and small-k analysis (spec §9 of
the private-selection specification, Antonova et al. 2025).

* RNM-Exp / permute-and-flip (spec §1.1): P[a] = p_a * int_0^1 prod_{b != a} (1 - p_b x) dx,
  p_a = exp(eps (q_a - OPT) / (2 Delta)). The integrand is a polynomial of degree k-1 in x, so
  Gauss-Legendre with k//2 + 2 nodes integrates it EXACTLY (up to rounding); the product is
  formed in log space (log1p), so nothing under/overflows.
* EM: softmax(eps q / (2 Delta)) in log space.
* GEM / mGEM: the chosen sensitivity-1 selector's law on the normalised scores.
* k-RR, uniform: closed forms. combined GEM: the mixture of the GEM and mGEM laws at eps2 with the
  randomised-response keep probability at eps1 (spec §9.11).
* RS_gamma (spec §9.9): P[a] = int (1/k) f_a(y) G'(Fbar(y)) dy, f_a the Laplace(q_a, Delta_a/eps0)
  density, Fbar = mean_b F_b, G' the derivative of the TNB probability generating function
  (adaptive quadrature, scipy ``quad_vec``).
* rnmh (not private, reference): P[a] = int f_a(y) prod_{b != a} F_b(y) dy with shifted
  Exponential(2 Delta_b/eps) noise (adaptive quadrature).
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ConfigError
from ...privacy import tnb
from ...privacy import selection as M


# ------------------------------------------------------------------------------------ base laws
def pf_law(logits) -> np.ndarray:
    """Permute-and-flip (= RNM with Exponential noise) law for accept log-probabilities
    ``logits`` = eps*score/(2*sensitivity) (shifted internally so the max is 0). Spec §1.1."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max()
    k = z.size
    if k == 1:
        return np.ones(1)
    p = np.exp(z)
    x, w = np.polynomial.legendre.leggauss(k // 2 + 2)  # exact for degree <= k + 3 > k - 1
    x, w = 0.5 * (x + 1.0), 0.5 * w
    logs = np.log1p(-p[:, None] * x[None, :])  # (k, m), finite: p <= 1 and x < 1
    others = np.exp(logs.sum(axis=0)[None, :] - logs)  # prod over b != a at each node
    return p * (others @ w)


def em_law(logits) -> np.ndarray:
    """Exponential-mechanism (Gumbel-max) law: softmax(logits), in log space. Spec §1.2."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def selector_law(logits, selector: str) -> np.ndarray:
    """Law of ``mechanisms._noisy_argmax``: "exp" -> :func:`pf_law`, "gumbel" -> :func:`em_law`."""
    if selector == "exp":
        return pf_law(logits)
    if selector == "gumbel":
        return em_law(logits)
    raise ConfigError(f"must be one of {M.SELECTORS}, got {selector!r}", field="selector")


def gem_law(
    scores, sens, epsilon: float, sign: int, beta: float = 0.1, selector: str = "exp", t: float | None = None
) -> np.ndarray:
    """Law of GEM (sign -1), mGEM (+1) or the unshifted variant (0) at budget ``epsilon``:
    the selector's law on eps * normalised_scores / 2 with t = gem_t(k, beta, eps) unless given
    (paper §IV-C/D, spec §2-3)."""
    q, d = _one(scores, sens)
    eps = M.check_epsilon(epsilon)
    if t is None:
        t = M.gem_t(q.size, beta, eps)
    s = M._normalized(q[None], d[None], float(t), sign)[0]
    return selector_law(eps * s / 2.0, selector)


def krr_law(scores, epsilon: float) -> np.ndarray:
    """k-RR law (spec §6): the first argmax w.p. 1/(1+(k-1)e^-eps), each other 1/(e^eps+k-1)."""
    q = np.asarray(scores, dtype=np.float64)
    k = q.size
    keep = M.krr_keep_probability(k, epsilon)
    out = np.full(k, (1.0 - keep) / (k - 1) if k > 1 else 0.0)
    out[int(np.argmax(q))] = keep
    return out


def _laplace_cdf(z: np.ndarray) -> np.ndarray:
    return np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))


def _breakpoints(centres: np.ndarray, scales: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Sorted unique points centre + m*scale (m in 0, +-1/2, +-1, +-2, ..., +-32) within [lo, hi],
    plus lo and hi: the ends of the pieces on which the integrands are smooth."""
    m = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    m = np.concatenate([-m[1:], m])
    pts = (centres[:, None] + m[None, :] * scales[:, None]).ravel()
    pts = pts[(pts > lo) & (pts < hi)]
    return np.unique(np.concatenate([[lo, hi], pts]))


def rs_law(scores, sens, eps0: float, eta: float, gamma: float, method: str = "gl") -> np.ndarray:
    """RS_gamma law (spec §9.9): P[a] = int (1/k) f_a(y) G'(Fbar(y)) dy. Each run reports
    candidate a w.p. 1/k with density f_a (Laplace(q_a, Delta_a/eps0)); the best of K runs is a
    with density sum_K P[K] K (1/k) f_a(y) Fbar(y)^(K-1) = (1/k) f_a(y) G'(Fbar(y)).

    The line is cut at every centre q_a + m*b_a (b_a = Delta_a/eps0, m in 0, +-1/2, ..., +-32), so
    the integrand is smooth on each piece and varies there on the piece's own length scale;
    ``method="gl"`` integrates each piece with 64-node Gauss-Legendre (vectorised), ``"quad"`` with
    scipy's adaptive ``quad_vec`` (slower; a cross-check). Tails beyond 60 scales of every centre
    (mass < 1e-26) are dropped."""
    q, d = _one(scores, sens)
    k = q.size
    b = d / eps0

    def integrand(y: np.ndarray) -> np.ndarray:  # y (m,) -> (k, m)
        z = (y[None, :] - q[:, None]) / b[:, None]
        g = tnb.pgf_derivative(_laplace_cdf(z).mean(axis=0), eta, gamma)
        return (0.5 / k) * np.exp(-np.abs(z)) / b[:, None] * g[None, :]

    lo, hi = float(q.min() - 60 * b.max()), float(q.max() + 60 * b.max())
    pts = _breakpoints(q, b, lo, hi)
    if method == "quad":
        from scipy.integrate import quad_vec

        f = lambda y: integrand(np.array([y]))[:, 0]  # noqa: E731
        return sum(quad_vec(f, u, v, epsabs=1e-15, epsrel=1e-12, limit=2000)[0] for u, v in zip(pts[:-1], pts[1:]))
    x, w = np.polynomial.legendre.leggauss(64)
    half = 0.5 * np.diff(pts)
    mid = 0.5 * (pts[:-1] + pts[1:])
    out = np.zeros(k)
    step = max(1, 2**20 // (64 * k))  # pieces per block: < ~8 MB per (k, nodes) array
    for i in range(0, mid.size, step):
        y = (mid[i : i + step, None] + half[i : i + step, None] * x[None, :]).ravel()
        wy = (half[i : i + step, None] * w[None, :]).ravel()
        out += integrand(y) @ wy
    return out


def rnmh_law(scores, sens, epsilon: float) -> np.ndarray:
    """Law of the NON-private RNMH (paper eq. 4): argmax q_a + Exp(scale 2 Delta_a/eps).
    P[a] = int_{L_a}^inf f_a(y) prod_{b != a} F_b(y) dy with L_a = max_b q_b (a report below
    max_{b != a} q_b surely loses: noise is positive); the density tail beyond 60 scales of L_a is
    dropped (mass < 1e-26)."""
    from scipy.integrate import quad

    q, d = _one(scores, sens)
    eps = M.check_epsilon(epsilon)
    k = q.size
    s = 2.0 * d / eps
    out = np.zeros(k)
    for a in range(k):
        rest = np.delete(np.arange(k), a)
        low = max(q[a], q[rest].max()) if k > 1 else q[a]

        def integrand(y: float) -> float:
            log_f = -math.log(s[a]) - (y - q[a]) / s[a]
            za = np.maximum((y - q[rest]) / s[rest], 0.0)
            return math.exp(log_f + float(np.sum(np.log(-np.expm1(-za))))) if np.all(za > 0) else 0.0

        high = low + 60 * s[a]
        pts = _breakpoints(q[rest], s[rest], low, high)
        out[a] = sum(quad(integrand, u, v, epsabs=1e-15, epsrel=1e-12, limit=500)[0] for u, v in zip(pts[:-1], pts[1:]))
    return out


# ------------------------------------------------------------------------------------ public API
def _one(scores, sens) -> tuple[np.ndarray, np.ndarray]:
    if np.ndim(scores) != 1:
        raise ConfigError(f"must be one score vector of shape (k,), got shape {np.shape(scores)}", field="scores")
    q, d = M._inputs(scores, sens)
    if d.shape[0] != 1 and d.strides[0] != 0:
        d = d[:1]
    return q[0], np.asarray(d[0], dtype=np.float64)


def probabilities(name: str, scores, sens, epsilon, **params) -> np.ndarray:
    """Exact law P[output = a], a = 0..k-1, of ``mechanisms.run(name, scores, sens, epsilon,
    rng, **params)`` for one score vector ``scores`` (k,) and sensitivities (k,).
    Supported: every name in ``mechanisms.NAMES`` (rnmh for reference)."""
    p = M.resolve_params(name, **params)
    eps = M.check_epsilon(epsilon)
    q, d = _one(scores, sens)
    k = q.size
    if name in ("rnm", "em"):
        return selector_law(eps * q / (2.0 * d.max()), "exp" if name == "rnm" else "gumbel")
    if name in ("gem", "mgem"):
        return gem_law(q, d, eps, -1 if name == "gem" else 1, p["beta"], p["selector"])
    if name == "krr":
        return krr_law(q, eps)
    if name == "uniform":
        return np.full(k, 1.0 / k)
    if name == "cgem":
        return cgem_law(q, d, eps, **p)
    if name == "rs":
        gamma = 1.0 / k if p["gamma"] is None else p["gamma"]
        return rs_law(q, d, eps / (2.0 + p["eta"]), p["eta"], gamma)
    return rnmh_law(q, d, eps)


def cgem_law(
    scores, sens, epsilon: float, lam: float, beta: float, selector: str, correlation: str, buckets: int
) -> np.ndarray:
    """Combined GEM law (spec §4, §9.11): with bit = [corr(q, Delta) > 0] and keep probability
    p = 1/(1+e^-eps1), P = p*P_mGEM(eps2) + (1-p)*P_GEM(eps2) if bit else the reverse;
    eps1 = lam*eps, eps2 = (1-lam)*eps."""
    q, d = _one(scores, sens)
    eps1, eps2 = lam * epsilon, (1.0 - lam) * epsilon
    positive = M._correlation(correlation, q[None], d[None], buckets)[0] > 0
    keep = M.rr_keep_probability(eps1)
    p_m = keep if positive else 1.0 - keep
    return p_m * gem_law(q, d, eps2, 1, beta, selector) + (1.0 - p_m) * gem_law(q, d, eps2, -1, beta, selector)


def expected_error(name: str, scores, sens, epsilon, **params) -> tuple[float, float]:
    """(E[OPT - q_out], E[(OPT - q_out)^2]) under :func:`probabilities`."""
    q = np.asarray(scores, dtype=np.float64)
    prob = probabilities(name, scores, sens, epsilon, **params)
    err = q.max() - q
    return float(prob @ err), float(prob @ (err * err))
