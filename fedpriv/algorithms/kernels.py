"""GEMM-bound sufficient-statistics kernel.

For segments s (items, or users) with member rows r in s, computes in one pass

    A_s = sum_r w_r x_r x_r^T        b_s = sum_r w_r y_r x_r        c_s = sum_r w_r y_r^2

where x_r = factors[index[r]] (negative weights count as 0). Three back ends compute the same
float32 sums, and every caller (both engines, every ClientApp) goes through
:func:`segment_stats`, which picks one:

- **native** (the default wherever a C compiler exists, :mod:`fedpriv.algorithms.native`): one
  fused pass per segment chunk: rows are gathered, scaled and packed into a cache-resident buffer
  (b and c accumulate while packing), then register-blocked rank-k updates compute the tiles of
  A on or above the diagonal and the rest is mirrored. Segments are split over the threads in
  ranges of about equal entry counts (ctypes releases the GIL). No torch, so ClientApps use it too;
- **torch** (``FEDPRIV_NATIVE=0`` or no compiler, when this process has imported torch already:
  the in-process engine, a server, an AM-DPSGD client): segments are cut into pieces of at most
  512 entries, packed by size class (ratio sqrt(2)) into padded 3-D blocks gathered straight from
  the factor table (padding entries have weight 0), and each block is reduced with one batched
  GEMM of the augmented rows [sqrt(w) x, sqrt(w) y] (one Gram matrix holds A, b and c). The
  packing depends only on the segment layout and the row width, so it is built once and cached;
- **numpy** (the same, without torch): the torch path's packing with numpy's batched matmul, and
  a direct sum for small inputs. A ClientApp of the ALS or AM-SSP family never imports torch:
  its import and its messages stay light (a test guards the import set).

Batched Cholesky solves and eigen-decompositions run one small matrix after another inside
torch and LAPACK; :func:`solve_spd` and :func:`project_psd` split the batch over
:func:`fedpriv.util.threads.thread_count` threads, and :func:`project_psd` decomposes only the
matrices that need it (a Cholesky test finds those already above the floor).
"""

from __future__ import annotations

import hashlib
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..privacy.clipping import clip_rows, clip_values
from ..privacy.symmetric import from_upper, upper  # noqa: F401 - the wire format of d x d blocks
from ..util import device
from ..util.threads import map_chunks, thread_count
from . import native

# a padded block holds at most this many floats (about 4 MB: the gathered rows of a block stay
# in the cache between the gather, the scaling and the GEMM)
_BLOCK_FLOATS = 1 << 20
# segments are cut into pieces of at most this many entries
_PIECE = 512
_SMALL_ENTRIES = 2048  # below this many entries, segment_stats runs in numpy
_SMALL_SYSTEMS = 16  # solve_spd of at most this many systems runs in numpy
_DEVICE_BLOCK_FLOATS = 1 << 25  # on a GPU: blocks of up to 128 MB (fewer, larger batched GEMMs)
# the packings kept: every layout of a step must stay (a shard's item groups and each chunk of
# its user solve: 10 at the ML-10M shape with d = 128, 73 at the MSD shape), else each step
# builds them again and a device copies their slots again (170 MB per step at ML-10M, d = 128,
# when 8 were kept); bounded by their slots (8 bytes each: 1 GB at most) and their number
_PLAN_CACHE_SLOTS = 1 << 27
_PLAN_CACHE_SIZE = 512
_NATIVE_THREADED_FLOATS = (
    1 << 18
)  # the native kernel splits inputs of at least this many gathered floats over the threads


def _loaded_torch():
    """torch if this process imported it already, else None (never imports it)."""
    return sys.modules.get("torch")


@dataclass
class SegmentStats:
    A: np.ndarray  # (n_segments, d, d) float32
    b: np.ndarray  # (n_segments, d) float32
    c: np.ndarray  # (n_segments,) float32


