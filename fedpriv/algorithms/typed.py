"""Typed configurations, one class per rating algorithm, composed from shared pieces:

    from fedpriv.algorithms.typed import AdaDPALS, Clipping, BiasStage
    job = fedpriv.Job(AdaDPALS(rank=8, mu=0.25, clipping=Clipping(user_clip=0.5)), "ml-100k:PATH", epsilon=5)
    fedpriv.train(AMSSP(features="genre,year,id"), data, epsilon=5)

Each class is named by its algorithm's registration (``AlgorithmSpec(..., typed=AdaDPALS)``; a
new algorithm may define its own class in its own module, from these pieces). Each holds only
what its algorithm reads (its own keys, the shared ones, and the pieces:
:class:`Clipping`, :class:`Budget`, :class:`Regularisation`, :class:`BiasStage`), typed, every
field ``None`` by default. ``None`` means *not given*: the noise-aware rule
(:mod:`fedpriv.algorithms.defaults`) or the algorithm's default chooses it, so which keys a user
set is the structure itself (:meth:`AlgorithmConfig.params` returns exactly those), not a string.
Engine options are not here: aggregation (central or secure), dropout and collusion, nodes and
users per node belong to the run (``params`` of :class:`fedpriv.run.Job`, or the engine object).

The classes are a typed front for the one strict parser (:mod:`fedpriv.algorithms.config`): the
values go through it, so a bad value is the same ConfigError naming the key as ``--set
key=value`` gives. A test checks that every class offers exactly the keys its algorithm reads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, kw_only=True)
class _Piece:
    """A group of shared keys; ``KEYS``: attribute -> config key (the attribute name when absent)."""

    KEYS: ClassVar[dict[str, str]] = {}

    def params(self) -> dict[str, Any]:
        return {
            self.KEYS.get(f.name, f.name): getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None
        }


@dataclass(frozen=True, kw_only=True)
class Clipping(_Piece):
    """Per-user contribution bounds: the user vector's norm bound, the rating (residual) clip,
    the L2 weight budget per user (``beta``), the count and mean caps, and the bias
    coordinate's share of the norm bound."""

    user_clip: float | None = None
    rating_clip: float | None = None
    beta: float | None = None
    count_cap: float | None = None
    mean_cap: float | None = None
    bias_share: float | None = None


