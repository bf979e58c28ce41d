"""Two-armed bandit under distribution shift with private selection (paper §IX and Appendix H).

At every step t = 0, ..., T-1 the learner picks one of two arms and observes a clipped reward
r_t = clip(N(loc[a], scale[a]^2), 0, 1); at ``shift_at`` (default T/2) the arms' means and
spreads are swapped (label shift). Each step is one user: the reward is that user's data and the
action is recorded by the server.

Policies
--------
* ``ucb`` (non-private): predicted score mean_i + c * sqrt(ln t / n_i); each arm is pulled once
  first. The default experiment runs it with c = sqrt(2) and with c = 0.1 (below).
* ``thompson`` (non-private): Beta-Bernoulli Thompson sampling on [0, 1] rewards (the reward is
  turned into a Bernoulli(r) success, Agrawal and Goyal 2012), Beta(1, 1) prior.
* private: ``rnm``, ``em``, ``krr``, ``gem``, ``mgem``, ``rs`` — the action of step t is
  ``ledger.select(mechanism, predicted means, estimated sensitivities, epsilon=eps_select)``
  (one row per repetition; the row of step t is user t's own selection, accounted once per
  user). Predicted means are the private prefix sums of each arm's rewards from a
  :class:`HybridCounter` divided by the arm's count (the counts are functions of the private
  actions, so only the sums are noised), clipped to [0, 1]; 0.5 before an arm's first pull.
  Per-arm sensitivities: q90 - q10 of the arm's last ``window`` rewards, both quantiles by the
  exponential mechanism over a public grid (:func:`private_quantile`), refreshed each time
  ``window`` new rewards of the arm have arrived (windows are disjoint: each reward is used in
  one estimation). kRR ignores the sensitivities (eps_quantile is not spent; the paper sets it
  to 0 for kRR; it is given sensitivities 1) and RNM / EM use their maximum.

Every private draw goes through one :class:`~fedpriv.privacy.ledger.PrivacyLedger` per
simulation (the repetitions are independent worlds: their users are distinct, so one ledger
over all of them accounts one user's guarantee); the reported epsilons are
:func:`fedpriv.privacy.accounting.epsilon_bounds` of its records (of the records of one
component for the per-component numbers). Non-private baselines and the synthetic rewards use
plain generators (the rewards inside ``public_draws``).

What the paper says vs what is chosen here
------------------------------------------
(the numbers of Appendix H were lost in the text conversion; the prose is intact)

* Environment. Paper: two arms, clipped rewards, means and variances swapped at T/2; "both
  before and after the distribution shift, the scores and candidate sensitivities have positive
  correlation"; UCB keeps choosing arm 1 after the shift, so arm 1 is the better arm before it.
  Chosen: rewards clipped to [0, 1]; before the shift loc = (0.3, 0.7), scale = (0.1, 0.3) (arm
  1 better and more spread), after it loc = (0.7, 0.3), scale = (0.3, 0.1). Clipped means
  0.3000 / 0.6760 (gap 0.376); true 10-90 spreads 0.256 / 0.684. (A smaller gap, loc = (0.4,
  0.6), was tried first: same ordering of the policies, but RNM, RS and kRR are then close to
  uniform at eps = 1 per action.)
* UCB. Paper: c "commonly set to sqrt(2)"; UCB "keeps picking action 1 for all time steps" after
  the shift. Found here: with c = sqrt(2) on [0, 1] rewards UCB does NOT get stuck — UCB keeps
  the optimistic index of the neglected arm level with the best arm's, so as soon as arm 1
  degrades arm 0 is tried and its few-sample mean moves fast (it adapts within a few hundred
  steps; a sweep over gaps 0.1 - 0.8 and spreads gave the same). Only a low-optimism UCB gets
  stuck, e.g. c = 0.1, which is c = sqrt(2) on rewards whose range is ~14 times the one the
  bonus assumes (our reading of the paper's observation: its rewards were not on the scale of
  its constant). Both are reported (``ucb_c``, default (sqrt 2, 0.1)); the private mechanisms
  are invariant to the reward scale, UCB is not.
* Horizon. Paper: not recovered. Chosen T = 5000, shift at 2500, 20 repetitions (common random
  rewards across policies: every policy sees the same reward draws for a given seed).
* Privacy of the means. Paper: tree-based counting (Dwork et al. 2010), per arm, conditioned on
  the private actions, hybrid mechanism (Chan, Shi and Song 2010) because the final count of an
  arm is unknown; the released sequences are eps-DP. Chosen: eps_mean = 1 split as in Chan et
  al.: eps/2 to the logarithmic mechanism (the noisy totals of the epochs [2^k, 2^{k+1})) and
  eps/2 to the binary mechanisms inside the epochs, spread evenly over the L binary levels that
  a stream of at most T values can reach (L = 11 for T = 5000; ``horizon=None`` instead gives
  level l the share 6 / (pi^2 (l+1)^2), valid for any length). The noise of a level does not
  depend on the epoch, so one ledger name per level (``disjoint=True``: nodes of one level cover
  disjoint intervals, arms and repetitions are distinct users) charges each reward once per
  level; the accountant then gives at most eps_mean (exactly eps_mean once every level has
  been used). The paper's variant (per-epoch binary trees, depth growing with the epoch) has
  the same guarantee, but its per-level noise would differ between epochs, which the ledger
  could not account as one record per level.
* Sensitivities. Paper: q10 and q90 of the last W rewards of the arm by the exponential
  mechanism, each reward used once, the pair eps_q-DP, "paid twice, once for each action".
  Chosen: eps_quantile = 1 for the pair (eps_q / 2 per quantile), W = 100, grid 0, 0.01, ..., 1,
  score |#{obs <= x} - p W| (sensitivity 1, not monotone); sensitivity floor 0.01 (one grid
  step); before an arm's first window fills its sensitivity is 1 (the range of the rewards).
  A reward enters one window of one arm only, so the ledger (parallel composition) charges the
  pair once, eps_q, where the paper conservatively counts 2 eps_q.
* Selection. Paper: eps per action (value lost); kRR spends nothing on quantiles. Chosen:
  eps_select = 1 per action; mechanism hyper-parameters (GEM / mGEM beta = 0.1 with the
  exponential-noise selector, RS eta = 1 and gamma = 1/k) are
  :data:`fedpriv.privacy.selection.DEFAULTS`.
* Regret: pseudo-regret sum_t (max_i m_i(t) - m_{a_t}(t)) with m the clipped means; mean and
  standard deviation over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ...util import atomic
from ...errors import ConfigError
from ...privacy.ledger import PrivacyLedger, public_draws

NONPRIVATE = ("ucb", "thompson")
PRIVATE = ("rnm", "em", "krr", "gem", "mgem", "rs")
POLICIES = NONPRIVATE + PRIVATE
DEFAULT_POLICIES = ("ucb", "thompson", "rnm", "krr", "gem", "mgem", "rs")
# private policies whose selection needs per-arm sensitivities (RNM/EM use their maximum)
NEEDS_SENSITIVITIES = ("rnm", "em", "gem", "mgem", "rs")

DEFAULTS = {
    "horizon": 5000,
    "reps": 20,
    "seed": 0,
    "eps_select": 1.0,
    "eps_mean": 1.0,
    "eps_quantile": 1.0,
    "window": 100,
    "ucb_c": math.sqrt(2.0),
    "delta": 1e-6,
}
# UCB rows of the default experiment: the textbook constant, and a low-optimism UCB (equivalently
# c = sqrt(2) on rewards spanning a range ~14 times wider than the one the bonus assumes)
DEFAULT_UCB_C = (math.sqrt(2.0), 0.1)
QUICK = {"horizon": 1000, "reps": 6}
QUANTILE_GRID = np.linspace(0.0, 1.0, 101)
SENSITIVITY_FLOOR = 0.01
MEAN_PREFIX = "bandit/mean/"
QUANTILE_PREFIX = "bandit/quantile/"
ACTION_NAME = "bandit/action"


# ---------------------------------------------------------------------- environment
@dataclass(frozen=True)
class Environment:
    """Two arms with clipped Gaussian rewards; (loc, scale) of the arms swap at the shift."""

    loc: tuple[float, float] = (0.3, 0.7)
    scale: tuple[float, float] = (0.1, 0.3)

    def params(self, after_shift: bool) -> tuple[np.ndarray, np.ndarray]:
        loc, scale = np.asarray(self.loc, float), np.asarray(self.scale, float)
        return (loc[::-1], scale[::-1]) if after_shift else (loc, scale)

    def clipped_means(self, after_shift: bool) -> np.ndarray:
        """E[clip(X, 0, 1)], X ~ N(loc, scale^2): g(loc) - g(loc - 1), g(m) = m Phi(m/s) + s phi(m/s)."""
        loc, scale = self.params(after_shift)

        def g(m: float, s: float) -> float:
            z = m / s
            return m * 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))) + s * math.exp(-0.5 * z * z) / math.sqrt(
                2.0 * math.pi
            )

        return np.array([g(m, s) - g(m - 1.0, s) for m, s in zip(loc, scale)])

    def spreads(self, after_shift: bool, lo: float = 0.1, hi: float = 0.9) -> np.ndarray:
        """True q_hi - q_lo of the clipped rewards (quantiles commute with clipping)."""
        from scipy.stats import norm

        loc, scale = self.params(after_shift)
        return np.clip(norm.ppf(hi, loc, scale), 0, 1) - np.clip(norm.ppf(lo, loc, scale), 0, 1)

    def draw(self, T: int, shift_at: int, reps: int, seed: int) -> np.ndarray:
        """Rewards of both arms for every step and repetition, shape (T, reps, 2): synthetic data,
        drawn from a public generator (the same for every policy with this seed)."""
        rng = np.random.default_rng([int(seed), 0xBA4D17])
        out = np.empty((T, reps, 2))
        with public_draws("bandit: synthetic rewards"):
            for after, sl in ((False, slice(0, shift_at)), (True, slice(shift_at, T))):
                loc, scale = self.params(after)
                n = len(range(T)[sl])
                out[sl] = rng.normal(loc, scale, size=(n, reps, 2))
        return np.clip(out, 0.0, 1.0)


# ---------------------------------------------------------------------- private continual counting
class HybridCounter:
    """Private prefix sums of ``n_streams`` independent streams of values in [0, sensitivity],
    each of unknown length (hybrid mechanism of Chan, Shi and Song 2010 over binary trees of
    Dwork et al. 2010).

    Positions are 1-based; epoch k holds the positions [2^k, 2^{k+1}). When an epoch is complete
    its total is released with Laplace(sensitivity / eps_log) (the logarithmic mechanism, ledger
    name ``PREFIX + 'log'``); inside the current epoch a binary mechanism releases each dyadic
    block of length 2^l (l < k) when it completes, with Laplace(sensitivity / eps_l) (name
    ``PREFIX + 'level<l>'``). The estimate at position p sums the epoch totals released so far
    and the blocks of the binary decomposition of the position inside the current epoch. Each
    value lies in one epoch total and in at most one block per level, and blocks of one level are
    disjoint; hence every ledger name is recorded with ``disjoint=True`` and the accountant
    charges eps_log + sum_l eps_l <= epsilon.

    ``horizon``: an upper bound H on every stream's length (public). Level l first closes a block
    inside an epoch at position 3 * 2^l - 1, so L = floor(log2((H + 1) / 3)) + 1 levels are
    reachable and each gets eps_l = (epsilon / 2) / L (H = 1: no level, eps_log = epsilon).
    ``None``: unbounded, eps_l = (epsilon / 2) * 6 / (pi^2 (l + 1)^2). Streams advance independently
    (``push`` with a mask); the releases of one level at one call are made as one vector release over
    all streams (entries of streams not closing a block are 0 and discarded), of L1 sensitivity
    ``sensitivity`` because a user's value lies in one stream only.
    """

    MAX_LEVELS = 62

    def __init__(
        self,
        ledger: PrivacyLedger,
        n_streams: int,
        epsilon: float,
        *,
        horizon: int | None = None,
        sensitivity: float = 1.0,
        prefix: str = MEAN_PREFIX,
    ):
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ConfigError(f"must be a finite positive number, got {epsilon}", field="eps_mean")
        if horizon is not None and horizon < 1:
            raise ConfigError(f"must be >= 1, got {horizon}", field="horizon")
        self.ledger = ledger
        self.S = int(n_streams)
        self.epsilon = float(epsilon)
        self.horizon = horizon
        self.sensitivity = float(sensitivity)
        self.prefix = prefix
        # level l first closes a block inside an epoch at position 3 * 2^l - 1
        self.levels = None if horizon is None else ((int(horizon) + 1) // 3).bit_length()
        self.eps_log = self.epsilon if self.levels == 0 else self.epsilon / 2.0
        self.counts = np.zeros(self.S, dtype=np.int64)
        self.log_total = np.zeros(self.S)  # sum of the noisy totals of the completed epochs
        self.alpha = np.zeros((self.S, self.MAX_LEVELS))  # true sums of the open / last closed blocks
        self.alpha_hat = np.zeros((self.S, self.MAX_LEVELS))  # noisy blocks of the current decomposition

    def level_epsilon(self, level: int) -> float:
        if self.levels is not None:
            if level >= self.levels:
                raise ConfigError(f"a stream grew past the declared horizon {self.horizon}", field="horizon")
            return (self.epsilon / 2.0) / self.levels
        return (self.epsilon / 2.0) * 6.0 / (math.pi**2 * (level + 1) ** 2)

    def push(self, mask: np.ndarray, values: np.ndarray) -> None:
        """Append ``values[s]`` to every stream s with ``mask[s]`` (values of other streams are ignored)."""
        idx = np.flatnonzero(mask)
        if len(idx) == 0:
            return
        x = np.asarray(values, dtype=np.float64)[idx]
        if np.any(x < 0) or np.any(x > self.sensitivity):
            raise ValueError(f"stream values must lie in [0, {self.sensitivity}]")
        if self.horizon is not None and np.any(self.counts[idx] >= self.horizon):
            raise ConfigError(f"a stream would grow past the declared horizon {self.horizon}", field="horizon")
        self.counts[idx] += 1
        p = self.counts[idx]
        k = np.floor(np.log2(p)).astype(np.int64)  # epoch
        k = k - (np.left_shift(np.int64(1), k) > p) + (np.left_shift(np.int64(1), k + 1) <= p)  # guard float rounding
        tau = p - np.left_shift(np.int64(1), k) + 1  # 1-based position inside the epoch
        low = np.log2(tau & -tau).round().astype(np.int64)  # level of the block closing now
        # true sum of the closing block: the blocks below it plus the new value
        cols = np.arange(self.MAX_LEVELS)
        below = cols[None, :] < low[:, None]
        block = np.where(below, self.alpha[idx], 0.0).sum(axis=1) + x
        epoch_end = low == k
        # logarithmic mechanism: epoch totals
        if np.any(epoch_end):
            e = idx[epoch_end]
            val = np.zeros(self.S)
            val[e] = block[epoch_end]
            noisy = self.ledger.laplace(
                self.prefix + "log", val, sensitivity=self.sensitivity, epsilon=self.eps_log, disjoint=True
            )
            self.log_total[e] += noisy[e]
            self.alpha[e] = 0.0
            self.alpha_hat[e] = 0.0
        # binary mechanism inside the epochs
        inner = ~epoch_end
        for level in np.unique(low[inner]):
            sel = inner & (low == level)
            s = idx[sel]
            val = np.zeros(self.S)
            val[s] = block[sel]
            noisy = self.ledger.laplace(
                f"{self.prefix}level{int(level)}",
                val,
                sensitivity=self.sensitivity,
                epsilon=self.level_epsilon(int(level)),
                disjoint=True,
            )
            self.alpha[s, :level] = 0.0
            self.alpha_hat[s, :level] = 0.0
            self.alpha[s, level] = block[sel]
            self.alpha_hat[s, level] = noisy[s]

    def estimates(self) -> np.ndarray:
        """Noisy prefix sums of every stream at its current length (0 for empty streams)."""
        return self.log_total + self.alpha_hat.sum(axis=1)

    def noise_variance(self, position: int) -> float:
        """Variance of the estimate's noise at a (1-based) position: 2 b^2 per Laplace(b) term."""
        if position < 1:
            return 0.0
        k = position.bit_length() - 1
        tau = position - (1 << k) + 1
        if tau == (1 << k):
            k, tau = k + 1, 0  # the epoch is complete: k + 1 epoch totals, no open block
        var = k * 2.0 * (self.sensitivity / self.eps_log) ** 2
        for level in range(k):
            if (tau >> level) & 1:
                var += 2.0 * (self.sensitivity / self.level_epsilon(level)) ** 2
        return var


