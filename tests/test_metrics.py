import numpy as np
import pytest

from fedpriv.algorithms import metrics


def test_frequency_buckets_are_equal_sized_and_ordered():
    counts = np.array([50, 1, 7, 3, 9, 100, 2, 0, 5, 20])
    b = metrics.frequency_buckets(counts, 5)
    assert np.bincount(b).tolist() == [2] * 5
    assert b[7] == 0 and b[5] == 4  # rarest in bucket 0, most frequent in the last


def test_sliced_rmse():
    counts = np.array([1, 2, 3, 4, 5])
    items = np.array([0, 0, 4])
    s = metrics.sliced_rmse(np.array([1.0, 3.0, 2.0]), np.array([2.0, 2.0, 2.0]), items, counts)
    assert s[0]["rmse"] == pytest.approx(1.0) and s[0]["n_eval"] == 2
    assert s[4]["rmse"] == 0.0 and np.isnan(s[2]["rmse"])


def test_recall_at_k_excludes_history_and_normalises():
    scores = np.array([[9.0, 8.0, 7.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    history = (np.array([0, 1, 1]), np.array([0]))  # user 0 has seen item 0
    targets = (np.array([0, 2, 4]), np.array([1, 3, 4, 3]))
    r, sliced = metrics.recall_at_k(lambda rows: scores[rows], np.arange(2), history, targets, np.arange(5), k=2)
    # user 0: top-2 without item 0 = {1, 2}: hits {1} of 2 targets -> 1/2; user 1: top-2 {4, 3}: 2 hits / min(2, 2) = 1
    assert r == pytest.approx(0.75)
    assert len(sliced) == 5
