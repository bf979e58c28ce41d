"""Run fedpriv on Flower's deployment runtime: one SuperLink and N SuperNodes talking gRPC over
loopback (``fedpriv deploy up|run|down``), or the same processes in Docker containers
(``docker/compose.yml``, generated from the same command builders).

* **Command builders** (:func:`superlink_command`, :func:`supernode_command`,
  :func:`flwr_run_command`, :func:`register_command`) are pure functions of a
  :class:`DeployConfig`; the local launcher and the compose file use the very same argv.
* **TLS**: a self-signed CA and a server certificate (SAN 127.0.0.1, localhost and any extra
  names, e.g. ``superlink`` in Docker) in ``RUN_DIR/certs``. The SuperLink gets ``--ssl-*``,
  each SuperNode ``--root-certificates``, the CLI connection ``root-certificates``.
* **SuperNode authentication**: one ECDSA P-384 key pair per node (OpenSSH format, as
  ``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register`` expect);
  the SuperLink runs with ``--enable-supernode-auth`` and every public key is registered with
  ``flwr supernode register`` before its node connects. An unregistered node is refused (the
  SuperNode exits with Flower's exit code 305).
* **Per-node data**: with ``--data``, ``up`` computes the split the ServerApp will compute (the
  same :func:`fedpriv.run.run` code, default split seed) and writes, for node i, a folder with
  only its users' ratings; the node gets ``data-dir`` in its node config and the ClientApp reads
  its shard from there instead of the folder the server broadcasts.

Layout of a run folder::

    RUN_DIR/deploy.json            the DeployConfig (without run_dir: the folder is portable)
    RUN_DIR/pids.json              PIDs of the processes ``up`` started (and their start times)
    RUN_DIR/logs/*.log             superlink.log, supernode-<i>.log, register.log
    RUN_DIR/certs/                 ca.crt, server.pem, server.key
    RUN_DIR/keys/node-<i>          private key of node i (0600)
    RUN_DIR/public-keys/node-<i>.pub
    RUN_DIR/node-data/node-<i>/    node i's partition files (only its users are non-empty)
    RUN_DIR/flwr-home/config.toml  the CLI connection ``deploy`` (project-local FLWR_HOME)
    RUN_DIR/app/, run-config.toml  the generated Flower app and run config of the last ``run``
    RUN_DIR/out/                   metrics.json and ledger.json of the last ``run``

Every input is checked before anything is written or started; a failing step stops every
process it started (by PID, with their children).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import atomic
from ..errors import ConfigError, FedprivError
from ..algorithms import registry
from ..algorithms.names import is_private
from . import launcher

CONNECTION = "deploy"  # name of the SuperLink connection in RUN_DIR/flwr-home/config.toml
STATE_FILE = "deploy.json"
PIDS_FILE = "pids.json"
DEFAULT_RUN_DIR = "runs/deploy"
DOCKER_RUN_DIR = "/fedpriv"  # where compose mounts the run folder (or parts of it)
DOCKER_PORTS = {"fleet_port": 9092, "control_port": 8000, "node_port_base": 9094}
LOCAL_HOSTS = ("127.0.0.1", "localhost")
STOP_SECONDS = 15.0  # SIGTERM, then SIGKILL after this long
CLI_SECONDS = 60.0  # one `flwr supernode ...` call
# `--set` keys that would change the split or the node count fixed by `deploy up`
FIXED_BY_UP = ("split", "split_seed", "heldout_fraction", "users_per_node", "nodes")


# ------------------------------------------------------------------------------ configuration
@dataclass
class DeployConfig:
    """One deployment: a SuperLink and ``nodes`` SuperNodes, and where their files live.

    ``bind_host`` is where the SuperLink listens (127.0.0.1 locally; 0.0.0.0 inside a
    container), ``superlink_host`` how nodes and the CLI reach it. SuperNode i serves its own
    runtime API on 127.0.0.1:``node_port_base + i`` (used by its ClientApp processes only)."""

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

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)

    # -- checks
    def validate(self) -> "DeployConfig":
        _positive_int(self.nodes, "--nodes")
        _positive_int(self.users_per_node, "--users-per-node")
        ports = {"--fleet-port": self.fleet_port, "--control-port": self.control_port, "--node-port-base": self.node_port_base}
        for name, port in ports.items():
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                raise ConfigError(f"must be a port number in 1..65535, got {port!r}", field=name)
        if self.node_port_base + self.nodes - 1 > 65535:
            raise ConfigError(f"{self.nodes} nodes need ports {self.node_port_base}..{self.node_port_base + self.nodes - 1}", field="--node-port-base")
        node_ports = range(self.node_port_base, self.node_port_base + self.nodes)
        if self.fleet_port == self.control_port or self.fleet_port in node_ports or self.control_port in node_ports:
            raise ConfigError(f"fleet {self.fleet_port}, control {self.control_port} and node ports {node_ports.start}..{node_ports.stop - 1} must not overlap", field="--fleet-port")
        if self.auth and not self.tls:
            raise ConfigError("SuperNode authentication needs TLS: drop --insecure or add --no-auth", field="--insecure")
        for name, host in (("bind_host", self.bind_host), ("superlink_host", self.superlink_host)):
            if not host or any(c.isspace() for c in host) or "," in host:
                raise ConfigError(f"not a host name or address: {host!r}", field=name)
        for name in self.san:
            if not name or any(c.isspace() for c in name):
                raise ConfigError(f"not a host name or address: {name!r}", field="--san")
        if self.data is not None:
            from ..data.spec import parse_data_spec

            if parse_data_spec(self.data).kind == "synthetic-personal":
                raise ConfigError("per-node data is written for rating data; start PAM jobs without --data at `deploy up`", field="--data")
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

    # -- addresses
    @property
    def fleet_address(self) -> str:
        return f"{self.superlink_host}:{self.fleet_port}"

    @property
    def control_address(self) -> str:
        return f"{self.superlink_host}:{self.control_port}"

    def server_names(self) -> list[str]:
        return list(dict.fromkeys([*LOCAL_HOSTS, self.superlink_host, *self.san]))

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
            raise ConfigError(f"no deployment in {run_dir} ({STATE_FILE} missing): run `fedpriv deploy up` (or `prepare`) first", field="--run-dir")
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
    every container, the SuperLink listening on all interfaces of its container and reached as
    ``superlink``; executables from the image's PATH."""
    return DeployConfig(
        run_dir=Path(DOCKER_RUN_DIR), nodes=nodes, tls=tls, auth=auth, data="(docker)" if data else None,
        bind_host="0.0.0.0", superlink_host="superlink", san=["superlink"], bin_dir=None, **DOCKER_PORTS,
    )


