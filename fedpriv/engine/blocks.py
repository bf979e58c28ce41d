"""The in-process driver of every block family (:class:`~fedpriv.algorithms.families.Family`:
DP model personalization and any family a user adds): the family's client function on blocks
of users, each block playing one node, through the one loop (:mod:`fedpriv.engine.loop`). The
Flower driver is :mod:`fedpriv.flower.block_server`; both call the same family functions."""

from __future__ import annotations

import time

import numpy as np
from tqdm.auto import tqdm

from ..algorithms.families import Family, block_values
from ..algorithms.shards import split_users
from ..privacy import distributed
from ..privacy.accounting import ADD_REMOVE
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets, node_noise_rng, user_keys
from .loop import Hooks, make_aggregator, step_seconds, train_rounds


def train_blocks(
    family: Family,
    algorithm: str,
    data,
    cfg,
    *,
    epsilon: float | None,
    delta: float,
    relation: str = ADD_REMOVE,
    users_per_shard: int = 4096,
    secrets: RunSecrets | None = None,
    ledger: PrivacyLedger | None = None,
    progress: bool = False,
) -> tuple[object, PrivacyLedger, dict]:
    """(released state, ledger, timings) of a run of ``family`` on ``data``. ``secrets``: the
    run's secret randomness (default fresh); ``ledger``: release through this ledger instead of
    the run's own (sensitivity tests replay one run's releases in another)."""
    t0 = time.perf_counter()
    secrets = secrets if secrets is not None else RunSecrets()
    state, own = family.new_state(algorithm, cfg, data, epsilon, delta, secrets.ledger_seed(), relation)
    ledger = ledger if ledger is not None else own
    keys = user_keys(secrets.client_key(), family.user_ids(data))
    transport = BlockTransport(
        family, data, users_per_shard, family.user_groups(keys, state), keys, secrets.reproducible
    )
    hooks = Hooks()
    train_rounds(
        transport,
        make_aggregator(cfg, ledger),
        state,
        hooks=hooks,
        progress=lambda steps: tqdm(steps, desc=algorithm, disable=not progress, leave=False),
    )
    timings: dict = {"steps": step_seconds(hooks.timings), "train_seconds": time.perf_counter() - t0}
    return state, ledger, timings


class BlockTransport:
    """A block family's clients in process: its client function on blocks of users (each block
    plays one node, as a Flower node holds one block)."""

    def __init__(
        self,
        family: Family,
        data,
        users_per_shard: int,
        group_of: np.ndarray | None,
        keys: np.ndarray | None = None,
        reproducible: bool = False,
    ):
        self.family, self.data, self.size, self.group_of = family, data, users_per_shard, group_of
        self.n_users = family.n_users(data)
        self.keys, self.reproducible = keys, reproducible

    def start(self, state, server) -> None:
        pass

    def prepare(self, step: int) -> None:
        pass

    def population(self) -> tuple[int, int]:
        return len(split_users(self.n_users, self.size)), max(1, self.n_users)

    def _blocks(self, group):
        """(block slice, its users of ``group``) of every block."""
        for u in split_users(self.n_users, self.size):
            users = np.arange(self.n_users)[u]
            if group is not None:
                users = users[self.group_of[users] == group]
            yield u, users

    def sums(self, kind: str, state, step: int = 0, group: int | None = None) -> tuple:
        total = None
        for _, users in self._blocks(group):
            part = self.family.client_round(kind, self.family.block(self.data, users), state)
            total = part if total is None else tuple(a + b for a, b in zip(total, part))
        if total is None:
            raise ValueError(f"round {kind!r}: no block of users")
        return total

    def secure_sum(self, kind: str, plan, state, step: int, group: int | None = None):
        """The arithmetic of secure summation without its cryptography: each block's words (its
        users' statistics, those of the step's group only, plus the block's Skellam share)."""
        total = np.zeros(plan.length, dtype=np.uint64)
        n, keys = 0, self.keys
        assert keys is not None, "secure rounds: every block draws its noise from its users' keys"
        for u, users in self._blocks(group):
            values = block_values(self.family, kind, self.family.block(self.data, users), state)
            total = distributed.add_words(
                plan,
                total,
                distributed.encode(plan, values, node_noise_rng(keys[u], f"{kind}-{step}", self.reproducible)),
            )
            n += 1
        return (lambda: total), n
