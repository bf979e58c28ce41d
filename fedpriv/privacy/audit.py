"""Empirical privacy auditing: statistical lower bounds on epsilon from distinguishing tests.

A release M is (epsilon, delta)-DP only if every test that tells M(D) from M(D') (D' = D plus
one user) has a false-positive rate FPR (says "present" on D) and a false-negative rate FNR
(says "absent" on D') with

    FPR + e^epsilon FNR >= 1 - delta   and   FNR + e^epsilon FPR >= 1 - delta.

Running the release many times on D and D' and bounding FPR and FNR from above (Clopper-Pearson)
therefore gives, with the stated confidence, a lower bound on the epsilon of the release: it
must never exceed the accounted epsilon. For a Gaussian release the most powerful test
thresholds the projection of the output on the difference of the exact values (the auditor
knows both data sets); the threshold is chosen on one half of the trials and the bound computed
on the other, fresh half, so that the choice does not inflate the bound.

Nothing here loads data or draws noise: the release function passed in does (through the
ledger).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.stats import beta as beta_dist

# (k, *shape) exact values stacked over k trials, by release name -> noised outputs, same shapes
ReleaseFn = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]
# maps stacked outputs (k, *shape) to (k, m): the coordinates that carry independent noise
ViewFn = Callable[[np.ndarray], np.ndarray]


def _cp_upper(k, n, alpha: float) -> np.ndarray:
    """Upper end of the two-sided Clopper-Pearson interval (vectorised; 1 where k = n)."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        hi = beta_dist.ppf(1.0 - alpha / 2.0, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, hi)


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact two-sided (1 - alpha) binomial confidence interval for k successes in n trials.

    Each end holds with probability at least 1 - alpha/2 on its own.
    """
    if n <= 0 or not (0 <= k <= n):
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if not (0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    lo = 0.0 if k == 0 else float(beta_dist.ppf(alpha / 2.0, k, n - k + 1))
    return lo, float(_cp_upper(k, n, alpha))


def _lower_bounds(fp, n0: int, fn, n1: int, delta: float, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(epsilon lower bounds, FPR upper bounds, FNR upper bounds), vectorised over fp, fn."""
    fpr = _cp_upper(fp, n0, alpha)
    fnr = _cp_upper(fn, n1, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where((fpr > 0) & (1 - delta - fnr > 0), np.log((1 - delta - fnr) / fpr), 0.0)
        b = np.where((fnr > 0) & (1 - delta - fpr > 0), np.log((1 - delta - fpr) / fnr), 0.0)
    eps = np.maximum(0.0, np.maximum(np.nan_to_num(a, nan=0.0), np.nan_to_num(b, nan=0.0)))
    return eps, fpr, fnr


def epsilon_lower_bound(fp: int, n0: int, fn: int, n1: int, delta: float, alpha: float = 0.05) -> float:
    """Lower bound on epsilon from a test with ``fp`` false positives in ``n0`` runs on D (user
    absent) and ``fn`` false negatives in ``n1`` runs on D' (user present).

    With FPR_hi, FNR_hi the upper ends of the two-sided (1 - alpha) Clopper-Pearson intervals,
    eps_lb = max(0, log((1 - delta - FNR_hi) / FPR_hi), log((1 - delta - FPR_hi) / FNR_hi)).
    Each upper end fails with probability at most alpha/2, so by Bonferroni (union bound over the
    two) the bound holds with confidence at least 1 - alpha. Returns 0 when nothing can be
    claimed (no trials, or rates too high).
    """
    if not (0 <= delta < 1):
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    if n0 <= 0 or n1 <= 0:
        return 0.0
    if not (0 <= fp <= n0 and 0 <= fn <= n1):
        raise ValueError(f"need 0 <= fp <= n0 and 0 <= fn <= n1, got fp={fp}, n0={n0}, fn={fn}, n1={n1}")
    eps, _, _ = _lower_bounds(fp, n0, fn, n1, delta, alpha)
    return float(eps)


def threshold_errors(s0: np.ndarray, s1: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false positives, false negatives) of the tests "present iff statistic > t": ``s0`` are
    statistics on D (user absent), ``s1`` on D' (user present)."""
    s0, s1 = np.sort(s0), np.sort(s1)
    fp = len(s0) - np.searchsorted(s0, thresholds, side="right")
    fn = np.searchsorted(s1, thresholds, side="right")
    return fp, fn


def select_threshold(
    s0: np.ndarray,
    s1: np.ndarray,
    delta: float,
    alpha: float,
    thresholds: int | Sequence[float] = 256,
    *,
    selection_alpha: float | None = None,
) -> tuple[float, float]:
    """(threshold, lower bound on these statistics) of the candidate with the largest bound.

    ``thresholds``: candidate values, or how many quantiles of the pooled statistics to try.
    Candidates are ranked by their bound at ``selection_alpha`` (default alpha / number of
    candidates): the stricter level penalises thresholds far in a tail whose few errors look
    good by luck (winner's curse), which would certify poorly on fresh trials. The returned
    bound (at ``alpha``) is optimistic, being maximised over candidates: certify on fresh trials.
    """
    if isinstance(thresholds, (int, np.integer)):
        cand = np.quantile(np.concatenate([s0, s1]), np.linspace(0.0, 1.0, int(thresholds)))
    else:
        cand = np.asarray(thresholds, dtype=np.float64)
    fp, fn = threshold_errors(s0, s1, cand)
    rank, _, _ = _lower_bounds(fp, len(s0), fn, len(s1), delta, selection_alpha or alpha / len(cand))
    eps, _, _ = _lower_bounds(fp, len(s0), fn, len(s1), delta, alpha)
    i = int(np.argmax(rank)) if rank.max() > 0 else int(np.argmax(eps))
    return float(cand[i]), float(eps[i])


def _flat(x: np.ndarray, view: ViewFn | None) -> np.ndarray:
    return (view(x) if view is not None else x).reshape(len(x), -1)


def audit_gaussian_release(
    release: ReleaseFn,
    with_user: Mapping[str, np.ndarray],
    without_user: Mapping[str, np.ndarray],
    *,
    trials: int,
    delta: float,
    alpha: float = 0.05,
    thresholds: int | Sequence[float] = 256,
    views: Mapping[str, ViewFn] | None = None,
    chunk_floats: int = 1 << 23,
) -> dict[str, dict]:
    """Audit the releases of ``release`` on neighbouring inputs.

    ``with_user`` / ``without_user``: the exact values of each release (by name) on D' and on D.
    ``release(values)`` receives them stacked over k trials, shape (k, *shape), and returns the
    noised outputs by name; it is called ``trials`` times in total per data set, in chunks of at
    most ``chunk_floats`` values. ``views[name]`` maps stacked outputs to the coordinates that
    carry independent noise (e.g. the upper triangle of a symmetric release); the test statistic
    is the projection of (output - without) on the unit difference (with - without) there, the
    most powerful test against a Gaussian mechanism.

    The first half of the trials (per data set) selects the threshold (:func:`select_threshold`),
    the second half certifies it: each result's ``lower_bound`` holds with confidence
    ``1 - alpha``. Returns, by name:
    lower_bound, confidence, counts and rates of the certifying half, the threshold, the
    (optimistic) selection bound, the difference norm and the empirical separation of the
    statistics (mean gap over standard deviation, i.e. the difference norm over the noise std).
    """
    if trials < 4:
        raise ValueError(f"need at least 4 trials, got {trials}")
    names = list(with_user)
    if set(names) != set(without_user):
        raise ValueError("with_user and without_user must name the same releases")
    views = dict(views or {})
    w1 = {n: np.asarray(with_user[n], dtype=np.float64) for n in names}
    w0 = {n: np.asarray(without_user[n], dtype=np.float64) for n in names}
    base, unit, norms = {}, {}, {}
    for n in names:
        if w1[n].shape != w0[n].shape:
            raise ValueError(f"{n}: shapes differ, {w1[n].shape} vs {w0[n].shape}")
        base[n] = _flat(w0[n][None], views.get(n))[0]
        diff = _flat(w1[n][None], views.get(n))[0] - base[n]
        norms[n] = float(np.linalg.norm(diff))
        if not norms[n] > 0:
            raise ValueError(f"{n}: the neighbouring values are identical, nothing to audit")
        unit[n] = diff / norms[n]

    per_trial = sum(int(w1[n].size) for n in names)
    chunk = max(1, min(trials, chunk_floats // max(per_trial, 1)))
    stats: dict[str, list[list[np.ndarray]]] = {n: [[], []] for n in names}
    done = 0
    while done < trials:
        k = min(chunk, trials - done)
        for side, values in ((0, w0), (1, w1)):
            stacked = {n: np.broadcast_to(values[n], (k, *values[n].shape)) for n in names}
            out = release(stacked)
            for n in names:
                stats[n][side].append((_flat(np.asarray(out[n]), views.get(n)) - base[n]) @ unit[n])
        done += k

    half = trials // 2
    results = {}
    for n in names:
        s0, s1 = np.concatenate(stats[n][0]), np.concatenate(stats[n][1])
        t, sel_eps = select_threshold(s0[:half], s1[:half], delta, alpha, thresholds)
        e0, e1 = s0[half:], s1[half:]
        fp, fn = threshold_errors(e0, e1, np.array([t]))
        fp, fn = int(fp[0]), int(fn[0])
        eps, fpr, fnr = _lower_bounds(fp, len(e0), fn, len(e1), delta, alpha)
        sd = math.sqrt(0.5 * (np.var(s0) + np.var(s1)))
        results[n] = {
            "lower_bound": float(eps),
            "confidence": 1.0 - alpha,
            "trials": int(trials),
            "selection_trials": int(half),
            "evaluation_trials": int(len(e0)),
            "threshold": t,
            "selection_lower_bound": sel_eps,
            "false_positives": fp,
            "false_negatives": fn,
            "fpr_upper": float(fpr),
            "fnr_upper": float(fnr),
            "difference_norm": norms[n],
            "empirical_separation": float((np.mean(s1) - np.mean(s0)) / sd) if sd > 0 else math.inf,
        }
    return results
