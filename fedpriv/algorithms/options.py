"""The own options of the DP-SGD baseline and the encoder family: each algorithm's spec names
one of these dataclasses (``AlgorithmSpec(options=...)``), so a config holds them as
``cfg.options`` and :class:`~fedpriv.algorithms.config.ALSConfig` carries only the keys that
the ALS family shares. Composed from pieces: the Poisson-sampled gradient rounds
(:class:`Sampled`), the public-feature encoder (:class:`EncoderOptions`) and the server's
encoder steps on released statistics (:class:`ServerSteps`).

For the JSON of ``metrics.json``, saved models and the broadcast state, the keys stay flat
and in their historical order (:data:`JSON_KEYS`): an algorithm without a key writes its
default there, as before the split. Light: no torch, no dp-accounting."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..errors import ConfigError

# key -> (test, what it must be): one rule per key, applied by every class that has the key
_RULES = {
    "sgd_sampling_rate": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "sgd_clip": (lambda v: v > 0 and math.isfinite(v), "a finite number > 0"),
    "sgd_lr": (lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0"),
    "sgd_weight_decay": (lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0"),
    "features": (
        lambda v: bool([f for f in v.replace(";", ",").split(",") if f.strip()]),
        "at least one field (e.g. genre,year or id)",
    ),
    "enc_hidden": (lambda v: v >= 0, ">= 0"),
    "enc_weight_decay": (lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0"),
    "ssp_steps": (lambda v: v > 0, "> 0"),
    "ssp_lr": (lambda v: v > 0 and math.isfinite(v), "a finite number > 0"),
    "ssp_batch_items": (lambda v: v >= 0, ">= 0"),
    "ssp_resamples": (lambda v: v >= 0, ">= 0"),
    "convex_threshold": (lambda v: math.isfinite(v), "finite"),
    "newton_steps": (lambda v: v > 0, "> 0"),
    "encoder_sgd_lr": (lambda v: v > 0 and math.isfinite(v), "a finite number > 0"),
}


class _Checked:
    def validate(self) -> None:
        """Each field against its rule: a ConfigError naming the key."""
        for f in fields(self):
            value = getattr(self, f.name)
            test, what = _RULES[f.name]
            if isinstance(value, float) and math.isnan(value) or not test(value):
                raise ConfigError(f"must be {what}, got {value!r}", field=f.name)


@dataclass(frozen=True)
class Sampled(_Checked):
    """Poisson-sampled gradient rounds: each user joins a round with probability
    ``sgd_sampling_rate``, its gradient clipped to L2 norm ``sgd_clip``."""

    sgd_sampling_rate: float = 0.1
    sgd_clip: float = 1.0


@dataclass(frozen=True)
class DPSGDOptions(Sampled):
    """``dpsgd``: federated DP-SGD on the item factors, one round per step."""

    sgd_lr: float = 0.5
    sgd_weight_decay: float = 1e-3


@dataclass(frozen=True)
class EncoderOptions(_Checked):
    """The public-feature encoder: its fields ("id" adds the item id), the embedding width per
    field (0: the output dimension) and the L2 weight decay of its parameters."""

    features: str = "genre,year"
    enc_hidden: int = 0
    enc_weight_decay: float = 0.0


@dataclass(frozen=True)
class ServerSteps(EncoderOptions):
    """The server's encoder steps on released statistics: ``ssp_steps`` Adam steps of rate
    ``ssp_lr`` per alternating step, on ``ssp_batch_items`` items each (0: all)."""

    ssp_steps: int = 200
    ssp_lr: float = 0.05
    ssp_batch_items: int = 0


@dataclass(frozen=True)
class SSPOptions(ServerSteps):
    """``am-ssp``, ``am-ssp1``: independent noise draws per step (0: am-ssp 1, am-ssp1 ssp_steps)."""

    ssp_resamples: int = 0


@dataclass(frozen=True)
class ConvexOptions(ServerSteps):
    """``am-ssp-convex``: label 1 when the rating is >= ``convex_threshold``; Newton steps of
    the clients' local logistic solves."""

    convex_threshold: float = 3.5
    newton_steps: int = 5


@dataclass(frozen=True)
class EncoderDPSGDOptions(EncoderOptions, Sampled):
    """``am-dpsgd``: the encoder trained on noised gradient sums, Adam at ``encoder_sgd_lr``."""

    encoder_sgd_lr: float = 0.01


#: the flat keys of the JSON forms, in their historical order, with their defaults
JSON_KEYS: dict[str, object] = {}
for _cls in (DPSGDOptions, SSPOptions, ConvexOptions, EncoderDPSGDOptions):
    for _f in fields(_cls):
        JSON_KEYS.setdefault(_f.name, _f.default)
_ORDER = ("sgd_lr", "sgd_sampling_rate", "sgd_clip", "sgd_weight_decay", "features", "enc_hidden", "ssp_steps",
          "ssp_lr", "ssp_batch_items", "ssp_resamples", "enc_weight_decay", "convex_threshold", "newton_steps",
          "encoder_sgd_lr")  # fmt: skip
assert set(_ORDER) == set(JSON_KEYS)
JSON_KEYS = {k: JSON_KEYS[k] for k in _ORDER}
FLAT = (DPSGDOptions, SSPOptions, ConvexOptions, EncoderDPSGDOptions)


def is_flat(options_class) -> bool:
    """Options written flat under :data:`JSON_KEYS` (these classes), not nested under "options"."""
    return options_class in FLAT


def of(cfg, cls):
    """``cfg``'s options as ``cls`` (one of these classes or a piece of them): its own, or the
    defaults when the config holds none; another algorithm's options are a ConfigError."""
    if cfg.options is None:
        return cls()
    if not isinstance(cfg.options, cls):
        raise ConfigError(f"the config holds {type(cfg.options).__name__}, not {cls.__name__}", field="options")
    return cfg.options
