"""Noise-aware defaults for the ALS family: the rule that picks rank, steps, ridges and budget
shares of a private run from what costs no privacy: epsilon, delta, the algorithm, the number
of items and the privately released number of users.

The rule runs on the server right after the user count is released (``defaults =
"noise-aware"``, the ALS family's default); the keys set explicitly (``cfg.given``) are left
alone. The rest of the plan is then calibrated with the count's release pinned at the
multiplier it was made with, so the whole run spends exactly the target epsilon. Every plan
the rule can choose is made of unsampled Gaussian releases, whose composed RDP is
``alpha * R`` with one R fixed by (epsilon, delta): each choice spends the same RDP curve, so
choosing after seeing the (noised) count is post-processing followed by a fixed budget.

The rule, fitted on ML-100K, ml-latest-small and the synthetic generators (docs/explanations/noise-aware-defaults.md,
"Noise-aware
defaults"): a factor model only pays for its noise when the per-item signal is large against
it. The statistic is

    snr = n_users * sqrt(rho) / sqrt(n_items)

with rho the zCDP budget of (epsilon, delta) (epsilon = rho + 2 sqrt(rho log(1/delta))). Below
``FACTOR_SNR`` the run is the private bias model alone (rank 0, no steps: the bias stage takes
the whole budget), with a ridge of 3 noise standard deviations and residuals clipped to +-0.5
while snr < 5, to +-1 from there, a ridge of 1 from snr 15, and a clip of +-2 from snr 45 (the ``bias`` algorithm
follows
the same rule for its own ridge and clip); above it, the bias stage keeps ``share_bias`` of the budget and two factor
steps fit the residual with a noise-aware ridge, the items the stage saw too little of keeping
no factors (``factor_floor``); above ``RICH_SNR`` with rank 8 and a lighter ridge.
"""

from __future__ import annotations

import dataclasses
import math

from ..privacy.accounting import ADD_REMOVE, REPLACE_ONE, calibrate
from . import als, registry

FACTOR_SNR = 350.0  # below: the bias model alone (see the module docstring)
# the bias model's own settings below FACTOR_SNR (the stage, or the ``bias`` algorithm's step):
# its ridge in noise standard deviations and the clip of the residual after the user bias.
# A heavy ridge and a tight clip while the noise dominates, lighter ones as the signal grows
# (validation RMSE on ML-100K and the 1.5k- and 4k-user synthetic sets, docs/explanations/noise-aware-defaults.md)
BIAS_SNR_TIGHT = 5.0  # below: residuals clipped to +-0.5 (almost pure noise: bias in exchange for less of it)
BIAS_SNR_LIGHT = 15.0  # from here: ridge 1 noise std instead of 3
BIAS_SNR_WIDE = 45.0  # from here: residuals clipped to +-2 instead of +-1
# bias_prior: the stage's item biases shrink towards their public feature groups (post-processing;
# test RMSE 0.001-0.003 lower on ML-100K and ml-latest-small at epsilon 5 and 20, every seed;
# nothing changes without item features)
# share_mean: the family's default, also where an algorithm starts from a smaller one (AM-DPSGD
# keeps its one-shot releases small for its gradient rounds; as the bias model it has none: its
# noisier mean lost 0.009 to the bias model on the 1.5k-user synthetic set at epsilon 0.5)
BIAS_ONLY = {
    "bias_stage": True,
    "rank": 0,
    "steps": 0,
    "bias_ridge_units": 3.0,
    "rating_clip": 1.0,
    "bias_prior": True,
    "share_mean": 0.02,
}
# k: the DPALS members keep 100 items per user (on the 10M-rating set k = 100 beat the old default
# of 50 on validation in all four cells tried, by 0.003-0.034; AdaDPALS does not read k)
WITH_FACTORS = {
    "bias_stage": True,
    "rank": 4,
    "steps": 2,
    "share_bias": 0.3,
    "bias_ridge_units": 3.0,
    "reg_noise_units": 3.0,
    "factor_floor": 10.0,
    "rating_clip": 1.0,
    "k": 100,
    "bias_prior": True,
}
RICH_SNR = 600.0  # above: a larger rank and a lighter ridge (the 10M-rating set at epsilon >= 10)
RICH = {**WITH_FACTORS, "rank": 8, "reg_noise_units": 1.0}