@dataclass(frozen=True)
class Targets:
    """Per-entry targets given by how they are made, so that each back end makes them where it
    computes (on a device: from the shard's arrays kept there, no per-entry copy):

        y_r = clip(base_r - shift - sum_k table_k[index_k[r]])

    ``base``: per entry (None: ones); ``terms``: (table, per-entry index) pairs subtracted in
    order; ``clip``: :func:`fedpriv.privacy.clipping.clip_values`'s bound (None: no clipping).
    :meth:`values` is the float64 array on the host; a device makes the same float64 values
    (IEEE subtraction, the same order), then both go to float32 as an array would."""

    n: int
    base: np.ndarray | None = None
    shift: float = 0.0
    terms: tuple = ()
    clip: float | None = None

    def __len__(self) -> int:
        return self.n

    def minus(self, table: np.ndarray, index: np.ndarray) -> Targets:
        """These targets less ``table[index[r]]``."""
        return Targets(self.n, self.base, self.shift, (*self.terms, (table, index)), self.clip)

    def clipped(self, bound: float) -> Targets:
        if self.clip is not None:
            raise ValueError("Targets: clipped twice")
        return Targets(self.n, self.base, self.shift, self.terms, bound)

    def __getitem__(self, sl: slice) -> Targets:
        """Entries ``sl`` (a slice with step 1)."""
        start, stop, _ = sl.indices(self.n)
        cut = lambda a: a[start:stop]  # noqa: E731
        return Targets(
            max(0, stop - start),
            None if self.base is None else cut(self.base),
            self.shift,
            tuple((t, cut(i)) for t, i in self.terms),
            self.clip,
        )

    def values(self) -> np.ndarray:
        y = np.ones(self.n) if self.base is None else self.base.astype(np.float64) - self.shift
        for table, index in self.terms:
            y = y - np.asarray(table)[index]
        return y if self.clip is None else clip_values(y, self.clip)


def _host_targets(targets):
    """An array of targets (a :class:`Targets` made on the host)."""
    return targets.values() if isinstance(targets, Targets) else targets


