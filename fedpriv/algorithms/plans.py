"""Budget plans of the ALS family: the algorithm's releases (:func:`fedpriv.algorithms.als.plan_releases`)
and their L2 sensitivities, calibrated by :func:`fedpriv.privacy.plan.calibrated_plan`."""

from __future__ import annotations

from ..privacy.plan import BudgetPlan, TuningPlan, calibrated_plan
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
) -> BudgetPlan:
    """Calibrate ``algorithm``'s release plan (config ``cfg``) to (epsilon, delta)."""
    als.validate_algorithm(algorithm)
    planned = als.plan_releases(algorithm, cfg, implicit)
    sens = {p.name: als.sensitivity(p.name, cfg, rating_range) for p in planned}
    return calibrated_plan(algorithm, planned, sens, epsilon, delta, rating_range=rating_range, tuning=tuning)
