"""The Docker deployment (``docker/``) on a real Docker engine: the images are built on a base
made here (``debootstrap`` of Debian bookworm, ``docker import``: no registry image) from a
wheelhouse built on the host (``docker/build-images.sh``), and ``docker/compose.yml`` runs as
shipped: the SuperLink on the host's 127.0.0.1 with TLS and SuperNode authentication, 4
SuperNodes each in a network of its own (``network_mode: none``, relayed to the SuperLink through
a Unix socket) mounting only its CA certificate, key, data and the relay's socket folder. A
process on the host cannot reach a SuperNode's Runtime API (tests/runtime_api_thief.py; the same
thief inside a node's container, the positive control, reads the node's state).
A secure-aggregation AdaDPALS job runs to the end while one SuperNode container is killed
(``docker kill``) after it shared its keys.

Needs a Docker daemon and, unless the image ``fedpriv-base:bookworm`` exists already, root and
``debootstrap`` (scripts/test.sh installs Debian's docker.io, docker-compose and debootstrap and
starts dockerd when run as root with apt, and sets FEDPRIV_REQUIRE_DOCKER=1: missing pieces then
fail the test instead of skipping it). The compose command is ``docker compose`` if it works,
else Debian's ``docker-compose`` (1.29). Everything the test creates is removed afterwards, on
failure too: containers, networks, volumes, the two images and their build stages. The base
image is kept (the cache of ``build-images.sh``: building it again takes about a minute)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
SCRIPT = DOCKER / "build-images.sh"
THIEF = Path(__file__).with_name("runtime_api_thief.py")
BASE = os.environ.get("FEDPRIV_BASE", "fedpriv-base:bookworm")
SYN = "synthetic-mf:users=300,items=100,ratings=9000,seed=1"  # 300 users: 4 nodes of 75
# 4 nodes: with one colluding node assumed (the default) a lost node's masks are recoverable with a
# Shamir threshold of 3 of its 4 holders (2t > k + 1 + 1); with 3 nodes every holder must answer
NODES = 4
# 2 steps; no bias stage (its 3 secure rounds cost ~25 s here: the steps estimate the item biases)
OVERRIDES = {"steps": "2", "rank": "4", "secure_dropout": "0.25", "bias_stage": "false"}
KILL_MARKER = "Receiving: query.secagg_mask message"  # node 2 has shared its keys and is asked for its masked input

pytestmark = pytest.mark.deployment

SUMMARY: list[str] = []  # printed at the end of the pytest run (see _summary below)


# ------------------------------------------------------------------------------ helpers
def _run(cmd, *, timeout: float = 120, check: bool = True, env=None, capture: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout, env=env, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{(out.stdout or '')[-3000:]}\n{(out.stderr or '')[-3000:]}")
    return out


def _unavailable(reason: str):
    if os.environ.get("FEDPRIV_REQUIRE_DOCKER") == "1":
        pytest.fail(f"FEDPRIV_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


def _compose_command() -> list[str] | None:
    """``docker compose`` (the v2 plugin) if it works, else ``docker-compose`` (Debian's 1.29)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def _listeners() -> dict[int, set]:
    """Listening TCP sockets of this network namespace (the containers share it): port -> addresses."""
    out: dict[int, set] = {}
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "0A":  # LISTEN
                continue
            addr, port = fields[1].split(":")
            raw = bytes.fromhex(addr)
            if v6:  # four host-order 32-bit words
                ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
                ip = ip.ipv4_mapped or ip
            else:
                ip = ipaddress.IPv4Address(raw[::-1])
            out.setdefault(int(port, 16), set()).add(ip)
    return out


def _ports() -> tuple[list[int], list[int]]:
    """The compose file's ports: the SuperLink's on the host (its one HTTP port with the Fleet API
    on the images' Flower >= 1.40; a gRPC Fleet port besides on 1.39), and each SuperNode's
    Runtime API port (inside its own container's network)."""
    from fedpriv.ops.deploy import docker_config

    cfg = docker_config(NODES)
    return list(cfg.superlink_ports), list(range(cfg.node_port_base, cfg.node_port_base + NODES))


def _image_size(ref: str) -> int:
    return int(_run(["docker", "image", "inspect", "-f", "{{.Size}}", ref]).stdout.strip())


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


class _Summary:
    """Prints SUMMARY at the end of the run (before tests/conftest.py's own summary hook, which
    then finds it empty: the lines are printed once)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter):
        for line in SUMMARY:
            terminalreporter.write_line(line)
        SUMMARY.clear()


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("fedpriv-docker-summary"):
        pm.register(_Summary(), "fedpriv-docker-summary")
    yield


# ------------------------------------------------------------------------------ static checks (no engine)
def test_images_build_from_the_wheelhouse_on_the_local_base():
    """No registry image and no package index in a build: both Dockerfiles start from the base
    build-images.sh makes and install from docker/wheels only; the build context (docker/) sends
    only the wheelhouse; the SuperNode's packages are fedpriv dependencies without torch."""
    import tomllib

    from fedpriv.ops.deploy.compose import BASE_IMAGE

    deps = {re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower() for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    for name in ("Dockerfile.superlink", "Dockerfile.supernode"):
        text = (DOCKER / name).read_text()
        assert f"ARG BASE={BASE_IMAGE}\n" in text and set(re.findall(r"^FROM (\S+)", text, re.M)) == {"${BASE}"}, name
        installs = re.findall(r"pip install[^\n]*", re.sub(r"\s*\\\n\s*", " ", text))  # continuation lines joined
        assert installs and all("--no-index --find-links /wheels -c /wheels/constraints.txt" in i for i in installs), name
    node = re.search(r'^ARG NODE_PACKAGES="([^"]*)"', (DOCKER / "Dockerfile.supernode").read_text(), re.M).group(1).split()
    assert set(node) <= deps and "torch" not in node, node
    assert (DOCKER / ".dockerignore").read_text().split("\n")[-3:] == ["*", "!wheels/", ""]
    assert not list(DOCKER.glob("Dockerfile.*.dockerignore"))  # BuildKit only: the classic builder reads .dockerignore
    assert os.access(SCRIPT, os.X_OK)
    _run(["bash", "-n", str(SCRIPT)])
    # the wheelhouse is pinned to the newest supported stack, the Flower whose transport
    # docker/compose.yml uses (HTTP Fleet API: no gRPC Fleet port exposed)
    from fedpriv.ops.deploy import docker_config
    from fedpriv.ops.deploy.flower_version import DOCKER_FLWR_VERSION, fleet_transport

    assert "ci/constraints-newest.txt" in SCRIPT.read_text()
    assert re.search(rf"^flwr=={re.escape(DOCKER_FLWR_VERSION)}$", (ROOT / "ci" / "constraints-newest.txt").read_text(), re.M)
    cfg = docker_config(NODES)
    assert cfg.transport == fleet_transport(DOCKER_FLWR_VERSION) == "http"
    exposed = [int(x) for x in re.search(r"^EXPOSE (.+)$", (DOCKER / "Dockerfile.superlink").read_text(), re.M).group(1).split()]
    assert exposed == cfg.superlink_ports == [cfg.control_port]


# ------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def engine():
    """The compose command, or a skip (a failure with FEDPRIV_REQUIRE_DOCKER=1) naming what is missing."""
    if shutil.which("docker") is None:
        _unavailable("no docker CLI")
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        _unavailable(f"no Docker daemon answers (start dockerd; scripts/test.sh does as root): {info.stderr.strip()[-300:]}")
    compose = _compose_command()
    if compose is None:
        _unavailable("neither `docker compose` nor docker-compose (apt-get install docker-compose)")
    has_base = subprocess.run(["docker", "image", "inspect", BASE], capture_output=True, timeout=60).returncode == 0
    if not has_base and (os.getuid() != 0 or shutil.which("debootstrap") is None):
        _unavailable(f"no image {BASE} and building it needs root and debootstrap (apt-get install debootstrap)")
    ports = _ports()[0]  # the SuperLink's, on the host (the nodes' are inside their containers)
    busy = sorted(set(ports) & set(_listeners()))
    if busy:
        _unavailable(f"the compose file's host ports are in use: {busy}")
    version = _run([*compose, "version", "--short"], check=False).stdout.strip()
    return {"compose": compose, "compose_version": version, "server": info.stdout.strip(), "ports": ports, "cold_base": not has_base}


@pytest.fixture(scope="module")
def images(engine):
    """Base (cached), wheelhouse and the two images, tagged for this test run; removed afterwards."""
    tag = f"test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "FEDPRIV_TAG": tag, "FEDPRIV_BASE": BASE, "COMPOSE": " ".join(engine["compose"])}
    refs = {"superlink": f"fedpriv-superlink:{tag}", "supernode": f"fedpriv-supernode:{tag}"}
    seconds: dict[str, float] = {}
    try:
        for step in ("base", "wheels", "images"):
            t0 = time.perf_counter()
            _run(["bash", str(SCRIPT), step], timeout=1800, env=env)
            seconds[step] = time.perf_counter() - t0
        sizes = {name: _image_size(ref) for name, ref in refs.items()} | {"base": _image_size(BASE)}
        SUMMARY.append(
            f"docker: images built in {sum(seconds.values()):.0f} s (base {'built' if engine['cold_base'] else 'cached'} {seconds['base']:.0f} s, "
            f"wheelhouse {seconds['wheels']:.0f} s, images {seconds['images']:.0f} s); sizes: SuperLink {_gb(sizes['superlink'])}, "
            f"SuperNode {_gb(sizes['supernode'])}, base {_gb(sizes['base'])} ({BASE}, kept); "
            f"engine {engine['server']}, {' '.join(engine['compose'])} {engine['compose_version']}"
        )
        yield {"tag": tag, "refs": refs, "env": env, "sizes": sizes, "seconds": seconds}
    finally:
        t0 = time.perf_counter()
        subprocess.run(["docker", "rmi", "-f", *refs.values()], capture_output=True, timeout=300)
        subprocess.run(["docker", "image", "prune", "-f", "--filter", "label=org.fedpriv.stage=install"], capture_output=True, timeout=300)
        SUMMARY.append(f"docker: images removed in {time.perf_counter() - t0:.0f} s (kept: {BASE})")


def test_supernode_image_has_no_torch(images):
    """The SuperNode image carries the light client only (no torch); the SuperLink's ServerApp has torch."""
    from fedpriv.ops.deploy.flower_version import DOCKER_FLWR_VERSION

    probe = ("import importlib.util as u, importlib.metadata as m; "
             "print(json.dumps({**{x: u.find_spec(x) is not None for x in ('torch', 'fedpriv', 'flwr')}, 'flwr_version': m.version('flwr')}))")
    found = {}
    for name, ref in images["refs"].items():
        out = _run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", ref, "-c", "import json; " + probe])
        found[name] = json.loads(out.stdout.strip().splitlines()[-1])
    # the images' Flower is the one docker/compose.yml's commands are written for
    assert found["supernode"] == {"torch": False, "fedpriv": True, "flwr": True, "flwr_version": DOCKER_FLWR_VERSION}, found
    assert found["superlink"] == {"torch": True, "fedpriv": True, "flwr": True, "flwr_version": DOCKER_FLWR_VERSION}, found
    assert images["sizes"]["supernode"] < images["sizes"]["superlink"] / 2


@pytest.fixture
def stack(engine, images, tmp_path):
    """`deploy prepare --docker` on the host, then the shipped compose file up (its own project
    name); afterwards `down` with volumes and networks, and every container of the project removed."""
    from fedpriv.cli import main

    run_dir = tmp_path / "run"
    assert main(["deploy", "prepare", "--docker", "--run-dir", str(run_dir), "--nodes", str(NODES), "--data", SYN, "--users-per-node", "75"]) == 0
    project = f"fedpriv-{images['tag']}"
    env = {**images["env"], "FEDPRIV_RUN_DIR": str(run_dir)}
    # the shipped compose file has 3 SuperNodes; the builder that wrote it writes the same file for
    # NODES (4: with one colluder assumed, 3 nodes cannot lose one), beside it (the same build context)
    from fedpriv.ops.deploy.compose import compose_yaml

    assert compose_yaml(3) == (DOCKER / "compose.yml").read_text()
    compose_file = DOCKER / f"compose-{images['tag']}.yml"
    compose_file.write_text(compose_yaml(NODES))
    compose = [*engine["compose"], "-p", project, "-f", str(compose_file)]

    def ids(service: str) -> list[str]:
        return _run([*compose, "ps", "-a", "-q", service], env=env, check=False).stdout.split()

    t0 = time.perf_counter()
    try:
        _run([*compose, "up", "-d"], env=env, timeout=600)
        yield {"compose": compose, "env": env, "run_dir": run_dir, "project": project, "ids": ids, "up_seconds": time.perf_counter() - t0}
    finally:
        t0 = time.perf_counter()
        label = f"label=com.docker.compose.project={project}"
        for cid in subprocess.run(["docker", "ps", "-a", "-q", "--filter", label], capture_output=True, text=True, timeout=60).stdout.split():
            logs = subprocess.run(["docker", "logs", "--tail", "25", cid], capture_output=True, text=True, timeout=60)
            print(f"--- container {cid} (last lines)\n{logs.stdout}{logs.stderr}")  # shown when the test fails
        if os.getuid() != 0 and run_dir.exists():  # files the containers (root) wrote into the run folder
            subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{run_dir}:/fedpriv", "--entrypoint", "chown", images["refs"]["superlink"],
                            "-R", f"{os.getuid()}:{os.getgid()}", "/fedpriv"], capture_output=True, timeout=120)
        subprocess.run([*compose, "down", "-v", "--remove-orphans", "-t", "5"], env=env, capture_output=True, timeout=300)
        for kind in ("container", "network", "volume"):
            left = subprocess.run(["docker", kind, "ls", "-q", *(["-a"] if kind == "container" else []), "--filter", label],
                                  capture_output=True, text=True, timeout=60).stdout.split()
            if left:
                subprocess.run(["docker", kind, "rm", *(["-f"] if kind != "network" else []), *left], capture_output=True, timeout=120)
        SUMMARY.append(f"docker: compose down and cleanup {time.perf_counter() - t0:.0f} s")
        compose_file.unlink(missing_ok=True)


