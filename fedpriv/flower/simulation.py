"""Run a job on Flower's simulation runtime (Ray), in this process: the ServerApp runs here and
every node runs the fedpriv ClientApp. The offline and quiet settings are set here, so users do
not have to know them.

By default Ray is started here, privately, and stopped at the end. With ``ray_address`` the
nodes run on an existing Ray cluster instead (see ``docs/how-to/ray-cluster.md``): Flower passes
``backend_config["init_args"]`` to ``ray.init``, so ``address`` goes there, and its
``ray.shutdown()`` at the end only disconnects this process from that cluster.

Without ``ray_address``, Ray's own rules apply (``ray.init()`` with no address): the
``RAY_ADDRESS`` environment variable, then the cluster of the last ``ray start`` on this host
(``/tmp/ray/ray_current_cluster``), then a new local instance. ``ray_address="local"`` always
starts a new private instance."""

from __future__ import annotations

import contextlib
import contextvars
import os
from pathlib import Path
import socket
import warnings

from ..errors import ConfigError, FedprivError
from .server_app import FlowerJob, FlowerResult, make_server_app

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}
CONNECT_SECONDS = 5.0  # TCP check of a cluster address before Ray gets it


def set_offline_env() -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def _split_host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``HOST:PORT`` or ``[IPv6]:PORT`` address; None if it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return (host, int(port)) if 0 < int(port) < 65536 else None


def check_ray_address(address: str) -> str:
    """The Ray address to connect to, checked: ``HOST:PORT`` of a head node's GCS (must accept a
    TCP connection now: Ray itself retries an unreachable GCS indefinitely, measured > 5 min),
    ``ray://HOST:PORT`` (Ray Client), ``auto`` (the cluster of the last ``ray start`` on this
    host, or ``RAY_ADDRESS``) or ``local`` (a new private instance)."""
    if not isinstance(address, str) or not address.strip():
        raise ConfigError(
            f"must be HOST:PORT, ray://HOST:PORT, 'auto' or 'local', got {address!r}", field="ray_address"
        )
    address = address.strip()
    if address in ("auto", "local"):
        return address
    target = address.split("://", 1)[1] if address.startswith("ray://") else address
    if "://" in target or (hp := _split_host_port(target)) is None:
        raise ConfigError(
            f"must be HOST:PORT, ray://HOST:PORT, 'auto' or 'local', got {address!r}", field="ray_address"
        )
    try:
        with socket.create_connection(hp, timeout=CONNECT_SECONDS):
            pass
    except OSError as e:
        raise FedprivError(
            f"cannot reach the Ray cluster at {address} ({e}); is `ray start --head` running there, and is the port "
            f"open?"
        ) from None
    return address


_SHARED_LEDGER: "contextvars.ContextVar[Path | None]" = contextvars.ContextVar(
    "fedpriv_shared_node_ledger", default=None
)


@contextlib.contextmanager
def shared_node_ledger(folder: str | os.PathLike):
    """Inside the block, every :func:`simulate` keeps its nodes' ledgers in ``folder``
    (``node-{partition}.json``) instead of its job's own work folder: the jobs of one private
    tuning (:meth:`fedpriv.run.flower_engines.FlowerOptions.tuning_candidates`) share one node
    ledger, so the nodes' budget bounds all their candidates together."""
    token = _SHARED_LEDGER.set(Path(folder))
    try:
        yield Path(folder)
    finally:
        _SHARED_LEDGER.reset(token)


def node_policy_for(job, nodes: int):
    """The simulated nodes' own policy for ``job`` (the user's options, the user operating every
    node): :meth:`NodePolicy.for_config <fedpriv.flower.node_policy.NodePolicy.for_config>` with
    a file ledger per node, ``node-ledger/node-{partition}.json`` in the job's work folder (or the
    folder of :func:`shared_node_ledger`), and the job's recommendation epsilon as its cap."""
    from .node_policy import NodePolicy

    folder = _SHARED_LEDGER.get() or Path(job.work_dir) / "node-ledger"
    rec = getattr(job, "recommend", None)
    return NodePolicy.for_config(
        job.cfg,
        epsilon=job.epsilon,
        delta=job.delta,
        nodes=nodes,
        reproducible=job.secrets.reproducible,
        ledger=str(Path(folder).resolve() / "node-{partition}.json"),
        recommend=rec,
    )


