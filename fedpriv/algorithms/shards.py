"""User shards: the unit of data a client (a Flower node, or one slice of the in-process engine)
holds. A shard owns all ratings of its users (the privacy unit is one user)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..data.interactions import Interactions
from ..util.device import read_only_root


@dataclass
class UserShard:
    """Ratings of a set of users, grouped by user. ``items`` are global item ids; ``user_ids``
    are the global ids of the shard's users (row r of the CSR is user ``user_ids[r]``)."""

    user_ids: np.ndarray  # (n_local,) int64
    indptr: np.ndarray  # (n_local + 1,) int64
    items: np.ndarray  # (N,) int32
    ratings: np.ndarray  # (N,) float32
    # (n_local,) uint64: each user's secret key (fedpriv.privacy.randomness.user_keys of the raw
    # user id), the source of the user's own random choices; None for shards that make none
    user_keys: np.ndarray | None = None

    def __post_init__(self) -> None:
        # the shard's own read-only copies: arrays that cannot change are kept on a device from
        # one step to the next (fedpriv.util.device.keep)
        self.items = _fixed(self.items)
        self.ratings = _fixed(self.ratings)

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_ratings(self) -> int:
        return len(self.items)

    @cached_property
    def local_user_of_rating(self) -> np.ndarray:
        return _read_only(np.repeat(np.arange(self.n_users, dtype=np.int64), np.diff(self.indptr)))

    @cached_property
    def global_user_of_rating(self) -> np.ndarray:
        return self.user_ids[self.local_user_of_rating]

    @cached_property
    def by_item_order(self) -> np.ndarray:
        """Permutation of the shard's ratings that groups them by item (stable)."""
        n = len(self.items)
        if n >= 1 << 32:
            return _read_only(np.argsort(self.items, kind="stable"))
        # sort (item, position) pairs packed in one int64: numpy's vectorised sort of unique keys
        # is stable by construction and 7x faster than a stable argsort of the int32 items
        key = (self.items.astype(np.int64) << 32) | np.arange(n, dtype=np.int64)
        key.sort()
        return _read_only(key & 0xFFFFFFFF)

    @cached_property
    def by_item_local_users(self) -> np.ndarray:
        """Local user index of each rating, in ``by_item_order``."""
        return _read_only(self.local_user_of_rating[self.by_item_order])

    @cached_property
    def item_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """(item ids present, indptr over ``by_item_order``)."""
        sorted_items = self.items[self.by_item_order]
        starts = (
            np.flatnonzero(np.r_[True, sorted_items[1:] != sorted_items[:-1]])
            if len(sorted_items)
            else np.zeros(0, np.int64)
        )
        present = sorted_items[starts]
        counts = np.diff(np.r_[starts, len(sorted_items)])
        indptr = np.zeros(len(present) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return present, indptr


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _fixed(a) -> np.ndarray:
    """``a`` itself when its memory is read-only (it cannot change: this module's constructors
    hand in such fresh arrays), else a read-only copy (a caller's array stays the caller's)."""
    a = np.asarray(a)
    return a if read_only_root(a) is not None else _read_only(np.array(a))


def shard_users(inter: Interactions, users: np.ndarray | None = None, keys: np.ndarray | None = None) -> UserShard:
    """One shard holding ``users`` (default: every user id of the interactions); ``keys``: the
    secret keys of every user of ``inter`` (indexed by dense id), sliced to the shard's users."""
    csr = inter.by_user
    if users is None:
        users = np.arange(inter.n_users)
    users = np.asarray(users, dtype=np.int64)
    starts, ends = csr.indptr[users], csr.indptr[users + 1]
    counts = ends - starts
    indptr = np.zeros(len(users) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    # positions of the selected users' ratings in the user-grouped CSR, vectorized
    pos = np.repeat(starts - indptr[:-1], counts) + np.arange(indptr[-1])
    items, ratings = csr.indices[pos], csr.data[pos]
    return UserShard(
        user_ids=users,
        indptr=indptr,
        items=_read_only(np.asarray(items, np.int32)),
        ratings=_read_only(np.asarray(ratings, np.float32)),  # fresh: kept as they are
        user_keys=None if keys is None else np.asarray(keys, dtype=np.uint64)[users],
    )


def sub_shard(shard: UserShard, keep: np.ndarray) -> UserShard:
    """The shard restricted to the users where ``keep`` (a boolean per local user) is True, with
    all of their ratings (e.g. a round's Poisson-sampled users)."""
    lengths = np.diff(shard.indptr)
    sel = np.repeat(keep, lengths)
    indptr = np.concatenate([[0], np.cumsum(lengths[keep])]).astype(shard.indptr.dtype)
    keys = None if shard.user_keys is None else shard.user_keys[keep]
    return UserShard(shard.user_ids[keep], indptr, _read_only(shard.items[sel]), _read_only(shard.ratings[sel]), keys)


def user_block(index: int, size: int, n_users: int) -> np.ndarray:
    """Block ``index`` of contiguous user ids, ``size`` each (the last may be smaller, and a block
    past the end is empty): the users of shard or node ``index``."""
    size = max(1, int(size))
    start = min(int(index) * size, n_users)
    return np.arange(start, min(start + size, n_users), dtype=np.int64)


def split_users(n_users: int, users_per_shard: int) -> list[np.ndarray]:
    """Every block of :func:`user_block` (the one rule of shards, nodes and deployment folders)."""
    size = max(1, int(users_per_shard))
    return [user_block(i, size, n_users) for i in range(-(-n_users // size))]