# ---------------------------------------------------------------------- private quantiles
def private_quantile(
    ledger: PrivacyLedger,
    name: str,
    observations: np.ndarray,
    p: float,
    epsilon: float,
    grid: np.ndarray = QUANTILE_GRID,
) -> float:
    """The p-quantile of ``observations`` (a window of n values; n public) by the exponential
    mechanism over the public ``grid``: candidate x has score |#{obs <= x} - p n| (lower is
    better, sensitivity 1 when one observation is replaced). Disjoint windows: ``disjoint=True``."""
    obs = np.sort(np.asarray(observations, dtype=np.float64))
    scores = np.abs(np.searchsorted(obs, grid, side="right") - p * len(obs))
    return float(grid[ledger.exponential(name, scores, epsilon=epsilon, sensitivity=1.0, disjoint=True)])


# ---------------------------------------------------------------------- simulation
def _validate(
    policy: str, T: int, shift_at: int, reps: int, eps_select: float, eps_mean: float, eps_quantile: float, window: int
) -> None:
    if policy not in POLICIES:
        raise ConfigError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})", field="policies")
    if not (isinstance(T, (int, np.integer)) and T >= 2):
        raise ConfigError(f"must be an integer >= 2, got {T!r}", field="horizon")
    if not (isinstance(shift_at, (int, np.integer)) and 0 <= shift_at <= T):
        raise ConfigError(f"must be an integer in [0, horizon], got {shift_at!r}", field="shift_at")
    if not (isinstance(reps, (int, np.integer)) and reps >= 1):
        raise ConfigError(f"must be an integer >= 1, got {reps!r}", field="reps")
    for field, v in (("eps_select", eps_select), ("eps_mean", eps_mean), ("eps_quantile", eps_quantile)):
        if not (isinstance(v, (int, float, np.floating)) and math.isfinite(v) and v > 0):
            raise ConfigError(f"must be a finite positive number, got {v!r}", field=field)
    if not (isinstance(window, (int, np.integer)) and window >= 2):
        raise ConfigError(f"must be an integer >= 2, got {window!r}", field="window")


