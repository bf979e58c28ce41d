"""The engines by name, one table for every edge that holds a name: the command line
(``--engine``), :func:`fedpriv.train`, the experiment configs (``engine = ...``) and the
``fedpriv.run.run`` helper all read :data:`ENGINES`, so a name means one engine everywhere:

- ``inprocess``: every client in this process, on shards of users (:class:`fedpriv.run.InProcess`);
- ``flower``: ``flwr run`` on Flower's local simulation federation, in a subprocess started and
  stopped here (:class:`fedpriv.ops.launcher.FlwrRun`): what ``flwr run .`` does;
- ``ray``: Flower's simulation runtime (Ray) started in this process, the fedpriv ServerApp and
  ClientApp without a SuperLink (:class:`fedpriv.run.FlowerSimulation`).

Code that holds engine objects needs no name: ``plan.execute(FlowerGrid(grid))``."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import ConfigError, did_you_mean
from ..run import Engine, FlowerSimulation, InProcess
from .launcher import FlwrRun

#: name -> (the engine class, what it is)
ENGINES: dict[str, tuple[Callable[..., Engine], str]] = {
    "inprocess": (InProcess, "every client in this process, on shards of users (default)"),
    "flower": (FlwrRun, "`flwr run` on Flower's local simulation federation, in a subprocess"),
    "ray": (FlowerSimulation, "Flower's simulation runtime (Ray) in this process, no SuperLink"),
}
ENGINE_NAMES = tuple(ENGINES)


def engine_named(name: str, field: str = "engine", **options: Any) -> Engine:
    """The engine of ``name`` with its keyword ``options`` (ConfigError naming ``field``, e.g.
    ``--engine``, for an unknown name)."""
    entry = ENGINES.get(name)
    if entry is None:
        raise ConfigError(
            f"unknown engine {name!r} (known: {', '.join(ENGINE_NAMES)}){did_you_mean(name, ENGINE_NAMES)}", field=field
        )
    return entry[0](**options)


def engines_help() -> str:
    """One line per engine, for ``--help``."""
    return "; ".join(f"{name}: {text}" for name, (_, text) in ENGINES.items())
