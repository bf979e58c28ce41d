"""The deployment's configuration: :class:`DeployConfig` (ports, hosts, TLS and authentication,
the files of a run folder, ``deploy.json``), the constants shared by the other modules,
:func:`docker_config` and the small validators."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError
from .flower_version import GRPC_RERE, TRANSPORTS, docker_transport, fleet_transport

CONNECTION = "deploy"  # name of the SuperLink connection in RUN_DIR/flwr-home/config.toml
STATE_FILE = "deploy.json"
PIDS_FILE = "pids.json"
DEFAULT_RUN_DIR = "runs/deploy"
DOCKER_RUN_DIR = "/fedpriv"  # where compose mounts the run folder (or parts of it)
# the compose file's ports, on the host's loopback (every container uses the host's network)
DOCKER_PORTS = {"fleet_port": 9092, "control_port": 8000, "node_port_base": 9094}
LOCAL_HOSTS = ("127.0.0.1", "localhost")
STOP_SECONDS = 15.0  # SIGTERM, then SIGKILL after this long
CLI_SECONDS = 60.0  # one `flwr supernode ...` call
# `--set` keys that would change the split or the node count fixed by `deploy up`
FIXED_BY_UP = ("split", "split_seed", "heldout_fraction", "users_per_node", "nodes")
# a compose SuperNode's ledger: on a named volume of its own (docker/compose.yml: node-ledger-<i>; its
# data mount is read-only), kept across restarts and `docker compose down` (not `down -v`)
DOCKER_NODE_LEDGER = "/var/lib/fedpriv/node-ledger.json"


@dataclass
class DeployConfig:
    """One deployment: a SuperLink and ``nodes`` SuperNodes, and where their files live.

    ``bind_host`` is where the SuperLink listens (127.0.0.1 locally and in the compose file's
    host-network containers; a host's own address for nodes on other hosts), ``superlink_host``
    how nodes and the CLI reach it. SuperNode i serves its own
    runtime API on 127.0.0.1:``node_port_base + i`` (used by its ClientApp processes only).

    ``fleet_api`` is how the SuperNodes reach the SuperLink (:mod:`.flower_version`): None (the
    default) follows the installed Flower, ``"grpc-rere"`` (Flower 1.39) puts the Fleet API on
    ``fleet_port``, ``"http"`` (Flower >= 1.40) on the SuperLink's one HTTP port,
    ``control_port`` (``fleet_port`` is then unused)."""

    run_dir: Path
    nodes: int
    tls: bool = True
    auth: bool = True
    data: str | None = None  # data spec: per-node partitions (None: nodes use the broadcast folder)
    users_per_node: int = 1
    fleet_port: int = 9092
    control_port: int = 8000  # the SuperLink's HTTP API: Control (CLI) and Runtime (ServerApp)
    node_port_base: int = 9094
    bind_host: str = "127.0.0.1"
    superlink_host: str = "127.0.0.1"
    san: list[str] = field(default_factory=list)  # extra names in the server certificate
    bin_dir: str | None = None  # folder of flower-superlink / flower-supernode / flwr (None: PATH)
    fleet_api: str | None = None  # "grpc-rere" or "http" (None: the installed Flower's, see .flower_version)
    node_policy: dict = field(
        default_factory=dict
    )  # each node's own privacy policy: policy-* overrides of the deployment's secure default (policy())

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)

    # -- checks
    def validate(self) -> "DeployConfig":
        _positive_int(self.nodes, "--nodes")
        _positive_int(self.users_per_node, "--users-per-node")
        ports = {
            "--fleet-port": self.fleet_port,
            "--control-port": self.control_port,
            "--node-port-base": self.node_port_base,
        }
        for name, port in ports.items():
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                raise ConfigError(f"must be a port number in 1..65535, got {port!r}", field=name)
        if self.node_port_base + self.nodes - 1 > 65535:
            raise ConfigError(
                f"{self.nodes} nodes need ports {self.node_port_base}..{self.node_port_base + self.nodes - 1}",
                field="--node-port-base",
            )
        node_ports = range(self.node_port_base, self.node_port_base + self.nodes)
        if self.fleet_port == self.control_port or self.fleet_port in node_ports or self.control_port in node_ports:
            raise ConfigError(
                f"fleet {self.fleet_port}, control {self.control_port} and node ports "
                f"{node_ports.start}..{node_ports.stop - 1} must not overlap",
                field="--fleet-port",
            )
        if self.fleet_api is not None and self.fleet_api not in TRANSPORTS:
            raise ConfigError(
                f"must be one of {', '.join(TRANSPORTS)} (or unset: the installed Flower's), got {self.fleet_api!r}",
                field="fleet_api",
            )
        if self.auth and not self.tls:
            raise ConfigError(
                "SuperNode authentication needs TLS: drop --insecure or add --no-auth", field="--insecure"
            )
        for name, host in (("bind_host", self.bind_host), ("superlink_host", self.superlink_host)):
            if not host or any(c.isspace() for c in host) or "," in host:
                raise ConfigError(f"not a host name or address: {host!r}", field=name)
        for name in self.san:
            if not name or any(c.isspace() for c in name):
                raise ConfigError(f"not a host name or address: {name!r}", field="--san")
        self.policy()  # a bad node policy value: an error naming its key
        if self.data is not None:
            from ...data.spec import parse_data_spec

            if parse_data_spec(self.data).kind == "synthetic-personal":
                raise ConfigError(
                    "per-node data is written for rating data; start PAM jobs without --data at `deploy up`",
                    field="--data",
                )
        return self

    # -- files
    @property
    def certs_dir(self) -> Path:
        return self.run_dir / "certs"

    @property
    def ca_cert(self) -> Path:
        return self.certs_dir / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.certs_dir / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.certs_dir / "server.key"

    def node_private_key(self, i: int) -> Path:
        return self.run_dir / "keys" / f"node-{i}"

    def node_public_key(self, i: int) -> Path:
        return self.run_dir / "public-keys" / f"node-{i}.pub"

    def node_data_dir(self, i: int) -> Path:
        return self.run_dir / "node-data" / f"node-{i}"

    def node_files(self, i: int) -> list[Path]:
        """What SuperNode ``i`` needs on its own host, relative to the run folder: the CA
        certificate (TLS), its private key (authentication) and its data folder (per-node data).
        Copied to the same relative paths under another folder ``D``, the command of
        ``dataclasses.replace(cfg, run_dir=D)`` reads only them."""
        files = [self.ca_cert] if self.tls else []
        files += [self.node_private_key(i)] if self.auth else []
        files += [self.node_data_dir(i)] if self.data is not None else []
        return [f.relative_to(self.run_dir) for f in files]

    @property
    def flwr_home(self) -> Path:
        return self.run_dir / "flwr-home"

    def node_home(self, i: int) -> Path:
        return self.run_dir / "node-home" / f"node-{i}"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def app_dir(self) -> Path:
        return self.run_dir / "app"

    @property
    def run_config_file(self) -> Path:
        return self.run_dir / "run-config.toml"

    @property
    def out_dir(self) -> Path:
        return self.run_dir / "out"

    # -- transport and addresses
    @property
    def transport(self) -> str:
        """The Fleet API transport: ``fleet_api`` if set, else the installed Flower's."""
        return self.fleet_api or fleet_transport()

    @property
    def fleet_api_port(self) -> int:
        """The port the SuperNodes connect to: ``fleet_port`` on gRPC-rere (Flower 1.39), the
        SuperLink's one HTTP port ``control_port`` on the HTTP Fleet API (Flower >= 1.40)."""
        return self.fleet_port if self.transport == GRPC_RERE else self.control_port

    @property
    def superlink_ports(self) -> list[int]:
        """The ports the SuperLink listens on (what ``up`` waits for)."""
        return [self.control_port, self.fleet_port] if self.transport == GRPC_RERE else [self.control_port]

    @property
    def fleet_address(self) -> str:
        return f"{self.superlink_host}:{self.fleet_api_port}"

    @property
    def control_address(self) -> str:
        return f"{self.superlink_host}:{self.control_port}"

    def server_names(self) -> list[str]:
        return list(dict.fromkeys([*LOCAL_HOSTS, self.superlink_host, *self.san]))

    def node_ledger(self, i: int | None = None) -> str:
        """Where node ``i`` keeps its ledger: ``node-ledger.json`` in its own data folder
        (``{partition}`` for the node's partition id when ``i`` is None)."""
        folder = self.node_data_dir(i) if i is not None else self.run_dir / "node-data" / "node-{partition}"
        return str(folder / "node-ledger.json")

    def policy(self, i: int | None = None):
        """Node ``i``'s own privacy policy (its ``--node-config`` ``policy-*`` keys): the
        deployment's secure default, :data:`fedpriv.flower.node_policy.DEFAULT` with
        ``aggregation="secure"`` (only the secure-summation handlers answer: what ``deploy run``
        runs by default), ``relation="replace_one"`` (the relation a deployment accounts under,
        its enrolled count being public: :class:`.engine.Deployment`) and ``ledger`` in the
        node's own data folder (:meth:`node_ledger`: a lifetime budget on the node's disk,
        across runs and restarts), then the operator's ``node_policy`` overrides."""
        from ...flower.node_policy import DEFAULT, NodePolicy

        secure = {"aggregation": "secure", "relation": "replace_one", "ledger": self.node_ledger(i)}
        return NodePolicy.from_mapping({**DEFAULT.to_dict(), **secure, **self.node_policy})

    # -- the state file (run_dir left out: the folder may be mounted elsewhere)
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        del d["run_dir"], d["bin_dir"]
        return d

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> "DeployConfig":
        run_dir = Path(run_dir).expanduser().resolve()
        path = run_dir / STATE_FILE
        if not path.is_file():
            raise ConfigError(
                f"no deployment in {run_dir} ({STATE_FILE} missing): run `fedpriv deploy up` (or `prepare`) first",
                field="--run-dir",
            )
        d = json.loads(path.read_text())
        known = {f.name for f in dataclasses.fields(cls)} - {"run_dir", "bin_dir"}
        cfg = cls(run_dir=run_dir, bin_dir=_bin_dir(), **{k: v for k, v in d.items() if k in known})
        if cfg.data is not None:
            cfg.data = cfg.data.replace("{run_dir}", str(run_dir))
        return cfg


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be an integer >= 1, got {value!r}", field=name)
    return value


def _bin_dir() -> str:
    return str(Path(sys.executable).parent)


def docker_config(nodes: int = 3, *, data: bool = True, tls: bool = True, auth: bool = True) -> DeployConfig:
    """The configuration the compose file is generated from: the run folder at /fedpriv in
    every container; the SuperLink on the host's network (``network_mode: host``), listening on
    127.0.0.1, where the CLI reaches it and each SuperNode (in a network of its own, no route
    out) reaches it through the relay (:mod:`.compose`), on the fixed ports of
    :data:`DOCKER_PORTS`; executables from the image's PATH; the Fleet API transport of
    the Flower the images are built with (:func:`.flower_version.docker_transport`: HTTP, on the
    SuperLink's one port 8000), whatever Flower the host has. Each node's policy is the secure
    default (:meth:`DeployConfig.policy`) with its ledger at :data:`DOCKER_NODE_LEDGER`, on a
    named volume of the node's own (its data mount is read-only): the budget holds across runs,
    restarts and ``docker compose down``; ``down -v`` removes the volumes, and the budget with them."""
    return DeployConfig(
        run_dir=Path(DOCKER_RUN_DIR),
        nodes=nodes,
        tls=tls,
        auth=auth,
        data="(docker)" if data else None,
        bind_host="127.0.0.1",
        superlink_host="127.0.0.1",
        san=[],
        bin_dir=None,
        fleet_api=docker_transport(),
        node_policy={"policy-ledger": DOCKER_NODE_LEDGER},
        **DOCKER_PORTS,
    )
