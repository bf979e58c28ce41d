"""The families of algorithms, one object each, in one catalogue: every layer asks the family of
an algorithm (:func:`family_of`) what it needs to know, and never compares a name.

A :class:`Family` answers what the layers ask of it: its algorithms and which are private, its
configuration type (frozen; parsed from overrides), the data it trains on, a new public state
and ledger, its rounds (the protocol the one loop drives, :mod:`fedpriv.algorithms.rounds`) and
what its run reports.

Two kinds of family exist:

- the rating family (:mod:`fedpriv.algorithms.ratings`): its members register an
  :class:`~fedpriv.algorithms.registry.AlgorithmSpec`; its engines (user shards in process, the
  rating ServerApp on Flower) are its own, as are its splits, tuning and recommendation;
- *block families* (DP model personalization, :mod:`fedpriv.algorithms.pam`, and any family a
  user adds): each node holds a block of users, and the family declares the few functions below
  (:class:`Family`'s block contract). The generic engines drive them: in process
  (:mod:`fedpriv.engine.blocks`) and on Flower (:mod:`fedpriv.flower.block_server` and the
  node handler of :mod:`fedpriv.flower.block_client`), with the same messages, reply checks,
  node policy and secure aggregation for every such family.

A new block family is one module (a :class:`Family` subclass, its state, config and rounds)
plus :func:`register_family`; nothing else in the package changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from ..errors import ConfigError, did_you_mean


class FamilyConfig(Protocol):
    """What every family's configuration has (its own keys besides): frozen, validated."""

    seed: int
    aggregation: Any  # fedpriv.algorithms.config.Aggregation: central or secure

    def to_dict(self) -> dict: ...


class FamilyData(Protocol):
    """What every family's data has: its users (the federation's)."""

    @property
    def n_users(self) -> int: ...


@dataclass(frozen=True)
class ReplyPart:
    """One array of a node's reply to a round: its name, its length, its bound per user (the
    L2 norm of one user's part; ``inf``: unbounded, a non-private run) and, when every entry of
    one user's part lies in [0, ``entry_range``], that range (an exponential mechanism's scores)."""

    name: str
    length: int
    bound: float
    entry_range: float | None = None


class Family:
    """One family of algorithms. ``name``: what the run's messages and metrics call it.

    The block contract (the generic engines call these; the rating family has engines of its
    own and leaves them unimplemented): ``load``, ``n_users``, ``user_ids``, ``new_state``,
    ``block``, ``client_round``, ``reply_parts``, ``user_groups``, ``eval_sums``,
    ``evaluate_sums``, ``write_node_data``, ``load_block``, ``encode_state``, ``decode_state``,
    ``round_label``, ``report_keys`` and ``references``. The model a run releases is the run
    layer's (:func:`fedpriv.run.model.released_model`)."""

    name: ClassVar[str] = ""
    #: the generic block engines drive this family (False: the family brings its own engines)
    blocks: ClassVar[bool] = True
    #: the ServerApp makes this family's data itself (a simulation's synthetic tasks), so a
    #: deployment needs no data of its own for it
    server_generates_data: ClassVar[bool] = False
    #: what ``metrics.json`` calls the family's split (its ``protocol``)
    protocol: ClassVar[str] = ""

    # ------------------------------------------------------------------ what every layer asks
    def algorithms(self) -> tuple[str, ...]:
        raise NotImplementedError

    def knows(self, algorithm: str) -> bool:
        return algorithm in self.algorithms()

    def private(self, algorithm: str) -> bool:
        """True when the algorithm releases only through the ledger (it needs an epsilon)."""
        raise NotImplementedError

    def parse(self, overrides: dict, algorithm: str) -> Any:
        """The algorithm's frozen configuration from typed overrides (ConfigError naming a key)."""
        raise NotImplementedError

    def budget(self, plan) -> Any:
        """The calibrated budget plan of a private ``plan`` (:class:`fedpriv.run.job.Plan`), or
        None where the family has none to show (a block family: its plan is checked)."""
        self.check_budget(plan)
        return None

    def check_budget(self, plan) -> None:
        """Raises ConfigError/PrivacyError when the plan's (epsilon, delta) cannot be met (no training)."""
        job = plan.job
        self.new_state(plan.algorithm, plan.config, plan.dataset, job.epsilon, job.delta, None, plan.relation)

    def n_users(self, data) -> int:
        """Users of the federation that ``data`` holds (or describes)."""
        return int(data.n_users)

    def describe(self, algorithm: str) -> tuple[str, str]:
        """(task, one-line summary) of an algorithm: its row of the model table."""
        raise NotImplementedError

    def evaluation(self, cfg) -> Any:
        """The :class:`~fedpriv.algorithms.evaluations.Evaluation` of a run held here."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the block contract
    def load(self, spec, dataset, algorithm: str):
        """The family's data of ``spec`` (``dataset``: already loaded, or None); ConfigError
        naming --data when the spec is not of a kind the family trains on."""
        raise NotImplementedError

    def user_ids(self, data) -> np.ndarray:
        """The users' raw ids (their secret keys derive from them)."""
        raise NotImplementedError

    def new_state(self, algorithm: str, cfg, data, epsilon, delta, ledger_seed, relation: str):
        """(public state, ledger) of a run; ``ledger_seed`` None: noise from the OS CSPRNG."""
        raise NotImplementedError

    def block(self, data, users: np.ndarray):
        """The block of ``users`` (indices into ``data``) as a client holds it; ``data`` may be a
        block itself (a node keeps the users of a disjoint schedule's group)."""
        raise NotImplementedError

    def client_round(self, kind: str, block, state) -> tuple:
        """A block's clipped contribution to round ``kind``, in the order of the round's
        declared parts (its rounds' ``declared_parts``)."""
        raise NotImplementedError

    def reply_parts(self, kind: str, state) -> list[ReplyPart]:
        """The arrays of a node's central-mode reply to round ``kind``, with their bounds."""
        raise NotImplementedError

    def part_bounds(self, kind: str, state) -> list[tuple[str, int, float]]:
        """(release, length, per-user L2 sensitivity) of each part of a secure round, from the
        node's own clipping (a node checks the server's plan against it)."""
        raise NotImplementedError

    def user_groups(self, keys: np.ndarray, state) -> np.ndarray | None:
        """Each user's group of a disjoint schedule, drawn from the user's secret key; None:
        every user is in every step."""
        return None

    def eval_sums(self, block, state) -> np.ndarray:
        """A block's evaluation sums (aggregate measurement, no noise)."""
        raise NotImplementedError

    def evaluate_sums(self, sums: np.ndarray, data, state) -> dict:
        """The run's measurements from the summed evaluation sums of every node."""
        raise NotImplementedError

    def write_node_data(self, folder, data) -> None:
        """A simulation's node data: the files every node reads its block from."""
        raise NotImplementedError

    def load_block(self, folder: str, partition_id: int, users_per_node: int):
        """(users, block) of one node, read from ``folder`` (cached by the caller)."""
        raise NotImplementedError

    def encode_state(self, state) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The broadcast state as (arrays, scalars) for a message; only public values."""
        raise NotImplementedError

    def decode_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]):
        raise NotImplementedError

    def round_label(self, kind: str, step: int, state) -> str:
        """The name of a round in the round log (``metrics.json``)."""
        return kind

    def report_keys(self, data, state) -> dict:
        """The data keys of the run's ``metrics.json`` (after ``n_users``)."""
        return {}

    def references(self, data) -> dict:
        """The trivial references of the family's task (``metrics.json`` ``references``)."""
        return {}