@dataclass(frozen=True, kw_only=True)
class Budget(_Piece):
    """Budget shares (RDP shares of the whole): the user count, the mean, the counts, b against
    A within a step, the gravity term, the bias stage."""

    users: float | None = None
    mean: float | None = None
    counts: float | None = None
    b: float | None = None
    gravity: float | None = None
    bias: float | None = None
    KEYS: ClassVar[dict[str, str]] = {
        "users": "share_users", "mean": "share_mean", "counts": "share_counts", "b": "share_b",
        "gravity": "share_gravity", "bias": "share_bias",
    }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Regularisation(_Piece):
    """Ridges of the user and (private) item solves, the noise-aware ridge in noise standard
    deviations, weighted-lambda, the PSD floor and the implicit-data gravity weight."""

    user: float | None = None
    item_private: float | None = None
    noise_units: float | None = None
    weighted: bool | None = None
    psd_floor: float | None = None
    gravity: float | None = None
    KEYS: ClassVar[dict[str, str]] = {
        "user": "reg_user", "item_private": "reg_item_private", "noise_units": "reg_noise_units",
        "weighted": "weighted_reg",
    }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BiasStage(_Piece):
    """The private bias model as a first stage: on or off, its ridge in noise standard
    deviations, the public-feature prior, and the support floor below which items get no
    factors. (Its budget share is :attr:`Budget.bias`.)"""

    enabled: bool | None = None
    ridge_units: float | None = None
    prior: bool | None = None
    factor_floor: float | None = None
    KEYS: ClassVar[dict[str, str]] = {"enabled": "bias_stage", "ridge_units": "bias_ridge_units", "prior": "bias_prior"}


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """What every rating algorithm reads. ``defaults``: "noise-aware" (the rule chooses what is
    not given) or "fixed" (as written); ``seed``: the public seed of the initialisations."""

    name: ClassVar[str] = ""  # set when the algorithm's spec is registered with this class
    defaults: str | None = None
    clipping: Clipping | None = None
    budget: Budget | None = None
    regularisation: Regularisation | None = None
    bias_stage: BiasStage | None = None
    init_scale: float | None = None
    eval_k: int | None = None
    seed: int | None = None

    def params(self) -> dict[str, Any]:
        """The keys given, as the config parser's key -> value (pieces flattened)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            items = value.params().items() if is_dataclass(value) else [(f.name, value)]
            for key, v in items:
                if key in out:
                    raise ValueError(f"{key} given twice")
                out[key] = v
        return out


@dataclass(frozen=True, kw_only=True)
class _Factored(AlgorithmConfig):
    """The members with factors: rank, alternating steps, user and item bias coordinates."""

    rank: int | None = None
    steps: int | None = None
    user_bias: bool | None = None
    item_bias: bool | None = None


@dataclass(frozen=True, kw_only=True)
class Bias(AlgorithmConfig):
    """The private bias model (global mean, item biases, user biases solved locally)."""

    steps: int | None = None


@dataclass(frozen=True, kw_only=True)
class Popular(AlgorithmConfig):
    """The private most-popular list (item counts released once)."""


@dataclass(frozen=True, kw_only=True)
class ALS(_Factored):
    """Non-private weighted-lambda ALS (the reference)."""

    reg_item: float | None = None


@dataclass(frozen=True, kw_only=True)
class IALS(_Factored):
    """Non-private implicit ALS (``ials``): every rating counts as 1, the gravity term pulls the
    unobserved entries to 0 (the top-k reference beside ``ease``)."""

    reg_item: float | None = None


@dataclass(frozen=True, kw_only=True)
class DPALSUniform(_Factored):
    """DPALS, ``k`` items sampled per user."""

    k: int | None = None


@dataclass(frozen=True, kw_only=True)
class DPALSTail(_Factored):
    """DPALS, the ``k`` least popular items per user."""

    k: int | None = None


@dataclass(frozen=True, kw_only=True)
class _Adaptive(_Factored):
    """Adaptive weights from the private counts (eq. 12 of the multitask paper)."""

    mu: float | None = None
    beta_bar_ratio: float | None = None
    weight_mode: str | None = None


@dataclass(frozen=True, kw_only=True)
class AdaDPALS(_Adaptive):
    """AdaDPALS, adaptive weights from private counts."""


@dataclass(frozen=True, kw_only=True)
class DPSGD(_Factored):
    """Federated DP-SGD on the item factors (a baseline)."""

    sgd_lr: float | None = None
    sgd_sampling_rate: float | None = None
    sgd_clip: float | None = None
    sgd_weight_decay: float | None = None


@dataclass(frozen=True, kw_only=True)
class _Encoder(_Adaptive):
    """The encoder family: a torch encoder over public item feature ``features`` (fields such as
    "genre,year" or with "id")."""

    features: str | None = None
    enc_hidden: int | None = None
    enc_weight_decay: float | None = None


@dataclass(frozen=True, kw_only=True)
class _ServerSteps(_Encoder):
    """AM-SSP's server: ``ssp_steps`` Adam steps at ``ssp_lr`` per alternating step."""

    ssp_steps: int | None = None
    ssp_lr: float | None = None
    ssp_batch_items: int | None = None


@dataclass(frozen=True, kw_only=True)
class AMSSP(_ServerSteps):
    """AM-SSP: alternating minimization with sufficient statistics (SSP2: one noising per step)."""

    ssp_resamples: int | None = None


@dataclass(frozen=True, kw_only=True)
class AMSSP1(_ServerSteps):
    """AM-SSP1: an independent noising per server step."""

    ssp_resamples: int | None = None


@dataclass(frozen=True, kw_only=True)
class AMSSPConvex(_ServerSteps):
    """AM-SSP-convex: the logistic model (ratings >= ``convex_threshold`` are positives)."""

    convex_threshold: float | None = None
    newton_steps: int | None = None


@dataclass(frozen=True, kw_only=True)
class AMDPSGD(_Encoder):
    """AM-DPSGD: the encoder trained by federated DP-SGD."""

    sgd_sampling_rate: float | None = None
    sgd_clip: float | None = None
    encoder_sgd_lr: float | None = None


def classes() -> dict[str, type[AlgorithmConfig]]:
    """Every registered algorithm's typed configuration, by name (a spec names its class with
    ``typed=``; registering sets the class's :attr:`AlgorithmConfig.name`)."""
    from . import registry

    return {name: registry.get(name).typed for name in registry.names() if registry.get(name).typed is not None}


def offered_keys(cls: type[AlgorithmConfig]) -> set[str]:
    """Every config key a class can set (its fields, with the pieces' keys)."""
    pieces = {"clipping": Clipping, "budget": Budget, "regularisation": Regularisation, "bias_stage": BiasStage}
    keys: set[str] = set()
    for f in fields(cls):
        if f.name in pieces:
            piece = pieces[f.name]
            keys |= {piece.KEYS.get(g.name, g.name) for g in fields(piece)}
        else:
            keys.add(f.name)
    return keys
