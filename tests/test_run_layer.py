"""The run layer's seams (issue 44): engines train, the plan chooses its evaluation, tuning wraps
an engine, plans are typed, and nothing in the run layer or the engines asks which engine or which
protocol it runs.

The engine below is defined here and nowhere else: it runs each round's clients (user shards, or
user blocks for personalization) in a thread pool, through the one loop
(:func:`fedpriv.engine.loop.train_rounds`). Rating, ranking and personalization jobs on it give the
in-process engine's ledgers, metrics and models."""

from __future__ import annotations

import ast
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from fedpriv.algorithms import pam, protocol
from fedpriv.algorithms.evaluations import BlockEvaluation, HeldoutUsers, Logistic, OnNodes, RatingRegression
from fedpriv.engine.inprocess import ShardTransport, make_shards, new_state
from fedpriv.engine.loop import make_aggregator, train_rounds
from fedpriv.engine.blocks import BlockTransport
from fedpriv.privacy.randomness import user_keys
from fedpriv.run import Engine, InProcess, Job, Plan, Trained
from fedpriv.run.base import Candidates
from fedpriv.run.inprocess import inprocess_shard_size

PACKAGE = Path(__file__).resolve().parents[1] / "fedpriv"
DATA = "synthetic-mf:users=120,items=40,ratings=3000,seed=5"
RANKED = "synthetic-mf:users=220,items=40,ratings=4400,seed=5"  # enough users for topk to personalize at epsilon 20


class ThreadShards(ShardTransport):
    """The in-process clients, each round's shards stepped by a pool of threads."""

    def __init__(self, shards, pool: ThreadPoolExecutor, reproducible: bool):
        super().__init__(shards, reproducible=reproducible)
        self.pool = pool

    def step(self, state, step: int) -> list:
        return list(self.pool.map(lambda s: protocol.client_step(s, state, step, self.table), self.shards))


