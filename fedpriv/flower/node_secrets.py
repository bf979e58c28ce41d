"""A node's secret randomness (:mod:`fedpriv.privacy.randomness`) on Flower.

Each node draws a 256-bit key from ``os.urandom`` the first time it needs one in a run and keeps
it in its own ``context.state`` (node state, kept by the SuperNode across the run's messages; it
never travels). Its users' keys are PRFs of their raw ids under that key.

Reproducible-noise runs (an explicit noise seed) instead broadcast the *path* of a key file the
server wrote (mode 0600) with the clients' key derived from the seed, so that the nodes make the
same choices as the in-process engine. The key itself never travels in a message; whoever can
read that file can reproduce the users' choices, which is what a reproducible run gives up. A
node reads such a file only where its own policy enables it (``policy-reproducible``): a server
must not make a node's noise reproducible by naming a file whose bytes it knows.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context

from ..util import atomic
from ..algorithms.shards import UserShard
from ..privacy.randomness import new_client_key, user_keys

STATE_KEY = "fedpriv-secrets"
KEY_FILE_FIELD = "client_key_file"
RAW_IDS_FILE = "user_ids.npy"


def write_key_file(folder: str | Path, key: bytes) -> str:
    """The clients' key of a reproducible run, readable by its owner only."""
    return str(atomic.write_bytes(Path(folder) / "clients.key", key, mode=0o600))


def node_key(cfg_record, context: Context) -> tuple[bytes, bool]:
    """(the node's client key, reproducible?). A key file named in the message is read only where
    the node's own policy enables reproducible noise (:mod:`fedpriv.flower.node_policy`);
    otherwise the message is refused (logged): the server may know the file's bytes."""
    from .node_policy import check_key_file

    path = cfg_record.get(KEY_FILE_FIELD) if cfg_record is not None else None
    if path:
        check_key_file(context, str(path))
        return Path(str(path)).read_bytes(), True
    rec = context.state.config_records.get(STATE_KEY)
    if rec is None or "client_key" not in rec:
        rec = ConfigRecord({"client_key": new_client_key()})
        context.state[STATE_KEY] = rec
    return bytes(rec["client_key"]), False


def raw_user_ids(data_dir: str, users: np.ndarray) -> np.ndarray:
    """The raw ids of the given dense users (``user_ids.npy`` of the node's data folder)."""
    path = Path(data_dir) / RAW_IDS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: the node's data folder has no raw user ids (write it with fedpriv.flower.partition)"
        )
    return np.load(path, mmap_mode="r", allow_pickle=False)[np.asarray(users)]


def write_raw_ids(folder: str | Path, ids: np.ndarray) -> None:
    """The raw user id of every dense user id (numbers, or text for other raw ids)."""
    ids = np.asarray(ids)
    if ids.dtype == object:
        ids = ids.astype(str)
    np.save(Path(folder) / RAW_IDS_FILE, ids, allow_pickle=False)


def with_keys(shard: UserShard, data_dir: str, cfg_record, context: Context) -> tuple[UserShard, bool]:
    """The shard with its users' secret keys; and whether they are reproducible."""
    key, reproducible = node_key(cfg_record, context)
    keys = user_keys(key, raw_user_ids(data_dir, shard.user_ids))
    return replace(shard, user_keys=keys), reproducible
