"""Starting and watching the processes: spawning, free ports, the ``flwr`` CLI helpers (node and
run listing, ``flwr stop``), registering node keys, :func:`up` and :func:`wait_for_nodes`.
The PID records and :func:`stop` are in :mod:`.pids`."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from ...util import atomic
from ...errors import ConfigError, FedprivError
from .. import launcher
from . import netns
from .commands import _exe, connection_toml, register_command, superlink_command, supernode_command
from .config import CLI_SECONDS, CONNECTION, LOCAL_HOSTS, PIDS_FILE, DeployConfig, _bin_dir
from .flower_version import fleet_transport, flwr_version
from .pids import _start_ticks, _write_pids, running, stop
from .prepare import prepare


def _env(cfg: DeployConfig, home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = launcher.flwr_env(home)  # offline env, our bin dir first on PATH, FLWR_HOME
    for key in ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT"):
        env.pop(key, None)
    return env


CLIENTAPP_SLOTS_ENV = (
    "FEDPRIV_CLIENTAPP_SLOTS"  # ClientApp processes running at once on this host (default: 8 per core)
)


def clientapp_gate(cfg: DeployConfig) -> Path | None:
    """A ``flwr-clientapp`` wrapper that lets at most N of them run at once on this host (a lock
    file per slot, held by the process until it exits), first on the SuperNodes' PATH.

    Flower 1.39 starts one ``flwr-clientapp`` process per message. With many SuperNodes on one
    host they all start in the same second, share the cores, and some do not reach their
    SuperNode within Flower's claim window: the task then goes back to pending and another
    process is started for it, so processes pile up (measured: 237 at once for 50 nodes, until
    memory ran out). Queued at the gate, a process costs nothing, and each one that runs gets
    the cores. A ClientApp process lives about 6 s, mostly in Flower's fixed 3 s polling waits,
    so the default allows 8 per core. The SuperNodes run with a claim window the queue fits in
    (:mod:`fedpriv.ops.deploy.supernode_main`). None without ``flock`` (util-linux): the nodes
    then start processes ungated, with Flower's own window."""
    flock = shutil.which("flock")
    if flock is None:
        return None
    n = int(os.environ.get(CLIENTAPP_SLOTS_ENV, "0") or 0) or 8 * (os.cpu_count() or 1)
    gate = cfg.run_dir / "clientapp-gate"
    (gate / "slots").mkdir(parents=True, exist_ok=True)
    real = Path(cfg.bin_dir or _bin_dir()) / "flwr-clientapp"
    script = gate / "flwr-clientapp"
    # one pass over the slots without waiting; all taken: wait (blocked, no CPU) on one slot
    # picked by the process id. A spinning wait cost more CPU than the ClientApps themselves
    # with 90 processes queued (measured: load average 160, 27 launches in 8 minutes).
    script.write_text(
        "#!/bin/sh\n"
        f"# fedpriv deploy: at most {n} flwr-clientapp processes at once on this host "
        "(see fedpriv/ops/deploy/processes.py)\n"
        f"i=0; while [ $i -lt {n} ]; do\n"
        f'  exec 9>"{gate}/slots/$i"\n'
        f'  if {flock} -n 9; then exec "{real}" "$@"; fi\n'
        "  i=$((i+1))\n"
        "done\n"
        f'exec 9>"{gate}/slots/$(($$ % {n}))"\n'
        f'{flock} 9 && exec "{real}" "$@"\n'
        "exit 1\n"
    )
    script.chmod(0o755)
    return gate


NODE_NETNS_ENV = "FEDPRIV_NODE_NETNS"  # "0": the SuperNodes share the host's network namespace (unprotected)


