"""The run layer: one object owns a run.

:class:`Job` (what to run) → :meth:`Job.prepare` → a frozen :class:`Plan` (checked, data loaded
and split; no training) → :meth:`Plan.execute` on an engine (:class:`InProcess`,
:class:`FlowerGrid`, :class:`FlowerSimulation`; ``flwr run`` in a subprocess:
:class:`fedpriv.flower.launcher.FlwrRun`) → an :class:`Outcome` holding
the typed :class:`RunReport` (``metrics.json``), the ledger records and the released model.
Private tuning (:mod:`fedpriv.run.tuning`) runs inside a plan's execution on the in-process engine.
:func:`write_outputs` writes ``metrics.json`` and ``ledger.json`` (both or neither)."""

from __future__ import annotations

import os

from ..data.spec import DataSpec
from ..errors import ConfigError
from .core import (
    ENGINES,
    REPRODUCIBLE_WARNING,
    RunOptions,
    _clean,  # noqa: F401 - JSON-safe values, used by tests that compare runs
    noise_statement,
    parse_overrides,
    resolve_data,
    write_outputs,
)
from .engines import (
    Engine,
    FlowerCallback,
    FlowerGrid,
    FlowerOptions,
    FlowerSimulation,
    InProcess,
    engine_named,
)
from .job import Job, Plan
from .report import Outcome, RunReport

__all__ = [
    "ENGINES", "REPRODUCIBLE_WARNING", "Engine", "FlowerCallback", "FlowerGrid", "FlowerOptions", "FlowerSimulation", "InProcess", "Job",
    "Outcome", "Plan", "RunOptions", "RunReport", "engine_named", "noise_statement", "parse_overrides", "resolve_data", "run",
    "write_outputs",
]


def run(
    algorithm: str,
    data: str | DataSpec,
    *,
    epsilon: float | None = None,
    delta: float = 1e-5,
    overrides: dict | None = None,
    engine: str = "inprocess",
    progress: bool = True,
    dataset=None,
    work_dir: str | os.PathLike | None = None,
    flower_runner=None,
    capture: dict | None = None,
    second_opinion: bool = True,
    noise_seed: int | None = None,
) -> tuple[dict, list[dict]]:
    """Train and evaluate; returns (metrics, ledger records): a :class:`~fedpriv.run.job.Job`
    prepared and executed, for callers that hold the CLI's strings (``overrides``) and an
    engine name. ``noise_seed``: None (the default) draws every noise value and every user's
    random choice from secret OS randomness; a number makes them reproducible (privacy then
    holds only against those who do not know it). ``dataset`` skips loading;
    ``flower_runner(job, n_nodes)`` runs a Flower job (default: a new simulation); ``capture``
    (a dict) receives the trained public ``state``, the ``train`` interactions and the
    ``dataset``; ``second_opinion=False`` skips the PLD cross-check ``epsilon_spent_pld``."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})", field="--engine")
    job = Job(algorithm, data, epsilon=epsilon, delta=delta, noise_seed=noise_seed, params=dict(overrides or {}), dataset=dataset)
    outcome = job.prepare().execute(engine_named(engine, flower_runner=flower_runner, work_dir=work_dir), progress=progress, second_opinion=second_opinion)
    if capture is not None:
        capture.update(state=outcome.state, train=outcome.train, dataset=outcome.dataset)
    return outcome.report.to_json(), outcome.ledger
