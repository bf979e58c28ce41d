"""Two "hosts" on one machine for the deployment tests: two fresh Linux network namespaces
joined by a veth pair with private addresses from a random /30, loopback up in both, no other
route (nothing but the other namespace is reachable). Used by ``tests/test_ray_two_hosts.py``
(a two-node Ray cluster); the same setup as ``tests/test_netns.py``'s (SuperLink/SuperNodes),
which can move to it. The process helpers read /proc only (no fedpriv internals).

Needs root, iproute2 and working network namespaces: :func:`namespaces` skips the test
otherwise. The namespaces (and with them the veth pair) are deleted on exit, also when the test
fails; processes still inside them are stopped first (only the test starts processes there)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest


@dataclasses.dataclass
class Hosts:
    ns_a: str  # namespace of "host A"
    ns_b: str  # namespace of "host B"
    a: str  # A's address on the veth
    b: str  # B's address on the veth
    veth_a: str = ""  # the veth end in A
    veth_b: str = ""  # the veth end in B


def ip(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("ip") or "ip", *args], capture_output=True, text=True, timeout=timeout)


def netns_list() -> str:
    return ip("netns", "list").stdout


def netns_pids(ns: str) -> list[int]:
    """The PIDs of the processes in namespace ``ns`` (``ip netns pids``)."""
    return [int(p) for p in ip("netns", "pids", ns).stdout.split()]


def netns_inode(ns: str) -> int:
    return os.stat(f"/run/netns/{ns}").st_ino


def pid_netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def skip_unless_netns() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("network namespaces are Linux only")
    if os.geteuid() != 0:
        pytest.skip("needs root (creates network namespaces)")
    if shutil.which("ip") is None:
        pytest.skip("needs `ip` (iproute2)")
    res = ip("netns", "list")
    if res.returncode != 0:
        pytest.skip(f"`ip netns` is not available: {res.stderr.strip()}")


@contextlib.contextmanager
def namespaces(prefix_a: str, prefix_b: str, net: str = "10.213"):
    """Two fresh namespaces ``PREFIX_A-TAG`` and ``PREFIX_B-TAG`` joined by a veth pair on a
    random ``NET.R.0/30`` (A is ``.1``, B is ``.2``); skips unless we are root with iproute2 and
    namespaces work. Deleted on exit, after stopping what still runs inside them."""
    skip_unless_netns()
    tag = secrets.token_hex(3)
    r = secrets.randbelow(256)
    hosts = Hosts(ns_a=f"{prefix_a}-{tag}", ns_b=f"{prefix_b}-{tag}", a=f"{net}.{r}.1", b=f"{net}.{r}.2",
                  veth_a=f"fpa-{tag}", veth_b=f"fpb-{tag}")
    created: list[str] = []
    try:
        for ns in (hosts.ns_a, hosts.ns_b):
            res = ip("netns", "add", ns)
            if res.returncode != 0:
                pytest.skip(f"network namespaces do not work here: `ip netns add {ns}` failed: {res.stderr.strip()}")
            created.append(ns)
        res = ip("link", "add", hosts.veth_a, "netns", hosts.ns_a, "type", "veth", "peer", "name", hosts.veth_b, "netns", hosts.ns_b)
        if res.returncode != 0:
            pytest.skip(f"cannot create a veth pair between namespaces: {res.stderr.strip()}")
        for ns, dev, addr in ((hosts.ns_a, hosts.veth_a, hosts.a), (hosts.ns_b, hosts.veth_b, hosts.b)):
            for args in (("link", "set", "lo", "up"), ("addr", "add", f"{addr}/30", "dev", dev), ("link", "set", dev, "up")):
                res = ip("-n", ns, *args)
                assert res.returncode == 0, f"ip -n {ns} {' '.join(args)}: {res.stderr}"
        yield hosts
    finally:
        for ns in created:
            leftover = netns_pids(ns)
            if leftover:  # safety net: only the test started processes in its namespaces
                terminate(leftover, 5.0)
            ip("netns", "del", ns)  # deletes the veth end inside it, and so the pair


_PROBE = """
import json, socket, sys, time
out = {}
for spec in sys.argv[2:]:
    host, port = spec.rsplit(":", 1)
    deadline = time.monotonic() + float(sys.argv[1])
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            out[spec] = "open"
            break
        except OSError as exc:
            out[spec] = type(exc).__name__
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)
print(json.dumps(out))
"""


def probe(ns: str, addresses: list[str], wait: float = 0.0) -> dict[str, str]:
    """From inside namespace ``ns``: for each host:port, 'open' or the connect error (retried
    for ``wait`` seconds until open)."""
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _PROBE, str(wait), *addresses],
                       capture_output=True, text=True, timeout=wait * len(addresses) + 60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ------------------------------------------------------------------------------ processes (/proc): the launcher's helpers
from fedpriv.ops.launcher import descendant_pids as descendants  # noqa: E402 - every live process below some PIDs
from fedpriv.ops.launcher import pid_alive as alive  # noqa: E402 - a zombie is not alive
from fedpriv.ops.launcher import process_cmdline as cmdline  # noqa: E402
from fedpriv.ops.launcher import terminate_pids as terminate  # noqa: E402 - SIGTERM, then SIGKILL after ``seconds``

__all__ = ["Hosts", "alive", "cmdline", "descendants", "ip", "namespaces", "netns_inode", "netns_list", "netns_pids", "pid_netns_inode",
           "pids_naming", "probe", "skip_unless_netns", "terminate"]


def pids_naming(needle: str) -> list[int]:
    """The processes (this one excluded) whose command line contains ``needle``."""
    from fedpriv.ops.launcher import pids_matching

    return pids_matching(needle)
