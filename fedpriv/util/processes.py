"""Finding and stopping processes by what they are (Linux ``/proc``; ``pgrep`` elsewhere): the
processes a command started, by PID, by ancestry and by a marker in their environment.

Flower's local runtime detaches what it starts (the SuperLink in its own session, which starts
SuperExec, the simulation and Ray's daemons), so neither a process group nor the tree below
one PID holds them all once a parent has gone. Every one of them inherits the environment of
the command that started the run, though: :func:`pids_with_env` finds them by a variable whose
value is unique to the run (a fresh ``FLWR_HOME`` folder), and :func:`stop_all` stops a
changing set of processes until none is left."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from typing import Callable


def _proc_ok() -> bool:
    return os.path.isdir("/proc/self")


def process_cmdline(pid: int) -> str:
    """The command line of process ``pid`` (Linux /proc; empty when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pids_matching(*needles: str) -> list[int]:
    """PIDs (ours excluded) of the processes whose command line contains every one of ``needles``."""
    if not _proc_ok():  # e.g. macOS: pgrep on the first needle, filter on the others
        r = subprocess.run(["pgrep", "-fl", needles[0]], check=False, capture_output=True, text=True)
        return sorted(
            int(line.split()[0]) for line in r.stdout.splitlines() if line.strip() and all(n in line for n in needles)
        )
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            cmd = process_cmdline(int(entry))
            if cmd and all(n in cmd for n in needles):
                out.append(int(entry))
    return sorted(out)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie is not)."""
    if _proc_ok():
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")  # zombies are gone
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendant_pids(pids: list[int]) -> list[int]:
    """Every live process below ``pids`` (Linux only: empty elsewhere)."""
    if not _proc_ok():
        return []
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(entry))
    out, todo = [], list(pids)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_pids(pids: list[int], seconds: float) -> None:
    """SIGTERM, wait until gone, SIGKILL what is left after ``seconds``."""
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            _signal([p for p in pids if pid_alive(p)], signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            return
        time.sleep(0.2)


def pids_with_env(key: str, value: str, *, prefix: bool = False) -> list[int]:
    """PIDs (ours excluded) of the processes whose environment holds ``key=value`` exactly (with
    ``prefix``: a value that starts with ``value``). Linux only: empty elsewhere; processes of
    other users are not readable and not listed."""
    if not _proc_ok():
        return []
    needle = f"{key}={value}".encode()
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                variables = f.read().split(b"\0")
        except OSError:
            continue
        if any(v == needle or (prefix and v.startswith(needle)) for v in variables):
            out.append(int(entry))
    return sorted(p for p in out if pid_alive(p))


def stop_all(find: Callable[[], list[int]], grace: float, *, rounds: int = 5) -> list[int]:
    """Stop every process ``find()`` returns, and what appears while they stop (a dying parent
    may start or re-parent children): SIGTERM with their children, SIGKILL after ``grace``
    seconds, then look again, at most ``rounds`` times. Returns every PID signalled."""
    seen: list[int] = []
    for _ in range(rounds):
        pids = [p for p in find() if p != os.getpid()]
        pids += [p for p in descendant_pids(pids) if p not in pids]
        if not pids:
            break
        seen += [p for p in pids if p not in seen]
        terminate_pids(pids, grace)
    return seen
