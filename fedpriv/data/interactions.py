"""The one interactions type used across fedpriv.

Ratings are stored as three parallel arrays (user index, item index, rating) with dense,
0-based integer ids; the original ids are kept in ``user_ids`` / ``item_ids``. Both CSR
views (ratings grouped by user and by item) are built once, with numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import DataError


@dataclass(frozen=True)
class CSR:
    """Compressed rows: row ``r`` owns ``indices[indptr[r]:indptr[r+1]]`` and the same slice of
    ``data``. ``order`` maps CSR positions back to positions in the source rating arrays."""

    indptr: np.ndarray  # int64, (n_rows + 1,)
    indices: np.ndarray  # int32, column index per entry
    data: np.ndarray  # float32 ratings
    order: np.ndarray  # int64, permutation of the rating arrays

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = self.indptr[r], self.indptr[r + 1]
        return self.indices[s:e], self.data[s:e]

    def counts(self) -> np.ndarray:
        return np.diff(self.indptr)


def build_csr(rows: np.ndarray, cols: np.ndarray, data: np.ndarray, n_rows: int) -> CSR:
    """Group entries by ``rows`` (stable: keeps the input order inside a row)."""
    rows = np.asarray(rows)
    order = np.argsort(rows, kind="stable").astype(np.int64, copy=False)
    counts = np.bincount(rows, minlength=n_rows).astype(np.int64)
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return CSR(
        indptr=indptr,
        indices=np.ascontiguousarray(cols[order], dtype=np.int32),
        data=np.ascontiguousarray(data[order], dtype=np.float32),
        order=order,
    )


@dataclass
class Interactions:
    """A set of (user, item, rating) triples with dense integer ids.

    ``user_ids[u]`` / ``item_ids[i]`` give the original identifiers of dense ids ``u`` / ``i``.
    ``n_users`` / ``n_items`` may exceed the largest id present (e.g. after a split, all parts
    keep the id space of the full data set).
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    n_users: int
    n_items: int
    user_ids: np.ndarray | None = None
    item_ids: np.ndarray | None = None
    name: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.users = np.ascontiguousarray(self.users, dtype=np.int32)
        self.items = np.ascontiguousarray(self.items, dtype=np.int32)
        self.ratings = np.ascontiguousarray(self.ratings, dtype=np.float32)
        n = len(self.users)
        if len(self.items) != n or len(self.ratings) != n:
            raise ValueError("users, items and ratings must have the same length")
        if n and not np.all(np.isfinite(self.ratings)):
            row = int(np.flatnonzero(~np.isfinite(self.ratings))[0])
            raise DataError(f"ratings: entry {row} is not a finite float32 number")
        if n:
            if self.users.min() < 0 or self.users.max() >= self.n_users:
                raise ValueError("user index out of range")
            if self.items.min() < 0 or self.items.max() >= self.n_items:
                raise ValueError("item index out of range")
        if self.user_ids is None:
            self.user_ids = np.arange(self.n_users)
        if self.item_ids is None:
            self.item_ids = np.arange(self.n_items)

    def __len__(self) -> int:
        return len(self.ratings)

    @classmethod
    def from_pandas(
        cls, df, user: str = "user", item: str = "item", rating: str = "rating", *, implicit: bool = False
    ) -> Interactions:
        """Interactions from a DataFrame with one row per rating (``implicit``: one interaction of
        value 1 per row, no rating column), with the checks of the ``csv:`` loader: ids are kept
        as raw ids (int64 when all are plain integers), users and items renumbered densely in raw
        id order; the items are the rated ones (``meta["catalogue"] == "ratings"``). An empty id,
        a rating that is not a finite number or a repeated (user, item) pair is a
        :class:`~fedpriv.errors.DataError` naming the 0-based row. No rating range is checked:
        use :func:`fedpriv.data.tabular.dataset_from_pandas` for that, for duplicate policies and
        item features."""
        from . import frames  # imports pandas: only when a DataFrame is read
        from .tables import Table

        table = Table(frames.require_frame(df, "df"), "DataFrame", "frame")
        raw = frames.read_ratings(table, user=user, item=item, rating=rating, implicit=bool(implicit))
        inter, _ = from_raw_ids(raw.users, raw.items, raw.ratings, name="DataFrame")
        return inter

    @cached_property
    def by_user(self) -> CSR:
        """Ratings grouped by user: ``indices`` are item ids."""
        return build_csr(self.users, self.items, self.ratings, self.n_users)

    @cached_property
    def by_item(self) -> CSR:
        """Ratings grouped by item: ``indices`` are user ids."""
        return build_csr(self.items, self.users, self.ratings, self.n_items)

    def subset(self, mask_or_index: np.ndarray, name: str | None = None) -> "Interactions":
        """Keep a subset of the ratings, in the same id space."""
        return Interactions(
            users=self.users[mask_or_index],
            items=self.items[mask_or_index],
            ratings=self.ratings[mask_or_index],
            n_users=self.n_users,
            n_items=self.n_items,
            user_ids=self.user_ids,
            item_ids=self.item_ids,
            name=self.name if name is None else name,
            meta=dict(self.meta),
        )

    def item_counts(self) -> np.ndarray:
        return np.bincount(self.items, minlength=self.n_items)

    def user_counts(self) -> np.ndarray:
        return np.bincount(self.users, minlength=self.n_users)


def from_raw_ids(
    raw_users: np.ndarray,
    raw_items: np.ndarray,
    ratings: np.ndarray,
    *,
    name: str = "",
    item_universe: np.ndarray | None = None,
) -> tuple[Interactions, int]:
    """Remap raw ids to dense ids and drop duplicate (user, item) pairs, keeping the last one.

    Users are the users with ratings, dense ids in sorted raw id order. ``item_universe``:
    optional array of all raw item ids (the public catalogue, e.g. from a metadata file), so
    items without ratings still get a dense id and ``n_items`` / ``item_ids`` do not depend on
    the ratings (dense item ids follow the sorted raw ids). Without it the items are the rated
    ones. ``meta["catalogue"]`` records which: ``"metadata"`` or ``"ratings"``. Returns the
    interactions and the number of duplicate pairs that were dropped.
    """
    import pandas as pd  # factorize and duplicated are several times faster than np.unique here

    raw_users = np.asarray(raw_users)
    raw_items = np.asarray(raw_items)
    users, user_ids = pd.factorize(raw_users, sort=True)
    if item_universe is not None:
        item_ids = np.sort(pd.unique(np.concatenate([np.asarray(item_universe), raw_items])))
        items = np.searchsorted(item_ids, raw_items)
    else:
        items, item_ids = pd.factorize(raw_items, sort=True)
    users = users.astype(np.int64)
    items = items.astype(np.int64)
    key = users * len(item_ids) + items
    keep = np.flatnonzero(~pd.Series(key).duplicated(keep="last").to_numpy())
    n_dup = len(key) - len(keep)
    inter = Interactions(
        users=users[keep],
        items=items[keep],
        ratings=np.asarray(ratings)[keep],
        n_users=len(user_ids),
        n_items=len(item_ids),
        user_ids=user_ids,
        item_ids=item_ids,
        name=name,
        meta={"duplicates_dropped": int(n_dup), "catalogue": "ratings" if item_universe is None else "metadata"},
    )
    return inter, int(n_dup)
