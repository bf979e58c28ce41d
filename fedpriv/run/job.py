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

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, cast

from ..algorithms import registry
from ..algorithms.families import Family, FamilyConfig, FamilyData, families, family_of
from ..algorithms.evaluations import evaluation_for
from ..data.spec import HELDOUT_KINDS, load_spec, require_declared_catalogue
from ..data.splits import heldout_users_split, random_split
from ..errors import ConfigError
from ..privacy.target import ADD_REMOVE, Privacy, check_relation
from .inputs import RunOptions, check_privacy_target, resolve_data

if TYPE_CHECKING:
    from ..algorithms.evaluations import Evaluation
    from ..algorithms.recommend import RecommendConfig
    from ..data.loaders import Dataset
    from ..data.public import PublicData
    from ..data.spec import DataSpec
    from ..data.splits import HeldoutSplit, RatingSplit
    from ..privacy.plan import BudgetPlan
    from .engines import Engine
    from .execute import Finished
    from .model import Model, PersonalModel
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
    ``relation``: the neighbouring relation every epsilon holds under (``"add_remove"``, or
    ``"replace_one"`` where the user count is public, as in a deployment): calibration, the
    noise-aware rule and ``metrics.json`` read it from the job, on every engine.
    ``dataset``: the loaded data of a spec (skips loading it again)."""

    algorithm: str  # a name, or a typed configuration (fedpriv.algorithms.typed): its name is kept
    data: Any
    epsilon: float | None = None
    delta: float = 1e-5
    noise_seed: int | None = None
    relation: str = ADD_REMOVE
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

    @property
    def privacy(self) -> Privacy:
        """The privacy target: (epsilon, delta), the relation and the noise seed."""
        return Privacy(self.epsilon, self.delta, self.relation, self.noise_seed)

    def prepare(self) -> Plan:
        """Validate, load, split: the frozen :class:`Plan` of the job's kind (raises
        ConfigError/DataError)."""
        return prepare_plan(self)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A checked job with its data loaded, ready to run on any engine: one kind for every family
    and place. ``family``: the algorithm's :class:`~fedpriv.algorithms.families.Family`;
    ``here``: the data is held here (False: the server of a partitioned deployment, whose
    ratings stay on the nodes); ``protocol`` is what ``metrics.json`` calls the split;
    ``evaluation`` measures the trained state (:mod:`fedpriv.algorithms.evaluations`), chosen
    once by :func:`prepare_plan`; ``options``: the run options (split, tuning, recommendation,
    node layout). ``split``, ``rating_range``, ``implicit`` and ``recommend`` belong to the
    rating family's plans held here (None otherwise)."""

    job: Job
    spec: DataSpec
    family: Family
    private: bool
    protocol: str
    evaluation: Evaluation
    dataset: Dataset | PublicData | FamilyData  # a deployment's server holds PublicData; a block family, its own
    config: FamilyConfig  # the algorithm's configuration, of the family's type
    options: RunOptions
    here: bool = True
    split: RatingSplit | HeldoutSplit | None = None
    rating_range: tuple[float, float] | None = None
    implicit: bool = False
    recommend: RecommendConfig | None = None

    @property
    def algorithm(self) -> str:
        return self.job.algorithm

    @property
    def relation(self) -> str:
        """The neighbouring relation every epsilon of the run holds under."""
        return self.job.relation

    @property
    def n_users(self) -> int:
        """Users of the federation (the training users; a deployment's enrolled users)."""
        if self.split is not None:
            return int(self.split.train.n_users)
        return int(self.family.n_users(self.dataset))

    @property
    def public(self) -> PublicData | None:
        """A deployment server's public data (None when the data is held here)."""
        return None if self.here else cast("PublicData", self.dataset)

    def partitions(self, users_per_node: int) -> int:
        """The number of nodes that hold ``users_per_node`` users each."""
        if users_per_node < 1:
            raise ValueError("users_per_node must be >= 1")
        return -(-self.n_users // users_per_node)

    def budget(self) -> BudgetPlan | None:
        """The calibrated budget plan (every release with its share, multiplier and
        sensitivity) of a private rating run, before the noise-aware rule; None when
        non-private, or for a block family (whose plan is checked). Raises
        ConfigError/PrivacyError when the target cannot be met."""
        if not self.private:
            return None
        return self.family.budget(self)

    def check_budget(self) -> None:
        """The privacy calibration alone (what a Flower run checks before it starts): raises
        ConfigError/PrivacyError when (epsilon, delta) cannot be met."""
        if not self.private or self.job.epsilon is None:
            return
        self.family.check_budget(self)

    def execute(self, engine: Engine | None = None, *, progress: bool = False, second_opinion: bool = True) -> Outcome:
        """Train on ``engine`` (default :class:`~fedpriv.run.engines.InProcess`) and evaluate."""
        from .engines import InProcess

        engine = engine if engine is not None else InProcess()
        return engine.execute(self, progress=progress, second_opinion=second_opinion)

    def execute_here(self, engine: Engine, *, progress: bool = False, second_opinion: bool = True) -> Outcome:
        """Train on ``engine`` in this process and measure (:func:`fedpriv.run.execute.execute`)."""
        from .execute import execute

        return execute(self, engine, progress=progress, second_opinion=second_opinion)

    def released_model(self, done: Finished) -> Model | PersonalModel | None:
        """The released model of a finished run (None when nothing shared was released)."""
        from .model import released_model

        return released_model(self, done)


@dataclass(frozen=True)
class SplitProtocol:
    """How a rating run splits and what it supports: ``make(interactions, options, spec,
    dataset)`` -> the split; ``implicit``: the held-out protocol trains on implicit feedback."""

    name: str
    make: Callable
    implicit: bool
    recommends: bool  # the private recommendation phase (hits on held-out ratings)
    tunes: bool  # private tuning (validation MSE)


def _random(inter, opts: RunOptions, spec, ds):
    return random_split(inter, seed=opts.split_seed)


def _heldout(inter, opts: RunOptions, spec, ds):
    frac = opts.heldout_fraction or (0.0722 if spec.kind in ("ml-20m", "ml-25m") else 0.1)
    threshold = None if ds.implicit else 3.5
    return heldout_users_split(
        inter, valid_fraction=frac, test_fraction=frac, positive_threshold=threshold, seed=opts.split_seed
    )


RANDOM = SplitProtocol("random", _random, implicit=False, recommends=True, tunes=True)
HELDOUT = SplitProtocol("heldout", _heldout, implicit=True, recommends=False, tunes=False)
#: the ``split`` option's protocols (``auto`` picks one by data set: :func:`split_protocol`)
PROTOCOLS = {p.name: p for p in (RANDOM, HELDOUT)}


def split_protocol(option: str, spec, ds) -> SplitProtocol:
    """The protocol of the ``split`` option: held-out users for implicit data and the large
    MovieLens sets when ``auto``, else the random split."""
    if option in PROTOCOLS:
        return PROTOCOLS[option]
    return HELDOUT if (ds.implicit or spec.kind in HELDOUT_KINDS) else RANDOM


def prepare_plan(job):
    """The checked plan of ``job`` (see the module docstring)."""
    family = family_of(job.algorithm)
    algorithm = job.algorithm
    private = family.private(algorithm)
    if private and job.epsilon is None:
        raise ConfigError(f"algorithm {algorithm!r} is private: give --epsilon", field="--epsilon")
    if private:
        check_privacy_target(job.epsilon, job.delta)
    if job.noise_seed is not None and (isinstance(job.noise_seed, bool) or not isinstance(job.noise_seed, int)):
        raise ConfigError(f"must be an integer, got {job.noise_seed!r}", field="--noise-seed")
    check_relation(job.relation, field="relation")
    spec, ds = resolve_data(job.data, job.data_options)
    if job.dataset is not None:
        ds = job.dataset
    if family.blocks:
        return _block_plan(job, family, spec, ds, private)
    overrides = dict(job.params)
    opts = RunOptions.pop_from(overrides)
    cfg = family.parse(overrides, algorithm)
    generated = [a for f in families() if f.server_generates_data for a in f.algorithms()]
    if spec.kind == "synthetic-personal":
        raise ConfigError(
            f"{algorithm!r} trains on ratings; synthetic-personal data is for {', '.join(generated)}", field="--data"
        )
    ds = ds if ds is not None else load_spec(spec)
    if ds.interactions is None:  # a partitioned deployment's public folder: the server holds no ratings
        return _server_plan(job, family, spec, ds, private, opts, cfg)
    return _ratings_plan(job, family, spec, ds, private, opts, cfg, overrides)


#: the run options a block family's job takes (its node layout; the others are the rating family's)
BLOCK_OPTIONS = ("users_per_node", "users_per_shard", "nodes")


def _block_plan(job, family, spec, ds, private: bool) -> Plan:
    """A block family's plan: its own data and config; of the run options, the node layout."""
    overrides = dict(job.params)
    opts = RunOptions.pop_from({k: overrides.pop(k) for k in BLOCK_OPTIONS if k in overrides})
    data = family.load(spec, ds, job.algorithm)
    cfg = family.parse(overrides, job.algorithm)
    return Plan(
        job=job,
        spec=spec,
        family=family,
        private=private,
        protocol=family.protocol,
        evaluation=family.evaluation(cfg),
        dataset=data,
        config=cfg,
        options=opts,
    )


def _server_plan(job, family, spec, public, private: bool, opts: RunOptions, cfg) -> Plan:
    given = PROTOCOLS.get(opts.split)  # None: auto
    if PROTOCOLS.get(public.protocol) is not RANDOM or given not in (None, RANDOM):
        raise ConfigError(
            f"a partitioned deployment evaluates on the nodes with the random split; got "
            f"{opts.split if given is not None else public.protocol!r}",
            field="split",
        )
    if opts.tune:
        raise ConfigError("private tuning runs on the in-process engine", field="tune")
    if opts.split_seed != RunOptions.split_seed and opts.split_seed != public.split_seed:
        raise ConfigError(f"the nodes split with the partition's public seed {public.split_seed}", field="split_seed")
    rating_range = (0.0, 1.0) if public.implicit else tuple(public.rating_range)
    rec_cfg = opts.recommend_config() if opts.recommend else None
    return Plan(
        job=job,
        spec=spec,
        family=family,
        here=False,
        private=private,
        protocol=RANDOM.name,
        evaluation=evaluation_for("deployment", None, cfg),
        dataset=public,
        options=opts,
        config=cfg,
        rating_range=rating_range,
        implicit=public.implicit,
        recommend=rec_cfg,
    )


def _ratings_plan(job, family, spec, ds, private: bool, opts: RunOptions, cfg, overrides: dict) -> Plan:
    algorithm = job.algorithm
    # a private run needs an item catalogue that does not depend on the ratings (before any training)
    if registry.get(algorithm).private:
        require_declared_catalogue(ds, spec, f"algorithm {algorithm!r}")
    elif opts.recommend:
        require_declared_catalogue(ds, spec, f"the private recommendation (recommend={opts.recommend})")
    protocol = split_protocol(opts.split, spec, ds)
    split = protocol.make(ds.interactions, opts, spec, ds)
    implicit = protocol.implicit or ds.implicit
    if protocol.implicit and cfg.gravity == 0 and "gravity" not in overrides:
        cfg = replace(cfg, gravity=0.1)
    lo, hi = (0.0, 1.0) if implicit else (float(ds.rating_range[0]), float(ds.rating_range[1]))
    rating_range = (lo, hi)
    rec_cfg = opts.recommend_config() if opts.recommend else None
    if rec_cfg is not None and (not protocol.recommends or opts.tune):
        raise ConfigError(
            "private recommendation runs after training on the random split (hits on held-out ratings), without tuning",
            field="recommend",
        )
    if opts.tune and (not protocol.tunes or not private):
        raise ConfigError(
            "private tuning runs with a private algorithm on the in-process engine and the random split (RMSE)",
            field="tune",
        )
    return Plan(
        job=job,
        spec=spec,
        family=family,
        private=private,
        protocol=protocol.name,
        evaluation=evaluation_for(protocol.name, registry.get(algorithm), cfg),
        dataset=ds,
        options=opts,
        config=cfg,
        split=split,
        rating_range=rating_range,
        implicit=implicit,
        recommend=rec_cfg,
    )


def typed_params(config: Any, params: dict) -> tuple[str, dict]:
    """(name, params) of a typed algorithm configuration joined with ``params``."""
    from ..algorithms.typed import AlgorithmConfig

    if not isinstance(config, AlgorithmConfig):
        raise ConfigError(
            f"expected an algorithm name or a typed configuration (fedpriv.algorithms.typed), got "
            f"{type(config).__name__}",
            field="algorithm",
        )
    try:
        given = config.params()
    except ValueError as exc:
        raise ConfigError(str(exc), field="algorithm") from None
    both = sorted(set(given) & set(params))
    if both:
        raise ConfigError(f"given both in {type(config).__name__}(...) and as a parameter", field=both[0])
    return config.name, {**given, **params}
