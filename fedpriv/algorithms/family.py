"""The built-in members of the rating-algorithm family (ALS, DPALS tail-biased, AdaDPALS,
DP-SGD and the encoder family), registered with their weights rules, their step releases and
their alternating steps (:mod:`fedpriv.algorithms.steps`, imported on first use); light on
purpose (numpy and the privacy primitives only), so that the registry and the configs load
without torch."""

from __future__ import annotations

import numpy as np

from ..privacy.randomness import PURPOSE_ITEM_SUBSET, require_keys, user_uniform
from ..privacy.weights import clip_user_weights, sampled_user_weights
from . import registry, typed
from .options import ConvexOptions, DPSGDOptions, EncoderDPSGDOptions, SSPOptions
from .releases import convex_releases, gradient_releases, ssp1_releases, ssp1_resamples, ssp2_releases, ssp2_resamples


def unit_rating_weights(shard, state) -> np.ndarray:
    """Non-private ALS: every rating weighs 1."""
    return np.ones(shard.n_ratings)


def adaptive_rating_weights(shard, state) -> np.ndarray:
    """Eq. 12: omega from the released counts, clipped per user (AdaDPALS, the encoder family)."""
    cfg = state.config
    return clip_user_weights(state.omega, shard.items, shard.indptr, cfg.beta, cfg.weight_mode)


def tail_rating_weights(shard, state) -> np.ndarray:
    """DPALS tail-biased: the k least counted items of each user (ties broken by the user)."""
    return sampled_rating_weights(shard, state, "tail")


def sampled_rating_weights(shard, state, mode: str) -> np.ndarray:
    """DPALS sampling weights, ``mode`` uniform or tail."""
    cfg = state.config
    # each user's own random subset: keyed by its secret key and the (public, stable) item ids
    keys = require_keys(shard)[shard.local_user_of_rating]
    return sampled_user_weights(
        user_uniform(keys, PURPOSE_ITEM_SUBSET, shard.items.astype(np.uint64)),
        shard.items,
        shard.indptr,
        cfg.k,
        cfg.beta,
        mode=mode,
        counts_hat=state.counts_hat,
    )


_STEPS = "fedpriv.algorithms.steps:"
#: ials' settings, chosen on the validation ratings of ML-100K and ml-latest-small (Recall@10: gravity 0.01-1,
#: regularisation 0.03-1, rank 32-64, 5-10 steps; docs/how-to/recommendations.md)
IALS_DEFAULTS = (
    ("rank", "32"),
    ("steps", "10"),
    ("gravity", "1.0"),
    ("reg_user", "0.1"),
    ("reg_item", "0.1"),
    ("item_bias", "false"),
    ("user_bias", "false"),
)


def _ials_scores(shard, state, candidates) -> np.ndarray:
    """ials' ranking: the predicted preference u . v of the user's own solved vector (no blend,
    no clip; no mean or biases: ials has none)."""
    from .recommend import client_scores

    return client_scores(shard, state, np.asarray(candidates, dtype=np.int64), clip=False)


_ADAPTIVE_KEYS = ("mu", "beta_bar_ratio", "weight_mode")
_ADAPTIVE = dict(needs_counts=True, needs_user_count=True, adaptive=True)
for _spec in (
    registry.AlgorithmSpec(
        "als",
        unit_rating_weights,
        private=False,
        task="reference: ratings",
        needs_counts=True,
        keys=("reg_item",),
        summary="non-private weighted-lambda ALS",
        typed=typed.ALS,
    ),
    registry.AlgorithmSpec(
        "ials",
        unit_rating_weights,
        private=False,
        task="reference: top-k",
        needs_counts=True,
        keys=("reg_item",),
        centred=False,
        implicit_targets=True,
        ranker=_ials_scores,
        typed=typed.IALS,
        summary="non-private implicit ALS (every rating counts as 1, the unobserved entries pulled to 0 by the gravity "
                "term): the top-k reference beside ease",
        defaults=IALS_DEFAULTS,
    ),
    registry.AlgorithmSpec(
        "dpals-tail",
        tail_rating_weights,
        task="ratings",
        needs_counts=True,
        keys=("k",),
        summary="DPALS, the k least popular items per user",
        defaults=registry.NOISE_AWARE,
        typed=typed.DPALSTail,
    ),
    registry.AlgorithmSpec(
        "adadpals",
        adaptive_rating_weights,
        task="ratings",
        keys=_ADAPTIVE_KEYS,
        summary="adaptive weights from private counts",
        defaults=registry.NOISE_AWARE,
        typed=typed.AdaDPALS,
        **_ADAPTIVE,
    ),
    registry.AlgorithmSpec(
        "dpsgd",
        unit_rating_weights,
        task="reference: ratings",
        needs_user_count=True,
        options=DPSGDOptions,
        summary="federated DP-SGD baseline",
        step=_STEPS + "DPSGD",
        step_releases=gradient_releases("dpsgd_grad"),
        contribution="gradient",
        bias_column=True,
        defaults=registry.FALL_BACK,
        typed=typed.DPSGD,
    ),
    *(
        registry.AlgorithmSpec(
            name,
            adaptive_rating_weights,
            task="ratings",
            keys=_ADAPTIVE_KEYS,
            options=SSPOptions,
            summary=f"{variant} with a public-feature encoder",
            step=_STEPS + "SSP",
            step_releases=releases,
            resamples=resamples,
            encoder=True,
            defaults=registry.FALL_BACK,
            typed=typed_class,
            **_ADAPTIVE,
        )
        for name, variant, releases, resamples, typed_class in (
            ("am-ssp", "SSP2", ssp2_releases, ssp2_resamples, typed.AMSSP),
            ("am-ssp1", "SSP1", ssp1_releases, ssp1_resamples, typed.AMSSP1),
        )
    ),
    registry.AlgorithmSpec(
        "am-ssp-convex",
        adaptive_rating_weights,
        task="ratings",
        keys=_ADAPTIVE_KEYS,
        options=ConvexOptions,
        summary="logistic SSP with a public-feature encoder",
        step=_STEPS + "CONVEX",
        step_releases=convex_releases,
        contribution="convex",
        centred=False,
        encoder=True,
        typed=typed.AMSSPConvex,
        **_ADAPTIVE,
    ),
    registry.AlgorithmSpec(
        "am-dpsgd",
        adaptive_rating_weights,
        task="reference: ratings",
        keys=_ADAPTIVE_KEYS,
        options=EncoderDPSGDOptions,
        summary="AM-DPSGD baseline with a public-feature encoder",
        step=_STEPS + "ENCODER_DPSGD",
        step_releases=gradient_releases("encoder_grad"),
        contribution="flat",
        encoder=True,
        # the gradient rounds are Poisson-sampled and need most of the budget: the one-shot
        # releases keep under a fifth of it (fedpriv privacy plan am-dpsgd --epsilon 1). The user
        # count keeps the family's share: the noise-aware rule reads it before anything else, and
        # a noisier count put the 1.5k-user synthetic set at epsilon 0.5 on the wrong side of a
        # threshold (the bias model's residual clip) and lost 0.021 to the bias model
        defaults=(("share_mean", "0.01"), ("share_counts", "0.05"), *registry.FALL_BACK),
        typed=typed.AMDPSGD,
        **_ADAPTIVE,
    ),
):
    registry.register(_spec)