def _ledger_seed(seed: int, policy: str) -> int:
    return int(
        np.random.SeedSequence([int(seed), POLICIES.index(policy), 0x1ED6E2]).generate_state(1, dtype=np.uint64)[0]
    )


def _release_epsilons(ledger: PrivacyLedger, delta: float) -> dict:
    from ...privacy.accounting import epsilon_bounds

    def eps(pred) -> float | None:
        rels = [r for r in ledger.releases if pred(r.name)]
        return epsilon_bounds(rels, delta)[0] if rels else None

    total, rdp, pure = epsilon_bounds(ledger, delta) if ledger.releases else (None, None, None)
    return {
        "epsilon_per_action": eps(lambda n: n == ACTION_NAME),
        "epsilon_means": eps(lambda n: n.startswith(MEAN_PREFIX)),
        "epsilon_quantiles": eps(lambda n: n.startswith(QUANTILE_PREFIX)),
        "epsilon_total": total,
        "epsilon_total_rdp": rdp,
        "epsilon_total_pure": pure,
        "delta": delta,
    }


def simulate_bandit(
    policy: str,
    T: int = DEFAULTS["horizon"],
    shift_at: int | None = None,
    reps: int = DEFAULTS["reps"],
    seed: int = DEFAULTS["seed"],
    eps_select: float = DEFAULTS["eps_select"],
    eps_mean: float = DEFAULTS["eps_mean"],
    eps_quantile: float = DEFAULTS["eps_quantile"],
    window: int = DEFAULTS["window"],
    *,
    env: Environment | None = None,
    ucb_c: float = DEFAULTS["ucb_c"],
    delta: float = DEFAULTS["delta"],
    mechanism_params: dict | None = None,
    return_ledger: bool = False,
) -> dict:
    """Run ``reps`` independent repetitions of the bandit with one policy (vectorised over the
    repetitions). Returns the cumulative regret curve (mean, std over repetitions; index t = after
    t + 1 steps), the final regret, the regret at the shift, the share of post-shift pulls of arm
    1 (the pre-shift best arm) and, for private policies, the ledger epsilons."""
    shift_at = T // 2 if shift_at is None else shift_at
    _validate(policy, T, shift_at, reps, eps_select, eps_mean, eps_quantile, window)
    env = env or Environment()
    rewards = env.draw(T, shift_at, reps, seed)
    means = np.stack([env.clipped_means(False), env.clipped_means(True)])  # (2 phases, 2 arms)
    best = means.max(axis=1)
    actions = np.empty((T, reps), dtype=np.int64)
    ledger = None
    rows = np.arange(reps)
    if policy == "ucb":
        sums = np.zeros((reps, 2))
        n = np.zeros((reps, 2))
        for t in range(T):
            if t < 2:
                a = np.full(reps, t, dtype=np.int64)
            else:
                ucb = sums / n + ucb_c * np.sqrt(math.log(t) / n)
                a = np.argmax(ucb, axis=1)
            actions[t] = a
            sums[rows, a] += rewards[t, rows, a]
            n[rows, a] += 1
    elif policy == "thompson":
        rng = np.random.default_rng([int(seed), POLICIES.index(policy), 0x7505])
        succ = np.zeros((reps, 2))
        fail = np.zeros((reps, 2))
        for t in range(T):
            a = np.argmax(rng.beta(1.0 + succ, 1.0 + fail), axis=1)
            actions[t] = a
            hit = rng.random(reps) < rewards[t, rows, a]
            succ[rows, a] += hit
            fail[rows, a] += ~hit
    else:
        ledger = PrivacyLedger(seed=_ledger_seed(seed, policy))
        actions = _run_private(
            policy, rewards, ledger, eps_select, eps_mean, eps_quantile, window, mechanism_params or {}
        )
    phase = (np.arange(T) >= shift_at).astype(np.int64)
    inst = best[phase][:, None] - means[phase[:, None], actions]  # (T, reps)
    cum = np.cumsum(inst, axis=0)
    final = cum[-1]
    at_shift = cum[shift_at - 1] if shift_at > 0 else np.zeros(reps)
    post = final - at_shift
    out = {
        "policy": policy,
        "private": policy in PRIVATE,
        "horizon": T,
        "shift_at": shift_at,
        "reps": reps,
        "seed": seed,
        "regret_mean": cum.mean(axis=1),
        "regret_std": cum.std(axis=1),
        "final_regret_mean": float(final.mean()),
        "final_regret_std": float(final.std()),
        "regret_at_shift_mean": float(at_shift.mean()),
        "regret_at_shift_std": float(at_shift.std()),
        "post_shift_regret_mean": float(post.mean()),
        "post_shift_regret_std": float(post.std()),
        "pre_shift_arm1_share": float((actions[:shift_at] == 1).mean()) if shift_at > 0 else None,
        "post_shift_arm1_share": float((actions[shift_at:] == 1).mean()) if shift_at < T else None,
        "actions": actions,
    }
    if policy in PRIVATE:
        out.update(
            eps_select=eps_select,
            eps_mean=eps_mean,
            eps_quantile=eps_quantile if policy in NEEDS_SENSITIVITIES else 0.0,
            window=window,
        )
        out.update(_release_epsilons(ledger, delta))
    if return_ledger:
        out["ledger"] = ledger
    return out


