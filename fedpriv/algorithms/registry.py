"""The registry of the rating algorithms (the ALS family and the encoder family): one
:class:`AlgorithmSpec` per algorithm, holding what the engines and the config parser need to
know about it, so that they look an algorithm up instead of comparing its name.

Adding an algorithm of the family is one module that registers its spec, plus the import of
that module in ``fedpriv/algorithms/__init__.py`` (``dpals_uniform.py`` is the example). The
built-in members register in :mod:`fedpriv.algorithms.family`.

A spec carries the algorithm's whole interface:

- its config keys (which the strict parser accepts for it and refuses for the others);
- its release plan: the pre-processing releases (``needs_user_count``, ``centred`` for the mean,
  ``needs_counts``) and ``step_releases``, the releases of one alternating step with their
  budget shares; the accountant composes them (:func:`fedpriv.algorithms.als.plan_releases`);
- its client step, aggregator step and server step: the :class:`~fedpriv.algorithms.steps.
  AlternatingStep` named by ``step`` ("module:attribute", imported on first use, so that the
  registry and the configs load without torch);
- ``contribution``, the wire form of a client's step contribution, which the codec validates.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, fields

from ..errors import ConfigError, did_you_mean
from .releases import stats_releases


@dataclass(frozen=True)
class AlgorithmSpec:
    """What the engines know of one algorithm.

    ``rating_weights(shard, state)``: the per-rating weights of a shard's users, with
    sum_i w_ij^2 <= beta for every user (computed on the client, from public values and the
    user's own secret randomness). It reads only the shard, the configuration, the released
    counts and omega: a shard keeps its weights for the run (:func:`fedpriv.algorithms.als.client_rating_weights`).
    ``keys``: the configuration keys that only some algorithms
    read and this one does (any other algorithm refuses them). ``step_releases(cfg, share)``:
    the releases of one alternating step, ``share`` being the step's part of the budget.
    ``contribution``: 'stats' (per-item A, b), 'convex' (per-item H, g), 'gradient' (item
    rows) or 'flat' (a parameter vector of the encoder that the clients rebuild).
    ``adaptive``: the server derives the weights omega from the released counts (eq. 12).
    ``encoder``: the item side is an encoder over public item features.
    """

    name: str
    rating_weights: Callable
    private: bool = True
    # what it is for, one of :data:`TASKS`: its group in the model table (``fedpriv run --help``),
    # whether it predicts ratings (a top-k model ranks items only) and the verdict of its runs
    task: str = "ratings"
    needs_counts: bool = False
    needs_user_count: bool = False
    keys: tuple[str, ...] = ()
    summary: str = ""
    step: object = "fedpriv.algorithms.steps:ITEM_STATS"  # a step object, or "module:attribute"
    step_releases: Callable = stats_releases
    contribution: str = "stats"
    centred: bool = True
    implicit_targets: bool = False  # every rating is the target 1 (implicit feedback from explicit ratings: ials)
    adaptive: bool = False
    encoder: bool = False
    bias_column: bool = False  # the contribution rows always carry the bias coordinate (DP-SGD)
    resamples: Callable | None = None  # cfg -> independent noisings of a step's statistics (SSP1)
    defaults: tuple[tuple[str, str], ...] = ()  # config values this algorithm starts from (overrides win)
    fixed: tuple[str, ...] = ()  # config keys of ``defaults`` an override may not change
    bias_model: bool = (
        False  # the private bias model itself: the noise-aware rule sets its ridge, clip and feature prior only
    )
    setup_only: bool = False  # the setup releases are the whole run (no alternating step: popular)
    # the algorithm's own config keys as a dataclass (``cfg.options`` holds the parsed instance;
    # its ``validate()`` runs with the config's); the shared keys stay in ALSConfig
    options: type | None = None
    # its typed configuration class (fedpriv.algorithms.typed): registering names the class
    typed: type | None = None
    # an algorithm with a noise-aware rule of its own (``choose(epsilon, delta, n_items, n_users,
    # *, relation)`` -> values, ``explain(cfg, epsilon, delta, n_items, n_users, *, relation)`` ->
    # text; ``relation``: the neighbouring relation of the run): the rule of
    # fedpriv.algorithms.defaults defers to it (topk)
    rule: object | None = None
    # its own ranking score ``(shard, state, candidates) -> (users, candidates)`` for top-k lists
    # (fedpriv.algorithms.ranking.ranking_scores defers to it), else the family's blend
    ranker: Callable | None = None
    # its ranker reads released values with numpy and scipy alone (never the device kernels, whose
    # device is the calling thread's): the evaluation may then run it on its thread pool
    ranker_any_thread: bool = False
    # its number of alternating steps for a config (default: ``steps``, none when ``setup_only``)
    n_steps: Callable | None = None
    # its own evaluation ``(protocol) -> Evaluation`` (fedpriv.algorithms.evaluations), else the
    # protocol's: rating regression, held-out users, logistic
    evaluation: Callable | None = None

    def steps_of(self, cfg) -> int:
        """The alternating steps a run of this config makes."""
        if self.n_steps is not None:
            return int(self.n_steps(cfg))
        return 0 if self.setup_only else int(cfg.steps)

    def noisings(self, cfg) -> int:
        """Independent noise draws of the item statistics per alternating step (1 unless SSP1)."""
        return 1 if self.resamples is None else int(self.resamples(cfg))

    @property
    def logistic(self) -> bool:
        """The logistic model (binarised ratings; evaluated by log-loss and accuracy)."""
        return self.contribution == "convex"

    @property
    def clients_need_encoder(self) -> bool:
        """The clients rebuild the encoder from the public feature table."""
        return self.contribution == "flat"

    @property
    def option_keys(self) -> frozenset[str]:
        """The keys of the algorithm's own options dataclass (empty without one)."""
        return frozenset(f.name for f in fields(self.options)) if self.options is not None else frozenset()

    def alternating_step(self):
        """The algorithm's :class:`~fedpriv.algorithms.steps.AlternatingStep`: the step object
        itself, or the one named "module:attribute" (imported now)."""
        if not isinstance(self.step, str):
            return self.step
        module, _, attr = self.step.partition(":")
        return getattr(importlib.import_module(module), attr)


_SPECS: dict[str, AlgorithmSpec] = {}

# the ALS family's private members start from the private bias model and let the rule of
# fedpriv.algorithms.defaults choose what is not set (``--set defaults=fixed`` turns it off)
NOISE_AWARE = (("defaults", "noise-aware"), ("bias_stage", "true"))
# the encoder family and DP-SGD: the rule falls back to the bias model while the signal is too
# weak for them (issue 34), and leaves their own settings above it
FALL_BACK = (("defaults", "noise-aware"),)


#: wire forms of a step contribution; 'parts' is the generic one: the node's sums of the step's
#: declared parts (:meth:`fedpriv.algorithms.steps.AlternatingStep.parts`), dense, each bounded by
#: the node's users times its release's declared sensitivity
_CONTRIBUTIONS = ("stats", "convex", "gradient", "flat", "parts")


#: release name -> its per-user L2 sensitivity, ``fn(cfg, rating_range) -> float``: every release
#: declares its own (the built-in ones in fedpriv.algorithms.als; an algorithm with a release of
#: its own registers it next to its spec)
_SENSITIVITIES: dict[str, Callable] = {}


def register_release(name: str, sensitivity: Callable) -> Callable:
    """Declare release ``name`` and its sensitivity function; a name declared twice is an error."""
    if name in _SENSITIVITIES and _SENSITIVITIES[name] is not sensitivity:
        raise ValueError(f"release {name!r} is declared twice")
    _SENSITIVITIES[name] = sensitivity
    return sensitivity


def release_sensitivity(name: str, cfg, rating_range) -> float:
    """The declared per-user L2 sensitivity of release ``name`` (KeyError: an undeclared release)."""
    return float(_SENSITIVITIES[name](cfg, tuple(rating_range)))


def release_names() -> tuple[str, ...]:
    return tuple(_SENSITIVITIES)


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec``; a name registered twice is an error."""
    if spec.task not in TASKS:
        raise ValueError(f"algorithm {spec.name!r}: task must be one of {tuple(TASKS)}, got {spec.task!r}")
    if spec.contribution not in _CONTRIBUTIONS:
        raise ValueError(
            f"algorithm {spec.name!r}: contribution must be one of {_CONTRIBUTIONS}, got {spec.contribution!r}"
        )
    if spec.name in _SPECS:
        raise ValueError(f"algorithm {spec.name!r} is registered twice")
    if spec.typed is not None:
        if spec.typed.name not in ("", spec.name):
            raise ValueError(
                f"algorithm {spec.name!r}: {spec.typed.__name__} is already the typed configuration of "
                f"{spec.typed.name!r}"
            )
        spec.typed.name = spec.name
    _SPECS[spec.name] = spec
    return spec


def get(name: str) -> AlgorithmSpec:
    """The spec of ``name``; an unknown name is a ConfigError listing the known ones."""
    try:
        return _SPECS[name]
    except KeyError:
        raise ConfigError(
            f"unknown algorithm {name!r} (known: {', '.join(_SPECS)}){did_you_mean(name, _SPECS)}", field="algorithm"
        ) from None


def names() -> tuple[str, ...]:
    """Every registered algorithm, in registration order."""
    return tuple(_SPECS)


def readers(key: str) -> tuple[str, ...] | None:
    """The algorithms that read ``key`` when only some do, else None (a key every one reads)."""
    found = tuple(name for name, spec in _SPECS.items() if key in spec.keys or key in spec.option_keys)
    return found or None


# ------------------------------------------------------------------------------ tasks and the model table
#: task -> (its group in the model table, the models predict ratings). A reference or baseline
#: ("reference: ...") serves its task and is grouped apart: compare with it, do not deploy it.
TASKS: dict[str, tuple[str, bool]] = {
    "ratings": ("rating prediction", True),
    "top-k": ("top-k", False),
    "personalization": ("personalization", False),
    "reference: ratings": ("references and baselines", True),
    "reference: top-k": ("references and baselines", False),
    "reference: personalization": ("references and baselines", False),
}
GROUPS = ("rating prediction", "top-k", "personalization", "references and baselines")

#: the personalization algorithms (fedpriv.algorithms.pam, on synthetic-personal data): they are
#: no AlgorithmSpec (no item model), so their task and summary are declared here
PERSONALIZATION: dict[str, tuple[str, str]] = {
    "pam": (
        "personalization",
        "a private shared subspace by alternating minimization; each user's personal vector stays on its client",
    ),
    "pam-exp": ("personalization", "the exponential mechanism over a net of subspaces (pure DP; small d and k only)"),
    "pam-single-model": (
        "reference: personalization",
        "one private shared regression vector: the shared model, no personalization",
    ),
    "pam-own-data": ("reference: personalization", "each user's own ridge regression, nothing shared"),
    "pam-nonprivate": ("reference: personalization", "pam without noise: the non-private upper reference"),
}


def task_of(name: str) -> str:
    """The task of algorithm ``name`` (a key of :data:`TASKS`)."""
    if name in PERSONALIZATION:
        return PERSONALIZATION[name][0]
    return get(name).task


def kind_of(task: str) -> str:
    """What a task's models do, reference or not: "ratings", "top-k" or "personalization"."""
    return task.rpartition(": ")[2]


def predicts_ratings(name: str) -> bool:
    """The models of ``name`` predict ratings (a top-k or personalization model does not)."""
    return TASKS[task_of(name)][1]


def is_personalization(task: str) -> bool:
    """A personalization task (reference or not): its models are judged on test MSE."""
    return kind_of(task) == "personalization"


def is_reference(task: str) -> bool:
    """A reference or baseline task: compare with it, do not deploy it."""
    return task.startswith("reference: ")


#: personalization models that are themselves one shared model (their verdict's reference is the zero predictor)
SHARED_MODELS = ("pam-single-model",)


def is_shared_model(name: str) -> bool:
    """``name`` fits one model for every user (no personalization)."""
    return name in SHARED_MODELS
