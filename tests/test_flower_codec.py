"""Message (de)serialization round trips and every reply-rejection reason (no runtime needed)."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedpriv.algorithms import als
from fedpriv.flower import codec

D = 4  # rank 3 + item-bias coordinate


def _state(private=True):
    cfg = als.ALSConfig(rank=3, user_clip=1.0, rating_clip=1.0, beta=1.0)
    st = als.PublicState(algorithm="adadpals" if private else "als", config=cfg, n_items=10, n_users=50, rating_range=(1.0, 5.0), mean=3.2)
    st.item_factors = np.arange(30, dtype=np.float32).reshape(10, 3)
    st.item_bias = np.linspace(0, 1, 10)
    st.counts_hat = np.arange(10.0)
    st.omega = np.ones(10)
    return st


def _stats(k=3, scale=0.01, seed=0):
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(k, D, D)) * scale
    return als.ItemStats(item_ids=np.array([1, 4, 7][:k]), A=(M @ np.swapaxes(M, 1, 2)).astype(np.float32), b=(rng.normal(size=(k, D)) * scale).astype(np.float32))


def test_state_round_trip():
    st = _state()
    back, data_dir, upn = codec.decode_state(codec.encode_state(st, "/data", 7))
    assert (data_dir, upn) == ("/data", 7)
    assert back.config == st.config and back.algorithm == "adadpals" and back.mean == 3.2
    for key in ("item_factors", "item_bias", "counts_hat", "omega"):
        assert np.array_equal(getattr(back, key), getattr(st, key))


def test_item_stats_round_trip_sends_upper_triangles():
    s = _stats()
    rd = codec.encode_item_stats(s, n_users=2)
    assert rd.array_records["contrib"]["A_upper"].numpy().shape == (3, D * (D + 1) // 2)
    back = codec.decode_item_stats(rd, _state(), D, max_users=5)
    assert np.array_equal(back.item_ids, s.item_ids)
    assert np.allclose(back.A, s.A) and np.allclose(back.b, s.b)


def test_vector_round_trip():
    v = codec.decode_vector(codec.encode_vector(np.array([3.0, 2.0]), 1), "mean", 2, _state(), 1)
    assert v.tolist() == [3.0, 2.0]


def _with(rd, **arrays):
    rec = rd.array_records["contrib"]
    for k, v in arrays.items():
        if v is None:
            del rec[k]
        else:
            rec[k] = Array(np.ascontiguousarray(v))
    return rd


@pytest.mark.parametrize(
    "mutate,reason",
    [
        (lambda rd: rd.config_records.__delitem__("meta") or rd, "declared user count"),
        (lambda rd: rd.config_records.__setitem__("meta", ConfigRecord({"n_users": 99})) or rd, "outside"),
        (lambda rd: _with(rd, b=None), "missing array 'b'"),
        (lambda rd: _with(rd, b=np.zeros((3, D + 1), np.float32)), "shapes"),
        (lambda rd: _with(rd, b=np.zeros((3, D), np.int64)), "dtype"),
        (lambda rd: _with(rd, b=np.full((3, D), np.nan, np.float32)), "non-finite"),
        (lambda rd: _with(rd, A_upper=np.full((3, 10), np.inf, np.float32)), "non-finite"),
        (lambda rd: _with(rd, item_ids=np.array([1, 4, 99])), "out of range"),
        (lambda rd: _with(rd, item_ids=np.array([1, 1, 7])), "repeated"),
        (lambda rd: _with(rd, b=np.full((3, D), 10.0, np.float32)), "over bound: ||item_stats_b||"),
        (lambda rd: _with(rd, A_upper=np.full((3, 10), 10.0, np.float32)), "over bound: ||item_stats_A||"),
    ],
)
def test_each_rejection_reason(mutate, reason):
    rd = mutate(codec.encode_item_stats(_stats(), n_users=2))
    with pytest.raises(codec.RejectedReply, match=reason.replace("|", r"\|").replace("(", r"\(")):
        codec.decode_item_stats(rd, _state(), D, max_users=5)


def test_no_contribution_record_is_rejected():
    with pytest.raises(codec.RejectedReply, match="no contribution"):
        codec.decode_item_stats(RecordDict({"meta": ConfigRecord({"n_users": 1})}), _state(), D, 5)


@pytest.mark.parametrize("values,reason", [(np.array([1.0, 2.0, 3.0]), "length"), (np.array([1e9, 1.0]), "over bound"), (np.array([np.nan, 1.0]), "non-finite")])
def test_vector_rejections(values, reason):
    with pytest.raises(codec.RejectedReply, match=reason):
        codec.decode_vector(codec.encode_vector(values, 1), "mean", 2, _state(), 1)


def test_bound_scales_with_declared_users_and_is_skipped_without_privacy():
    big = codec.encode_item_stats(_stats(scale=0.6), n_users=1)
    with pytest.raises(codec.RejectedReply, match="over bound"):
        codec.decode_item_stats(big, _state(), D, max_users=50)
    ok = codec.encode_item_stats(_stats(scale=0.6), n_users=50)
    codec.decode_item_stats(ok, _state(), D, max_users=50)
    codec.decode_item_stats(big, _state(private=False), D, max_users=50)  # non-private ALS: no DP bound


def test_payload_bytes_counts_array_buffers():
    rd = codec.encode_item_stats(_stats(), n_users=2)
    arrays = rd.array_records["contrib"]
    assert codec.payload_bytes(rd) >= sum(a.numpy().nbytes for a in arrays.values())


def test_evaluation_sums_validation():
    good = RecordDict({"eval": ArrayRecord({"sse": Array(np.ones(5)), "n": Array(np.ones(5))})})
    assert codec.decode_eval_sums(good, ("sse", "n"))["n"].tolist() == [1.0] * 5
    for bad, reason in [
        (RecordDict({}), "no evaluation record"),
        (RecordDict({"eval": ArrayRecord({"sse": Array(np.ones(5))})}), "missing array 'n'"),
        (RecordDict({"eval": ArrayRecord({"sse": Array(np.ones(5)), "n": Array(-np.ones(5))})}), "non-negative"),
        (RecordDict({"eval": ArrayRecord({"sse": Array(np.full(5, np.nan)), "n": Array(np.ones(5))})}), "non-finite"),
    ]:
        with pytest.raises(codec.RejectedReply, match=reason):
            codec.decode_eval_sums(bad, ("sse", "n"))
