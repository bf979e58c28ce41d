"""Issue 41, item 5: a SuperNode's Runtime API on a shared loopback.

Flower's SuperNode (1.39 to 1.42, subprocess isolation: what ``fedpriv deploy up`` and the
compose file run) serves its Runtime API on ``127.0.0.1:PORT`` without credentials:
``acquire-task`` hands a pending task and its token to any caller, and ``pull-task-input``
then returns the node's ``context.state`` (its client key, its secure-summation state). On a
host where the SuperNodes share the host's network namespace, any process there can do it
(tests/runtime_api_thief.py: it even runs the stolen task with Flower's own ClientApp runtime, so
the run goes on as if nothing happened).

The defence (:mod:`fedpriv.ops.deploy.netns`): each SuperNode in a network namespace of its
own, its Fleet API connection relayed to the SuperLink on the host's loopback.

Unmarked tests start no SuperNode; the ``deployment`` test runs the attack on a real loopback
deployment twice: the unprotected layout (``FEDPRIV_NODE_NETNS=0``, positive control: the
attacker gets the node's client key) and the default one (the attacker's connections are
refused, the run completes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fedpriv.errors import ConfigError
from fedpriv.ops import deploy, launcher
from fedpriv.ops.deploy import netns

ROOT = Path(__file__).resolve().parents[1]
THIEF = Path(__file__).with_name("runtime_api_thief.py")
SMALL = "synthetic-mf:users=40,items=30,ratings=800,seed=3"

needs_netns = pytest.mark.skipif(bool(netns.unavailable()), reason=f"no network namespace: {netns.unavailable()}")


def _host_ports():
    """Two listeners on the host's loopback: ``relayed`` answers one connection with
    ``host:<what it got>``, ``other`` never answers. Returns (relayed, other, probe code): the code
    connects to the relayed port, tries the other one and prints what it saw as JSON."""
    relayed = socket.socket()
    relayed.bind(("127.0.0.1", 0))
    relayed.listen()
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    port, other_port = relayed.getsockname()[1], other.getsockname()[1]

    def answer():
        conn, _ = relayed.accept()
        conn.sendall(b"host:" + conn.recv(16))
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    code = (
        "import socket, os, json\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=10); s.sendall(b'node'); got = s.recv(64).decode()\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {other_port}), timeout=5); other = 'open'\n"
        "except OSError as e:\n"
        "    other = type(e).__name__\n"
        "print(json.dumps({'got': got, 'other': other, 'ns': os.stat('/proc/self/ns/net').st_ino}))\n"
    )
    return relayed, other, code


@needs_netns
def test_wrapper_runs_the_command_in_its_own_network_with_one_port_relayed():
    """The wrapped command reaches the relayed port (a listener in the host's namespace) but no
    other port of the host's loopback, and runs in another network namespace."""
    relayed, other, code = _host_ports()
    port = relayed.getsockname()[1]
    r = subprocess.run([sys.executable, str(Path(netns.__file__)), "--forward", str(port), "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["got"] == "host:node"
    assert seen["other"] == "ConnectionRefusedError"
    assert seen["ns"] != netns.network_namespace()
    relayed.close(), other.close()
    # the wrapper exits with its command's status
    r = subprocess.run([sys.executable, str(Path(netns.__file__)), "--", sys.executable, "-c", "raise SystemExit(7)"], timeout=60)
    assert r.returncode == 7


@needs_netns
def test_container_layout_relays_the_superlink_port_through_a_unix_socket(tmp_path):
    """The compose file's layout: a node in a network of its own with no route out (Docker's
    ``network_mode: none``; here a namespace from the wrapper with no port forwarded) reaches the
    SuperLink's port only through the Unix socket of the ``relay`` service (``--unix-gateway``),
    via its own loopback listener (``--via-unix``); another port of the host stays unreachable.
    The gateway removes its socket when stopped."""
    relayed, other, code = _host_ports()
    port = relayed.getsockname()[1]
    sock = tmp_path / "relay" / "superlink.sock"
    sock.parent.mkdir()
    script = str(Path(netns.__file__))
    gateway = subprocess.Popen([sys.executable, script, "--unix-gateway", str(sock), "--to", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert "fedpriv relay:" in gateway.stdout.readline() and sock.exists()
        r = subprocess.run([sys.executable, script, "--", sys.executable, script, "--via-unix", f"{port}={sock}", "--", sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout.strip().splitlines()[-1])
        assert seen == {"got": "host:node", "other": "ConnectionRefusedError", "ns": seen["ns"]} and seen["ns"] != netns.network_namespace()
        # positive control: without the relay the node's network has no route to the SuperLink's port
        r = subprocess.run([sys.executable, script, "--", sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "ConnectionRefusedError" in r.stderr
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=30) == 0
        relayed.close(), other.close()
    assert not sock.exists()
    r = subprocess.run([sys.executable, script, "--via-unix", "8000", "--", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "PORT=SOCKET_PATH" in r.stderr


def test_up_refuses_when_nodes_cannot_have_their_own_network(tmp_path, monkeypatch):
    """No network namespace possible: `deploy up` refuses before writing or starting anything,
    naming the switch that runs the nodes unprotected; with the switch no wrapper is used."""
    monkeypatch.setattr(netns, "unavailable", lambda: "unshare: Operation not permitted")
    monkeypatch.delenv(deploy.processes.NODE_NETNS_ENV, raising=False)
    cfg = deploy.DeployConfig(run_dir=tmp_path / "run", nodes=2, fleet_port=0, control_port=0, node_port_base=0)
    with pytest.raises(ConfigError, match="Operation not permitted") as err:
        deploy.up(cfg)
    assert err.value.field == "FEDPRIV_NODE_NETNS"
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv(deploy.processes.NODE_NETNS_ENV, "0")
    assert deploy.processes.node_netns_prefix(cfg) == []
    monkeypatch.setattr(netns, "unavailable", lambda: None)
    monkeypatch.setenv(deploy.processes.NODE_NETNS_ENV, "1")
    prefix = deploy.processes.node_netns_prefix(deploy.DeployConfig(run_dir=tmp_path / "r", nodes=2, fleet_port=9092, control_port=8000, node_port_base=9094))
    assert prefix[1] == str(Path(netns.__file__).resolve()) and prefix[-1] == "--"
    assert prefix[prefix.index("--forward") + 1] in ("9092", "8000")  # the Fleet API port of the installed Flower
    with pytest.raises(ConfigError, match="loopback"):
        deploy.processes.node_netns_prefix(deploy.DeployConfig(run_dir=tmp_path / "r", nodes=2, superlink_host="10.0.0.1"))


def _attack(cfg, out: Path, seconds: float, aggregation: str = "central") -> tuple[dict, dict]:
    """Run a job while the thief polls every node's Runtime API port; (thief report, metrics)."""
    ports = [cfg.node_port_base + i for i in range(cfg.nodes)]
    stop_file = out / "stop"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(out.parent / f"{out.name}-thief.log", "wb") as log:
        thief = subprocess.Popen([sys.executable, str(THIEF), "--ports", *map(str, ports), "--out", str(out), "--seconds", str(seconds), "--stop-file", str(stop_file)],
                                 env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(2.0)  # polling before the first message
        metrics = deploy.run_deployed_job(cfg, "adadpals", epsilon=1.0, overrides={"steps": "1", "rank": "2"}, node_wait=60.0, quiet=True,
                                          timeout=900, aggregation=aggregation)
    finally:
        out.mkdir(parents=True, exist_ok=True)
        stop_file.touch()
        try:
            thief.wait(timeout=120)
        except subprocess.TimeoutExpired:
            launcher.terminate_pids([thief.pid, *launcher.descendant_pids([thief.pid])], 5.0)
    return json.loads((out / "summary.json").read_text()), metrics


@pytest.mark.deployment
@pytest.mark.parametrize("layout", ["host-network", "own-network"])
def test_outside_process_reads_a_nodes_state_only_on_the_shared_network(tmp_path, monkeypatch, layout):
    """host-network (positive control): an outside process on the host claims the nodes' tasks
    through their Runtime API on 127.0.0.1, receives their context and finds the node's client
    key (``fedpriv-secrets``) in ``context.state``; the run still completes (the stolen tasks
    are run by Flower's own ClientApp runtime). own-network (the default of `deploy up`): its
    every connection to those ports is refused, and the run completes."""
    if layout == "own-network" and netns.unavailable():
        pytest.skip(f"no network namespace: {netns.unavailable()}")
    monkeypatch.setenv(deploy.processes.NODE_NETNS_ENV, "0" if layout == "host-network" else "1")
    cfg = deploy.DeployConfig(run_dir=tmp_path / "run", nodes=2, data=SMALL, users_per_node=20, fleet_port=0, control_port=0, node_port_base=0,
                              node_policy={"policy-aggregation": "central"})  # a central run (_attack): its nodes' own policy must allow it (the default is secure)
    seen: list[int] = []
    try:
        deploy.up(cfg, wait=240)
        entries = deploy.running(cfg)
        seen = [int(e["pid"]) for e in entries]
        nodes = [int(e["pid"]) for e in entries if e["name"].startswith("supernode")]
        below = launcher.descendant_pids(nodes)
        # where the SuperNode processes (and what they started) live
        spaces = {netns.network_namespace(p) for p in below if launcher.pid_alive(p)}
        if layout == "own-network":
            assert len(spaces) >= cfg.nodes and netns.network_namespace() not in spaces, spaces
        else:
            assert spaces == {netns.network_namespace()}
        report, metrics = _attack(cfg, tmp_path / "thief", seconds=900)
        seen += launcher.descendant_pids(seen)
        assert np.isfinite(metrics["test_rmse"]) and metrics["epsilon_spent"] > 0
        contexts = [json.loads(Path(f).read_text()) for f in report["contexts"]]
        print(f"\n{layout} (flwr {'.'.join(map(str, deploy.flwr_version()))}): thief report {json.dumps(report['ports'])}; "
              f"{len(contexts)} contexts: " + "; ".join(f"{c['message_type']} node {c['port']}: {sorted(c['state'])}" for c in contexts))
        if layout == "host-network":
            assert all(r["answered"] for r in report["ports"].values()), report
            assert sum(r["tasks"] for r in report["ports"].values()) > 0, report
            keys = [c["state"]["fedpriv-secrets"]["client_key"] for c in contexts if "fedpriv-secrets" in c["state"]]
            assert keys and all(k["bytes"] == 32 for k in keys), contexts  # the node's 256-bit client key
            assert {c["port"] for c in contexts if "fedpriv-secrets" in c["state"]} <= set(range(cfg.node_port_base, cfg.node_port_base + cfg.nodes))
        else:
            assert not any(r["answered"] or r["tasks"] for r in report["ports"].values()), report
            assert report["contexts"] == []
            assert all(any("ConnectError" in e or "refused" in e.lower() for e in r["errors"]) for r in report["ports"].values()), report
    finally:
        seen += launcher.descendant_pids(seen)
        deploy.stop(cfg.run_dir)
    deadline = time.monotonic() + 20
    while any(launcher.pid_alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(launcher.pid_alive(p) for p in seen), [p for p in seen if launcher.pid_alive(p)]
