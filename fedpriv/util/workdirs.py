"""Temporary work folders that a killed process cannot leave behind for long.

A run's temporary folder (a Flower job's copy of the node data, a tuning's runs) is removed by
the run itself, in a ``finally``. A process killed outright (SIGKILL, a runtime that stops its
ServerApp before the ``finally``) cannot do that, so :func:`owned_tempdir` writes its owner (PID
and start time) into the folder, and the next run that makes one removes every folder of the
same prefix whose owner is gone (:func:`sweep_stale`). A folder without an owner file, or whose
owner still runs (the same PID and start time), is left alone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .processes import pid_alive

OWNER = ".fedpriv-owner"


def _start_ticks(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot ('' where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def _owner_gone(folder: Path) -> bool:
    try:
        pid_text, _, ticks = (folder / OWNER).read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False  # no owner file (or unreadable): not ours to judge
    return not pid_alive(pid) or (bool(ticks) and _start_ticks(pid) not in ("", ticks))


def sweep_stale(prefix: str, root: str | os.PathLike | None = None) -> list[Path]:
    """Remove the folders ``root/prefix*`` (default: the temporary directory) whose owner
    process is gone; returns them."""
    base = Path(root if root is not None else tempfile.gettempdir())
    removed = []
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(prefix) and p.is_dir()]
    except OSError:
        return removed
    for folder in candidates:
        if _owner_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def owned_tempdir(prefix: str, root: str | os.PathLike | None = None) -> Path:
    """A new temporary folder ``prefix*`` owned by this process, after the stale ones of the same
    prefix are removed."""
    sweep_stale(prefix, root)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    (folder / OWNER).write_text(f"{os.getpid()} {_start_ticks(os.getpid())}\n")
    return folder
