"""The in-process engine: drives the client, aggregator and server functions of an algorithm
over user shards in one process. The Flower apps drive the very same functions."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

try:  # loaded where installed: the kernels take their multi-threaded torch path in this process
    import torch  # noqa: F401
except ImportError:  # torch is an extra (fedpriv[torch]): the ALS family runs on the native and numpy kernels
    pass

from ..algorithms import als, protocol, recommend, registry, secure
from ..algorithms.shards import UserShard, shard_users, split_users
from ..data.interactions import Interactions
from ..util import threads
from ..errors import ConfigError
from .loop import Hooks, RatingTransport, make_aggregator, recommend_rounds, train_rounds
from ..privacy.accounting import ADD_REMOVE, BestOfAccountant
from ..privacy import distributed
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets, user_keys


@dataclass
class TrainResult:
    state: als.PublicState
    ledger: PrivacyLedger
    timings: dict = field(default_factory=dict)


def make_shards(train: Interactions, users_per_shard: int | None, client_key: bytes | None = None) -> list[UserShard]:
    """User shards of ``train``; with ``client_key``, each user carries its secret key (a PRF of
    its raw id: :func:`fedpriv.privacy.randomness.user_keys`), the source of its own random
    choices."""
    raw = train.user_ids if train.user_ids is not None else np.arange(train.n_users)
    keys = user_keys(client_key, raw) if client_key is not None else None
    if not users_per_shard or users_per_shard >= train.n_users:
        return [shard_users(train, keys=keys)]
    return [shard_users(train, users, keys) for users in split_users(train.n_users, users_per_shard)]


def new_state(
    algorithm: str,
    cfg: als.ALSConfig,
    train: Interactions,
    rating_range,
    implicit: bool,
    epsilon: float | None,
    delta: float,
    multipliers: dict[str, float] | None = None,
    secrets: RunSecrets | None = None,
    relation: str = ADD_REMOVE,
) -> tuple[als.PublicState, PrivacyLedger]:
    """Validated public state and a ledger (with the budget for private runs). ``secrets``: the
    run's secret randomness (default: fresh OS randomness; a noise seed makes it reproducible).
    ``relation``: the neighbouring relation of the job, calibrated under and carried by the ledger.

    ``multipliers``: noise multipliers calibrated by the caller for a plan that contains this
    run (one run of private tuning, :mod:`fedpriv.run.tuning`); the run's ledger then carries no
    budget of its own: the caller accounts the whole."""
    als.validate_algorithm(algorithm)
    state = als.PublicState(
        algorithm=algorithm,
        config=cfg,
        n_items=train.n_items,
        # private runs never broadcast the exact number of users: those that use it release it
        # (``release_user_count``), the others carry 0
        n_users=0 if registry.get(algorithm).private else train.n_users,
        rating_range=tuple(rating_range),
        implicit=implicit,
    )
    budget = None
    if state.private and multipliers is not None:
        missing = {p.name for p in als.plan_releases(algorithm, cfg, implicit)} - set(multipliers)
        if missing:
            raise ConfigError(f"no noise multiplier for {sorted(missing)}", field="multipliers")
        state.multipliers = dict(multipliers)
    elif state.private:
        if epsilon is None:
            raise ConfigError(f"algorithm {algorithm!r} is private: give --epsilon", field="--epsilon")
        state.multipliers = als.calibrate_plan(algorithm, cfg, implicit, epsilon, delta, relation)
        budget = (epsilon, delta)
    secrets = secrets if secrets is not None else RunSecrets()
    return state, PrivacyLedger(
        seed=secrets.ledger_seed(),
        budget=budget,
        accountant=BestOfAccountant() if budget else None,
        relation=relation,
    )


def train_inprocess(
    algorithm: str,
    train: Interactions,
    cfg: als.ALSConfig,
    *,
    rating_range: tuple[float, float],
    implicit: bool = False,
    epsilon: float | None = None,
    delta: float = 1e-5,
    users_per_shard: int | None = None,
    item_features=None,
    progress: bool = True,
    on_step=None,
    multipliers: dict[str, float] | None = None,
    secrets: RunSecrets | None = None,
    ledger: PrivacyLedger | None = None,
    relation: str = ADD_REMOVE,
) -> TrainResult:
    """``item_features``: public features of the encoder algorithms; ``on_step(step, state,
    seconds)`` is called after every alternating step (measurement hooks); when it returns True,
    training stops there (the ledger then holds the releases made so far). ``secrets``: the
    run's secret randomness (default: fresh, from the OS); ``ledger``: a ledger to release
    through instead of the run's own (sensitivity tests replay one run's releases in another);
    ``relation``: the job's neighbouring relation (:func:`new_state`)."""
    t0 = time.perf_counter()
    threads.configure()
    secrets = secrets if secrets is not None else RunSecrets()
    state, own = new_state(
        algorithm, cfg, train, rating_range, implicit, epsilon, delta, multipliers, secrets, relation
    )
    ledger = ledger if ledger is not None else own
    transport = ShardTransport(
        make_shards(train, users_per_shard, secrets.client_key()), reproducible=secrets.reproducible
    )
    timings: dict = {}

    def after_setup(state, server):
        timings["setup_seconds"] = time.perf_counter() - t0

    def after_step(step, state, server, seconds):
        return on_step is not None and on_step(step, state, time.perf_counter() - t0)

    hooks = Hooks(after_setup=after_setup, after_step=after_step)
    train_rounds(
        transport,
        make_aggregator(cfg, ledger),
        state,
        item_features=item_features,
        hooks=hooks,
        progress=lambda steps: tqdm(steps, desc=algorithm, disable=not progress or len(steps) == 0, leave=False),
    )  # no "0it" bar
    timings["steps"] = hooks.timings
    timings["train_seconds"] = time.perf_counter() - t0
    return TrainResult(state=state, ledger=ledger, timings=timings)


