"""Saved models: what a run released, written in an open format, and recommendations from it.

A model folder holds three files, written together or not at all (a temporary folder renamed
into place):

- ``model.npz``: numpy arrays: ``item_factors`` (n_items, d), ``item_bias`` (n_items,) when the
  model has item biases, ``item_ids`` (the raw item ids, when they are numbers), and
  ``encoder_params`` (the AM-SSP family's released item encoder, flattened) when there is one;
- ``model.json``: the algorithm, its config, the rating range, implicit or not, the released
  mean, the released number of users (0 when none was released), the number of items, the raw
  item ids (when they are strings), the item display names, epsilon and delta spent, the format
  version, and ``info``: the algorithm, the data set's public label (its kind: ``ml-100k``,
  ``csv``, ``synthetic-mf``, ...), the engine and the target epsilon;
- ``ledger.json``: the releases that produced it (the accountant's input).

Everything in it is released: noised statistics and their post-processing (item embeddings and
biases solved from noised sums, the released mean), public metadata (item ids and names) and
public choices (the config). Nothing about any user is saved, and nothing computed on private
data that was not released: no test or validation metric (those are measured on held-out
private ratings; they stay in the run's ``metrics.json``), no local path (the data spec's path
or parameters). A user's vector is solved on their own device from their own ratings, by the
same function the Flower ClientApp uses for its private recommendations
(:func:`fedpriv.algorithms.recommend.client_scores`), and spends no privacy budget.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import numpy as np

from ..algorithms import als
from ..algorithms.config import ALSConfig
from ..algorithms.shards import UserShard
from ..errors import ConfigError, DataError, FedprivError, FedprivWarning
from ..util import atomic

FORMAT = "fedpriv-model/1"
FILES = ("model.npz", "model.json", "ledger.json")
#: The keys of ``model.json``'s ``info``: public configuration only (older models also held a
#: test metric and the data spec with its path; loading drops them).
INFO_KEYS = ("algorithm", "dataset", "engine", "epsilon")


def public_data_label(spec_text) -> str | None:
    """The public label of a data spec: its kind (``ml-100k``, ``csv``, ``synthetic-mf``,
    ``dataframe``, ...), never its path nor its parameters; None for an unknown kind."""
    from ..data.spec import FILE_KINDS, PUBLIC_KIND, SYNTHETIC_KINDS, TABULAR_KINDS

    kind = str(spec_text).partition(":")[0]
    return (
        kind if kind in (*FILE_KINDS, *SYNTHETIC_KINDS, *TABULAR_KINDS, PUBLIC_KIND, "dataframe", "dataset") else None
    )


def public_info(info) -> dict:
    """``info`` cut down to :data:`INFO_KEYS`, the data set reduced to its public label."""
    info = info if isinstance(info, dict) else {}
    out = {k: info[k] for k in INFO_KEYS if k in info}
    if "dataset" in out:
        out["dataset"] = public_data_label(out["dataset"])
    return out


@dataclass
class Model:
    """A released model: the public state of a finished run plus its public item metadata."""

    state: als.PublicState
    item_ids: np.ndarray  # raw item id of every dense item id
    item_names: list[str] | None = None
    ledger: list[dict] = field(default_factory=list)
    epsilon_spent: float | None = None
    delta: float | None = None
    info: dict = field(default_factory=dict)  # algorithm, data set label, engine, target epsilon (public)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_run(
        cls, state: als.PublicState, train, ledger: list[dict], metrics: dict, item_names: list[str] | None = None
    ) -> Model:
        """The model of a finished run (``train``: its training interactions, for the item ids)."""
        if state.item_factors is None:
            raise ConfigError(f"{state.algorithm} released no item embeddings to save", field="--save-model")
        info = public_info(metrics)  # no metric: they are measured on held-out private ratings
        return cls(
            state=state,
            item_ids=np.asarray(train.item_ids),
            item_names=item_names,
            ledger=list(ledger),
            epsilon_spent=metrics.get("epsilon_spent"),
            delta=metrics.get("delta"),
            info=info,
        )

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the model folder ``path`` (an existing model folder there is replaced only with
        ``overwrite``; a folder holding anything else is refused). All files appear at once or
        not at all."""
        path = Path(path)
        check_model_folder(path, overwrite=overwrite)

        def fill(tmp: Path) -> None:
            arrays: dict[str, Any] = {"item_factors": np.asarray(self.state.item_factors, dtype=np.float32)}
            if self.state.item_bias is not None:
                arrays["item_bias"] = np.asarray(self.state.item_bias, dtype=np.float64)
            if self.state.encoder_release is not None:
                arrays["encoder_params"] = np.asarray(self.state.encoder_release, dtype=np.float32)
            for name in ("counts_hat", "item_support"):  # the released popularity the ranking reads
                value = getattr(self.state, name)
                if value is not None:
                    arrays[name] = np.asarray(value, dtype=np.float64)
            if self.state.item_item is not None:  # topk / ease: the item-item model of the head items
                arrays["item_item"] = np.asarray(self.state.item_item, dtype=np.float32)
            numeric_ids = np.issubdtype(self.item_ids.dtype, np.number)
            if numeric_ids:
                arrays["item_ids"] = self.item_ids
            np.savez(tmp / "model.npz", **arrays)
            meta = {
                "format": FORMAT,
                "algorithm": self.state.algorithm,
                "config": self.state.config.to_dict(),
                "n_items": int(self.state.n_items),
                # private runs: the released (noised) count, or 0; a non-private run releases none
                "n_users_released": int(self.state.n_users) if self.state.private else 0,
                "rating_range": [float(x) for x in self.state.rating_range],
                "implicit": bool(self.state.implicit),
                "mean": float(self.state.mean),
                "item_ids": None if numeric_ids else [str(x) for x in self.item_ids],
                "item_names": self.item_names,
                "epsilon_spent": self.epsilon_spent,
                "delta": self.delta,
                "info": public_info(self.info),
            }
            (tmp / "model.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            (tmp / "ledger.json").write_text(json.dumps(self.ledger, indent=2) + "\n", encoding="utf-8")

        return atomic.write_folder(path, fill)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Model:
        """Read a model folder written by :meth:`save` (clear errors naming the file)."""
        path = Path(path)
        meta, ledger, arrays = _read_folder(path)
        state = _public_state(meta, arrays, path)
        ids = arrays["item_ids"] if "item_ids" in arrays else np.asarray(meta.get("item_ids") or [], dtype=object)
        if len(ids) != state.n_items:
            raise DataError(f"expected {state.n_items} item ids, got {len(ids)}", path=str(path / "model.json"))
        names = meta.get("item_names")
        return cls(
            state=state,
            item_ids=ids,
            item_names=names,
            ledger=ledger,
            epsilon_spent=meta.get("epsilon_spent"),
            delta=meta.get("delta"),
            info=public_info(meta.get("info")),
        )

    # ------------------------------------------------------------------ recommendations
    def dense_items(self, raw_items) -> np.ndarray:
        """Dense ids of raw item ids; an id the model does not know is an error naming it."""
        raw = np.asarray(raw_items).reshape(-1)
        dense, hit = self._lookup(raw)
        if not hit.all():
            raise DataError(f"{_unknown_text(raw[~hit])} not in the model's catalogue ({self._catalogue_hint()})")
        return dense

    def _lookup(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The dense ids of the known raw item ids (in order) and, for every raw id, whether the
        model knows it. A model whose ids are numbers knows no id that is not one (``"item3"``)."""
        ids = self.item_ids
        if raw.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        if np.issubdtype(ids.dtype, np.number):
            integer = np.issubdtype(ids.dtype, np.integer)
            bounds = np.iinfo(ids.dtype) if integer else None
            values = [
                v if v is None or bounds is None or bounds.min <= v <= bounds.max else None
                for v in (_as_number(x, integer) for x in raw.tolist())
            ]
            known = np.array([v is not None for v in values], dtype=bool)
            vals = np.asarray([0 if v is None else v for v in values], dtype=ids.dtype)
            order = np.argsort(ids, kind="stable")
            pos = np.minimum(np.searchsorted(ids, vals, sorter=order), len(ids) - 1)
            dense = order[pos]
            hit = known & (ids[dense] == vals)
        else:
            index = {str(x): i for i, x in enumerate(ids)}
            dense = np.array([index.get(str(x), -1) for x in raw.tolist()], dtype=np.int64)
            hit = dense >= 0
        return dense[hit].astype(np.int64), hit

    def _catalogue_hint(self) -> str:
        """A few of the model's item ids, for error messages."""
        ids = self.item_ids
        kind = "numbers" if np.issubdtype(ids.dtype, np.number) else "strings"
        shown = ", ".join(repr(_plain(x)) for x in ids[:3])
        return f"{len(ids):,} items whose ids are {kind}: {shown}, ..."

    def _user(self, items, ratings) -> tuple[UserShard, np.ndarray]:
        """One user's shard from their raw item ids and ratings (checked), and the dense ids.

        What the model cannot use is never dropped silently: ratings of items the model does
        not know are an error naming them when none of the items is known, and are left out
        with a :class:`~fedpriv.errors.FedprivWarning` naming them when some are known; no
        items at all warns that the ranking is the released popularity alone (a new user)."""
        raw = np.asarray(items).reshape(-1) if items is not None else np.zeros(0)
        if ratings is None:
            y = np.ones(raw.size, dtype=np.float32)
        else:
            y = np.asarray(ratings, dtype=np.float32).reshape(-1)
            if y.shape != raw.shape:
                raise DataError(f"expected one rating per item ({raw.size}), got {y.size}")
            lo, hi = self.state.rating_range
            if not np.isfinite(y).all() or (y < lo).any() or (y > hi).any():
                raise DataError(f"ratings must be finite and lie in the model's range [{lo:g}, {hi:g}]")
        dense, hit = self._lookup(raw)
        if not hit.all():
            if not hit.any():
                raise DataError(
                    f"{_unknown_text(raw)} not in the model's catalogue: none of the user's {raw.size:,} "
                    f"item ids is known ({self._catalogue_hint()})"
                )
            y = y[hit]
            warnings.warn(
                f"{_unknown_text(raw[~hit])} not in the model's catalogue: left out; the user's vector is solved from "
                f"the other {len(dense):,} of their {raw.size:,} ratings",
                FedprivWarning,
                stacklevel=3,
            )
        elif raw.size == 0:
            warnings.warn(
                "no ratings given: the ranking is the released popularity alone (the same for every new user)",
                FedprivWarning,
                stacklevel=3,
            )
        if len(np.unique(dense)) != len(dense):
            raise DataError("an item is rated twice")
        shard = UserShard(
            user_ids=np.zeros(1, np.int64),
            indptr=np.array([0, len(dense)], np.int64),
            items=dense.astype(np.int32),
            ratings=y,
        )
        return shard, dense

    def recommend(
        self,
        items,
        ratings=None,
        k: int = 10,
        *,
        exclude_seen: bool = True,
        as_frame: bool = False,
        blend: float | None = None,
    ):
        """The top ``k`` items for one user from their own ratings: ``items`` (raw ids) and
        ``ratings`` (same length; None for implicit feedback: all 1). The user's vector is
        solved locally (no privacy cost). Ranked by the released popularity plus ``blend``
        (default :func:`fedpriv.algorithms.ranking.blend_for` the model's epsilon) times the predicted rating,
        both standardized (:func:`fedpriv.algorithms.ranking.ranking_scores`); ``score`` is
        that ranking score and ``rating`` the predicted rating, clipped to the rating range.
        Returns [{item, score, rating, name}] best first, or with ``as_frame`` a pandas
        DataFrame with the columns rank, item, score, rating, name. A top-k model
        (:attr:`predicts_ratings` False: topk, popular, ease, ...) ranks items only: its rows
        have no ``rating``.

        Items the model does not know: when none of ``items`` is in the catalogue, a
        :class:`~fedpriv.errors.DataError` names them (a user or id mix-up, e.g. the ids of
        another data set); when some are, they are left out with a
        :class:`~fedpriv.errors.FedprivWarning` naming them. With no items at all the ranking is
        the released popularity alone (a new user), with a warning that says so."""
        from ..algorithms import ranking
        from ..algorithms.recommend import client_scores

        if k < 1:
            raise ConfigError(f"must be >= 1, got {k}", field="k")
        shard, dense = self._user(items, ratings)
        everything = np.arange(self.state.n_items)
        if blend is None:
            private = self.state.private
            blend = ranking.blend_for(
                self.info.get("epsilon") if private else None, self.delta, self.state.n_items, self.state.n_users
            )
        scores = ranking.ranking_scores(shard, self.state, everything, float(blend))[0].astype(np.float64)
        rated = self.predicts_ratings
        rating = client_scores(shard, self.state, everything)[0] if rated else None
        if exclude_seen:
            scores[dense] = -np.inf
        k = min(k, int(np.isfinite(scores).sum()))
        top = np.argsort(-scores, kind="stable")[:k]
        rows = [
            {
                "item": _plain(self.item_ids[i]),
                "score": float(scores[i]),
                **({"rating": float(rating[i])} if rating is not None else {}),
                "name": self.item_names[i] if self.item_names else None,
            }
            for i in top
        ]
        if not as_frame:
            return rows
        import pandas as pd

        columns = ["rank", "item", "score", *(["rating"] if rated else []), "name"]
        return pd.DataFrame([{"rank": r, **row} for r, row in enumerate(rows, 1)], columns=columns)

    @property
    def predicts_ratings(self) -> bool:
        """The model predicts ratings (False for a top-k model, which ranks items only: its task
        in the algorithm registry, :data:`fedpriv.algorithms.registry.TASKS`)."""
        from ..algorithms import registry

        try:
            return registry.predicts_ratings(self.state.algorithm)
        except FedprivError:  # an algorithm this installation does not register: as the family does
            return True

    def predict(self, items, ratings=None, targets=None) -> np.ndarray:
        """Predicted ratings of one user for the raw item ids ``targets`` (default: every item),
        from their own ``items`` and ``ratings`` (solved locally), clipped to the rating range.
        A target the model does not know is a :class:`~fedpriv.errors.DataError` naming it;
        ``items`` are checked as in :meth:`recommend`. A top-k model refuses (a ConfigError):
        it ranks items, it predicts no ratings."""
        from ..algorithms.recommend import client_scores

        if not self.predicts_ratings:
            algorithm = self.state.algorithm
            raise ConfigError(f"{algorithm} ranks items; it predicts no ratings: use recommend")
        shard, _ = self._user(items, ratings)
        wanted = np.arange(self.state.n_items) if targets is None else self.dense_items(targets)
        return client_scores(shard, self.state, wanted)[0]

    def similar_items(self, item, k: int = 10) -> list[dict]:
        """The ``k`` items whose released embeddings are closest in cosine similarity to
        ``item``'s (post-processing of the release); [{item, similarity, name}]. A model
        without factors (the bias model, popular) has no embeddings to compare."""
        if k < 1:
            raise ConfigError(f"must be >= 1, got {k}", field="k")
        V = np.asarray(self.state.item_factors, dtype=np.float64)
        if V.shape[1] == 0 or not np.any(V):
            raise ConfigError(
                f"{self.state.algorithm} released no item embeddings (rank {V.shape[1]}): nothing to compare",
                field="item",
            )
        i = int(self.dense_items([item])[0])
        norms = np.linalg.norm(V, axis=1)
        sims = (V @ V[i]) / np.maximum(norms * norms[i], 1e-12)
        sims[i] = -np.inf
        top = np.argsort(-sims, kind="stable")[: min(k, self.state.n_items - 1)]
        return [
            {
                "item": _plain(self.item_ids[j]),
                "similarity": float(sims[j]),
                "name": self.item_names[j] if self.item_names else None,
            }
            for j in top
        ]

    def __repr__(self) -> str:
        eps = f"epsilon {self.epsilon_spent:.3g}" if isinstance(self.epsilon_spent, (int, float)) else "non-private"
        d = np.asarray(self.state.item_factors).shape[1]
        return f"Model({self.state.algorithm}, {self.state.n_items:,} items, rank {d}, {eps})"


def check_model_folder(path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Refuse a model destination that holds anything but a model, or an earlier model unless
    ``overwrite`` (before any training)."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(p.name not in FILES for p in path.iterdir())):
        raise ConfigError(f"{path} exists and is not a fedpriv model folder; choose a new folder", field="--save-model")
    if not overwrite and path.is_dir() and any(path.iterdir()):
        raise ConfigError(
            f"{path} holds an earlier model; give --overwrite (overwrite=True) to replace it, or choose a new folder",
            field="--save-model",
        )


def read_user_ratings(path: str | os.PathLike, *, implicit: bool = False) -> tuple[list, list[float] | None]:
    """One user's ratings from a CSV file with a header: columns ``item`` and ``rating``
    (``item`` alone for implicit feedback). Errors name the file and line."""
    import csv

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DataError(f"cannot read the file: {exc.strerror or exc}", path=str(path)) from None
    except UnicodeDecodeError:
        raise DataError("not UTF-8 text", path=str(path)) from None
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise DataError("empty file (expected a header: item,rating)", path=str(path))
    header = [h.strip() for h in rows[0]]
    if "item" not in header:
        raise DataError(f"no 'item' column in the header {header}", path=str(path), line=1)
    if not implicit and "rating" not in header:
        raise DataError(
            f"no 'rating' column in the header {header} (this model is for explicit ratings)", path=str(path), line=1
        )
    ci, cr = header.index("item"), (header.index("rating") if "rating" in header else None)
    items, ratings = [], []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataError(f"expected {len(header)} fields, got {len(row)}", path=str(path), line=line)
        item = row[ci].strip()
        if not item:
            raise DataError("empty item id", path=str(path), line=line)
        items.append(item)
        if cr is not None and not implicit:
            try:
                ratings.append(float(row[cr]))
            except ValueError:
                raise DataError(f"rating {row[cr]!r} is not a number", path=str(path), line=line) from None
    if not items:
        raise DataError("no ratings (the file has no data rows)", path=str(path))
    return items, (None if implicit else ratings)


def _plain(x):
    """A raw id as a JSON-friendly Python value."""
    return x.item() if isinstance(x, np.generic) else x


def _as_number(x, integer: bool):
    """A raw id as the number a model with numeric ids would hold (``"50"`` -> 50), or None when
    it is not one (``"item3"``, ``2.5`` for integer ids)."""
    x = _plain(x)
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, str):
        try:
            return int(x.strip())
        except ValueError:
            pass
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    if not np.isfinite(v):
        return None
    if integer:
        return int(v) if v.is_integer() else None
    return v


def _unknown_text(raw, shown: int = 5) -> str:
    """``item 'x' is`` / ``items 'x', 'y' (and 3 more) are``: the ids a model does not know."""
    ids = [_plain(x) for x in np.asarray(raw).reshape(-1).tolist()]
    if len(ids) == 1:
        return f"item {ids[0]!r} is"
    more = f" (and {len(ids) - shown:,} more)" if len(ids) > shown else ""
    return f"items {', '.join(repr(x) for x in ids[:shown])}{more} are"


PERSONAL_FORMAT = "fedpriv-personal-model/1"


@dataclass
class PersonalModel:
    """The released model of DP model personalization (:mod:`fedpriv.algorithms.pam`): the
    shared d x k embedding U (pam, pam-exp, pam-nonprivate) or the single global regression
    vector theta (pam-single-model), with its config, ledger and spent epsilon. A user's
    personal vector is solved on their own device from their own samples
    (:meth:`personalize`) and spends no budget. The folder holds ``model.npz`` (``U`` or
    ``theta``), ``model.json`` and ``ledger.json``, written together or not at all."""

    algorithm: str
    config: dict
    d: int
    k: int
    U: np.ndarray | None = None
    theta: np.ndarray | None = None
    ledger: list[dict] = field(default_factory=list)
    epsilon_spent: float | None = None
    delta: float | None = None
    info: dict = field(default_factory=dict)

    @classmethod
    def from_run(cls, state, ledger: list[dict], metrics: dict) -> PersonalModel:
        if state.U is None and state.theta is None:
            raise ConfigError(
                f"{state.algorithm} releases no shared model (each user learns alone)", field="--save-model"
            )
        return cls(
            state.algorithm,
            state.config.to_dict(),
            int(state.d),
            int(state.k),
            state.U,
            state.theta,
            list(ledger),
            metrics.get("epsilon_spent"),
            metrics.get("delta"),
            public_info(metrics),
        )

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        path = Path(path)
        check_model_folder(path, overwrite=overwrite)

        def fill(tmp: Path) -> None:
            arrays: dict[str, Any] = {
                name: np.asarray(v, dtype=np.float64)
                for name, v in (("U", self.U), ("theta", self.theta))
                if v is not None
            }
            np.savez(tmp / "model.npz", **arrays)
            meta = {
                "format": PERSONAL_FORMAT,
                "algorithm": self.algorithm,
                "config": self.config,
                "d": self.d,
                "k": self.k,
                "epsilon_spent": self.epsilon_spent,
                "delta": self.delta,
                "info": public_info(self.info),
            }
            (tmp / "model.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            (tmp / "ledger.json").write_text(json.dumps(self.ledger, indent=2) + "\n", encoding="utf-8")

        return atomic.write_folder(path, fill)

    @classmethod
    def from_files(cls, path: Path, meta: dict, ledger: list, arrays: dict) -> PersonalModel:
        try:
            d, k = int(meta["d"]), int(meta["k"])
            model = cls(
                str(meta["algorithm"]),
                dict(meta["config"]),
                d,
                k,
                arrays.get("U"),
                arrays.get("theta"),
                ledger,
                meta.get("epsilon_spent"),
                meta.get("delta"),
                public_info(meta.get("info")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"bad or missing field: {exc}", path=str(path / "model.json")) from None
        ok_u = model.U is not None and model.U.shape == (d, k) and np.isfinite(model.U).all()
        ok_theta = model.theta is not None and model.theta.shape == (d,) and np.isfinite(model.theta).all()
        if not (ok_u or ok_theta):
            raise DataError(f"expected a finite U ({d}, {k}) or theta ({d},) array", path=str(path / "model.npz"))
        return model

    def _samples(self, X, y=None) -> tuple[np.ndarray, np.ndarray | None]:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.d or not np.isfinite(X).all():
            raise DataError(f"expected a finite (samples, {self.d}) feature array, got shape {X.shape}")
        if y is None:
            return X, None
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if y.shape != (len(X),) or not np.isfinite(y).all():
            raise DataError(f"expected {len(X)} finite labels, got shape {y.shape}")
        return X, y

    def __repr__(self) -> str:
        eps = f"epsilon {self.epsilon_spent:.3g}" if isinstance(self.epsilon_spent, (int, float)) else "non-private"
        shared = f"U {self.d}x{self.k}" if self.U is not None else f"theta ({self.d},)"
        return f"PersonalModel({self.algorithm}, {shared}, {eps})"

    def personalize(self, X, y) -> np.ndarray | None:
        """One user's personal vector v (k,) solved from their own samples X (m, d) and labels
        y (m,), locally; None for the single model (it has no personal part)."""
        if self.U is None:
            return None
        from ..algorithms.pam import client_personal_vectors

        X, y = self._samples(X, y)
        ridge = float(self.config.get("user_ridge", 1e-3))
        return client_personal_vectors(X[None], y[None], self.U, ridge)[0]

    def predict(self, X, v=None) -> np.ndarray:
        """Predictions x U v for samples X (m, d) (x theta for the single model)."""
        X, _ = self._samples(X)
        if self.U is None:
            return X @ self.theta
        if v is None:
            raise ConfigError("give the user's personal vector (from personalize)", field="v")
        return X @ self.U @ np.asarray(v, dtype=np.float64)


def _read_folder(path: Path) -> tuple[dict, list, dict]:
    """(model.json, ledger.json, the arrays of model.npz) of a model folder (DataError naming the file)."""
    for name in FILES:
        if not (path / name).is_file():
            raise DataError(f"not a fedpriv model folder: {name} is missing", path=str(path))
    try:
        meta = json.loads((path / "model.json").read_text(encoding="utf-8"))
        ledger = json.loads((path / "ledger.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"not valid JSON: {exc}", path=str(path / "model.json")) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(
            f"unknown model format {meta.get('format') if isinstance(meta, dict) else None!r} (expected {FORMAT})",
            path=str(path / "model.json"),
        )
    try:
        with np.load(path / "model.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read the arrays: {exc}", path=str(path / "model.npz")) from None
    return meta, ledger, arrays


def _public_state(meta: dict, arrays: dict, path: Path) -> als.PublicState:
    """The released public state of a model folder's metadata and arrays, every array checked."""
    try:
        cfg = ALSConfig.from_dict(meta["config"], meta.get("algorithm"))
        cfg.validate()
        n_items = int(meta["n_items"])
        state = als.PublicState(
            meta["algorithm"],
            cfg,
            n_items,
            int(meta["n_users_released"]),
            tuple(meta["rating_range"]),
            implicit=bool(meta["implicit"]),
            mean=float(meta["mean"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"bad or missing field: {exc}", path=str(path / "model.json")) from None
    V = arrays.get("item_factors")
    if V is None or V.ndim != 2 or V.shape[0] != n_items or not np.isfinite(V).all():
        raise DataError(f"item_factors must be a finite ({n_items}, d) array", path=str(path / "model.npz"))
    state.item_factors = V.astype(np.float32)
    state.item_bias = arrays.get("item_bias")
    state.encoder_release = arrays.get("encoder_params")
    for name in ("counts_hat", "item_support"):
        value = arrays.get(name)
        if value is not None and (value.shape != (n_items,) or not np.isfinite(value).all()):
            raise DataError(f"{name} must be a finite ({n_items},) array", path=str(path / "model.npz"))
        setattr(state, name, value)
    B = arrays.get("item_item")
    if B is not None:
        if B.ndim != 2 or B.shape[0] != B.shape[1] or B.shape[0] > n_items or not np.isfinite(B).all():
            raise DataError(
                f"item_item must be a finite square (M, M) array with M <= {n_items}", path=str(path / "model.npz")
            )
        state.item_item = B.astype(np.float32)
    return state


def load_model(path: str | os.PathLike) -> Model | PersonalModel:
    """A saved model: :meth:`Model.load`, or a :class:`PersonalModel` (by the folder's format)."""
    path = Path(path)
    try:
        meta = json.loads((path / "model.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        meta = None
    if isinstance(meta, dict) and meta.get("format") == PERSONAL_FORMAT and all((path / n).is_file() for n in FILES):
        try:
            ledger = json.loads((path / "ledger.json").read_text(encoding="utf-8"))
            with np.load(path / "model.npz", allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read the model: {exc}", path=str(path)) from None
        return PersonalModel.from_files(path, meta, ledger, arrays)
    return Model.load(path)


# ---------------------------------------------------------------------------- a run's model
def _rating_model(plan, done) -> Model | None:
    state = done.state
    if state is None or getattr(state, "item_factors", None) is None:
        return None
    features = getattr(plan.dataset, "item_features", None)
    names = features.names if features is not None else None
    train = done.train if done.train is not None else plan.public
    return Model.from_run(state, train, done.records, done.metrics, names)


def _personal_model(plan, done) -> PersonalModel | None:
    state = done.state
    if state.U is None and state.theta is None:
        return None
    return PersonalModel.from_run(state, done.records, done.metrics)


def released_model(plan, done) -> Model | PersonalModel | None:
    """The model a finished run of ``plan`` released, by the plan's family (None when nothing
    shared was released, or for a family whose model this module does not know)."""
    from ..algorithms import pam
    from ..algorithms.ratings import RATINGS

    make = {RATINGS: _rating_model, pam.FAMILY: _personal_model}.get(plan.family)
    return make(plan, done) if make is not None else None
