"""The in-process engine: drives the client, aggregator and server functions of an algorithm
over user shards in one process. The Flower apps drive the very same functions."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from .algorithms import als, dpsgd
from .algorithms.shards import UserShard, shard_users, split_users
from .data.interactions import Interactions
from .privacy.ledger import PrivacyLedger


@dataclass
class TrainResult:
    state: als.PublicState
    ledger: PrivacyLedger
    timings: dict = field(default_factory=dict)


def make_shards(train: Interactions, users_per_shard: int | None) -> list[UserShard]:
    if not users_per_shard or users_per_shard >= train.n_users:
        return [shard_users(train)]
    return [shard_users(train, users) for users in split_users(train.n_users, users_per_shard)]


def new_state(algorithm: str, cfg: als.ALSConfig, train: Interactions, rating_range, implicit: bool, epsilon: float | None, delta: float) -> tuple[als.PublicState, PrivacyLedger]:
    """Validated public state and a ledger (with the budget for private runs)."""
    als.validate_algorithm(algorithm)
    state = als.PublicState(
        algorithm=algorithm,
        config=cfg,
        n_items=train.n_items,
        n_users=train.n_users,
        rating_range=tuple(rating_range),
        implicit=implicit,
    )
    budget = None
    if state.private:
        state.multipliers = als.calibrate_plan(algorithm, cfg, implicit, epsilon, delta)
        budget = (epsilon, delta)
    return state, PrivacyLedger(seed=cfg.seed, budget=budget)


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
    progress: bool = True,
) -> TrainResult:
    t0 = time.perf_counter()
    state, ledger = new_state(algorithm, cfg, train, rating_range, implicit, epsilon, delta)
    shards = make_shards(train, users_per_shard)
    timings: dict = {"steps": []}

    if not implicit:
        total = np.sum([als.client_mean(s, cfg, state.rating_range, state.private) for s in shards], axis=0)
        state.mean = als.release_mean(total, state, ledger)
    if als.needs_counts(algorithm):
        total = np.sum([als.client_counts(s, cfg, state.n_items, state.private) for s in shards], axis=0)
        state.counts_hat = als.release_counts(total, state, ledger)
    als.server_weights(state)
    als.server_init(state)
    timings["setup_seconds"] = time.perf_counter() - t0

    for step in tqdm(range(cfg.steps), desc=algorithm, disable=not progress, leave=False):
        ts = time.perf_counter()
        if algorithm == "dpsgd":
            parts = [dpsgd.client_gradient(s, state, step) for s in shards]
            tc = time.perf_counter()
            G = dpsgd.release_gradient(dpsgd.sum_gradients(parts, state.n_items, cfg.rank + 1), state, ledger)
            ta = time.perf_counter()
            dpsgd.server_update(G, state)
            te = time.perf_counter()
            timings["steps"].append({"client_seconds": tc - ts, "aggregate_seconds": ta - tc, "server_seconds": te - ta})
            continue
        parts = [als.client_item_stats(s, state) for s in shards]
        tc = time.perf_counter()
        A, b, g = als.sum_item_stats(parts, state.n_items, parts[0].A.shape[-1])
        A, b, g = als.release_item_stats(A, b, g, state, ledger)
        ta = time.perf_counter()
        als.server_item_update(A, b, g, state)
        te = time.perf_counter()
        timings["steps"].append({"client_seconds": tc - ts, "aggregate_seconds": ta - tc, "server_seconds": te - ta})
    timings["train_seconds"] = time.perf_counter() - t0
    return TrainResult(state=state, ledger=ledger, timings=timings)
