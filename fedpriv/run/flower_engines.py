"""The Flower engines: the fedpriv ServerApp logic (:mod:`fedpriv.flower.server_app`,
:mod:`fedpriv.flower.block_server`) run through ``runner(job, n_nodes)``:

- :class:`FlowerGrid`: on any Flower ``Grid`` (the ``flwr run`` ServerApp hands it Flower's grid;
  tests use an in-memory one);
- :class:`FlowerSimulation`: Flower's simulation runtime (Ray) started in this process, or an
  existing Ray cluster (``ray_address``);
- :class:`FlowerCallback`: any ``runner(job, n_nodes)`` (tests, fault injection, benchmarks).

A rating plan runs as a :class:`~fedpriv.flower.server_app.FlowerJob`, a block family's as a
:class:`~fedpriv.flower.block_server.BlockJob`; the runner serves either (``job.serve(grid)``).

The nodes evaluate their own held-out ratings; every node sees every run of a private tuning."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, ClassVar

from ..errors import ConfigError
from ..privacy.randomness import RunSecrets
from ..util.workdirs import owned_tempdir
from .base import Candidates, Engine, Trained
from .inputs import RunOptions
from .nodes import node_layout


def flower_nodes(opts, n_users: int) -> tuple[int, int]:
    """(nodes, users per node) of a Flower run (:func:`fedpriv.run.nodes.node_layout`; default one
    node per user)."""
    if opts.nodes and opts.users_per_node:  # resolved by the engine's layout
        return int(opts.nodes), int(opts.users_per_node)
    layout = node_layout(n_users, nodes=opts.nodes, users_per_node=opts.users_per_node)
    return layout.nodes, layout.users_per_node


def flower_job(plan, cfg, opts, work_dir, secrets, **extra):
    """The :class:`~fedpriv.flower.server_app.FlowerJob` of a plan: a split's, or (no split) a
    partitioned deployment's server with its public data; ``extra``: the job's other fields."""
    from ..data.splits import HeldoutSplit
    from ..flower.server_app import FlowerJob

    split = plan.split
    if split is None:
        train, valid, test = None, None, None
    else:
        train = split.train
        valid, test = (None, None) if isinstance(split, HeldoutSplit) else (split.valid, split.test)
    return FlowerJob(
        plan.algorithm,
        plan.job.epsilon,
        plan.job.delta,
        cfg,
        train,
        valid,
        test,
        plan.rating_range,
        work_dir,
        users_per_node=flower_nodes(opts, plan.n_users)[1],
        implicit=plan.implicit,
        item_features=plan.dataset.item_features,
        round_timeout=opts.round_timeout or None,
        node_wait_seconds=opts.node_wait,
        secrets=secrets,
        public=plan.public,
        relation=plan.job.relation,
        **extra,
    )


def _node_measurements(res, evaluated: bool) -> dict:
    """The node-side evaluation of a Flower run (``evaluated``: the random split or a deployment)."""
    if res.logistic:
        valid, test = res.logistic["valid"], res.logistic["test"]
        return {
            "valid_logloss": valid["logloss"],
            "valid_accuracy": valid["accuracy"],
            "test_logloss": test["logloss"],
            "test_accuracy": test["accuracy"],
            "valid_sliced": valid["sliced"],
            "sliced": test["sliced"],
        }
    if evaluated:
        return {
            "valid_rmse": res.valid_rmse,
            "valid_sliced": res.valid_sliced,
            "test_rmse": res.test_rmse,
            "sliced": res.test_sliced,
        }
    return {}


def _counters(res, opts, n_users: int) -> dict:
    n_nodes, upn = flower_nodes(opts, n_users)
    return {
        "nodes": n_nodes,
        "users_per_node": upn,
        "rounds": res.rounds,
        "bytes_up": res.bytes_up,
        "bytes_down": res.bytes_down,
        "round_log": res.round_log,
        "rejected_replies": res.rejected,
    }


def _trained(res, plan, opts, evaluated: bool, ledger=None) -> Trained:
    counters = _counters(res, opts, plan.n_users)
    if plan.recommend is not None:  # the recommendation rounds ran on the nodes with the training
        counters["recommendation"] = res.recommendation
    return Trained(
        res.state,
        res.ledger if ledger is None else ledger,
        {"rounds": res.round_log},
        measured=_node_measurements(res, evaluated),
        counters=counters,
        on_nodes=evaluated or bool(res.logistic),
        rec_ledger=res.rec_ledger if plan.recommend is not None else None,
    )


@dataclass(frozen=True)
class FlowerOptions(Engine):
    """Options every Flower engine shares; ``flower_runner()``: the ``runner(job, n_nodes)`` it
    runs jobs with (None: a new simulation in this process)."""

    users_per_node: int | None = None
    nodes: int | None = None
    round_timeout: float | None = None
    node_wait: float | None = None
    work_dir: str | os.PathLike | None = None  # keeps the server's checkpoint (rerun to resume)
    device: str | None = (
        # where the server computes its solves and fits: "cpu" (default), "cuda", "cuda:N" (the nodes: their own config)
        None
    )
    name: ClassVar[str] = "flower"
    sets: ClassVar[tuple[str, ...]] = ("users_per_node", "nodes", "round_timeout", "node_wait")
    honours: ClassVar[frozenset[str]] = frozenset({"round_timeout", "node_wait"})
    nodes_see_every_run: ClassVar[bool] = True

    def _flower_runner(self) -> Callable | None:
        return None

    def execute(self, plan, *, progress: bool = False, second_opinion: bool = True):
        from ..util import device

        with device.use(self.device):  # the server's side; the same releases and ledger on every device
            return super().execute(plan, progress=progress, second_opinion=second_opinion)

    def _runner(self) -> Callable:
        runner = self._flower_runner()
        if runner is None:
            from ..flower.simulation import simulate

            return simulate
        return runner

    def _run(self, job, n_nodes: int):
        return self._runner()(job, n_nodes)

    def layout(self, opts: RunOptions, plan) -> RunOptions:
        """Resolved once (:mod:`fedpriv.run.nodes`); a deployment's server checks the partition's."""
        if plan.family.blocks:  # a block family: laid out in train()
            return opts
        public = plan.public
        layout = node_layout(
            plan.n_users,
            nodes=opts.nodes,
            users_per_node=opts.users_per_node or (public.users_per_node if public is not None else None),
        )
        opts = replace(opts, nodes=layout.nodes, users_per_node=layout.users_per_node)
        if public is not None and opts.users_per_node != public.users_per_node:
            raise ConfigError(
                f"the partition put {public.users_per_node} users on each node, got {opts.users_per_node}",
                field="users-per-node",
            )
        return opts

    def _job_fields(self, plan) -> dict:
        """Fields of the :class:`~fedpriv.flower.server_app.FlowerJob` this engine sets (a run
        token, users per node from the registered nodes)."""
        return {}

    @staticmethod
    def _adapted(job, opts) -> RunOptions:
        """``opts`` with the layout a job of ``users_from_nodes`` found (its users per node,
        set by the ServerApp from the registered nodes): what metrics.json reports."""
        if getattr(job, "users_from_nodes", False) and job.users_per_node >= 1:
            upn = int(job.users_per_node)
            return replace(opts, users_per_node=upn, nodes=-(-int(job.n_users) // upn))
        return opts

    def _train_job(self, plan, opts, secrets, progress: bool) -> Trained:
        tmp = (
            Path(self.work_dir) if self.work_dir else owned_tempdir("fedpriv-flower-")
        )  # a killed run's folder goes with the next run
        job = flower_job(
            plan,
            plan.config,
            opts,
            tmp,
            secrets,
            recommend=plan.recommend,
            progress=bool(progress),
            **self._job_fields(plan),
        )
        try:
            res = self._run(job, flower_nodes(opts, plan.n_users)[0])
        finally:
            if not self.work_dir:
                shutil.rmtree(tmp, ignore_errors=True)
        opts = self._adapted(job, opts)
        trained = _trained(res, plan, opts, evaluated=job.valid is not None or plan.public is not None)
        trained.options = opts
        return trained

    def train(self, plan, opts: RunOptions, secrets: RunSecrets, *, progress: bool = False) -> Trained:
        if plan.family.blocks:
            return self._train_blocks(plan, opts, secrets, progress)
        return self._train_job(plan, opts, secrets, progress)

    def _train_blocks(self, plan, opts: RunOptions, secrets: RunSecrets, progress: bool) -> Trained:
        from ..flower.block_server import BlockJob, run_block_job_local

        layout = node_layout(plan.n_users, nodes=opts.nodes or None, users_per_node=opts.users_per_node or None)
        job = BlockJob(
            plan.family,
            plan.algorithm,
            plan.job.epsilon,
            plan.job.delta,
            plan.config,
            plan.dataset,
            Path(self.work_dir) if self.work_dir else None,
            users_per_node=layout.users_per_node,
            secrets=secrets,
            progress=progress,
            relation=plan.relation,
        )
        res = run_block_job_local(job, layout.nodes, self._runner())
        counters = {
            "rounds": res.rounds,
            "bytes_up": res.bytes_up,
            "bytes_down": res.bytes_down,
            "round_log": res.round_log,
            "rejected_replies": res.rejected,
            "nodes": res.nodes,
            "users_per_node": layout.users_per_node,
        }
        return Trained(
            res.state,
            res.ledger,
            res.timings,
            measured=dict(res.evaluation),
            counters=counters,
            on_nodes=True,
            users_per_node=layout.users_per_node,
        )

    def tuning_candidates(self, plan, opts: RunOptions) -> Candidates:
        """One run of private tuning as a Flower job (central mode): trained with the tuning plan's
        multipliers, then scored on the nodes (each sends its users' clipped validation MSEs,
        summed here; the tuning adds the noise); :func:`_tuning_candidates`."""
        if plan.config.aggregation.mode != "central":
            raise ConfigError(
                "private tuning on the Flower engine runs in central mode (its score round is not a secure sum yet)",
                field="tune",
            )
        return self._tuning_candidates(plan, opts)

    def _tuning_candidates(self, plan, opts: RunOptions) -> Candidates:
        """The candidates of a tuning on this engine.

        One node ledger for the whole tuning: every candidate is a job of its own (its own work
        folder, removed after it), but the simulated nodes this engine starts keep their ledgers
        in one folder made for this tuning (``node-ledger-*`` under the tuning's root, removed
        by the cleanup), passed to each candidate's launch through
        :func:`fedpriv.flower.simulation.shared_node_ledger`: a node's budget counts every
        candidate it served, so it bounds the number of candidates, not one candidate each.
        (``flwr run``, :class:`fedpriv.ops.launcher.FlwrRun`, runs every candidate in one run
        and one node-policy file: one ledger too. Nodes that others operate, e.g. a deployment's,
        keep their own ledgers whatever this engine does.)"""
        from ..flower.simulation import shared_node_ledger

        n_nodes = flower_nodes(opts, plan.n_users)[0]
        own = not self.work_dir
        root = Path(self.work_dir) if self.work_dir else owned_tempdir("fedpriv-tune-")
        root.mkdir(parents=True, exist_ok=True)
        ledger_dir = Path(tempfile.mkdtemp(prefix="node-ledger-", dir=root))  # one for every candidate of this tuning
        adapted = [opts]  # the layout the runs found (users per node from the registered nodes)

        def run_candidate(cfg, multipliers, run_secrets, clip, index):
            # a folder of its own, named by no index and removed after the run: none is left to count K
            root.mkdir(parents=True, exist_ok=True)
            run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=root))
            try:
                job = flower_job(
                    plan,
                    cfg,
                    opts,
                    run_dir,
                    run_secrets,
                    multipliers=multipliers,
                    tune_score_clip=clip,
                    checkpoint=False,
                    **self._job_fields(plan),
                )
                with shared_node_ledger(ledger_dir):
                    res = self._run(job, n_nodes)
                adapted[0] = self._adapted(job, opts)
            finally:
                shutil.rmtree(run_dir, ignore_errors=True)
            return res, res.ledger, res.score_total

        def cleanup():
            shutil.rmtree(root if own else ledger_dir, ignore_errors=True)

        def selected(result, ledger) -> Trained:  # the selected run's own evaluation on the nodes, rounds and bytes
            trained = _trained(result, plan, adapted[0], evaluated=True, ledger=ledger)
            trained.options = adapted[0]
            return trained

        return Candidates(run_candidate, selected, cleanup)


@dataclass(frozen=True)
class FlowerGrid(FlowerOptions):
    """The fedpriv ServerApp logic on ``grid`` (a Flower ``Grid`` whose nodes run the fedpriv
    ClientApp): the ``flwr run`` ServerApp, a deployment's ServerApp, an in-memory grid."""

    grid: Any = None
    # the launcher's run token (run-config ``run-token``): the job runs only on nodes that report it
    run_token: str = ""
    # users-per-node 0 in a ``flwr run .`` run config (and no nodes given): the ServerApp splits
    # the users over the nodes that register (ceil(users / nodes)) instead of one node per user
    users_from_nodes: bool = False

    def _job_fields(self, plan) -> dict:
        adapt = self.users_from_nodes and not self.users_per_node and not self.nodes and plan.public is None
        adapt = adapt and not plan.options.users_per_node and not plan.options.nodes  # nodes=... in `set`: that layout
        return {"run_token": self.run_token, "users_from_nodes": adapt}

    def _flower_runner(self) -> Callable:
        from ..flower.server_app import run_job

        grid = self.grid
        return lambda job, n_nodes: run_job(grid, job)


@dataclass(frozen=True)
class FlowerSimulation(FlowerOptions):
    """Flower's simulation runtime started in this process (Ray): one simulated node per
    partition unless ``nodes``; ``ray_address`` runs the nodes on an existing Ray cluster
    (``docs/how-to/ray-cluster.md``)."""

    ray_address: str | None = None
    cpus_per_node: float = 1.0
    gpus_per_node: float = 0.0  # Ray's GPU share per node actor (docs/how-to/gpu.md)
    node_device: str | None = None  # where the nodes compute their step ("cuda" needs gpus_per_node > 0)

    def _flower_runner(self) -> Callable:
        from ..flower.simulation import simulate

        ray_address, cpus, gpus, dev = self.ray_address, self.cpus_per_node, self.gpus_per_node, self.node_device
        return lambda job, n_nodes: simulate(
            job, n_nodes, ray_address=ray_address, cpus_per_node=cpus, gpus_per_node=gpus, node_device=dev
        )


@dataclass(frozen=True)
class FlowerCallback(FlowerOptions):
    """A Flower run through ``runner(job, n_nodes)`` (tests, fault injection, the benchmarks)."""

    runner: Callable | None = None

    def _flower_runner(self) -> Callable | None:
        return self.runner
