"""The engines a :class:`~fedpriv.run.job.Plan` runs on, behind one interface
(``plan.execute(engine)``; what an engine is: :mod:`fedpriv.run.base`):

- :class:`InProcess`: every client's step in this process, on shards of users
  (:mod:`fedpriv.run.inprocess`);
- :class:`FlowerGrid`, :class:`FlowerSimulation`, :class:`FlowerCallback`: the fedpriv ServerApp
  logic on a Flower grid, on Flower's simulation runtime (Ray), or through any runner
  (:mod:`fedpriv.run.flower_engines`);
- :class:`fedpriv.ops.launcher.FlwrRun` (an operations module: it starts and stops
  processes): ``flwr run`` on Flower's local simulation federation, in a subprocess (what
  ``--engine flower`` means, on the command line and in Python).

Every engine returns the same :class:`~fedpriv.run.report.Outcome`, and the same data, options,
``save_model`` and report work on each. A running gRPC deployment is the engine
:class:`fedpriv.ops.deploy.engine.Deployment` (``fedpriv deploy run``), whose ServerApp is a
:class:`FlowerGrid` over the SuperNodes. Engine names exist only at the edges (``--engine``, the
run config): :func:`engine_for_run` here, :func:`fedpriv.ops.engines.engine_named` at the edges."""

from __future__ import annotations

from typing import Callable

from ..errors import ConfigError
from .base import Engine, Trained
from .flower_engines import FlowerCallback, FlowerGrid, FlowerOptions, FlowerSimulation
from .inprocess import InProcess

__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "Engine",
    "FlowerCallback",
    "FlowerGrid",
    "FlowerOptions",
    "FlowerSimulation",
    "InProcess",
    "Trained",
    "engine_for_run",
]


def _inprocess(flower_runner, work_dir, options) -> Engine:
    return InProcess(**options)


def _ray(flower_runner, work_dir, options) -> Engine:
    return FlowerSimulation(work_dir=work_dir, **options)


def _flower(flower_runner, work_dir, options) -> Engine:
    if flower_runner is None:
        raise ConfigError(
            "'flower' is `flwr run` in a subprocess (fedpriv.train, the command line: fedpriv.ops.engines); "
            "here give engine='ray' for Flower's simulation runtime in this process, or a flower_runner",
            field="engine",
        )
    return FlowerCallback(runner=flower_runner, work_dir=work_dir, **options)


#: the engines this layer builds by name (the names of fedpriv.ops.engines.ENGINES: ``flower`` is
#: `flwr run`, an operations engine, reached here only through a ``flower_runner`` callback)
_BY_NAME = {"inprocess": _inprocess, "ray": _ray, "flower": _flower}
ENGINE_NAMES = tuple(_BY_NAME)
ENGINES = ENGINE_NAMES


def engine_for_run(name: str, *, flower_runner: Callable | None = None, work_dir=None, **options) -> Engine:
    """The engine of a name at the edges of this layer (``fedpriv.run.run``): ``inprocess``,
    ``ray`` (Flower's simulation runtime in this process), or ``flower`` with ``flower_runner``
    (the fedpriv ServerApp through that callback)."""
    make = _BY_NAME.get(name)
    if make is None:
        raise ConfigError(f"unknown engine {name!r} (known: {', '.join(ENGINE_NAMES)})", field="engine")
    return make(flower_runner, work_dir, options)
