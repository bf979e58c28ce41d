"""Preparing a run folder: certificates, node keys, per-node data, the CLI connection and
``deploy.json``, staged and moved in place."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ...errors import ConfigError
from .certs import make_certs, make_node_keys
from .commands import connection_toml
from .config import STATE_FILE, DeployConfig
from .nodedata import n_partitions, split_job, write_node_data
from .pids import running


def _portable_data(data: str | None, run_dir: Path) -> str | None:
    """The data spec with an absolute path, written relative to ``{run_dir}`` when inside it
    (so a run folder mounted elsewhere, e.g. in a container, still finds its data)."""
    if data is None:
        return None
    from ...data.spec import parse_data_spec

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
        raise ConfigError(
            f"a deployment is running in {cfg.run_dir} (PIDs {', '.join(str(e['pid']) for e in live)}): "
            "`fedpriv deploy down` first",
            field="--run-dir",
        )
    if cfg.data is not None and job is None:
        job = split_job(cfg.data, cfg.users_per_node)
    if job is not None and n_partitions(job) > cfg.nodes:
        raise ConfigError(
            f"{n_partitions(job)} partitions of {cfg.users_per_node} users need at least {n_partitions(job)} nodes, "
            f"got {cfg.nodes}",
            field="--nodes",
        )
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
            # each node's signing key and the roster, in its own data folder (the nodes read it
            # there, node-config data-dir; the server never sees node-data)
            from ...flower.node_identity import DATA_SUBDIR, provision_into

            provision_into(
                {i: stage / cfg.node_data_dir(i).relative_to(cfg.run_dir) / DATA_SUBDIR for i in range(cfg.nodes)}
            )
        (stage / "flwr-home").mkdir()
        (stage / "flwr-home" / "config.toml").write_text(connection_toml(cfg))
        state = cfg.to_dict()
        state["data"] = _portable_data(cfg.data, cfg.run_dir)
        (stage / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        for name in ("certs", "keys", "public-keys", "node-data", "node-home", "public"):
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
