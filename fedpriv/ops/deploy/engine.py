"""A running gRPC deployment as an engine of :mod:`fedpriv.run` (imported on use: the deploy
package stays light for the command line)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError, PrivacyError
from ...privacy.accounting import REPLACE_ONE
from ...run import FlowerOptions, Outcome, RunReport
from .. import launcher
from .commands import flwr_run_command
from .config import PIDS_FILE, DeployConfig
from .pids import running
from .processes import _env, list_runs, stop_runs, write_connection


@dataclass(frozen=True)
class Deployment(FlowerOptions):
    """A running gRPC deployment (``fedpriv deploy up``) as an engine: ``plan.execute(Deployment(cfg))``
    runs the plan with ``flwr run APP deploy --stream``; its ServerApp (a
    :class:`~fedpriv.run.FlowerGrid` over the SuperNodes) writes ``out/metrics.json`` and
    ``out/ledger.json`` (default ``RUN_DIR/out``).

    A deployment publishes its exact number of enrolled users (``public/meta.json``, and one
    node per user by default), so adding or removing a user is not hidden: the ServerApp
    calibrates and accounts every epsilon under the replace-one relation (run-config key
    ``neighbouring``), and ``metrics.json`` says so (``neighbouring_relation``)."""

    cfg: DeployConfig | None = None
    out: str | os.PathLike | None = None
    quiet: bool = False
    timeout: float | None = None

    def execute(self, plan, *, progress: bool = False, second_opinion: bool = True):
        cfg, job = self.cfg, plan.job
        n_parts = launcher.flower_partitions(plan, cfg.users_per_node)
        if n_parts > cfg.nodes:
            raise ConfigError(
                f"{n_parts} partitions of {cfg.users_per_node} users need {n_parts} nodes; "
                f"the deployment has {cfg.nodes}",
                field="--users-per-node",
            )
        if cfg.run_dir.joinpath(PIDS_FILE).is_file() and not running(cfg):
            raise ConfigError(
                f"the deployment in {cfg.run_dir} is not running: `fedpriv deploy up` first", field="--run-dir"
            )
        out_dir = Path(self.out).expanduser().resolve() if self.out is not None else cfg.out_dir
        run_config = launcher.job_run_config(
            job,
            launcher.absolute_data_spec(job.data if isinstance(job.data, str) else str(plan.spec)),
            users_per_node=cfg.users_per_node,
            nodes=cfg.nodes,
            round_timeout=self.round_timeout or 0.0,
            node_wait=self.node_wait if self.node_wait is not None else 120.0,
            server_device=self.device,
        )
        run_config["out"] = str(out_dir)
        run_config["work-dir"] = str(Path(self.work_dir).expanduser().resolve()) if self.work_dir else ""
        run_config["neighbouring"] = REPLACE_ONE  # the enrolled count is public: the target holds for replace-one
        _app(cfg)
        write_connection(cfg)
        launcher.write_run_config(cfg.run_config_file, run_config)
        before = _stamp(out_dir)
        earlier = {r.get("run-id") for r in list_runs(cfg)}
        try:
            code, tail = launcher.run_streaming(
                flwr_run_command(cfg),
                cwd=cfg.run_dir,
                env=_env(cfg, cfg.flwr_home),
                quiet=self.quiet,
                timeout=self.timeout,
            )
        except BaseException:  # timeout or interrupt: `flwr run` is stopped, stop the run on the SuperLink too
            stop_runs(cfg, exclude=earlier)
            raise
        if code != 0:
            stop_runs(cfg, exclude=earlier)
        metrics_path, ledger_path = out_dir / "metrics.json", out_dir / "ledger.json"
        if code != 0 or _stamp(out_dir) == before or not ledger_path.is_file():
            launcher.raise_run_failure(code, tail, "the run wrote no new metrics.json")
        metrics = json.loads(metrics_path.read_text())
        if metrics.get("private") and metrics.get("neighbouring_relation") != REPLACE_ONE:
            raise PrivacyError(
                "the ServerApp accounted this deployment's epsilon under "
                f"{metrics.get('neighbouring_relation', 'add_remove')!r}, not replace-one "
                f"(its enrolled count is public): {metrics_path} does not hold"
            )
        return Outcome(
            RunReport.from_metrics(metrics), json.loads(ledger_path.read_text()), None, None, None, plan.dataset
        )


def _app(cfg: DeployConfig) -> None:
    """The app folder (launcher's writer), with every run-config key the ServerApp reads."""
    import tomllib

    shutil.rmtree(cfg.app_dir, ignore_errors=True)
    launcher.write_app_folder(cfg.app_dir)
    pyproject = cfg.app_dir / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]
    extra = {"round-timeout": 0.0, "node-wait": 120.0, "work-dir": "", "neighbouring": "add_remove"}
    missing = {k: v for k, v in extra.items() if k not in declared}
    if missing:  # [tool.flwr.app.config] is the file's last table
        with open(pyproject, "a") as f:
            f.write("".join(f"{k} = {launcher.toml_value(v)}\n" for k, v in missing.items()))
        assert set(missing) <= set(tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"])


def _stamp(out_dir: Path):
    try:
        st = (out_dir / "metrics.json").stat()
        return (st.st_mtime_ns, st.st_ino)
    except OSError:
        return None
