"""DPALS with uniform sampling (Chien et al. 2021): each user keeps at most ``k`` of its rated
items, a uniformly random subset that the user draws from its own secret key (never a public or
dense-index hash), each kept rating weighted sqrt(beta / k). Everything else is the ALS family's
alternating step (:mod:`fedpriv.algorithms.als`)."""

from __future__ import annotations

import numpy as np

from .family import sampled_rating_weights
from .registry import NOISE_AWARE, AlgorithmSpec, register
from .typed import DPALSUniform


def uniform_rating_weights(shard, state) -> np.ndarray:
    """At most ``k`` items per user, chosen uniformly at random by the user."""
    return sampled_rating_weights(shard, state, "uniform")


SPEC = register(
    AlgorithmSpec(
        "dpals-uniform",
        uniform_rating_weights,
        task="ratings",
        keys=("k",),
        summary="DPALS, k items sampled per user",
        defaults=NOISE_AWARE,
        typed=DPALSUniform,
    )
)
