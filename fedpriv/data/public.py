"""Data of a deployment where the server holds no ratings (``fedpriv deploy partition``).

A partition folder holds::

    public/meta.json              what everyone may know: the data set's source spec, the number
                                  of enrolled users, the item count and raw item ids, the rating
                                  range, the split protocol and its public seed, the topology
    public/item_features.npz|json the public item features and names (when the data set has them)
    node-<i>/ratings.npz          node i's users only: their ratings (global dense user index,
                                  dense item index), their raw user ids
    node-<i>/public/              a copy of public/ (a node shares no filesystem with anyone)

The server reads ``public/`` only (data spec ``public:DIR/public``): :func:`load_public` opens
``meta.json`` and the item features, never a ratings file. Each node makes its own train / valid
/ test split of its users' ratings (:func:`node_split`) with the public seed: the split of
:func:`fedpriv.data.splits.random_split` is keyed by the raw (user, item) ids of each rating, so a
node's parts are exactly the global split's parts restricted to its users.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from .interactions import Interactions

META = "meta.json"
RATINGS = "ratings.npz"
FORMAT = "fedpriv-partition-1"


@dataclass
class PublicData:
    """What the server of a partitioned deployment starts from: public metadata only."""

    n_users: int  # enrolled users (the deployment's registry); private algorithms release their own count
    n_items: int
    item_ids: np.ndarray
    rating_range: tuple[float, float]
    implicit: bool
    protocol: str  # "random": each node splits its users' ratings with split_seed
    split_seed: int
    source: str
    nodes: int
    users_per_node: int
    item_features: object = None  # ItemFeatures or None

    interactions = None  # no ratings, by construction


def _write_features(folder: Path, features) -> None:
    m = features.matrix.tocsr()
    np.savez(folder / "item_features.npz", indptr=m.indptr, indices=m.indices, data=m.data, shape=np.asarray(m.shape))
    (folder / "item_features.json").write_text(
        json.dumps(
            {
                "fields": {k: [v.start, v.stop] for k, v in features.fields.items()},
                "columns": list(features.columns),
                "names": features.names,
            }
        )
    )


def _read_features(folder: Path):
    if not (folder / "item_features.npz").is_file():
        return None
    import scipy.sparse as sp  # the server's encoder and AM-DPSGD nodes only

    from .features import ItemFeatures

    with np.load(folder / "item_features.npz") as z:
        matrix = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(int(x) for x in z["shape"]))
    meta = json.loads((folder / "item_features.json").read_text())
    return ItemFeatures(
        matrix=matrix,
        fields={k: slice(a, b) for k, (a, b) in meta["fields"].items()},
        columns=meta["columns"],
        names=meta["names"],
    )


def write_public(folder: str | Path, meta: dict, item_ids: np.ndarray, item_features=None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "item_ids.npy", np.asarray(item_ids), allow_pickle=False)
    if item_features is not None:
        _write_features(folder, item_features)
    (folder / META).write_text(json.dumps({"format": FORMAT, **meta}, indent=2) + "\n")
    return folder


def load_public(folder: str | Path) -> PublicData:
    """The public metadata of a partition (``DIR/public`` or a node's copy)."""
    folder = Path(folder).expanduser()
    path = folder / META
    if not path.is_file():
        raise DataError(f"{path}: no such file (a public folder written by `fedpriv deploy partition`)")
    try:
        meta = json.loads(path.read_text())
        if meta.get("format") != FORMAT:
            raise DataError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
        item_ids = np.load(folder / "item_ids.npy", allow_pickle=False)
        return PublicData(
            n_users=int(meta["n_users"]),
            n_items=int(meta["n_items"]),
            item_ids=item_ids,
            rating_range=(float(meta["rating_range"][0]), float(meta["rating_range"][1])),
            implicit=bool(meta["implicit"]),
            protocol=str(meta["protocol"]),
            split_seed=int(meta["split_seed"]),
            source=str(meta["source"]),
            nodes=int(meta["nodes"]),
            users_per_node=int(meta["users_per_node"]),
            item_features=_read_features(folder),
        )
    except (KeyError, TypeError, ValueError, OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: {type(exc).__name__}: {exc}") from None


def write_node_ratings(folder: str | Path, inter: Interactions, users: np.ndarray) -> Path:
    """Node folder: the ratings of ``users`` (a contiguous block of dense user ids) only."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    keep = np.isin(inter.users, users)
    own_ids = np.asarray(inter.user_ids)[users] if inter.user_ids is not None else users
    np.savez(
        folder / RATINGS,
        users=inter.users[keep],
        items=inter.items[keep],
        ratings=inter.ratings[keep],
        user_index=np.asarray(users, dtype=np.int64),
        user_ids=np.asarray(own_ids),
    )
    return folder


def node_interactions(folder: str | Path, public: PublicData) -> Interactions:
    """A node's ratings as :class:`Interactions` over the full id spaces (other users: no
    ratings and a blank raw id)."""
    path = Path(folder) / RATINGS
    try:
        with np.load(path, allow_pickle=False) as z:
            users, items, ratings = z["users"], z["items"], z["ratings"]
            user_index, own_ids = z["user_index"], z["user_ids"]
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(f"{path}: {type(exc).__name__}: {exc}") from None
    if own_ids.dtype.kind in "iu":
        raw = np.full(public.n_users, -1, dtype=own_ids.dtype)
    else:
        raw = np.full(public.n_users, "", dtype=own_ids.dtype)
    raw[user_index] = own_ids
    return Interactions(users, items, ratings, public.n_users, public.n_items, user_ids=raw, item_ids=public.item_ids)


def node_split(folder: str | Path, public: PublicData) -> dict[str, Interactions]:
    """The node's own train / valid / test parts (the global random split on its users)."""
    from .splits import random_split

    if public.protocol != "random":
        raise DataError(f"{folder}: protocol {public.protocol!r}: nodes split locally with the random protocol only")
    split = random_split(node_interactions(folder, public), seed=public.split_seed)
    return {"train": split.train, "valid": split.valid, "test": split.test}
