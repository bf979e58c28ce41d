"""GEMM-bound sufficient-statistics kernel.

For segments s (items, or users) with member rows r in s, computes in one pass

    A_s = sum_r w_r x_r x_r^T        b_s = sum_r w_r y_r x_r        c_s = sum_r w_r y_r^2

where x_r = factors[index[r]]. Segments are cut into pieces of at most 512 entries; pieces are
packed by size class (ratio sqrt(2)) into padded 3-D blocks gathered straight from the factor
table (padding entries have weight 0), each block is reduced with one batched GEMM of the
augmented rows [sqrt(w) x, sqrt(w) y] (so one Gram matrix holds A, b and c), and the pieces
are accumulated into their segments. No per-rating Python loop and no outer-product scatter.

Two back ends compute the same float32 sums: torch (multi-threaded gathers and batched GEMM) when
this process has imported torch already (the in-process engine, a server, an AM-DPSGD client),
numpy otherwise. A ClientApp of the ALS or AM-SSP family therefore never imports torch: its
import and its messages stay light (a test guards the import set).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ..privacy.symmetric import from_upper, upper  # noqa: F401 - the wire format of d x d blocks

# a padded block holds at most this many floats
_BLOCK_FLOATS = 1 << 23
# segments are cut into pieces of at most this many entries
_PIECE = 512
_SMALL_ENTRIES = 2048  # below this many entries, segment_stats runs in numpy
_SMALL_SYSTEMS = 16  # solve_spd of at most this many systems runs in numpy


def _loaded_torch():
    """torch if this process imported it already, else None (never imports it)."""
    return sys.modules.get("torch")


@dataclass
class SegmentStats:
    A: np.ndarray  # (n_segments, d, d) float32
    b: np.ndarray  # (n_segments, d) float32
    c: np.ndarray  # (n_segments,) float32


def _pieces(indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut segments into pieces of at most _PIECE entries: (segment, start, length) per piece."""
    counts = np.diff(indptr)
    n_pieces = -(-counts // _PIECE)
    seg = np.repeat(np.arange(len(counts)), n_pieces)
    first = np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    start = indptr[seg] + (np.arange(len(seg)) - first) * _PIECE
    length = np.minimum(_PIECE, indptr[seg + 1] - start)
    return seg, start, length


def segment_stats(
    factors: np.ndarray,
    index: np.ndarray,
    indptr: np.ndarray,
    weights: np.ndarray | None = None,
    targets: np.ndarray | None = None,
) -> SegmentStats:
    """Weighted Gram matrices per segment (see module docstring).

    ``factors``: (n_src, d); ``index``: (N,) source row of each entry, grouped by segment with
    ``indptr`` (n_segments + 1,); ``weights``/``targets``: (N,) per entry (default 1 / 0).
    """
    d = factors.shape[1]
    n_seg = len(indptr) - 1
    n = len(index)
    indptr = np.asarray(indptr, dtype=np.int64)
    width = d + 1
    if n <= _SMALL_ENTRIES:  # one user's or a few users' ratings: numpy beats torch's op overhead
        return _segment_stats_small(factors, index, indptr, weights, targets)
    torch = _loaded_torch()
    if torch is None:
        return _segment_stats_numpy(factors, index, indptr, weights, targets)
    F, idx, sw, ty = (torch.from_numpy(x) for x in _padded_inputs(factors, index, weights, targets))
    piece_seg, piece_start, piece_len = _pieces(indptr)
    G = torch.zeros((n_seg, width * width), dtype=torch.float32)
    buf = torch.empty(_BLOCK_FLOATS + _PIECE * width, dtype=torch.float32)  # reused gather buffer
    for block, L in _blocks(piece_len, width):
        ent = torch.from_numpy(_entries(block, L, piece_start, piece_len, n))
        X = buf[: len(ent) * width].view(len(ent), width)
        torch.index_select(F, 0, torch.index_select(idx, 0, ent), out=X)
        X[:, d] = torch.index_select(ty, 0, ent)
        X.mul_(torch.index_select(sw, 0, ent)[:, None])
        Xb = X.view(len(block), L, width)
        # accumulate per segment (2-D index_add_ is fast; several pieces may share a segment)
        G.index_add_(0, torch.from_numpy(piece_seg[block]), torch.bmm(Xb.transpose(1, 2), Xb).view(len(block), -1))
    G3 = G.view(n_seg, width, width).numpy()
    return SegmentStats(A=G3[:, :d, :d], b=G3[:, :d, d], c=G3[:, d, d])


def _size_classes(piece_len: np.ndarray) -> list[np.ndarray]:
    """Pieces grouped by size class (ratio sqrt(2): padding waste < 1.42x)."""
    size_class = np.floor(2.0 * np.log2(np.maximum(piece_len, 1))).astype(np.int64)
    order = np.argsort(size_class, kind="stable")
    return [c for c in np.split(order, np.flatnonzero(np.diff(size_class[order])) + 1) if len(c)]


def _blocks(piece_len: np.ndarray, width: int):
    """(pieces, padded length L) of every block: pieces of one size class, at most
    _BLOCK_FLOATS floats of gathered rows per block."""
    for cls in _size_classes(piece_len):
        L = int(piece_len[cls].max())
        B = max(1, _BLOCK_FLOATS // (L * width))
        for b0 in range(0, len(cls), B):
            yield cls[b0 : b0 + B], L


def _entries(block: np.ndarray, L: int, piece_start: np.ndarray, piece_len: np.ndarray, pad: int) -> np.ndarray:
    """Entry index of every padded slot of a block, row-major (``pad``: the zero-weight slot)."""
    ar = np.arange(L)
    return np.where(ar[None, :] < piece_len[block][:, None], piece_start[block][:, None] + ar[None, :], pad).reshape(-1)


def _padded_inputs(factors, index, weights, targets) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Both back ends' inputs: the source table with a spare last column (filled with sqrt(w) y
    per entry) and a zero padding row; per-entry source rows, sqrt weights and targets, each with
    one extra padding slot of weight 0."""
    n_src, d = factors.shape
    n = len(index)
    F = np.zeros((n_src + 1, d + 1), dtype=np.float32)
    F[:n_src, :d] = factors
    idx = np.full(n + 1, n_src, dtype=np.int64)
    idx[:n] = index
    sw = np.zeros(n + 1, dtype=np.float32)
    sw[:n] = np.sqrt(np.maximum(weights, 0.0)) if weights is not None else 1.0
    ty = np.zeros(n + 1, dtype=np.float32)
    if targets is not None:
        ty[:n] = targets
    return F, idx, sw, ty


def _segment_stats_numpy(factors, index, indptr, weights, targets) -> SegmentStats:
    """The torch path's algorithm in numpy (padded blocks, one batched GEMM each)."""
    d = factors.shape[1]
    n_seg, n, width = len(indptr) - 1, len(index), d + 1
    F, idx, sw, ty = _padded_inputs(factors, index, weights, targets)
    piece_seg, piece_start, piece_len = _pieces(indptr)
    G = np.zeros((n_seg, width * width), dtype=np.float32)
    for block, L in _blocks(piece_len, width):
        ent = _entries(block, L, piece_start, piece_len, n)
        X = F[idx[ent]]
        X[:, d] = ty[ent]
        X *= sw[ent][:, None]
        Xb = X.reshape(len(block), L, width)
        P = np.matmul(Xb.transpose(0, 2, 1), Xb).reshape(len(block), -1)
        np.add.at(G, piece_seg[block], P)  # several pieces may share a segment
    G3 = G.reshape(n_seg, width, width)
    return SegmentStats(A=G3[:, :d, :d], b=G3[:, :d, d], c=G3[:, d, d])


def _segment_stats_small(factors, index, indptr, weights, targets) -> SegmentStats:
    """The same sums for small inputs, in numpy (float32, like the torch path)."""
    n_seg, d = len(indptr) - 1, factors.shape[1]
    X = np.zeros((len(index), d + 1), dtype=np.float32)
    X[:, :d] = np.asarray(factors, dtype=np.float32)[np.asarray(index, dtype=np.int64)]
    if targets is not None:
        X[:, d] = targets
    if weights is not None:
        X *= np.sqrt(np.maximum(np.asarray(weights, dtype=np.float32), 0.0))[:, None]
    G = np.zeros((n_seg, d + 1, d + 1), dtype=np.float32)
    counts = np.diff(indptr)
    if len(index):
        outer = X[:, :, None] * X[:, None, :]
        nonempty = counts > 0
        G[nonempty] = np.add.reduceat(outer, indptr[:-1][nonempty], axis=0)
    return SegmentStats(A=G[:, :d, :d], b=G[:, :d, d], c=G[:, d, d])


def gram_flops(n_entries: int, d: int) -> float:
    """Useful floating-point operations of the kernel: one (d+1)^2 multiply-add per entry."""
    return 2.0 * n_entries * (d + 1) ** 2


def solve_spd(A: np.ndarray, b: np.ndarray, reg: np.ndarray | float) -> np.ndarray:
    """Solve (A_s + reg_s I) x_s = b_s for a batch of symmetric PSD systems.

    Float32 Cholesky for speed; systems it rejects (not positive definite, e.g. zero reg on a
    singular Gram matrix) are solved again in float64 by least squares.
    """
    torch = _loaded_torch()
    if len(A) <= _SMALL_SYSTEMS or torch is None:  # a node's users: numpy, without torch's per-op overhead
        return _solve_spd_numpy(A, b, reg)
    At = torch.from_numpy(np.ascontiguousarray(A, dtype=np.float32)).clone()
    n = At.shape[0]
    reg_t = torch.from_numpy(np.broadcast_to(np.asarray(reg, dtype=np.float32), (n,)).copy())
    At.diagonal(dim1=-2, dim2=-1).add_(reg_t[:, None])
    bt = torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32))[..., None]
    L, info = torch.linalg.cholesky_ex(At)
    x = torch.cholesky_solve(bt, L)[..., 0].to(torch.float64)
    bad = (info != 0) | ~torch.isfinite(x).all(dim=-1)
    if bad.any():
        Ab = At[bad].to(torch.float64)
        x[bad] = torch.linalg.lstsq(Ab, bt[bad].to(torch.float64)).solution[..., 0]
    return x.numpy()


