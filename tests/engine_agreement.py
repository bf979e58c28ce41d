"""The check that a Flower run released the same model, ledger and metrics as the in-process
engine (shared by the simulation and the Ray-cluster tests)."""

import numpy as np
import pytest

from fedpriv.algorithms.evaluation import evaluate_rmse


def assert_same_as_inprocess(res, ref, split) -> None:
    """``res``: a Flower simulation result; ``ref``: ``train_inprocess``'s result on ``split.train``."""
    assert np.allclose(res.state.item_factors, ref.state.item_factors, rtol=1e-4, atol=1e-5)
    assert np.allclose(res.state.item_bias, ref.state.item_bias, rtol=1e-4, atol=1e-5)
    assert res.ledger.to_list() == ref.ledger.to_list()
    valid, _ = evaluate_rmse(ref.state, split.train, split.valid, split.train.item_counts())
    test, _ = evaluate_rmse(ref.state, split.train, split.test, split.train.item_counts())
    assert res.valid_rmse == pytest.approx(valid, rel=1e-6) and res.test_rmse == pytest.approx(test, rel=1e-6)
