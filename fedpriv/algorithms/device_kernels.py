"""The statistics kernels in torch on a device (:mod:`fedpriv.util.device`): the GPU path.

The same sums and solves as :mod:`fedpriv.algorithms.kernels`, in float32 like its CPU back
ends: segment Gram matrices by the CPU path's cached packing (segments cut into pieces, packed
by size class into padded blocks, one batched GEMM per block, accumulated per segment with
``index_add_``), batched Cholesky solves, and eigenvalue clipping. Only
:mod:`fedpriv.algorithms.kernels` calls these; they take numpy arrays (or DeviceArrays) and
return numpy arrays or DeviceArrays, which read as numpy arrays, so every caller is unchanged.

What does not change from one call to the next stays on the device: the packing of a segment
layout, and a shard's read-only arrays (its ratings, their items, users and item order, and its
rating weights, fixed for a run), kept by :func:`fedpriv.util.device.keep` while they live. The
client's targets (:class:`kernels.Targets`), the weights' square roots, the gathers into
segment order and the padding are made on the device. The item side of a step stays there:
the item statistics and their sums are :class:`fedpriv.util.device.DeviceArray` s, which the
ledger's device noise reads and leaves there too, and the server's solve reads the release
where it is; the solves' results (user and item factors) come back to the host.
:data:`fedpriv.util.device.transfers` counts the bytes that cross."""

from __future__ import annotations

import weakref

import numpy as np

from ..util import device
from ..util.device import transfers


def _t(torch, x, dev, dtype=None):
    """``x`` as a contiguous tensor on ``dev``, this call's own
    (:func:`fedpriv.util.device.as_tensor`): a DeviceArray, or a read-only array with a kept
    device copy (a release the ledger noised on the device), is copied there, not from the
    host. A strided view is made contiguous by torch: numpy's strided copy of 70,000 blocks of
    32 x 32 floats took 1.27 s on the CI machine, torch's 0.21 s."""
    return device.as_tensor(x, dev, dtype, own=True)


def _host(t) -> np.ndarray:
    """A device tensor as a numpy array on the host (counted in :data:`fedpriv.util.device.transfers`)."""
    transfers["to_host"] += t.numel() * t.element_size()
    return t.cpu().numpy()


def resident(torch, dev, arr: np.ndarray, pad: int | None = None):
    """The integer array ``arr`` as an int64 tensor on ``dev`` (with ``pad`` appended), and its
    (min, max). An array whose memory is read-only (a shard's index arrays, and views of them)
    is copied once and kept while it lives (:func:`fedpriv.util.device.keep`); another is copied
    on every call. The tensor is shared: the caller must not write to it."""
    arr = np.asarray(arr)

    def make():
        t = torch.from_numpy(np.array(arr, dtype=np.int64))
        transfers["to_device"] += t.numel() * 8
        t = t.to(dev)
        bounds = (int(t.min()), int(t.max())) if t.numel() else (0, -1)
        if pad is not None:
            t = torch.cat([t, torch.tensor([pad], dtype=torch.int64, device=dev)])
        return t, bounds

    return device.kept_or_make(arr, dev, ("index", pad), make)


def _plan_tensors(torch, dev, plan):
    """The packing ``plan``'s slots and per-block segments on ``dev``, copied once per plan."""
    key = str(dev)
    got = plan.resident.get(key)
    if got is None:
        got = plan.resident[key] = (_t(torch, plan.slots, dev), [_t(torch, segs, dev) for _, _, _, segs in plan.blocks])
    return got


def _per_entry(torch, dev, values, order, order_t, n: int, sqrt: bool):
    """Per-entry values as float32 on the device in segment order, with the padding slot's 0
    appended (``sqrt``: the square roots of the weights, negative ones counting as 0). Kept on
    the device for read-only ``values`` in a read-only ``order`` (a shard's rating weights,
    fixed for a run, in its item order), checked to be that very order. Shared: the caller must
    not write to it."""
    values = np.asarray(values)
    order = None if order is None else np.asarray(order)
    order_root = None if order is None else device.read_only_root(order)
    keep = order is None or order_root is not None  # an order that may change: nothing kept
    tag = (
        "entries",
        sqrt,
        n,
        None if order is None else (order.__array_interface__["data"][0], order.shape, order.strides),
    )
    hit = device.kept(values, dev, tag) if keep else None
    if hit is not None and (order is None or hit[1]() is order_root):
        return hit[0]
    v = _t(torch, np.asarray(values, dtype=np.float32), dev)
    if order_t is not None:
        v = v.index_select(0, order_t)
    out = torch.zeros(n + 1, dtype=torch.float32, device=dev)
    out[:n] = torch.sqrt(torch.clamp(v, min=0.0)) if sqrt else v
    if keep:
        device.keep(values, dev, (out, weakref.ref(order_root) if order is not None else None), tag)
    return out