def _wait_online(superlink: str, n: int, seconds: float = 180.0) -> list[dict]:
    deadline = time.monotonic() + seconds
    nodes: list[dict] = []
    while time.monotonic() < deadline:
        out = _run(["docker", "exec", superlink, "fedpriv", "deploy", "status", "--run-dir", "/fedpriv"], check=False, timeout=120)
        if out.returncode == 0:
            nodes = json.loads(out.stdout)["nodes"]
            if sum(x["status"] == "online" for x in nodes) >= n:
                return nodes
        time.sleep(2)
    raise AssertionError(f"{n} SuperNodes not online after {seconds:.0f} s: {nodes}")


def _kill_when(container: str, marker: str):
    """`docker kill` the container as soon as ``marker`` is in its log. Returns (killed, done, thread)."""
    from fedpriv.testing.chaos import kill_when

    def seen() -> bool:
        logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True, timeout=60)
        return marker in logs.stdout + logs.stderr

    return kill_when(seen, lambda: subprocess.run(["docker", "kill", container], capture_output=True, timeout=60), interval=0.3)


def test_compose_secure_run_completes_with_a_supernode_container_killed(stack, images, request):
    """The shipped compose file: TLS, node authentication, the SuperLink on the host's loopback
    only, each SuperNode in a network of its own with only its own files; a process on the host
    cannot reach a node's Runtime API, while the same thief inside node 0's container (positive
    control) takes its tasks and reads its secure-summation state (and relays them: the run goes on). A 2-step AdaDPALS job in secure mode (`fedpriv deploy run`
    in the SuperLink container, as docker/README.md says) completes although SuperNode 2's
    container is killed after it shared its keys; metrics.json and ledger.json reach the host's
    run folder, and the ledger gives the run's epsilon."""
    from fedpriv.algorithms import als
    from fedpriv.ops import deploy
    from fedpriv.privacy.accounting import epsilon_bounds
    from fedpriv.privacy.ledger import PrivacyLedger

    ids, run_dir = stack["ids"], stack["run_dir"]
    (superlink,), (register,) = ids("superlink"), ids("register")
    nodes = [ids(f"supernode-{i}")[0] for i in range(NODES)]
    t0 = time.perf_counter()
    online = _wait_online(superlink, NODES)
    t_online = stack["up_seconds"] + time.perf_counter() - t0
    reg = _run(["docker", "inspect", "-f", "{{.State.ExitCode}}", register]).stdout.strip()
    registered = json.loads(_run(["docker", "logs", register]).stdout.strip().splitlines()[-1])["registered"]
    assert reg == "0" and sorted(registered) == sorted(n["node-id"] for n in online) and len(registered) == NODES

    # the layout: the SuperLink on the host's network, on loopback only; each node in a network of
    # its own (no route out) with only its own files and the relay's socket folder, read-only, and its
    # own ledger's named volume, writable (its budget across runs and restarts)
    cfg = deploy.docker_config(NODES)
    listening = _listeners()
    host_ports, node_ports = _ports()
    for port in host_ports:
        assert listening.get(port) and all(ip.is_loopback for ip in listening[port]), (port, listening.get(port))
    assert not any(listening.get(port) for port in node_ports), {p: listening.get(p) for p in node_ports}  # no node's Runtime API on the host
    (relay,) = ids("relay")
    for cid, mode in ((superlink, "host"), (relay, "host"), *((n, "none") for n in nodes)):
        assert _run(["docker", "inspect", "-f", "{{.HostConfig.NetworkMode}}", cid]).stdout.strip() == mode
    for i, cid in enumerate(nodes):
        mounts = json.loads(_run(["docker", "inspect", "-f", "{{json .Mounts}}", cid]).stdout)
        assert {m["Destination"]: m["RW"] for m in mounts} == {str(cfg.ca_cert): False, str(cfg.node_private_key(i)): False, str(cfg.node_data_dir(i)): False,
                                                              "/fedpriv/relay": False, str(Path(deploy.DOCKER_NODE_LEDGER).parent): True}
    tmpfs = json.loads(_run(["docker", "inspect", "-f", "{{json .HostConfig.Tmpfs}}", superlink]).stdout)
    assert set(tmpfs) == {"/fedpriv/keys", "/fedpriv/node-data"}  # the server sees no node key and no rating
    assert _run(["docker", "exec", superlink, "ls", "-A", "/fedpriv/keys", "/fedpriv/node-data"]).stdout.split() == ["/fedpriv/keys:", "/fedpriv/node-data:"]

    # the Runtime API thief (issue 41, item 5) on the host, and, as its positive control, inside
    # SuperNode 0's container (its own network, where that API lives)
    stop_file = run_dir.parent / "thief-stop"
    host_thief = subprocess.Popen([sys.executable, str(THIEF), "--ports", *map(str, node_ports), "--out", str(run_dir.parent / "thief-host"),
                                   "--seconds", "1200", "--stop-file", str(stop_file)], stdout=subprocess.DEVNULL,
                                  stderr=open(run_dir.parent / "thief-host.log", "wb"))
    request.addfinalizer(lambda: host_thief.poll() is None and host_thief.kill())
    _run(["docker", "cp", str(THIEF), f"{nodes[0]}:/tmp/thief.py"])
    _run(["docker", "exec", "-d", "-e", "FLWR_HOME=/tmp/thief-home", nodes[0], "python", "/tmp/thief.py", "--ports", str(node_ports[0]), "--out", "/tmp/thief",
          "--seconds", "1200", "--stop-file", "/tmp/thief-stop"])

    killed, done, watcher = _kill_when(nodes[2], KILL_MARKER)
    cmd = ["docker", "exec", superlink, "fedpriv", "deploy", "run", "--run-dir", "/fedpriv", "adadpals", "--epsilon", "1", "--aggregation", "secure",
           *[a for k, v in OVERRIDES.items() for a in ("--set", f"{k}={v}")], "--round-timeout", "20", "--node-wait", "60", "--quiet", "--timeout", "900"]
    t1 = time.perf_counter()
    try:
        out = _run(cmd, timeout=1000, check=False)
    finally:
        done.set()
        watcher.join(timeout=10)
        stop_file.touch()
        _run(["docker", "exec", nodes[0], "touch", "/tmp/thief-stop"], check=False)
    t_run = time.perf_counter() - t1
    assert host_thief.wait(timeout=120) == 0, (run_dir.parent / "thief-host.log").read_text()[-3000:]
    inside = None
    for _ in range(120):  # the thief in the container writes its summary once its relayed tasks ended
        got = _run(["docker", "exec", nodes[0], "cat", "/tmp/thief/summary.json"], check=False)
        if got.returncode == 0:
            inside = json.loads(got.stdout)
            break
        time.sleep(1)
    assert inside is not None, "the thief in SuperNode 0's container wrote no summary"
    stolen = [json.loads(_run(["docker", "exec", nodes[0], "cat", f]).stdout) for f in inside["contexts"]]
    outside = json.loads((run_dir.parent / "thief-host" / "summary.json").read_text())
    # from the host: every connection to the nodes' Runtime API ports refused, nothing taken
    assert not any(r["answered"] or r["tasks"] for r in outside["ports"].values()) and outside["contexts"] == [], outside
    assert all(any("ConnectError" in e or "refused" in e.lower() for e in r["errors"]) for r in outside["ports"].values()), outside
    # inside the node's own network (positive control): tasks taken, the node's secure-summation state read
    assert inside["ports"][str(node_ports[0])]["answered"] and inside["ports"][str(node_ports[0])]["tasks"] > 0, inside
    # a secure run: the node's secure-summation state (its channel key, mask keys and shares)
    blobs = [c["state"]["fedpriv-secagg"]["blob"] for c in stolen if "fedpriv-secagg" in c["state"]]
    assert blobs and all(b["bytes"] > 0 for b in blobs), stolen
    assert out.returncode == 0, f"deploy run exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    assert killed.is_set(), "SuperNode 2 never received a masked-input request"
    state = _run(["docker", "inspect", "-f", "{{.State.Running}} {{.RestartCount}}", nodes[2]]).stdout.split()
    assert state == ["false", "0"], state  # killed by hand: not restarted (restart: on-failure)
    summary = json.loads(out.stdout.strip().splitlines()[-1])

    metrics = json.loads((run_dir / "out" / "metrics.json").read_text())
    records = json.loads((run_dir / "out" / "ledger.json").read_text())
    assert metrics["aggregation"] == "secure" and metrics["engine"] == "flower" and metrics["nodes"] == NODES
    assert metrics["dataset"] == "public:/fedpriv/public" and metrics["server_holds_ratings"] is False  # the ServerApp started from the public metadata only
    assert {rec["mechanism"] for rec in records} == {"skellam"}
    counts: dict = {}
    for rec in records:
        counts[rec["name"]] = counts.get(rec["name"], 0) + int(rec["count"])
    plan = als.plan_releases("adadpals", als.ALSConfig.from_overrides({**OVERRIDES, "aggregation": "secure"}, "adadpals"), False)
    assert {p.name: p.count for p in plan} == counts
    # epsilon from the ledger itself, under the relation the deployment states (replace-one: the
    # enrolled count is public), which every figure of the run reports
    assert metrics["neighbouring_relation"] == "replace_one"
    eps = epsilon_bounds(PrivacyLedger.releases_from_list(records), metrics["delta"], relation="replace_one")[0]
    assert eps == pytest.approx(metrics["epsilon_spent"], rel=1e-9) == pytest.approx(summary["epsilon_spent"], rel=1e-9)
    assert eps == pytest.approx(1.0, rel=1e-3) and eps <= 1.0 * (1 + 1e-3)
    by_round = {r["round"]: r for r in metrics["round_log"]}
    assert by_round["secagg_keys"]["replies"] == NODES and by_round["step2"]["replies"] == NODES - 1
    assert any(r["node"] for r in metrics["rejected_replies"])  # the killed node's missing replies, logged
    assert np.isfinite(metrics["test_rmse"])
    SUMMARY.append(
        f"docker: compose up and {NODES} nodes online {t_online:.0f} s; secure AdaDPALS (steps 2) with supernode-2 killed: run {t_run:.0f} s, "
        f"runtime-API thief: {len(stolen)} tasks of node 0 taken inside its container, 0 from the host; "
        f"{len(metrics['round_log'])} rounds, epsilon {eps:.4f} from the ledger, test RMSE {metrics['test_rmse']:.4f}"
    )
    print("\n" + SUMMARY[-1])
