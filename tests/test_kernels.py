import numpy as np
import pytest

from fedpriv.algorithms import kernels, native
from fedpriv.algorithms.kernels import project_psd, segment_stats, solve_spd

PATHS = ["native", "torch", "numpy"]


@pytest.fixture(autouse=True)
def _default_native_switch(monkeypatch):
    """Each test starts from the default (native kernel on), whatever FEDPRIV_NATIVE the
    caller's environment exports: the switch is the user's, and the tests set it themselves."""
    monkeypatch.delenv("FEDPRIV_NATIVE", raising=False)


def use_path(monkeypatch, path: str) -> None:
    """Route segment_stats to one back end: the native kernel, or (FEDPRIV_NATIVE=0) torch blocks
    or numpy."""
    if path == "native":
        if native.library() is None:
            pytest.skip(f"native kernel unavailable: {native.unavailable_reason()}")
    else:
        monkeypatch.setenv("FEDPRIV_NATIVE", "0")
        monkeypatch.setattr(kernels, "_SMALL_ENTRIES", -1 if path == "torch" else 10**9)


def _naive(F, idx, indptr, w, y):
    A, b, c = [], [], []
    for s in range(len(indptr) - 1):
        X = F[idx[indptr[s] : indptr[s + 1]]].astype(np.float64)
        ww, yy = w[indptr[s] : indptr[s + 1]], y[indptr[s] : indptr[s + 1]]
        A.append((X * ww[:, None]).T @ X)
        b.append(X.T @ (ww * yy))
        c.append(np.sum(ww * yy * yy))
    return np.array(A), np.array(b), np.array(c)


@pytest.mark.parametrize("piece", [3, 512])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("d", [1, 5, 16, 33, 70])
def test_segment_stats_matches_naive_sums(monkeypatch, piece, path, d):
    """Every back end against per-segment float64 sums; widths below, at and between the native
    kernel's vector widths (its column groups and row tiles), segments longer than its packed
    chunk, empty and one-entry segments."""
    monkeypatch.setattr(kernels, "_PIECE", piece)
    use_path(monkeypatch, path)
    rng = np.random.default_rng(d)
    counts = np.concatenate([rng.integers(0, 12, 40), [0, 1, 700, 2500]])
    indptr = np.concatenate([[0], np.cumsum(counts)])
    n = indptr[-1]
    F = rng.normal(size=(60, d)).astype(np.float32)
    idx, w, y = rng.integers(0, 60, n), rng.random(n), rng.normal(size=n)
    got = segment_stats(F, idx, indptr, weights=w, targets=y)
    A, b, c = _naive(F, idx, indptr, w, y)
    assert np.allclose(got.A, A, rtol=1e-4, atol=1e-3)
    assert np.allclose(got.b, b, rtol=1e-4, atol=1e-3)
    assert np.allclose(got.c, c, rtol=1e-4, atol=1e-3)


def test_segment_stats_small_blocks(monkeypatch):
    monkeypatch.setattr(kernels, "_BLOCK_FLOATS", 64)  # forces tiny blocks
    use_path(monkeypatch, "torch")  # the torch path's blocks
    rng = np.random.default_rng(1)
    counts = np.array([5, 0, 40, 3, 1])
    indptr = np.concatenate([[0], np.cumsum(counts)])
    F = rng.normal(size=(10, 3)).astype(np.float32)
    idx = rng.integers(0, 10, indptr[-1])
    got = segment_stats(F, idx, indptr)
    A, b, _ = _naive(F, idx, indptr, np.ones(indptr[-1]), np.zeros(indptr[-1]))
    assert np.allclose(got.A, A, atol=1e-4) and np.allclose(got.b, 0)


@pytest.mark.parametrize("small", [-1, 10**9], ids=["torch", "numpy"])
def test_project_psd_and_solve(monkeypatch, small):
    monkeypatch.setattr(kernels, "_SMALL_SYSTEMS", small)
    rng = np.random.default_rng(2)
    M = rng.normal(size=(20, 4, 4))
    S = M + np.swapaxes(M, 1, 2)
    P = project_psd(S, floor=0.5)
    assert np.all(np.linalg.eigvalsh(P) >= 0.5 - 1e-5)  # float32 projection
    x = rng.normal(size=(20, 4))
    A = M @ np.swapaxes(M, 1, 2)
    b = np.einsum("nij,nj->ni", A + 0.3 * np.eye(4), x)
    assert np.allclose(solve_spd(A, b, 0.3), x, atol=1e-6)
    # a singular system with no ridge falls back to least squares (float64) on both paths
    sing = np.zeros((2, 3, 3))
    sing[0] = np.eye(3)
    sing[1, 0, 0] = 1.0
    got = solve_spd(sing, np.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]), 0.0)
    assert np.allclose(got, [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])


