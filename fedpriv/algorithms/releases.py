"""The releases of one alternating step of the rating algorithms, with their budget shares
(the pre-processing releases are planned by :func:`fedpriv.algorithms.als.plan_releases`).
Light: no torch, no dp-accounting."""

from __future__ import annotations

from ..privacy.records import PlannedRelease
from .options import Sampled, SSPOptions, of


def stats_releases(cfg, share: float, noisings: int = 1) -> list[PlannedRelease]:
    """Per-item statistics b and A (and the gravity term when on), ``noisings`` draws per step."""
    count = cfg.steps * noisings
    grav = cfg.share_gravity if cfg.gravity > 0 else 0.0
    plan = [
        PlannedRelease("item_stats_b", count, share * cfg.share_b),
        PlannedRelease("item_stats_A", count, share * (1 - cfg.share_b) * (1 - grav)),
    ]
    if grav:
        plan.append(PlannedRelease("gravity", count, share * (1 - cfg.share_b) * grav))
    return plan


def ssp2_resamples(cfg) -> int:
    """SSP2: the statistics are noised once per step (unless ``ssp_resamples`` says otherwise)."""
    return of(cfg, SSPOptions).ssp_resamples or 1


def ssp1_resamples(cfg) -> int:
    """SSP1: a fresh noising for every server gradient step."""
    opts = of(cfg, SSPOptions)
    return opts.ssp_resamples or opts.ssp_steps


def ssp2_releases(cfg, share: float) -> list[PlannedRelease]:
    return stats_releases(cfg, share, ssp2_resamples(cfg))


def ssp1_releases(cfg, share: float) -> list[PlannedRelease]:
    return stats_releases(cfg, share, ssp1_resamples(cfg))


def convex_releases(cfg, share: float) -> list[PlannedRelease]:
    """The logistic model's per-item gradient g and Hessian H statistics."""
    return [
        PlannedRelease("item_stats_g", cfg.steps, share * cfg.share_b),
        PlannedRelease("item_stats_H", cfg.steps, share * (1 - cfg.share_b)),
    ]


def gradient_releases(name: str):
    """One Poisson-subsampled clipped-gradient sum per step."""

    def releases(cfg, share: float) -> list[PlannedRelease]:
        return [PlannedRelease(name, cfg.steps, share, of(cfg, Sampled).sgd_sampling_rate)]

    return releases