def _values(torch, dev, arr):
    """A float array as a float64 tensor on ``dev``: kept there when read-only (a shard's
    ratings), else copied. Shared: the caller must not write to it."""
    arr = np.asarray(arr)
    return device.kept_or_make(arr, dev, "float64", lambda: _t(torch, arr, dev, torch.float64))


def _targets_on_device(torch, dev, targets, order_t, n: int):
    """A :class:`kernels.Targets` made on the device as :meth:`kernels.Targets.values` makes it
    on the host (float64, the same operations in the same order), then float32 in segment
    order with the padding slot's 0."""
    if targets.base is None:
        y = torch.ones(n, dtype=torch.float64, device=dev)
    else:
        y = _values(torch, dev, targets.base) - targets.shift
    for table, index in targets.terms:
        table = (
            table if isinstance(table, device.DeviceArray) else np.asarray(table)
        )  # a user bias solved on the device is read there
        idx, (lo, hi) = resident(torch, dev, index)
        if n and (lo < 0 or hi >= len(table)):
            raise IndexError(f"targets: index holds entries outside 0..{len(table) - 1}")
        y = y - _t(torch, table, dev, torch.float64).index_select(0, idx)
    if targets.clip is not None:  # fedpriv.privacy.clipping.clip_values
        y = torch.where(torch.isfinite(y), y, torch.zeros((), dtype=y.dtype, device=dev))
        if np.isfinite(targets.clip):
            y = torch.clamp(y, -targets.clip, targets.clip)
    y = y.to(torch.float32)
    if order_t is not None:
        y = y.index_select(0, order_t)
    out = torch.zeros(n + 1, dtype=torch.float32, device=dev)
    out[:n] = y
    return out


def device_inputs(torch, dev, factors, index, weights, targets, order):
    """The padded inputs of :func:`kernels._padded_inputs` built on the device: the source table
    with a spare column and a zero row, the source row of every entry (resident), and the
    per-entry square-root weights and targets in segment order (``order``: read at ``order[r]``
    for entry r, resident). Raises IndexError for an index or order outside its range."""
    n_src, d = factors.shape
    n = len(index)

    def padded_factors():
        F = torch.zeros((n_src + 1, d + 1), dtype=torch.float32, device=dev)
        F[:n_src, :d] = _t(torch, factors, dev, torch.float32)
        return F

    F = device.kept_or_make(
        factors, dev, "padded", padded_factors
    )  # kept for read-only factors (the item factors of a user solve in chunks)
    idx, (lo, hi) = resident(torch, dev, index, pad=n_src)
    if n and (lo < 0 or hi >= n_src):
        raise IndexError(f"segment_stats: index holds entries outside 0..{n_src - 1}")
    order_t = None
    if order is not None:
        order_t, (lo, hi) = resident(torch, dev, order)
        size = len(weights if weights is not None else targets if targets is not None else index)
        if n and (lo < 0 or hi >= size):
            raise IndexError(f"segment_stats: order holds entries outside 0..{size - 1}")
    if weights is not None:
        sw = _per_entry(torch, dev, weights, order, order_t, n, True)
    else:
        sw = torch.ones(n + 1, dtype=torch.float32, device=dev)
        sw[n] = 0.0
    if targets is None:
        ty = torch.zeros(n + 1, dtype=torch.float32, device=dev)
    elif hasattr(targets, "terms"):  # a kernels.Targets: made here
        ty = _targets_on_device(torch, dev, targets, order_t, n)
    else:
        ty = _per_entry(torch, dev, targets, order, order_t, n, False)
    return F, idx, sw, ty