def node_netns_prefix(cfg: DeployConfig) -> list[str]:
    """The argv prefix that starts a SuperNode in a network namespace of its own
    (:mod:`.netns`), its Fleet API port relayed to the SuperLink on the host's loopback; empty
    with ``FEDPRIV_NODE_NETNS=0``. Its Runtime API, which hands the node's tasks and
    ``context.state`` to any caller, is then reachable by its own processes only; in the host's
    namespace it is reachable by every process on the host (tests/test_hostnet.py)."""
    if os.environ.get(NODE_NETNS_ENV, "1").strip() == "0":
        return []
    unprotected = (
        f"set {NODE_NETNS_ENV}=0 to start the SuperNodes in the host's network anyway, "
        "where every process on this host can claim their tasks and read their state"
    )
    if cfg.superlink_host not in LOCAL_HOSTS:
        raise ConfigError(
            "a SuperNode in a network namespace of its own reaches the SuperLink on the host's loopback only, "
            f"not {cfg.superlink_host}: {unprotected}",
            field=NODE_NETNS_ENV,
        )
    why = netns.unavailable()
    if why:
        raise ConfigError(
            f"cannot give each SuperNode a network namespace of its own ({why}): {unprotected}", field=NODE_NETNS_ENV
        )
    return [sys.executable, str(Path(netns.__file__).resolve()), "--forward", str(cfg.fleet_api_port), "--"]


def _spawn(cfg: DeployConfig, name: str, cmd: list[str], home: Path, gate: Path | None = None) -> dict:
    cfg.logs_dir.mkdir(parents=True, exist_ok=True)
    env = _env(cfg, home)
    if gate is not None:
        env["PATH"] = f"{gate}{os.pathsep}{env.get('PATH', '')}"
    with open(cfg.logs_dir / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=cfg.run_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return {"name": name, "pid": proc.pid, "start": _start_ticks(proc.pid), "cmd": cmd}


def _tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(launcher.ANSI_ESCAPE.sub("", line) for line in lines[-n:])


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held open together while choosing)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _free_block(n: int) -> int:
    """The first of ``n`` consecutive free loopback ports, below the kernel's ephemeral range:
    SuperNodes bind theirs one wave after another, minutes apart, and a port inside that range
    may meanwhile be taken by an outgoing connection (measured: node 35 of 100 failed to bind)."""
    import random

    low, _ = _ephemeral_range()
    top = min(low, 65536) - n
    for _ in range(200):
        base = random.randrange(10000, top) if top > 10000 else free_ports(1)[0]
        if base + n > 65535:
            continue
        if all(_bindable(p) for p in range(base, base + n)):
            return base
    raise FedprivError(f"found no {n} consecutive free loopback ports")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def write_connection(cfg: DeployConfig) -> Path:
    """``RUN_DIR/flwr-home/config.toml`` (rewritten before every CLI call: the run folder may be
    mounted at another path than where it was prepared)."""
    cfg.flwr_home.mkdir(parents=True, exist_ok=True)
    path = cfg.flwr_home / "config.toml"
    text = connection_toml(cfg)
    if not path.is_file() or path.read_text() != text:
        atomic.write_text(path, text)
    return path


