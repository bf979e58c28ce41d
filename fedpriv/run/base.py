"""What an engine is: :class:`Engine` trains a prepared plan, of any family, and returns
:class:`Trained` (the released state, the ledger, the timings, and what the engine measured
itself: a Flower run's node-side evaluation, its nodes, rounds and bytes). Evaluation,
accounting and ``metrics.json`` are the run layer's (:mod:`fedpriv.run.execute`), the same for
every engine; an engine is never asked which engine it is (it declares what it honours).

An engine has four methods: :meth:`~Engine.layout` (the run's nodes), :meth:`~Engine.train`,
:meth:`~Engine.tuning_candidates` (one private-tuning run at a time) and
:meth:`~Engine.execute`. Its options are its dataclass fields (:func:`engine_options`). A ``plan`` here is a
:class:`fedpriv.run.job.Plan` (typed ``Any``: this module is below the plan's), and
:meth:`Engine.execute` returns its :class:`~fedpriv.run.report.Outcome`."""

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
    ``metrics.json`` shows after the evaluation (a tuning's report); ``options``: the run options
    as the engine ended the run (a layout it adapted to the nodes that registered)."""

    state: Any  # the family's released public state
    ledger: PrivacyLedger
    timings: dict
    measured: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    on_nodes: bool = False
    recommendation: dict | None = None
    rec_ledger: PrivacyLedger | None = None
    after: dict = field(default_factory=dict)
    users_per_node: int | None = None  # a block family's node size, as its config reports it
    options: RunOptions | None = None


@dataclass(frozen=True)
class Candidates:
    """What an engine gives a private tuning (:func:`fedpriv.run.tuning.tune` draws and selects):
    ``run(cfg, multipliers, secrets, clip, index) -> (result, run ledger, exact score sum)``,
    ``selected(result, ledger) -> Trained`` (the selected run as a trained run of the engine) and
    ``cleanup()``."""

    run: Callable[..., tuple]
    selected: Callable[[Any, Any], Trained]
    cleanup: Callable[[], None] = lambda: None


def engine_options(engine: Engine) -> dict[str, Any]:
    """The run options an engine object sets: its fields named in ``sets`` that were given (not None)."""
    return {key: getattr(engine, key) for key in engine.sets if getattr(engine, key, None) is not None}


def check_options(engine: Engine, options: dict) -> None:
    """ConfigError naming the first engine-only option given (a non-default value) that
    ``engine`` cannot honour."""
    from .inputs import RunOptions

    defaults = RunOptions()
    for key, owner in ENGINE_ONLY_OPTIONS.items():
        value = options.get(key)
        if value is None or key in engine.honours:
            continue
        try:
            unchanged = float(value) == float(getattr(defaults, key))
        except (TypeError, ValueError):
            unchanged = False
        if not unchanged:
            raise ConfigError(f"applies to {owner} only; the {engine.name} engine cannot honour it", field=key)


class Engine:
    """Trains a plan of any family. ``name``: what ``metrics.json`` calls the engine; ``sets``:
    the run options its fields set; ``honours``: the engine-only run options
    (:data:`ENGINE_ONLY_OPTIONS`) it honours; ``nodes_see_every_run``: other parties see every
    run of a private tuning (its epsilon must cover them all)."""

    name: ClassVar[str] = "inprocess"
    sets: ClassVar[tuple[str, ...]] = ()
    honours: ClassVar[frozenset[str]] = frozenset()
    nodes_see_every_run: ClassVar[bool] = False

    def layout(self, opts: RunOptions, plan: Any) -> RunOptions:
        """``opts`` with the run's node layout resolved (every later use reads it back)."""
        return opts

    def train(self, plan: Any, opts: RunOptions, secrets: RunSecrets, *, progress: bool = False) -> Trained:
        """Train ``plan`` (its config, its data here or on the nodes) with the options ``opts``."""
        raise NotImplementedError

    def tuning_candidates(self, plan: Any, opts: RunOptions) -> Candidates:
        """One private-tuning run at a time on this engine (ConfigError when the plan's
        tuning cannot run here)."""
        raise ConfigError(f"private tuning does not run on the {self.name} engine", field="tune")

    def execute(self, plan: Any, *, progress: bool = False, second_opinion: bool = True) -> Any:
        """Train ``plan`` and measure it: the :class:`~fedpriv.run.report.Outcome`
        (:func:`fedpriv.run.execute.execute`; engines that run the whole job elsewhere, as
        ``flwr run`` does, override this)."""
        return plan.execute_here(self, progress=progress, second_opinion=second_opinion)