def stats_on_device(torch, dev, plan, padded, d: int, n_seg: int, has_targets: bool, has_weights: bool):
    """(A, b, c) of every segment from the packing ``plan`` of :func:`kernels._plan` and the
    padded inputs of :func:`device_inputs`."""
    G = _gram_on_device(torch, dev, plan, padded, d, n_seg, has_targets, has_weights)
    return (
        device.DeviceArray(G[:, :d, :d], dev),
        device.DeviceArray(G[:, :d, d], dev),
        device.DeviceArray(G[:, d, d], dev),
    )


def sum_rows_on_device(torch, dev, shape: tuple, pieces) -> device.DeviceArray:
    """:func:`kernels.sum_rows` on the device: float64 sums there (pieces on the device are read
    there), left there for the ledger's noise."""
    out = torch.zeros(shape, dtype=torch.float64, device=dev)
    for ids, values in pieces:
        if len(ids):
            out.index_add_(0, _t(torch, ids, dev, torch.int64), _t(torch, values, dev, torch.float64))
    return device.DeviceArray(out, dev)


def _gram_on_device(torch, dev, plan, padded, d: int, n_seg: int, has_targets: bool, has_weights: bool):
    """The (n_seg, d + 1, d + 1) Gram blocks [A b; b^T c] of every segment, on the device."""
    F, idx, sw, ty = padded
    slots, segs_t = _plan_tensors(torch, dev, plan)
    width = d + 1
    G = torch.zeros((n_seg, width * width), dtype=torch.float32, device=dev)
    for (offset, pieces, L, _), segs in zip(plan.blocks, segs_t):
        ent = slots[offset : offset + pieces * L]
        X = F.index_select(0, idx.index_select(0, ent))
        if has_targets:
            X[:, d] = ty.index_select(0, ent)
        if has_weights:
            X.mul_(sw.index_select(0, ent)[:, None])
        Xb = X.view(pieces, L, width)
        G.index_add_(0, segs, torch.bmm(Xb.transpose(1, 2), Xb).view(pieces, -1))
    return G.view(n_seg, width, width)


def solve_on_device(torch, dev, A, b, reg) -> np.ndarray:
    """x_s = (A_s + reg_s I)^-1 b_s: float32 Cholesky on the device; the systems it rejects are
    returned as NaN rows for the caller's float64 least-squares fallback."""
    return _host(_cholesky(torch, dev, _t(torch, A, dev, torch.float32), _t(torch, b, dev, torch.float32), reg))


def _cholesky(torch, dev, At, bt, reg):
    """The float64 solutions of (At + reg I) x = bt on the device (At is overwritten); NaN rows
    for the systems the float32 Cholesky rejects."""
    diagonal = At.diagonal(dim1=-2, dim2=-1)
    if np.ndim(reg) == 0:  # one ridge for all: nothing to copy to the device
        diagonal.add_(float(np.float32(reg)))
    else:
        diagonal.add_(_t(torch, np.broadcast_to(np.asarray(reg, dtype=np.float32), (len(At),)), dev)[:, None])
    L, info = torch.linalg.cholesky_ex(At)
    x = torch.cholesky_solve(bt[..., None], L)[..., 0].to(torch.float64)
    bad = (info != 0) | ~torch.isfinite(x).all(dim=-1)
    x[bad] = float("nan")
    return x


def stats_solve_on_device(torch, dev, plan, padded, d: int, n_seg: int, reg, extra=None):
    """The solutions x_s = (A_s + extra + reg_s I)^-1 b_s of every segment's statistics (with
    targets), a float64 tensor on the device (the Gram blocks never leave it); and, for the
    systems the float32 Cholesky rejects (NaN rows of x), their rows and (A_s + extra, b_s) on
    the host for the float64 fallback (:func:`set_rows_on_device` puts its solutions in x)."""
    G = _gram_on_device(torch, dev, plan, padded, d, n_seg, True, False)
    extra_t = _t(torch, extra, dev, torch.float32) if extra is not None else None
    At = G[:, :d, :d].contiguous()  # the solves' scratch (G keeps the sums for the fallback)
    if extra_t is not None:
        At += extra_t
    bt = G[:, :d, d].contiguous()
    x = _cholesky(torch, dev, At, bt, reg)
    bad = torch.isnan(x).any(dim=-1)
    if not bad.any():
        return x, None
    A_bad = G[bad][:, :d, :d]
    if extra_t is not None:
        A_bad = A_bad + extra_t
    return x, (_host(bad), _host(A_bad), _host(bt[bad]))


