"""A loaded data set written to a folder and read back exactly: the ``saved:DIR`` data kind.

A run whose data is not a built-in spec (a csv or parquet file with options, a pandas DataFrame,
a :class:`~fedpriv.data.loaders.Dataset` built in Python) is written once to the job's work
folder, so that a process that did not load it (the ServerApp of ``flwr run``) reads the very same
ratings, raw ids, catalogue and item features. No pickle: numpy arrays (``allow_pickle=False``)
and one JSON file. Raw ids keep their type (integers, or strings stored as unicode arrays), so the
public hash split gives the same parts in both processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..util import atomic
from .interactions import Interactions

FORMAT = "fedpriv-saved-dataset/1"
_META = "dataset.json"
_ARRAYS = "ratings.npz"
_FEATURES = "features.npz"


def _ids(values) -> np.ndarray | None:
    if values is None:
        return None
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    return np.asarray([str(v) for v in arr.tolist()], dtype=np.str_)


def save_dataset(dataset, folder: str | os.PathLike) -> Path:
    """Write ``dataset`` to ``folder`` (created; written in a temporary folder beside it, then
    moved in place: nothing half-written). Returns the folder."""
    inter: Interactions = dataset.interactions

    def fill(tmp: Path) -> None:
        arrays = {"users": inter.users, "items": inter.items, "ratings": inter.ratings}
        for key in ("user_ids", "item_ids"):
            ids = _ids(getattr(inter, key))
            if ids is not None:
                arrays[key] = ids
        np.savez(tmp / _ARRAYS, **arrays)
        meta = {
            "format": FORMAT,
            "n_users": int(inter.n_users),
            "n_items": int(inter.n_items),
            "name": inter.name,
            "meta": inter.meta,
            "rating_range": [float(x) for x in dataset.rating_range],
            "implicit": bool(dataset.implicit),
            "source": dataset.source,
            "duplicates_dropped": int(dataset.duplicates_dropped),
            "features": None,
        }
        feats = dataset.item_features
        if feats is not None:
            m = feats.matrix.tocsr()
            np.savez(
                tmp / _FEATURES, data=m.data, indices=m.indices, indptr=m.indptr, shape=np.asarray(m.shape, np.int64)
            )
            meta["features"] = {
                "fields": {k: [s.start, s.stop] for k, s in feats.fields.items()},
                "columns": list(feats.columns),
                "names": None if feats.names is None else [str(n) for n in feats.names],
            }
        (tmp / _META).write_text(json.dumps(meta, indent=1) + "\n")

    return atomic.write_folder(folder, fill)


def load_saved(folder: str | os.PathLike):
    """The :class:`~fedpriv.data.loaders.Dataset` that :func:`save_dataset` wrote to ``folder``."""
    import scipy.sparse as sp

    from .features import ItemFeatures
    from .loaders import Dataset

    folder = Path(folder)
    meta_path = folder / _META
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise DataError(f"no saved data set here (missing {_META})", path=str(folder)) from None
    except (OSError, ValueError) as exc:
        raise DataError(f"unreadable: {exc}", path=str(meta_path)) from None
    if meta.get("format") != FORMAT:
        raise DataError(
            f"not a fedpriv saved data set (format {meta.get('format')!r}, expected {FORMAT!r})", path=str(meta_path)
        )
    with np.load(folder / _ARRAYS, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    inter = Interactions(
        arrays["users"],
        arrays["items"],
        arrays["ratings"],
        int(meta["n_users"]),
        int(meta["n_items"]),
        user_ids=arrays.get("user_ids"),
        item_ids=arrays.get("item_ids"),
        name=meta.get("name", ""),
        meta=dict(meta.get("meta") or {}),
    )
    features = None
    if meta.get("features") is not None:
        f = meta["features"]
        with np.load(folder / _FEATURES, allow_pickle=False) as z:
            matrix = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(int(x) for x in z["shape"]))
        features = ItemFeatures(
            matrix=matrix,
            fields={k: slice(a, b) for k, (a, b) in f["fields"].items()},
            columns=list(f["columns"]),
            names=f["names"],
        )
    return Dataset(
        interactions=inter,
        item_features=features,
        rating_range=tuple(meta["rating_range"]),
        implicit=bool(meta["implicit"]),
        source=meta.get("source") or str(folder),
        duplicates_dropped=int(meta.get("duplicates_dropped", 0)),
    )