def simulate(
    job: FlowerJob,
    num_nodes: int,
    *,
    cpus_per_node: float = 1.0,
    verbose: bool = False,
    client_app=None,
    ray_address: str | None = None,
    gpus_per_node: float = 0.0,
    node_device: str | None = None,
) -> FlowerResult:
    """Run ``job`` on ``num_nodes`` simulated nodes (default ClientApp: fedpriv's).

    ``ray_address`` (e.g. ``"10.0.0.5:6379"``, the address ``ray start --head`` prints) runs
    the nodes on that existing Ray cluster instead of a new local Ray; the cluster keeps
    running afterwards. This process (the ServerApp) must run on a node of that cluster for a
    ``HOST:PORT`` address. Every worker host needs the same Python environment and fedpriv, and
    must see ``job.work_dir`` at the same path (the nodes memory-map their partitions there).

    ``gpus_per_node``: the GPU share Ray reserves for each node's actor (Flower's
    ``client_resources``, ``num_gpus``); ``node_device``: the device the nodes compute their
    training step on (``"cuda"``: :mod:`fedpriv.flower.node_device`), given to the workers as
    ``FEDPRIV_NODE_DEVICE``. A node device other than the CPU needs a GPU share."""
    set_offline_env()
    _check_gpu_share(gpus_per_node, node_device, local=ray_address is None)
    init_args = {"logging_level": "ERROR", "log_to_driver": verbose, "include_dashboard": False}
    if ray_address is not None:
        init_args["address"] = check_ray_address(ray_address)
        import ray

        if ray.is_initialized():  # Flower would reuse that connection and ignore the address
            raise FedprivError(
                "Ray is already initialized in this process, so ray_address would be ignored; call ray.shutdown() first"
            )

    if client_app is None:
        from .client_app import app as client_app

    # the nodes' own policy (fedpriv.flower.node_policy) from the user's options (the user
    # operates every simulated node): a file the Ray workers read through FEDPRIV_NODE_POLICY,
    # which they get from the job's Ray runtime environment (_init_ray: on an existing cluster
    # the workers inherit `ray start`'s environment, not this process's)
    from .node_policy import POLICY_ENV

    n_users, upn = getattr(job, "n_users", None), getattr(job, "users_per_node", None)
    serving = min(num_nodes, -(-n_users // upn)) if n_users and upn else num_nodes  # the nodes that hold a partition
    policy = node_policy_for(job, serving)  # a file ledger per node: in the job's work folder, or a tuning's shared one
    policy_file = policy.write(Path(job.work_dir) / "node-policy.json")
    previous = os.environ.get(POLICY_ENV)
    os.environ[POLICY_ENV] = policy_file
    try:
        from .node_device import ENV as DEVICE_ENV

        from ..algorithms.families import FAMILIES_ENV

        env = {POLICY_ENV: policy_file, **({DEVICE_ENV: node_device} if node_device else {})}
        if os.environ.get(FAMILIES_ENV):  # the families this process serves: the simulated nodes serve them too
            env[FAMILIES_ENV] = os.environ[FAMILIES_ENV]
        return _simulate(
            job,
            num_nodes,
            client_app,
            init_args,
            {"num_cpus": cpus_per_node, "num_gpus": float(gpus_per_node)},
            verbose,
            env,
        )
    finally:
        if previous is None:
            os.environ.pop(POLICY_ENV, None)
        else:
            os.environ[POLICY_ENV] = previous


def _init_ray(init_args: dict, env_vars: dict) -> None:
    """``ray.init`` as Flower would call it (``init_args``, the ``PYTHONPATH`` of this process),
    with ``env_vars`` added to the job's runtime environment: the workers that run the nodes read
    them there, on a local Ray and on an existing cluster alike. Flower then finds Ray
    initialized and uses this connection, and disconnects at the end (a cluster keeps running)."""
    import sys

    import ray

    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath, **env_vars}}, **init_args)


def _check_gpu_share(gpus_per_node: float, node_device: str | None, *, local: bool) -> None:
    """A GPU share only where there is a GPU (a local Ray without one would wait forever for
    the share), and a GPU node device only with a share."""
    if not (gpus_per_node >= 0):
        raise ConfigError(f"must be >= 0, got {gpus_per_node}", field="gpus_per_node")
    if node_device not in (None, "cpu", "torch:cpu") and gpus_per_node <= 0:
        raise ConfigError(
            f"node_device {node_device!r} needs a GPU share per node (gpus_per_node > 0)", field="node_device"
        )
    if gpus_per_node > 0 and local:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"gpus_per_node {gpus_per_node} asks Ray for GPU shares, but torch sees no CUDA device on this machine",
                field="gpus_per_node",
            )


def _simulate(
    job, num_nodes: int, client_app, init_args: dict, client_resources: dict, verbose: bool, env_vars: dict
) -> FlowerResult:
    import ray
    from flwr.simulation import run_simulation

    sink: dict = {}
    backend_config = {
        "client_resources": client_resources,  # num_cpus, num_gpus per node actor
        "init_args": init_args,
    }
    from .node_identity import ENV as IDENTITY_ENV
    from .node_identity import simulation_identities

    # the nodes' signing keys (authenticated secure aggregation), for a local Ray only: a
    # temporary folder on this host
    local = "address" not in init_args and not os.environ.get("RAY_ADDRESS")
    started = False
    with warnings.catch_warnings(), simulation_identities(num_nodes, enabled=local):
        warnings.simplefilter("ignore", DeprecationWarning)
        identity = os.environ.get(IDENTITY_ENV)
        try:
            if not ray.is_initialized():
                _init_ray(init_args, {**env_vars, **({IDENTITY_ENV: identity} if identity else {})})
                started = True
            run_simulation(
                server_app=make_server_app(job, sink),
                client_app=client_app,
                num_supernodes=num_nodes,
                backend_config=backend_config,
                verbose_logging=verbose,
            )
        finally:
            if started and ray.is_initialized():  # Flower disconnects at its end; not when it failed first
                ray.shutdown()
    if "error" in sink:
        raise sink["error"]
    if "result" not in sink:
        raise FedprivError("the Flower simulation ended without a result (see the log above)")
    return sink["result"]
