"""Secure aggregation of the rating algorithms' releases: what a node sends and what the server
makes of the noised sum, for every release that sums node contributions (the user count, the
mean, the item counts, and each alternating step's declared parts).

A secure round has a *kind* ('users', 'mean', 'counts', 'bias' or 'step'). Both engines call:

- :func:`round_parts`: the round's releases (name, words, L2 sensitivity, z), from which the
  server plans the round (:func:`fedpriv.privacy.distributed.secure_round`, the one secure
  step of every family);
- :func:`node_values` then :func:`node_words` on each node: the node's clipped sums, flattened
  (upper triangles for symmetric parts), quantized, plus the node's Skellam share;
- the server's post-processing of the decoded (already noised) sums goes through the
  algorithm's own release functions, which receive them from :class:`Prereleased` instead of
  drawing noise (:class:`fedpriv.engine.loop.SecureAggregator`).
"""

from __future__ import annotations


import numpy as np

from ..errors import ConfigError, PrivacyError
from ..privacy import distributed
from ..privacy.distributed import Prereleased  # noqa: F401 - re-exported
from ..privacy.randomness import node_noise_rng
from . import als
from .shards import UserShard
from .steps import Part

KINDS = ("users", "mean", "counts", "bias", "step")


def check_secure(state: als.PublicState) -> None:
    """Secure aggregation needs a private algorithm whose step noises its sums once."""
    spec = state.spec
    if not spec.private:
        raise ConfigError(
            f"secure aggregation adds distributed noise; {state.algorithm} is not private (use --aggregation central)",
            field="aggregation",
        )
    if spec.noisings(state.config) != 1:
        raise ConfigError(
            f"{state.algorithm} noises each step's statistics {spec.noisings(state.config)} times (SSP1); "
            "secure aggregation releases each sum once: use am-ssp, or ssp_resamples=1",
            field="aggregation",
        )


def _pre_parts(kind: str, state: als.PublicState) -> list[Part]:
    return [Part(kind, 0, (als.pre_release_length(kind, state),))]


def declared(kind: str, state: als.PublicState) -> list[Part]:
    """The declared parts of a round."""
    if kind == "step":
        return state.spec.alternating_step().parts(state)
    if kind not in KINDS:
        raise PrivacyError(f"unknown secure round {kind!r}")
    return _pre_parts(kind, state)


def round_parts(kind: str, state: als.PublicState) -> list[tuple[str, int, float, float]]:
    """(release name, words, L2 sensitivity, noise multiplier z) of every part of the round."""
    return [
        (p.name, p.length, als.sensitivity(p.name, state.config, state.rating_range), state.multipliers[p.name])
        for p in declared(kind, state)
    ]


# ---------------------------------------------------------------------------- node side
def node_values(
    kind: str, shard: UserShard, state: als.PublicState, step: int = 0, table=None
) -> dict[str, np.ndarray]:
    """The node's clipped sums of one round, flattened per declared part."""
    if kind in als.PRE_RELEASES:
        return {kind: als.client_vector(kind, shard, state)}
    alternating = state.spec.alternating_step()
    sums = alternating.sums([alternating.client(shard, state, step, table)], state)
    return {p.name: p.flatten(sums[p.index]) for p in alternating.parts(state)}


def node_histogram(shard: UserShard, state: als.PublicState, candidates: np.ndarray, cfg) -> dict[str, np.ndarray]:
    """The node's score-histogram counts of the recommendation's quantile ranges, flattened."""
    from . import recommend

    return {recommend.HIST_RELEASE: recommend.client_histogram(shard, state, candidates, cfg).ravel()}


def node_rng(shard: UserShard, label: str, reproducible: bool) -> np.random.Generator:
    """The node's generator for its noise share of the round ``label``
    (:func:`fedpriv.privacy.randomness.node_noise_rng` over its users' keys)."""
    return node_noise_rng(shard.user_keys, label, reproducible)


def node_words(
    plan: distributed.DistributedPlan, values: dict[str, np.ndarray], rng: np.random.Generator
) -> np.ndarray:
    """The node's words (uint64 mod 2^bits): quantized sums plus its noise share."""
    return distributed.encode(plan, values, rng)


def label(kind: str, step: int = 0) -> str:
    """The public name of a round (its masks and noise shares are drawn per label)."""
    return kind if kind != "step" else f"step-{step}"
