"""The run layer: one object owns a run.

:class:`Job` (what to run) → :meth:`Job.prepare` → a frozen :class:`Plan` (checked, data loaded
and split; no training) → :meth:`Plan.execute` on an engine (:class:`InProcess`,
:class:`FlowerGrid`, :class:`FlowerSimulation`; ``flwr run`` in a subprocess:
:class:`fedpriv.ops.launcher.FlwrRun`) → an :class:`Outcome` holding
the typed :class:`RunReport` (``metrics.json``), the ledger records and the released model.
Each engine trains (:mod:`fedpriv.run.base`); the plan's evaluation measures
(:mod:`fedpriv.algorithms.evaluations`); private tuning wraps any engine (:mod:`fedpriv.run.tuning`).
:func:`write_outputs` writes ``metrics.json`` and ``ledger.json`` (both or neither)."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..data.spec import DataSpec

# exported here and loaded on first use (PEP 562), so that ``import fedpriv.run.model`` (a saved
# model's recommendations) stays light: no torch, no dp-accounting, no Flower
_EXPORTS = {
    "ENGINES": "engines",
    "REPRODUCIBLE_WARNING": "inputs",
    "RunOptions": "inputs",
    "_clean": "outputs",
    "noise_statement": "inputs",
    "parse_overrides": "inputs",
    "resolve_data": "inputs",
    "write_outputs": "outputs",
    "check_results_folder": "outputs",
    "Engine": "base",
    "Trained": "base",
    "FlowerCallback": "engines",
    "FlowerGrid": "engines",
    "FlowerOptions": "engines",
    "FlowerSimulation": "engines",
    "InProcess": "engines",
    "engine_for_run": "engines",
    "Job": "job",
    "Plan": "job",
    "Outcome": "report",
    "RunReport": "report",
}
__all__ = sorted([*(n for n in _EXPORTS if not n.startswith("_")), "run"])


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedpriv.run' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])


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
    from .engines import ENGINE_NAMES as ENGINES, engine_for_run
    from .job import Job

    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})", field="--engine")
    job = Job(
        algorithm,
        data,
        epsilon=epsilon,
        delta=delta,
        noise_seed=noise_seed,
        params=dict(overrides or {}),
        dataset=dataset,
    )
    outcome = job.prepare().execute(
        engine_for_run(engine, flower_runner=flower_runner, work_dir=work_dir),
        progress=progress,
        second_opinion=second_opinion,
    )
    if capture is not None:
        capture.update(state=outcome.state, train=outcome.train, dataset=outcome.dataset)
    return outcome.report.to_json(), outcome.ledger