def _flwr_cli(cfg: DeployConfig, cmd: list[str], timeout: float = CLI_SECONDS) -> tuple[int, str]:
    """Run a ``flwr`` CLI command against the connection ``deploy``: (exit code, output)."""
    write_connection(cfg)
    try:
        r = subprocess.run(
            cmd,
            cwd=cfg.run_dir,
            env=_env(cfg, cfg.flwr_home),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return 124, f"`{' '.join(cmd)}` did not finish within {timeout:g} s"
    return r.returncode, launcher.ANSI_ESCAPE.sub("", r.stdout + r.stderr)


def _json_of(output: str):
    start = output.find("{")
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(output[start:])[0]
    except ValueError:
        return None


def list_nodes(cfg: DeployConfig, timeout: float = CLI_SECONDS) -> list[dict]:
    """``flwr supernode ls``: the SuperLink's nodes (``node-id``, ``status``, ...)."""
    code, out = _flwr_cli(cfg, [_exe(cfg, "flwr"), "supernode", "ls", CONNECTION, "--format", "json"], timeout)
    data = _json_of(out)
    if code != 0 or not isinstance(data, dict) or not data.get("success"):
        raise FedprivError(f"`flwr supernode ls` failed (exit {code}): {out.strip()[-2000:]}")
    return list(data.get("nodes", []))


def list_runs(cfg: DeployConfig) -> list[dict]:
    """``flwr ls``: the SuperLink's runs (``run-id``, ``status``, ...); empty if it does not answer."""
    code, out = _flwr_cli(cfg, [_exe(cfg, "flwr"), "ls", CONNECTION, "--format", "json"])
    data = _json_of(out)
    return list(data.get("runs", [])) if code == 0 and isinstance(data, dict) else []


def stop_runs(cfg: DeployConfig, exclude=()) -> list[str]:
    """``flwr stop`` every unfinished run (but those in ``exclude``): after a failed or
    interrupted ``flwr run`` its ServerApp would otherwise go on on the SuperLink."""
    stopped = []
    for r in list_runs(cfg):
        rid = r.get("run-id")
        if rid and rid not in exclude and not str(r.get("status", "")).startswith("finished"):
            _flwr_cli(cfg, [_exe(cfg, "flwr"), "stop", str(rid), CONNECTION])
            stopped.append(rid)
    return stopped


def register_supernodes(
    cfg: DeployConfig, *, wait: float = 60.0, indices: list[int] | None = None, workers: int = 4
) -> list[str]:
    """Register the public key of every node (or of ``indices``) with the SuperLink, waiting up
    to ``wait`` seconds for its Control API; returns the node ids. A key registered before
    counts as registered."""
    if not cfg.auth:
        return []
    deadline = time.monotonic() + wait
    while not _port_open(cfg.superlink_host, cfg.control_port):
        if time.monotonic() > deadline:
            raise FedprivError(f"the SuperLink's Control API at {cfg.control_address} did not answer within {wait:g} s")
        time.sleep(0.5)
    indices = list(range(cfg.nodes)) if indices is None else indices

    def one(i: int) -> str:
        code, out = _flwr_cli(cfg, register_command(cfg, i))
        data = _json_of(out)
        if code == 0 and isinstance(data, dict) and data.get("success"):
            return str(data.get("node-id"))
        if "already" in out.lower():
            return "registered before"
        raise FedprivError(f"`flwr supernode register` of node {i} failed (exit {code}): {out.strip()[-2000:]}")

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, indices))


def up(cfg: DeployConfig, *, wait: float = 180.0, job=None) -> DeployConfig:
    """Prepare the run folder, start the SuperLink and the SuperNodes in the background
    (``pids.json``, ``logs/``), register the node keys, and wait until every node is online.
    Any failure stops every process started here."""
    cfg.run_dir = Path(cfg.run_dir).expanduser().resolve()
    if cfg.bin_dir is None:
        cfg.bin_dir = _bin_dir()
    if (
        cfg.fleet_api is not None and cfg.fleet_api != fleet_transport()
    ):  # the processes started here are the installed Flower's
        raise ConfigError(
            f"the installed Flower {'.'.join(map(str, flwr_version()))} speaks {fleet_transport()} "
            f"to its SuperNodes, not {cfg.fleet_api}",
            field="fleet_api",
        )
    live = running(DeployConfig(run_dir=cfg.run_dir, nodes=1))
    if live:
        raise ConfigError(
            f"a deployment is running in {cfg.run_dir} (PIDs {', '.join(str(e['pid']) for e in live)}): "
            "`fedpriv deploy down` first",
            field="--run-dir",
        )
    # fresh loopback ports unless given (0 = choose)
    if 0 in (cfg.fleet_port, cfg.control_port, cfg.node_port_base):
        chosen = iter(free_ports(2))
        cfg.fleet_port = cfg.fleet_port or next(chosen)
        cfg.control_port = cfg.control_port or next(chosen)
        if not cfg.node_port_base:
            while True:
                base = _free_block(cfg.nodes)
                if not {cfg.fleet_port, cfg.control_port} & set(range(base, base + cfg.nodes)):
                    break
            cfg.node_port_base = base
    isolate = node_netns_prefix(cfg)  # checked before anything is written or started
    prepare(cfg, job=job)
    (cfg.run_dir / PIDS_FILE).unlink(missing_ok=True)
    shutil.rmtree(cfg.logs_dir, ignore_errors=True)
    entries: list[dict] = []
    try:
        entries.append(_spawn(cfg, "superlink", superlink_command(cfg), cfg.flwr_home))
        _write_pids(cfg, entries)
        deadline = time.monotonic() + wait
        while not all(
            _port_open(cfg.superlink_host, port) for port in cfg.superlink_ports
        ):  # Fleet API on a port of its own only on gRPC-rere
            if not launcher.pid_alive(entries[0]["pid"]):
                raise FedprivError("the SuperLink exited; its log:\n" + _tail(cfg.logs_dir / "superlink.log"))
            if time.monotonic() > deadline:
                raise FedprivError(
                    f"the SuperLink did not listen within {wait:g} s; its log:\n"
                    + _tail(cfg.logs_dir / "superlink.log")
                )
            time.sleep(0.3)
        register_supernodes(cfg, wait=max(5.0, deadline - time.monotonic()))
        wave = node_wave()
        gate = clientapp_gate(cfg)
        for start in range(0, cfg.nodes, wave):
            started = []
            for i in range(start, min(start + wave, cfg.nodes)):
                cmd = supernode_command(cfg, i)
                if gate is not None:  # Flower's SuperNode with a claim window the gate's queue fits in
                    cmd = [sys.executable, "-m", "fedpriv.ops.deploy.supernode_main", *cmd[1:]]
                started.append(_spawn(cfg, f"supernode-{i}", isolate + cmd, cfg.node_home(i), gate))
                entries.append(started[-1])
                _write_pids(cfg, entries)
            if start + wave < cfg.nodes:
                _wait_connected(cfg, started, min(deadline, time.monotonic() + WAVE_SECONDS))
        wait_for_supernodes(cfg, entries, deadline)
    except BaseException:
        stop(cfg.run_dir, also=entries)
        raise
    return cfg


