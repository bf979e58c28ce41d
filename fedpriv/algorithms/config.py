"""The configurations of the algorithms and their one strict parser: ``--set key=value`` pairs
become typed fields, and a bad bool (``weighted_reg=ture``), a truncated number (``2.5`` for an
int), an unknown key or a key the algorithm does not read (:mod:`fedpriv.algorithms.registry`)
is a :class:`~fedpriv.errors.ConfigError` naming the field. Light on purpose: this module
imports neither torch nor dp-accounting (a test checks it)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from ..errors import ConfigError, did_you_mean
from . import registry
from .options import JSON_KEYS, is_flat


def _coerce(key: str, raw, typ):
    if typ is frozenset:  # a set of names: given as a set, a sequence, or comma-joined text
        items = raw if isinstance(raw, (set, frozenset, list, tuple)) else str(raw).split(",")
        return frozenset(str(k).strip() for k in items if str(k).strip())
    if isinstance(raw, typ) and not (typ is int and isinstance(raw, bool)):
        return raw
    s = str(raw).strip()
    try:
        if typ is bool:
            if s.lower() in ("1", "true", "yes", "on"):
                return True
            if s.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(s)
        if typ is int:
            f = float(s)
            if not f.is_integer():
                raise ValueError(s)
            return int(f)
        if typ is float:
            v = float(s)
            if math.isnan(v):
                raise ValueError(s)
            return v
        return s
    except ValueError:
        raise ConfigError(f"expected {typ.__name__}, got {raw!r}", field=key) from None


def _own_options(spec) -> set[str]:
    """The keys of an algorithm's own options dataclass (empty without one)."""
    return {f.name for f in fields(spec.options)} if spec.options is not None else set()


def _parse(cls, overrides: dict, also: frozenset = frozenset(), **whole):
    """An instance of the (frozen) dataclass ``cls``, built whole: ``overrides`` parsed strictly
    into its fields (the engine keys into its :class:`Aggregation`, when it has one), then the
    fields of ``whole`` as they are (an algorithm's parsed options); ``also``: keys parsed
    elsewhere (an algorithm's own options), named among the known ones in an error."""
    overrides, engine = _split_engine(cls, overrides)
    known = {f.name for f in fields(cls)} - {"aggregation"}
    base = cls()  # the defaults: each field's type
    values: dict = {}
    for key, raw in overrides.items():
        if key not in known:
            shown = sorted(
                (known | also | (set(Aggregation.KEYS) if engine is not None else set())) - {"given", "options"}
            )  # filled by the parser, never set by hand
            raise ConfigError(f"unknown key (known: {', '.join(shown)}){did_you_mean(key, shown)}", field=key)
        values[key] = _coerce(key, raw, type(getattr(base, key)))
    if engine is not None:
        values["aggregation"] = engine
    return cls(**{**values, **whole})


@dataclass(frozen=True)
class Aggregation:
    """Engine options, apart from every algorithm's hyperparameters: who sees exact sums.
    ``mode``: 'central' (a trusted aggregator step adds the noise) or 'secure' (nodes add
    Skellam noise shares and mask their words: only the noised sum is revealed); ``dropout``:
    the fraction of nodes that may drop (shares sized for the rest); ``collusion``: nodes that
    may pool their own noise shares (the noise holds without them). Set with the keys
    ``aggregation``, ``secure_dropout`` and ``secure_collusion`` (``--aggregation``, ``--set``);
    the same object for every family (ALS, encoder, DP-SGD, pam)."""

    mode: str = "central"
    dropout: float = 0.0
    collusion: int = 1

    #: config key -> field (the keys are what users write and what the JSON holds)
    KEYS = {"aggregation": "mode", "secure_dropout": "dropout", "secure_collusion": "collusion"}

    @property
    def secure(self) -> bool:
        return self.mode == "secure"

    def validate(self) -> None:
        if self.mode not in ("central", "secure"):
            raise ConfigError(f"must be 'central' or 'secure', got {self.mode!r}", field="aggregation")
        if not (0 <= self.dropout < 1):
            raise ConfigError(f"must be in [0, 1), got {self.dropout}", field="secure_dropout")
        if not (isinstance(self.collusion, int) and self.collusion >= 0):
            raise ConfigError(f"must be an integer >= 0, got {self.collusion!r}", field="secure_collusion")

    def to_dict(self) -> dict:
        """The options under their config keys."""
        return {key: getattr(self, attr) for key, attr in self.KEYS.items()}

    @classmethod
    def parse(cls, given: dict) -> "Aggregation":
        """From config keys (values typed strictly, as every key); validated."""
        base = cls()
        values = {
            attr: _coerce(key, given[key], type(getattr(base, attr))) for key, attr in cls.KEYS.items() if key in given
        }
        out = cls(**values)
        out.validate()
        return out


