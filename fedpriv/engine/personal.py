"""Runs of the DP model personalization algorithms (:mod:`fedpriv.algorithms.pam`) on either
engine: the in-process driver over user blocks here, the Flower driver in
:mod:`fedpriv.flower.pam_server`; both call the same client, aggregator and server functions."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..algorithms import pam
from ..algorithms.shards import split_users
from ..data.personal import PersonalData
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets, node_noise_rng, user_keys


def train_personal_inprocess(algorithm: str, data: PersonalData, cfg: pam.PAMConfig, *, epsilon: float | None, delta: float, users_per_shard: int = 4096, secrets: RunSecrets | None = None, ledger: PrivacyLedger | None = None) -> tuple[pam.PAMState, PrivacyLedger, dict]:
    """``secrets``: the run's secret randomness (default fresh); ``ledger``: release through this
    ledger instead of the run's own (sensitivity tests replay one run's releases in another)."""
    t0 = time.perf_counter()
    secrets = secrets if secrets is not None else RunSecrets()
    state, own = pam.new_pam_state(algorithm, cfg, data.d, data.k, data.samples, epsilon, delta, secrets.ledger_seed())
    ledger = ledger if ledger is not None else own
    keys = user_keys(secrets.client_key(), data.user_ids)
    group_of = pam.user_groups(keys, cfg.epochs) if cfg.schedule == "disjoint" else None
    transport = _BlockTransport(data, users_per_shard, group_of, keys, secrets.reproducible)
    timings: dict = {"steps": pam.run_pam_rounds(transport, state, ledger)}
    timings["train_seconds"] = time.perf_counter() - t0
    return state, ledger, timings


class _BlockTransport:
    """The personalization rounds' clients in process: the client functions on user blocks."""

    def __init__(self, data: PersonalData, users_per_shard: int, group_of: np.ndarray | None, keys: np.ndarray | None = None, reproducible: bool = False):
        self.data, self.size, self.group_of = data, users_per_shard, group_of
        self.keys, self.reproducible = keys, reproducible

    def population(self) -> tuple[int, int]:
        """Each block of users plays one node (as a Flower node holds one block)."""
        return len(split_users(self.data.n_users, self.size)), max(1, self.data.n_users)

    def secure_sum(self, kind: str, plan, state, step: int, group):
        """The arithmetic of secure summation without its cryptography: each block's words (its
        users' statistics, those of the step's group only, plus the block's Skellam share)."""
        from ..privacy import distributed

        total = np.zeros(plan.length, dtype=np.uint64)
        blocks = split_users(self.data.n_users, self.size)
        for u in blocks:
            users = np.arange(self.data.n_users)[u]
            if group is not None:
                users = users[self.group_of[users] == group]
            values = pam.pam_node_values(kind, self.data.X[users], self.data.y[users], state)
            total = distributed.add_words(plan, total, distributed.encode(plan, values, node_noise_rng(self.keys[u], f"{kind}-{step}", self.reproducible)))
        return (lambda: total), len(blocks)

    def _sum(self, fn, users=None) -> tuple:
        users = np.arange(self.data.n_users) if users is None else users
        total = None
        for u in split_users(len(users), self.size):
            part = fn(self.data.X[users[u]], self.data.y[users[u]])
            part = part if isinstance(part, tuple) else (part,)
            total = part if total is None else tuple(a + b for a, b in zip(total, part))
        if total is None:  # no user (an empty group): the statistics of no one
            part = fn(self.data.X[:0], self.data.y[:0])
            total = part if isinstance(part, tuple) else (part,)
        return total

    def single_stats(self, state):
        return self._sum(lambda X, y: pam.client_single_stats(X, y, state))

    def exp_scores(self, state, net):
        return self._sum(lambda X, y: pam.client_exp_scores(X, y, state, net))[0]

    def init_stats(self, state):
        return self._sum(lambda X, y: pam.client_init_stats(X, y, state))[0]

    def step_stats(self, state, t, group):
        users = None if group is None else np.flatnonzero(self.group_of == group)
        return self._sum(lambda X, y: pam.client_am_stats(X, y, state), users)


