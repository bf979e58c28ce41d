"""The rating family as one object (:class:`RatingsFamily`, the catalogue's :data:`RATINGS`):
the ALS family, the bias model, DP-SGD, the encoder family and the top-k models, each a
registered :class:`~fedpriv.algorithms.registry.AlgorithmSpec`. Its engines are its own: user
shards in process (:mod:`fedpriv.engine.inprocess`) and the rating ServerApp on Flower
(:mod:`fedpriv.flower.server_app`), with its splits, private tuning and recommendation."""

from __future__ import annotations

from . import registry
from .config import ALSConfig
from .families import Family, register_family


class RatingsFamily(Family):
    name = "ratings"
    blocks = False

    @property
    def rounds(self):
        """The rating rounds (:class:`fedpriv.algorithms.rounds.RatingRounds`), loaded on first
        use: a node's catalogue of families stays light."""
        from .rounds import RATING

        return RATING

    def algorithms(self) -> tuple[str, ...]:
        return registry.names()

    def private(self, algorithm: str) -> bool:
        return registry.get(algorithm).private

    def describe(self, algorithm: str) -> tuple[str, str]:
        spec = registry.get(algorithm)
        return spec.task, spec.summary

    def parse(self, overrides: dict, algorithm: str) -> ALSConfig:
        return ALSConfig.from_overrides(overrides, algorithm)

    def budget(self, plan):
        from .plans import budget_plan

        job = plan.job
        return budget_plan(
            plan.algorithm,
            plan.config,
            job.epsilon,
            job.delta,
            implicit=plan.implicit,
            rating_range=plan.rating_range,
            relation=plan.relation,
        )

    def check_budget(self, plan) -> None:
        from . import als

        als.calibrate_plan(plan.algorithm, plan.config, plan.implicit, plan.job.epsilon, plan.job.delta, plan.relation)


RATINGS = register_family(RatingsFamily())
