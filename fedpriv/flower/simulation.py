"""Run a job on Flower's simulation runtime (Ray), in this process: the ServerApp runs here and
every node runs the fedpriv ClientApp. The offline and quiet settings are set here, so users do
not have to know them."""

from __future__ import annotations

import os
import warnings

from ..errors import FedprivError
from .server_app import FlowerJob, FlowerResult, make_server_app

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}


def set_offline_env() -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def simulate(job: FlowerJob, num_nodes: int, *, cpus_per_node: float = 1.0, verbose: bool = False, client_app=None) -> FlowerResult:
    """Run ``job`` on ``num_nodes`` simulated nodes (default ClientApp: fedpriv's)."""
    set_offline_env()
    from flwr.simulation import run_simulation

    if client_app is None:
        from .client_app import app as client_app

    sink: dict = {}
    backend_config = {
        "client_resources": {"num_cpus": cpus_per_node, "num_gpus": 0.0},
        "init_args": {"logging_level": "ERROR", "log_to_driver": verbose, "include_dashboard": False},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        run_simulation(
            server_app=make_server_app(job, sink),
            client_app=client_app,
            num_supernodes=num_nodes,
            backend_config=backend_config,
            verbose_logging=verbose,
        )
    if "error" in sink:
        raise sink["error"]
    if "result" not in sink:
        raise FedprivError("the Flower simulation ended without a result (see the log above)")
    return sink["result"]
