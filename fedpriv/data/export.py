"""Write ratings in the official MovieLens-100K layout (``u.data`` and ``u.item``), so that any
rating set (a generated one, or a data set minus one user) can be read back through the real
loader: :func:`fedpriv.data.loaders.load_dataset` ``("ml-100k", folder)``. Neighbouring data sets
built this way are renumbered exactly as the loader renumbers real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .interactions import Interactions

N_ML100K_GENRES = 19
_FIRST_TIMESTAMP = 881_250_949


def write_ml100k(folder: str | Path, raw_users, raw_items, ratings, catalogue_ids) -> Path:
    """``u.data`` (``user\\titem\\trating\\ttimestamp``, in the given order) and ``u.item`` (one
    line per id of ``catalogue_ids``, with one deterministic genre and a release year). Returns
    the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    raw_users, raw_items, ratings = (np.asarray(a) for a in (raw_users, raw_items, ratings))
    if not len(raw_users) == len(raw_items) == len(ratings):
        raise ValueError("raw_users, raw_items and ratings must have the same length")
    rows = (
        f"{u}\t{i}\t{float(r):g}\t{_FIRST_TIMESTAMP + k}\n"
        for k, (u, i, r) in enumerate(zip(raw_users.tolist(), raw_items.tolist(), ratings.tolist()))
    )
    (folder / "u.data").write_text("".join(rows), encoding="utf-8")
    items = []
    for m in np.asarray(catalogue_ids).tolist():
        flags = "|".join("1" if g == m % N_ML100K_GENRES else "0" for g in range(N_ML100K_GENRES))
        year = 1980 + m % 20
        items.append(f"{m}|Movie {m} ({year})|01-Jan-{year}||http://example.org/movie/{m}|{flags}\n")
    (folder / "u.item").write_text("".join(items), encoding="utf-8")
    return folder


def write_interactions_ml100k(folder: str | Path, inter: Interactions, *, without_user=None) -> Path:
    """An :class:`Interactions` set (raw ids and catalogue kept) in the ML-100K layout;
    ``without_user``: leave out every rating of this raw user id (the neighbouring data set)."""
    users = np.asarray(inter.user_ids)[inter.users]
    keep = np.ones(len(users), dtype=bool) if without_user is None else users != without_user
    items = np.asarray(inter.item_ids)[inter.items]
    return write_ml100k(folder, users[keep], items[keep], inter.ratings[keep], inter.item_ids)