def _pieces(indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut segments into pieces of at most _PIECE entries: (segment, start, length) per piece."""
    counts = np.diff(indptr)
    n_pieces = -(-counts // _PIECE)
    seg = np.repeat(np.arange(len(counts)), n_pieces)
    first = np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    start = indptr[seg] + (np.arange(len(seg)) - first) * _PIECE
    length = np.minimum(_PIECE, indptr[seg + 1] - start)
    return seg, start, length


@dataclass(frozen=True)
class _Plan:
    """The packing of one segment layout: ``slots`` is the entry of every padded slot, block
    after block (padding slots hold the entry count n, the zero-weight slot); each block is
    (first slot, pieces, padded length L, segment of each piece)."""

    slots: np.ndarray
    blocks: tuple
    resident: dict = field(
        default_factory=dict, compare=False, repr=False
    )  # device name -> its copies (device_kernels)


_plans: OrderedDict = OrderedDict()


def _plan(indptr: np.ndarray, width: int, block_floats: int = _BLOCK_FLOATS) -> _Plan:
    """The cached packing of ``indptr`` for rows of ``width`` floats, blocks of at most
    ``block_floats`` gathered floats."""
    key = (width, _PIECE, block_floats, len(indptr), hashlib.blake2b(indptr.tobytes(), digest_size=16).digest())
    plan = _plans.get(key)
    if plan is not None:
        _plans.move_to_end(key)
        return plan
    n = int(indptr[-1])
    piece_seg, piece_start, piece_len = _pieces(indptr)
    slots, blocks, offset = [], [], 0
    for block, L in _blocks(piece_len, width, block_floats):
        ent = _entries(block, L, piece_start, piece_len, n)
        slots.append(ent)
        blocks.append((offset, len(block), L, piece_seg[block]))
        offset += len(ent)
    plan = _Plan(np.concatenate(slots) if slots else np.zeros(0, np.int64), tuple(blocks))
    _plans[key] = plan
    total = sum(len(p.slots) for p in _plans.values())
    while len(_plans) > 1 and (len(_plans) > _PLAN_CACHE_SIZE or total > _PLAN_CACHE_SLOTS):
        total -= len(_plans.popitem(last=False)[1].slots)
    return plan


def segment_stats(
    factors: np.ndarray,
    index: np.ndarray,
    indptr: np.ndarray,
    weights: np.ndarray | None = None,
    targets: np.ndarray | Targets | None = None,
    *,
    order: np.ndarray | None = None,
) -> SegmentStats:
    """Weighted Gram matrices per segment (see module docstring).

    ``factors``: (n_src, d); ``index``: (N,) source row of each entry, grouped by segment with
    ``indptr`` (n_segments + 1,); ``weights``/``targets``: per entry (default 1 / 0; targets
    may be a :class:`Targets`), read at ``order[r]`` for entry r when ``order`` (N,) is given
    (saves gathering them into segment order first), else at r.
    """
    n = len(index)
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    _check_entries(n, indptr, weights, targets, order)
    dev = device.torch_device()  # the GPU path (fedpriv.util.device) replaces the CPU back ends
    if dev is not None and factors.shape[1] > 0 and len(indptr) > 1:
        return _segment_stats_device(dev, factors, index, indptr, weights, targets, order)
    targets = _host_targets(targets)
    lib = native.library() if dev is None else None
    if lib is not None and factors.shape[1] > 0 and len(indptr) > 1:
        return _segment_stats_native(lib, factors, index, indptr, weights, targets, order)
    _check_sources(index, len(factors), order, weights, targets)
    if order is not None:
        weights = None if weights is None else np.asarray(weights)[order]
        targets = None if targets is None else np.asarray(targets)[order]
    if n <= _SMALL_ENTRIES:  # one user's or a few users' ratings: numpy beats torch's op overhead
        return _segment_stats_small(factors, index, indptr, weights, targets)
    torch = _loaded_torch()
    if torch is None:
        return _segment_stats_numpy(factors, index, indptr, weights, targets)
    d = factors.shape[1]
    n_seg, width = len(indptr) - 1, d + 1
    plan = _plan(indptr, width)
    F, idx, sw, ty = (torch.from_numpy(x) for x in _padded_inputs(factors, index, weights, targets))
    slots = torch.from_numpy(plan.slots)
    G = torch.zeros((n_seg, width * width), dtype=torch.float32)
    most = max((pieces * L for _, pieces, L, _ in plan.blocks), default=0)
    buf = torch.empty(most * width, dtype=torch.float32)  # reused buffers: they stay in the cache
    src = torch.empty(most, dtype=torch.int64)
    swp = torch.empty(most, dtype=torch.float32)
    typ = torch.empty(most, dtype=torch.float32)
    for offset, pieces, L, segs in plan.blocks:
        m = pieces * L
        ent = slots[offset : offset + m]
        X = buf[: m * width].view(m, width)
        torch.index_select(F, 0, torch.index_select(idx, 0, ent, out=src[:m]), out=X)  # padding: F's zero row
        if targets is not None:
            X[:, d] = torch.index_select(ty, 0, ent, out=typ[:m])
        if weights is not None:
            X.mul_(torch.index_select(sw, 0, ent, out=swp[:m])[:, None])
        Xb = X.view(pieces, L, width)
        # accumulate per segment (2-D index_add_ is fast; several pieces may share a segment)
        G.index_add_(0, torch.from_numpy(segs), torch.bmm(Xb.transpose(1, 2), Xb).view(pieces, -1))
    G3 = G.view(n_seg, width, width).numpy()
    return SegmentStats(A=G3[:, :d, :d], b=G3[:, :d, d], c=G3[:, d, d])


def _device_plan(dev, indptr: np.ndarray, d: int) -> _Plan:
    """The packing of ``indptr`` for the device path (larger blocks on a GPU)."""
    return _plan(indptr, d + 1, _DEVICE_BLOCK_FLOATS if dev.type == "cuda" else _BLOCK_FLOATS)


def _segment_stats_device(dev, factors, index, indptr, weights, targets, order) -> SegmentStats:
    """:func:`segment_stats` on a device (the inputs built there: device_kernels.device_inputs)."""
    from . import device_kernels

    torch, d = device.torch_device_module(), factors.shape[1]
    padded = device_kernels.device_inputs(torch, dev, factors, index, weights, targets, order)
    A, b, c = device_kernels.stats_on_device(
        torch, dev, _device_plan(dev, indptr, d), padded, d, len(indptr) - 1, targets is not None, weights is not None
    )
    return SegmentStats(A=A, b=b, c=c)


def segment_solve(
    factors: np.ndarray,
    index: np.ndarray,
    indptr: np.ndarray,
    targets: np.ndarray | Targets,
    reg,
    extra: np.ndarray | None = None,
) -> np.ndarray:
    """x_s = (A_s + extra + reg_s I)^-1 b_s for the statistics of :func:`segment_stats` (unit
    weights, ``targets``): the users' local least squares. The same as ``solve_spd(A + extra,
    b, reg)``; on a device the Gram blocks stay there between the sums and the solves (no
    round trip through the host), and only the systems the float32 Cholesky rejects come back
    for the float64 fallback."""
    dev = device.torch_device()
    d = factors.shape[1]
    if dev is None or d == 0 or len(indptr) < 2:
        stats = segment_stats(factors, index, indptr, targets=targets)
        A = stats.A if extra is None else stats.A + extra.astype(np.float32)
        return solve_spd(A, stats.b, reg, overwrite_a=True)  # A: this call's own scratch
    from . import device_kernels

    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    _check_entries(len(index), indptr, None, targets, None)
    torch = device.torch_device_module()
    padded = device_kernels.device_inputs(torch, dev, factors, index, None, targets, None)
    x, rejected = device_kernels.stats_solve_on_device(
        torch, dev, _device_plan(dev, indptr, d), padded, d, len(indptr) - 1, reg, extra
    )
    if rejected is not None:  # the float64 least-squares fallback, on the CPU (as solve_spd's)
        bad, A_bad, b_bad = rejected
        x = device_kernels.set_rows_on_device(
            torch, dev, x, bad, _solve_spd_numpy(A_bad, b_bad, _reg_of(reg, len(x))[bad])
        )
    return device.DeviceArray(x, dev)  # the users' rows stay on the device for their item statistics


def stack_rows(pieces: list, width: int):
    """The row blocks ``pieces`` one after another, in float64 ((0, width) for none): on the
    device where they all are (:class:`fedpriv.util.device.DeviceArray` s), else on the host."""
    if pieces and all(isinstance(p, device.DeviceArray) for p in pieces):
        from . import device_kernels

        return device_kernels.stack_rows_on_device(device.torch_device_module(), pieces[0].device, pieces)
    if not pieces:
        return np.zeros((0, width))
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in pieces])


def released_rows(U, max_norm: float | None, column: float | None):
    """The rows of ``U`` as they enter a release: clipped to L2 norm ``max_norm``
    (:func:`fedpriv.privacy.clipping.clip_rows`; None: not clipped), then with a last column
    of ``column`` (None: none). Where ``U`` is on the device (a DeviceArray), there, in
    float64 (the same formula)."""
    if isinstance(U, device.DeviceArray):
        from . import device_kernels

        return device_kernels.released_rows_on_device(device.torch_device_module(), U.device, U, max_norm, column)
    if max_norm is not None:
        U = clip_rows(U, max_norm)
    if column is not None:
        U = np.hstack([U, np.full((len(U), 1), column)])
    return U


def sum_rows(shape: tuple, pieces) -> np.ndarray:
    """The float64 array of ``shape`` holding, at rows ``ids``, the sum of the pieces'
    ``values`` ((ids, values) pairs; the ids of a piece are distinct), added piece by piece. On a
    device the sums are made there, reading the pieces there where they are (a shard's item
    statistics), and stay there for the ledger's noise (a :class:`fedpriv.util.device.DeviceArray`):
    the same numbers (float64 additions in the same order)."""
    dev = device.torch_device()
    if dev is not None:
        from . import device_kernels

        return device_kernels.sum_rows_on_device(device.torch_device_module(), dev, tuple(shape), pieces)
    out = np.zeros(shape, dtype=np.float64)
    for ids, values in pieces:
        out[ids] += values
    return out


def clipped_gradient_rows(
    X: np.ndarray, theta: np.ndarray, rows: np.ndarray, items: np.ndarray, y: np.ndarray, clip: float
) -> tuple[np.ndarray, np.ndarray]:
    """Federated DP-SGD's client sum: every user's squared-error gradient with respect to the
    item parameters ``theta`` (n_items, d + 1), clipped to L2 norm ``clip``, summed over the
    users. ``X``: (n_users, d + 1) user rows [u_j, 1]; per rating: its user's row in ``X``
    (``rows``), its item and target ``y``. A user's gradient has norm 2 |X_j| sqrt(sum_i
    r_ij^2) (r: residuals), so clipping scales its residuals. Returns (item ids touched,
    (k, d + 1) gradient rows), in float64; on a device the per-rating products and sums run
    there."""
    dev = device.torch_device()
    if dev is not None and len(rows):
        from . import device_kernels

        return device_kernels.gradient_rows_on_device(device.torch_device_module(), dev, X, theta, rows, items, y, clip)
    d1 = X.shape[1]
    r = y - np.einsum("nd,nd->n", X[rows], theta[items])
    sq = np.bincount(rows, weights=r * r, minlength=len(X))
    norm = 2.0 * np.linalg.norm(X, axis=1) * np.sqrt(sq)
    scale = np.minimum(1.0, clip / np.maximum(norm, 1e-12))
    coef = -2.0 * r * scale[rows]
    keep = coef != 0
    ids, inv = np.unique(items[keep], return_inverse=True)
    G = X[rows[keep]] * coef[keep, None]
    out = (
        np.stack([np.bincount(inv, weights=G[:, k], minlength=len(ids)) for k in range(d1)], axis=1)
        if len(ids)
        else np.zeros((0, d1))
    )
    return ids.astype(np.int64), out


def _reg_of(reg, n: int) -> np.ndarray:
    """The ridge of each of ``n`` systems (a scalar or one per system), float64."""
    return np.broadcast_to(np.asarray(reg, dtype=np.float64), (n,))


def _check_entries(n: int, indptr: np.ndarray, weights, targets, order) -> None:
    if len(indptr) == 0 or indptr[0] != 0 or indptr[-1] != n or (len(indptr) > 1 and np.any(indptr[1:] < indptr[:-1])):
        raise ValueError(f"segment_stats: indptr must rise from 0 to the {n} entries")
    if order is not None and len(order) != n:
        raise ValueError(f"segment_stats: order has {len(order)} entries, index has {n}")
    if order is None:
        for name, a in (("weights", weights), ("targets", targets)):
            if a is not None and len(a) != n:
                raise ValueError(f"segment_stats: {name} has {len(a)} entries, index has {n}")
    elif weights is not None and targets is not None and len(weights) != len(targets):
        raise ValueError(f"segment_stats: weights ({len(weights)}) and targets ({len(targets)}) differ in length")


def _value_count(index, weights, targets) -> int:
    """How many per-entry values there are to read (``order`` indexes into these)."""
    return len(weights if weights is not None else targets if targets is not None else index)


def _check_sources(index, n_src: int, order, weights, targets) -> None:
    """The fallback paths' bounds check (numpy would wrap negative indices around)."""
    for name, a, size in (("index", index, n_src), ("order", order, _value_count(index, weights, targets))):
        if a is not None and len(a) and (np.min(a) < 0 or np.max(a) >= size):
            raise IndexError(f"segment_stats: {name} holds entries outside 0..{size - 1}")


