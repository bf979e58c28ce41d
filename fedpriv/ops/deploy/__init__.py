"""Run fedpriv on Flower's deployment runtime: one SuperLink and N SuperNodes on loopback
(``fedpriv deploy up|run|down``), or the same processes in Docker containers
(``docker/compose.yml``, generated from the same command builders).

* **Flower 1.39 to 1.42**: the SuperNodes reach the SuperLink's Fleet API over gRPC-rere on
  Flower 1.39 (a port of its own) and over HTTP from 1.40 (the SuperLink's one HTTP port, with
  the Control and Runtime APIs). :mod:`.flower_version` reads the installed Flower's version
  and decides, in one place; the command builders follow ``DeployConfig.transport``.

* **Command builders** (:func:`superlink_command`, :func:`supernode_command`,
  :func:`flwr_run_command`, :func:`register_command`) are pure functions of a
  :class:`DeployConfig`; the local launcher and the compose file use the very same argv.
* **TLS**: a self-signed CA and a server certificate (SAN 127.0.0.1, localhost and any extra
  names, e.g. a host's address for nodes on other hosts) in ``RUN_DIR/certs``. The SuperLink gets ``--ssl-*``,
  each SuperNode ``--root-certificates``, the CLI connection ``root-certificates``.
* **SuperNode authentication**: one ECDSA P-384 key pair per node (OpenSSH format, as
  ``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register`` expect);
  the SuperLink runs with ``--enable-supernode-auth`` and every public key is registered with
  ``flwr supernode register`` before its node connects. An unregistered node is refused (the
  SuperNode exits with Flower's exit code 305).
* **Per-node data** (``deploy partition``, or ``up``/``prepare`` with ``--data``): the data
  owner's step writes, for node i, a folder with only its users' ratings and a copy of the
  public metadata, and a ``public`` folder for the server (item count and ids, item features,
  rating range, the public split seed). The node gets ``data-dir`` in its node config and splits
  its own users' ratings; the ServerApp of ``deploy run`` starts from ``public:RUN_DIR/public``
  and never opens a ratings file.

Layout of a run folder::

    RUN_DIR/deploy.json            the DeployConfig (without run_dir: the folder is portable)
    RUN_DIR/pids.json              PIDs of the processes ``up`` started (and their start times)
    RUN_DIR/logs/*.log             superlink.log, supernode-<i>.log, register.log
    RUN_DIR/certs/                 ca.crt, server.pem, server.key
    RUN_DIR/keys/node-<i>          private key of node i (0600)
    RUN_DIR/public-keys/node-<i>.pub
    RUN_DIR/node-data/node-<i>/    node i's ratings.npz (its users only), public/ copy, split/ (its own)
    RUN_DIR/public/                the server's public metadata (no ratings)
    RUN_DIR/flwr-home/config.toml  the CLI connection ``deploy`` (project-local FLWR_HOME)
    RUN_DIR/app/, run-config.toml  the generated Flower app and run config of the last ``run``
    RUN_DIR/out/                   metrics.json and ledger.json of the last ``run``

Every input is checked before anything is written or started; a failing step stops every
process it started (by PID, with their children).

Modules of this package (each imports only modules listed above it)::

    flower_version.py  the installed Flower's version and its Fleet API transport (gRPC-rere or HTTP)
    config.py      DeployConfig (the run folder's files, deploy.json), constants, docker_config
    commands.py    command builders (superlink, supernode, register, flwr run), connection_toml
    certs.py       keys and certificates: make_certs, make_node_keys, verify_server_cert
    nodedata.py    per-node data (the data owner's step): split_job, write_partition, write_node_data
    pids.py        pids.json: running, stop (SIGTERM, then SIGKILL, with children)
    prepare.py     preparing a run folder: prepare
    netns.py       a SuperNode in a network namespace of its own, relayed to the SuperLink (standard library only)
    processes.py   spawning, ports, flwr CLI helpers, register, up, wait_for_nodes
    job.py         running a job: run_deployed_job
    compose.py     docker/compose.yml: compose_yaml, compose_services
    cli.py         command line: add_arguments, command, main (``__main__.py`` runs main)

Their names are re-exported here: ``from fedpriv.flower import deploy; deploy.up(...)``.
"""

from __future__ import annotations

from .certs import make_certs, make_node_keys, verify_server_cert
from .cli import add_deploy_arguments, deploy_command, deploy_main
from .commands import (
    connection_toml,
    flwr_run_command,
    node_config,
    register_command,
    superlink_command,
    supernode_command,
)
from .compose import compose_services, compose_yaml
from .config import (
    CLI_SECONDS,
    CONNECTION,
    DEFAULT_RUN_DIR,
    DOCKER_NODE_LEDGER,
    DOCKER_PORTS,
    DOCKER_RUN_DIR,
    FIXED_BY_UP,
    LOCAL_HOSTS,
    PIDS_FILE,
    STATE_FILE,
    STOP_SECONDS,
    DeployConfig,
    docker_config,
)
from .flower_version import DOCKER_FLWR_VERSION, GRPC_RERE, HTTP, fleet_transport, flwr_version
from .job import run_deployed_job
from .nodedata import Partition, n_partitions, split_job, write_node_data, write_partition
from .pids import running, stop
from .prepare import _portable_data as _portable_data  # private helpers the tests call
from .prepare import prepare
from .processes import _env as _env
from .processes import list_nodes, list_runs, register_supernodes, stop_runs, up, wait_for_supernodes, write_connection

__all__ = [
    "DOCKER_FLWR_VERSION", "GRPC_RERE", "HTTP", "fleet_transport", "flwr_version",
    "CLI_SECONDS", "CONNECTION", "DEFAULT_RUN_DIR", "DOCKER_NODE_LEDGER",
    "DOCKER_PORTS", "DOCKER_RUN_DIR", "FIXED_BY_UP", "LOCAL_HOSTS", "PIDS_FILE", "STATE_FILE",
    "STOP_SECONDS", "DeployConfig", "add_deploy_arguments", "deploy_command", "compose_services", "compose_yaml",
    "connection_toml", "docker_config", "flwr_run_command", "list_nodes", "list_runs", "deploy_main", "make_certs",
    "make_node_keys", "n_partitions", "node_config", "prepare", "register_supernodes", "register_command",
    "run_deployed_job", "running", "split_job", "stop", "stop_runs", "superlink_command", "supernode_command", "up",
    "verify_server_cert", "wait_for_supernodes", "write_connection", "write_node_data", "write_partition", "Partition",
]  # fmt: skip
