"""One run as objects: a :class:`Job` says what to run, :meth:`Job.prepare` checks it, loads and
splits the data and returns a frozen :class:`Plan` (no training, no exception used for control),
and :meth:`Plan.execute` trains it on an engine (:mod:`fedpriv.run.engines`) and returns an
:class:`Outcome`: the typed :class:`~fedpriv.run.report.RunReport`, the ledger records and the
released model.

    from fedpriv.run import Job, InProcess, FlowerSimulation

    plan = Job("adadpals", "ml-100k:PATH", epsilon=5.0, params={"rank": 8}).prepare()
    plan.partitions(users_per_node=20)       # the nodes a Flower run needs
    plan.budget().to_markdown()              # the calibrated budget plan
    out = plan.execute(InProcess())          # or FlowerSimulation(users_per_node=20), FlwrRun(), FlowerGrid(grid)
    out.report.summary(); out.ledger; out.model

Every entry point goes through here: the command line, :func:`fedpriv.train`, the ``flwr run``
ServerApp, the launcher and deployments, tuning and the experiments. Values stay typed: ``params``
holds hyperparameters and run options as Python values (``{"rank": 8, "aggregation":
"secure"}``); only the command line and the run-config reader hold strings."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from . import core

if TYPE_CHECKING:
    from ..privacy.plan import BudgetPlan
    from .engines import Engine
    from .report import Outcome


@dataclass(frozen=True)
class Job:
    """What to run: an algorithm, its data, its privacy target and its parameters.

    ``algorithm``: a name (``"adadpals"``) or a typed configuration
    (``AdaDPALS(rank=8, mu=0.25)``, :mod:`fedpriv.algorithms.typed`), whose given keys join
    ``params`` (a key in both is an error naming it).

    ``data``: a spec string (``"ml-100k:PATH"``, ``"csv:PATH"``, ``"synthetic-mf:..."``), a
    :class:`~fedpriv.data.spec.DataSpec`, a loaded :class:`~fedpriv.data.loaders.Dataset` or a
    pandas DataFrame; ``data_options``: the csv/parquet options of a spec string, or the
    DataFrame's columns and catalogue. ``params``: hyperparameters of the algorithm and run
    options (split, tuning, recommendation), typed. ``noise_seed``: reproducible noise (privacy
    then holds only against those who know not the seed); by default the noise is secret.
    ``dataset``: the loaded data of a spec (skips loading it again)."""

    algorithm: str  # a name, or a typed configuration (fedpriv.algorithms.typed): its name is kept
    data: Any
    epsilon: float | None = None
    delta: float = 1e-5
    noise_seed: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    data_options: Mapping[str, Any] = field(default_factory=dict)
    dataset: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        params = dict(self.params or {})
        if not isinstance(self.algorithm, str):  # a typed configuration (fedpriv.algorithms.typed)
            algorithm, params = typed_params(self.algorithm, params)
            object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "params", MappingProxyType(params))
        object.__setattr__(self, "data_options", MappingProxyType(dict(self.data_options or {})))

    def prepare(self) -> Plan:
        """Validate, load, split: the frozen :class:`Plan` (raises ConfigError/DataError)."""
        return Plan(job=self, **core.load_and_check(self))


@dataclass(frozen=True)
class Plan:
    """A checked job with its data loaded and split, ready to run on any engine."""

    job: Job
    spec: Any  # DataSpec
    dataset: Any  # Dataset, PublicData (a deployment's server) or PersonalData
    private: bool
    options: Any  # RunOptions (None for the personalization algorithms)
    config: Any  # ALSConfig or PAMConfig, before the noise-aware rule (which needs a release)
    protocol: str  # "random", "heldout" or "personalization"
    split: Any  # RandomSplit / HeldoutSplit, or None (a deployment's server, personalization)
    rating_range: tuple[float, float] | None
    implicit: bool
    recommend: Any  # RecommendConfig or None
    public: Any  # PublicData of a deployment's server, or None
    engine_params: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def algorithm(self) -> str:
        return self.job.algorithm

    @property
    def n_users(self) -> int:
        """Users of the federation (the training users; a deployment's enrolled users)."""
        if self.public is not None:
            return int(self.public.n_users)
        if self.split is None:
            return int(self.dataset.n_users)
        return int(self.split.train.n_users)

    def partitions(self, users_per_node: int) -> int:
        """The number of nodes that hold ``users_per_node`` users each."""
        if users_per_node < 1:
            raise ValueError("users_per_node must be >= 1")
        return -(-self.n_users // users_per_node)

    def budget(self) -> BudgetPlan | None:
        """The calibrated budget plan (every release with its share, multiplier and
        sensitivity) of a private run, before the noise-aware rule; None when non-private.
        Raises ConfigError/PrivacyError when the target cannot be met."""
        if not self.private:
            return None
        if self.protocol == "personalization":
            from ..algorithms import pam

            data = self.dataset
            pam.new_pam_state(self.algorithm, self.config, data.d, data.k, data.samples, self.job.epsilon, self.job.delta)
            return None
        from ..algorithms.plans import budget_plan

        return budget_plan(self.algorithm, self.config, self.job.epsilon, self.job.delta, implicit=self.implicit, rating_range=self.rating_range)

    def check_budget(self) -> None:
        """The privacy calibration alone (what a Flower run checks before it starts): raises
        ConfigError/PrivacyError when (epsilon, delta) cannot be met."""
        if not self.private or self.job.epsilon is None:
            return
        if self.protocol == "personalization":
            self.budget()
            return
        from ..algorithms import als

        als.calibrate_plan(self.algorithm, self.config, self.implicit, self.job.epsilon, self.job.delta)

    def execute(self, engine: Engine | None = None, *, progress: bool = False, second_opinion: bool = True) -> Outcome:
        """Train on ``engine`` (default :class:`~fedpriv.run.engines.InProcess`) and evaluate."""
        from .engines import InProcess

        engine = engine if engine is not None else InProcess()
        return engine.execute(self, progress=progress, second_opinion=second_opinion)


def typed_params(config: Any, params: dict) -> tuple[str, dict]:
    """(name, params) of a typed algorithm configuration joined with ``params``."""
    from ..algorithms.typed import AlgorithmConfig
    from ..errors import ConfigError

    if not isinstance(config, AlgorithmConfig):
        raise ConfigError(f"expected an algorithm name or a typed configuration (fedpriv.algorithms.typed), got {type(config).__name__}", field="algorithm")
    try:
        given = config.params()
    except ValueError as exc:
        raise ConfigError(str(exc), field="algorithm") from None
    both = sorted(set(given) & set(params))
    if both:
        raise ConfigError(f"given both in {type(config).__name__}(...) and as a parameter", field=both[0])
    return config.name, {**given, **params}
