"""Per-node data: the split the ServerApp will compute, and node i's folder with only its users'
ratings."""

from __future__ import annotations

from pathlib import Path

from .config import DeployConfig


class _Captured(Exception):
    def __init__(self, job):
        self.job = job


def split_job(data: str, users_per_node: int):
    """The job the ServerApp will build for ``data`` (same :func:`fedpriv.run.run` code, same
    default split): its ``train``, ``valid``, ``test`` and ``users_per_node``."""
    from ...run import run

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
    from ...algorithms.shards import user_block
    from ..partition import write_user_partitions

    n_users = job.train.n_users
    parts = {k: v for k, v in (("train", job.train), ("valid", job.valid), ("test", job.test)) if v is not None}
    for i in range(cfg.nodes):
        block = user_block(i, job.users_per_node, n_users)
        lo, hi = (int(block[0]), int(block[-1]) + 1) if len(block) else (n_users, n_users)
        rel = cfg.node_data_dir(i).relative_to(cfg.run_dir)
        write_user_partitions((root or cfg.run_dir) / rel, parts, {"n_users": n_users, "partition_id": i, "users": [lo, hi]}, (lo, hi))
