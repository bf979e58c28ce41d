"""Floating-point-safe Gaussian noise: a discrete Gaussian on a power-of-two lattice.

The ledger's Gaussian releases used to add ``std * N(0, 1)`` computed in floating point
(Box-Muller on ``os.urandom``, or numpy's normal for a seeded ledger). The set of floating-point
numbers such a sum can take depends on the exact value, which is what the attacks of Mironov
(CCS 2012, on the Laplace mechanism) and Jin et al. (IEEE S&P 2022, on Gaussian samplers) read
from the low bits of the output. :func:`lattice_gaussian` closes them:

1. The grid ``gamma`` is a power of two chosen from public parameters only (the sensitivity
   ``Delta`` and the dimension ``d``): the largest with ``gamma * sqrt(d) <= Delta * 2**-SLACK_BITS``.
2. The value is rounded to the nearest point of ``gamma * Z`` (deterministic, exact in floating
   point since ``gamma`` is a power of two). Each coordinate moves by at most ``gamma / 2``, so
   the rounded statistic has L2 sensitivity at most ``Delta' = Delta + gamma * sqrt(d)``
   (``Delta * (1 + 2**-SLACK_BITS)`` at most).
3. Integer noise ``k`` is drawn *exactly* from the discrete Gaussian ``N_Z(0, s)`` with
   ``sqrt(s) >= z * Delta' / gamma`` (z the noise multiplier), by Algorithm 3 of Canonne, Kamath
   and Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020): discrete
   Laplace proposals and Bernoulli(exp(-x)) acceptances, every one of them an exact comparison
   of random bits with the exact probability (:func:`_bernoulli_exp`).
4. The output is ``gamma * (round(value / gamma) + k)``: an integer times a power of two,
   computed in integers and converted once, a function of the integer alone (post-processing).

Privacy: on the lattice the mechanism is the multivariate discrete Gaussian with an integer
shift of L2 norm at most ``Delta' / gamma``, whose Renyi divergence of every order alpha is at
most ``alpha * (Delta' / gamma)**2 / (2 s)`` (Canonne, Kamath and Steinke 2020: between
discrete Gaussians with integer means, the continuous Gaussian's bound; the divergences of
independent coordinates add), i.e. that of
the continuous Gaussian mechanism with noise multiplier ``z``. The ledger therefore records the
release exactly as before (sensitivity ``Delta``, std ``z * Delta``: the accountant reads only the
ratio ``z``), while the noise actually drawn is ``Delta' / Delta <= 1 + 2**-SLACK_BITS`` times
larger.

The same sampler serves a seeded ledger (its random bits come from the ledger's PCG64, so the
noise is reproducible) and the default one (bits from ``os.urandom``, large draws split over
threads).
"""

from __future__ import annotations

import decimal
import math
import os
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import PrivacyError

#: the lattice's rounding adds at most 2**-SLACK_BITS of the sensitivity (and of the noise std)
SLACK_BITS = 12
#: the largest standard deviation of the integer noise: |k| < 2**52 but with probability
#: exp(-2**23); the lattice values r + k then stay exact in int64
_MAX_SIGMA = float(2**40)
#: the rounded value saturates here (clipping is 1-Lipschitz per coordinate: the bound holds)
_MAX_INT = 2**62
#: a float estimate p_hat of exp(-x) is trusted to within p_hat * 2**-30 + 2**-1000 (the
#: float error of x is below 2**-48 (1 + x) and numpy's exp is accurate to a few ulps: both
#: far inside); a comparison closer than that is settled exactly (:func:`_exact_bernoulli_exp`)
_REL_MARGIN = 2.0**-30
_ABS_MARGIN = 2.0**-1000
_TWO53 = 2.0**-53
#: coordinates drawn at once (temporaries of a few arrays of this size)
_BLOCK = 1 << 20


# ---------------------------------------------------------------------- random bits
class BitSource:
    """Uniform 64-bit words: from a numpy Generator (reproducible) or ``os.urandom``."""

    def __init__(self, rng: np.random.Generator | None = None):
        self.rng = rng

    def words(self, n: int) -> np.ndarray:
        if n <= 0:
            return np.zeros(0, dtype=np.uint64)
        if self.rng is not None:
            return self.rng.bit_generator.random_raw(n)
        return np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()