def _solve_spd_numpy(A: np.ndarray, b: np.ndarray, reg) -> np.ndarray:
    """:func:`solve_spd` in numpy: batched float32 Cholesky check and solve; the systems it
    rejects are solved again in float64 by least squares."""
    A32 = np.array(A, dtype=np.float32)
    n, d = A32.shape[0], A32.shape[-1]
    idx = np.arange(d)
    A32[:, idx, idx] += np.broadcast_to(np.asarray(reg, dtype=np.float32), (n,))[:, None]
    b32 = np.asarray(b, dtype=np.float32)
    x = np.zeros((n, d), dtype=np.float64)
    if n == 0:
        return x
    try:
        np.linalg.cholesky(A32)  # all positive definite (the common case): one batched solve
        good = np.ones(n, dtype=bool)
    except np.linalg.LinAlgError:
        good = np.zeros(n, dtype=bool)
        for i in range(n):
            try:
                np.linalg.cholesky(A32[i])
                good[i] = True
            except np.linalg.LinAlgError:
                pass
    if good.any():
        x[good] = np.linalg.solve(A32[good], b32[good][..., None])[..., 0]
    bad = ~good | ~np.isfinite(x).all(axis=-1)
    for i in np.flatnonzero(bad):
        x[i] = np.linalg.lstsq(A32[i].astype(np.float64), b32[i].astype(np.float64), rcond=None)[0]
    return x


def project_psd(A: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Project a batch of symmetric matrices onto {X : X >= floor I} (eigenvalue clipping)."""
    torch = _loaded_torch()
    if torch is None:
        A32 = np.asarray(A, dtype=np.float32)
        A32 = 0.5 * (A32 + A32.transpose(0, 2, 1))
        evals, evecs = np.linalg.eigh(A32)
        return (evecs * np.maximum(evals, floor)[..., None, :]) @ evecs.transpose(0, 2, 1)
    At = torch.from_numpy(np.ascontiguousarray(A, dtype=np.float32))
    At = 0.5 * (At + At.transpose(-1, -2))
    evals, evecs = torch.linalg.eigh(At)
    evals = torch.clamp(evals, min=floor)
    return ((evecs * evals[..., None, :]) @ evecs.transpose(-1, -2)).numpy()