def rho_of_epsilon(epsilon: float, delta: float) -> float:
    """The zCDP rho whose standard conversion gives ``epsilon`` at ``delta``."""
    L = math.log(1.0 / delta)
    return (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2


def snr(epsilon: float, delta: float, n_items: int, n_users: int, relation: str = ADD_REMOVE) -> float:
    # under replace-one (a deployment: its job's relation) every release moves by twice its
    # add/remove sensitivity, so the same (epsilon, delta) buys half the signal per noise std
    half = 0.5 if relation == REPLACE_ONE else 1.0
    return half * max(n_users, 1) * math.sqrt(rho_of_epsilon(epsilon, delta)) / math.sqrt(max(n_items, 1))


def bias_settings(s: float) -> tuple[float, float]:
    """(ridge in noise standard deviations, rating clip) of the bias model at snr ``s``."""
    return (3.0 if s < BIAS_SNR_LIGHT else 1.0), (0.5 if s < BIAS_SNR_TIGHT else 1.0 if s < BIAS_SNR_WIDE else 2.0)


def effective_snr(s: float, noisings: int) -> float:
    """The snr of one noising when a step's statistics are noised ``noisings`` times (SSP1):
    each draw gets 1/noisings of the step's zCDP budget, so its noise std grows by
    sqrt(noisings)."""
    return s / math.sqrt(max(int(noisings), 1))


def choose(
    algorithm: str,
    epsilon: float,
    delta: float,
    n_items: int,
    n_users: int,
    given: frozenset = frozenset(),
    noisings: int = 1,
    relation: str = ADD_REMOVE,
) -> dict:
    """The rule's values (typed) for a private run of the ALS family, of ``bias``, of the
    encoder family (AM-SSP, AM-SSP1, AM-DPSGD) or of DP-SGD. Below ``FACTOR_SNR`` every one of
    them is the private bias model (the bias stage alone); above it the ALS family fits factors
    over the stage and the AM-SSP family fits its encoder to the stage's residual. DP-SGD and
    AM-DPSGD (whose steps estimate their own biases, so no stage can precede them) are the bias
    model at every snr: their own settings lost to it wherever measured. ``given``: keys the user set; an algorithm
    whose steps cannot
    follow the stage (DP-SGD, AM-DPSGD) keeps its own settings when rank or steps were given.
    ``noisings``: independent noisings of each step's statistics (AM-SSP1: one per server
    step); factors are fitted only when the snr of one noising reaches ``FACTOR_SNR`` (on the
    300k-rating synthetic set at epsilon 20, AM-SSP1's 200 noisings at snr 421 lost 0.057 to
    the bias model). ``relation``: the neighbouring relation the run's epsilon holds under
    (the ledger's: :func:`apply`)."""
    spec = registry.get(algorithm)
    if spec.rule is not None:  # an algorithm with a rule of its own (topk)
        return spec.rule.choose(epsilon, delta, n_items, n_users, relation=relation)
    s = snr(epsilon, delta, n_items, n_users, relation)
    ridge, clip = bias_settings(s)
    if (
        spec.bias_model
    ):  # bias_prior: +0.001 to +0.0033 test RMSE gained on ML-100K and ml-latest-small at epsilon 0.5-20 (3 seeds)
        return {"reg_noise_units": ridge, "rating_clip": clip, "bias_prior": True}
    stage_first = spec.contribution == "stats"  # its clients send per-item statistics: the stage can precede its steps
    if not stage_first:
        # DP-SGD and AM-DPSGD lost to the bias model wherever measured, above FACTOR_SNR too
        # (the 10M-rating set at epsilon 5: 0.929 and 0.927 against 0.775): their own settings
        # run when rank or steps are given (or with defaults=fixed)
        return {} if {"rank", "steps"} & set(given) else {**BIAS_ONLY, "bias_ridge_units": ridge, "rating_clip": clip}
    if effective_snr(s, noisings) < FACTOR_SNR:
        if (
            "bias_stage" in given
        ):  # the stage turned off by hand: the bias model through one rank-0 step, if the steps can be it
            return {} if spec.encoder else {"rank": 0, "steps": 1, "reg_noise_units": ridge, "rating_clip": clip}
        return {**BIAS_ONLY, "bias_ridge_units": ridge, "rating_clip": clip}
    # the encoder fits the residual of the bias stage (10M-rating set, epsilon 5: 0.765 against 0.903 without the stage)
    if spec.encoder:
        return {"bias_stage": True, "bias_prior": True}
    return dict(WITH_FACTORS if s < RICH_SNR else RICH)


def noise_aware_config(
    cfg, algorithm: str, epsilon: float, delta: float, n_items: int, n_users: int, relation: str = ADD_REMOVE
):
    """A new config: ``cfg`` with the rule's values for every key the user did not set
    (``cfg.given``), validated. ``cfg`` itself is left as it is."""
    noisings = registry.get(algorithm).noisings(cfg)
    chosen = {
        k: v
        for k, v in choose(algorithm, epsilon, delta, n_items, n_users, cfg.given, noisings, relation).items()
        if k not in cfg.given
    }
    own = registry.get(algorithm).option_keys  # the algorithm's own options (cfg.options)
    changes = {k: v for k, v in chosen.items() if k not in own}
    if own & set(chosen):
        changes["options"] = dataclasses.replace(cfg.options, **{k: v for k, v in chosen.items() if k in own})
    new = dataclasses.replace(cfg, **changes)
    new.validate()
    return new


def explain(
    algorithm: str, cfg, epsilon: float, delta: float, n_items: int, n_users: int, relation: str = ADD_REMOVE
) -> dict:
    """Why the rule chose what it chose, in public numbers: the snr statistic, the thresholds,
    the model it picked and the keys the user had set (which it left alone)."""
    s = snr(epsilon, delta, n_items, n_users, relation)
    if registry.get(algorithm).rule is not None:
        model = registry.get(algorithm).rule.explain(cfg, epsilon, delta, n_items, n_users, relation=relation)
    elif registry.get(algorithm).bias_model:
        model = (
            "the bias model (its own algorithm): the rule sets its ridge, its clip and the public-feature prior only"
        )
    elif (cfg.rank == 0 or (cfg.steps == 0 and cfg.bias_stage)) and registry.get(algorithm).noisings(cfg) > 1:
        n = registry.get(algorithm).noisings(cfg)
        model = (
            f"the bias model: {algorithm} noises each step's statistics {n} times, so one noising's snr is "
            f"{s:.3g} / sqrt({n}) = {effective_snr(s, n):.3g} < {FACTOR_SNR:g}, too little signal per item for factors"
        )
    elif (cfg.rank == 0 or (cfg.steps == 0 and cfg.bias_stage)) and s >= FACTOR_SNR:
        model = (
            f"the bias model: {algorithm}'s own settings lost to it wherever measured (snr {s:.3g}; "
            "set rank or steps, or defaults=fixed, to run them)"
        )
    elif cfg.rank == 0 or (cfg.steps == 0 and cfg.bias_stage):
        model = f"the bias model: snr {s:.3g} < {FACTOR_SNR:g}, too little signal per item for factors at this epsilon"
    elif registry.get(algorithm).encoder or registry.get(algorithm).contribution != "stats":
        stage = " over the bias stage" if cfg.bias_stage else ""
        why = (
            f"snr {s:.3g} >= {FACTOR_SNR:g}"
            if s >= FACTOR_SNR
            else f"rank or steps given (snr {s:.3g} < {FACTOR_SNR:g})"
        )
        model = f"{algorithm}'s own settings (rank {cfg.rank}, {cfg.steps} steps){stage}: {why}"
    elif s < FACTOR_SNR:  # factors below the threshold: the user set them
        model = (
            f"rank {cfg.rank}, {cfg.steps} steps"
            + (" over the bias stage" if cfg.bias_stage else "")
            + f": rank or steps given (snr {s:.3g} < {FACTOR_SNR:g})"
        )
    else:
        model = f"rank {cfg.rank}, {cfg.steps} steps over the bias stage: snr {s:.3g} >= {FACTOR_SNR:g}" + (
            f" (>= {RICH_SNR:g}: the rich setting)" if s >= RICH_SNR else ""
        )
    return {
        "snr": s,
        "factor_snr": FACTOR_SNR,
        "rich_snr": RICH_SNR,
        "released_n_users": int(n_users),
        "n_items": int(n_items),
        "model": model,
        "given": sorted(cfg.given),
    }


def apply(state, ledger) -> None:
    """Replace the state's config by the rule's choice for the keys not given, and recalibrate
    the rest of the plan around the released user count (see the module docstring). Nothing
    happens without a budgeted ledger (a run inside private tuning keeps its config). The
    configs are frozen: the state holds the new one (:func:`noise_aware_config`), the config it
    held before (the plan's) stays as it was. The
    relation the budget holds under is the ledger's (its run's)."""
    cfg = state.config
    if not state.private or ledger is None or ledger.budget is None:
        return
    epsilon, delta = ledger.budget
    relation = ledger.relation
    new = noise_aware_config(cfg, state.algorithm, epsilon, delta, state.n_items, state.n_users, relation)
    state.choice = explain(state.algorithm, new, epsilon, delta, state.n_items, state.n_users, relation)
    if new == cfg:  # the rule kept every setting: the plan calibrated before the count stands
        return
    plan = als.plan_releases(state.algorithm, new, state.implicit)
    # secure mode's Skellam records are accounted at integer orders only: calibrate there too
    state.multipliers = dict(
        calibrate(
            plan,
            epsilon,
            delta,
            pinned={"users": state.multipliers["users"]},
            integer_orders=new.aggregation.secure,
            relation=relation,
        ).multipliers
    )
    state.config = new
