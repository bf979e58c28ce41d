"""Private selection with heterogeneous sensitivities (Antonova, Laro, McMillan, Wolf, SaTML 2025).

Pure-numpy samplers, vectorised over rows (one row = one user's score vector over k candidates).
Formulas: the private-selection specification of the project (Antonova et al. 2025; cited as "spec §n");
where the spec and the paper's prose disagree the paper is followed (said so in the docstring concerned).

Every mechanism except ``rnmh`` is pure epsilon-DP for the TOTAL budget ``epsilon`` passed to
:func:`run`, when ``sensitivities`` bound the change of each candidate's score between neighbouring
datasets and are public:

=========  =====================================================================================
rnm        report noisy max, Exponential noise of scale 2*Delta_max/eps (paper eq. 3, spec §1.1)
em         exponential mechanism = RNM with Gumbel noise, Delta_max (spec §1.2)
gem        generalised exponential mechanism: normalised scores with shift -t*Delta (paper eq. 6-7,
           spec §2), then RNM-Exp at sensitivity 1 (paper footnote 3) or EM (``selector="gumbel"``)
mgem       modified GEM: the same with t negative, i.e. shift +t*Delta (paper §IV-D, spec §3)
rs         RS_gamma: random stopping (Liu-Talwar / Papernot-Steinke) over runs that each draw one
           candidate uniformly and release its score + Laplace(Delta_a/eps0) (paper §IV-B, spec
           §5); K ~ TNB(eta, gamma), eps0 = eps/(2+eta) (eta = 1: geometric, 3*eps0-DP)
krr        k-ary randomised response on the argmax (paper §III-B, spec §6)
uniform    uniform random candidate (ignores eps; trivially private)
cgem       combined GEM: randomised response (budget lam*eps) on sign(correlation(q, Delta)), then
           mGEM if positive else GEM at budget (1-lam)*eps (paper §VII / Algorithm 2, spec §4)
rnmh       NOT private: RNM with Exponential noise of scale 2*Delta_a/eps per candidate (paper eq. 4,
           §IV-A); reference only
=========  =====================================================================================

Research code: floating-point samplers are not side-channel safe (spec §10).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import ConfigError
from . import tnb

NAMES = ("rnm", "em", "gem", "mgem", "rs", "krr", "uniform", "cgem", "rnmh")
PRIVATE = tuple(n for n in NAMES if n != "rnmh")
SELECTORS = ("exp", "gumbel")
CORRELATIONS = ("spearman", "weighted", "pearson")

DEFAULTS: dict[str, dict] = {
    "rnm": {},
    "em": {},
    "gem": {"beta": 0.1, "selector": "exp"},
    "mgem": {"beta": 0.1, "selector": "exp"},
    "rs": {"eta": 1.0, "gamma": None},
    "krr": {},
    "uniform": {},
    "cgem": {"lam": 0.1, "beta": 0.1, "selector": "exp", "correlation": "spearman", "buckets": 10},
    "rnmh": {},
}

_MEMORY_BYTES = 96 * 2**20  # the O(k^2)-per-row steps hold <= 3 (rows, k, k) float arrays within this
_RS_BLOCK = 1_000_000  # random-stopping runs drawn per block (~100 MB of temporaries)


# ------------------------------------------------------------------------------------ validation
def _real(value, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"must be a real number, got {value!r}", field=field)
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"must be finite, got {value}", field=field)
    return value


def check_epsilon(epsilon) -> float:
    """The budget as a float; ConfigError(field="epsilon") unless finite and > 0."""
    eps = _real(epsilon, "epsilon")
    if eps <= 0:
        raise ConfigError(f"must be > 0, got {eps}", field="epsilon")
    return eps


def resolve_params(name: str, **params) -> dict:
    """``DEFAULTS[name]`` updated with ``params``, every value checked (ConfigError names the field)."""
    if name not in NAMES:
        raise ConfigError(f"unknown mechanism {name!r}; known: {', '.join(NAMES)}", field="name")
    out = dict(DEFAULTS[name])
    for key, value in params.items():
        if key not in out:
            allowed = ", ".join(out) or "none"
            raise ConfigError(f"unknown parameter for mechanism {name!r} (allowed: {allowed})", field=key)
        out[key] = value
    if "beta" in out:
        beta = out["beta"] = _real(out["beta"], "beta")
        if not 0 < beta < 1:
            raise ConfigError(f"must be in (0, 1), got {beta}", field="beta")
    if "selector" in out and out["selector"] not in SELECTORS:
        raise ConfigError(f"must be one of {SELECTORS}, got {out['selector']!r}", field="selector")
    if "eta" in out:
        eta = out["eta"] = _real(out["eta"], "eta")
        if eta <= -1:
            raise ConfigError(f"must be > -1 (0 logarithmic, 1 geometric), got {eta}", field="eta")
    if out.get("gamma") is not None:
        gamma = out["gamma"] = _real(out["gamma"], "gamma")
        if not 0 < gamma <= 1:
            raise ConfigError(f"must be in (0, 1] (or None for 1/k), got {gamma}", field="gamma")
    if "lam" in out:
        lam = out["lam"] = _real(out["lam"], "lam")
        if not 0 < lam < 1:
            raise ConfigError(f"must be in (0, 1), got {lam}", field="lam")
    if "correlation" in out and out["correlation"] not in CORRELATIONS:
        raise ConfigError(f"must be one of {CORRELATIONS}, got {out['correlation']!r}", field="correlation")
    if "buckets" in out:
        out["buckets"] = _check_buckets(out["buckets"])
    return out


def _scores(scores) -> np.ndarray:
    try:
        q = np.array(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"must be a numeric array ({exc})", field="scores") from None
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2 or q.shape[1] == 0:
        raise ConfigError(f"must have shape (k,) or (n, k) with k >= 1, got {np.shape(scores)}", field="scores")
    if not np.all(np.isfinite(q)):
        raise ConfigError("has non-finite entries", field="scores")
    return q


def _sensitivities(sens, shape: tuple[int, int]) -> np.ndarray:
    """(n, k) read-only broadcast view of ``sens`` ((k,), (1, k) or (n, k); finite, > 0)."""
    try:
        d = np.array(sens, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"must be a numeric array ({exc})", field="sensitivities") from None
    n, k = shape
    if d.ndim == 1:
        d = d[None, :]
    if d.ndim != 2 or d.shape[1] != k or d.shape[0] not in (1, n):
        raise ConfigError(f"must have shape ({k},) or ({n}, {k}), got {np.shape(sens)}", field="sensitivities")
    if not np.all(np.isfinite(d)):
        raise ConfigError("has non-finite entries", field="sensitivities")
    if not np.all(d > 0):
        raise ConfigError("must all be > 0", field="sensitivities")
    return np.broadcast_to(d, shape)


def _inputs(scores, sens) -> tuple[np.ndarray, np.ndarray]:
    q = _scores(scores)
    return q, _sensitivities(sens, q.shape)


def _row_chunk(k: int, arrays: int = 3) -> int:
    return max(1, _MEMORY_BYTES // (arrays * 8 * k * k))


# ------------------------------------------------------------------------------------ helpers
def gem_t(k: int, beta: float, epsilon: float) -> float:
    """GEM's public shift t = 2 ln(k/beta)/epsilon (Raskhodnikova-Smith; paper §IV-C, spec §2)."""
    return 2.0 * math.log(k / beta) / epsilon


