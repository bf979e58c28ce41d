"""``fedpriv deploy``: Flower's deployment runtime (SuperLink + SuperNodes on loopback: gRPC-rere on Flower 1.39, HTTP from 1.40,
TLS, SuperNode authentication, per-node data) and the Docker compose file generated from the
same command builders.

Unmarked tests start no process. ``@pytest.mark.deployment`` tests start a SuperLink and
SuperNodes on 127.0.0.1 and always stop them (by PID, with their children)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from fedpriv.cli import main
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.ops import deploy, launcher

ROOT = Path(__file__).resolve().parents[1]
SYN = "synthetic-mf:users=300,items=100,ratings=9000,seed=1"
SMALL = "synthetic-mf:users=40,items=30,ratings=800,seed=3"
ML100K = ROOT.parent / "shared" / "data" / "ml-100k" / "ml-100k.zip"


# ------------------------------------------------------------------------------ command builders
def _cfg(tmp_path, **kw) -> deploy.DeployConfig:
    base = dict(run_dir=tmp_path / "run", nodes=3, fleet_port=19092, control_port=18000, node_port_base=19094, bin_dir="/venv/bin")
    return deploy.DeployConfig(**{**base, **kw})


@pytest.mark.parametrize("fleet_api", ["grpc-rere", "http"])
def test_builders_bind_loopback_with_tls_and_auth(tmp_path, fleet_api):
    """Flower 1.39 (gRPC-rere): the Fleet API on a port of its own; Flower >= 1.40 (HTTP): on
    the SuperLink's one HTTP port, no --fleet-api-address. TLS and authentication: the same flags."""
    cfg = _cfg(tmp_path, data=SYN, users_per_node=100, fleet_api=fleet_api)
    sl = deploy.superlink_command(cfg)
    assert sl[0] == "/venv/bin/flower-superlink"
    fleet = "127.0.0.1:19092" if fleet_api == "grpc-rere" else "127.0.0.1:18000"
    if fleet_api == "grpc-rere":
        assert sl[sl.index("--fleet-api-address") + 1] == fleet and cfg.superlink_ports == [18000, 19092]
    else:
        assert "--fleet-api-address" not in sl and "--fleet-api-type" not in sl and cfg.superlink_ports == [18000]
    assert cfg.fleet_address == fleet
    assert sl[sl.index("--host") + 1] == "127.0.0.1" and sl[sl.index("--port") + 1] == "18000"
    assert sl[sl.index("--ssl-ca-certfile") + 1] == str(cfg.ca_cert) and "--enable-supernode-auth" in sl and "--insecure" not in sl
    sn = deploy.supernode_command(cfg, 2)
    assert sn[sn.index("--superlink") + 1] == fleet and sn[sn.index("--host") + 1] == "127.0.0.1" and "--grpc-rere" not in sn
    assert sn[sn.index("--port") + 1] == "19096" and sn[sn.index("--root-certificates") + 1] == str(cfg.ca_cert)
    assert sn[sn.index("--auth-supernode-private-key") + 1] == str(cfg.node_private_key(2))
    # the node config parses (flwr's own parser) into the partition and the node's own folder
    from flwr.common.config import parse_config_args

    nc = parse_config_args([sn[sn.index("--node-config") + 1]])
    assert {k: v for k, v in nc.items() if not k.startswith("policy-")} == {"partition-id": 2, "num-partitions": 3, "data-dir": str(cfg.node_data_dir(2))}
    from fedpriv.flower.node_policy import DEFAULT, NodePolicy  # and the node's own privacy policy (the deployment's secure default here)

    want = DEFAULT.with_changes(aggregation="secure", relation="replace_one", ledger=str(cfg.node_data_dir(2) / "node-ledger.json"))
    assert NodePolicy.from_mapping({k: v for k, v in nc.items() if k.startswith("policy-")}) == want
    assert deploy.flwr_run_command(cfg) == ["/venv/bin/flwr", "run", str(cfg.app_dir), "deploy", "--stream", "--run-config", str(cfg.run_config_file)]

    plain = _cfg(tmp_path, tls=False, auth=False, fleet_api=fleet_api)
    assert "--insecure" in deploy.superlink_command(plain) and "--enable-supernode-auth" not in deploy.superlink_command(plain)
    assert "--insecure" in deploy.supernode_command(plain, 0) and "data-dir" not in deploy.node_config(plain, 0)
    assert 'insecure = true' in deploy.connection_toml(plain) and f'root-certificates = "{cfg.ca_cert}"' in deploy.connection_toml(cfg)