def _split_engine(cls, overrides: dict) -> tuple[dict, Aggregation | None]:
    """The overrides without the engine keys, and the engine options they set (None: the
    config class has no engine options). ``aggregation`` is the mode's key, or a whole
    :class:`Aggregation`."""
    if "aggregation" not in {f.name for f in fields(cls)}:
        return overrides, None
    rest = {k: v for k, v in overrides.items() if k not in Aggregation.KEYS}
    given = {k: v for k, v in overrides.items() if k in Aggregation.KEYS}
    whole = given.get("aggregation")
    if isinstance(whole, Aggregation):
        given = {**whole.to_dict(), **{k: v for k, v in given.items() if k != "aggregation"}}
    return rest, Aggregation.parse(given)


def _engine_dict(cfg) -> dict:
    """``asdict(cfg)`` with the engine options flattened in place under their config keys."""
    out: dict = {}
    for name, value in asdict(cfg).items():
        if name == "aggregation":
            out.update(cfg.aggregation.to_dict())
        else:
            out[name] = value
    return out


def _check_reads(overrides: dict, algorithm: str) -> None:
    """A key only other algorithms read is a ConfigError naming it and its readers."""
    for key in overrides:
        readers = registry.readers(key)
        if readers is not None and algorithm not in readers:
            raise ConfigError(f"{algorithm} does not use this key (it is read by {', '.join(readers)})", field=key)