def evaluate_personal(state: pam.PAMState, data: PersonalData, users_per_shard: int = 4096) -> dict:
    sums = sum(pam.client_eval_sums(data.X[u], data.y[u], data.V_star[u], data.U_star, state, data.noise) for u in split_users(data.n_users, users_per_shard))
    out = {"test_mse": float(sums[0] / max(sums[1], 1.0) + data.noise**2)}
    out["subspace_error"] = pam.subspace_error(state.U, data.U_star) if state.U is not None else None
    return out


def run_personal(algorithm: str, spec, data: PersonalData, *, epsilon: float | None, delta: float, overrides: dict, engine: str, work_dir=None, flower_runner=None, secrets: RunSecrets | None = None) -> tuple[dict, list[dict]]:
    """One run of a personalization algorithm: (metrics, ledger records), the CLI contract."""
    from ..algorithms.metrics import run_header
    from ..privacy.accounting import zcdp_rho

    t0 = time.perf_counter()
    overrides = dict(overrides)
    users_per_node = int(float(overrides.pop("users_per_node", 1)))
    users_per_shard = int(float(overrides.pop("users_per_shard", 0))) or 4096
    nodes = int(float(overrides.pop("nodes", 0)))
    cfg = pam.PAMConfig.from_overrides(overrides)
    secrets = secrets if secrets is not None else RunSecrets()
    private = algorithm in pam.PRIVATE  # run() has checked the algorithm, epsilon and data kind
    extra: dict = {}
    if engine == "flower":
        from ..flower.pam_server import PamJob

        job = PamJob(algorithm, epsilon, delta, cfg, data, work_dir, users_per_node=users_per_node, secrets=secrets)
        res = run_pam_job_local(job, nodes, flower_runner)
        state, ledger, timings = res.state, res.ledger, res.timings
        ev = res.evaluation
        extra = {"rounds": res.rounds, "bytes_up": res.bytes_up, "bytes_down": res.bytes_down, "round_log": res.round_log, "rejected_replies": res.rejected, "nodes": res.nodes, "users_per_node": users_per_node}
    else:
        state, ledger, timings = train_personal_inprocess(algorithm, data, cfg, epsilon=epsilon if private else None, delta=delta, users_per_shard=users_per_shard, secrets=secrets)
        ev = evaluate_personal(state, data, users_per_shard)
    metrics = {
        **run_header(algorithm, spec, engine, cfg.seed, epsilon, delta, private, "personalization"),
        "n_users": data.n_users,
        "samples_per_user": data.samples,
        "d": data.d,
        "k": state.k,
        **ev,
        **_spent(ledger, delta, private),
        "rho_zcdp": zcdp_rho(ledger) if private else None,
        "noise_multipliers": dict(state.multipliers),
        "aggregation": cfg.aggregation,
        **extra,
        "timings": timings,
        "wall_seconds": time.perf_counter() - t0,
        "config": {"algorithm": algorithm, "data": str(spec), "engine": engine, "epsilon": epsilon, "delta": delta, "users_per_node": users_per_node, **cfg.to_dict()},
    }
    return metrics, ledger.to_list()


def _spent(ledger, delta, private) -> dict:
    """epsilon_spent by the rule of :func:`~fedpriv.privacy.accounting.epsilon_bounds` (the pure
    epsilon counts when every release is pure DP, as for pam-exp), with the RDP and PLD values."""
    from ..privacy.accounting import epsilon_bounds, epsilon_pld, pld_supported

    if not private:
        return {"epsilon_spent": None, "epsilon_spent_pld": None}
    spent, rdp, pure = epsilon_bounds(ledger, delta)
    out = {"epsilon_spent": spent, "epsilon_spent_rdp": rdp}
    out["epsilon_spent_pld"] = epsilon_pld(ledger, delta) if pld_supported(ledger) else None
    if pure is not None:
        out["epsilon_pure"] = pure
    return out


def run_pam_job_local(job, nodes: int, runner=None):
    """Run ``job`` with ``runner(job, n_nodes)`` (default: a new Flower simulation)."""
    import shutil
    import tempfile

    if runner is None:
        from ..flower.simulation import simulate as runner
    own_dir = job.work_dir is None
    if own_dir:
        job.work_dir = Path(tempfile.mkdtemp(prefix="fedpriv-pam-"))
    try:
        return runner(job, nodes or job.n_parts())
    finally:
        if own_dir:
            shutil.rmtree(job.work_dir, ignore_errors=True)

