from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not present at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def small_mf():
    from fedpriv.data.synthetic import make_mf

    return make_mf(300, 120, 6000, rank=3, seed=3)


def adversarial_interactions(rng, n_users: int, n_items: int, n_background: int, n_ratings: int, rating: float):
    """``n_background`` random in-range ratings by users 0..n_users-2, plus the last user rating
    ``n_ratings`` distinct items with ``rating`` (duplicate pairs keep the last)."""
    from fedpriv.data.interactions import Interactions

    users = rng.integers(0, n_users - 1, n_background)
    items = rng.integers(0, n_items, n_background)
    vals = rng.uniform(1, 5, n_background)
    adv = rng.choice(n_items, size=n_ratings, replace=False)
    users = np.concatenate([users, np.full(n_ratings, n_users - 1)])
    items = np.concatenate([items, adv])
    vals = np.concatenate([vals, np.full(n_ratings, rating)])
    key = users * n_items + items
    _, first = np.unique(key[::-1], return_index=True)
    keep = np.sort(len(key) - 1 - first)
    return Interactions(users[keep], items[keep], vals[keep], n_users, n_items)
