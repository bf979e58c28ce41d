"""The engines a :class:`~fedpriv.run.job.Plan` runs on, behind one interface
(``plan.execute(engine)``):

- :class:`InProcess`: every client's step in this process, on shards of users;
- :class:`FlowerGrid`: the fedpriv ServerApp logic on any Flower ``Grid`` (the ``flwr run``
  ServerApp hands it Flower's grid; tests use an in-memory one);
- :class:`FlowerSimulation`: Flower's simulation runtime (Ray) started in this process, or an
  existing Ray cluster (``ray_address``);
- :class:`fedpriv.ops.launcher.FlwrRun` (an operations module: it starts and stops
  processes): ``flwr run`` on Flower's local simulation federation, in a subprocess (what
  ``--engine flower`` means, on the command line and in Python).

Every engine returns the same :class:`~fedpriv.run.report.Outcome`, and the same data, options,
``save_model`` and report work on each. A running gRPC deployment is the engine
:class:`fedpriv.ops.deploy.engine.Deployment` (``fedpriv deploy run``), whose ServerApp is a
:class:`FlowerGrid` over the SuperNodes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from ..errors import ConfigError
from . import core
from .report import Outcome, RunReport

Plan = Any  # fedpriv.run.job.Plan (job.py imports this module: no import back)


def _model(plan: Plan, state, train, ledger: list[dict], metrics: dict):
    """The released model of a finished run (None when nothing shared was released)."""
    if plan.protocol == "personalization" and state is not None:
        from .model import PersonalModel

        return PersonalModel.from_run(state, ledger, metrics) if (state.U is not None or state.theta is not None) else None
    if state is None or getattr(state, "item_factors", None) is None:
        return None
    from .model import Model

    features = getattr(plan.dataset, "item_features", None)
    names = features.names if features is not None else None
    return Model.from_run(state, train if train is not None else plan.public, ledger, metrics, names)


class Engine:
    """Runs a plan. ``name`` is what ``metrics.json`` calls the engine; ``run_options()`` the
    run options the engine sets (users per shard or node, nodes, timeouts)."""

    name: ClassVar[str] = "inprocess"
    work_dir: str | os.PathLike | None = None

    def run_options(self) -> dict[str, Any]:
        return {}

    def flower_runner(self) -> Callable | None:
        return None

    def execute(self, plan: Plan, *, progress: bool = False, second_opinion: bool = True) -> Outcome:
        metrics, records, state, train = core.train_and_evaluate(plan, self, progress=progress, second_opinion=second_opinion)
        return Outcome(RunReport.from_metrics(metrics), records, _model(plan, state, train, records, metrics), state, train, plan.dataset)


def _set(options: dict, **values) -> dict:
    """The run options given (None: leave the job's value)."""
    for key, value in values.items():
        if value is not None:
            options[key] = value
    return options


@dataclass(frozen=True)
class InProcess(Engine):
    """Every client in this process, on shards of users that play the nodes: ``nodes`` and
    ``users_per_node`` mean what they mean on every engine (:mod:`fedpriv.run.nodes`; default one
    shard in central mode, 20 users per node in secure mode); ``users_per_shard`` sets the
    shard size directly."""

    users_per_shard: int | None = None
    nodes: int | None = None
    users_per_node: int | None = None
    device: str | None = None  # where the kernels compute: "cpu" (default), "cuda", "cuda:N" (fedpriv.util.device)
    name: ClassVar[str] = "inprocess"

    def run_options(self) -> dict[str, Any]:
        return _set({}, users_per_shard=self.users_per_shard, nodes=self.nodes, users_per_node=self.users_per_node)

    def execute(self, plan: Plan, *, progress: bool = False, second_opinion: bool = True) -> Outcome:
        from ..util import device

        with device.use(self.device):  # the same releases and ledger on every device
            return super().execute(plan, progress=progress, second_opinion=second_opinion)


@dataclass(frozen=True)
class FlowerOptions(Engine):
    """Options every Flower engine shares."""

    users_per_node: int | None = None
    nodes: int | None = None
    round_timeout: float | None = None
    node_wait: float | None = None
    work_dir: str | os.PathLike | None = None  # keeps the server's checkpoint (rerun to resume)
    name: ClassVar[str] = "flower"

    def run_options(self) -> dict[str, Any]:
        return _set({}, users_per_node=self.users_per_node, nodes=self.nodes, round_timeout=self.round_timeout, node_wait=self.node_wait)


@dataclass(frozen=True)
class FlowerGrid(FlowerOptions):
    """The fedpriv ServerApp logic on ``grid`` (a Flower ``Grid`` whose nodes run the fedpriv
    ClientApp): the ``flwr run`` ServerApp, a deployment's ServerApp, an in-memory grid."""

    grid: Any = None

    def flower_runner(self) -> Callable:
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

    def flower_runner(self) -> Callable:
        from ..flower.simulation import simulate

        ray_address, cpus, gpus, dev = self.ray_address, self.cpus_per_node, self.gpus_per_node, self.node_device
        return lambda job, n_nodes: simulate(job, n_nodes, ray_address=ray_address, cpus_per_node=cpus, gpus_per_node=gpus, node_device=dev)


@dataclass(frozen=True)
class FlowerCallback(FlowerOptions):
    """A Flower run through ``runner(job, n_nodes)`` (tests, fault injection, the benchmarks)."""

    runner: Callable | None = None

    def flower_runner(self) -> Callable | None:
        return self.runner


ENGINE_NAMES = ("inprocess", "flower")


def engine_named(name: str, *, flower_runner: Callable | None = None, work_dir=None, **options) -> Engine:
    """The engine of a name at the edges (``--engine``, the run config): ``inprocess`` or
    ``flower`` (with ``flower_runner``: that callback; without: Flower's simulation runtime in
    this process)."""
    if name == "inprocess":
        return InProcess(**options)
    if name == "flower":
        if flower_runner is not None:
            return FlowerCallback(runner=flower_runner, work_dir=work_dir, **options)
        return FlowerSimulation(work_dir=work_dir, **options)
    raise ConfigError(f"unknown engine {name!r} (known: {', '.join(ENGINE_NAMES)})", field="engine")
