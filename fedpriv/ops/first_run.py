"""Helpers of the first run (``scripts/run.sh`` and a plain ``flwr run .``); standard library only.

``flwr run .`` on the default local federation starts (or reuses!) a local SuperLink on fixed
loopback ports: 127.0.0.1:39091 (its HTTP API: the runtime and, out of simulation, the Fleet
API) and 127.0.0.1:39093 (the Control API), the only two ports a local SuperLink binds on Flower
1.39 (``flwr.cli.constant``: ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` and
``FLWR_LOCAL_CONTROL_API_PORT``). When another SuperLink already answers there, the run is
installed into that foreign federation. scripts/run.sh therefore gives every run free ports and
a private FLWR_HOME, and a run token its nodes must report (:mod:`fedpriv.flower.server_app`).

    python -m fedpriv.ops.first_run env          # shell lines: free ports and a fresh run token
    python -m fedpriv.ops.first_run stop [HOME]  # stop what `flwr run .` left under FLWR_HOME
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from pathlib import Path

from .deploy.processes import free_ports  # n distinct free loopback ports

#: the environment variables that move the local SuperLink of `flwr run` (Flower 1.39-1.42)
PORT_VARIABLES = ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")
TOKEN_VARIABLE = "FEDPRIV_RUN_TOKEN"


def run_token() -> str:
    """A fresh random run token (URL-safe, no quote or space: it travels in a run config)."""
    return secrets.token_hex(16)


def run_env() -> dict[str, str]:
    """The variables of one run: a free port for each local SuperLink port, and a run token."""
    return {**dict(zip(PORT_VARIABLES, map(str, free_ports(len(PORT_VARIABLES))))), TOKEN_VARIABLE: run_token()}


def default_home() -> Path:
    """Flower's FLWR_HOME: the variable, else ``~/.flwr``."""
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr")


def _ancestors() -> set[int]:
    """This process and its ancestors (a shell that exported FLWR_HOME is not stopped)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def stop_local_superlink(home: str | os.PathLike | None = None, seconds: float = 10.0) -> list[int]:
    """Stop, by PID, what ``flwr run .`` left running under ``home`` (default: FLWR_HOME, else
    ``~/.flwr``): its local SuperLink (found by the ``HOME/local-superlink`` in its command line,
    since without FLWR_HOME set nothing carries the home in its environment) and everything it
    started, and every process with ``home`` as FLWR_HOME (SuperExec, simulation, Ray); returns
    the PIDs signalled."""
    from ..util.processes import descendant_pids, pids_matching, pids_with_env, stop_all

    target = Path(home).expanduser().resolve() if home else default_home()
    keep = _ancestors()

    def find() -> list[int]:
        links = pids_matching("flower-superlink", f"{target}/local-superlink")
        found = set(links) | set(descendant_pids(links)) | set(pids_with_env("FLWR_HOME", str(target)))
        return sorted(found - keep)

    return stop_all(find, seconds)


def _main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["env"] and len(args) == 1:
        for key, value in run_env().items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    if args[:1] == ["stop"] and len(args) <= 2:
        home = args[1] if len(args) == 2 else None
        pids = stop_local_superlink(home)
        where = Path(home) if home else default_home()
        print(
            f"stopped {len(pids)} process(es) under FLWR_HOME={where}"
            if pids
            else f"no process runs under FLWR_HOME={where}"
        )
        return 0
    print("usage: python -m fedpriv.ops.first_run env | stop [FLWR_HOME]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main())
