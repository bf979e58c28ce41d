"""What the Flower engine's evaluation sends and measures (issue 41, item 6).

- The frequency buckets an evaluation message carries to every node come from the run's
  released (noised) item counts, or from the item ids when nothing was released; never from the
  exact training counts (positive control: exact-count buckets change when one user is removed).
- A job measures each model once: with ``eval_every`` the final model is not measured a second
  time (two exact measurements of the same model over different answering nodes differ by the
  exact sums of the nodes in one of them only).
"""

import hashlib

import numpy as np
import pytest
from fake_grid import FakeGrid

from fedpriv.algorithms import metrics
from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.flower import codec
from fedpriv.flower.server_app import FlowerJob, bucket_counts, run_job
from fedpriv.privacy.randomness import RunSecrets


@pytest.fixture(scope="module")
def split():
    syn = make_mf(60, 40, 60 * 20, seed=4)
    return random_split(syn.interactions, seed=1234)


def _eval_messages(seen: list) -> list:
    """(message type, item buckets, model digest) of every evaluation message a node received:
    ``evaluate`` (central) or the mask round of a secure measurement of kind ``eval``."""
    out = []
    for msg in seen:
        content = msg.content
        if "eval" not in content.array_records:
            continue
        if msg.metadata.message_type == "query.secagg_mask" and str(content.config_records["secagg"]["kind"]) != "eval":
            continue
        state, _, _ = codec.decode_state(content)
        digest = hashlib.sha256(np.ascontiguousarray(state.item_factors).tobytes()).hexdigest()
        out.append((msg.metadata.message_type, content.array_records["eval"]["item_bucket"].numpy().copy(), digest))
    return out


def _run(split, tmp_path, algorithm="adadpals", aggregation="central", **kw):
    cfg = ALSConfig.from_overrides({"rank": "3", "steps": "2", "aggregation": aggregation})
    seen = []
    job = FlowerJob(algorithm, 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), tmp_path, users_per_node=6,
                    secrets=RunSecrets(7), checkpoint=False, **kw)
    res = run_job(FakeGrid(10, observer=lambda nid, msg: seen.append(msg)), job)
    return res, _eval_messages(seen)


def test_exact_count_buckets_change_when_one_user_is_removed(split):
    """Positive control for the leak the old messages had: the buckets of the exact training
    counts move when one user's ratings are removed, for a good share of the users."""
    train = split.train
    base = metrics.frequency_buckets(train.item_counts())
    changed = 0
    users = np.unique(train.users)
    for u in users:
        keep = train.users != u
        counts = np.bincount(train.items[keep], minlength=train.n_items)
        changed += not np.array_equal(metrics.frequency_buckets(counts), base)
    assert changed / len(users) > 0.2, changed


@pytest.mark.parametrize("aggregation", ["central", "secure"])
def test_evaluation_buckets_come_from_the_released_counts(split, tmp_path, aggregation):
    res, evals = _run(split, tmp_path, aggregation=aggregation)
    assert evals and {t for t, _, _ in evals} == {"evaluate" if aggregation == "central" else "query.secagg_mask"}
    assert res.state.counts_hat is not None
    want = metrics.frequency_buckets(np.asarray(res.state.counts_hat, dtype=np.float64))
    assert all(np.array_equal(b, want) for _, b, _ in evals)
    assert not np.array_equal(want, metrics.frequency_buckets(split.train.item_counts()))  # (else the check above proves nothing)
    # the sliced report is bucketed the same way
    assert [row["n_items"] for row in res.test_sliced] == [int(np.sum(want == b)) for b in range(5)]


def test_without_released_counts_the_buckets_follow_the_item_ids(split, tmp_path):
    """DP-SGD releases no counts: the buckets are one fixed order of the item ids (public)."""
    res, evals = _run(split, tmp_path, algorithm="dpsgd")
    assert res.state.counts_hat is None and evals
    ids = metrics.frequency_buckets(np.zeros(split.train.n_items))
    assert np.array_equal(ids, np.repeat(np.arange(5), 8))
    assert all(np.array_equal(b, ids) for _, b, _ in evals)
    assert np.array_equal(metrics.frequency_buckets(bucket_counts(res.state, split.train.n_items)), ids)


@pytest.mark.parametrize("aggregation", ["central", "secure"])
def test_each_model_is_measured_once(split, tmp_path, aggregation):
    """eval_every=1 over 2 steps: two evaluation rounds (after step 1 and step 2), each of a
    different model, one message per serving node; the final metrics are the last curve point."""
    res, evals = _run(split, tmp_path, aggregation=aggregation, eval_every=1)
    per_model: dict = {}
    for _, _, digest in evals:
        per_model[digest] = per_model.get(digest, 0) + 1
    assert len(per_model) == 2 and set(per_model.values()) == {10}, per_model
    assert [p["step"] for p in res.curve] == [1, 2]
    assert res.valid_rmse == res.curve[-1]["valid_rmse"] and np.isfinite(res.test_rmse)
    # without eval_every: the one final measurement
    res1, evals1 = _run(split, tmp_path / "once", aggregation=aggregation)
    assert len({d for _, _, d in evals1}) == 1 and len(evals1) == 10
    assert res1.valid_rmse == pytest.approx(res.valid_rmse) and res1.test_rmse == pytest.approx(res.test_rmse)
