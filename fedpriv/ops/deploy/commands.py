"""The command builders: pure functions of a :class:`DeployConfig` giving the argv of
``flower-superlink``, ``flower-supernode``, ``flwr supernode register`` and ``flwr run`` (the
local launcher and the compose file use the very same argv), and the CLI connection file."""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import ConfigError
from .config import CONNECTION, DeployConfig
from .flower_version import GRPC_RERE


def _exe(cfg: DeployConfig, name: str) -> str:
    return str(Path(cfg.bin_dir) / name) if cfg.bin_dir else name


def superlink_command(cfg: DeployConfig) -> list[str]:
    """``flower-superlink``: the Control and Runtime HTTP API on ``bind_host:control_port``; the
    Fleet API on the transport of ``cfg.transport`` (:mod:`.flower_version`): gRPC-rere on
    ``bind_host:fleet_port`` (Flower 1.39), or over HTTP on that same ``bind_host:control_port``
    (Flower >= 1.40: no ``--fleet-api-address``, which is deprecated there). TLS and SuperNode
    authentication as set (the same flags on both)."""
    cmd = [_exe(cfg, "flower-superlink")]
    if cfg.transport == GRPC_RERE:
        cmd += ["--fleet-api-address", f"{cfg.bind_host}:{cfg.fleet_port}"]
    cmd += [
        "--host", cfg.bind_host,
        "--port", str(cfg.control_port),
        "--disable-runtime-dependency-installation",
    ]  # fmt: skip
    if cfg.tls:
        cmd += [
            "--ssl-ca-certfile",
            str(cfg.ca_cert),
            "--ssl-certfile",
            str(cfg.server_cert),
            "--ssl-keyfile",
            str(cfg.server_key),
        ]
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
    for key, value in (
        cfg.policy(i).node_config_items().items()
    ):  # the node's own privacy policy (fedpriv.flower.node_policy)
        parts.append(f"{key}={json.dumps(value if isinstance(value, (bool, int, float)) else str(value))}")
    return " ".join(parts)


def supernode_command(cfg: DeployConfig, i: int) -> list[str]:
    """``flower-supernode`` number ``i`` (0-based): partition ``i`` of ``nodes``. ``--superlink``
    is the Fleet API's address (:attr:`DeployConfig.fleet_address`: the gRPC-rere port on Flower
    1.39, the SuperLink's HTTP port from 1.40); the flags are the same on both transports."""
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
    return [
        _exe(cfg, "flwr"),
        "run",
        str(cfg.app_dir),
        CONNECTION,
        "--stream",
        "--run-config",
        str(cfg.run_config_file),
    ]


def connection_toml(cfg: DeployConfig) -> str:
    """``FLWR_HOME/config.toml`` with the connection ``deploy`` to this SuperLink's Control API."""
    lines = [
        "[superlink]",
        f'default = "{CONNECTION}"',
        "",
        f"[superlink.{CONNECTION}]",
        f"address = {json.dumps(cfg.control_address)}",
    ]
    if cfg.tls:
        lines.append(
            "root-certificates = "
            f"{json.dumps(str(cfg.ca_cert.resolve() if not cfg.ca_cert.is_absolute() else cfg.ca_cert))}"
        )
    else:
        lines.append("insecure = true")
    return "\n".join(lines) + "\n"
