import numpy as np
import pytest

from fedpriv.algorithms import kernels
from fedpriv.algorithms.kernels import project_psd, segment_stats, solve_spd


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
@pytest.mark.parametrize("small", [-1, 10**9], ids=["torch", "numpy"])
def test_segment_stats_matches_naive_sums(monkeypatch, piece, small):
    monkeypatch.setattr(kernels, "_PIECE", piece)
    monkeypatch.setattr(kernels, "_SMALL_ENTRIES", small)  # both paths: torch blocks, numpy below the size
    rng = np.random.default_rng(0)
    counts = np.concatenate([rng.integers(0, 12, 40), [0, 1, 700, 2500]])
    indptr = np.concatenate([[0], np.cumsum(counts)])
    n = indptr[-1]
    F = rng.normal(size=(60, 5)).astype(np.float32)
    idx, w, y = rng.integers(0, 60, n), rng.random(n), rng.normal(size=n)
    got = segment_stats(F, idx, indptr, weights=w, targets=y)
    A, b, c = _naive(F, idx, indptr, w, y)
    assert np.allclose(got.A, A, rtol=1e-4, atol=1e-3)
    assert np.allclose(got.b, b, rtol=1e-4, atol=1e-3)
    assert np.allclose(got.c, c, rtol=1e-4, atol=1e-3)


def test_segment_stats_small_blocks(monkeypatch):
    monkeypatch.setattr(kernels, "_BLOCK_FLOATS", 64)  # forces tiny blocks
    monkeypatch.setattr(kernels, "_SMALL_ENTRIES", -1)  # of the torch path
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


def test_segment_stats_empty_input_on_both_paths(monkeypatch):
    F = np.ones((4, 3), np.float32)
    for small in (-1, 10**9):
        monkeypatch.setattr(kernels, "_SMALL_ENTRIES", small)
        got = segment_stats(F, np.zeros(0, np.int64), np.zeros(4, np.int64))
        assert got.A.shape == (3, 3, 3) and not got.A.any() and not got.b.any()