def test_transport_follows_the_installed_flower():
    """One place decides the transport from the installed flwr (importlib.metadata): gRPC-rere
    on 1.39, HTTP from 1.40; an unset ``fleet_api`` follows it, and deploy.json keeps a set one."""
    import importlib.metadata as md

    from fedpriv.ops.deploy import flower_version as fv

    assert fv.parse_version("1.39.0") == (1, 39, 0) and fv.parse_version("1.40.0rc1") == (1, 40, 0) and fv.parse_version("1.42") == (1, 42, 0)
    assert [fv.fleet_transport(v) for v in ("1.39.0", "1.39.9", "1.40.0", "1.42.0")] == ["grpc-rere", "grpc-rere", "http", "http"]
    installed = fv.parse_version(md.version("flwr"))
    assert fv.SUPPORTED[0] <= installed[:2] <= fv.SUPPORTED[1], f"flwr {md.version('flwr')} is outside the supported range"
    assert fv.flwr_version() == installed
    want = "grpc-rere" if installed[:2] < (1, 40) else "http"
    cfg = deploy.DeployConfig(run_dir=Path("/r"), nodes=2)
    assert fv.fleet_transport() == cfg.transport == want
    assert deploy.docker_config(2).transport == fv.fleet_transport(fv.DOCKER_FLWR_VERSION) == "http"
    with pytest.raises(ConfigError, match="fleet_api"):
        deploy.DeployConfig(run_dir=Path("/r"), nodes=2, fleet_api="grpc-bidi").validate()


def test_up_refuses_a_transport_the_installed_flower_does_not_speak(tmp_path):
    other = "http" if deploy.fleet_transport() == "grpc-rere" else "grpc-rere"
    with pytest.raises(ConfigError, match="fleet_api"):
        deploy.up(deploy.DeployConfig(run_dir=tmp_path / "run", nodes=1, fleet_api=other, fleet_port=0, control_port=0, node_port_base=0))
    assert not (tmp_path / "run").exists()


def test_supported_flower_range_agrees_with_pyproject_and_ci():
    """pyproject's flwr range, the oldest/newest CI constraints and the Docker images' Flower agree."""
    import re
    import tomllib

    from fedpriv.ops.deploy import flower_version as fv

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    flwr = next(d for d in deps if d.startswith("flwr"))
    assert flwr.replace(" ", "") == f"flwr[simulation]>={fv.SUPPORTED[0][0]}.{fv.SUPPORTED[0][1]},<{fv.SUPPORTED[1][0]}.{fv.SUPPORTED[1][1] + 1}"

    def pin(name: str, which: str) -> str:
        text = (ROOT / "ci" / f"constraints-{which}.txt").read_text()
        return re.search(rf"^{name}==(\S+)$", text, re.M).group(1)

    assert fv.parse_version(pin("flwr", "oldest"))[:2] == fv.SUPPORTED[0]
    assert fv.parse_version(pin("flwr", "newest"))[:2] == fv.SUPPORTED[1]
    assert pin("flwr", "newest") == fv.DOCKER_FLWR_VERSION  # the images' wheelhouse is built with the newest constraints
    assert pin("torch", "oldest") == pin("torch", "newest") == "2.13.0"


def test_builders_flags_are_the_installed_flowers_own():
    """Every flag of the SuperLink and SuperNode argv parses with the installed Flower's own
    argument parser, and none of them is one Flower calls deprecated or hides."""
    import argparse
    import importlib

    # the modules (their packages re-export functions of the same names)
    sl_cli = importlib.import_module("flwr.superlink.cli.flower_superlink")
    sn_cli = importlib.import_module("flwr.supernode.cli.flower_supernode")

    cfg = _cfg(Path("/r"), data=SYN, users_per_node=100)  # the installed Flower's transport
    for parser, argv in ((sl_cli._parse_args_run_superlink(), deploy.superlink_command(cfg)), (sn_cli._parse_args_run_supernode(), deploy.supernode_command(cfg, 1))):
        parser.parse_args(argv[1:])  # exits (SystemExit) on an unknown flag
        for flag in (a for a in argv[1:] if a.startswith("--")):
            action = parser._option_string_actions[flag]
            assert action.help is not argparse.SUPPRESS and "deprecated" not in (action.help or "").lower(), (flag, action.help)


