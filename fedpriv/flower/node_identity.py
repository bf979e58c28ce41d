"""A node's signing identity for authenticated secure aggregation
(:mod:`fedpriv.privacy.secagg_auth`), read from the node's own configuration only: never from a
message or the run config, which the server writes.

Where a node finds its identity folder (``signing_key.pem`` + ``roster.json``), first match:

1. the node-config key ``fedpriv-identity=PATH`` (a deployment's operator sets it);
2. ``identity/`` inside the node's own ``data-dir`` (where ``fedpriv deploy prepare`` writes it);
3. the environment variable ``FEDPRIV_NODE_IDENTITY=DIR``, with ``DIR/node-<partition-id>``
   (engines where fedpriv starts the nodes itself: the launcher's ``flwr run`` simulations, or
   ``flwr run .`` after ``python -m fedpriv.flower.node_identity DIR --nodes N``).

A node with none of them runs unauthenticated SecAgg+ (safe against a server that follows the
protocol only) and says so once in its log. A configured identity that cannot be read is an
error: the node refuses the secure rounds rather than silently dropping to the weaker protocol.

Roster names are ``node-<partition-id>`` for the identities fedpriv writes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from ..privacy.secagg_auth import NodeIdentity, load_identity, write_identities

log = logging.getLogger("fedpriv.flower")

CONFIG_KEY = "fedpriv-identity"
ENV = "FEDPRIV_NODE_IDENTITY"
DATA_SUBDIR = "identity"

__all__ = [
    "CONFIG_KEY",
    "DATA_SUBDIR",
    "ENV",
    "identity_folder",
    "node_identity",
    "node_name",
    "provision",
    "provision_into",
    "simulation_identities",
]


def node_name(partition_id: int) -> str:
    """The roster name fedpriv gives the node of ``partition_id``."""
    return f"node-{int(partition_id)}"


def provision_into(folders: dict[int, Path]) -> None:
    """A signing key and the common roster in each ``folders[partition id]`` (a deployment's
    node data folders: ``node-data/node-<i>/identity``)."""
    with tempfile.TemporaryDirectory(prefix="fedpriv-identity-") as tmp:
        made = provision(tmp, len(folders)) if sorted(folders) == list(range(len(folders))) else None
        if made is None:
            raise ValueError("partition ids must be 0 .. N-1")
        for i, target in folders.items():
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(made[i], target)
            os.chmod(target, 0o700)
            os.chmod(Path(target) / "signing_key.pem", 0o600)


def provision(folder: str | os.PathLike, n_nodes: int) -> dict[int, Path]:
    """Signing keys and the roster for nodes ``0 .. n_nodes-1`` under ``folder``
    (``folder/node-<i>/`` each, keys mode 0600); ``{partition id: its identity folder}``."""
    made = write_identities(folder, [node_name(i) for i in range(int(n_nodes))])
    return {i: made[node_name(i)] for i in range(int(n_nodes))}


@contextlib.contextmanager
def simulation_identities(n_nodes: int, enabled: bool = True):
    """For a simulation whose nodes this process starts (they inherit its environment): signing
    keys and a roster for ``n_nodes`` nodes in a private temporary folder named by
    ``$FEDPRIV_NODE_IDENTITY`` while the block runs, removed after it. Nothing is made when
    ``enabled`` is false or the variable is already set (the caller's identities are used)."""
    if not enabled or os.environ.get(ENV):
        yield None
        return
    folder = tempfile.mkdtemp(prefix="fedpriv-identity-")
    try:
        provision(folder, n_nodes)
        os.environ[ENV] = folder
        yield folder
    finally:
        os.environ.pop(ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def identity_folder(node_config) -> Path | None:
    """The identity folder this node's configuration names (see the module doc), or None."""
    cfg = node_config if node_config is not None else {}
    explicit = cfg.get(CONFIG_KEY)
    if explicit:
        return Path(str(explicit))
    data_dir = cfg.get("data-dir")
    if data_dir and (Path(str(data_dir)) / DATA_SUBDIR).is_dir():
        return Path(str(data_dir)) / DATA_SUBDIR
    env = os.environ.get(ENV)
    if env:
        return Path(env) / node_name(int(cfg.get("partition-id", 0)))
    return None


@lru_cache(maxsize=64)
def _load(folder: str, mtime: float) -> NodeIdentity:
    return load_identity(folder)


_warned = False


def node_identity(context) -> NodeIdentity | None:
    """This node's identity, or None when its configuration names none (logged once per process)."""
    global _warned
    folder = identity_folder(context.node_config)
    if folder is None:
        if not _warned:
            _warned = True
            log.warning(
                "node %s: no signing identity configured (node-config %s, data-dir/%s or $%s): "
                "secure aggregation runs unauthenticated, safe against a server that follows the protocol only",
                context.node_id,
                CONFIG_KEY,
                DATA_SUBDIR,
                ENV,
            )
        return None
    key = folder / "signing_key.pem"
    try:
        mtime = key.stat().st_mtime
    except OSError:
        mtime = -1.0
    return _load(str(folder), mtime)


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fedpriv.flower.node_identity",
        description="write signing keys and a roster for N nodes (DIR/node-<i>/), for FEDPRIV_NODE_IDENTITY=DIR",
    )
    p.add_argument("dir")
    p.add_argument("--nodes", type=int, required=True)
    args = p.parse_args(argv)
    if args.nodes < 1:
        p.error("--nodes: must be >= 1")
    provision(args.dir, args.nodes)
    print(f"export {ENV}={Path(args.dir).resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
