"""Stable, keyed pseudo-random numbers attached to raw identifiers.

Loaders renumber users and items densely, so removing one user shifts the dense index of many
others. Anything that must not move when another user is added or removed (the train/valid/test
split, a user's sampled items, a user's Poisson coin, a user's group) is therefore keyed by the
*raw* identifier of the user (and item), never by a dense index.

- :func:`id_keys`: one 64-bit key per raw id, ``BLAKE2b(key, label || str(id))``. With a secret
  ``key`` it is a pseudo-random function of the id (user-level randomness); with a public one
  (a split seed) it is a stable public hash.
- :func:`mix_uniform`: uniforms in [0, 1) from 64-bit keys and integers (splitmix64 finaliser),
  for the many (user, item) or (user, round) pairs of one call. Its inputs already carry the
  keyed PRF output, so the mixer only has to spread bits.
"""

from __future__ import annotations

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def id_keys(key: bytes, label: str, ids: np.ndarray) -> np.ndarray:
    """One uint64 per entry of ``ids``: BLAKE2b keyed with ``key`` (up to 64 bytes) over
    ``label`` and the id's text. Equal ids get equal keys whatever their position."""
    ids = np.asarray(ids)
    if ids.size == 0:
        return np.zeros(ids.shape, dtype=np.uint64)
    uniq, inv = np.unique(ids, return_inverse=True)
    prefix = label.encode() + b"\x00"
    out = np.empty(len(uniq), dtype=np.uint64)
    k = bytes(key)[:64]
    for j, v in enumerate(uniq.tolist()):
        digest = hashlib.blake2b(prefix + str(v).encode(), key=k, digest_size=8).digest()
        out[j] = int.from_bytes(digest, "little")
    return out[inv.reshape(ids.shape)]


def public_key(seed: int | str, label: str) -> bytes:
    """A public hashing key from a public seed (splits, public draws)."""
    return hashlib.blake2b(f"fedpriv-public:{label}:{seed}".encode(), digest_size=32).digest()


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def mix_uniform(*parts: np.ndarray | int) -> np.ndarray:
    """Uniform [0, 1) numbers (53 bits) from broadcastable uint64-compatible arrays: each part is
    folded into a splitmix64 state in turn, so (k, a, b) and (k, b, a) differ."""
    with np.errstate(over="ignore"):
        x = np.uint64(0x2545F4914F6CDD1D)
        for p in parts:
            p = np.asarray(p)
            p = p.astype(np.uint64) if p.dtype != np.uint64 else p
            x = _mix((x + _GOLDEN) ^ (p * _M1 + _GOLDEN))
        x = np.asarray(x, dtype=np.uint64)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
