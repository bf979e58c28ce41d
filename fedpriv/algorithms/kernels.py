"""GEMM-bound sufficient-statistics kernel.

For segments s (items, or users) with member rows r in s, computes in one pass

    A_s = sum_r w_r x_r x_r^T        b_s = sum_r w_r y_r x_r        c_s = sum_r w_r y_r^2

where x_r = factors[index[r]]. Rows are gathered with their sqrt-weights into an augmented
matrix [sqrt(w) x, sqrt(w) y], so one Gram matrix G = X^T X holds A, b and c. Entries are
gathered one contiguous chunk at a time; segments are cut into pieces of at most 512 entries,
the pieces packed by size class (ratio sqrt(2)) into padded 3-D blocks and reduced with one
batched GEMM per block (padding rows are zero), then added back into their segments. No per-rating Python loop and
no outer-product scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# rows gathered at once (one contiguous run of entries); padded blocks hold at most _BLOCK_FLOATS
_CHUNK_FLOATS = 1 << 25
_BLOCK_FLOATS = 1 << 23
# segments are cut into pieces of at most this many entries
_PIECE = 512


@dataclass
class SegmentStats:
    A: np.ndarray  # (n_segments, d, d) float32
    b: np.ndarray  # (n_segments, d) float32
    c: np.ndarray  # (n_segments,) float32


def _to_torch(x: np.ndarray, dtype=torch.float32) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(dtype)


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
    indptr = np.asarray(indptr, dtype=np.int64)
    G = torch.zeros((n_seg, d + 1, d + 1), dtype=torch.float32)
    F = _to_torch(factors)
    idx = torch.from_numpy(np.asarray(index, dtype=np.int64))
    sw = _to_torch(np.sqrt(np.maximum(weights, 0.0))) if weights is not None else None
    ty = _to_torch(targets) if targets is not None else None
    counts = np.diff(indptr)
    rows_per_chunk = max(1, _CHUNK_FLOATS // (d + 1))
    seg = 0
    while seg < n_seg:
        # a run of whole segments with at most rows_per_chunk entries (or one larger segment)
        end = int(np.searchsorted(indptr, indptr[seg] + rows_per_chunk, side="right")) - 1
        end = min(max(end, seg + 1), n_seg)
        lo, hi = int(indptr[seg]), int(indptr[end])
        X = _gather(F, idx, sw, ty, lo, hi)
        _chunk_grams(X, indptr[seg : end + 1] - lo, G[seg:end])
        seg = end
    Gn = G.numpy()
    return SegmentStats(A=Gn[:, :d, :d], b=Gn[:, :d, d], c=Gn[:, d, d])


def _gather(F, idx, sw, ty, lo: int, hi: int) -> torch.Tensor:
    """Rows lo..hi as [sqrt(w) x, sqrt(w) y], plus one trailing zero row for padding."""
    d = F.shape[1]
    X = torch.empty((hi - lo + 1, d + 1), dtype=torch.float32)
    X[:-1, :d] = torch.index_select(F, 0, idx[lo:hi])
    X[:-1, d] = ty[lo:hi] if ty is not None else 0.0
    if sw is not None:
        X[:-1] *= sw[lo:hi, None]
    X[-1] = 0.0
    return X


def _chunk_grams(X: torch.Tensor, ptr: np.ndarray, out: torch.Tensor) -> None:
    """Gram matrix of each segment of the gathered chunk ``X`` into ``out``.

    Segments are cut into pieces of at most _PIECE rows, the pieces packed by size class
    (ratio sqrt(2): padding waste < 1.42x) into padded 3-D blocks, each block reduced with one
    batched GEMM, and the pieces' Gram matrices added back into their segments.
    """
    counts = np.diff(ptr)
    n_pieces = -(-counts // _PIECE)
    piece_seg = np.repeat(np.arange(len(counts)), n_pieces)
    first = np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    piece_start = ptr[piece_seg] + (np.arange(len(piece_seg)) - first) * _PIECE
    piece_len = np.minimum(_PIECE, ptr[piece_seg + 1] - piece_start)
    grams = torch.empty((len(piece_seg), X.shape[1], X.shape[1]), dtype=torch.float32)
    order = np.argsort(piece_len, kind="stable")
    size_class = np.floor(2.0 * np.log2(piece_len[order])).astype(np.int64)
    pad_row = X.shape[0] - 1
    width = X.shape[1]
    for cls in np.split(order, np.flatnonzero(np.diff(size_class)) + 1):
        L = int(piece_len[cls].max())
        B = max(1, _BLOCK_FLOATS // (L * width))
        ar = torch.arange(L)
        for b0 in range(0, len(cls), B):
            block = cls[b0 : b0 + B]
            lens = torch.from_numpy(piece_len[block])
            rows = torch.from_numpy(piece_start[block])[:, None] + ar[None, :]
            rows = torch.where(ar[None, :] < lens[:, None], rows, pad_row)
            Xb = torch.index_select(X, 0, rows.reshape(-1)).reshape(len(block), L, width)
            grams[torch.from_numpy(block)] = torch.bmm(Xb.transpose(1, 2), Xb)
    # pieces of one segment are consecutive: sum them per segment
    has = np.flatnonzero(n_pieces)
    if len(has):
        summed = np.add.reduceat(grams.numpy(), np.cumsum(n_pieces)[has] - n_pieces[has], axis=0)
        out[torch.from_numpy(has)] = torch.from_numpy(summed)


def gram_flops(n_entries: int, d: int) -> float:
    """Useful floating-point operations of the kernel: one (d+1)^2 multiply-add per entry."""
    return 2.0 * n_entries * (d + 1) ** 2


def solve_spd(A: np.ndarray, b: np.ndarray, reg: np.ndarray | float) -> np.ndarray:
    """Solve (A_s + reg_s I) x_s = b_s for a batch of symmetric systems (float64 for stability)."""
    At = torch.from_numpy(np.asarray(A, dtype=np.float64)).clone()
    d = At.shape[-1]
    reg_t = torch.as_tensor(np.broadcast_to(np.asarray(reg, dtype=np.float64), (At.shape[0],)).copy())
    At += reg_t[:, None, None] * torch.eye(d, dtype=torch.float64)
    bt = torch.from_numpy(np.asarray(b, dtype=np.float64))[..., None]
    x = torch.linalg.lstsq(At, bt).solution if (reg_t <= 0).any() else torch.linalg.solve(At, bt)
    return x[..., 0].numpy()


def project_psd(A: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Project a batch of symmetric matrices onto {X : X >= floor I} (eigenvalue clipping)."""
    At = torch.from_numpy(np.asarray(A, dtype=np.float64))
    At = 0.5 * (At + At.transpose(-1, -2))
    evals, evecs = torch.linalg.eigh(At)
    evals = torch.clamp(evals, min=floor)
    return ((evecs * evals[..., None, :]) @ evecs.transpose(-1, -2)).numpy()