def set_rows_on_device(torch, dev, x, rows: np.ndarray, values: np.ndarray):
    """``x`` (a tensor on the device) with the rows where ``rows`` (a host mask) is set replaced
    by ``values`` (host)."""
    x[_t(torch, rows, dev)] = _t(torch, values, dev, x.dtype)
    return x


def stack_rows_on_device(torch, dev, pieces: list) -> device.DeviceArray:
    """The DeviceArrays ``pieces`` one after another (rows), on the device, in float64."""
    return device.DeviceArray(torch.cat([_t(torch, p, dev, torch.float64) for p in pieces]), dev)


def released_rows_on_device(torch, dev, U, max_norm: float | None, column: float | None) -> device.DeviceArray:
    """:func:`kernels.released_rows` on the device, in float64: the rows with a non-finite
    entry zeroed, each row scaled to L2 norm at most ``max_norm``
    (:func:`fedpriv.privacy.clipping.clip_rows`'s formula), then a column of ``column``."""
    x = _t(torch, U, dev, torch.float64)
    x = torch.where(torch.isfinite(x).all(dim=-1, keepdim=True), x, torch.zeros((), dtype=x.dtype, device=dev))
    if max_norm is not None and np.isfinite(max_norm):
        norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        x = x * torch.clamp(max_norm / torch.clamp(norms, min=1e-30), max=1.0)
    if column is not None:
        x = torch.cat([x, torch.full((len(x), 1), float(column), dtype=x.dtype, device=dev)], dim=1)
    return device.DeviceArray(x, dev)


def gradient_rows_on_device(torch, dev, X, theta, rows, items, y, clip: float):
    """:func:`kernels.clipped_gradient_rows` on the device, in float64: the residuals, the
    users' norms and clipping, and the per-item sums (``index_add_``)."""
    Xt, th = _t(torch, X, dev, torch.float64), _t(torch, theta, dev, torch.float64)
    rt, it = _t(torch, rows, dev, torch.int64), _t(torch, items, dev, torch.int64)
    Xr = Xt.index_select(0, rt)
    r = _t(torch, y, dev, torch.float64) - (Xr * th.index_select(0, it)).sum(dim=1)
    sq = torch.zeros(len(Xt), dtype=torch.float64, device=dev).index_add_(0, rt, r * r)
    norm = 2.0 * torch.linalg.vector_norm(Xt, dim=1) * torch.sqrt(sq)
    scale = torch.clamp(clip / torch.clamp(norm, min=1e-12), max=1.0)
    coef = -2.0 * r * scale.index_select(0, rt)
    keep = coef != 0
    ids = torch.unique(it[keep])
    full = torch.zeros((len(th), Xt.shape[1]), dtype=torch.float64, device=dev).index_add_(
        0, it[keep], Xr[keep] * coef[keep, None]
    )
    return _host(ids).astype(np.int64), _host(full.index_select(0, ids))


#: cuSOLVER's batched eigensolver (syevjBatched) takes matrices up to 32 x 32; above, torch
#: decomposes a CUDA batch one matrix after another: measured on an H100, 20,000 matrices of
#: 33 x 33 took 13 s there against 1.7 s on the CPU (and 0.012 s at 32 x 32)
_CUDA_BATCHED_EIGH = 32
#: the device types whose clipping above that size takes the matrix sign function on the device
#: (:func:`_sign`) instead of an eigendecomposition; elsewhere eigh decomposes them (on torch's CPU
#: device it is faster; a test adds "cpu" to run this path everywhere)
SIGN_ITERATION = {"cuda"}
#: the sign iteration's most steps, and its matrices per pass (float64: 512 MB each at d = 128)
_SIGN_STEPS, _SIGN_CHUNK_BYTES = 40, 1 << 29