class ThreadBlocks(BlockTransport):
    """The personalization clients, each round's user blocks in a pool of threads."""

    def __init__(self, *args, pool: ThreadPoolExecutor, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = pool

    def sums(self, kind: str, state, step: int = 0, group: int | None = None) -> tuple:
        family, data = self.family, self.data
        parts = list(self.pool.map(lambda b: family.client_round(kind, family.block(data, b[1]), state), list(self._blocks(group))))
        return tuple(np.sum(column, axis=0) for column in zip(*parts))


@dataclasses.dataclass(frozen=True)
class ThreadPoolEngine(Engine):
    """A new engine: the clients of every round in a thread pool; everything else (evaluation,
    accounting, metrics.json, the model) is the run layer's."""

    users_per_node: int = 50
    workers: int = 4
    name: ClassVar[str] = "threads"

    def layout(self, opts, plan):
        opts = dataclasses.replace(opts, users_per_node=self.users_per_node)
        return dataclasses.replace(opts, users_per_shard=inprocess_shard_size(opts, plan.n_users, plan.config.aggregation.secure) or 0)

    def train(self, plan, opts, secrets, *, progress: bool = False) -> Trained:
        if plan.family.blocks:
            return self._train_blocks(plan, secrets)
        train, cfg = plan.split.train, self.config(plan)
        state, ledger = new_state(plan.algorithm, cfg, train, plan.rating_range, plan.implicit, plan.job.epsilon, plan.job.delta, secrets=secrets)
        shards = make_shards(train, opts.users_per_shard or None, secrets.client_key())
        with ThreadPoolExecutor(self.workers) as pool:
            train_rounds(ThreadShards(shards, pool, secrets.reproducible), make_aggregator(cfg, ledger), state, item_features=plan.dataset.item_features)
        return Trained(state, ledger, {"threads": self.workers})

    def config(self, plan):
        return plan.config

    def _train_blocks(self, plan, secrets) -> Trained:
        family, cfg, data = plan.family, plan.config, plan.dataset
        state, ledger = family.new_state(plan.algorithm, cfg, data, plan.job.epsilon if plan.private else None, plan.job.delta,
                                         secrets.ledger_seed(), plan.relation)
        keys = user_keys(secrets.client_key(), family.user_ids(data))
        groups = family.user_groups(keys, state)
        with ThreadPoolExecutor(self.workers) as pool:
            transport = ThreadBlocks(family, data, self.users_per_node, groups, keys, secrets.reproducible, pool=pool)
            train_rounds(transport, make_aggregator(cfg, ledger), state)
        return Trained(state, ledger, {"threads": self.workers}, users_per_node=self.users_per_node)


def _same_run(job: Job, **inprocess):
    plan = job.prepare()
    ours, theirs = plan.execute(ThreadPoolEngine(), second_opinion=False), plan.execute(InProcess(**inprocess), second_opinion=False)
    assert ours.report.engine == "threads" and theirs.report.engine == "inprocess"
    assert ours.ledger == theirs.ledger and len(ours.ledger) > 0
    assert ours.report.epsilon_spent == theirs.report.epsilon_spent
    return plan, ours, theirs


def test_a_new_engine_defined_here_runs_a_rating_job_like_the_inprocess_engine():
    plan, ours, theirs = _same_run(Job("adadpals", DATA, epsilon=5.0, noise_seed=3, params={"rank": 2, "steps": 2}), users_per_node=50)
    assert isinstance(plan, Plan) and plan.here and isinstance(plan.evaluation, RatingRegression)
    for key in ("valid_rmse", "test_rmse"):
        assert ours.report.metrics[key] == pytest.approx(theirs.report.metrics[key], rel=1e-9)
    assert ours.report["ranking"]["recall"] == pytest.approx(theirs.report["ranking"]["recall"], rel=1e-9)
    assert np.allclose(ours.model.state.item_factors, theirs.model.state.item_factors, rtol=1e-6, atol=1e-9)

    # a positive control: the comparisons can fail, an engine that trains another plan gives another ledger
    @dataclasses.dataclass(frozen=True)
    class OneStepLess(ThreadPoolEngine):
        def config(self, plan):
            return dataclasses.replace(plan.config, steps=plan.config.steps - 1)

    assert plan.execute(OneStepLess(), second_opinion=False).ledger != theirs.ledger


def test_a_new_engine_defined_here_runs_a_ranking_job_like_the_inprocess_engine():
    plan, ours, theirs = _same_run(Job("topk", RANKED, epsilon=20.0, noise_seed=4), users_per_node=50)
    assert theirs.report.config["options"]["topk_items"] > 0, "the rule must personalize here, or this compares two popularity lists"
    assert "cooc" in {r["name"] for r in ours.ledger}
    for key in ("recall", "ndcg", "coverage", "median_train_count"):
        assert ours.report["ranking"][key] == pytest.approx(theirs.report["ranking"][key], rel=1e-9)
    users = [0, 5, 9]
    assert ours.model.recommend(users, k=5) == theirs.model.recommend(users, k=5)


def test_a_new_engine_defined_here_runs_a_personalization_job_like_the_inprocess_engine():
    job = Job("pam", "synthetic-personal:users=200,samples=10,d=6,k=2,noise=0.1,seed=3", epsilon=4.0, noise_seed=5, params={"users_per_node": 50})
    plan, ours, theirs = _same_run(job)
    assert plan.family is pam.FAMILY and isinstance(plan.evaluation, BlockEvaluation)
    assert ours.report.metrics["test_mse"] == pytest.approx(theirs.report.metrics["test_mse"], rel=1e-9)
    assert ours.report.metrics["subspace_error"] == pytest.approx(theirs.report.metrics["subspace_error"], rel=1e-9)


def test_the_plan_chooses_its_evaluation_once():
    assert isinstance(Job("adadpals", DATA, epsilon=5.0, params={"split": "heldout"}).prepare().evaluation, HeldoutUsers)
    assert isinstance(Job("am-ssp-convex", DATA, epsilon=5.0).prepare().evaluation, Logistic)
    assert isinstance(Job("als", DATA).prepare().evaluation, RatingRegression)
    from fedpriv.algorithms.evaluations import evaluation_for

    assert isinstance(evaluation_for("deployment", None, None), OnNodes)


def test_private_tuning_wraps_a_new_engine_without_it_knowing():
    """The thread-pool engine knows nothing of tuning: given a candidate runner it tunes, and
    selects what the in-process engine selects."""

    @dataclasses.dataclass(frozen=True)
    class Tunable(ThreadPoolEngine):
        def tuning_candidates(self, plan, opts):
            run = InProcess().tuning_candidates(plan, opts).run
            return Candidates(run, lambda result, ledger: Trained(result.state, ledger, {}))

    params = {"tune": "reg_item_private=0.5/5/50", "tune_mean": 2, "rank": 2, "steps": 1}
    plan = Job("adadpals", DATA, epsilon=4.0, noise_seed=9, params=params).prepare()
    ours, theirs = plan.execute(Tunable(), second_opinion=False), plan.execute(InProcess(), second_opinion=False)
    assert ours.ledger == theirs.ledger and [r["name"] for r in ours.ledger] == ["tuning"]
    assert ours.report["tuning"]["selected"] == theirs.report["tuning"]["selected"]


# ---------------------------------------------------------------------- the layer's shape
NAMES = {"inprocess", "flower", "random", "heldout", "personalization"}


def _compared_strings(tree) -> list[tuple[int, str]]:
    """(line, code) of every comparison with an engine or protocol name as a string constant."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            values = {c.value for c in sides if isinstance(c, ast.Constant)}
            values |= {e.value for c in sides if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts if isinstance(e, ast.Constant)}
            if values & NAMES:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_nothing_in_the_run_layer_or_the_engines_compares_an_engine_or_protocol_name():
    hits = [f"{p.relative_to(PACKAGE)}:{line}: {code}" for folder in ("run", "engine") for p in sorted((PACKAGE / folder).glob("*.py"))
            for line, code in _compared_strings(ast.parse(p.read_text()))]
    assert not hits, "\n".join(hits)
    assert _compared_strings(ast.parse('if engine.name == "flower": pass')), "positive control: the check sees such a comparison"
    assert not (PACKAGE / "run" / "core.py").exists()


def test_functions_of_the_run_layer_are_short():
    long = [f"{p.name}:{n.name} ({n.end_lineno - n.lineno + 1} lines)" for p in sorted((PACKAGE / "run").glob("*.py"))
            for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, long


def test_plans_have_no_field_typed_any():
    import fedpriv.run.job as job

    assert not any(hasattr(job, name) for name in ("RatingsPlan", "ServerPlan", "PersonalPlan")), "one Plan for every family"
    for kind in (Plan,):
        loose = [f.name for f in dataclasses.fields(kind) if "Any" in str(f.type)]
        assert not loose, f"{kind.__name__}: {loose}"