@pytest.mark.parametrize("path", PATHS)
def test_segment_stats_empty_input_on_every_path(monkeypatch, path):
    use_path(monkeypatch, path)
    F = np.ones((4, 3), np.float32)
    got = segment_stats(F, np.zeros(0, np.int64), np.zeros(4, np.int64))
    assert got.A.shape == (3, 3, 3) and not got.A.any() and not got.b.any() and not got.c.any()
    none = segment_stats(F, np.zeros(0, np.int64), np.zeros(1, np.int64))
    assert none.A.shape == (0, 3, 3) and none.b.shape == (0, 3)
    zero_width = segment_stats(np.ones((4, 0), np.float32), np.array([0, 1, 3]), np.array([0, 2, 3]), targets=np.array([1.0, 2.0, 3.0]))
    assert zero_width.A.shape == (2, 0, 0) and np.allclose(zero_width.c, [5.0, 9.0])


# ---------------------------------------------------------------- issue 20: the fast paths
def test_user_solves_match_the_per_user_computation_with_empty_users_and_singular_systems():
    """The whole client user update (cached packing, threaded batched Cholesky) against one
    least-squares solve per user, on random data with empty users, users with fewer ratings than
    the rank (singular Gram matrices) and, with no ridge, their least-squares fallback."""
    from fedpriv.algorithms import als
    from fedpriv.algorithms.shards import UserShard

    rng = np.random.default_rng(11)
    n_users, n_items, d = 3000, 400, 6
    counts = rng.integers(0, 40, n_users)
    counts[::17] = 0  # empty users
    counts[5::23] = 2  # fewer ratings than d: singular without a ridge
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.concatenate([rng.choice(n_items, c, replace=False) for c in counts]).astype(np.int32)
    ratings = rng.uniform(1, 5, indptr[-1]).astype(np.float32)
    shard = UserShard(user_ids=np.arange(n_users), indptr=indptr, items=items, ratings=ratings)
    for reg_user in (0.5, 0.0):
        cfg = als.ALSConfig(rank=d, steps=1, reg_user=reg_user, weighted_reg=False, user_bias=False)
        state = als.PublicState("als", cfg, n_items, n_users, (1.0, 5.0), mean=3.0)
        state.item_factors = rng.normal(size=(n_items, d)).astype(np.float32)
        got = als.client_user_vectors(shard, state)
        for u in range(n_users):
            its = items[indptr[u] : indptr[u + 1]]
            V = state.item_factors[its].astype(np.float64)
            y = ratings[indptr[u] : indptr[u + 1]].astype(np.float64) - 3.0
            ref = np.linalg.lstsq(V.T @ V + reg_user * np.eye(d), V.T @ y, rcond=None)[0]
            if reg_user == 0.0 and 0 < len(its) < d:  # singular: any least-squares solution fits
                assert np.allclose(V @ got[u], V @ ref, atol=1e-3), u
            else:
                assert np.allclose(got[u], ref, atol=2e-3 * max(1.0, np.abs(ref).max())), (reg_user, u)
        assert np.all(got[counts == 0] == 0)


def test_project_psd_skips_only_matrices_already_above_the_floor():
    rng = np.random.default_rng(3)
    M = rng.normal(size=(3000, 5, 5))
    S = (M + np.swapaxes(M, 1, 2)).astype(np.float32)
    S[::2] = (M[::2] @ np.swapaxes(M[::2], 1, 2) + 2.0 * np.eye(5)).astype(np.float32)  # inside for floor 1
    got = project_psd(S, floor=1.0)
    evals, evecs = np.linalg.eigh(S.astype(np.float64))
    ref = (evecs * np.maximum(evals, 1.0)[..., None, :]) @ np.swapaxes(evecs, 1, 2)
    assert np.allclose(got, ref, atol=1e-4 * np.abs(ref).max())
    assert np.allclose(got[::2], S[::2], rtol=1e-6, atol=1e-6)  # inside: returned as they are (symmetrised)


def test_cached_packing_is_keyed_by_the_layout(monkeypatch):
    """Two layouts of the same length and total reuse nothing of each other's packing."""
    use_path(monkeypatch, "torch")
    rng = np.random.default_rng(4)
    F = rng.normal(size=(30, 3)).astype(np.float32)
    for counts in ([5, 0, 7, 3], [3, 7, 0, 5], [5, 0, 7, 3]):
        indptr = np.concatenate([[0], np.cumsum(counts)])
        idx, w, y = rng.integers(0, 30, indptr[-1]), rng.random(indptr[-1]), rng.normal(size=indptr[-1])
        got = segment_stats(F, idx, indptr, weights=w, targets=y)
        A, b, c = _naive(F, idx, indptr, w, y)
        assert np.allclose(got.A, A, atol=1e-4) and np.allclose(got.b, b, atol=1e-4) and np.allclose(got.c, c, atol=1e-4)


