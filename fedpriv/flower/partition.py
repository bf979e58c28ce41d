"""Node data: the training / validation / test ratings of every user, written once as
memory-mapped per-user CSR files; each node maps its own block of users (``users-per-node``)
once per worker process. Ratings never travel in messages."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..algorithms.options import EncoderOptions, of
from ..algorithms.shards import UserShard, shard_users, user_block
from ..data.interactions import Interactions
from .node_secrets import write_raw_ids


def write_partitions(
    folder: str | Path, parts: dict[str, Interactions], meta: dict, raw_ids: np.ndarray | None = None
) -> Path:
    """Write each part as a by-user CSR (indptr, items, ratings) of .npy files plus meta.json,
    and the raw user ids (``raw_ids``, default: the parts' own) that key the users' secrets."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, inter in parts.items():
        shard = shard_users(inter)
        np.save(folder / f"{name}_indptr.npy", shard.indptr)
        np.save(folder / f"{name}_items.npy", shard.items)
        np.save(folder / f"{name}_ratings.npy", shard.ratings)
    write_raw_ids(folder, next(iter(parts.values())).user_ids if raw_ids is None else raw_ids)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def write_user_partitions(
    folder: str | Path, parts: dict[str, Interactions], meta: dict, user_range: tuple[int, int]
) -> Path:
    """:func:`write_partitions` for one node of a deployment: the same files over the whole user
    id space (so :func:`load_shard` works unchanged), but only users ``start <= u < stop`` have
    ratings; every other user's row is empty."""
    start, stop = int(user_range[0]), int(user_range[1])
    kept = {}
    for name, inter in parts.items():
        if not 0 <= start <= stop <= inter.n_users:
            raise ValueError(f"user range {start}..{stop} outside 0..{inter.n_users}")
        kept[name] = inter.subset((inter.users >= start) & (inter.users < stop))
    # the node learns the raw ids of its own users only (the others' are blanked)
    ids = np.asarray(next(iter(parts.values())).user_ids)
    own = np.zeros(len(ids), dtype=bool)
    own[start:stop] = True
    blanked = np.where(own, ids, -1) if ids.dtype.kind in "iu" else np.where(own, ids.astype(str), "")
    return write_partitions(folder, kept, meta, blanked)


def data_dir_of(node_config, broadcast_dir: str) -> str:
    """The folder a node reads its shards from: its own ``data-dir`` (node config of a
    deployment, holding only its users) or else the folder the server broadcasts. A node folder
    of ``fedpriv deploy partition`` (its users' ratings and the public metadata) is split by the
    node itself, once, into ``DATA_DIR/split``."""
    own = node_config.get("data-dir") if node_config is not None else None
    if not own:
        if not broadcast_dir:
            raise FileNotFoundError(
                "this node has no data-dir in its node config, and the server holds no ratings to broadcast"
            )
        return broadcast_dir
    return _split_node_folder(str(own)) if (Path(own) / "ratings.npz").is_file() else str(own)


@lru_cache(maxsize=8)
def _split_node_folder(folder: str) -> str:
    """``folder/split``: the node's own train / valid / test parts (:func:`fedpriv.data.public.node_split`
    with the public seed), written atomically the first time (several ClientApp processes may race)."""
    import os
    import shutil
    import tempfile

    from ..data.public import load_public, node_split

    target = Path(folder) / "split"
    if not (target / "meta.json").is_file() and not os.access(folder, os.W_OK):  # e.g. a read-only mount
        import hashlib

        tag = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]
        target = Path(tempfile.gettempdir()) / f"fedpriv-node-split-{os.getuid()}-{tag}"
    if (target / "meta.json").is_file():
        return str(target)
    public = load_public(Path(folder) / "public")
    parts = node_split(folder, public)
    tmp = Path(tempfile.mkdtemp(prefix=".split-", dir=target.parent))
    try:
        # the parts keep the node's raw user ids (its own; the others' blanked): its users' keys
        write_partitions(tmp, parts, {"n_users": public.n_users, "split_seed": public.split_seed})
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race: its split is the same
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def node_feature_table(node_config, broadcast_dir: str, cfg):
    """The encoder's public feature table on a node: built from the node's own copy of the public
    item features (``DATA_DIR/public`` of a partitioned deployment, which shares no filesystem),
    else read from the folder the server broadcasts (simulation)."""
    own = node_config.get("data-dir") if node_config is not None else None
    if own and (Path(own) / "public" / "item_features.npz").is_file():
        return _own_feature_table(str(Path(own) / "public"), str(of(cfg, EncoderOptions).features))
    return load_feature_table(broadcast_dir)


@lru_cache(maxsize=4)
def _own_feature_table(public_dir: str, fields: str):
    """The same table the server's encoder is built on (:func:`fedpriv.algorithms.ssp.feature_table`)."""
    from ..algorithms.encoder import FeatureTable, parse_fields
    from ..data.public import load_public

    public = load_public(public_dir)
    return FeatureTable.build(public.item_features, public.n_items, parse_fields(fields))


@lru_cache(maxsize=8)
def _mapped(folder: str, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    f = Path(folder)
    return (
        np.load(f / f"{name}_indptr.npy", mmap_mode="r"),
        np.load(f / f"{name}_items.npy", mmap_mode="r"),
        np.load(f / f"{name}_ratings.npy", mmap_mode="r"),
    )


def node_users(partition_id: int, users_per_node: int, n_users: int) -> np.ndarray:
    """The users of node ``partition_id`` (:func:`~fedpriv.algorithms.shards.user_block`)."""
    return user_block(partition_id, users_per_node, n_users)


@lru_cache(maxsize=64)
def load_shard(folder: str, name: str, partition_id: int, users_per_node: int) -> UserShard:
    """The shard of one node: its users' ratings of one part (cached per worker process)."""
    indptr, items, ratings = _mapped(folder, name)
    users = node_users(partition_id, users_per_node, len(indptr) - 1)
    if len(users) == 0:
        return UserShard(users, np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32))
    s, e = int(indptr[users[0]]), int(indptr[users[-1] + 1])
    return UserShard(
        user_ids=users,
        indptr=np.asarray(indptr[users[0] : users[-1] + 2]) - s,
        items=np.asarray(items[s:e], dtype=np.int32),
        ratings=np.asarray(ratings[s:e], dtype=np.float32),
    )


def write_feature_table(folder: str | Path, table) -> None:
    """The encoder's public feature tables (padded index per field), for clients that need the
    encoder (am-dpsgd). Public data: no privacy cost."""
    folder = Path(folder)
    for i, idx in enumerate(table.index):
        np.save(folder / f"features_{i}.npy", idx.numpy())
    (folder / "features.json").write_text(
        json.dumps({"names": table.names, "vocab": table.vocab, "n_items": table.n_items})
    )


@lru_cache(maxsize=4)
def load_feature_table(folder: str):
    import torch

    from ..algorithms.encoder import FeatureTable

    meta = json.loads((Path(folder) / "features.json").read_text())
    index = [torch.from_numpy(np.load(Path(folder) / f"features_{i}.npy")) for i in range(len(meta["names"]))]
    return FeatureTable(names=meta["names"], index=index, vocab=meta["vocab"], n_items=meta["n_items"])