def _run_private(
    policy: str,
    rewards: np.ndarray,
    ledger: PrivacyLedger,
    eps_select: float,
    eps_mean: float,
    eps_quantile: float,
    window: int,
    mechanism_params: dict,
) -> np.ndarray:
    T, reps, k = rewards.shape
    rows = np.arange(reps)
    counter = HybridCounter(ledger, reps * k, eps_mean, horizon=T)
    n = np.zeros((reps, k), dtype=np.int64)
    sens = np.ones((reps, k))  # before an arm's first window: the range of the rewards
    use_sens = policy in NEEDS_SENSITIVITIES
    buf = np.zeros((reps, k, window))
    fill = np.zeros((reps, k), dtype=np.int64)
    actions = np.empty((T, reps), dtype=np.int64)
    for t in range(T):
        sums = counter.estimates().reshape(reps, k)
        scores = np.where(n > 0, np.clip(sums / np.maximum(n, 1), 0.0, 1.0), 0.5)
        a = np.asarray(
            ledger.select(ACTION_NAME, policy, scores, sens, epsilon=eps_select, **mechanism_params), dtype=np.int64
        )
        actions[t] = a
        r = rewards[t, rows, a]
        mask = np.zeros((reps, k), dtype=bool)
        mask[rows, a] = True
        vals = np.zeros((reps, k))
        vals[rows, a] = r
        counter.push(mask.ravel(), vals.ravel())
        n[rows, a] += 1
        if use_sens:
            buf[rows, a, fill[rows, a]] = r
            fill[rows, a] += 1
            for i in np.flatnonzero(fill[rows, a] == window):
                arm = a[i]
                w = buf[i, arm]
                q10 = private_quantile(ledger, QUANTILE_PREFIX + "p10", w, 0.1, eps_quantile / 2.0)
                q90 = private_quantile(ledger, QUANTILE_PREFIX + "p90", w, 0.9, eps_quantile / 2.0)
                sens[i, arm] = max(q90 - q10, SENSITIVITY_FLOOR)
                fill[i, arm] = 0
    return actions


