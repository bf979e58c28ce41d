"""Runs of the DP model personalization algorithms (:mod:`fedpriv.algorithms.pam`) on either
engine: the in-process driver over user blocks here, the Flower driver in
:mod:`fedpriv.flower.pam_server`; both call the same client, aggregator and server functions."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tqdm.auto import tqdm

from ..algorithms import pam
from ..algorithms.shards import split_users
from ..data.personal import PersonalData
from ..privacy import distributed
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets, node_noise_rng, user_keys
from .loop import Hooks, make_aggregator, step_seconds, train_rounds


def train_personal_inprocess(algorithm: str, data: PersonalData, cfg: pam.PAMConfig, *, epsilon: float | None, delta: float, users_per_shard: int = 4096, secrets: RunSecrets | None = None, ledger: PrivacyLedger | None = None, progress: bool = False) -> tuple[pam.PAMState, PrivacyLedger, dict]:
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
    train_rounds(transport, make_aggregator(cfg, ledger), state, hooks=hooks, progress=lambda steps: tqdm(steps, desc=algorithm, disable=not progress, leave=False))
    timings: dict = {"steps": step_seconds(hooks.timings), "train_seconds": time.perf_counter() - t0}
    return state, ledger, timings


class BlockTransport:
    """The personalization rounds' clients in process: the client functions on user blocks
    (each block plays one node, as a Flower node holds one block)."""

    def __init__(self, data: PersonalData, users_per_shard: int, group_of: np.ndarray | None, keys: np.ndarray | None = None, reproducible: bool = False):
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
            total = distributed.add_words(plan, total, distributed.encode(plan, values, node_noise_rng(self.keys[u], f"{kind}-{step}", self.reproducible)))
            n += 1
        return (lambda: total), n


def evaluate_personal(state: pam.PAMState, data: PersonalData, users_per_shard: int = 4096) -> dict:
    sums = sum(pam.client_eval_sums(data.X[u], data.y[u], data.V_star[u], data.U_star, state, data.noise) for u in split_users(data.n_users, users_per_shard))
    out = {"test_mse": float(sums[0] / max(sums[1], 1.0) + data.noise**2)}
    out["subspace_error"] = pam.subspace_error(state.U, data.U_star) if state.U is not None else None
    return out


def run_personal(algorithm: str, spec, data: PersonalData, *, epsilon: float | None, delta: float, overrides: dict, engine: str, work_dir=None, flower_runner=None, secrets: RunSecrets | None = None, progress: bool = False) -> tuple[dict, list[dict], pam.PAMState]:
    """One run of a personalization algorithm: (metrics, ledger records, released state), the
    CLI contract; ``progress``: the same progress lines as the rating algorithms' runs."""
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

        job = PamJob(algorithm, epsilon, delta, cfg, data, work_dir, users_per_node=users_per_node, secrets=secrets, progress=progress)
        res = run_pam_job_local(job, nodes, flower_runner)
        state, ledger, timings = res.state, res.ledger, res.timings
        ev = res.evaluation
        extra = {"rounds": res.rounds, "bytes_up": res.bytes_up, "bytes_down": res.bytes_down, "round_log": res.round_log, "rejected_replies": res.rejected, "nodes": res.nodes, "users_per_node": users_per_node}
    else:
        state, ledger, timings = train_personal_inprocess(algorithm, data, cfg, epsilon=epsilon if private else None, delta=delta, users_per_shard=users_per_shard, secrets=secrets, progress=progress)
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
        "aggregation": cfg.aggregation.mode,
        **extra,
        "timings": timings,
        "wall_seconds": time.perf_counter() - t0,
        "config": {"algorithm": algorithm, "data": str(spec), "engine": engine, "epsilon": epsilon, "delta": delta, "users_per_node": users_per_node, **cfg.to_dict()},
    }
    return metrics, ledger.to_list(), state


def _spent(ledger, delta, private) -> dict:
    """epsilon_spent by the rule of :func:`~fedpriv.privacy.accounting.epsilon_bounds` (the pure
    epsilon counts when every release is pure DP, as for pam-exp), with the RDP and PLD values."""
    from ..privacy.accounting import ADD_REMOVE, current_relation, epsilon_bounds, epsilon_pld_second_opinion

    if not private:
        return {"epsilon_spent": None, "epsilon_spent_pld": None}
    spent, rdp, pure = epsilon_bounds(ledger, delta)
    out = {"epsilon_spent": spent, "epsilon_spent_rdp": rdp}
    out["epsilon_spent_pld"] = epsilon_pld_second_opinion(ledger, delta, spent)
    if pure is not None:
        out["epsilon_pure"] = pure
    if current_relation() != ADD_REMOVE:  # a deployment (its enrolled count is public): every epsilon here holds under it
        out["neighbouring_relation"] = current_relation()
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