@dataclass(frozen=True)
class ALSConfig:
    """Hyperparameters the ALS family shares (every field can be set with ``--set key=value``);
    an algorithm's own keys are its spec's options dataclass, held in ``options`` (DP-SGD and
    the encoder family: :mod:`fedpriv.algorithms.options`; topk: its own module's)."""

    rank: int = 8
    steps: int = 3
    reg_user: float = 0.1
    reg_item: float = 0.1  # non-private item solves (weighted-lambda: reg_item * count)
    reg_item_private: float = 2.0  # private item solves: constant ridge after PSD projection
    reg_noise_units: float = (
        0.0  # private item solves: plus this many noise standard deviations of A (noise-aware ridge)
    )
    weighted_reg: bool = True  # weighted-lambda (lambda * count) for user solves and non-private item solves
    user_bias: bool = True  # items carry a fixed column of ones: each user solves its own bias locally
    item_bias: bool = True  # released user vectors carry a fixed coordinate: items learn a bias
    bias_share: float = 0.25  # item_bias: share kappa^2 of the squared norm bound G_u^2 given to it
    # the private bias model as a first stage (ALS family): item biases from one release of
    # clipped per-user statistics before the factor steps, which then fit the residual
    bias_stage: bool = False
    share_bias: float = 0.3  # its budget share (an RDP share like share_mean)
    bias_ridge_units: float = 3.0  # its item ridge, in noise standard deviations of the released denominators
    factor_floor: float = 0.0  # items whose released weight sum is below this many of its noise stds get no factors
    bias_prior: bool = (
        False  # bias stage: shrink item biases towards their public feature groups' pooled effects (post-processing)
    )
    # 'noise-aware': the keys not set here are chosen by the rule of fedpriv.algorithms.defaults
    # from epsilon, delta, the number of items and the privately released user count; 'fixed': as written
    defaults: str = "fixed"
    given: frozenset = frozenset()  # the keys set explicitly (filled by from_overrides; the rule leaves them alone)
    user_clip: float = 1.0
    rating_clip: float = 1.0
    beta: float = 1.0
    mu: float = 0.5
    beta_bar_ratio: float = 1.0
    weight_mode: str = "clip"  # adadpals: 'clip' (eq. 12) or 'normalize' (reference code)
    k: int = 50  # dpals: items kept per user
    count_cap: float = 50.0  # K: counts contribution has L2 norm <= sqrt(K)
    mean_cap: float = 50.0  # C: mean contribution uses at most C ratings' worth per user
    share_users: float = 0.01  # fractions of the privacy budget (RDP shares)
    share_mean: float = 0.02
    share_counts: float = 0.08
    share_b: float = 0.5  # within one step: share of b versus A (and gravity)
    share_gravity: float = 0.1
    gravity: float = 0.0  # implicit data: weight of the unobserved-entries term
    psd_floor: float = 0.0
    init_scale: float = 0.1
    eval_k: int = 20
    seed: int = 1234  # public seed: initialisations only (noise and users' choices come from secret randomness)
    # engine options (aggregation, secure_dropout, secure_collusion), apart from the hyperparameters
    aggregation: Aggregation = field(default_factory=Aggregation)
    # the algorithm's own typed options (an instance of its spec's ``options`` dataclass), or None
    options: object = None

    @classmethod
    def from_overrides(
        cls, overrides: dict[str, str | float | int | bool], algorithm: str | None = None
    ) -> "ALSConfig":
        """A validated config from ``key=value`` overrides; with ``algorithm``, a key that
        algorithm does not read (:func:`fedpriv.algorithms.registry.readers`) is an error naming it."""
        if algorithm is not None:
            _check_reads(overrides, algorithm)
            spec = registry.get(algorithm)
            for key in spec.fixed:
                if key in overrides and str(overrides[key]) != dict(spec.defaults)[key]:
                    raise ConfigError(f"{algorithm} fixes it to {dict(spec.defaults)[key]}", field=key)
            given = frozenset(k for k in overrides if k not in ("given", "defaults"))
            overrides = {**dict(spec.defaults), **overrides, "given": given}
            own = _own_options(spec)
            options = (
                _parse(spec.options, {k: overrides.pop(k) for k in list(overrides) if k in own})
                if spec.options is not None
                else None
            )
        if algorithm is None:
            cfg = _parse(cls, overrides)
        else:
            cfg = _parse(cls, overrides, registry.get(algorithm).option_keys, options=options)
        cfg.validate()
        return cfg

    @classmethod
    def as_written(cls, overrides: dict, algorithm: str) -> "ALSConfig":
        """The config exactly as written for ``algorithm``: the shared keys on the fields'
        defaults (not the algorithm's defaults, no noise-aware rule unless ``defaults`` says so,
        nothing recorded as given), its own keys in its options; validated. A key the algorithm
        does not read is a ConfigError naming it (the harnesses that replay a fixed config:
        the red team, the audit)."""
        _check_reads(overrides, algorithm)
        spec = registry.get(algorithm)
        cfg = _parse(cls, {k: v for k, v in overrides.items() if k not in spec.option_keys}, spec.option_keys)
        if spec.options is not None:
            own = {k: v for k, v in overrides.items() if k in spec.option_keys}
            cfg = replace(cfg, options=_parse(spec.options, own))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not (self.rank >= 0):
            raise ConfigError(f"must be >= 0 (0: no factors, the bias model), got {self.rank}", field="rank")
        if not (self.steps > 0 or (self.steps == 0 and self.bias_stage)):
            raise ConfigError(
                f"must be > 0 (0 only with bias_stage: the bias model alone), got {self.steps}", field="steps"
            )
        positive = ("user_clip", "rating_clip", "beta", "beta_bar_ratio", "k", "count_cap", "mean_cap")
        for name in positive:
            v = getattr(self, name)
            if not (v > 0) or (isinstance(v, float) and math.isnan(v)):
                raise ConfigError(f"must be > 0, got {v}", field=name)
        for name in (
            "reg_user",
            "reg_item",
            "reg_item_private",
            "reg_noise_units",
            "gravity",
            "psd_floor",
            "mu",
            "init_scale",
            "bias_ridge_units",
            "factor_floor",
        ):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"must be a finite number >= 0, got {v}", field=name)
        for name in (
            "share_users",
            "share_mean",
            "share_counts",
            "share_b",
            "share_gravity",
            "bias_share",
            "share_bias",
        ):
            v = getattr(self, name)
            if not (0 < v < 1):
                raise ConfigError(f"must be in (0, 1), got {v}", field=name)
        if self.share_users + self.share_mean + self.share_counts >= 1:
            raise ConfigError("share_users + share_mean + share_counts must be < 1", field="share_counts")
        self.aggregation.validate()
        if self.defaults not in ("fixed", "noise-aware"):
            raise ConfigError(f"must be 'fixed' or 'noise-aware', got {self.defaults!r}", field="defaults")
        if self.weight_mode not in ("clip", "normalize"):
            raise ConfigError(f"must be 'clip' or 'normalize', got {self.weight_mode!r}", field="weight_mode")
        if self.options is not None and hasattr(self.options, "validate"):
            self.options.validate()

    def to_dict(self) -> dict:
        """The config as JSON values (``given`` as its sorted, comma-joined keys; the engine
        options under their keys). The options of DP-SGD and the encoder family are written flat
        under :data:`fedpriv.algorithms.options.JSON_KEYS` after ``seed`` (defaults for an
        algorithm without them), so the JSON is the same for every algorithm; another
        algorithm's own options (topk) go under "options"."""
        d: dict = {}
        opts = self.options
        flat = opts is not None and is_flat(type(opts))
        for key, value in _engine_dict(self).items():
            if key == "options":
                if opts is not None and not flat:
                    d["options"] = value
                continue
            d[key] = value
            if key == "seed":
                d.update({k: getattr(opts, k, default) if flat else default for k, default in JSON_KEYS.items()})
        d["given"] = ",".join(sorted(self.given))
        return d

    @classmethod
    def from_dict(cls, d: dict, algorithm: str | None = None) -> "ALSConfig":
        """The config of :meth:`to_dict` (a saved model, a broadcast state), every field typed;
        the algorithm's own options come back as its spec's dataclass (from the flat keys for
        DP-SGD and the encoder family; the flat keys of an algorithm that has no such option
        hold defaults and are dropped)."""
        d = dict(d)
        nested = d.pop("options", None)
        flat = {k: d.pop(k) for k in list(d) if k in JSON_KEYS}
        cfg = _parse(cls, d)
        spec = registry.get(algorithm) if algorithm is not None else None
        if spec is not None and spec.options is not None and is_flat(spec.options):
            cfg = replace(cfg, options=_parse(spec.options, {k: v for k, v in flat.items() if k in spec.option_keys}))
        elif nested is not None:
            if spec is None or spec.options is None:
                raise ConfigError(
                    f"options {sorted(nested)} belong to no algorithm's config (algorithm: {algorithm!r})",
                    field="options",
                )
            cfg = replace(cfg, options=_parse(spec.options, nested))
        return cfg