def shard_population(shards: list[UserShard]) -> tuple[int, int]:
    """(nodes, public bound on their users) of a secure round in process: each shard plays one
    node, and the bound is the shards' declared sizes (what Flower nodes declare in replies)."""
    return len(shards), max(1, sum(s.n_users for s in shards))


class ShardTransport(RatingTransport):
    """The in-process engine's clients: the client functions called on user shards."""

    def __init__(self, shards: list[UserShard], reproducible: bool = False):
        self.shards, self.table, self.reproducible = shards, None, reproducible

    def vector(self, kind: str, length: int, state: als.PublicState) -> np.ndarray:
        return np.sum([als.client_vector(kind, s, state) for s in self.shards], axis=0)

    def start(self, state: als.PublicState, server) -> None:
        encoder = getattr(server, "encoder", None)  # an encoder server; the bias model keeps its public features
        self.table = encoder.table if encoder is not None else None

    def prepare(self, step: int) -> None:
        pass

    def step(self, state: als.PublicState, step: int) -> list:
        return [protocol.client_step(s, state, step, self.table) for s in self.shards]

    def population(self) -> tuple[int, int]:
        return shard_population(self.shards)

    def secure_sum(self, kind: str, plan, state: als.PublicState, step: int, group: int | None = None):
        """The arithmetic of secure summation without its cryptography: each shard's words (its
        quantized sums plus its Skellam share), summed mod 2^bits (the masks would cancel)."""
        total = np.zeros(plan.length, dtype=np.uint64)
        label = secure.label(kind, step)
        for s in self.shards:
            values = secure.node_values(kind, s, state, step, self.table)
            words = secure.node_words(plan, values, secure.node_rng(s, label, self.reproducible))
            total = distributed.add_words(plan, total, words)
        return (lambda: total), len(self.shards)