WAVE_SECONDS = 120.0  # at most this long for one wave of SuperNodes to connect before the next starts


def node_wave() -> int:
    """SuperNodes started at once: four per core. All at once (100 nodes: 200 Python processes
    importing flwr on 2 cores) starve their first heartbeats; the SuperLink then lists some of
    them offline for good (measured: 15 of 100 here)."""
    return max(4, 4 * (os.cpu_count() or 1))


def _wait_connected(cfg: DeployConfig, started: list[dict], until: float) -> None:
    """Until every SuperNode of ``started`` logged that it has connected and started its
    SuperExec (or ``until``: the final check is :func:`wait_for_nodes`)."""
    pending = [e["name"] for e in started]
    while pending and time.monotonic() < until:
        pending = [n for n in pending if "Starting Flower SuperExec" not in _tail(cfg.logs_dir / f"{n}.log", 200)]
        if pending:
            time.sleep(0.5)


def wait_for_supernodes(cfg: DeployConfig, entries: list[dict], deadline: float) -> None:
    """Until ``flwr supernode ls`` shows every node online; fails early if a SuperNode exits.
    A slow or failing ``ls`` (a loaded machine while many nodes start) is retried until the
    deadline."""
    online, error = 0, ""
    while True:
        for e in entries:
            if e["name"].startswith("supernode") and not launcher.pid_alive(e["pid"]):
                raise FedprivError(f"{e['name']} exited; its log:\n" + _tail(cfg.logs_dir / f"{e['name']}.log"))
        try:
            online = sum(
                1
                for n in list_nodes(cfg, timeout=max(10.0, min(CLI_SECONDS, deadline - time.monotonic())))
                if n.get("status") == "online"
            )
            error = ""
        except FedprivError as exc:
            error = f" (last `flwr supernode ls`: {exc})"
        if online >= cfg.nodes:
            return
        if time.monotonic() > deadline:
            raise FedprivError(
                f"{online} of {cfg.nodes} SuperNodes online after the wait{error}; last SuperNode log:\n"
                + _tail(cfg.logs_dir / f"supernode-{cfg.nodes - 1}.log")
            )
        time.sleep(1.0 if cfg.nodes <= 10 else 3.0)
