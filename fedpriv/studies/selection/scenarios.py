"""Synthetic selection scenarios of Antonova et al., *Private Selection with Heterogeneous
Sensitivities* (SaTML 2025), §VI "Analysing Correlation as a Heuristic" (scenarios 1–6 and the
increasing-correlation family), §VII "Choosing a Mechanism Adaptively" with Appendix -F (the two
polarised scenarios 7–8), and the runner that evaluates every selection mechanism of
:mod:`fedpriv.privacy.selection` on them (``fedpriv selection scenarios``).

Protocol (paper §VI "Experimental Design"; spec §8)
----------------------------------------------------
* ``k = 100`` candidates (paper: "In all experiments the number of candidates is set to [k]").
* Each scenario defines, for each candidate ``a``, a score distribution ``P_a``. ``T`` score sets
  (trials) are drawn, one score per candidate per trial; scores vary between trials.
* The sensitivity ``Δ_a`` is constant across trials: the difference between an upper and a
  lower quantile of the ``T`` scores drawn for candidate ``a``; every score is then clipped to
  that range. The paper's quantile levels were lost; we use the **5 % and 95 %** quantiles
  (:data:`QUANTILES`; the paper's bandit appendix uses 10/90 for a different purpose).
* Error of a trial: ``OPT − q_â`` on the clipped scores (``OPT`` = that trial's maximum clipped
  score); reported: ``MSE`` = mean of the squared errors over the ``T`` trials, with its
  standard error ``mse_se = sd(e²)/sqrt(T)``.
* Every trial is one independent dataset (one row of ``scores``); all trials of one
  (scenario, mechanism, ε) cell go through ONE :meth:`PrivacyLedger.select` call (rows = trials),
  with a fresh ledger seeded from (seed, scenario, mechanism label, ε) — a cell's result does not
  depend on which other cells are run. The non-private reference ``rnmh`` (refused by the ledger)
  is run through :func:`mechanisms.run` under :func:`public_draws`. Score generation is public
  (synthetic) and also runs under :func:`public_draws`; it is seeded from (seed, scenario) only,
  so every mechanism and ε of a scenario sees the same trials (common random numbers).
* Reported correlation: ``spearman`` = mean over trials of the per-trial Spearman correlation
  between the clipped scores and the sensitivities; ``weighted_correlation`` likewise with the
  paper's bucket-weighted correlation (Appendix -I, 10 buckets).
* Default ε grid: 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 4, 8, 16 (the paper's figures span 0.01
  to 16; the grid points themselves were lost). Default ``T = 2000`` (paper's ``T`` lost).
* Mechanism hyper-parameters: the defaults of :data:`mechanisms.DEFAULTS` (paper §VI lists a β
  for GEM/mGEM and a γ for RSγ; values lost). cGEM additionally runs at λ = 0.25 and 0.5
  (labels ``cgem-lam0.25``, ``cgem-lam0.5``) on the polarised scenarios only.

Scenarios and the choices made for the lost numbers
---------------------------------------------------
``s1-bimodal-pos``, ``s2-bimodal-neg``, ``s3-bimodal-none`` — paper: "a bimodal split in the
candidate scores and candidate-wise sensitivities: the high scores are set to [h], the low to
[l], and the sensitivities are either [Δ1] or [Δ2]. There is no variability in the scores and
sensitivities"; positive, negative and no correlation; the previous figures use "the equal split"
(Appendix -E), and in scenario 3 "the best candidate has a sensitivity comparable to the rest"
and GEM, mGEM, RSγ are all "slightly worse than RNM". Chosen: 50 high candidates with score
``h = 1``, 50 low with ``l = 0``; sensitivities ``Δ_hi = 1`` and ``Δ_lo = 0.5``. Scores are fixed
(the quantile rule would give Δ = 0), so these scenarios carry explicit sensitivities and no
clipping. Scenario 1: high scores ↔ Δ_hi; scenario 2: high scores ↔ Δ_lo; scenario 3: within
each score group half the candidates get Δ_hi and half Δ_lo (Spearman exactly 0). The ratio
``Δ_lo/Δ_hi = 1/2`` is the one the paper's utility-bound condition (Appendix -J: GEM's bound is
worse than RNM's when Δ_opt > Δ_max/2) puts at the boundary, which is what reproduces the
described scenario-3 behaviour (exact permute-and-flip laws: at ε = 1 RNM 0.376, GEM 0.379, mGEM
0.435); with a smaller ratio (e.g. 1/4) GEM would clearly beat RNM in scenario 3, contradicting
the prose. A score gap of 1 with Δ_max = 1 makes RNM go from near-uniform (ε = 0.01) to
near-perfect (ε = 16) across the grid.

``s4-pos``, ``s5-neg``, ``s6-none`` ("more realistic scores"; the paper's distributions were
lost). Paper: "In Scenario 4, we first sample 100 samples from [D] and order these in increasing
order, then for each candidate a set P_a = [...]. In Scenario 5, we set P_a = [...]. Finally,
Scenario 6 first samples [x_a] and [y_a] for each candidate then sets P_a = [...]"; GEM does
badly under positive correlation and well under negative or absent correlation, and vice-versa
for mGEM/RSγ. Chosen (all Gaussian, means on [0, 1], standard deviations in
``[SD_LO, SD_HI] = [0.02, 0.3]``, so Δ_a ≈ 3.29 σ_a ∈ [0.07, 1]):
  * s4: ``σ_(1) ≤ … ≤ σ_(100)`` = 100 sorted draws of U(SD_LO, SD_HI); ``P_a = N(a/k, σ_(a)²)``
    (better candidates are noisier: positive correlation).
  * s5: ``P_a = N(a/k, σ_a²)`` with ``σ_a = SD_HI − (SD_HI − SD_LO)·a/k`` (negative correlation).
  * s6: ``μ_a ~ U(0, 1)`` and ``σ_a ~ U(SD_LO, SD_HI)`` independently; ``P_a = N(μ_a, σ_a²)``
    (no correlation).

``corr-3`` … ``corr+3`` (increasing correlation; paper: "the scenarios are each indexed by a value
[c]. For each scenario (value of c), and each candidate, we sample [...], and then define P_a =
[...]", Spearman going from negative to positive across the panels). Chosen: 7 values
``c ∈ {−1, −2/3, −1/3, 0, 1/3, 2/3, 1}`` (name ``corr{3c:+d}``, ``corr0`` for c = 0); per candidate
``g_a, h_a ~ N(0, 1)`` independently, mean ``μ_a = Φ(g_a)`` (uniform on (0, 1)), spread
``σ_a = SD_LO + (SD_HI − SD_LO)·Φ(c·g_a + sqrt(1 − c²)·h_a)``, ``P_a = N(μ_a, σ_a²)`` (a Gaussian
copula: the Spearman correlation of (μ, σ) is (6/π)·asin(c/2), nearly linear in c, so the
panels are evenly spread from ≈ −1 to ≈ +1; a linear mixture of uniforms saturated too early).
Each c draws its own candidate parameters (seeded by (seed, scenario name)).

``s7-polarised-strong``, ``s8-polarised-weak`` (Appendix -F; numbers lost). Paper: users split
equally into two groups; base scores for group 0 given by one formula in the candidate index and
another for group 1; per-user scores = base + sampled noise; half the datasets have strong
positive and half strong negative correlation (scenario 7), scenario 8 "less polarised and
noisier"; the figures show "the sensitivities across mean scores by groups". Here one trial =
one user; trials ``0 … T//2 − 1`` are group 0, the rest group 1. With ``x_a = a/(k − 1)``, a
per-candidate noise level ``σ_a = SD_LO + (SD_HI − SD_LO)·x_a`` and a shared random base
``w_a ~ U(0, 1)``: group 0 ``b⁰_a = ρ·x_a + (1 − ρ)·w_a``, group 1 ``b¹_a = ρ·(1 − x_a) +
(1 − ρ)·w_a``, user scores ``b^g_a + σ_a·ξ``, ``ξ ~ N(0, 1)``. Polarisation ``ρ = 1`` (strong)
and ``ρ = 0.35`` (weak: the shared random component makes the per-user correlation weaker and
noisier). The quantile rule is applied within each group (a user's sensitivities are those of its
group: the per-row ``(n, k)`` sensitivities of the mechanisms API); pooling both groups would make
Δ_a measure the gap between the groups' base scores instead of the score noise.

Outputs (:func:`write_outputs`): ``selection.json`` (list of rows, keys :data:`ROW_KEYS`) and
``selection_{bimodal,realistic,correlation,polarised}.png`` (one panel per scenario, MSE vs ε on
a log ε axis, ±2 standard errors shaded, RNM solid black and random dashed grey), plus
``selection_correlation_relative.png`` (MSE / MSE of RNM against the mean Spearman correlation
of the increasing-correlation family, at ε = 0.1 and 1). With the defaults (2000 trials, 11 ε,
15 scenarios, 1529 cells) a run takes about two minutes; ``--quick`` about 15 s.

Observed with the defaults (qualitative): scenarios 1, 4 and corr+3 — mGEM and RSγ beat RNM,
GEM is worse than random for ε below ~2; scenarios 2, 5 and corr-3 — the order flips; scenario 3
— RNM is within noise of the best private mechanism. In scenario 7, combined GEM beats both GEM
and mGEM only once λε reaches about 1 (below that the randomised-response bit is close to a coin
flip), and RNM stays close to or better than it.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy.special import ndtr

from ...errors import ConfigError
from ...privacy.ledger import PrivacyLedger, public_draws

K = 100
QUANTILES = (0.05, 0.95)
DEFAULT_EPSILONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
DEFAULT_TRIALS = 2000
QUICK_EPSILONS = (0.1, 1.0, 8.0)
QUICK_TRIALS = 300
MIN_TRIALS = 20  # the 5 %/95 % quantiles of fewer draws are meaningless

BIMODAL_HIGH, BIMODAL_LOW = 1.0, 0.0
BIMODAL_SENS_HIGH, BIMODAL_SENS_LOW = 1.0, 0.5
BIMODAL_FRACTION_HIGH = 0.5
SD_LO, SD_HI = 0.02, 0.3
CORRELATION_C = (-1.0, -2.0 / 3.0, -1.0 / 3.0, 0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0)
POLARISATION = {"strong": 1.0, "weak": 0.35}

# extra mechanism variants (label -> (mechanism, params)); by default only on the polarised scenarios
VARIANTS: dict[str, tuple[str, dict]] = {
    "cgem-lam0.25": ("cgem", {"lam": 0.25}),
    "cgem-lam0.5": ("cgem", {"lam": 0.5}),
}
SUMMARY_EPSILONS = (0.1, 1.0)
RELATIVE_EPSILONS = (0.1, 1.0)  # epsilons of the correlation-family relative-MSE figure
ROW_KEYS = ("scenario", "mechanism", "epsilon", "mse", "mse_se", "spearman", "weighted_correlation", "trials")


def _mech():
    from ...privacy import selection as mechanisms

    return mechanisms


# ---------------------------------------------------------------------------------------- scenarios
Sampler = Callable[[np.random.Generator, int], np.ndarray]


@dataclass(frozen=True)
class Scenario:
    """One synthetic scenario: ``sample(rng, T)`` draws the raw ``(T, k)`` score sets (candidate
    parameters first, then the trials). ``sensitivities`` is set only for scenarios without
    variability (bimodal), whose scores are then used as they are. ``strata(T)`` labels each
    trial's group; the quantile rule is applied within each group."""

    name: str
    title: str
    group: str
    sample: Sampler
    sensitivities: np.ndarray | None = None
    n_groups: int = 1
    c: float | None = None

    def strata(self, trials: int) -> np.ndarray:
        if self.n_groups == 1:
            return np.zeros(trials, dtype=np.int64)
        return (np.arange(trials) >= trials // 2).astype(np.int64)


@dataclass
class Instance:
    """Materialised scenario: clipped scores ``(T, k)``, sensitivities ``(k,)`` or ``(T, k)``,
    per-trial optimum, and the quantile bounds ``lo``/``hi`` (same shape as the sensitivities)."""

    scenario: Scenario
    scores: np.ndarray
    sensitivities: np.ndarray
    opt: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    raw: np.ndarray | None = field(default=None, repr=False)


_CORR_WORD = {"positive": "positive", "negative": "negative", "none": "no"}


def bimodal(correlation: str) -> Scenario:
    """Scenarios 1–3: fixed bimodal scores (h = 1 / l = 0, half each) and fixed sensitivities
    (1 / 0.5); ``correlation`` in {"positive", "negative", "none"}."""
    n_hi = int(round(BIMODAL_FRACTION_HIGH * K))
    q = np.r_[np.full(n_hi, BIMODAL_HIGH), np.full(K - n_hi, BIMODAL_LOW)]
    hi, lo = BIMODAL_SENS_HIGH, BIMODAL_SENS_LOW
    if correlation == "positive":
        sens, num, name = np.r_[np.full(n_hi, hi), np.full(K - n_hi, lo)], 1, "s1-bimodal-pos"
    elif correlation == "negative":
        sens, num, name = np.r_[np.full(n_hi, lo), np.full(K - n_hi, hi)], 2, "s2-bimodal-neg"
    elif correlation == "none":
        h1, l1 = n_hi // 2, (K - n_hi) // 2
        sens = np.r_[np.full(h1, hi), np.full(n_hi - h1, lo), np.full(l1, hi), np.full(K - n_hi - l1, lo)]
        num, name = 3, "s3-bimodal-none"
    else:
        raise ConfigError(f"unknown correlation {correlation!r}", field="correlation")

    def sample(rng: np.random.Generator, trials: int) -> np.ndarray:
        return np.broadcast_to(q, (trials, K)).copy()

    return Scenario(
        name, f"Scenario {num}: bimodal, {_CORR_WORD[correlation]} correlation", "bimodal", sample, sensitivities=sens
    )


def realistic(correlation: str) -> Scenario:
    """Scenarios 4–6: Gaussian candidate distributions whose spread increases (4), decreases (5)
    or is independent of (6) the candidate's mean."""
    idx = np.arange(1, K + 1) / K

    if correlation == "positive":
        num, name = 4, "s4-pos"

        def params(rng):
            return idx, np.sort(rng.uniform(SD_LO, SD_HI, K))
    elif correlation == "negative":
        num, name = 5, "s5-neg"

        def params(rng):
            return idx, SD_HI - (SD_HI - SD_LO) * idx
    elif correlation == "none":
        num, name = 6, "s6-none"

        def params(rng):
            mu = rng.uniform(0.0, 1.0, K)
            return mu, rng.uniform(SD_LO, SD_HI, K)
    else:
        raise ConfigError(f"unknown correlation {correlation!r}", field="correlation")

    def sample(rng: np.random.Generator, trials: int) -> np.ndarray:
        mu, sd = params(rng)
        return mu + sd * rng.standard_normal((trials, K))

    return Scenario(name, f"Scenario {num}: Gaussian, {_CORR_WORD[correlation]} correlation", "realistic", sample)


def _corr_name(c: float) -> str:
    i = int(round(3 * c))
    return "corr0" if i == 0 else f"corr{i:+d}"


def increasing_correlation(c: float) -> Scenario:
    """Increasing-correlation family, ``c`` in [-1, 1]: mean and spread of each candidate are
    coupled by a Gaussian copula with correlation ``c``."""
    if not (math.isfinite(c) and -1.0 <= c <= 1.0):
        raise ConfigError(f"c must be in [-1, 1], got {c}", field="c")

    def sample(rng: np.random.Generator, trials: int) -> np.ndarray:
        g = rng.standard_normal(K)
        h = rng.standard_normal(K)
        mu = ndtr(g)
        sd = SD_LO + (SD_HI - SD_LO) * ndtr(c * g + math.sqrt(max(0.0, 1.0 - c * c)) * h)
        return mu + sd * rng.standard_normal((trials, K))

    return Scenario(_corr_name(c), f"c = {c:+.2f}", "correlation", sample, c=float(c))


def polarised(strength: str) -> Scenario:
    """Scenarios 7 (strong) and 8 (weak): two equal groups of users, group 0 with positive and
    group 1 with negative score/sensitivity correlation (Appendix -F)."""
    if strength not in POLARISATION:
        raise ConfigError(f"unknown polarisation {strength!r}", field="strength")
    rho = POLARISATION[strength]
    x = np.arange(K) / (K - 1)
    sd = SD_LO + (SD_HI - SD_LO) * x

    def sample(rng: np.random.Generator, trials: int) -> np.ndarray:
        w = rng.uniform(0.0, 1.0, K)
        base0 = rho * x + (1.0 - rho) * w
        base1 = rho * (1.0 - x) + (1.0 - rho) * w
        g = (np.arange(trials) >= trials // 2)[:, None]
        return np.where(g, base1, base0) + sd * rng.standard_normal((trials, K))

    num = 7 if strength == "strong" else 8
    return Scenario(
        f"s{num}-polarised-{strength}", f"Scenario {num}: {strength} polarisation", "polarised", sample, n_groups=2
    )


def all_scenarios() -> dict[str, Scenario]:
    out = [
        bimodal("positive"),
        bimodal("negative"),
        bimodal("none"),
        realistic("positive"),
        realistic("negative"),
        realistic("none"),
    ]
    out += [increasing_correlation(c) for c in CORRELATION_C]
    out += [polarised("strong"), polarised("weak")]
    return {s.name: s for s in out}


SCENARIOS = all_scenarios()
GROUPS = ("bimodal", "realistic", "correlation", "polarised")
GROUP_TITLES = {
    "bimodal": "Scenarios 1-3: bimodal scores",
    "realistic": "Scenarios 4-6: more realistic scores",
    "correlation": "Increasing correlation",
    "polarised": "Scenarios 7-8: polarised users (combined GEM)",
}


def _seed_of(*parts) -> int:
    words = [int(p) if isinstance(p, (int, np.integer)) else zlib.crc32(str(p).encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0])


def quantile_clip(raw: np.ndarray, strata: np.ndarray | None = None, quantiles: tuple[float, float] = QUANTILES):
    """The paper's rule: per candidate (and per stratum), Δ_a = upper − lower quantile of its
    sampled scores; scores clipped to [lower, upper]. Returns (clipped, Δ, lo, hi), with Δ/lo/hi
    of shape (k,) for a single stratum, else (T, k) (each trial carries its stratum's values)."""
    raw = np.asarray(raw, dtype=np.float64)
    ql, qh = quantiles
    if strata is None or np.all(strata == strata[0]):
        lo, hi = np.quantile(raw, [ql, qh], axis=0)
    else:
        lo = np.empty_like(raw)
        hi = np.empty_like(raw)
        for g in np.unique(strata):
            m = strata == g
            lo[m], hi[m] = np.quantile(raw[m], [ql, qh], axis=0)[:, None, :]
    sens = hi - lo
    if not np.all(sens > 0):
        raise ConfigError("a candidate's sampled scores have a zero quantile range (too few trials?)", field="--trials")
    return np.clip(raw, lo, hi), sens, lo, hi


def materialise(scenario: Scenario, trials: int, seed: int) -> Instance:
    """Draw ``trials`` score sets of ``scenario`` (seeded by (seed, scenario name)), apply the
    quantile rule (or the explicit sensitivities) and compute each trial's optimum."""
    if int(trials) < MIN_TRIALS:
        raise ConfigError(f"need at least {MIN_TRIALS} trials, got {trials}", field="--trials")
    rng = np.random.default_rng(_seed_of(seed, "scenario", scenario.name))
    with public_draws(f"synthetic selection scenario {scenario.name}"):
        raw = scenario.sample(rng, int(trials))
    if scenario.sensitivities is not None:
        scores, sens, lo, hi = raw, np.asarray(scenario.sensitivities, dtype=np.float64), None, None
    else:
        scores, sens, lo, hi = quantile_clip(raw, scenario.strata(int(trials)))
    return Instance(scenario, scores, sens, scores.max(axis=1), lo, hi, raw)


# ------------------------------------------------------------------------------------------ running
def mechanism_labels(scenario: Scenario, mechanisms: Sequence[str] | None) -> list[str]:
    if mechanisms is not None:
        return list(mechanisms)
    labels = list(_mech().NAMES)
    if scenario.group == "polarised":
        labels += list(VARIANTS)
    return labels


def _resolve(label: str) -> tuple[str, dict]:
    if label in VARIANTS:
        name, params = VARIANTS[label]
        return name, dict(params)
    return label, {}


def known_labels() -> list[str]:
    return list(_mech().NAMES) + list(VARIANTS)


def run_cell(inst: Instance, label: str, epsilon: float, seed: int) -> np.ndarray:
    """Selected candidate of every trial of one (scenario, mechanism, ε) cell: one ledger call
    (rows = trials) from a fresh ledger seeded by (seed, scenario, label, ε)."""
    mech = _mech()
    name, params = _resolve(label)
    cell_seed = _seed_of(seed, inst.scenario.name, label, repr(float(epsilon)))
    if name in mech.PRIVATE:
        ledger = PrivacyLedger(seed=cell_seed)
        return ledger.select(
            f"selection/{inst.scenario.name}/{label}",
            name,
            inst.scores,
            inst.sensitivities,
            epsilon=float(epsilon),
            **params,
        )
    rng = np.random.default_rng(cell_seed)
    with public_draws(f"{name}: non-private reference"):
        return mech.select(name, inst.scores, inst.sensitivities, float(epsilon), rng, **params)


def _check(epsilons, trials, scenarios, mechanisms) -> tuple[list[float], int, list[str], list[str] | None]:
    eps = []
    for e in epsilons:
        try:
            v = float(e)
        except (TypeError, ValueError):
            raise ConfigError(f"not a number: {e!r}", field="--epsilons") from None
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"epsilons must be finite and > 0, got {e!r}", field="--epsilons")
        eps.append(v)
    if not eps:
        raise ConfigError("no epsilon given", field="--epsilons")
    if isinstance(trials, bool) or int(trials) != trials or int(trials) < MIN_TRIALS:
        raise ConfigError(f"trials must be an integer >= {MIN_TRIALS}, got {trials!r}", field="--trials")
    names = expand_scenarios(scenarios)
    labels = None
    if mechanisms is not None:
        known = known_labels()
        bad = [m for m in mechanisms if m not in known]
        if bad or not mechanisms:
            raise ConfigError(f"unknown mechanism(s) {bad} (known: {', '.join(known)})", field="--mechanisms")
        labels = list(dict.fromkeys(mechanisms))
    return eps, int(trials), names, labels


def expand_scenarios(scenarios: Sequence[str] | None) -> list[str]:
    """Scenario names, group names (bimodal, realistic, correlation, polarised) or 'all'."""
    if scenarios is None:
        return list(SCENARIOS)
    out: list[str] = []
    for s in scenarios:
        if s == "all":
            out += list(SCENARIOS)
        elif s in GROUPS:
            out += [n for n, sc in SCENARIOS.items() if sc.group == s]
        elif s in SCENARIOS:
            out.append(s)
        else:
            raise ConfigError(
                f"unknown scenario {s!r} (known: {', '.join(SCENARIOS)}, or a group: {', '.join(GROUPS)}, all)",
                field="--scenarios",
            )
    if not out:
        raise ConfigError("no scenario given", field="--scenarios")
    return list(dict.fromkeys(out))


def run_scenarios(
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    trials: int = DEFAULT_TRIALS,
    seed: int = 0,
    scenarios: Sequence[str] | None = None,
    mechanisms: Sequence[str] | None = None,
    progress=None,
) -> list[dict]:
    """MSE of every (scenario, mechanism, ε) cell; rows with keys :data:`ROW_KEYS`.
    ``progress``: called with one line after each scenario (what is done, the time so far)."""
    eps, trials, names, labels = _check(epsilons, trials, scenarios, mechanisms)
    mech = _mech()
    rows = []
    t0 = time.perf_counter()
    for k, sname in enumerate(names):
        if progress is not None and k == 0:
            progress(f"scenarios: {len(names)} to run, {trials} trials a cell (a line after each)")
        inst = materialise(SCENARIOS[sname], trials, seed)
        rho = float(np.mean(mech.spearman(inst.scores, inst.sensitivities)))
        wcorr = float(np.mean(mech.weighted_correlation(inst.scores, inst.sensitivities)))
        ar = np.arange(trials)
        for label in mechanism_labels(inst.scenario, labels):
            for e in eps:
                sel = np.asarray(run_cell(inst, label, e, seed), dtype=np.int64)
                err2 = (inst.opt - inst.scores[ar, sel]) ** 2
                rows.append(
                    {
                        "scenario": sname,
                        "mechanism": label,
                        "epsilon": e,
                        "mse": float(err2.mean()),
                        "mse_se": float(err2.std(ddof=1) / math.sqrt(trials)),
                        "spearman": rho,
                        "weighted_correlation": wcorr,
                        "trials": trials,
                    }
                )
        if progress is not None:
            progress(
                f"scenarios: {k + 1}/{len(names)} done ({sname}), {len(rows)} cells, {time.perf_counter() - t0:.0f} s"
            )
    return rows


# ------------------------------------------------------------------------------------------ outputs
_STYLE = {
    "rnm": dict(color="black", lw=2.6, ls="-", zorder=5),
    "uniform": dict(color="0.35", lw=2.6, ls="--", zorder=5),
    "rnmh": dict(color="0.6", lw=1.2, ls=":", zorder=2),
    "em": dict(color="tab:olive", lw=1.3, ls="-."),
    "gem": dict(color="tab:purple", lw=1.8),
    "mgem": dict(color="tab:pink", lw=1.8),
    "rs": dict(color="tab:orange", lw=1.6),
    "krr": dict(color="tab:cyan", lw=1.3, ls="-."),
    "cgem": dict(color="tab:green", lw=1.8),
    "cgem-lam0.25": dict(color="tab:green", lw=1.4, ls="--"),
    "cgem-lam0.5": dict(color="tab:green", lw=1.4, ls=":"),
}
_LABEL = {
    "rnm": "RNM",
    "uniform": "random",
    "rnmh": "RNMH (not DP)",
    "em": "EM",
    "gem": "GEM",
    "mgem": "mGEM",
    "rs": "RS$_\\gamma$",
    "krr": "kRR",
    "cgem": "cGEM",
    "cgem-lam0.25": "cGEM λ=0.25",
    "cgem-lam0.5": "cGEM λ=0.5",
}


def _style(label):
    return dict(_STYLE.get(label, dict(lw=1.3)))


def _new_figure(n_panels: int, ncols: int | None = None, panel=(4.2, 3.3)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ncols = ncols or min(n_panels, 4)
    nrows = int(math.ceil(n_panels / ncols))
    fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def _by_cell(rows):
    d: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        d.setdefault(r["scenario"], {}).setdefault(r["mechanism"], []).append(r)
    for per in d.values():
        for lst in per.values():
            lst.sort(key=lambda r: r["epsilon"])
    return d


def _plot_group(cells, names, title):
    fig, axes = _new_figure(len(names))
    handles = {}
    for ax, sname in zip(axes, names):
        per = cells[sname]
        spear = next(iter(per.values()))[0]["spearman"]
        for label, lst in per.items():
            x = np.array([r["epsilon"] for r in lst])
            y = np.array([r["mse"] for r in lst])
            se = np.array([r["mse_se"] for r in lst])
            (h,) = ax.plot(x, y, marker="o", ms=2.5, label=_LABEL.get(label, label), **_style(label))
            ax.fill_between(x, np.maximum(y - 2 * se, 0), y + 2 * se, color=h.get_color(), alpha=0.12, lw=0)
            handles.setdefault(label, h)
        sc = SCENARIOS.get(sname)
        ax.set_title(f"{sc.title if sc else sname}\nSpearman {spear:+.2f}", fontsize=9)
        ax.set_xscale("log")
        ax.set_xlabel("ε")
        ax.set_ylabel("MSE")
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(title)
    fig.legend(
        [handles[k] for k in handles],
        [_LABEL.get(k, k) for k in handles],
        loc="outside lower center",
        ncols=min(len(handles), 6),
        fontsize=8,
    )
    return fig


def _plot_relative(cells, names):
    eps_avail = sorted({r["epsilon"] for s in names for lst in cells[s].values() for r in lst})
    chosen = [e for e in RELATIVE_EPSILONS if any(math.isclose(e, a) for a in eps_avail)]
    if not chosen:
        chosen = [eps_avail[len(eps_avail) // 2]]
    fig, axes = _new_figure(len(chosen), panel=(5.0, 3.8))
    handles = {}
    for ax, e in zip(axes, chosen):
        labels = list(dict.fromkeys(lab for s in names for lab in cells[s]))
        for label in labels:
            xs, ys = [], []
            for s in names:
                lst = cells[s].get(label, [])
                ref = [r for r in cells[s].get("rnm", []) if math.isclose(r["epsilon"], e)]
                row = [r for r in lst if math.isclose(r["epsilon"], e)]
                if ref and row and ref[0]["mse"] > 0:
                    xs.append(row[0]["spearman"])
                    ys.append(row[0]["mse"] / ref[0]["mse"])
            if xs:
                o = np.argsort(xs)
                (h,) = ax.plot(np.array(xs)[o], np.array(ys)[o], marker="o", ms=3, **_style(label))
                handles.setdefault(label, h)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("Spearman correlation (scores, sensitivities)")
        ax.set_ylabel("MSE / MSE of RNM")
        ax.set_title(f"Increasing correlation, ε = {e:g}", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    fig.legend(
        [handles[k] for k in handles],
        [_LABEL.get(k, k) for k in handles],
        loc="outside lower center",
        ncols=min(len(handles), 6),
        fontsize=8,
    )
    return fig


def _write_json(rows, path):
    import json

    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")


def write_scenario_outputs(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """Write ``out_dir/selection.json`` (the rows) and the figures (one PNG per scenario group
    present: MSE vs ε, log-x, one line per mechanism; plus ``selection_correlation_relative.png``
    when the increasing-correlation family was run). Everything is rendered in a temporary folder
    next to ``out_dir`` and only then moved in; on failure nothing is left behind (folders this
    call created are removed). Returns the written paths."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} exists and is not a folder", field="--out")
    for r in rows:
        missing = [k for k in ROW_KEYS if k not in r]
        if missing:
            raise ConfigError(f"row lacks {missing}", field="rows")
    # create missing parents, remembering them so a failure can remove them again
    created: list[Path] = []
    p = out_dir.resolve().parent
    while not p.exists():
        created.append(p)
        p = p.parent
    for d in reversed(created):
        d.mkdir()
    tmp = None
    moved: list[Path] = []
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.resolve().parent))
        files: list[str] = []
        _write_json(rows, tmp / "selection.json")
        files.append("selection.json")
        cells = _by_cell(rows)
        for grp in GROUPS:
            names = [s for s in SCENARIOS if s in cells and SCENARIOS[s].group == grp]
            if names:
                fig = _plot_group(cells, names, GROUP_TITLES[grp])
                fig.savefig(tmp / f"selection_{grp}.png", format="png", dpi=110)
                files.append(f"selection_{grp}.png")
        others = [s for s in cells if s not in SCENARIOS]
        if others:
            fig = _plot_group(cells, others, "Other scenarios")
            fig.savefig(tmp / "selection_other.png", format="png", dpi=110)
            files.append("selection_other.png")
        corr = [s for s in SCENARIOS if s in cells and SCENARIOS[s].group == "correlation" and "rnm" in cells[s]]
        if len(corr) >= 2:
            fig = _plot_relative(cells, corr)
            fig.savefig(tmp / "selection_correlation_relative.png", format="png", dpi=110)
            files.append("selection_correlation_relative.png")
        out_created = not out_dir.exists()
        out_dir.mkdir(exist_ok=True)
        if out_created:
            created.insert(0, out_dir.resolve())
        for f in files:
            os.replace(tmp / f, out_dir / f)
            moved.append(out_dir / f)
        return moved
    except BaseException:
        for m in moved:  # a failed move half-way: take back what was moved
            try:
                m.unlink()
            except OSError:
                pass
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for d in created:  # deepest first
            try:
                d.rmdir()
            except OSError:
                pass
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------ CLI glue
def add_scenarios_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``fedpriv selection scenarios``."""
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (selection.json and PNG figures)")
    parser.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        default=None,
        metavar="EPS",
        help="privacy budgets (default 0.01 0.02 0.05 0.1 0.2 0.5 1 2 4 8 16; --quick: 0.1 1 8)",
    )
    parser.add_argument(
        "--trials",
        type=int,
        default=None,
        metavar="N",
        help=f"trials (score sets) per scenario (default {DEFAULT_TRIALS}; --quick: {QUICK_TRIALS})",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the scores and of the selection noise (default 0)")
    parser.add_argument("--quick", action="store_true", help=f"few epsilons and {QUICK_TRIALS} trials (a smoke run)")
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=None,
        metavar="NAME",
        help="scenario names or groups (bimodal, realistic, correlation, polarised; default all): "
        + ", ".join(SCENARIOS),
    )
    parser.add_argument(
        "--mechanisms",
        nargs="+",
        default=None,
        metavar="NAME",
        help="mechanisms (default: all, plus cgem-lam0.25 and cgem-lam0.5 on the polarised scenarios)",
    )
    return parser


def _summary(rows: list[dict]) -> str:
    eps_avail = sorted({r["epsilon"] for r in rows})
    chosen = [e for e in SUMMARY_EPSILONS if any(math.isclose(e, a) for a in eps_avail)] or eps_avail[:1]
    labels = list(dict.fromkeys(r["mechanism"] for r in rows))
    scen = list(dict.fromkeys(r["scenario"] for r in rows))
    idx = {(r["scenario"], r["mechanism"], r["epsilon"]): r for r in rows}
    w = max(len(s) for s in scen) + 2
    lines = []
    for e in chosen:
        lines.append(f"MSE at epsilon={e:g} (Spearman = mean per-trial correlation of scores and sensitivities)")
        head = "scenario".ljust(w) + "rho".rjust(6) + "".join(lab.rjust(max(len(lab), 7) + 1) for lab in labels)
        lines.append(head)
        for s in scen:
            rho = next(r["spearman"] for r in rows if r["scenario"] == s)
            line = s.ljust(w) + f"{rho:+.2f}".rjust(6)
            for lab in labels:
                r = next((idx[k] for k in idx if k[0] == s and k[1] == lab and math.isclose(k[2], e)), None)
                line += ("-" if r is None else f"{r['mse']:.4f}").rjust(max(len(lab), 7) + 1)
            lines.append(line)
        lines.append("")
    return "\n".join(lines)


def scenarios_command(args: argparse.Namespace) -> int:
    """Run the scenarios, write the outputs, print a short summary. Bad values raise
    :class:`ConfigError` before anything is computed or written."""
    epsilons = args.epsilons if args.epsilons is not None else (QUICK_EPSILONS if args.quick else DEFAULT_EPSILONS)
    trials = args.trials if args.trials is not None else (QUICK_TRIALS if args.quick else DEFAULT_TRIALS)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a folder", field="--out")
    if not isinstance(args.seed, (int, np.integer)) or isinstance(args.seed, bool) or args.seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {args.seed!r}", field="--seed")
    _check(epsilons, trials, args.scenarios, args.mechanisms)
    t0 = time.perf_counter()
    rows = run_scenarios(
        epsilons,
        trials,
        int(args.seed),
        args.scenarios,
        args.mechanisms,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    paths = write_scenario_outputs(rows, out)
    print(_summary(rows))
    print(
        f"{len(rows)} cells ({trials} trials each) in {time.perf_counter() - t0:.1f} s; wrote "
        + ", ".join(str(p) for p in paths)
    )
    return 0
