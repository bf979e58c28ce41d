"""The private popularity baseline (``popular``): the item counts released once, with their
noise, and nothing else but the mean. Each user adds one to each item it rated, its vector
clipped to L2 norm sqrt(count_cap) (a heavy user's ones are scaled down uniformly); the counts
take almost the whole budget (the mean, for its rating predictions, the rest). Its top-k list is
the same for every user (the released counts, the items a user rated excluded) and it predicts
every rating by the released mean: the floor every private recommender must beat, at the same
epsilon. Adding it is this module and its registration (fedpriv.algorithms.__init__)."""

from __future__ import annotations

import numpy as np

from .registry import AlgorithmSpec, register
from .typed import Popular


def no_rating_weights(shard, state) -> np.ndarray:
    """popular has no alternating step: no rating is weighted."""
    return np.zeros(shard.n_ratings)


def no_step_releases(cfg, share: float) -> list:
    return []


def popularity_scores(shard, state, candidates) -> np.ndarray:
    """Every user's list: the standardized released log-popularity of the candidates (the same
    for all), in every evaluation protocol (random split and held-out users) and in ``recommend``."""
    from .ranking import popularity_prior

    prior = popularity_prior(state)
    prior = prior if prior is not None else np.zeros(state.n_items)
    return np.broadcast_to(prior[np.asarray(candidates, dtype=np.int64)], (shard.n_users, len(candidates))).copy()


SPEC = register(
    AlgorithmSpec(
        "popular",
        no_rating_weights,
        task="reference: top-k",
        needs_counts=True,
        summary="private popularity baseline: the item counts released once (top-k = the most popular unrated items)",
        step_releases=no_step_releases,
        setup_only=True,
        defaults=(
            ("rank", "0"),
            ("steps", "1"),
            ("share_counts", "0.9"),
            ("share_mean", "0.08"),
            ("item_bias", "true"),
            ("user_bias", "false"),
        ),
        fixed=("rank", "steps"),
        typed=Popular,
        ranker=popularity_scores,
        ranker_any_thread=True,
    )
)