def _eigh(torch, X):
    """torch.linalg.eigh of a batch; where the device would decompose it one matrix after
    another, on the CPU, split over the kernels' threads (measured on the H100 for 20,000
    indefinite 33 x 33 matrices: 13 s on the GPU, 2.1 s as one CPU call, 0.2 s threaded)."""
    if X.is_cuda and X.shape[-1] > _CUDA_BATCHED_EIGH and len(X) > 1:
        from ..util.threads import map_chunks

        Xc = X.cpu()
        evals = torch.empty(Xc.shape[:-1], dtype=Xc.dtype)
        evecs = torch.empty_like(Xc)

        def part(sl: slice) -> None:
            evals[sl], evecs[sl] = torch.linalg.eigh(Xc[sl])

        map_chunks(part, len(Xc), min_chunk=256)
        return evals.to(X.device), evecs.to(X.device)
    return torch.linalg.eigh(X)


def _sign(torch, B):
    """The matrix sign function of a batch of symmetric float64 matrices, and which converged.

    Newton's iteration X <- (mu X + (mu X)^-1) / 2 from X = B, with each matrix's own scaling
    mu = sqrt(|X^-1|_F / |X|_F) (Higham, Functions of Matrices, 5.3), while the step is large:
    its limit is Q diag(sign(lambda)) Q^T, so (B + sign(B) B) / 2 is B with its negative
    eigenvalues set to 0 (B's eigenvalue clipping at 0), from batched inverses only. In float64 a
    spread of 1e7 between B's largest and smallest eigenvalues takes about 10 steps. A matrix
    whose inverse fails (B singular), whose entries are not finite, or that has not converged
    after :data:`_SIGN_STEPS` steps is reported (the caller decomposes it instead). The host
    waits once per check from the sixth step on."""
    X, ok = B, torch.ones(len(B), dtype=torch.bool, device=B.device)
    scale = torch.ones(len(B), 1, 1, dtype=B.dtype, device=B.device)
    for step in range(1, _SIGN_STEPS + 1):
        inv, info = torch.linalg.inv_ex(X)
        ok &= info == 0
        norm = X.flatten(1).norm(dim=1)[:, None, None]
        mu = torch.where(scale > 0, torch.sqrt(inv.flatten(1).norm(dim=1)[:, None, None] / norm), 1.0)
        nxt = 0.5 * (mu * X + inv / mu)
        change = ((nxt - X).flatten(1).norm(dim=1) / nxt.flatten(1).norm(dim=1))[:, None, None]
        ok &= torch.isfinite(change[:, 0, 0])
        X = torch.where(ok[:, None, None], nxt, X)
        scale = torch.where(change < 1e-2, 0.0, scale)  # near the limit: unscaled, quadratic
        if step >= 6 and not bool((ok & (change[:, 0, 0] > 1e-13)).any()):
            break
    return X, ok & (change[:, 0, 0] <= 1e-13)


def _by_sign(At) -> bool:
    """Whether the clipping of the batch ``At`` takes the sign iteration (:data:`SIGN_ITERATION`)."""
    return At.device.type in SIGN_ITERATION and At.shape[-1] > _CUDA_BATCHED_EIGH and len(At) > 1