# ------------------------------------------------------------------------------ command builders
def _exe(cfg: DeployConfig, name: str) -> str:
    return str(Path(cfg.bin_dir) / name) if cfg.bin_dir else name


def superlink_command(cfg: DeployConfig) -> list[str]:
    """``flower-superlink``: Fleet API (gRPC-rere) on ``bind_host:fleet_port``, Control and
    Runtime HTTP API on ``bind_host:control_port``; TLS and SuperNode authentication as set."""
    cmd = [
        _exe(cfg, "flower-superlink"),
        "--fleet-api-address", f"{cfg.bind_host}:{cfg.fleet_port}",
        "--host", cfg.bind_host,
        "--port", str(cfg.control_port),
        "--disable-runtime-dependency-installation",
    ]  # fmt: skip
    if cfg.tls:
        cmd += ["--ssl-ca-certfile", str(cfg.ca_cert), "--ssl-certfile", str(cfg.server_cert), "--ssl-keyfile", str(cfg.server_key)]
    else:
        cmd += ["--insecure"]
    if cfg.auth:
        cmd += ["--enable-supernode-auth"]
    return cmd


def node_config(cfg: DeployConfig, i: int) -> str:
    """The ``--node-config`` of SuperNode ``i``."""
    parts = [f"partition-id={i}", f"num-partitions={cfg.nodes}"]
    if cfg.data is not None:
        parts.append(f"data-dir={json.dumps(str(cfg.node_data_dir(i)))}")
    return " ".join(parts)


def supernode_command(cfg: DeployConfig, i: int) -> list[str]:
    """``flower-supernode`` number ``i`` (0-based): partition ``i`` of ``nodes``."""
    if not 0 <= i < cfg.nodes:
        raise ConfigError(f"node index must be in 0..{cfg.nodes - 1}, got {i}", field="node")
    cmd = [
        _exe(cfg, "flower-supernode"),
        "--superlink", cfg.fleet_address,
        "--host", "127.0.0.1",
        "--port", str(cfg.node_port_base + i),
        "--node-config", node_config(cfg, i),
    ]  # fmt: skip
    cmd += ["--root-certificates", str(cfg.ca_cert)] if cfg.tls else ["--insecure"]
    if cfg.auth:
        cmd += ["--auth-supernode-private-key", str(cfg.node_private_key(i))]
    return cmd


def register_command(cfg: DeployConfig, i: int) -> list[str]:
    """``flwr supernode register`` of node ``i``'s public key (connection ``deploy``)."""
    return [_exe(cfg, "flwr"), "supernode", "register", str(cfg.node_public_key(i)), CONNECTION, "--format", "json"]


def flwr_run_command(cfg: DeployConfig) -> list[str]:
    """``flwr run APP deploy --stream --run-config FILE`` (app folder and run config in the run folder)."""
    return [_exe(cfg, "flwr"), "run", str(cfg.app_dir), CONNECTION, "--stream", "--run-config", str(cfg.run_config_file)]


def connection_toml(cfg: DeployConfig) -> str:
    """``FLWR_HOME/config.toml`` with the connection ``deploy`` to this SuperLink's Control API."""
    lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]", f"address = {json.dumps(cfg.control_address)}"]
    if cfg.tls:
        lines.append(f"root-certificates = {json.dumps(str(cfg.ca_cert.resolve() if not cfg.ca_cert.is_absolute() else cfg.ca_cert))}")
    else:
        lines.append("insecure = true")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ keys and certificates