def test_compose_file_runs_the_builders_commands():
    """docker/compose.yml is the generated file, and every service runs the builders' argv."""
    import yaml

    text = (ROOT / "docker" / "compose.yml").read_text()
    assert text == deploy.compose_yaml(3), "docker/compose.yml is stale: python -m fedpriv.ops.deploy compose --nodes 3 > docker/compose.yml"
    services = yaml.safe_load(text)["services"]
    want = deploy.compose_services(3)
    assert sorted(services) == sorted(want) == ["register", "relay", "superlink", "supernode-0", "supernode-1", "supernode-2"]
    for name, svc in services.items():
        assert svc["entrypoint"] + svc["command"] == want[name], name
    cfg = deploy.docker_config(3)
    assert want["superlink"] == deploy.superlink_command(cfg)
    # each SuperNode runs the builder's argv behind the relay (its own network, no route out:
    # the SuperLink's port 8000 on its loopback leads to the relay's Unix socket)
    sock = "/fedpriv/relay/superlink.sock"
    relay_prefix = ["python", "/opt/fedpriv/netns.py", "--via-unix", f"8000={sock}", "--"]
    assert want["relay"] == ["python", "/opt/fedpriv/netns.py", "--unix-gateway", sock, "--to", "8000"]
    for i in range(3):
        assert want[f"supernode-{i}"] == relay_prefix + deploy.supernode_command(cfg, i)
        assert services[f"supernode-{i}"]["network_mode"] == "none"
        # the CA, its own key, its own data and the relay's socket folder, all read-only; its own ledger's named volume, writable
        vols = services[f"supernode-{i}"]["volumes"]
        assert [v.rsplit(":", 2)[1] for v in vols[:4]] == [str(cfg.ca_cert), str(cfg.node_private_key(i)), str(cfg.node_data_dir(i)), "/fedpriv/relay"]
        assert all(v.endswith(":ro") for v in vols[:4])
        assert vols[4:] == [f"node-ledger-{i}:{Path(deploy.DOCKER_NODE_LEDGER).parent}"] and cfg.policy(i).ledger == deploy.DOCKER_NODE_LEDGER
    # the SuperLink (with register and relay) on the host's network, on loopback only; nothing published
    assert all(services[n]["network_mode"] == "host" for n in ("superlink", "register", "relay"))
    assert all("ports" not in svc for svc in services.values())
    assert services["relay"]["volumes"] == ["${FEDPRIV_RUN_DIR:-./run}/relay:/fedpriv/relay"]
    assert cfg.bind_host == cfg.superlink_host == "127.0.0.1"
    for dockerfile in ("Dockerfile.superlink", "Dockerfile.supernode"):
        assert (ROOT / "docker" / dockerfile).is_file()


def test_docker_prepare_matches_the_compose_file(tmp_path, capsys):
    """`deploy prepare --docker` writes the run folder compose.yml expects: its deploy.json,
    read at the containers' mount point, gives the compose services' commands."""
    import yaml

    run_dir = tmp_path / "run"
    (run_dir / "dataset").mkdir(parents=True)
    assert main(["deploy", "prepare", "--docker", "--run-dir", str(run_dir), "--nodes", "3", "--data", SYN, "--users-per-node", "100"]) == 0
    state = json.loads((run_dir / "deploy.json").read_text())
    assert (state["superlink_host"], state["bind_host"], state["fleet_port"], state["control_port"]) == ("127.0.0.1", "127.0.0.1", 9092, 8000)
    inside = deploy.DeployConfig(run_dir=Path(deploy.DOCKER_RUN_DIR), bin_dir=None, **{k: v for k, v in state.items()})
    services = yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())["services"]
    assert services["superlink"]["entrypoint"] + services["superlink"]["command"] == deploy.superlink_command(inside)
    for i in range(3):
        svc = services[f"supernode-{i}"]
        assert svc["command"][svc["command"].index("--") + 1 :] == deploy.supernode_command(inside, i)
        assert (run_dir / "keys" / f"node-{i}").is_file() and (run_dir / "node-data" / f"node-{i}" / "ratings.npz").is_file()
    assert (run_dir / "relay").is_dir()  # the relay's socket folder, made by this user (not by dockerd as root)
    deploy.verify_server_cert(run_dir / "certs" / "ca.crt", run_dir / "certs" / "server.pem", "127.0.0.1")
    # a data file inside the run folder is stored relative to it (the folder is mounted elsewhere)
    assert deploy._portable_data(f"ml-100k:{run_dir}/dataset/u.zip", run_dir) == "ml-100k:{run_dir}/dataset/u.zip"
    assert main(["deploy", "prepare", "--docker", "--run-dir", str(tmp_path / "nodata")]) == 2
    assert "--data:" in capsys.readouterr().err and not (tmp_path / "nodata").exists()