# ---------------------------------------------------------------------- experiment, outputs, CLI
def _plot(results: list[dict], path: Path, shift_at: int, title: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(8.5, 5.2))
    ax = fig.subplots()
    for res in results:
        t = np.arange(1, len(res["regret_mean"]) + 1)
        m, s = res["regret_mean"], res["regret_std"]
        style = "-" if res["private"] else "--"
        (line,) = ax.plot(t, m, style, label=res.get("label", res["policy"]), lw=1.6)
        ax.fill_between(t, m - s, m + s, color=line.get_color(), alpha=0.12, lw=0)
    ax.axvline(shift_at, color="k", ls=":", lw=1.2, label=f"shift (t={shift_at})")
    ax.set_xlabel("step t")
    ax.set_ylabel("cumulative pseudo-regret (mean ± std over repetitions)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic.write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def _ucb_label(c: float) -> str:
    return f"ucb(c={c:.3g})"


def _check_ucb_c(values) -> list[float]:
    vals = [values] if isinstance(values, (int, float, np.floating)) else list(values)
    if not vals:
        raise ConfigError("give at least one UCB constant", field="ucb_c")
    for c in vals:
        if isinstance(c, bool) or not isinstance(c, (int, float, np.floating)) or not (math.isfinite(c) and c >= 0):
            raise ConfigError(f"must be finite numbers >= 0, got {c!r}", field="ucb_c")
    return [float(c) for c in dict.fromkeys(vals)]


def run_bandit(
    out_dir: str | os.PathLike,
    policies: Sequence[str] = DEFAULT_POLICIES,
    T: int = DEFAULTS["horizon"],
    reps: int = DEFAULTS["reps"],
    seed: int = DEFAULTS["seed"],
    eps_select: float = DEFAULTS["eps_select"],
    eps_mean: float = DEFAULTS["eps_mean"],
    eps_quantile: float = DEFAULTS["eps_quantile"],
    window: int = DEFAULTS["window"],
    *,
    shift_at: int | None = None,
    ucb_c: float | Sequence[float] = DEFAULT_UCB_C,
    delta: float = DEFAULTS["delta"],
    curve_points: int = 200,
) -> dict:
    """Simulate every policy and write ``out_dir/bandit.json`` and ``out_dir/bandit.png``
    (each written to a temporary file first, then renamed). ``ucb`` is run once per constant in
    ``ucb_c`` (rows labelled ``ucb(c=...)``); other rows are labelled by the policy name."""
    policies = list(dict.fromkeys(policies))
    if not policies:
        raise ConfigError("no policy given", field="policies")
    shift_at = T // 2 if shift_at is None else shift_at
    for p in policies:
        _validate(p, T, shift_at, reps, eps_select, eps_mean, eps_quantile, window)
    ucb_cs = _check_ucb_c(ucb_c)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a directory", field="out")
    runs = [(p, _ucb_label(c) if p == "ucb" else p, c) for p in policies for c in (ucb_cs if p == "ucb" else [None])]
    env = Environment()
    results, rows = [], []
    t0 = time.perf_counter()
    for p, label, c in runs:
        t1 = time.perf_counter()
        kw = {"ucb_c": c} if c is not None else {}
        res = simulate_bandit(
            p, T, shift_at, reps, seed, eps_select, eps_mean, eps_quantile, window, env=env, delta=delta, **kw
        )
        res["seconds"] = time.perf_counter() - t1
        res["label"] = label
        results.append(res)
        row = {"label": label, "ucb_c": c}
        row.update(
            {
                k: res[k]
                for k in (
                    "policy",
                    "private",
                    "final_regret_mean",
                    "final_regret_std",
                    "regret_at_shift_mean",
                    "regret_at_shift_std",
                    "post_shift_regret_mean",
                    "post_shift_regret_std",
                    "pre_shift_arm1_share",
                    "post_shift_arm1_share",
                )
            }
        )
        for key in ("epsilon_per_action", "epsilon_means", "epsilon_quantiles", "epsilon_total"):
            row[key] = res.get(key)
        row["seconds"] = round(res["seconds"], 3)
        rows.append(row)
    idx = np.unique(np.linspace(0, T - 1, min(curve_points, T)).round().astype(int))
    private_rows = [r for r in rows if r["private"]]
    summary = {
        "best": min(rows, key=lambda r: r["final_regret_mean"])["label"],
        "best_private": min(private_rows, key=lambda r: r["final_regret_mean"])["label"] if private_rows else None,
        "best_private_after_shift": min(private_rows, key=lambda r: r["post_shift_regret_mean"])["label"]
        if private_rows
        else None,
        "private_beating_ucb_after_shift": {
            r["label"]: [q["label"] for q in private_rows if q["post_shift_regret_mean"] < r["post_shift_regret_mean"]]
            for r in rows
            if r["policy"] == "ucb"
        },
    }
    before, after = env.params(False), env.params(True)
    doc = {
        "experiment": "two-armed bandit, the arms' means and variances swapped at the shift "
        "(Antonova et al. 2025, Sec. IX / App. H); fedpriv.studies.selection.bandit",
        "config": {
            "horizon": T,
            "shift_at": shift_at,
            "reps": reps,
            "seed": seed,
            "policies": policies,
            "ucb_c": ucb_cs,
            "eps_select": eps_select,
            "eps_mean": eps_mean,
            "eps_quantile": eps_quantile,
            "window": window,
            "delta": delta,
            "quantile_grid": {"lo": 0.0, "hi": 1.0, "points": len(QUANTILE_GRID)},
            "sensitivity_floor": SENSITIVITY_FLOOR,
            "mechanism_params": {p: _mech_defaults(p) for p in policies if p in PRIVATE},
            "environment": {
                "before_shift": {
                    "loc": before[0].tolist(),
                    "scale": before[1].tolist(),
                    "clipped_mean": env.clipped_means(False).tolist(),
                    "spread_10_90": env.spreads(False).tolist(),
                },
                "after_shift": {
                    "loc": after[0].tolist(),
                    "scale": after[1].tolist(),
                    "clipped_mean": env.clipped_means(True).tolist(),
                    "spread_10_90": env.spreads(True).tolist(),
                },
            },
        },
        "rows": rows,
        "summary": summary,
        "curves": {
            "t": (idx + 1).tolist(),
            **{
                r["label"]: {
                    "mean": r["regret_mean"][idx].round(4).tolist(),
                    "std": r["regret_std"][idx].round(4).tolist(),
                }
                for r in results
            },
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }
    out.mkdir(parents=True, exist_ok=True)
    title = (
        f"Two-armed bandit, arms swap at t={shift_at} ({reps} reps)\n"
        f"eps per action {eps_select:g}, eps means {eps_mean:g}, eps quantile pair {eps_quantile:g}, W={window}"
    )
    _plot(results, out / "bandit.png", shift_at, title)
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    atomic.write_text(out / "bandit.json", text)
    return doc


def _mech_defaults(policy: str) -> dict:
    from ...privacy import selection as mechanisms

    return dict(mechanisms.DEFAULTS.get(policy, {}))


def _parse_policies(values: Sequence[str] | None) -> list[str]:
    if values is None:
        return list(DEFAULT_POLICIES)
    names = [v.strip().lower() for item in values for v in str(item).split(",") if v.strip()]
    if not names:
        raise ConfigError("no policy given", field="policies")
    if names == ["all"]:
        return list(POLICIES)
    for p in names:
        if p not in POLICIES:
            raise ConfigError(f"unknown policy {p!r} (known: {', '.join(POLICIES)}, or all)", field="policies")
    return names


def add_bandit_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fedpriv selection bandit``."""
    parser.add_argument("--out", required=True, help="output folder for bandit.json and bandit.png")
    parser.add_argument(
        "--horizon",
        type=int,
        default=None,
        help=f"number of steps T (default {DEFAULTS['horizon']}; --quick {QUICK['horizon']}); the arms swap at T/2",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        help=f"independent repetitions (default {DEFAULTS['reps']}; --quick {QUICK['reps']})",
    )
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument(
        "--quick", action="store_true", help=f"T={QUICK['horizon']}, {QUICK['reps']} repetitions (a few seconds)"
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        default=None,
        metavar="P",
        help=f"comma- or space-separated, from {', '.join(POLICIES)} or 'all' (default: {','.join(DEFAULT_POLICIES)})",
    )
    parser.add_argument(
        "--eps-select", type=float, default=DEFAULTS["eps_select"], help="epsilon of each private action"
    )
    parser.add_argument(
        "--eps-mean",
        type=float,
        default=DEFAULTS["eps_mean"],
        help="epsilon of the released mean sequences (hybrid counter)",
    )
    parser.add_argument(
        "--eps-quantile",
        type=float,
        default=DEFAULTS["eps_quantile"],
        help="epsilon of each (q10, q90) pair of a window",
    )
    parser.add_argument("--window", type=int, default=DEFAULTS["window"], help="rewards per sensitivity window W")
    parser.add_argument(
        "--ucb-c",
        type=float,
        nargs="+",
        default=None,
        metavar="C",
        help=f"UCB optimism constant(s), one row each (default {' '.join(f'{c:.4g}' for c in DEFAULT_UCB_C)})",
    )


def bandit_command(args: argparse.Namespace) -> int:
    """Run the experiment of :func:`add_arguments`'s arguments; bad values raise ConfigError."""
    T = args.horizon if args.horizon is not None else (QUICK["horizon"] if args.quick else DEFAULTS["horizon"])
    reps = args.reps if args.reps is not None else (QUICK["reps"] if args.quick else DEFAULTS["reps"])
    if T < 2:
        raise ConfigError(f"must be >= 2, got {T}", field="horizon")
    if reps < 1:
        raise ConfigError(f"must be >= 1, got {reps}", field="reps")
    if args.seed < 0:
        raise ConfigError(f"must be >= 0, got {args.seed}", field="seed")
    policies = _parse_policies(args.policies)
    ucb_c = DEFAULT_UCB_C if getattr(args, "ucb_c", None) is None else args.ucb_c
    doc = run_bandit(
        args.out,
        policies,
        T,
        reps,
        args.seed,
        args.eps_select,
        args.eps_mean,
        args.eps_quantile,
        args.window,
        ucb_c=ucb_c,
    )

    def fmt(v) -> str:
        return "-" if v is None else f"{v:.3f}"

    print(
        f"{'policy':<13} {'final regret':>16} {'at shift':>9} {'after shift':>12} {'arm 1 after':>11} "
        f"{'eps/action':>10} {'eps means':>9} {'eps quant':>9}"
    )
    for r in doc["rows"]:
        print(
            f"{r['label']:<13} {r['final_regret_mean']:>8.1f} ± {r['final_regret_std']:<5.1f} "
            f"{r['regret_at_shift_mean']:>9.1f} "
            f"{r['post_shift_regret_mean']:>12.1f} {r['post_shift_arm1_share']:>11.2f} "
            f"{fmt(r['epsilon_per_action']):>10} {fmt(r['epsilon_means']):>9} {fmt(r['epsilon_quantiles']):>9}"
        )
    print(f"wrote {Path(args.out) / 'bandit.json'} and {Path(args.out) / 'bandit.png'} ({doc['seconds']:.1f} s)")
    return 0