def normalized_scores(scores, sens, t: float, sign: int) -> np.ndarray:
    """GEM normalised scores (paper eq. 6-7, spec §2-3), per row:

        s_a = min_b ((q_a - q_b) + sign*t*(Delta_a - Delta_b)) / (Delta_a + Delta_b)  <= 0

    sign = -1: GEM (shift q - t*Delta, penalises high sensitivity); sign = +1: mGEM (the paper's
    "t negative", shift q + t*Delta, penalises low sensitivity); sign = 0: no shift (t ignored).
    Sensitivity 1 in q for any public t. ``scores`` (k,) or (n, k), ``sens`` (k,) or (n, k);
    returns the shape of ``scores``."""
    if isinstance(sign, bool) or sign not in (-1, 0, 1):
        raise ConfigError(f"must be -1 (GEM), 0 (no shift) or +1 (mGEM), got {sign!r}", field="sign")
    t = _real(t, "t")
    one_d = np.ndim(scores) == 1
    out = _normalized(*_inputs(scores, sens), t, int(sign))
    return out[0] if one_d else out


def _normalized(q: np.ndarray, d: np.ndarray, t: float, sign: int) -> np.ndarray:
    """:func:`normalized_scores` on validated (n, k) arrays. The numerator is formed from
    differences (never from q - t*Delta itself) so a large t does not swamp the score differences.
    Rows are processed in chunks so the (rows, k, k) temporaries stay below ~100 MB; a
    sensitivity vector shared by all rows (stride 0) has its (k, k) terms computed once."""
    n, k = q.shape
    out = np.empty((n, k))
    shared = n > 0 and (d.shape[0] == 1 or d.strides[0] == 0)
    if shared:
        den = d[0][:, None] + d[0][None, :]
        dd = (sign * t) * (d[0][:, None] - d[0][None, :])
    step = _row_chunk(k)
    for lo in range(0, n, step):
        qs = q[lo : lo + step]
        num = qs[:, :, None] - qs[:, None, :]
        if shared:
            if sign:
                num += dd
            num /= den
        else:
            ds = d[lo : lo + step]
            if sign:
                num += (sign * t) * (ds[:, :, None] - ds[:, None, :])
            num /= ds[:, :, None] + ds[:, None, :]
        out[lo : lo + step] = num.min(axis=2)
    return out