def test_thread_count_and_chunks(monkeypatch):
    from fedpriv.util import threads
    from fedpriv.errors import ConfigError

    monkeypatch.setenv("FEDPRIV_THREADS", "3")
    assert threads.thread_count() == 3
    monkeypatch.delenv("FEDPRIV_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in a worker given one CPU
    assert threads.thread_count() == 1
    assert threads.map_chunks(lambda s: (s.start, s.stop), 10_000) == [(0, 10_000)]
    monkeypatch.setenv("FEDPRIV_THREADS", "2")
    assert threads.map_chunks(lambda s: (s.start, s.stop), 10_000) == [(0, 5000), (5000, 10_000)]
    monkeypatch.setenv("FEDPRIV_THREADS", "zero")
    with pytest.raises(ConfigError, match="FEDPRIV_THREADS"):
        threads.thread_count()


def test_secure_normal_in_threads_has_unit_variance(monkeypatch):
    from fedpriv.privacy.ledger import secure_standard_normal

    monkeypatch.setenv("FEDPRIV_THREADS", "2")
    z = secure_standard_normal((700_001,))
    assert z.shape == (700_001,) and np.isfinite(z).all()
    assert abs(z.mean()) < 0.01 and abs(z.var() - 1.0) < 0.01
    assert abs(np.corrcoef(z[:350_000], z[350_001:])[0, 1]) < 0.01  # the cos and sin halves


@pytest.mark.parametrize("n", [0, 3, 5000])
def test_zero_width_and_empty_batches(n):
    """Rank-0 runs (the bias model alone) pass 0 x 0 systems; empty batches have no systems."""
    A, b = np.zeros((n, 0, 0)), np.zeros((n, 0))
    assert project_psd(A, 0.5).shape == (n, 0, 0)
    assert solve_spd(A, b, 1.0).shape == (n, 0)
    B = np.tile(np.eye(2), (n, 1, 1))
    assert project_psd(B, 0.5).shape == (n, 2, 2) and solve_spd(B, np.ones((n, 2)), 1.0).shape == (n, 2)


def test_fused_projection_solve_equals_project_then_solve():
    from fedpriv.algorithms.kernels import project_psd_solve

    rng = np.random.default_rng(8)
    M = rng.normal(size=(2500, 6, 6))
    S = M + np.swapaxes(M, 1, 2)
    S[::3] = M[::3] @ np.swapaxes(M[::3], 1, 2) + 3.0 * np.eye(6)  # inside the set: the Cholesky branch
    b = rng.normal(size=(2500, 6))
    for floor, reg in ((0.0, 0.5), (0.2, 0.0), (1.0, 2.0)):
        ref = solve_spd(project_psd(S, floor), b, reg)
        got = project_psd_solve(S, b, floor, reg)
        assert np.allclose(got, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max()), (floor, reg)


# ---------------------------------------------------------------- the native kernel
def _random_layout(rng, n_seg=300, n_src=2000, d=32, big=9000):
    counts = rng.integers(0, 60, n_seg)
    counts[::11] = 0
    counts[5] = big  # longer than many packed chunks, on its own thread range
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n = int(indptr[-1])
    F = rng.normal(size=(n_src, d))
    return F, rng.integers(0, n_src, n), indptr, rng.random(n) - 0.2, rng.normal(size=n)  # some negative weights: clipped to 0


def test_native_kernel_loads_where_a_compiler_exists():
    """The fast path is the one the benchmarks measure: it must not fall back silently here."""
    if native._compiler() is None:
        pytest.skip("no C compiler on this machine: the torch/numpy path runs")
    assert native.library() is not None, native.unavailable_reason()
    assert native.library().fedpriv_vector_width() in (4, 8, 16)


@pytest.mark.parametrize("d", [8, 32, 128])
def test_native_equals_fallback_with_order_and_threads(monkeypatch, d):
    """Native (threaded over entry-balanced segment ranges, weights and targets read through
    ``order``) against the torch path on gathered inputs, and against one thread."""
    use_path(monkeypatch, "native")
    rng = np.random.default_rng(d)
    F, idx, indptr, w, y = _random_layout(rng, d=d)
    order = rng.permutation(len(idx))
    monkeypatch.setenv("FEDPRIV_THREADS", "2")
    got = segment_stats(F, idx, indptr, weights=w, targets=y, order=order)
    monkeypatch.setenv("FEDPRIV_THREADS", "1")
    one = segment_stats(F, idx, indptr, weights=w, targets=y, order=order)
    monkeypatch.setenv("FEDPRIV_NATIVE", "0")
    monkeypatch.setattr(kernels, "_SMALL_ENTRIES", -1)
    ref = segment_stats(F, idx, indptr, weights=w[order], targets=y[order])
    scale = np.abs(ref.A).max()
    for x in (got, one):
        assert np.allclose(x.A, ref.A, atol=1e-5 * scale) and np.allclose(x.b, ref.b, atol=1e-5 * np.abs(ref.b).max())
        assert np.allclose(x.c, ref.c, rtol=1e-5)
        assert np.array_equal(x.A, np.swapaxes(x.A, 1, 2))  # mirrored exactly
    assert np.all(got.A[::11] == 0) and np.all(got.b[::11] == 0) and np.all(got.c[::11] == 0)


@pytest.mark.parametrize("path", PATHS)
def test_out_of_range_entries_are_errors_not_reads(monkeypatch, path):
    use_path(monkeypatch, path)
    F = np.ones((10, 4), np.float32)
    indptr = np.array([0, 2, 5])
    for bad in (10, -1):
        with pytest.raises(IndexError):
            segment_stats(F, np.array([0, 1, 2, bad, 3]), indptr, weights=np.ones(5))
    with pytest.raises(IndexError):
        segment_stats(F, np.arange(5), indptr, weights=np.ones(5), order=np.array([0, 1, 2, 3, 5]))
    with pytest.raises(ValueError, match="indptr"):
        segment_stats(F, np.arange(5), np.array([0, 3, 2, 5]))
    with pytest.raises(ValueError, match="weights has 4 entries"):
        segment_stats(F, np.arange(5), indptr, weights=np.ones(4))
    with pytest.raises(ValueError, match="order has 4 entries"):
        segment_stats(F, np.arange(5), indptr, weights=np.ones(5), order=np.arange(4))


def test_without_a_compiler_the_fallback_computes_the_same_sums(monkeypatch):
    monkeypatch.setattr(native, "_compiler", lambda: None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "_lib", None)
    assert native.library() is None and "no C compiler" in native.unavailable_reason()
    rng = np.random.default_rng(5)
    F, idx, indptr, w, y = _random_layout(rng, n_seg=40, d=6, big=300)
    got = segment_stats(F, idx, indptr, weights=w, targets=y)
    A, b, c = _naive(F, idx, indptr, np.maximum(w, 0), y)
    assert np.allclose(got.A, A, rtol=1e-4, atol=1e-3) and np.allclose(got.b, b, rtol=1e-4, atol=1e-3)
    monkeypatch.setenv("FEDPRIV_NATIVE", "0")
    assert native.library() is None and native.unavailable_reason() == "FEDPRIV_NATIVE=0"


def test_a_failing_compiler_leaves_no_library_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("FEDPRIV_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "_lib", None)
    assert native.library() is None
    assert "false failed" in native.unavailable_reason()
    assert list(tmp_path.iterdir()) == []  # no half-built library for the next process to load


def test_the_library_is_built_once_per_cache_and_reused_by_later_processes(tmp_path):
    import os
    import subprocess
    import sys

    if native._compiler() is None:
        pytest.skip("no C compiler")
    env = {**os.environ, "FEDPRIV_NATIVE_CACHE": str(tmp_path)}
    env.pop("FEDPRIV_NATIVE", None)
    code = "from fedpriv.algorithms import native; lib = native.library(); print(lib is not None, native.unavailable_reason())"
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        assert out.startswith("True"), out
        built = sorted(tmp_path.iterdir())
        assert len(built) == 1 and built[0].name.startswith("segment_stats-") and built[0].suffix == ".so"
        if _ == 0:
            first = built[0].stat().st_mtime_ns
    assert built[0].stat().st_mtime_ns == first


@pytest.mark.parametrize("path", PATHS)
def test_non_finite_inputs_propagate_to_the_sums(monkeypatch, path):
    """A NaN weight or target is not silently dropped: it reaches the statistics, where the
    aggregator's reply check rejects non-finite contributions."""
    use_path(monkeypatch, path)
    F = np.ones((4, 3), np.float32)
    idx, indptr = np.array([0, 1, 2, 3]), np.array([0, 2, 4])
    got = segment_stats(F, idx, indptr, weights=np.array([1.0, np.nan, 1.0, 1.0]), targets=np.ones(4))
    assert np.isnan(got.A[0]).all() and np.isfinite(got.A[1]).all()
    got = segment_stats(F, idx, indptr, weights=np.ones(4), targets=np.array([1.0, 1.0, np.inf, 1.0]))
    assert not np.isfinite(got.b[1]).all() and np.isfinite(got.b[0]).all()
