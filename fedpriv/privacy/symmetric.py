"""Symmetric matrices as their upper triangles (diagonal included): the coordinates a symmetric
release is noised and bounded in (the ledger draws noise for the triangle and mirrors it; the L2
sensitivity of such a release is the norm of one user's triangle), and the wire format of the
d x d blocks. Numpy only."""

from __future__ import annotations

import numpy as np


def upper(A: np.ndarray) -> np.ndarray:
    """The upper triangles (diagonal included) of the last two axes, as vectors."""
    iu = np.triu_indices(A.shape[-1])
    return A[..., iu[0], iu[1]]


def from_upper(T: np.ndarray, d: int) -> np.ndarray:
    """The symmetric d x d matrices whose upper triangles are the last axis of ``T``."""
    T = np.asarray(T)
    return np.take(T, triangle_positions(d), axis=-1)


_positions: dict[int, np.ndarray] = {}


def triangle_positions(d: int) -> np.ndarray:
    """(d, d): the position in the upper-triangle vector of every entry of a symmetric matrix."""
    pos = _positions.get(d)
    if pos is None:
        iu = np.triu_indices(d)
        pos = np.empty((d, d), dtype=np.intp)
        pos[iu] = np.arange(len(iu[0]))
        pos[iu[1], iu[0]] = np.arange(len(iu[0]))
        _positions[d] = pos
    return pos