def _segment_stats_native(lib, factors, index, indptr, weights, targets, order) -> SegmentStats:
    """The fused C kernel (:mod:`fedpriv.algorithms.native`), its segments split over the
    threads in ranges of about equal entry counts."""
    F = np.ascontiguousarray(factors, dtype=np.float32)
    index = np.ascontiguousarray(index, dtype=np.int64)
    w = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    y = None if targets is None else np.ascontiguousarray(targets, dtype=np.float64)
    order = None if order is None else np.ascontiguousarray(order, dtype=np.int64)
    n_wy = len(index) if order is None else _value_count(index, w, y)  # order has len(index) entries (checked)
    n_seg, d = len(indptr) - 1, F.shape[1]
    A = np.empty((n_seg, d, d), dtype=np.float32)
    b = np.empty((n_seg, d), dtype=np.float32)
    c = np.empty(n_seg, dtype=np.float32)
    n = len(index)
    parts = thread_count() if n * d >= _NATIVE_THREADED_FLOATS else 1
    bounds = np.unique(
        np.concatenate([[0], np.searchsorted(indptr, np.arange(1, parts) * n // parts), [n_seg]]).clip(0, n_seg)
    )

    def run(s: slice) -> None:
        native.native_segment_stats(
            lib, F, index, indptr, int(bounds[s.start]), int(bounds[s.stop]), w, y, order, n_wy, A, b, c
        )

    map_chunks(run, len(bounds) - 1, min_chunk=1)
    return SegmentStats(A=A, b=b, c=c)


def _size_classes(piece_len: np.ndarray) -> list[np.ndarray]:
    """Pieces grouped by size class (ratio sqrt(2): padding waste < 1.42x)."""
    size_class = np.floor(2.0 * np.log2(np.maximum(piece_len, 1))).astype(np.int64)
    order = np.argsort(size_class, kind="stable")
    return [c for c in np.split(order, np.flatnonzero(np.diff(size_class[order])) + 1) if len(c)]


def _blocks(piece_len: np.ndarray, width: int, block_floats: int = _BLOCK_FLOATS):
    """(pieces, padded length L) of every block: pieces of one size class, at most
    ``block_floats`` floats of gathered rows per block."""
    for cls in _size_classes(piece_len):
        L = int(piece_len[cls].max())
        B = max(1, block_floats // (L * width))
        for b0 in range(0, len(cls), B):
            yield cls[b0 : b0 + B], L


def _entries(block: np.ndarray, L: int, piece_start: np.ndarray, piece_len: np.ndarray, pad: int) -> np.ndarray:
    """Entry index of every padded slot of a block, row-major (``pad``: the zero-weight slot)."""
    ar = np.arange(L)
    return np.where(ar[None, :] < piece_len[block][:, None], piece_start[block][:, None] + ar[None, :], pad).reshape(-1)


def _padded_inputs(factors, index, weights, targets) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Both back ends' inputs: the source table with a spare last column (filled with sqrt(w) y
    per entry) and a zero padding row; per-entry source rows, sqrt weights and targets, each with
    one extra padding slot of weight 0 (float32; one pass over each input)."""
    n_src, d = factors.shape
    n = len(index)
    F = np.zeros((n_src + 1, d + 1), dtype=np.float32)
    F[:n_src, :d] = factors
    idx = np.empty(n + 1, dtype=np.int64)
    idx[:n] = index
    idx[n] = n_src
    sw = np.zeros(n + 1, dtype=np.float32)
    if weights is not None:
        np.maximum(weights, 0.0, out=sw[:n], casting="unsafe")
        np.sqrt(sw, out=sw)
    else:
        sw[:n] = 1.0
    ty = np.zeros(n + 1, dtype=np.float32)
    if targets is not None:
        ty[:n] = targets
    return F, idx, sw, ty


def _segment_stats_numpy(factors, index, indptr, weights, targets) -> SegmentStats:
    """The torch path's algorithm in numpy (the same cached packing, one batched GEMM per block)."""
    d = factors.shape[1]
    n_seg, width = len(indptr) - 1, d + 1
    F, idx, sw, ty = _padded_inputs(factors, index, weights, targets)
    plan = _plan(indptr, width)
    G = np.zeros((n_seg, width * width), dtype=np.float32)
    for offset, pieces, L, segs in plan.blocks:
        ent = plan.slots[offset : offset + pieces * L]
        X = F[idx[ent]]
        X[:, d] = ty[ent]
        X *= sw[ent][:, None]
        Xb = X.reshape(pieces, L, width)
        P = np.matmul(Xb.transpose(0, 2, 1), Xb).reshape(pieces, -1)
        np.add.at(G, segs, P)  # several pieces may share a segment
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


def solve_spd(A: np.ndarray, b: np.ndarray, reg: np.ndarray | float, *, overwrite_a: bool = False) -> np.ndarray:
    """Solve (A_s + reg_s I) x_s = b_s for a batch of symmetric PSD systems.

    Float32 Cholesky for speed; systems it rejects (not positive definite, e.g. zero reg on a
    singular Gram matrix) are solved again in float64 by least squares. Large batches are split
    over the kernels' threads. ``overwrite_a``: a float32 ``A`` may be used as scratch (its
    diagonal gets the ridge), saving a copy.
    """
    dev = device.torch_device()
    if dev is not None and len(A):
        from . import device_kernels

        x = device_kernels.solve_on_device(device.torch_device_module(), dev, A, b, reg)
        bad = ~np.isfinite(x).all(axis=-1)
        if bad.any():  # the float64 least-squares fallback, on the CPU
            x[bad] = _solve_spd_numpy(np.asarray(A)[bad], np.asarray(b)[bad], _reg_of(reg, len(A))[bad])
        return x
    torch = _loaded_torch()
    if len(A) <= _SMALL_SYSTEMS or torch is None:  # a node's users: numpy, without torch's per-op overhead
        return _solve_spd_numpy(A, b, reg)
    At = torch.from_numpy(np.asarray(A))
    if not (overwrite_a and At.dtype == torch.float32):
        At = At.to(torch.float32, copy=True)
    n = At.shape[0]
    reg_t = torch.from_numpy(np.broadcast_to(np.asarray(reg, dtype=np.float32), (n,)).copy())
    At.diagonal(dim1=-2, dim2=-1).add_(reg_t[:, None])
    bt = torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32))[..., None]
    x = torch.empty((n, At.shape[-1]), dtype=torch.float64)
    bad = torch.zeros(n, dtype=torch.bool)

    def part(s: slice) -> None:
        L, info = torch.linalg.cholesky_ex(At[s])
        y = torch.linalg.solve_triangular(L, bt[s], upper=False)
        x[s] = torch.linalg.solve_triangular(L.mT, y, upper=True)[..., 0]
        bad[s] = (info != 0) | ~torch.isfinite(x[s]).all(dim=-1)

    map_chunks(
        part, n, min_chunk=max(256, (1 << 24) // max(1, At.shape[-1]) ** 3)
    )  # small systems: threads cost more than they save
    if bad.any():
        Ab = At[bad].to(torch.float64)
        # numpy's driver (SVD, the minimum-norm solution): the default gelsy returned zeros for
        # a rank-1 system after some other tests had run in the same process
        x[bad] = torch.linalg.lstsq(Ab, bt[bad].to(torch.float64), driver="gelsd").solution[..., 0]
    return x.numpy()


def sparse_gram(X) -> np.ndarray:
    """X^T X of a scipy sparse matrix (users x M), dense float64: scipy on the CPU; on a device,
    blocks of rows densified there and multiplied in float32 (exact for 0/1 rows up to 2^24 per
    entry; unit-normalized rows to float32 rounding), accumulated in float64."""
    dev = device.torch_device()
    if dev is None:
        return np.asarray((X.T @ X).toarray(), dtype=np.float64)
    torch = device.torch_device_module()
    X = X.tocsr()
    m = X.shape[1]
    G = torch.zeros((m, m), dtype=torch.float64, device=dev)
    rows = max(1, (1 << 26) // max(m, 1))  # at most 256 MB of dense float32 rows per block
    for start in range(0, X.shape[0], rows):
        B = X[start : start + rows].tocoo()
        D = torch.zeros((B.shape[0], m), dtype=torch.float32, device=dev)
        D[torch.from_numpy(B.row.astype(np.int64)).to(dev), torch.from_numpy(B.col.astype(np.int64)).to(dev)] = (
            torch.from_numpy(B.data.astype(np.float32)).to(dev)
        )
        G += (D.T @ D).to(torch.float64)
    return G.cpu().numpy()


def _torch_csr(torch, X, dev):
    """A scipy CSR matrix as a float32 torch sparse CSR tensor on ``dev``."""
    import warnings

    if not X.has_sorted_indices:
        X = X.copy()
        X.sort_indices()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        T = torch.sparse_csr_tensor(
            torch.from_numpy(X.indptr.astype(np.int64)),
            torch.from_numpy(X.indices.astype(np.int64)),
            torch.from_numpy(X.data.astype(np.float32)),
            size=X.shape,
            check_invariants=True,
        )
    return T.to(dev)


def sparse_sketch(X, Q: np.ndarray) -> np.ndarray:
    """X^T (X Q) of a scipy sparse X (users x M) and a dense Q (M x d), float64: scipy on the
    CPU; on a device, torch's sparse CSR products there (float32)."""
    dev = device.torch_device()
    if dev is None or X.nnz == 0:
        return np.asarray(X.T @ (X @ Q), dtype=np.float64)
    torch = device.torch_device_module()
    X = X.tocsr()
    P = _torch_csr(torch, X, dev) @ torch.from_numpy(np.ascontiguousarray(Q, dtype=np.float32)).to(dev)
    return (_torch_csr(torch, X.T.tocsr(), dev) @ P).to(torch.float64).cpu().numpy()


def inverse(M: np.ndarray) -> np.ndarray:
    """The inverse of one symmetric positive definite matrix (float64), on the current device."""
    dev = device.torch_device()
    if dev is not None and M.size:
        from . import device_kernels

        return device_kernels.inverse_on_device(device.torch_device_module(), dev, M)
    return np.linalg.inv(M)


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


def _symmetric_and_inside(torch, A: np.ndarray, floor: float):
    """(float32 symmetrised A as a torch tensor, mask of the matrices with A - floor I positive
    definite by a Cholesky test: those already in {X >= floor I}, up to float32 rounding)."""
    At = torch.from_numpy(np.ascontiguousarray(A, dtype=np.float32))
    At = 0.5 * (At + At.transpose(-1, -2))
    n, d = At.shape[0], At.shape[-1]
    inside = torch.zeros(n, dtype=torch.bool)
    eye = torch.eye(d, dtype=torch.float32) * floor

    def check(s: slice) -> None:
        inside[s] = torch.linalg.cholesky_ex(At[s] - eye)[1] == 0

    map_chunks(check, n, min_chunk=max(256, (1 << 24) // max(1, d) ** 3))
    return At, inside


def project_psd(A: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Project a batch of symmetric matrices onto {X : X >= floor I} (eigenvalue clipping).

    Matrices whose Cholesky factorisation of X - floor I succeeds are already in the set (up to
    float32 rounding) and are returned symmetrised; only the others are eigen-decomposed. Both
    passes are split over the kernels' threads."""
    dev = device.torch_device()
    if dev is not None and len(A):
        from . import device_kernels

        return device_kernels.psd_on_device(device.torch_device_module(), dev, A, floor)
    torch = _loaded_torch()
    if torch is None:
        A32 = np.asarray(A, dtype=np.float32)
        A32 = 0.5 * (A32 + A32.transpose(0, 2, 1))
        evals, evecs = np.linalg.eigh(A32)
        return (evecs * np.maximum(evals, floor)[..., None, :]) @ evecs.transpose(0, 2, 1)
    At, inside = _symmetric_and_inside(torch, A, floor)
    outside = torch.nonzero(~inside).flatten()
    if len(outside):
        B = At[outside]

        def project(s: slice) -> None:
            evals, evecs = torch.linalg.eigh(B[s])
            B[s] = (evecs * torch.clamp(evals, min=floor)[..., None, :]) @ evecs.transpose(-1, -2)

        map_chunks(
            project, len(outside), min_chunk=256
        )  # eigh: about 10 us per 10 x 10 matrix, well above a thread handoff
        At[outside] = B
    return At.numpy()


def project_psd_solve(A: np.ndarray, b: np.ndarray, floor: float, reg: float) -> np.ndarray:
    """``solve_spd(project_psd(A, floor), b, reg)`` in one pass: matrices already above the floor
    (a Cholesky test) are solved directly; the others are solved from their eigendecomposition,
    x = Q diag(1 / (max(lambda, floor) + reg)) Q^T b, without rebuilding the projected matrix
    (with floor + reg <= 0 that division is undefined: the two steps then run as they are, and
    solve_spd's least-squares fallback takes the singular systems)."""
    dev = device.torch_device()
    if dev is not None and len(A) and floor + reg > 0:
        from . import device_kernels

        return device_kernels.psd_solve_on_device(device.torch_device_module(), dev, A, b, floor, reg)
    torch = _loaded_torch()
    if torch is None or len(A) <= _SMALL_SYSTEMS or floor + reg <= 0:
        return solve_spd(project_psd(A, floor), b, reg)
    At, inside = _symmetric_and_inside(torch, A, floor)
    n, d = At.shape[0], At.shape[-1]
    x = np.zeros((n, d), dtype=np.float64)
    ins = inside.numpy()
    if ins.any():
        x[ins] = solve_spd(At[inside].numpy(), np.asarray(b)[ins], reg, overwrite_a=True)
    out = np.flatnonzero(~ins)
    if len(out):
        B = At[torch.from_numpy(out)]
        bt = torch.from_numpy(np.ascontiguousarray(np.asarray(b)[out], dtype=np.float32))
        xo = torch.empty((len(out), d), dtype=torch.float32)

        def solve(s: slice) -> None:
            evals, evecs = torch.linalg.eigh(B[s])
            coef = (evecs.transpose(-1, -2) @ bt[s][..., None])[..., 0] / (torch.clamp(evals, min=floor) + reg)
            xo[s] = (evecs @ coef[..., None])[..., 0]

        map_chunks(solve, len(out), min_chunk=256)  # eigh: about 10 us per 10 x 10 matrix, well above a thread handoff
        x[out] = xo.numpy()
    return x
