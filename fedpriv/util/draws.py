"""Labelled random draws: the ledger's noise draws and the public (data-independent) draws.

While a sanctioned draw runs, :func:`drawing_context` names it ('ledger:<release>' or
'public:<why>'); a test replaces numpy's and torch's samplers and fails on any draw made outside
such a context. The lowest layer of fedpriv: data generators (public draws) and the privacy
ledger (noise) both use it.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator

import numpy as np

# True while the ledger (or public_gaussian) is drawing: lets tests detect draws made elsewhere.
_DRAWING: contextvars.ContextVar[str | None] = contextvars.ContextVar("fedpriv_drawing", default=None)


def drawing_context() -> str | None:
    """Name of the sanctioned draw in progress ('ledger:<release>' or 'public:<why>'), else None."""
    return _DRAWING.get()


@contextmanager
def _sanctioned(tag: str) -> Iterator[None]:
    token = _DRAWING.set(tag)
    try:
        yield
    finally:
        _DRAWING.reset(token)


@contextmanager
def public_draws(why: str) -> Iterator[None]:
    """Sanction draws (numpy or torch) that depend on no private data, e.g. the initialisation
    of a model; ``why`` is visible to the ledger-completeness test."""
    with _sanctioned(f"public:{why}"):
        yield


def public_gaussian(rng: np.random.Generator, shape, *, why: str, scale: float = 1.0) -> np.ndarray:
    """A Gaussian draw that depends on no private data (initialisations, synthetic data).

    ``why`` documents the use; it is visible to the ledger-completeness test.
    """
    with _sanctioned(f"public:{why}"):
        return rng.normal(0.0, scale, size=shape)
