"""What an engine is: :class:`Engine` trains a prepared plan and returns :class:`Trained` (the
released state, the ledger, the timings, and what the engine measured itself: a Flower run's
node-side evaluation, its nodes, rounds and bytes). Evaluation, accounting and ``metrics.json``
are the run layer's (:mod:`fedpriv.run.execute`), the same for every engine; an engine is never
asked which engine it is (it declares what it honours instead)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..privacy.ledger import PrivacyLedger
    from ..privacy.randomness import RunSecrets
    from .inputs import RunOptions

#: run options that only some engines honour (given to another, refused, never ignored): who honours them
ENGINE_ONLY_OPTIONS = {
    "round_timeout": "the Flower engines",
    "node_wait": "the Flower engines",
    "users_per_shard": "the in-process engine",
}


@dataclass
class Trained:
    """One trained run. ``measured``: the held-out measurements the engine made (``on_nodes``:
    the nodes measured the held-out ratings, so the plan's evaluation adds only what the released
    model gives here); ``counters``: nodes, rounds, bytes, rejected replies; ``after``: keys
    ``metrics.json`` shows after the evaluation (a tuning's report)."""

    state: Any  # PublicState, or PAMState of a personalization run
    ledger: PrivacyLedger
    timings: dict
    measured: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    on_nodes: bool = False
    recommendation: dict | None = None
    rec_ledger: PrivacyLedger | None = None
    after: dict = field(default_factory=dict)
    users_per_node: int | None = None  # a personalization run's node size, as its config reports it


def given_options(**values) -> dict:
    """The run options an engine object sets: those given (None leaves the job's value)."""
    return {key: value for key, value in values.items() if value is not None}


#: ``train_candidate(cfg, multipliers, secrets, clip, index) -> (result, run ledger, exact score sum)``
CandidateRunner = Callable[..., tuple]


class Engine:
    """Trains a plan of each kind. ``name``: what ``metrics.json`` calls the engine; ``honours``:
    the engine-only run options (:data:`ENGINE_ONLY_OPTIONS`) it honours; ``nodes_see_every_run``:
    other parties see every run of a private tuning (its epsilon must cover them all)."""

    name: ClassVar[str] = "inprocess"
    honours: ClassVar[frozenset[str]] = frozenset()
    nodes_see_every_run: ClassVar[bool] = False
    work_dir = None

    def run_options(self) -> dict[str, Any]:
        """The run options this engine object sets (users per shard or node, nodes, timeouts)."""
        return {}

    def check_options(self, options) -> None:
        """ConfigError naming the first engine-only option given (a non-default value) that this
        engine cannot honour."""
        from .inputs import RunOptions

        defaults = RunOptions()
        for key, owner in ENGINE_ONLY_OPTIONS.items():
            value = options.get(key)
            if value is None or key in self.honours:
                continue
            try:
                unchanged = float(value) == float(getattr(defaults, key))
            except (TypeError, ValueError):
                unchanged = False
            if not unchanged:
                raise ConfigError(f"applies to {owner} only; the {self.name} engine cannot honour it", field=key)

    def layout(self, opts: RunOptions, plan, secure: bool) -> RunOptions:
        """``opts`` with the run's node layout resolved (every later use reads it back)."""
        return opts

    def train(self, plan, cfg, opts: RunOptions, secrets: RunSecrets, *, progress: bool = False) -> Trained:
        raise NotImplementedError

    def train_server(self, plan, cfg, opts: RunOptions, secrets: RunSecrets, *, progress: bool = False) -> Trained:
        """A partitioned deployment's server (no ratings here)."""
        raise ConfigError(
            "public:DIR holds no ratings: it is the server side of a partitioned deployment (--engine flower)",
            field="--data",
        )

    def train_personal(self, plan, secrets: RunSecrets, *, progress: bool = False) -> Trained:
        raise NotImplementedError

    def check_tuning(self, cfg) -> None:
        """ConfigError when a private tuning cannot run on this engine with ``cfg``."""

    def tuning_candidates(self, plan, opts: RunOptions) -> tuple[CandidateRunner, Callable[[], None]]:
        """(one tuning run on this engine, cleanup): :func:`fedpriv.run.tuning.tune` draws and selects."""
        raise NotImplementedError

    def selected(self, result, ledger: PrivacyLedger, plan, opts: RunOptions) -> Trained:
        """The tuning's selected run as a trained run of this engine."""
        raise NotImplementedError

    def execute(self, plan, *, progress: bool = False, second_opinion: bool = True):
        """Train ``plan`` and measure it: the :class:`~fedpriv.run.report.Outcome`
        (:func:`fedpriv.run.execute.execute`; engines that run the whole job elsewhere, as
        ``flwr run`` does, override this)."""
        return plan.execute_here(self, progress=progress, second_opinion=second_opinion)