def _uniform_below(src: BitSource, t: int, n: int) -> np.ndarray:
    """n integers uniform in {0, ..., t - 1}, exactly: below 2**32 by Lemire's multiply-shift
    with rejection (each 64-bit word gives two 32-bit tries), above by rejecting the top of the
    64-bit range and reducing modulo t."""
    if t < 2**32:
        floor = np.uint64((2**32 - t) % t)  # a low part below this would bias the result: retry
        tt = np.uint64(t)
        w = src.words((n + 1) // 2)
        h = np.concatenate([w >> np.uint64(32), w & np.uint64(0xFFFFFFFF)])[:n]
        h *= tt
        out = (h >> np.uint64(32)).astype(np.int64)
        redo = np.flatnonzero((h & np.uint64(0xFFFFFFFF)) < floor)
        if len(redo):
            out[redo] = _uniform_below(src, t, len(redo))
        return out
    limit = (2**64 // t) * t
    w = src.words(n)
    out = (w % np.uint64(t)).astype(np.int64)
    if limit < 2**64:
        redo = np.flatnonzero(w >= np.uint64(limit))
        if len(redo):
            out[redo] = _uniform_below(src, t, len(redo))
    return out


# ---------------------------------------------------------------------- Bernoulli(exp(-x))
def _exact_bernoulli_exp(x: Fraction, prefix: int, bits: int, src: BitSource) -> bool:
    """Whether the uniform U in [0, 1) whose first ``bits`` bits are ``prefix`` is below
    exp(-x), settled exactly: exp(-x) is bracketed in decimal arithmetic (correctly rounded
    exp) at growing precision, and U gains 64 more random bits whenever the bracket cannot tell."""
    prec = 60
    while True:
        ctx = decimal.Context(prec=prec, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)
        xd = ctx.divide(decimal.Decimal(x.numerator), decimal.Decimal(x.denominator))
        p = ctx.exp(-xd)
        # relative error of p: |x| 10^(1-prec) from the division, half an ulp from exp
        err = (math.floor(abs(x)) + 3) * Fraction(10) ** (1 - prec)
        if err >= Fraction(1, 2):  # the bound needs |x| 10^(1-prec) small: more digits
            prec += 40
            continue
        pf = Fraction(p)
        lo_p, hi_p = pf * (1 - err), pf * (1 + err)
        u_lo, u_hi = Fraction(prefix, 2**bits), Fraction(prefix + 1, 2**bits)
        if u_hi <= lo_p:
            return True
        if u_lo >= hi_p:
            return False
        prefix = (prefix << 64) | int(src.words(1)[0])
        bits += 64
        prec += 40


def _bernoulli_exp(src: BitSource, x_hat: np.ndarray, x_exact, words: np.ndarray | None = None) -> np.ndarray:
    """Bernoulli(exp(-x)) per entry, exactly: U uniform with 53 random bits (the top bits of
    ``words``, or fresh words) is compared with the float estimate exp(-x_hat); where U's
    interval [U, U + 2**-53) lies within the error margin of the estimate, the comparison is
    settled by :func:`_exact_bernoulli_exp` with ``x_exact(i)`` (a Fraction) and the same bits.
    The low 11 bits of ``words`` stay unused (a caller may take them as independent bits)."""
    n = len(x_hat)
    if n == 0:
        return np.zeros(0, dtype=bool)
    r = (src.words(n) if words is None else words) >> np.uint64(11)
    u = r.astype(np.float64)
    u *= _TWO53
    u += 2.0**-54  # the middle of U's interval: exact
    p = np.exp(-np.asarray(x_hat, dtype=np.float64))
    out = u < p
    u -= p
    np.abs(u, out=u)
    p *= _REL_MARGIN
    p += _ABS_MARGIN + 2.0**-54
    for i in np.flatnonzero(u < p):  # U's interval reaches within the margin of exp(-x)
        out[i] = _exact_bernoulli_exp(x_exact(int(i)), int(r[i]), 53, src)
    return out


def _exact_floor_neglog(prefix: int, bits: int, src: BitSource) -> int:
    """floor(-ln U) for the uniform U in (0, 1) whose first ``bits`` bits are ``prefix``,
    settled exactly (as :func:`_exact_bernoulli_exp`: decimal brackets of ln at the ends of U's
    interval, more random bits while the interval straddles an integer of -ln)."""
    prec = 60
    while True:
        if prefix > 0:
            ctx = decimal.Context(prec=prec, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)
            scale = decimal.Decimal(2) ** bits
            e_hi = -ctx.ln(ctx.divide(decimal.Decimal(prefix), scale))  # -ln(U's lower end)
            e_lo = -ctx.ln(ctx.divide(decimal.Decimal(prefix + 1), scale))  # -ln(U's upper end)
            slack = decimal.Decimal(10) ** (3 - prec) * (abs(e_hi) + 1)  # rounding of divide and ln
            lo_f, hi_f = math.floor(e_lo - slack), math.floor(e_hi + slack)
            if lo_f == hi_f:
                return int(lo_f)
        prefix = (prefix << 64) | int(src.words(1)[0])
        bits += 64
        prec += 40


def _geometric_e1(src: BitSource, n: int) -> np.ndarray:
    """n draws of V with P(V >= v) = exp(-v) (the successes of Bernoulli(exp(-1)) before the
    first failure): V = floor(-ln U), U uniform with 53 bits, computed in floating point where
    U's whole interval [U, U + 2**-53) maps to one integer with room to spare (-ln moves by at
    most 2**-53 / U over it), exactly (:func:`_exact_floor_neglog`) elsewhere."""
    r = src.words(n) >> np.uint64(11)
    lo = r.astype(np.float64) * _TWO53
    with np.errstate(divide="ignore"):
        e = -np.log(lo + 2.0**-54)
        reach = 2.0**-53 / lo + (e + 1.0) * _REL_MARGIN  # inf where U's interval starts at 0
    a, b = np.floor(e - reach), np.floor(e + reach)
    with np.errstate(invalid="ignore"):  # -inf where U's interval starts at 0: settled below
        out = a.astype(np.int64)
    for i in np.flatnonzero(a != b):
        out[i] = _exact_floor_neglog(int(r[i]), 53, src)
    return out


# ---------------------------------------------------------------------- CKS samplers
def discrete_laplace(src: BitSource, t: int, attempts: int) -> np.ndarray:
    """The draws that ``attempts`` tries of Algorithm 2 of Canonne, Kamath and Steinke (2020)
    accept (about 63% of them), in order: i.i.d. from the discrete Laplace P(y) proportional to
    exp(-|y| / t), t a positive integer. One try: U uniform in {0, ..., t - 1}, kept with
    probability exp(-U / t); V with P(V >= v) = exp(-v); X = U + t V; a random sign, the draw
    refused when the sign is minus and X = 0."""
    u = _uniform_below(src, t, attempts)
    w = src.words(attempts)
    keep = _bernoulli_exp(src, u / t, lambda i: Fraction(int(u[i]), t), words=w)
    d = np.flatnonzero(keep)
    x = u[d] + np.int64(t) * _geometric_e1(src, len(d))
    minus = (w[d] & np.uint64(1)).astype(bool)  # bit 0 of the word whose top 53 bits chose keep
    ok = ~(minus & (x == 0))
    return np.where(minus, -x, x)[ok]


#: about the share of discrete Laplace tries that Algorithm 3 turns into a discrete Gaussian
#: draw (only sizes the batches: every accepted draw is used, in order)
_YIELD = 0.45


def laplace_scale(sigma2: float) -> int:
    """The scale t = floor(sqrt(sigma2)) + 1 of the discrete Laplace proposals of CKS
    Algorithm 3, exactly (the integer square root of the floor of the exact rational)."""
    return math.isqrt(math.floor(Fraction(sigma2))) + 1


def discrete_gaussian(src: BitSource, sigma2: float, n: int) -> np.ndarray:
    """n exact draws of the discrete Gaussian P(y) proportional to exp(-y^2 / (2 sigma2)) on the
    integers, ``sigma2`` a positive float taken as the exact rational it represents (Canonne,
    Kamath and Steinke 2020, Algorithm 3: discrete Laplace proposals of scale t = floor(sigma) + 1,
    accepted with probability exp(-(|y| - sigma2 / t)^2 / (2 sigma2))). Proposals are made in
    batches; the first n accepted ones, in order, are returned."""
    if not (math.isfinite(sigma2) and sigma2 > 0):
        raise PrivacyError(f"the discrete Gaussian needs a finite variance > 0, got {sigma2}")
    s = Fraction(sigma2)
    t = laplace_scale(sigma2)
    q = sigma2 / t
    parts, need = [], n
    while need > 0:
        y = discrete_laplace(src, t, int(need / _YIELD * 1.02) + 32)
        ay = np.abs(y)
        diff = ay.astype(np.float64) - q
        c = _bernoulli_exp(src, diff * diff / (2.0 * sigma2), lambda i: (int(ay[i]) * t - s) ** 2 / (2 * s * t * t))
        got = y[c][:need]
        parts.append(got)
        need -= len(got)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------------- the lattice release
@dataclass(frozen=True)
class Lattice:
    """The public parameters of one lattice release."""

    grid: float  # gamma: a power of two
    sensitivity: float  # Delta' = Delta + gamma sqrt(d): the L2 sensitivity of the rounded value
    sigma2: float  # the integer noise's variance parameter: sqrt(sigma2) >= z Delta' / gamma

    @property
    def std(self) -> float:
        """The noise's scale in the value's units (gamma sqrt(sigma2) >= z Delta')."""
        return self.grid * math.sqrt(self.sigma2)


def lattice_for(sensitivity: float, noise_multiplier: float, dim: int) -> Lattice:
    """The grid and integer noise of a release of ``dim`` coordinates with L2 ``sensitivity`` and
    ``noise_multiplier``: public parameters only (never the value)."""
    dim = max(1, int(dim))
    root = math.sqrt(dim) * (1 + 2**-50)  # >= sqrt(dim)
    gamma = 2.0 ** math.floor(math.log2(sensitivity * 2.0**-SLACK_BITS / root))
    sens = math.nextafter(math.nextafter(sensitivity + gamma * root, math.inf), math.inf)
    sigma = noise_multiplier * sens / gamma * (1 + 2**-50)
    if not sigma <= _MAX_SIGMA:
        raise PrivacyError(
            f"noise multiplier {noise_multiplier} over {dim} coordinates needs a lattice noise of std "
            f"{sigma:.3g} grid steps, above the sampler's limit 2**40"
        )
    sigma2 = math.nextafter(math.nextafter(sigma * sigma, math.inf), math.inf)
    return Lattice(gamma, sens, sigma2)


def lattice_gaussian(
    value: np.ndarray,
    sensitivity: float,
    noise_multiplier: float,
    rng: np.random.Generator | None = None,
    threads: bool = True,
) -> np.ndarray:
    """``value`` (float64, any shape) released on the lattice: ``gamma * (round(value / gamma) + k)``
    with k exact discrete Gaussian noise (module docstring). ``rng``: the seeded ledger's
    generator (reproducible noise), or None for bits from ``os.urandom`` (split over the
    kernels' threads when ``threads``)."""
    value = np.asarray(value, dtype=np.float64)
    lat = lattice_for(sensitivity, noise_multiplier, value.size)
    flat = value.ravel()
    with np.errstate(over="ignore"):  # a value beyond 2**62 grid steps saturates (clip: 1-Lipschitz)
        r = np.clip(np.rint(flat / lat.grid), -_MAX_INT, _MAX_INT).astype(np.int64)
    n = flat.size
    if rng is not None or not threads:  # blocks in turn (bounded memory; reproducible)
        src = BitSource(rng)
        k = (
            np.concatenate([discrete_gaussian(src, lat.sigma2, min(_BLOCK, n - i)) for i in range(0, n, _BLOCK)])
            if n
            else np.zeros(0, dtype=np.int64)
        )
    else:
        from ..util.threads import map_chunks

        k = np.empty(n, dtype=np.int64)

        def part(sl: slice) -> None:
            src = BitSource(None)
            for i in range(sl.start, sl.stop, _BLOCK):
                k[i : min(i + _BLOCK, sl.stop)] = discrete_gaussian(src, lat.sigma2, min(_BLOCK, sl.stop - i))

        map_chunks(part, n, min_chunk=1 << 16)
    return ((r + k).astype(np.float64) * lat.grid).reshape(value.shape)
