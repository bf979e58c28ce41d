"""fedpriv over really separate hosts: the SuperLink in one Linux network namespace ("host A"),
three SuperNodes in another ("host B"), joined by a veth pair with private addresses from a
random /30 in 10.213.R.0. TLS (server certificate for A's address) and SuperNode authentication
(keys registered with ``flwr supernode register``) as ``fedpriv deploy`` sets them up; each
SuperNode runs in its own folder holding only the CA certificate, its key and its data.

Every command is the deploy package's builders' argv, run on its "host" through ``bin_dir``: a
folder of wrappers ``exec ip netns exec NS <venv>/bin/<name> "$@"`` (so ``run_job`` and
``list_nodes`` reach the SuperLink from inside namespace A unchanged).

Needs root, iproute2 and working network namespaces (skipped otherwise). The namespaces (and
with them the veth pair) are deleted and every process is stopped even when the test fails."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from netns_hosts import ip, namespaces, netns_inode, netns_list, pid_netns_inode, probe

from fedpriv.ops import deploy, launcher

DATA = "synthetic-mf:users=30,items=20,ratings=400,seed=3"
USERS_PER_NODE = 10  # 30 users: 3 partitions, 3 nodes
NODES = 3
EPSILON = 4.0
# `fedpriv deploy run`'s default. Flower 1.39 polls every 3 s on both sides (SuperNode pull loop,
# ServerApp's send_and_receive), so each round costs ~6 s: 21 rounds secure (~145 s), 7 central.
AGGREGATION = "secure"


# ------------------------------------------------------------------------------ namespaces (tests/netns_hosts.py)


def _wrappers(folder: Path, ns: str) -> str:
    """A bin folder whose flower-superlink / flower-supernode / flwr run the venv's executable
    inside namespace ``ns`` (``ip netns exec`` execs it: same PID, same environment)."""
    folder.mkdir(parents=True)
    ip, venv_bin = shutil.which("ip"), Path(sys.executable).parent
    for name in ("flower-superlink", "flower-supernode", "flwr"):
        path = folder / name
        path.write_text(f'#!/bin/sh\nexec {ip} netns exec {ns} {venv_bin / name} "$@"\n')
        path.chmod(0o755)
    return str(folder)


# ------------------------------------------------------------------------------ processes
def _start(cfg, name: str, cmd: list[str], cwd: Path, home: Path, logs: Path, procs: dict) -> subprocess.Popen:
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=deploy._env(cfg, home), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    procs[name] = proc
    return proc


def _stop_all(procs: dict) -> list[int]:
    pids = [p.pid for p in procs.values()]
    below = launcher.descendant_pids(pids)  # taken first: children get re-parented
    launcher.terminate_pids([p for p in pids if launcher.pid_alive(p)], 15.0)
    left = [p for p in below if launcher.pid_alive(p)]
    if left:
        launcher.terminate_pids(left, 5.0)
    for p in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
    return pids + below


def _tails(logs: Path, n: int = 25) -> str:
    out = []
    for path in sorted(logs.glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()[-n:]
        out.append(f"----- {path.name} (last {len(lines)} lines)\n" + "\n".join(launcher.ANSI_ESCAPE.sub("", x) for x in lines))
    return "\n".join(out)


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------ the test
@pytest.mark.deployment
def test_superlink_and_supernodes_on_separate_hosts(tmp_path, monkeypatch):
    t0 = time.perf_counter()
    logs = tmp_path / "logs"
    procs: dict[str, subprocess.Popen] = {}
    seen: list[int] = []
    with namespaces("fp-link", "fp-nodes") as hosts:
        monkeypatch.setenv("NO_PROXY", ",".join(x for x in (os.environ.get("NO_PROXY", ""), hosts.a) if x))
        monkeypatch.setenv("no_proxy", ",".join(x for x in (os.environ.get("no_proxy", ""), hosts.a) if x))
        try:
            # host A's run folder: certificate for A's address, node keys, per-node data, CLI connection
            cfg = deploy.DeployConfig(run_dir=tmp_path / "host-a", nodes=NODES, data=DATA, users_per_node=USERS_PER_NODE,
                                      bind_host=hosts.a, superlink_host=hosts.a,
                                      bin_dir=_wrappers(tmp_path / "bin-a", hosts.ns_a))
            deploy.prepare(cfg)
            assert cfg.tls and cfg.auth
            deploy.verify_server_cert(cfg.ca_cert, cfg.server_cert, hosts.a)

            # host B: one folder per SuperNode with only its own files (same relative paths)
            bin_b = _wrappers(tmp_path / "bin-b", hosts.ns_b)
            node_cfgs = []
            for i in range(NODES):
                own = tmp_path / "host-b" / f"node-{i}"
                for rel in cfg.node_files(i):
                    src, dst = cfg.run_dir / rel, own / rel
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
                node_cfgs.append(dataclasses.replace(cfg, run_dir=own, bin_dir=bin_b))
            # ... and host A keeps no node key and no node data
            shutil.rmtree(cfg.run_dir / "keys")
            shutil.rmtree(cfg.run_dir / "node-data")

            sl_cmd = deploy.superlink_command(cfg)
            fleet, control = cfg.fleet_address, f"{hosts.a}:{cfg.control_port}"  # Fleet API: its own port on gRPC-rere (1.39), the HTTP port from 1.40
            assert fleet == f"{hosts.a}:{cfg.fleet_port if cfg.transport == 'grpc-rere' else cfg.control_port}"
            if cfg.transport == "grpc-rere":
                assert sl_cmd[sl_cmd.index("--fleet-api-address") + 1] == fleet
            else:
                assert "--fleet-api-address" not in sl_cmd
            assert sl_cmd[sl_cmd.index("--host") + 1] == hosts.a and "--enable-supernode-auth" in sl_cmd
            node_cmds = [deploy.supernode_command(node_cfgs[i], i) for i in range(NODES)]
            for i, cmd in enumerate(node_cmds):
                own = node_cfgs[i].run_dir
                assert cmd[cmd.index("--superlink") + 1] == fleet
                # 127.0.0.1 only as the node's own ClientApp API, on B's loopback
                assert [k for k, a in enumerate(cmd) if "127.0.0.1" in a] == [cmd.index("--host") + 1]
                # every file it is given lies in its own folder, which holds only its own files
                assert cmd[cmd.index("--root-certificates") + 1] == str(own / "certs" / "ca.crt")
                assert cmd[cmd.index("--auth-supernode-private-key") + 1] == str(own / "keys" / f"node-{i}")
                assert f'data-dir="{own / "node-data" / f"node-{i}"}"' in cmd[cmd.index("--node-config") + 1]
                files = _files_under(own)
                assert "certs/ca.crt" in files and f"keys/node-{i}" in files and any(f.startswith(f"node-data/node-{i}/") for f in files)
                assert all(f in ("certs/ca.crt", f"keys/node-{i}") or f.startswith(f"node-data/node-{i}/") for f in files), files

            # SuperLink on host A
            _start(cfg, "superlink", sl_cmd, cfg.run_dir, cfg.flwr_home, logs, procs)
            assert probe(hosts.ns_a, [fleet, control], wait=90.0) == {fleet: "open", control: "open"}, _tails(logs)
            assert pid_netns_inode(procs["superlink"].pid) == netns_inode(hosts.ns_a)

            # isolation: B reaches A's address, but not the host's loopback (a port listening there)
            with socket.socket() as host_lo:
                host_lo.bind(("127.0.0.1", 0))
                host_lo.listen()
                host_port = host_lo.getsockname()[1]
                seen_b = probe(hosts.ns_b, [fleet, control, f"127.0.0.1:{host_port}"])
                assert seen_b[fleet] == seen_b[control] == "open", seen_b
                assert seen_b[f"127.0.0.1:{host_port}"] != "open", seen_b
            # B's only IPv4 routes: the /30 on the veth (no default route: nothing but A is reachable)
            routes = ip("-n", hosts.ns_b, "-4", "route", "show").stdout.strip().splitlines()
            assert len(routes) == 1 and routes[0].startswith(hosts.a.rsplit(".", 1)[0] + ".0/30 "), routes

            # register the node keys through the Control API (flwr CLI on host A)
            deploy.write_connection(cfg)
            assert f'address = "{control}"' in (cfg.flwr_home / "config.toml").read_text()
            for i in range(NODES):
                r = subprocess.run(deploy.register_command(cfg, i), cwd=cfg.run_dir, env=deploy._env(cfg, cfg.flwr_home),
                                   capture_output=True, text=True, timeout=90)
                out = launcher.ANSI_ESCAPE.sub("", r.stdout + r.stderr)
                reply = json.JSONDecoder().raw_decode(out[out.find("{"):])[0] if "{" in out else {}
                assert r.returncode == 0 and reply.get("success"), f"register node {i} (exit {r.returncode}): {out[-2000:]}"

            # the SuperNodes on host B, each in its own folder
            for i, cmd in enumerate(node_cmds):
                own = node_cfgs[i].run_dir
                _start(node_cfgs[i], f"supernode-{i}", cmd, own, own / "flwr-home", logs, procs)
            deadline = time.monotonic() + 120
            online = 0
            while online < NODES:
                for name, p in procs.items():
                    assert p.poll() is None, f"{name} exited ({p.returncode}):\n{_tails(logs)}"
                with contextlib.suppress(Exception):
                    online = sum(n.get("status") == "online" for n in deploy.list_nodes(cfg, timeout=30))
                assert time.monotonic() < deadline, f"{online} of {NODES} SuperNodes online:\n{_tails(logs)}"
                if online < NODES:
                    time.sleep(1.0)
            for i in range(NODES):
                pid = procs[f"supernode-{i}"].pid
                assert pid_netns_inode(pid) == netns_inode(hosts.ns_b)
                assert launcher.process_cmdline(pid).split().count(fleet) == 1
            t_up = time.perf_counter() - t0

            # one job: adadpals at epsilon 4, 2 steps, `flwr run APP deploy --stream` on host A
            t1 = time.perf_counter()
            metrics = deploy.run_deployed_job(cfg, "adadpals", epsilon=EPSILON, overrides={"steps": "2"}, node_wait=60.0, quiet=True,
                                     timeout=480, aggregation=AGGREGATION)  # ~10 s a round on a loaded machine (21 rounds)
            t_run = time.perf_counter() - t1
            saved = json.loads((cfg.out_dir / "metrics.json").read_text())
            assert np.isfinite(saved["test_rmse"]) and saved["test_rmse"] == pytest.approx(metrics["test_rmse"])
            assert saved["engine"] == "flower" and saved["nodes"] == NODES and saved["aggregation"] == AGGREGATION
            rounds = [r["round"] for r in saved["round_log"]]
            assert "step1" in rounds and "step2" in rounds and "step3" not in rounds, rounds
            by_round = {r["round"]: r for r in saved["round_log"]}
            assert by_round["step1"]["replies"] == by_round["step2"]["replies"] == NODES
            assert saved["epsilon_spent"] <= EPSILON * (1 + 1e-9) and saved["epsilon_spent"] > 0
            # the server started from the public metadata only (host A holds no node's data)
            assert saved["server_holds_ratings"] is False and saved["n_ratings"] is None
            assert not (cfg.run_dir / "node-data").exists() and (cfg.run_dir / "public" / "meta.json").is_file()
            ledger = json.loads((cfg.out_dir / "ledger.json").read_text())
            assert ledger and all(int(rec["count"]) >= 1 for rec in ledger)
            print(f"\nnetns deploy ({hosts.ns_a} {hosts.a} <-> {hosts.ns_b} {hosts.b}), TLS+auth, {AGGREGATION}, {NODES} nodes: "
                  f"up {t_up:.1f} s, run {t_run:.1f} s, test_rmse {saved['test_rmse']:.3f}, epsilon {saved['epsilon_spent']:.3f}; rounds "
                  + ", ".join(f"{r['round']} {r['seconds']:.1f}" for r in saved["round_log"]))
        except BaseException:
            print("\n" + _tails(logs), file=sys.stderr)
            raise
        finally:
            seen += _stop_all(procs)
    assert hosts.ns_a not in netns_list() and hosts.ns_b not in netns_list(), netns_list()
    assert not any(launcher.pid_alive(p) for p in seen), [p for p in seen if launcher.pid_alive(p)]
    print(f"netns test total {time.perf_counter() - t0:.1f} s")
