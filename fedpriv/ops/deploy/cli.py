"""The command line: ``deploy partition|up|run|down|status|prepare|register|compose|certs`` (argparse,
:func:`command`, :func:`main`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ...errors import ConfigError, FedprivError
from .certs import make_certs, make_node_keys
from .compose import compose_yaml
from .config import (
    DEFAULT_RUN_DIR,
    DOCKER_NODE_LEDGER,
    DOCKER_PORTS,
    LOCAL_HOSTS,
    PIDS_FILE,
    STOP_SECONDS,
    DeployConfig,
    _positive_int,
)
from .flower_version import docker_transport
from .job import run_deployed_job
from .nodedata import SPLIT_SEED, n_partitions, split_job, write_partition
from .pids import running, stop
from .prepare import prepare
from .processes import list_nodes, register_supernodes, up


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    """``deploy up|run|down|status|prepare|register|compose|certs`` (shared by ``fedpriv deploy``
    and ``python -m fedpriv.ops.deploy``)."""
    sub = parser.add_subparsers(dest="deploy_command", required=True)

    def run_dir(p):
        p.add_argument(
            "--run-dir", default=DEFAULT_RUN_DIR, help=f"the deployment's folder (default {DEFAULT_RUN_DIR})"
        )

    def layout(p, local: bool):
        run_dir(p)
        p.add_argument(
            "--nodes",
            type=int,
            default=None,
            help="number of SuperNodes (default with --data: one per partition of --users-per-node users; else 3)",
        )
        p.add_argument(
            "--data",
            default=None,
            help="data spec: each node gets a folder with only its users' ratings (same split as the ServerApp)",
        )
        p.add_argument("--users-per-node", type=int, default=1, help="users held by each node (default 1)")
        p.add_argument("--insecure", action="store_true", help="no TLS (implies --no-auth)")
        p.add_argument("--no-auth", action="store_true", help="no SuperNode authentication")
        default = 0 if local else None
        p.add_argument(
            "--fleet-port",
            type=int,
            default=default,
            help="SuperLink Fleet API port on Flower 1.39 "
            "(gRPC-rere; from Flower 1.40 the Fleet API is served over HTTP on --control-port)"
            + (" (default: a free loopback port)" if local else " (default 9092)"),
        )
        p.add_argument(
            "--control-port",
            type=int,
            default=default,
            help="SuperLink HTTP API port: Control and Runtime, and from Flower 1.40 the Fleet API"
            + (" (default: a free port)" if local else " (default 8000)"),
        )
        p.add_argument(
            "--node-port-base",
            type=int,
            default=default,
            help="SuperNode i serves its runtime API on this port + i"
            + (" (default: free ports)" if local else " (default 9094)"),
        )
        p.add_argument(
            "--san",
            action="append",
            default=[],
            metavar="HOST",
            help="extra host name or address in the server certificate (repeatable)",
        )
        p.add_argument(
            "--node-policy",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="each node's own privacy policy, e.g. aggregation=secure, max-epsilon=2, min-contributors=3, "
            "colluders=1 (repeatable; docs/how-to/secure-aggregation.md)",
        )

    pa = sub.add_parser(
        "partition",
        help="the data owner's step: one folder per node with only its users' ratings (+ public metadata), "
        "and the server's public folder",
    )
    pa.add_argument("--data", required=True, help="data spec of the ratings to distribute")
    pa.add_argument(
        "--data-opt",
        dest="data_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="csv/parquet option (repeatable), as for `fedpriv run`: rating_range=LO,HI, "
        "items=FILE (the catalogue), user=COL, ...",
    )
    pa.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="number of node folders (default: one per block of --users-per-node users)",
    )
    pa.add_argument("--users-per-node", type=int, default=1, help="users held by each node (default 1)")
    pa.add_argument(
        "--split-seed",
        type=int,
        default=SPLIT_SEED,
        help=f"public seed of the nodes' own train/valid/test split (default {SPLIT_SEED})",
    )
    pa.add_argument(
        "--out",
        required=True,
        help="new folder: OUT/public (the server's) and OUT/node-<i> (node i's, copy it to that host)",
    )

    u = sub.add_parser(
        "up", help="start a SuperLink and N SuperNodes on loopback (TLS and node authentication by default)"
    )
    layout(u, local=True)
    u.add_argument(
        "--wait", type=float, default=180.0, help="seconds to wait for the SuperLink and every node to be online"
    )

    pr = sub.add_parser(
        "prepare", help="write certificates, node keys, per-node data and deploy.json without starting anything"
    )
    layout(pr, local=False)
    pr.add_argument(
        "--docker",
        action="store_true",
        help="the layout of docker/compose.yml (the SuperLink on the host's 127.0.0.1, its HTTP API with the "
        "Fleet API on 8000; each SuperNode in a network of its own, relayed through RUN_DIR/relay)",
    )
    pr.add_argument(
        "--bind-host",
        default=None,
        help="address the SuperLink listens on (default 127.0.0.1): its host's own address for nodes on other hosts",
    )
    pr.add_argument(
        "--superlink-host",
        default=None,
        help="address the nodes and the CLI dial (default 127.0.0.1; added to the certificate)",
    )

    r = sub.add_parser("run", help="run one job on the running deployment (`flwr run APP deploy --stream`)")
    run_dir(r)
    r.add_argument("algorithm")
    r.add_argument("--data", default=None, help="data spec (default: the one given to `deploy up`)")
    r.add_argument("--epsilon", type=float, default=None)
    r.add_argument("--delta", type=float, default=1e-5)
    r.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="hyperparameter or run option (repeatable)",
    )
    r.add_argument(
        "--aggregation",
        choices=("central", "secure"),
        default="secure",
        help="secure (default: the server learns only noised sums, the nodes add distributed noise) "
        "or central (the ServerApp's aggregator step sees exact sums)",
    )
    r.add_argument(
        "--round-timeout",
        type=float,
        default=0.0,
        help="seconds to wait for replies per round; later replies are rejected (0: wait)",
    )
    r.add_argument("--node-wait", type=float, default=120.0, help="seconds the ServerApp waits for the nodes")
    r.add_argument(
        "--work-dir", default=None, help="server work folder (keeps the checkpoint: run again with it to resume)"
    )
    r.add_argument("--out", default=None, help="output folder for metrics.json and ledger.json (default RUN_DIR/out)")
    r.add_argument("--timeout", type=float, default=None, help="bound on the `flwr run` call, in seconds")
    r.add_argument("--quiet", action="store_true", help="do not echo Flower's log")

    d = sub.add_parser("down", help="stop every process of the deployment (SIGTERM, then SIGKILL)")
    run_dir(d)
    d.add_argument("--grace", type=float, default=STOP_SECONDS, help="seconds between SIGTERM and SIGKILL")

    s = sub.add_parser("status", help="the deployment's processes and the SuperLink's nodes")
    run_dir(s)

    g = sub.add_parser(
        "register", help="register every node's public key with the SuperLink (`flwr supernode register`)"
    )
    run_dir(g)
    g.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the SuperLink's Control API")

    c = sub.add_parser("compose", help="print docker/compose.yml (generated from the command builders)")
    c.add_argument("--nodes", type=int, default=3)

    ce = sub.add_parser("certs", help="write a CA, a server certificate and node key pairs into DIR")
    ce.add_argument("dir")
    ce.add_argument(
        "--nodes", type=int, default=3, help="node key pairs to write (keys/node-<i>, public-keys/node-<i>.pub)"
    )
    ce.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="HOST",
        help="extra host name or address in the server certificate (repeatable)",
    )


def _node_policy(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}", field="--node-policy")
        out["policy-" + key.strip().removeprefix("policy-")] = value.strip()
    return out


def _layout_config(args, *, docker: bool = False) -> tuple[DeployConfig, object]:
    job = None
    upn = args.users_per_node
    _positive_int(upn, "--users-per-node")
    if args.nodes is not None:
        _positive_int(args.nodes, "--nodes")
    nodes = args.nodes
    if args.data is not None:
        DeployConfig(run_dir=Path("."), nodes=1, data=args.data, auth=False).validate()  # data kind first
        job = split_job(args.data, upn)
        nodes = nodes or n_partitions(job)
    nodes = nodes or 3
    ports = {}
    for key in ("fleet_port", "control_port", "node_port_base"):
        value = getattr(args, key)
        ports[key] = (DOCKER_PORTS[key] if docker else 0) if value is None else value
    insecure = bool(args.insecure)
    cfg = DeployConfig(
        run_dir=Path(args.run_dir),
        nodes=nodes,
        tls=not insecure,
        auth=not (insecure or args.no_auth),
        data=args.data,
        users_per_node=upn,
        san=list(args.san),
        node_policy=_node_policy(getattr(args, "node_policy", [])),
        **ports,
    )
    if docker:  # the compose file's SuperLink on the host's loopback; each node reaches it there through the relay
        cfg.bind_host = cfg.superlink_host = "127.0.0.1"
        cfg.fleet_api = docker_transport()  # the images' Flower, whatever this host has
        cfg.node_policy = {
            "policy-ledger": DOCKER_NODE_LEDGER,
            **cfg.node_policy,
        }  # each node's ledger volume (docker/compose.yml)
    return cfg, job


def deploy_command(args) -> int:
    """Run a parsed ``deploy`` command."""
    what = args.deploy_command
    if what == "partition":
        return _partition(args)
    if what == "up":
        cfg, job = _layout_config(args)
        cfg = up(cfg, wait=args.wait, job=job)
        print(
            json.dumps(
                {
                    "run_dir": str(cfg.run_dir),
                    "superlink": cfg.control_address,
                    "fleet": cfg.fleet_address,
                    "nodes": cfg.nodes,
                    "tls": cfg.tls,
                    "auth": cfg.auth,
                    "pids": {e["name"]: e["pid"] for e in running(cfg)},
                }
            )
        )
        return 0
    if what == "prepare":
        if args.docker and args.data is None:
            raise ConfigError("the compose file gives every SuperNode its own data folder: give --data", field="--data")
        cfg, job = _layout_config(args, docker=args.docker)
        if args.bind_host or args.superlink_host:  # separate hosts (docs/how-to/deployment.md, "cross-host")
            cfg.bind_host = args.bind_host or cfg.bind_host
            cfg.superlink_host = args.superlink_host or cfg.superlink_host
        if not args.docker and 0 in (cfg.fleet_port, cfg.control_port, cfg.node_port_base):
            cfg.fleet_port, cfg.control_port, cfg.node_port_base = (
                cfg.fleet_port or 9092,
                cfg.control_port or 8000,
                cfg.node_port_base or 9094,
            )
        cfg = prepare(cfg, job=job)
        if (
            args.docker
        ):  # the relay's socket folder (docker/compose.yml), owned by this user, not made by dockerd as root
            (cfg.run_dir / "relay").mkdir(exist_ok=True)
        print(
            json.dumps(
                {"run_dir": str(cfg.run_dir), "nodes": cfg.nodes, "tls": cfg.tls, "auth": cfg.auth, "data": cfg.data}
            )
        )
        return 0
    if what == "run":
        from ...run import parse_overrides

        cfg = DeployConfig.load(args.run_dir)
        metrics = run_deployed_job(
            cfg,
            args.algorithm,
            data=args.data,
            epsilon=args.epsilon,
            delta=args.delta,
            overrides=parse_overrides(args.overrides),
            aggregation=args.aggregation,
            round_timeout=args.round_timeout,
            node_wait=args.node_wait,
            work_dir=args.work_dir,
            out=args.out,
            quiet=args.quiet,
            timeout=args.timeout,
        )
        keys = [k for k in metrics if k.startswith(("test_", "valid_")) and not k.endswith("sliced")]
        summary = {
            k: metrics.get(k)
            for k in (
                "algorithm",
                "dataset",
                "epsilon",
                "epsilon_spent",
                "neighbouring_relation",
                *keys,
                "rounds",
                "wall_seconds",
                "deploy_wall_seconds",
            )
        }
        summary["rejected_replies"] = len(metrics.get("rejected_replies") or [])
        print(json.dumps(summary))
        return 0
    if what == "down":
        stopped = stop(args.run_dir, args.grace)
        print(json.dumps({"stopped": stopped}))
        return 0
    if what == "status":
        cfg = DeployConfig.load(args.run_dir)
        live = running(cfg)
        nodes = list_nodes(cfg) if live or not (cfg.run_dir / PIDS_FILE).exists() else []
        print(json.dumps({"processes": [{"name": e["name"], "pid": e["pid"]} for e in live], "nodes": nodes}, indent=2))
        return 0
    if what == "register":
        cfg = DeployConfig.load(args.run_dir)
        ids = register_supernodes(cfg, wait=args.wait)
        print(json.dumps({"registered": ids}))
        return 0
    if what == "compose":
        sys.stdout.write(compose_yaml(_positive_int(args.nodes, "--nodes")))
        return 0
    if what == "certs":
        _positive_int(args.nodes, "--nodes")
        folder = Path(args.dir).expanduser().resolve()
        names = list(dict.fromkeys([*LOCAL_HOSTS, *args.san]))
        make_certs(folder / "certs", names)
        for i in range(args.nodes):
            make_node_keys(folder / "keys" / f"node-{i}", folder / "public-keys" / f"node-{i}.pub")
        print(json.dumps({"certs": str(folder / "certs"), "keys": args.nodes, "names": names}))
        return 0
    raise AssertionError(what)  # pragma: no cover


def _partition(args) -> int:
    import shutil
    import tempfile

    _positive_int(args.users_per_node, "--users-per-node")
    if args.nodes is not None:
        _positive_int(args.nodes, "--nodes")
    out = Path(args.out).expanduser().resolve()
    if out.exists():
        raise ConfigError(f"{out} exists: a partition is written into a new folder", field="--out")
    from ...run import parse_overrides

    part = split_job(
        args.data, args.users_per_node, args.split_seed, parse_overrides(args.data_options, field="--data-opt")
    )
    nodes = args.nodes or n_partitions(part)
    if n_partitions(part) > nodes:
        raise ConfigError(
            f"{n_partitions(part)} partitions of {part.users_per_node} users need at least {n_partitions(part)} nodes, "
            f"got {nodes}",
            field="--nodes",
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write_partition(part, nodes, stage)
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print(
        json.dumps(
            {
                "out": str(out),
                "public": str(out / "public"),
                "nodes": nodes,
                "users_per_node": part.users_per_node,
                "n_users": part.n_users,
                "server_data": f"public:{out / 'public'}",
            }
        )
    )
    return 0


def deploy_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fedpriv.ops.deploy",
        description="Flower deployment runtime for fedpriv (same as `fedpriv deploy`).",
    )
    add_deploy_arguments(p)
    args = p.parse_args(argv)
    try:
        return deploy_command(args)
    except FedprivError as exc:
        print(f"fedpriv: error: {exc}", file=sys.stderr)
        return 2
