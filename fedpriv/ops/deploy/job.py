"""Running a job on a running deployment: the app folder and run config, then
``flwr run APP deploy --stream``."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ...algorithms import registry
from ...algorithms.names import is_private
from ...errors import ConfigError, FedprivError
from .. import launcher
from .commands import flwr_run_command
from .config import FIXED_BY_UP, PIDS_FILE, DeployConfig
from .pids import running
from .processes import _env, list_runs, stop_runs, write_connection


def _app(cfg: DeployConfig) -> None:
    """The app folder (launcher's writer), with every run-config key the ServerApp reads."""
    import tomllib

    shutil.rmtree(cfg.app_dir, ignore_errors=True)
    launcher.write_app_folder(cfg.app_dir)
    pyproject = cfg.app_dir / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]
    extra = {"round-timeout": 0.0, "node-wait": 120.0, "work-dir": ""}
    missing = {k: v for k, v in extra.items() if k not in declared}
    if missing:  # [tool.flwr.app.config] is the file's last table
        with open(pyproject, "a") as f:
            f.write("".join(f"{k} = {launcher.toml_value(v)}\n" for k, v in missing.items()))
        assert set(missing) <= set(tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"])


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
    from ...algorithms.pam import PAM_ALGORITHMS

    if cfg.data is None and algorithm in PAM_ALGORITHMS:  # synthetic-personal data: the ServerApp generates it and broadcasts its folder
        if data is None:
            raise ConfigError("give --data synthetic-personal:... (the deployment was started without per-node data)", field="--data")
    elif cfg.data is None:
        raise ConfigError("the deployment was started without per-node data: give --data to `fedpriv deploy up` "
                          "(the nodes hold the ratings; the server of a deployment holds none)", field="--data")
    elif data is not None and launcher.absolute_data_spec(data) != launcher.absolute_data_spec(cfg.data):
        raise ConfigError(f"the nodes hold partitions of {cfg.data!r}; run with that data (or omit --data)", field="--data")
    else:  # the ServerApp starts from the partition's public metadata only: it never opens a ratings file
        data = f"public:{cfg.run_dir / 'public'}"
    from ...run import Job

    plan = Job(algorithm, data, epsilon=epsilon, delta=delta, params=overrides).prepare()  # every check of `fedpriv run`, no training
    n_parts = launcher.flower_partitions(plan, cfg.users_per_node)
    if n_parts > cfg.nodes:
        raise ConfigError(f"{n_parts} partitions of {cfg.users_per_node} users need {n_parts} nodes; the deployment has {cfg.nodes}", field="--users-per-node")
    if cfg.run_dir.joinpath(PIDS_FILE).is_file() and not running(cfg):
        raise ConfigError(f"the deployment in {cfg.run_dir} is not running: `fedpriv deploy up` first", field="--run-dir")
    out_dir = Path(out).expanduser().resolve() if out is not None else cfg.out_dir
    run_config = {
        "algorithm": algorithm,
        "data": launcher.absolute_data_spec(data),
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
    launcher.write_run_config(cfg.run_config_file, run_config)
    before = _stamp(out_dir)
    earlier = {r.get("run-id") for r in list_runs(cfg)}
    try:
        code, tail = launcher.run_streaming(flwr_run_command(cfg), cwd=cfg.run_dir, env=_env(cfg, cfg.flwr_home), quiet=quiet, timeout=timeout)
    except BaseException:  # timeout or interrupt: `flwr run` is stopped, stop the run on the SuperLink too
        stop_runs(cfg, exclude=earlier)
        raise
    if code != 0:
        stop_runs(cfg, exclude=earlier)
    metrics_path, ledger_path = out_dir / "metrics.json", out_dir / "ledger.json"
    if code != 0 or _stamp(out_dir) == before or not ledger_path.is_file():
        reasons = [m.group(1) for line in tail if (m := launcher.ERROR_LINE.search(line))]
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