#: the kind of a block family's evaluation round (an aggregate measurement: exact sums, no noise)
EVAL_KIND = "block_eval"


def block_values(family: Family, kind: str, block, state) -> dict[str, np.ndarray]:
    """A block's clipped statistics of a secure round, by declared part name."""
    parts = family.rounds.declared_parts(kind, state)
    sums = family.client_round(kind, block, state)
    return {p.name: np.asarray(sums[p.index]).ravel() for p in parts}


_FAMILIES: list[Family] = []


def register_family(family: Family) -> Family:
    """Add ``family`` to the catalogue; a family, or an algorithm, registered twice is an error."""
    if any(f.name == family.name for f in _FAMILIES):
        raise ValueError(f"family {family.name!r} is registered twice")
    taken = {a for f in _FAMILIES for a in f.algorithms()} & set(family.algorithms())
    if taken:
        raise ValueError(f"family {family.name!r}: algorithms {sorted(taken)} belong to another family")
    _FAMILIES.append(family)
    return family


def unregister_family(family: Family) -> None:
    """Remove ``family`` (a test's own family, after the test)."""
    _FAMILIES.remove(family)


def families() -> tuple[Family, ...]:
    _load()
    return tuple(_FAMILIES)


def all_algorithms() -> tuple[str, ...]:
    """Every algorithm of every family, the rating family's first."""
    return tuple(a for f in families() for a in f.algorithms())


def family_of(algorithm: str) -> Family:
    """The family of ``algorithm``; an unknown name is a ConfigError listing the known ones."""
    for family in families():
        if family.knows(algorithm):
            return family
    known = all_algorithms()
    raise ConfigError(
        f"unknown algorithm {algorithm!r} (known: {', '.join(known)}){did_you_mean(algorithm, known)}",
        field="algorithm",
    )


def family_named(name: str) -> Family:
    """The family a message names (a node's handler); ConfigError for an unknown one."""
    for family in families():
        if family.name == name:
            return family
    raise ConfigError(f"unknown family {name!r}", field="family")


#: the environment variable naming the modules of the families a process serves besides the
#: built-in ones (comma-separated; each registers its family on import): the operator's choice,
#: read by this process, never a message's
FAMILIES_ENV = "FEDPRIV_FAMILIES"


def _load() -> None:
    """The families of :data:`FAMILIES_ENV` (the built-in ones registered when the package
    ``fedpriv.algorithms`` was imported: ratings first, then personalization)."""
    import importlib
    import os

    for module in filter(None, (m.strip() for m in os.environ.get(FAMILIES_ENV, "").split(","))):
        importlib.import_module(module)