def _sign_clipped(torch, At, floor: float):
    """Eigenvalue clipping at ``floor`` of the symmetric float32 batch ``At`` by :func:`_sign`, a
    chunk at a time: yields (the chunk's slice, its clipped matrices in float64, which of them
    converged). Float64 keeps the solves after it as accurate as the eigendecomposition's."""
    d = At.shape[-1]
    eye = torch.eye(d, dtype=torch.float64, device=At.device)
    chunk = max(1, _SIGN_CHUNK_BYTES // (8 * d * d))
    for lo in range(0, len(At), chunk):
        sl = slice(lo, min(lo + chunk, len(At)))
        B = At[sl].to(torch.float64) - floor * eye
        S, ok = _sign(torch, B)
        P = 0.5 * (B + S @ B)
        yield sl, 0.5 * (P + P.transpose(-1, -2)) + floor * eye, ok


def _clip_by_eigh(torch, At, floor: float):
    evals, evecs = _eigh(torch, At)
    return (evecs * torch.clamp(evals, min=floor)[..., None, :]) @ evecs.transpose(-1, -2)


def _clipped_solve_by_eigh(torch, At, bt, floor: float, reg: float):
    """x = Q diag(1 / (max(lambda, floor) + reg)) Q^T b, without rebuilding the clipped matrix."""
    evals, evecs = _eigh(torch, At)
    coef = (evecs.transpose(-1, -2) @ bt[..., None])[..., 0] / (torch.clamp(evals, min=floor) + reg)
    return (evecs @ coef[..., None])[..., 0]


def _clip(torch, At, floor: float):
    """The symmetric float32 batch ``At`` with its eigenvalues below ``floor`` raised to it."""
    if not _by_sign(At):
        return _clip_by_eigh(torch, At, floor)
    out = torch.empty_like(At)
    for sl, P, ok in _sign_clipped(torch, At, floor):
        out[sl] = P.to(torch.float32)
        if not bool(ok.all()):  # singular or slow to converge (rare for noised matrices): decomposed
            rows = torch.nonzero(~ok).flatten() + sl.start
            out[rows] = _clip_by_eigh(torch, At[rows], floor)
    return out


def _clipped_solve(torch, At, bt, floor: float, reg: float):
    """x = (clip(At, floor) + reg I)^-1 b for a symmetric float32 batch (floor + reg > 0): from
    the eigendecomposition, or from the sign iteration's clipped matrices by a float64 Cholesky
    solve."""
    if not _by_sign(At):
        return _clipped_solve_by_eigh(torch, At, bt, floor, reg)
    x = torch.empty_like(bt)
    eye = torch.eye(At.shape[-1], dtype=torch.float64, device=At.device)
    for sl, P, ok in _sign_clipped(torch, At, floor):
        L, info = torch.linalg.cholesky_ex(P + reg * eye)
        x[sl] = torch.cholesky_solve(bt[sl].to(torch.float64)[..., None], L)[..., 0].to(x.dtype)
        ok &= info == 0
        if not bool(ok.all()):  # singular or slow to converge (rare for noised matrices): decomposed
            rows = torch.nonzero(~ok).flatten() + sl.start
            x[rows] = _clipped_solve_by_eigh(torch, At[rows], bt[rows], floor, reg)
    return x


def _symmetric(torch, dev, A):
    At = _t(torch, A, dev, torch.float32)
    return 0.5 * (At + At.transpose(-1, -2))


def _below(torch, dev, At, floor: float):
    """Which matrices of the batch are not above ``floor`` (a Cholesky test), and how many."""
    outside = torch.linalg.cholesky_ex(At - floor * torch.eye(At.shape[-1], device=dev))[1] != 0
    return outside, int(outside.sum())


def psd_on_device(torch, dev, A, floor: float) -> device.DeviceArray:
    """Eigenvalue clipping at ``floor`` of the matrices not already above it (a Cholesky test)."""
    At = _symmetric(torch, dev, A)
    outside, n_out = _below(torch, dev, At, floor)
    if n_out == len(At):  # after the noise, the usual case: the batch is clipped uncopied
        At = _clip(torch, At, floor)
    elif n_out:
        At[outside] = _clip(torch, At[outside], floor)
    return device.DeviceArray(At, dev)  # the encoder server's fit reads it on the device


def psd_solve_on_device(torch, dev, A, b, floor: float, reg: float) -> np.ndarray:
    """``solve_spd(project_psd(A, floor), b, reg)`` in one pass (floor + reg > 0): the matrices
    already above the floor are solved as they are, the others clipped (:func:`_clipped_solve`)."""
    At = _symmetric(torch, dev, A)
    bt = _t(torch, b, dev, torch.float32)
    outside, n_out = _below(torch, dev, At, floor)
    if n_out == 0:  # A + reg I is positive definite (floor + reg > 0): no NaN row
        x = _cholesky(torch, dev, At, bt, reg)
    elif n_out == len(At):  # after the noise, the usual case: every matrix is clipped, none copied
        x = _clipped_solve(torch, At, bt, floor, reg)
    else:
        x, inside = torch.empty_like(bt), ~outside
        x[inside] = _cholesky(torch, dev, At[inside], bt[inside], reg).to(x.dtype)
        x[outside] = _clipped_solve(torch, At[outside], bt[outside], floor, reg)
    return _host(x.to(torch.float64))


def inverse_on_device(torch, dev, M: np.ndarray) -> np.ndarray:
    """The inverse of one (symmetric positive definite) matrix, in float64 on the device."""
    return _host(torch.linalg.inv(_t(torch, M, dev, torch.float64)))
