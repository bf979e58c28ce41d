"""Per-user clipping: the bounds that make user-level sensitivities hold whatever the data."""

from __future__ import annotations

import numpy as np


def clip_rows(x: np.ndarray, max_norm: float) -> np.ndarray:
    """Scale each row of ``x`` to L2 norm at most ``max_norm`` (non-finite rows become zero)."""
    x = np.asarray(x, dtype=np.float64 if x.dtype == np.float64 else np.float32)
    x = np.where(np.isfinite(x).all(axis=-1, keepdims=True), x, 0.0).astype(x.dtype)
    if not np.isfinite(max_norm):
        return x
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    scale = np.minimum(1.0, max_norm / np.maximum(norms, 1e-30))
    return (x * scale).astype(x.dtype, copy=False)


def clip_values(y: np.ndarray, bound: float) -> np.ndarray:
    """Clip values to [-bound, bound]; non-finite values become 0."""
    y = np.asarray(y)
    y = np.where(np.isfinite(y), y, 0.0)
    if not np.isfinite(bound):
        return y
    return np.clip(y, -bound, bound)
