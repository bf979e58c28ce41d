"""The in-process driver of the DP model personalization algorithms (:mod:`fedpriv.algorithms.pam`)
over user blocks; the Flower driver is :mod:`fedpriv.flower.pam_server`. Both call the same
client, aggregator and server functions through the one loop (:mod:`fedpriv.engine.loop`)."""

from __future__ import annotations

import time

import numpy as np

from tqdm.auto import tqdm

from ..algorithms import pam
from ..algorithms.shards import split_users
from ..data.personal import PersonalData
from ..privacy import distributed
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets, node_noise_rng, user_keys
from .loop import Hooks, make_aggregator, step_seconds, train_rounds


def train_personal_inprocess(
    algorithm: str,
    data: PersonalData,
    cfg: pam.PAMConfig,
    *,
    epsilon: float | None,
    delta: float,
    users_per_shard: int = 4096,
    secrets: RunSecrets | None = None,
    ledger: PrivacyLedger | None = None,
    progress: bool = False,
) -> tuple[pam.PAMState, PrivacyLedger, dict]:
    """``secrets``: the run's secret randomness (default fresh); ``ledger``: release through this
    ledger instead of the run's own (sensitivity tests replay one run's releases in another).
    The rounds are the one loop's (:func:`fedpriv.engine.loop.train_rounds`)."""
    t0 = time.perf_counter()
    secrets = secrets if secrets is not None else RunSecrets()
    state, own = pam.new_pam_state(algorithm, cfg, data.d, data.k, data.samples, epsilon, delta, secrets.ledger_seed())
    ledger = ledger if ledger is not None else own
    keys = user_keys(secrets.client_key(), data.user_ids)
    group_of = pam.user_groups(keys, cfg.epochs) if cfg.schedule == "disjoint" else None
    transport = BlockTransport(data, users_per_shard, group_of, keys, secrets.reproducible)
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
    """The personalization rounds' clients in process: the client functions on user blocks
    (each block plays one node, as a Flower node holds one block)."""

    def __init__(
        self,
        data: PersonalData,
        users_per_shard: int,
        group_of: np.ndarray | None,
        keys: np.ndarray | None = None,
        reproducible: bool = False,
    ):
        self.data, self.size, self.group_of = data, users_per_shard, group_of
        self.keys, self.reproducible = keys, reproducible

    def start(self, state, server) -> None:
        pass

    def prepare(self, step: int) -> None:
        pass

    def population(self) -> tuple[int, int]:
        return len(split_users(self.data.n_users, self.size)), max(1, self.data.n_users)

    def _blocks(self, group):
        """(block slice, its users of ``group``) of every block."""
        for u in split_users(self.data.n_users, self.size):
            users = np.arange(self.data.n_users)[u]
            if group is not None:
                users = users[self.group_of[users] == group]
            yield u, users

    def sums(self, kind: str, state, step: int = 0, group: int | None = None) -> tuple:
        total = None
        for _, users in self._blocks(group):
            part = pam.client_round(kind, self.data.X[users], self.data.y[users], state)
            total = part if total is None else tuple(a + b for a, b in zip(total, part))
        return total

    def secure_sum(self, kind: str, plan, state, step: int, group: int | None = None):
        """The arithmetic of secure summation without its cryptography: each block's words (its
        users' statistics, those of the step's group only, plus the block's Skellam share)."""
        total = np.zeros(plan.length, dtype=np.uint64)
        n = 0
        for u, users in self._blocks(group):
            values = pam.pam_node_values(kind, self.data.X[users], self.data.y[users], state)
            total = distributed.add_words(
                plan,
                total,
                distributed.encode(plan, values, node_noise_rng(self.keys[u], f"{kind}-{step}", self.reproducible)),
            )
            n += 1
        return (lambda: total), n
