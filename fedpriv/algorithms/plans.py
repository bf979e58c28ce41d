"""Budget plans of the ALS family: the algorithm's releases (:func:`fedpriv.algorithms.als.plan_releases`)
and their L2 sensitivities, calibrated by :func:`fedpriv.privacy.plan.calibrated_plan`."""

from __future__ import annotations

from ..privacy.plan import BudgetPlan, TuningPlan, calibrated_plan
from ..privacy.target import ADD_REMOVE
from . import als


def budget_plan(
    algorithm: str,
    cfg: als.ALSConfig,
    epsilon: float,
    delta: float,
    *,
    implicit: bool = False,
    rating_range: tuple[float, float] = (1.0, 5.0),
    tuning: TuningPlan | None = None,
    relation: str = ADD_REMOVE,
) -> BudgetPlan:
    """Calibrate ``algorithm``'s release plan (config ``cfg``) to (epsilon, delta) under the
    neighbouring ``relation`` (:mod:`fedpriv.privacy.target`)."""
    als.validate_algorithm(algorithm)
    planned = als.plan_releases(algorithm, cfg, implicit)
    sens = {p.name: als.sensitivity(p.name, cfg, rating_range) for p in planned}
    secure = cfg.aggregation.secure  # Skellam noise: calibrated and accounted at integer RDP orders
    plan = calibrated_plan(
        algorithm,
        planned,
        sens,
        epsilon,
        delta,
        rating_range=rating_range,
        tuning=tuning,
        integer_orders=secure,
        relation=relation,
    )
    plan.one_shot = als.PRE_RELEASES
    before = plan.calibration.share_rule
    if tuning is None and before is not None:
        plan.notes.append(
            "Fair allocation: each Poisson-sampled release gets the multiplier that spends its budget fraction of the "
            "RDP at the composition's optimal order. Before (z = s / sqrt(share), which ignores the amplification by "
            "sampling and over-noises the sampled releases while the one-shot ones spend more than their fraction): "
            + ", ".join(f"{k} {before[k]:.4g} -> {plan.multipliers[k]:.4g}" for k in before)
            + "."
        )
    if cfg.defaults == "noise-aware":
        plan.notes.append(
            "Noise-aware defaults: this is the plan before the user count is released. The run then lets the rule of "
            "fedpriv.algorithms.defaults choose the keys not set (rank, steps, ridges, shares) and calibrates the rest "
            "with the count's release pinned, spending the same epsilon; the run's ledger records the plan it chose "
            "(--set defaults=fixed to run this plan as it is)."
        )
    if secure:
        plan.notes.append(
            "Secure aggregation: each release is a secure sum of the nodes' words (scaled so that one user moves "
            "them by 2^20 or more integers, rounded, plus each node's share of Skellam noise). Its noise has standard "
            "deviation kappa * z * Delta2 in integer units, Delta2 the rounded sensitivity, "
            "kappa^2 = 1 + 3.5 / (z Delta2)^2, which keeps its (xi, rho)-zCDP below the Gaussian's at every order. "
            "The Skellam RDP bound (Agarwal, Kairouz and "
            "Liu 2021) is proven at integer orders only, so the run's ledger is accounted at integer orders and this "
            "plan is calibrated at them: the Skellam releases the run records spend at most the RDP epsilon above. "
            "Sampled releases are planned unsampled (no amplification "
            "for distributed noise), and the PLD line is the Gaussian's (dp-accounting has no Skellam PLD)."
        )
    return plan