def recommend_inprocess(
    state: als.PublicState,
    train: Interactions,
    heldout: Interactions | None,
    cfg,
    *,
    users_per_shard: int | None = None,
    secrets: RunSecrets | None = None,
    relation: str = ADD_REMOVE,
):
    """Private recommendation after training (:func:`fedpriv.engine.loop.recommend_rounds`) over the
    same user shards as training: returns (summary, recommendation ledger, reports per global
    user id). The Flower apps run the very same rounds. ``relation``: the job's (its ledger's)."""
    secrets = secrets if secrets is not None else RunSecrets()
    ledger = PrivacyLedger(seed=secrets.ledger_seed("recommend"), relation=relation)
    shards = make_shards(train, users_per_shard, secrets.client_key())
    held = [shard_users(heldout, s.user_ids) for s in shards] if heldout is not None else [None] * len(shards)
    summary, reports = recommend_rounds(
        _ShardRecommendTransport(shards, held, secrets.reproducible), state, cfg, ledger
    )
    picks = np.full(train.n_users, -1, dtype=np.int64)
    for i, items in reports.items():
        picks[shards[i].user_ids] = items
    return summary, ledger, picks


class _ShardRecommendTransport:
    """The recommendation rounds' clients in process: the client functions on user shards."""

    def __init__(self, shards: list[UserShard], held: list, reproducible: bool):
        self.shards, self.held, self.reproducible = shards, held, reproducible

    def histogram(self, state, candidates, cfg) -> np.ndarray:
        return np.sum([recommend.client_histogram(s, state, candidates, cfg) for s in self.shards], axis=0)

    def population(self) -> tuple[int, int]:
        return shard_population(self.shards)

    def secure_histogram(self, plan, state, candidates, cfg):
        """Secure mode: each shard's histogram words (counts plus its Skellam share), summed."""
        total = np.zeros(plan.length, dtype=np.uint64)
        for s in self.shards:
            words = secure.node_words(
                plan,
                secure.node_histogram(s, state, candidates, cfg),
                secure.node_rng(s, "rec_hist", self.reproducible),
            )
            total = distributed.add_words(plan, total, words)
        return (lambda: total), len(self.shards)

    def reports(self, state, candidates, lo, hi, cfg, secure: bool = False):
        self.pending = []
        for i, (s, h) in enumerate(zip(self.shards, self.held)):
            rep = recommend.client_recommend(s, state, candidates, lo, hi, cfg, h, reproducible=self.reproducible)
            if secure:
                self.pending.append(rep.sums)
            yield i, s.n_users, rep.picks, rep.records, None if secure else rep.sums

    def measure_eval(self, parts):
        """Secure mode: the arithmetic of the measurement sum (fixed point, mod 2^64), as the
        Flower rounds compute it."""
        plan = distributed.ExactPlan(tuple(parts), len(self.shards))
        total = np.zeros(plan.length, dtype=np.uint64)
        for sums in self.pending:
            total = total + plan.encode(sums)  # uint64 arithmetic wraps mod 2^64
        return plan.decode(total)

    def reject(self, key, reason: str) -> None:
        raise ValueError(f"shard {key}: {reason}")  # in process, the client code is ours: a bug


def tuning_candidate(
    algorithm: str, split, rating_range: tuple[float, float], epsilon: float, delta: float, item_features=None
):
    """One run of a private tuning in process (``train_candidate`` of
    :func:`fedpriv.run.tuning.tune`): trained with the tuning's multipliers, then every user's
    min(validation MSE, clip) summed over all users at once (a Flower node sums its own users':
    :func:`fedpriv.algorithms.evaluation.shard_clipped_score_sum`)."""
    from ..algorithms.evaluation import clipped_score_sum

    def run(cfg, multipliers, run_secrets, clip, index):
        res = train_inprocess(
            algorithm,
            split.train,
            cfg,
            rating_range=rating_range,
            epsilon=epsilon,
            delta=delta,
            # no progress bar per run: a log holding K bars would tell K
            item_features=item_features,
            progress=False,
            multipliers=multipliers,
            secrets=run_secrets,
        )
        return res, res.ledger, clipped_score_sum(res.state, split.train, split.valid, clip)

    return run