def _pearson_rows(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Row-wise (weighted) Pearson correlation; 0 where either row is constant (NaN -> 0)."""
    if w is None:
        w = np.ones(x.shape)
    sw = w.sum(axis=1, keepdims=True)
    xc = x - (w * x).sum(axis=1, keepdims=True) / sw
    yc = y - (w * y).sum(axis=1, keepdims=True) / sw
    cov = (w * xc * yc).sum(axis=1)
    den = np.sqrt((w * xc * xc).sum(axis=1) * (w * yc * yc).sum(axis=1))
    constant = (np.ptp(x, axis=1) == 0) | (np.ptp(y, axis=1) == 0)  # exactly: no rounding noise
    safe = (den > 0) & ~constant
    r = np.where(safe, cov / np.where(safe, den, 1.0), 0.0)
    return np.clip(r, -1.0, 1.0)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Row-wise ranks 1..k of a 2-D array, tied values sharing their average rank (as
    ``scipy.stats.rankdata(method="average", axis=1)``), vectorised in numpy."""
    x = np.asarray(x, dtype=np.float64)
    n, k = x.shape
    order = np.argsort(x, axis=1, kind="stable")
    xs = np.take_along_axis(x, order, axis=1)
    pos = np.broadcast_to(np.arange(k), (n, k))
    starts = np.ones((n, k), dtype=bool)
    starts[:, 1:] = xs[:, 1:] != xs[:, :-1]
    ends = np.ones((n, k), dtype=bool)
    ends[:, :-1] = starts[:, 1:]
    first = np.maximum.accumulate(np.where(starts, pos, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends, pos, k)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty((n, k))
    np.put_along_axis(ranks, order, 0.5 * (first + last) + 1.0, axis=1)
    return ranks


def _spearman(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    rq = average_ranks(q)
    rd = np.broadcast_to(average_ranks(d[:1]), q.shape) if d.strides[0] == 0 else average_ranks(d)
    return _pearson_rows(rq, rd)


def spearman(scores, sens):
    """Spearman's rank correlation of (q, Delta) per row (paper §VII): Pearson correlation of the
    average ranks (ties share their mean rank); 0 for a constant row (where scipy gives NaN).
    Returns a float (np.float64) for 1-D ``scores``, else an (n,) array."""
    one_d = np.ndim(scores) == 1
    r = _spearman(*_inputs(scores, sens))
    return r[0] if one_d else r  # np.float64 (a float) for one vector


def pearson(scores, sens):
    """Plain Pearson correlation of (q, Delta) per row (paper App. -I, for comparison)."""
    one_d = np.ndim(scores) == 1
    r = _pearson_rows(*_inputs(scores, sens))
    return r[0] if one_d else r  # np.float64 (a float) for one vector


def _check_buckets(buckets) -> int:
    if isinstance(buckets, bool) or not isinstance(buckets, numbers.Integral) or buckets < 1:
        raise ConfigError(f"must be an integer >= 1, got {buckets!r}", field="buckets")
    return int(buckets)


def bucket_weights(scores, sens, buckets: int = 10) -> np.ndarray:
    """Weights of the paper's weighted correlation (App. -I), per row: the score range
    [min q, max q] is cut into ``buckets`` equal-width buckets, half-open [lo_i, lo_{i+1}) except
    the last, which is closed; w_a = Delta_a / (largest Delta in a's bucket), so w_a in (0, 1].
    A constant row is a single bucket."""
    one_d = np.ndim(scores) == 1
    w = _bucket_weights(*_inputs(scores, sens), _check_buckets(buckets))
    return w[0] if one_d else w


def _bucket_weights(q: np.ndarray, d: np.ndarray, buckets: int) -> np.ndarray:
    lo, hi = q.min(axis=1, keepdims=True), q.max(axis=1, keepdims=True)
    width = (hi - lo) / buckets
    idx = np.zeros(q.shape, dtype=np.int64)
    for j in range(1, buckets):  # bucket index = number of inner edges <= q
        idx += q >= lo + j * width
    idx[(width == 0).ravel()] = 0
    top = np.zeros(q.shape)
    for b in range(buckets):
        mask = idx == b
        top = np.where(mask, np.where(mask, d, 0.0).max(axis=1, keepdims=True), top)
    return d / top


def weighted_correlation(scores, sens, buckets: int = 10):
    """The paper's weighted correlation (App. -I, eq. 17), per row: the Pearson correlation of
    (q, Delta) with weights w from :func:`bucket_weights` and weighted means
    q_bar = sum w q / sum w, Delta_bar = sum w Delta / sum w; 0 for a constant row.
    (Follows the paper; the spec's §4 placeholder, Pinto da Costa's rank correlation, is not used.)
    Returns a float (np.float64) for 1-D ``scores``, else an (n,) array."""
    one_d = np.ndim(scores) == 1
    r = _weighted(*_inputs(scores, sens), _check_buckets(buckets))
    return r[0] if one_d else r  # np.float64 (a float) for one vector


def _weighted(q: np.ndarray, d: np.ndarray, buckets: int) -> np.ndarray:
    return _pearson_rows(q, d, _bucket_weights(q, d, buckets))


def correlation(kind: str, scores, sens, buckets: int = 10):
    """Dispatch on ``kind`` in CORRELATIONS: "spearman" (paper default), "weighted" (App. -I),
    "pearson"."""
    one_d = np.ndim(scores) == 1
    r = _correlation(kind, *_inputs(scores, sens), _check_buckets(buckets))
    return r[0] if one_d else r  # np.float64 (a float) for one vector


def _correlation(kind: str, q: np.ndarray, d: np.ndarray, buckets: int) -> np.ndarray:
    if kind == "spearman":
        return _spearman(q, d)
    if kind == "weighted":
        return _weighted(q, d, buckets)
    if kind == "pearson":
        return _pearson_rows(q, d)
    raise ConfigError(f"must be one of {CORRELATIONS}, got {kind!r}", field="correlation")


def rr_keep_probability(epsilon: float) -> float:
    """Binary randomised response keeps the true bit w.p. e^eps/(1+e^eps) (stable form)."""
    return 1.0 / (1.0 + math.exp(-epsilon))


def krr_keep_probability(k: int, epsilon: float) -> float:
    """k-RR keeps the argmax w.p. e^eps/(e^eps+k-1) = 1/(1+(k-1)e^-eps) (spec §6, §10)."""
    if k == 1:
        return 1.0
    return 1.0 / (1.0 + math.exp(math.log(k - 1) - epsilon))


# ------------------------------------------------------------------------------------ selectors
def _noisy_argmax(z: np.ndarray, selector: str, rng: np.random.Generator) -> np.ndarray:
    """argmax per row of z + noise, noise iid standard Exponential ("exp": RNM-Exp / permute-and-
    flip law) or standard Gumbel ("gumbel": exponential mechanism). ``z`` is already in noise units
    (score * eps / (2 * sensitivity)); the row max is subtracted first so nothing overflows."""
    z = z - z.max(axis=1, keepdims=True)
    noise = rng.standard_exponential(z.shape) if selector == "exp" else rng.gumbel(size=z.shape)
    return np.argmax(z + noise, axis=1).astype(np.int64)


def _rnm(q, d, eps, rng, selector="exp"):
    """RNM (paper eq. 3, spec §1.1): argmax q_a + Exp(2 Delta_max/eps); EM with "gumbel"."""
    dmax = d.max(axis=1, keepdims=True)
    return _noisy_argmax(q * (eps / (2.0 * dmax)), selector, rng)


def _rnmh(q, d, eps, rng):
    """RNMH (paper eq. 4): argmax q_a + Exp(2 Delta_a/eps). NOT differentially private (§IV-A)."""
    return np.argmax(q + rng.standard_exponential(q.shape) * (2.0 * d / eps), axis=1).astype(np.int64)


def _gem(q, d, eps, rng, sign, beta, selector):
    """GEM (sign -1) / mGEM (sign +1): normalised scores at t = 2 ln(k/beta)/eps, then the
    sensitivity-1 selector at eps (paper §IV-C/D, footnote 3; spec §2-3)."""
    if q.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    s = _normalized(q, d, gem_t(q.shape[1], beta, eps), sign)
    return _noisy_argmax(s * (eps / 2.0), selector, rng)


def _krr(q, eps, rng):
    """k-RR (spec §6): the first argmax w.p. 1/(1+(k-1)e^-eps), else uniform over the other k-1."""
    n, k = q.shape
    best = np.argmax(q, axis=1).astype(np.int64)
    if k == 1:
        return best
    keep = rng.random(n) < krr_keep_probability(k, eps)
    other = rng.integers(0, k - 1, n)
    other += other >= best
    return np.where(keep, best, other).astype(np.int64)


def _cgem(q, d, eps, rng, lam, beta, selector, correlation, buckets):
    """Combined GEM (paper §VII, Algorithm 2; spec §4): bit = [corr(q, Delta) > 0] released by
    randomised response at eps1 = lam*eps; mGEM if the released bit is 1 else GEM, at
    eps2 = (1-lam)*eps. A zero (or undefined) correlation counts as not positive -> GEM."""
    n = q.shape[0]
    eps1, eps2 = lam * eps, (1.0 - lam) * eps
    positive = _correlation(correlation, q, d, buckets) > 0
    keep = rng.random(n) < rr_keep_probability(eps1)
    use_m = positive == keep
    out = np.empty(n, dtype=np.int64)
    for sign, rows in ((1, np.flatnonzero(use_m)), (-1, np.flatnonzero(~use_m))):
        if rows.size:
            out[rows] = _gem(q[rows], _take_rows(d, rows), eps2, rng, sign, beta, selector)
    return out


def _take_rows(d: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """d[rows], keeping a shared (stride-0) sensitivity vector shared."""
    if d.strides[0] == 0:
        return np.broadcast_to(d[0], (len(rows), d.shape[1]))
    return d[rows]


def _rs(q, d, eps, rng, eta, gamma):
    """RS_gamma (paper §IV-B, Algorithm 1, App. -C; spec §5). Per row: K ~ TNB(eta, gamma)
    (gamma None -> 1/k), eps0 = eps/(2+eta); K runs, each picks a candidate a uniformly and
    reports q_a + Laplace(Delta_a/eps0); the candidate of the largest report is returned.
    (2+eta)*eps0 = eps-DP (Papernot-Steinke Cor. 3; eta = 1 is Liu-Talwar's 3*eps0).

    Vectorised: all K are drawn first, then the sum(K) runs in blocks of ``_RS_BLOCK`` (a row may
    straddle blocks); each block is reduced by segment max and merged into a running best."""
    n, k = q.shape
    if gamma is None:
        gamma = 1.0 / k
    eps0 = eps / (2.0 + eta)
    counts = tnb.sample_many(rng, eta, gamma, n)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if n else 0
    best_val = np.full(n, -np.inf)
    best_idx = np.zeros(n, dtype=np.int64)
    for lo in range(0, total, _RS_BLOCK):
        hi = min(lo + _RS_BLOCK, total)
        row = np.searchsorted(ends, np.arange(lo, hi), side="right")
        cand = rng.integers(0, k, hi - lo)
        vals = q[row, cand] + rng.laplace(0.0, 1.0, hi - lo) * (d[row, cand] / eps0)
        starts = np.concatenate([[0], np.flatnonzero(row[1:] != row[:-1]) + 1])
        seg_max = np.maximum.reduceat(vals, starts)
        seg_len = np.diff(np.append(starts, hi - lo))
        pos = np.where(vals == np.repeat(seg_max, seg_len), np.arange(hi - lo), hi - lo)
        first = np.minimum.reduceat(pos, starts)
        rows = row[starts]
        better = seg_max > best_val[rows]
        best_val[rows[better]] = seg_max[better]
        best_idx[rows[better]] = cand[first[better]]
    return best_idx


# ------------------------------------------------------------------------------------ entry point
def select(name: str, scores, sensitivities, epsilon, rng: np.random.Generator, **params) -> np.ndarray:
    """Select one candidate per row with mechanism ``name`` (module docstring).

    ``scores`` (n, k) float, higher is better (a (k,) vector is one row); ``sensitivities`` (k,)
    or (n, k), finite and > 0; ``epsilon`` the mechanism's TOTAL pure-DP budget (rs: eps0 =
    eps/(2+eta) per run; cgem: lam*eps for the bit, (1-lam)*eps for the selection); ``rng`` the
    only source of randomness; ``params`` override ``DEFAULTS[name]``. Returns (n,) int64 indices.
    Bad input raises ConfigError naming the field."""
    p = resolve_params(name, **params)
    eps = check_epsilon(epsilon)
    q, d = _inputs(scores, sensitivities)
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"must be a numpy.random.Generator, got {type(rng).__name__}", field="rng")
    if name == "rnm":
        return _rnm(q, d, eps, rng)
    if name == "em":
        return _rnm(q, d, eps, rng, selector="gumbel")
    if name == "gem":
        return _gem(q, d, eps, rng, -1, p["beta"], p["selector"])
    if name == "mgem":
        return _gem(q, d, eps, rng, 1, p["beta"], p["selector"])
    if name == "rs":
        return _rs(q, d, eps, rng, p["eta"], p["gamma"])
    if name == "krr":
        return _krr(q, eps, rng)
    if name == "uniform":
        return rng.integers(0, q.shape[1], q.shape[0]).astype(np.int64)
    if name == "cgem":
        return _cgem(q, d, eps, rng, p["lam"], p["beta"], p["selector"], p["correlation"], p["buckets"])
    return _rnmh(q, d, eps, rng)
