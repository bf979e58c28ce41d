"""Running a job on a running deployment: the app folder and run config, then
``flwr run APP deploy --stream``."""

from __future__ import annotations

import os
import time

from ...algorithms import registry
from ...algorithms.names import is_private
from ...errors import ConfigError
from .. import launcher
from .config import FIXED_BY_UP, DeployConfig


def run_deployed_job(
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
            raise ConfigError(
                "fixed by `fedpriv deploy up` (the nodes hold their data already); give it to `deploy up`", field=key
            )
    for key, option in (("round_timeout", "--round-timeout"), ("node_wait", "--node-wait")):
        if key in overrides:
            raise ConfigError(f"give it as {option} (a run-config key of its own)", field=key)
    for key, value in overrides.items():
        if "," in value or ";" in value:
            raise ConfigError(f"a value given to the flower engine cannot contain ',' or ';', got {value!r}", field=key)
    for name, value in (("--round-timeout", round_timeout), ("--node-wait", node_wait)):
        if not (isinstance(value, (int, float)) and value >= 0 and value == value and value != float("inf")):
            raise ConfigError(f"must be a finite number >= 0, got {value!r}", field=name)
    from ...algorithms.families import family_of

    # a family whose data the ServerApp generates (synthetic-personal) and broadcasts as a folder
    if cfg.data is None and family_of(algorithm).server_generates_data:
        if data is None:
            raise ConfigError(
                "give --data synthetic-personal:... (the deployment was started without per-node data)", field="--data"
            )
    elif cfg.data is None:
        raise ConfigError(
            "the deployment was started without per-node data: give --data to `fedpriv deploy up` "
            "(the nodes hold the ratings; the server of a deployment holds none)",
            field="--data",
        )
    elif data is not None and launcher.absolute_data_spec(data) != launcher.absolute_data_spec(cfg.data):
        raise ConfigError(
            f"the nodes hold partitions of {cfg.data!r}; run with that data (or omit --data)", field="--data"
        )
    else:  # the ServerApp starts from the partition's public metadata only: it never opens a ratings file
        data = f"public:{cfg.run_dir / 'public'}"
    from ...privacy.target import REPLACE_ONE
    from ...run import Job
    from .engine import Deployment

    # the enrolled count is public: every epsilon holds for replace-one (the ServerApp's too)
    plan = Job(
        algorithm, data, epsilon=epsilon, delta=delta, params=overrides, relation=REPLACE_ONE
    ).prepare()  # every check of `fedpriv run`, no training
    engine = Deployment(
        cfg=cfg,
        out=out,
        quiet=quiet,
        timeout=timeout,
        round_timeout=float(round_timeout),
        node_wait=float(node_wait),
        work_dir=work_dir,
    )
    outcome = plan.execute(engine)
    metrics = outcome.report.to_json()
    metrics["deploy_wall_seconds"] = time.perf_counter() - t0
    return metrics