def make_certs(certs_dir: str | os.PathLike, names: list[str] | tuple[str, ...] = LOCAL_HOSTS, days: int = 365) -> dict[str, Path]:
    """A self-signed CA and a server certificate signed by it, valid for ``names`` (IP
    addresses and DNS names in the SAN): ``ca.crt``, ``server.pem``, ``server.key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    certs_dir = Path(certs_dir)
    certs_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedpriv"), x509.NameAttribute(NameOID.COMMON_NAME, "fedpriv deployment CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False, key_agreement=False,
                          key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans: list = []
    for name in dict.fromkeys(names):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedpriv"), x509.NameAttribute(NameOID.COMMON_NAME, "fedpriv superlink")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True, data_encipherment=False, key_agreement=False,
                          key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": certs_dir / "ca.crt", "cert": certs_dir / "server.pem", "key": certs_dir / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(paths["key"], key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


def make_node_keys(private_path: str | os.PathLike, public_path: str | os.PathLike) -> None:
    """An ECDSA P-384 key pair in OpenSSH format: the private key for
    ``flower-supernode --auth-supernode-private-key``, the public key for ``flwr supernode register``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    Path(private_path).parent.mkdir(parents=True, exist_ok=True)
    Path(public_path).parent.mkdir(parents=True, exist_ok=True)
    _write_private(Path(private_path), key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    Path(public_path).write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def verify_server_cert(ca_path: str | os.PathLike, cert_path: str | os.PathLike, name: str) -> None:
    """Raise unless ``cert_path`` chains to the CA of ``ca_path`` and is valid for ``name`` (a
    DNS name or an IP address) as a TLS server certificate."""
    from cryptography import x509
    from cryptography.x509.verification import PolicyBuilder, Store

    ca = x509.load_pem_x509_certificate(Path(ca_path).read_bytes())
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    try:
        subject = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = x509.DNSName(name)
    PolicyBuilder().store(Store([ca])).build_server_verifier(subject).verify(cert, [])


# ------------------------------------------------------------------------------ per-node data
class _Captured(Exception):
    def __init__(self, job):
        self.job = job


def split_job(data: str, users_per_node: int):
    """The job the ServerApp will build for ``data`` (same :func:`fedpriv.run.run` code, same
    default split): its ``train``, ``valid``, ``test`` and ``users_per_node``."""
    from ..run import run

    def capture(job, n_nodes):
        raise _Captured(job)

    try:
        run("als", data, overrides={"users_per_node": str(users_per_node)}, engine="flower", progress=False, flower_runner=capture)
    except _Captured as c:
        return c.job
    raise AssertionError("the capturing runner did not run")  # pragma: no cover


def n_partitions(job) -> int:
    return -(-job.train.n_users // job.users_per_node)


def write_node_data(cfg: DeployConfig, job, root: Path | None = None) -> None:
    """Node i's folder under ``root`` (default: the run folder) with only its users' ratings."""
    from ..algorithms.shards import user_block
    from .partition import write_user_partitions

    n_users = job.train.n_users
    parts = {k: v for k, v in (("train", job.train), ("valid", job.valid), ("test", job.test)) if v is not None}
    for i in range(cfg.nodes):
        block = user_block(i, job.users_per_node, n_users)
        lo, hi = (int(block[0]), int(block[-1]) + 1) if len(block) else (n_users, n_users)
        rel = cfg.node_data_dir(i).relative_to(cfg.run_dir)
        write_user_partitions((root or cfg.run_dir) / rel, parts, {"n_users": n_users, "partition_id": i, "users": [lo, hi]}, (lo, hi))


# ------------------------------------------------------------------------------ preparing a run folder
def _portable_data(data: str | None, run_dir: Path) -> str | None:
    """The data spec with an absolute path, written relative to ``{run_dir}`` when inside it
    (so a run folder mounted elsewhere, e.g. in a container, still finds its data)."""
    if data is None:
        return None
    from ..data.spec import parse_data_spec

    spec = parse_data_spec(data)
    if spec.path is None:
        return str(spec)
    path = Path(spec.path).expanduser().resolve()
    try:
        spec.path = "{run_dir}/" + str(path.relative_to(run_dir))
    except ValueError:
        spec.path = str(path)
    return str(spec)


def prepare(cfg: DeployConfig, *, job=None) -> DeployConfig:
    """Write the run folder's certificates, node keys, per-node data, CLI connection and
    ``deploy.json``: everything into a staging folder first, then moved in place, so bad input
    or a failure leaves the folder as it was. Returns ``cfg`` (with absolute paths)."""
    cfg.run_dir = Path(cfg.run_dir).expanduser().resolve()
    cfg.validate()
    live = running(DeployConfig(run_dir=cfg.run_dir, nodes=1))
    if live:
        raise ConfigError(f"a deployment is running in {cfg.run_dir} (PIDs {', '.join(str(e['pid']) for e in live)}): `fedpriv deploy down` first", field="--run-dir")
    if cfg.data is not None and job is None:
        job = split_job(cfg.data, cfg.users_per_node)
    if job is not None and n_partitions(job) > cfg.nodes:
        raise ConfigError(f"{n_partitions(job)} partitions of {cfg.users_per_node} users need at least {n_partitions(job)} nodes, got {cfg.nodes}", field="--nodes")
    created = not cfg.run_dir.exists()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".prepare-", dir=cfg.run_dir))
    try:
        if cfg.tls:
            make_certs(stage / "certs", cfg.server_names())
        if cfg.auth:
            for i in range(cfg.nodes):
                make_node_keys(stage / "keys" / f"node-{i}", stage / "public-keys" / f"node-{i}.pub")
            os.chmod(stage / "keys", 0o700)
        if job is not None:
            write_node_data(cfg, job, root=stage)
        (stage / "flwr-home").mkdir()
        (stage / "flwr-home" / "config.toml").write_text(connection_toml(cfg))
        state = cfg.to_dict()
        state["data"] = _portable_data(cfg.data, cfg.run_dir)
        (stage / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        for name in ("certs", "keys", "public-keys", "node-data", "node-home"):
            shutil.rmtree(cfg.run_dir / name, ignore_errors=True)
        for entry in stage.iterdir():
            target = cfg.run_dir / entry.name
            if target.is_dir() and entry.name == "flwr-home":  # keep other FLWR_HOME content
                os.replace(entry / "config.toml", target / "config.toml")
                continue
            os.replace(entry, target)
    except BaseException:
        if created:
            shutil.rmtree(cfg.run_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return cfg


# ------------------------------------------------------------------------------ processes
def _start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot, Linux): guards against PID reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _ours(entry: dict) -> bool:
    pid = int(entry["pid"])
    if not launcher._alive(pid):  # noqa: SLF001
        return False
    ticks = entry.get("start")
    return ticks is None or _start_ticks(pid) in (None, ticks)


def _read_pids(cfg: DeployConfig) -> list[dict]:
    path = cfg.run_dir / PIDS_FILE
    if not path.is_file():
        return []
    try:
        return list(json.loads(path.read_text())["processes"])
    except (ValueError, KeyError, TypeError):
        raise FedprivError(f"{path} is not a pids file written by `fedpriv deploy up`") from None


def _write_pids(cfg: DeployConfig, entries: list[dict]) -> None:
    atomic.write_text(cfg.run_dir / PIDS_FILE, json.dumps({"processes": entries}, indent=2) + "\n")


def running(cfg: DeployConfig) -> list[dict]:
    """The recorded processes of ``cfg`` that are still alive."""
    return [e for e in _read_pids(cfg) if _ours(e)]


def stop(run_dir: str | os.PathLike, seconds: float = STOP_SECONDS, *, also: list[dict] = ()) -> list[int]:
    """Stop every process ``up`` recorded in ``run_dir`` (and the entries ``also``), then what
    they started (SuperExec, ServerApp, ClientApp processes): SIGTERM, SIGKILL after
    ``seconds``. Returns the PIDs stopped; removes ``pids.json``."""
    run_dir = Path(run_dir).expanduser().resolve()
    cfg = DeployConfig(run_dir=run_dir, nodes=1)
    live = list(dict.fromkeys(int(e["pid"]) for e in [*running(cfg), *(e for e in also if _ours(e))]))
    below = launcher._descendants(live)  # noqa: SLF001 - taken first: children get re-parented
    if live:
        launcher._terminate(live, seconds)  # noqa: SLF001
    left = [p for p in below if launcher._alive(p)]  # noqa: SLF001
    if left:
        launcher._terminate(left, 5.0)  # noqa: SLF001
    (run_dir / PIDS_FILE).unlink(missing_ok=True)
    return live + below


def _env(cfg: DeployConfig, home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = launcher._flwr_env(home)  # noqa: SLF001 - offline env, our bin dir first on PATH, FLWR_HOME
    for key in ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT"):
        env.pop(key, None)
    return env


def _spawn(cfg: DeployConfig, name: str, cmd: list[str], home: Path) -> dict:
    cfg.logs_dir.mkdir(parents=True, exist_ok=True)
    with open(cfg.logs_dir / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(cmd, cwd=cfg.run_dir, env=_env(cfg, home), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return {"name": name, "pid": proc.pid, "start": _start_ticks(proc.pid), "cmd": cmd}


def _tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(launcher._ANSI.sub("", line) for line in lines[-n:])  # noqa: SLF001


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _free_ports(n: int) -> list[int]:
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


def _free_block(n: int) -> int:
    """The first of ``n`` consecutive free loopback ports."""
    for _ in range(200):
        base = _free_ports(1)[0]
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
        r = subprocess.run(cmd, cwd=cfg.run_dir, env=_env(cfg, cfg.flwr_home), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"`{' '.join(cmd)}` did not finish within {timeout:g} s"
    return r.returncode, launcher._ANSI.sub("", r.stdout + r.stderr)  # noqa: SLF001


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


def register(cfg: DeployConfig, *, wait: float = 60.0, indices: list[int] | None = None, workers: int = 4) -> list[str]:
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
    live = running(DeployConfig(run_dir=cfg.run_dir, nodes=1))
    if live:
        raise ConfigError(f"a deployment is running in {cfg.run_dir} (PIDs {', '.join(str(e['pid']) for e in live)}): `fedpriv deploy down` first", field="--run-dir")
    # fresh loopback ports unless given (0 = choose)
    if 0 in (cfg.fleet_port, cfg.control_port, cfg.node_port_base):
        chosen = iter(_free_ports(2))
        cfg.fleet_port = cfg.fleet_port or next(chosen)
        cfg.control_port = cfg.control_port or next(chosen)
        if not cfg.node_port_base:
            while True:
                base = _free_block(cfg.nodes)
                if not {cfg.fleet_port, cfg.control_port} & set(range(base, base + cfg.nodes)):
                    break
            cfg.node_port_base = base
    prepare(cfg, job=job)
    (cfg.run_dir / PIDS_FILE).unlink(missing_ok=True)
    shutil.rmtree(cfg.logs_dir, ignore_errors=True)
    entries: list[dict] = []
    try:
        entries.append(_spawn(cfg, "superlink", superlink_command(cfg), cfg.flwr_home))
        _write_pids(cfg, entries)
        deadline = time.monotonic() + wait
        while not (_port_open(cfg.superlink_host, cfg.control_port) and _port_open(cfg.superlink_host, cfg.fleet_port)):
            if not launcher._alive(entries[0]["pid"]):  # noqa: SLF001
                raise FedprivError("the SuperLink exited; its log:\n" + _tail(cfg.logs_dir / "superlink.log"))
            if time.monotonic() > deadline:
                raise FedprivError(f"the SuperLink did not listen within {wait:g} s; its log:\n" + _tail(cfg.logs_dir / "superlink.log"))
            time.sleep(0.3)
        register(cfg, wait=max(5.0, deadline - time.monotonic()))
        for i in range(cfg.nodes):
            entries.append(_spawn(cfg, f"supernode-{i}", supernode_command(cfg, i), cfg.node_home(i)))
            _write_pids(cfg, entries)
        wait_for_nodes(cfg, entries, deadline)
    except BaseException:
        stop(cfg.run_dir, also=entries)
        raise
    return cfg


def wait_for_nodes(cfg: DeployConfig, entries: list[dict], deadline: float) -> None:
    """Until ``flwr supernode ls`` shows every node online; fails early if a SuperNode exits.
    A slow or failing ``ls`` (a loaded machine while many nodes start) is retried until the
    deadline."""
    online, error = 0, ""
    while True:
        for e in entries:
            if e["name"].startswith("supernode") and not launcher._alive(e["pid"]):  # noqa: SLF001
                raise FedprivError(f"{e['name']} exited; its log:\n" + _tail(cfg.logs_dir / f"{e['name']}.log"))
        try:
            online = sum(1 for n in list_nodes(cfg, timeout=max(10.0, min(CLI_SECONDS, deadline - time.monotonic()))) if n.get("status") == "online")
            error = ""
        except FedprivError as exc:
            error = f" (last `flwr supernode ls`: {exc})"
        if online >= cfg.nodes:
            return
        if time.monotonic() > deadline:
            raise FedprivError(f"{online} of {cfg.nodes} SuperNodes online after the wait{error}; last SuperNode log:\n" + _tail(cfg.logs_dir / f"supernode-{cfg.nodes - 1}.log"))
        time.sleep(1.0 if cfg.nodes <= 10 else 3.0)


# ------------------------------------------------------------------------------ running a job
def _app(cfg: DeployConfig) -> None:
    """The app folder (launcher's writer), with every run-config key the ServerApp reads."""
    import tomllib

    shutil.rmtree(cfg.app_dir, ignore_errors=True)
    launcher._write_app(cfg.app_dir)  # noqa: SLF001
    pyproject = cfg.app_dir / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]
    extra = {"round-timeout": 0.0, "node-wait": 120.0, "work-dir": ""}
    missing = {k: v for k, v in extra.items() if k not in declared}
    if missing:  # [tool.flwr.app.config] is the file's last table
        with open(pyproject, "a") as f:
            f.write("".join(f"{k} = {launcher._toml_value(v)}\n" for k, v in missing.items()))  # noqa: SLF001
        assert set(missing) <= set(tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"])


def run_job(
    cfg: DeployConfig,
    algorithm: str,
    *,
    data: str | None = None,
    epsilon: float | None = None,
    delta: float = 1e-5,
    overrides: dict[str, str] | None = None,
    round_timeout: float = 0.0,
    node_wait: float = 120.0,
    work_dir: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    quiet: bool = False,
    timeout: float | None = None,
    aggregation: str = "secure",
) -> dict:
    """Run one job on the deployment with ``flwr run APP deploy --stream``; the ServerApp
    writes ``out/metrics.json`` and ``out/ledger.json`` (default ``RUN_DIR/out``). Returns the
    metrics. Every input is checked (the same checks as ``fedpriv run``) before ``flwr run``.
    ``aggregation``: 'secure' (default: the ServerApp learns only noised sums) or 'central', for
    the private rating algorithms (an ``aggregation`` key in ``overrides`` wins)."""
    t0 = time.perf_counter()
    overrides = {str(k): str(v) for k, v in (overrides or {}).items()}
    if is_private(algorithm) and algorithm in registry.names():
        overrides.setdefault("aggregation", aggregation)
    for key in FIXED_BY_UP:
        if key in overrides:
            raise ConfigError("fixed by `fedpriv deploy up` (the nodes hold their data already); give it to `deploy up`", field=key)
    for key, option in (("round_timeout", "--round-timeout"), ("node_wait", "--node-wait")):
        if key in overrides:
            raise ConfigError(f"give it as {option} (a run-config key of its own)", field=key)
    for key, value in overrides.items():
        if "," in value or ";" in value:
            raise ConfigError(f"a value given to the flower engine cannot contain ',' or ';', got {value!r}", field=key)
    for name, value in (("--round-timeout", round_timeout), ("--node-wait", node_wait)):
        if not (isinstance(value, (int, float)) and value >= 0 and value == value and value != float("inf")):
            raise ConfigError(f"must be a finite number >= 0, got {value!r}", field=name)
    if cfg.data is not None:
        if data is not None and launcher._absolute_data(data) != launcher._absolute_data(cfg.data):  # noqa: SLF001
            raise ConfigError(f"the nodes hold partitions of {cfg.data!r}; run with that data (or omit --data)", field="--data")
        data = cfg.data
    elif data is None:
        raise ConfigError("give --data (the deployment was started without per-node data)", field="--data")
    n_parts = launcher._plan(algorithm, data, epsilon, delta, {**overrides, "users_per_node": str(cfg.users_per_node)})  # noqa: SLF001
    if n_parts > cfg.nodes:
        raise ConfigError(f"{n_parts} partitions of {cfg.users_per_node} users need {n_parts} nodes; the deployment has {cfg.nodes}", field="--users-per-node")
    if cfg.run_dir.joinpath(PIDS_FILE).is_file() and not running(cfg):
        raise ConfigError(f"the deployment in {cfg.run_dir} is not running: `fedpriv deploy up` first", field="--run-dir")
    out_dir = Path(out).expanduser().resolve() if out is not None else cfg.out_dir
    run_config = {
        "algorithm": algorithm,
        "data": launcher._absolute_data(data),  # noqa: SLF001
        "epsilon": launcher.run_config_epsilon_value(algorithm, epsilon),
        "delta": float(delta),
        "users-per-node": cfg.users_per_node,
        "set": ",".join([*(f"{k}={v}" for k, v in overrides.items()), f"nodes={cfg.nodes}"]),
        "out": str(out_dir),
        "round-timeout": float(round_timeout),
        "node-wait": float(node_wait),
        "work-dir": str(Path(work_dir).expanduser().resolve()) if work_dir else "",
    }
    _app(cfg)
    write_connection(cfg)
    launcher._write_run_config(cfg.run_config_file, run_config)  # noqa: SLF001
    before = _stamp(out_dir)
    earlier = {r.get("run-id") for r in list_runs(cfg)}
    try:
        code, tail = launcher._run_streaming(flwr_run_command(cfg), cwd=cfg.run_dir, env=_env(cfg, cfg.flwr_home), quiet=quiet, timeout=timeout)  # noqa: SLF001
    except BaseException:  # timeout or interrupt: `flwr run` is stopped, stop the run on the SuperLink too
        stop_runs(cfg, exclude=earlier)
        raise
    if code != 0:
        stop_runs(cfg, exclude=earlier)
    metrics_path, ledger_path = out_dir / "metrics.json", out_dir / "ledger.json"
    if code != 0 or _stamp(out_dir) == before or not ledger_path.is_file():
        reasons = [m.group(1) for line in tail if (m := launcher._ERROR_LINE.search(line))]  # noqa: SLF001
        what = f"`flwr run` exited with code {code}" if code != 0 else "the run wrote no new metrics.json"
        raise FedprivError((f"{reasons[-1]} ({what})" if reasons else what) + "; last output:\n" + "\n".join(tail[-40:]))
    metrics = json.loads(metrics_path.read_text())
    metrics["deploy_wall_seconds"] = time.perf_counter() - t0
    return metrics


def _stamp(out_dir: Path):
    try:
        st = (out_dir / "metrics.json").stat()
        return (st.st_mtime_ns, st.st_ino)
    except OSError:
        return None


# ------------------------------------------------------------------------------ compose file
def compose_yaml(nodes: int = 3) -> str:
    """``docker/compose.yml``: the SuperLink, a one-shot ``register`` service (node keys) and
    ``nodes`` SuperNodes, with the commands of the builders above for :func:`docker_config`.
    The run folder (``FEDPRIV_RUN_DIR``, default ``./run``) is prepared on the host with
    ``fedpriv deploy prepare --docker``; each SuperNode mounts only its own key and data."""
    cfg = docker_config(nodes)
    run = "${FEDPRIV_RUN_DIR:-./run}"
    root = DOCKER_RUN_DIR

    def flow(items) -> str:
        return "[" + ", ".join(json.dumps(str(x)) for x in items) + "]"

    sl = superlink_command(cfg)
    reg = ["fedpriv", "deploy", "register", "--run-dir", root, "--wait", "120"]
    lines = [
        "# Generated by `python -m fedpriv.flower.deploy compose --nodes %d` from the command builders of" % nodes,
        "# fedpriv/flower/deploy.py (tests/test_deploy.py checks that it matches). Prepare the run folder first:",
        "#   fedpriv deploy prepare --docker --run-dir docker/run --nodes %d --data SPEC --users-per-node U" % nodes,
        "# then: FEDPRIV_RUN_DIR=./run docker compose -f docker/compose.yml up --build -d  (see docker/README.md)",
        "name: fedpriv",
        "services:",
        "  superlink:",
        "    build: {context: .., dockerfile: docker/Dockerfile.superlink}",
        "    image: fedpriv-superlink:latest",
        f"    entrypoint: {flow(sl[:1])}",
        f"    command: {flow(sl[1:])}",
        "    ports: [\"127.0.0.1:%d:%d\"]  # Control API for the host's flwr CLI; the Fleet API stays inside the network" % (cfg.control_port, cfg.control_port),
        f"    volumes: [\"{run}:{root}\"]",
        f"    tmpfs: [\"{root}/keys\", \"{root}/node-data\"]  # the server sees no node key and no node data",
        "    environment: {FLWR_TELEMETRY_ENABLED: \"0\", FLWR_DISABLE_UPDATE_CHECK: \"1\", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION: \"1\"}",
        "  register:",
        "    image: fedpriv-superlink:latest",
        f"    entrypoint: {flow(reg[:1])}",
        f"    command: {flow(reg[1:])}",
        f"    volumes: [\"{run}:{root}\"]",
        f"    tmpfs: [\"{root}/keys\", \"{root}/node-data\"]",
        "    environment: {FLWR_TELEMETRY_ENABLED: \"0\", FLWR_DISABLE_UPDATE_CHECK: \"1\"}",
        "    depends_on: {superlink: {condition: service_started}}",
        "    restart: \"no\"",
    ]
    for i in range(nodes):
        sn = supernode_command(cfg, i)
        lines += [
            f"  supernode-{i}:",
            *(["    build: {context: .., dockerfile: docker/Dockerfile.supernode}"] if i == 0 else []),
            "    image: fedpriv-supernode:latest",
            f"    entrypoint: {flow(sn[:1])}",
            f"    command: {flow(sn[1:])}",
            "    volumes:",
            f"      - \"{run}/certs/ca.crt:{cfg.ca_cert}:ro\"",
            f"      - \"{run}/keys/node-{i}:{cfg.node_private_key(i)}:ro\"",
            f"      - \"{run}/node-data/node-{i}:{cfg.node_data_dir(i)}:ro\"",
            "    environment: {FLWR_TELEMETRY_ENABLED: \"0\", FLWR_DISABLE_UPDATE_CHECK: \"1\"}",
            "    depends_on: {register: {condition: service_completed_successfully}}",
            "    restart: on-failure",
        ]
    return "\n".join(lines) + "\n"


def compose_services(nodes: int = 3) -> dict[str, list[str]]:
    """The argv of every compose service, from the builders (what ``compose.yml`` must run)."""
    cfg = docker_config(nodes)
    out = {"superlink": superlink_command(cfg), "register": ["fedpriv", "deploy", "register", "--run-dir", DOCKER_RUN_DIR, "--wait", "120"]}
    out.update({f"supernode-{i}": supernode_command(cfg, i) for i in range(nodes)})
    return out


# ------------------------------------------------------------------------------ command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``deploy up|run|down|status|prepare|register|compose|certs`` (shared by ``fedpriv deploy``
    and ``python -m fedpriv.flower.deploy``)."""
    sub = parser.add_subparsers(dest="deploy_command", required=True)

    def run_dir(p):
        p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, help=f"the deployment's folder (default {DEFAULT_RUN_DIR})")

    def layout(p, local: bool):
        run_dir(p)
        p.add_argument("--nodes", type=int, default=None, help="number of SuperNodes (default with --data: one per partition of --users-per-node users; else 3)")
        p.add_argument("--data", default=None, help="data spec: each node gets a folder with only its users' ratings (same split as the ServerApp)")
        p.add_argument("--users-per-node", type=int, default=1, help="users held by each node (default 1)")
        p.add_argument("--insecure", action="store_true", help="no TLS (implies --no-auth)")
        p.add_argument("--no-auth", action="store_true", help="no SuperNode authentication")
        default = 0 if local else None
        p.add_argument("--fleet-port", type=int, default=default, help="SuperLink Fleet API port" + (" (default: a free loopback port)" if local else " (default 9092)"))
        p.add_argument("--control-port", type=int, default=default, help="SuperLink Control/Runtime HTTP API port" + (" (default: a free port)" if local else " (default 8000)"))
        p.add_argument("--node-port-base", type=int, default=default, help="SuperNode i serves its runtime API on this port + i" + (" (default: free ports)" if local else " (default 9094)"))
        p.add_argument("--san", action="append", default=[], metavar="HOST", help="extra host name or address in the server certificate (repeatable)")

    u = sub.add_parser("up", help="start a SuperLink and N SuperNodes on loopback (TLS and node authentication by default)")
    layout(u, local=True)
    u.add_argument("--wait", type=float, default=180.0, help="seconds to wait for the SuperLink and every node to be online")

    pr = sub.add_parser("prepare", help="write certificates, node keys, per-node data and deploy.json without starting anything")
    layout(pr, local=False)
    pr.add_argument("--docker", action="store_true", help="the layout of docker/compose.yml (SuperLink `superlink` on 0.0.0.0 in its container)")

    r = sub.add_parser("run", help="run one job on the running deployment (`flwr run APP deploy --stream`)")
    run_dir(r)
    r.add_argument("algorithm")
    r.add_argument("--data", default=None, help="data spec (default: the one given to `deploy up`)")
    r.add_argument("--epsilon", type=float, default=None)
    r.add_argument("--delta", type=float, default=1e-5)
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="hyperparameter or run option (repeatable)")
    r.add_argument("--aggregation", choices=("central", "secure"), default="secure", help="secure (default: the server learns only noised sums, the nodes add distributed noise) or central (the ServerApp's aggregator step sees exact sums)")
    r.add_argument("--round-timeout", type=float, default=0.0, help="seconds to wait for replies per round; later replies are rejected (0: wait)")
    r.add_argument("--node-wait", type=float, default=120.0, help="seconds the ServerApp waits for the nodes")
    r.add_argument("--work-dir", default=None, help="server work folder (keeps the checkpoint: run again with it to resume)")
    r.add_argument("--out", default=None, help="output folder for metrics.json and ledger.json (default RUN_DIR/out)")
    r.add_argument("--timeout", type=float, default=None, help="bound on the `flwr run` call, in seconds")
    r.add_argument("--quiet", action="store_true", help="do not echo Flower's log")

    d = sub.add_parser("down", help="stop every process of the deployment (SIGTERM, then SIGKILL)")
    run_dir(d)
    d.add_argument("--grace", type=float, default=STOP_SECONDS, help="seconds between SIGTERM and SIGKILL")

    s = sub.add_parser("status", help="the deployment's processes and the SuperLink's nodes")
    run_dir(s)

    g = sub.add_parser("register", help="register every node's public key with the SuperLink (`flwr supernode register`)")
    run_dir(g)
    g.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the SuperLink's Control API")

    c = sub.add_parser("compose", help="print docker/compose.yml (generated from the command builders)")
    c.add_argument("--nodes", type=int, default=3)

    ce = sub.add_parser("certs", help="write a CA, a server certificate and node key pairs into DIR")
    ce.add_argument("dir")
    ce.add_argument("--nodes", type=int, default=3, help="node key pairs to write (keys/node-<i>, public-keys/node-<i>.pub)")
    ce.add_argument("--san", action="append", default=[], metavar="HOST", help="extra host name or address in the server certificate (repeatable)")


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
        run_dir=Path(args.run_dir), nodes=nodes, tls=not insecure, auth=not (insecure or args.no_auth), data=args.data, users_per_node=upn,
        san=list(args.san), **ports,
    )
    if docker:
        cfg.bind_host, cfg.superlink_host = "0.0.0.0", "superlink"
        cfg.san = list(dict.fromkeys(["superlink", *cfg.san]))
    return cfg, job


def command(args) -> int:
    """Run a parsed ``deploy`` command."""
    what = args.deploy_command
    if what == "up":
        cfg, job = _layout_config(args)
        cfg = up(cfg, wait=args.wait, job=job)
        print(json.dumps({"run_dir": str(cfg.run_dir), "superlink": cfg.control_address, "fleet": cfg.fleet_address, "nodes": cfg.nodes, "tls": cfg.tls, "auth": cfg.auth,
                          "pids": {e["name"]: e["pid"] for e in running(cfg)}}))
        return 0
    if what == "prepare":
        if args.docker and args.data is None:
            raise ConfigError("the compose file gives every SuperNode its own data folder: give --data", field="--data")
        cfg, job = _layout_config(args, docker=args.docker)
        if not args.docker and 0 in (cfg.fleet_port, cfg.control_port, cfg.node_port_base):
            cfg.fleet_port, cfg.control_port, cfg.node_port_base = (cfg.fleet_port or 9092, cfg.control_port or 8000, cfg.node_port_base or 9094)
        cfg = prepare(cfg, job=job)
        print(json.dumps({"run_dir": str(cfg.run_dir), "nodes": cfg.nodes, "tls": cfg.tls, "auth": cfg.auth, "data": cfg.data}))
        return 0
    if what == "run":
        from ..run import parse_overrides

        cfg = DeployConfig.load(args.run_dir)
        metrics = run_job(
            cfg, args.algorithm, data=args.data, epsilon=args.epsilon, delta=args.delta, overrides=parse_overrides(args.overrides), aggregation=args.aggregation,
            round_timeout=args.round_timeout, node_wait=args.node_wait, work_dir=args.work_dir, out=args.out, quiet=args.quiet, timeout=args.timeout,
        )
        keys = [k for k in metrics if k.startswith(("test_", "valid_")) and not k.endswith("sliced")]
        summary = {k: metrics.get(k) for k in ("algorithm", "dataset", "epsilon", "epsilon_spent", *keys, "rounds", "wall_seconds", "deploy_wall_seconds")}
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
        ids = register(cfg, wait=args.wait)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedpriv.flower.deploy", description="Flower deployment runtime for fedpriv (same as `fedpriv deploy`).")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return command(args)
    except FedprivError as exc:
        print(f"fedpriv: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