# ------------------------------------------------------------------------------ TLS and node keys
def test_certificate_chain_verifies_for_loopback_names(tmp_path):
    paths = deploy.make_certs(tmp_path / "certs", ["127.0.0.1", "localhost", "superlink"])
    for name in ("127.0.0.1", "localhost", "superlink"):
        deploy.verify_server_cert(paths["ca"], paths["cert"], name)
    with pytest.raises(Exception):
        deploy.verify_server_cert(paths["ca"], paths["cert"], "example.org")
    other = deploy.make_certs(tmp_path / "other")
    with pytest.raises(Exception):
        deploy.verify_server_cert(other["ca"], paths["cert"], "127.0.0.1")
    assert oct(paths["key"].stat().st_mode & 0o777) == "0o600"

    # the chain also verifies with the ssl module (what gRPC and the HTTP client do)
    import ssl

    ctx = ssl.create_default_context(cafile=str(paths["ca"]))
    ctx.load_verify_locations(cafile=str(paths["ca"]))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(paths["cert"], paths["key"])


def test_node_keys_are_what_flwr_reads(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key

    deploy.make_node_keys(tmp_path / "k", tmp_path / "k.pub")
    key = load_ssh_private_key((tmp_path / "k").read_bytes(), None)  # as flower-supernode loads it
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert try_load_public_key(tmp_path / "k.pub")  # as `flwr supernode register` loads it
    assert (tmp_path / "k.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    assert oct((tmp_path / "k").stat().st_mode & 0o777) == "0o600"


# ------------------------------------------------------------------------------ per-node data
def test_node_partition_holds_only_its_users(tmp_path):
    """``deploy prepare --data``: node i's folder holds only its users' ratings and the public
    metadata; the node's own split equals the global split on its users; the server's public
    folder holds no ratings (tests/test_partitioned.py runs a job from it)."""
    from fedpriv.data.splits import random_split
    from fedpriv.flower.partition import data_dir_of, load_shard, write_partitions

    cfg = deploy.prepare(_cfg(tmp_path, data=SYN, users_per_node=100, tls=False, auth=False))
    part = deploy.split_job(SYN, 100)
    split = random_split(part.interactions, seed=1234)
    full = write_partitions(tmp_path / "full", {"train": split.train, "valid": split.valid, "test": split.test}, {"n_users": part.n_users})
    assert sorted(p.name for p in (cfg.run_dir / "public").iterdir()) == ["item_features.json", "item_features.npz", "item_ids.npy", "meta.json"]
    for i in range(3):
        own = data_dir_of({"data-dir": str(cfg.node_data_dir(i)), "partition-id": i}, "")
        for name in ("train", "valid", "test"):
            mine, ref = load_shard(own, name, i, 100), load_shard(str(full), name, i, 100)
            assert np.array_equal(mine.user_ids, ref.user_ids) and np.array_equal(mine.indptr, ref.indptr)
            assert np.array_equal(mine.items, ref.items) and np.array_equal(mine.ratings, ref.ratings)
            assert ref.n_ratings > 0
        with np.load(cfg.node_data_dir(i) / "ratings.npz") as z:
            assert set(np.unique(z["users"])) <= set(range(i * 100, (i + 1) * 100))  # nobody else's ratings
        raw = np.load(Path(own) / "user_ids.npy")  # the raw ids that key its users' secrets: its own only
        others = np.ones(part.n_users, bool)
        others[i * 100 : (i + 1) * 100] = False
        assert np.array_equal(raw[~others], np.asarray(part.interactions.user_ids)[~others]) and np.all(raw[others] == -1)
    state = json.loads((cfg.run_dir / "deploy.json").read_text())
    assert state["data"] == SYN and state["nodes"] == 3 and "run_dir" not in state
    # the ClientApp reads a deployed node's own folder, else the broadcast one
    assert data_dir_of({"data-dir": "/n/0", "partition-id": 0}, "/server") == "/n/0"
    assert data_dir_of({"partition-id": 0}, "/server") == "/server"


def test_client_handlers_read_the_node_folder(tmp_path):
    """The info and train handlers of the real ClientApp use ``data-dir`` from the node config,
    not the (here: missing) folder the server broadcasts."""
    from flwr.app import Context, Message, RecordDict

    from fedpriv.algorithms import als
    from fedpriv.engine.inprocess import new_state
    from fedpriv.flower import client_app, codec

    cfg = deploy.prepare(_cfg(tmp_path, data=SYN, users_per_node=100, tls=False, auth=False))
    part = deploy.split_job(SYN, 100)
    from fedpriv.algorithms import protocol
    from fedpriv.data.splits import random_split

    train = random_split(part.interactions, seed=1234).train
    state, _ = new_state("als", als.ALSConfig.from_overrides({"rank": "3"}), train, part.rating_range, False, None, 1e-5)
    protocol.server_setup(state, None)
    content = codec.encode_state(state, str(tmp_path / "no-such-folder"), 100, 0)
    from flwr.supercore.task_identity import TaskIdentity

    for key in ("run_id", "node_id", "task_id"):  # Message() needs a task identity outside a run
        try:
            getattr(TaskIdentity, key)
        except RuntimeError:
            setattr(TaskIdentity, key, 1)
    node_config = {"partition-id": 1, "num-partitions": 3, "data-dir": str(cfg.node_data_dir(1))}
    ctx = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})
    reply = client_app.app(Message(content=content, dst_node_id=7, message_type="query.info"), ctx)
    assert not reply.has_error(), reply.error
    meta = dict(reply.content.config_records["meta"])  # configuration only, no count of the node's data
    assert meta["partition_id"] == 1 and set(meta) == {"partition_id", "policy_mode", "policy_ledger", "identity"} and meta["identity"] is True
    n_rated = len(np.unique(train.items[train.users // 100 == 1]))
    train = client_app.app(Message(content=codec.encode_state(state, str(tmp_path / "no-such-folder"), 100, 0), dst_node_id=7, message_type="train"), ctx)
    assert not train.has_error(), train.error
    # the contribution comes from the node's own folder: its 100 users and the items they rated
    assert train.content.config_records["meta"]["n_users"] == 100
    assert len(train.content.array_records["contrib"]["item_ids"].numpy()) == n_rated


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "argv,field",
    [
        (["--nodes", "0"], "--nodes"),
        (["--users-per-node", "0", "--data", SMALL], "--users-per-node"),
        (["--data", "nosuchkind:x"], "--data"),
        (["--data", "synthetic-personal:users=10"], "--data"),
        (["--data", SMALL, "--users-per-node", "10", "--nodes", "2"], "--nodes"),  # 4 partitions
        (["--no-auth", "--nodes", "2", "--fleet-port", "70000"], "--fleet-port"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(tmp_path, capsys, argv, field):
    run_dir = tmp_path / "run"
    for command in ("up", "prepare"):
        code = main(["deploy", command, "--run-dir", str(run_dir), *argv])
        err = capsys.readouterr().err
        assert code == 2 and f"{field}:" in err, err
        assert not run_dir.exists()


def test_auth_needs_tls_and_run_checks_before_starting(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--insecure"):
        _cfg(tmp_path, tls=False, auth=True).validate()
    cfg = deploy.prepare(_cfg(tmp_path, data=SMALL, users_per_node=10, nodes=4, tls=False, auth=False))
    loaded = deploy.DeployConfig.load(cfg.run_dir)
    assert (loaded.nodes, loaded.data, loaded.users_per_node, loaded.fleet_port) == (4, SMALL, 10, 19092)
    for overrides, field in (({"users_per_node": "5"}, "users_per_node"), ({"split_seed": "7"}, "split_seed"), ({"rank": "3,4"}, "rank"), ({"round_timeout": "5"}, "round_timeout")):
        with pytest.raises(ConfigError, match=field):
            deploy.run_deployed_job(loaded, "adadpals", epsilon=1.0, overrides=overrides)
    with pytest.raises(ConfigError, match="--epsilon"):
        deploy.run_deployed_job(loaded, "adadpals")
    with pytest.raises(ConfigError, match="--data"):
        deploy.run_deployed_job(loaded, "adadpals", epsilon=1.0, data=SYN)
    with pytest.raises(ConfigError, match="--round-timeout"):
        deploy.run_deployed_job(loaded, "adadpals", epsilon=1.0, round_timeout=-1)
    assert not (cfg.run_dir / "app").exists() and not (cfg.run_dir / "out").exists()
    with pytest.raises(ConfigError, match="--run-dir"):
        deploy.DeployConfig.load(tmp_path / "nothing-here")
    assert main(["deploy", "run", "--run-dir", str(tmp_path / "nothing-here"), "als"]) == 2


def test_compose_and_certs_commands(tmp_path, capsys):
    assert main(["deploy", "compose", "--nodes", "2"]) == 0
    assert capsys.readouterr().out == deploy.compose_yaml(2)
    assert deploy.deploy_main(["certs", str(tmp_path / "c"), "--nodes", "2", "--san", "superlink"]) == 0
    deploy.verify_server_cert(tmp_path / "c" / "certs" / "ca.crt", tmp_path / "c" / "certs" / "server.pem", "superlink")
    assert sorted(p.name for p in (tmp_path / "c" / "public-keys").iterdir()) == ["node-0.pub", "node-1.pub"]


# ------------------------------------------------------------------------------ deployment (processes)
def _kill_tree(pid: int) -> None:
    below = launcher.descendant_pids([pid])
    for p in [pid, *below]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _all_gone(pids: list[int], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(launcher.pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(launcher.pid_alive(p) for p in pids)


def _kill_when(log, marker: str, pid: int):
    """Kill the process tree of ``pid`` as soon as ``marker`` appears in the file ``log``.
    Returns (killed, done, watcher): set ``done`` and join ``watcher`` when the run is over."""
    from fedpriv.testing.chaos import kill_when

    return kill_when(lambda: marker in log.read_text(errors="replace"), lambda: _kill_tree(pid))


def _tree(cfg) -> list[int]:
    pids = [int(e["pid"]) for e in deploy.running(cfg)]
    return pids + launcher.descendant_pids(pids)


@pytest.mark.deployment
def test_tls_auth_deployment_completes_with_a_node_killed_in_round_one(tmp_path):
    """SuperLink + 3 SuperNodes over gRPC with TLS and node authentication; node 2 is killed
    when the first training round reaches it. The run finishes: its reply is given up after the
    round timeout and logged as rejected, and every planned release is in the ledger."""
    from fedpriv.algorithms import als

    data, upn = (f"ml-100k:{ML100K}", 315) if ML100K.is_file() else (SYN, 100)  # 943 or 300 users: 3 nodes
    cfg = deploy.DeployConfig(run_dir=tmp_path / "run", nodes=3, data=data, users_per_node=upn, fleet_port=0, control_port=0, node_port_base=0,
                              node_policy={"policy-aggregation": "central"})  # a central run: its nodes' own policy must allow it (the default is secure)
    seen: list[int] = []
    t0 = time.perf_counter()
    try:
        deploy.up(cfg, wait=240)
        t_up = time.perf_counter() - t0
        seen = _tree(cfg)
        nodes = deploy.list_nodes(cfg)
        assert sum(n["status"] == "online" for n in nodes) == 3
        assert cfg.tls and cfg.auth and (cfg.run_dir / "certs" / "ca.crt").is_file()
        victim = next(e for e in deploy.running(cfg) if e["name"] == "supernode-2")
        log = cfg.logs_dir / "supernode-2.log"
        killed, done, watcher = _kill_when(log, "Receiving: train message", int(victim["pid"]))
        t1 = time.perf_counter()
        try:
            metrics = deploy.run_deployed_job(cfg, "adadpals", epsilon=1.0, overrides={"steps": "2", "rank": "4"}, round_timeout=30.0, node_wait=60.0, quiet=True, timeout=900, aggregation="central")
        finally:
            done.set()
            watcher.join(timeout=5)
        t_run = time.perf_counter() - t1
        assert killed.is_set(), "node 2 never received a train message"

        out = cfg.out_dir
        assert (out / "metrics.json").is_file() and (out / "ledger.json").is_file()
        assert metrics["engine"] == "flower" and metrics["nodes"] == 3 and metrics["epsilon_spent"] == pytest.approx(1.0, rel=1e-3)
        by_round = {r["round"]: r for r in metrics["round_log"]}
        assert by_round["info"]["replies"] == 3 and by_round["counts"]["replies"] == 3
        assert by_round["step1"]["replies"] == 2 and by_round["step2"]["replies"] == 2
        rejected = [r for r in metrics["rejected_replies"] if r["round"] == "step1"]
        # given up after the round timeout (or, once its heartbeat expired, answered by the
        # SuperLink with a "Node Unavailable" error) and logged as rejected
        assert rejected and all("timeout" in r["reason"] or "Unavailable" in r["reason"] for r in rejected), rejected
        if all("timeout" in r["reason"] for r in rejected):
            assert by_round["step1"]["seconds"] >= 29.0  # waited for the round timeout, then went on
        assert np.isfinite(metrics["test_rmse"])

        ledger = json.loads((out / "ledger.json").read_text())
        counts: dict = {}
        for rec in ledger:
            counts[rec["name"]] = counts.get(rec["name"], 0) + int(rec["count"])
        # the algorithm's own defaults (its bias stage) with the run's overrides
        plan = als.plan_releases("adadpals", als.ALSConfig.from_overrides({"steps": "2", "rank": "4"}, "adadpals"), False)
        assert {p.name: p.count for p in plan} == counts
        print(f"\ndeploy TLS+auth, 3 nodes, {data.split(':')[0]}: up {t_up:.1f} s, run {t_run:.1f} s, rounds "
              + ", ".join(f"{r['round']} {r['seconds']:.1f}" for r in metrics["round_log"])
              + "; rejected: " + "; ".join(f"{r['round']} node {r['node']}: {r['reason']}" for r in metrics["rejected_replies"]))
    finally:
        seen += _tree(cfg)
        deploy.stop(cfg.run_dir)
    assert _all_gone(seen), [p for p in seen if launcher.pid_alive(p)]
    assert deploy.running(cfg) == []


@pytest.mark.deployment
def test_secure_aggregation_deployment_completes_with_a_node_killed_after_sharing(tmp_path):
    """The same deployment in secure mode (the default of `fedpriv deploy`): the ServerApp learns
    only masked words and their noised sums. Node 2 of 4 is killed when its first masked-input
    request arrives, after it shared its keys: the other three recover its masks, every later
    release goes on with the three survivors (shares sized for 3 of 4 nodes), and every planned
    release is in the ledger as a Skellam (distributed-noise) release. Four nodes, because with
    one colluding node assumed (the default) a node's masks are recoverable only with a
    Shamir threshold t of its k + 1 holders where 2t > k + 2: 3 of 4 here; of 3 holders
    (3 nodes) all would have to answer."""
    from fedpriv.algorithms import als

    data, upn = (f"ml-100k:{ML100K}", 236) if ML100K.is_file() else (SYN, 75)
    cfg = deploy.DeployConfig(run_dir=tmp_path / "run", nodes=4, data=data, users_per_node=upn, fleet_port=0, control_port=0, node_port_base=0)
    seen: list[int] = []
    overrides = {"steps": "2", "rank": "4", "secure_dropout": "0.25"}
    try:
        deploy.up(cfg, wait=240)
        seen = _tree(cfg)
        assert cfg.tls and cfg.auth
        victim = next(e for e in deploy.running(cfg) if e["name"] == "supernode-2")
        log = cfg.logs_dir / "supernode-2.log"
        killed, done, watcher = _kill_when(log, "Receiving: query.secagg_mask message", int(victim["pid"]))
        t1 = time.perf_counter()
        try:
            metrics = deploy.run_deployed_job(cfg, "adadpals", epsilon=1.0, overrides=overrides, round_timeout=20.0, node_wait=60.0, quiet=True, timeout=900)
        finally:
            done.set()
            watcher.join(timeout=5)
        assert killed.is_set(), "node 2 never received a masked-input request"
        assert metrics["aggregation"] == "secure" and metrics["epsilon_spent"] == pytest.approx(1.0, rel=1e-3)
        ledger = json.loads((cfg.out_dir / "ledger.json").read_text())
        assert {rec["mechanism"] for rec in ledger} == {"skellam"}
        counts: dict = {}
        for rec in ledger:
            counts[rec["name"]] = counts.get(rec["name"], 0) + int(rec["count"])
        plan = als.plan_releases("adadpals", als.ALSConfig.from_overrides({**overrides, "aggregation": "secure"}, "adadpals"), False)
        assert {p.name: p.count for p in plan} == counts
        by_round = {r["round"]: r for r in metrics["round_log"]}
        assert by_round["secagg_keys"]["replies"] == 4 and by_round["step2"]["replies"] == 3
        assert by_round["step2:consistency"]["replies"] == 3  # authenticated nodes (identity in their data folder) sign the view
        assert any(r["node"] for r in metrics["rejected_replies"])  # the killed node's missing replies, logged
        assert np.isfinite(metrics["test_rmse"])
        print(f"\ndeploy secure TLS+auth, 4 nodes, {data.split(':')[0]}: run {time.perf_counter() - t1:.1f} s, rounds "
              + ", ".join(f"{r['round']} {r['seconds']:.1f}" for r in metrics["round_log"]))
    finally:
        seen += _tree(cfg)
        deploy.stop(cfg.run_dir)
    assert _all_gone(seen), [p for p in seen if launcher.pid_alive(p)]


@pytest.mark.deployment
def test_unregistered_node_is_refused(tmp_path):
    """With node authentication on, a SuperNode whose key was not registered is refused: it
    exits (Flower's exit code 305) and the SuperLink lists only the registered node."""
    cfg = deploy.DeployConfig(run_dir=tmp_path / "run", nodes=1, fleet_port=0, control_port=0, node_port_base=0)
    seen: list[int] = []
    stranger = None
    try:
        deploy.up(cfg, wait=180)
        seen = _tree(cfg)
        assert [n["status"] for n in deploy.list_nodes(cfg)] == ["online"]
        deploy.make_node_keys(tmp_path / "stranger", tmp_path / "stranger.pub")
        cmd = deploy.supernode_command(cfg, 0)
        cmd[cmd.index("--auth-supernode-private-key") + 1] = str(tmp_path / "stranger")
        cmd[cmd.index("--port") + 1] = str(launcher._free_port())
        import subprocess

        with open(tmp_path / "stranger.log", "wb") as log:
            stranger = subprocess.Popen(cmd, env=deploy._env(cfg, tmp_path / "stranger-home"), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        code = stranger.wait(timeout=120)
        text = (tmp_path / "stranger.log").read_text(errors="replace")
        assert code != 0 and "Failed to activate SuperNode" in text, text[-2000:]
        nodes = deploy.list_nodes(cfg)
        assert len(nodes) == 1 and nodes[0]["status"] == "online"
    finally:
        if stranger is not None and stranger.poll() is None:
            _kill_tree(stranger.pid)
        seen += _tree(cfg)
        deploy.stop(cfg.run_dir)
    assert _all_gone(seen)


@pytest.mark.deployment
def test_failed_up_stops_everything(tmp_path, monkeypatch):
    """SuperNode 0 cannot bind its runtime port (taken): `up` fails with that node's log and
    leaves no process (SuperLink, other nodes, their children) and no pids.json behind. The
    nodes share the host's network here (FEDPRIV_NODE_NETNS=0): in a namespace of its own, a
    node's port cannot be taken from the host."""
    import socket

    monkeypatch.setenv(deploy.processes.NODE_NETNS_ENV, "0")
    run_dir = tmp_path / "run"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = deploy.DeployConfig(run_dir=run_dir, nodes=2, fleet_port=0, control_port=0, node_port_base=port)
        with pytest.raises(FedprivError, match="supernode-0 exited"):
            deploy.up(cfg, wait=120)
    assert not (run_dir / "pids.json").exists() and (run_dir / "logs" / "supernode-1.log").is_file()
    assert _all_gone(launcher.pids_matching(str(run_dir)), 5.0), launcher.pids_matching(str(run_dir))


def test_clientapp_gate_bounds_concurrent_processes(tmp_path, monkeypatch):
    """Many SuperNodes on one host: the flwr-clientapp wrapper on their PATH lets at most N
    processes run at once (the others wait at the gate, then run with their own arguments)."""
    import shutil
    import subprocess
    import time

    from fedpriv.ops.deploy.processes import CLIENTAPP_SLOTS_ENV, clientapp_gate

    if shutil.which("flock") is None:
        pytest.skip("no flock (util-linux)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "flwr-clientapp"  # stands for Flower's: records when it runs
    fake.write_text(f'#!/bin/sh\necho "start $1 $(date +%s.%N)" >> {tmp_path}/log\nsleep 0.6\necho "end $1 $(date +%s.%N)" >> {tmp_path}/log\n')
    fake.chmod(0o755)
    monkeypatch.setenv(CLIENTAPP_SLOTS_ENV, "2")
    cfg = _cfg(tmp_path, bin_dir=str(bin_dir))
    cfg.run_dir.mkdir(parents=True)
    gate = clientapp_gate(cfg)
    t0 = time.monotonic()
    procs = [subprocess.Popen([str(gate / "flwr-clientapp"), f"task{i}"]) for i in range(6)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    events = sorted((float(t), kind, name) for kind, name, t in (line.split() for line in (tmp_path / "log").read_text().splitlines()))
    running, peak = 0, 0
    for _, kind, _ in events:
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak == 2 and {n for _, k, n in events if k == "end"} == {f"task{i}" for i in range(6)}
    assert time.monotonic() - t0 >= 3 * 0.6  # three waves of two