@dataclass(frozen=True)
class PAMConfig:
    """Hyperparameters (``--set key=value``)."""

    rank: int = 0  # k of the learned embedding (0: the data's k)
    epochs: int = 5  # full: epochs over all users; disjoint: number of user groups (steps)
    schedule: str = "full"  # 'full' or 'disjoint'
    clip_w: float = 0.0  # eta: bound on |vec(x v^T)| (0: sqrt(d * k))
    clip_y: float = 0.0  # zeta: bound on |y| (0: 2 sqrt(k))
    clip_x: float = 0.0  # single model: bound on |x| (0: sqrt(d))
    share_init: float = 0.2  # share of the budget for the private initialization
    ridge: float = 1.0  # server ridge, in units of the noise std of A times sqrt(dk) (private)
    user_ridge: float = 1e-3  # client solve of v_j (relative to the trace of its Gram matrix)
    own_ridge: float = 1.0  # pam-own-data: ridge of each user's d-dimensional regression
    nonprivate_epochs: int = 20  # pam-nonprivate: alternating steps to convergence
    net_size: int = 1000  # pam-exp: candidates in the net
    exp_radius: float = 0.0  # pam-exp: C, bound on |v| (0: 2.5 sqrt(k))
    exp_clip: float = 0.0  # pam-exp: L_f, bound on |U^T x| (0: 2 sqrt(k))
    seed: int = 1234  # public seed (the pam-exp net); noise and user groups come from secret randomness
    aggregation: Aggregation = field(default_factory=Aggregation)  # secure: pam and pam-single-model only

    @classmethod
    def from_overrides(cls, overrides: dict) -> "PAMConfig":
        """A validated config from ``key=value`` overrides (the strict parser of this module)."""
        cfg = _parse(cls, overrides)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.rank < 0:
            raise ConfigError(f"must be >= 0, got {self.rank}", field="rank")
        for name in ("epochs", "nonprivate_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"must be >= 1, got {getattr(self, name)}", field=name)
        if self.net_size < 1:
            raise ConfigError(f"must be >= 1, got {self.net_size}", field="net_size")
        for name in ("clip_w", "clip_y", "clip_x", "ridge", "user_ridge", "own_ridge", "exp_radius", "exp_clip"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"must be a finite number >= 0, got {v}", field=name)
        if not (0 < self.share_init < 1):
            raise ConfigError(f"must be in (0, 1), got {self.share_init}", field="share_init")
        if self.schedule not in ("full", "disjoint"):
            raise ConfigError(f"must be 'full' or 'disjoint', got {self.schedule!r}", field="schedule")
        self.aggregation.validate()

    def to_dict(self) -> dict:
        return _engine_dict(self)
