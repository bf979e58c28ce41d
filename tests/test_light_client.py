"""The light client path (issue 19): a SuperNode starts one ``flwr-clientapp`` process per
message, so what the ClientApp imports is paid on every message. Importing it, and handling the
messages of the ALS family, AM-SSP's and AM-SSP-convex's statistics, DP model personalization and
the private recommendation, loads no torch, dp-accounting, scipy, pandas or matplotlib.

The messages are the real ones: a job runs on the in-process grid, every message a node receives
is recorded, and a fresh interpreter replays them through the ClientApp (each node keeping its own
state), checking every reply and then the modules it loaded. The numpy kernels the client falls
back to are checked against the straightforward per-segment computation."""

import json
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fake_grid import FakeGrid

from fedpriv.algorithms import kernels
from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.flower.client_app import app as client_app
from fedpriv.flower.server_app import FlowerJob, run_job
from fedpriv.privacy.randomness import RunSecrets

HEAVY = ("torch", "scipy", "dp_accounting", "pandas", "matplotlib", "sklearn")

REPLAY = textwrap.dedent(
    """
    import json, pickle, sys
    from flwr.app import Context, Message
    from flwr.common import RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    for key in ("run_id", "node_id", "task_id"):
        try:
            getattr(TaskIdentity, key)
        except RuntimeError:
            setattr(TaskIdentity, key, 1)
    from fedpriv.flower.client_app import app

    after_import = sorted(m for m in {heavy!r} if m in sys.modules)
    with open(sys.argv[1], "rb") as f:
        log = pickle.load(f)
    states, errors, types = {{}}, [], set()
    for nid, node_config, mtype, blob in log:
        msg = Message(pickle.loads(blob), dst_node_id=nid, message_type=mtype)
        ctx = Context(run_id=1, node_id=nid, node_config=node_config, state=states.setdefault(nid, RecordDict()), run_config={{}})
        reply = app(msg, ctx)
        types.add(mtype)
        if reply.has_error():
            errors.append((mtype, reply.error.reason))
    print(json.dumps({{"after_import": after_import, "after_messages": sorted(m for m in {heavy!r} if m in sys.modules),
                      "errors": errors, "types": sorted(types), "messages": len(log)}}))
    """
).format(heavy=HEAVY)


class _Recorder:
    """The ClientApp, recording every message it handles (node, node config, type, content)."""

    def __init__(self):
        self.log = []

    def __call__(self, msg, ctx):
        self.log.append((ctx.node_id, dict(ctx.node_config), msg.metadata.message_type, pickle.dumps(msg.content)))
        return client_app(msg, ctx)


def _replay(log, tmp_path) -> dict:
    path = tmp_path / "messages.pkl"
    path.write_bytes(pickle.dumps(log))
    out = subprocess.run([sys.executable, "-c", REPLAY, str(path)], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def data():
    syn = make_mf(60, 40, 60 * 20, seed=4)
    return syn, random_split(syn.interactions, seed=1234)


def test_importing_the_client_app_is_light():
    code = f"import sys, fedpriv.flower.client_app; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("algorithm", ["adadpals", "dpals-uniform", "bias", "am-ssp", "am-ssp-convex"])
def test_rating_messages_load_no_heavy_module(tmp_path, data, algorithm):
    syn, split = data
    rec = _Recorder()
    kw = {"item_features": syn.item_features} if algorithm.startswith("am-ssp") else {}
    if algorithm == "adadpals":  # the private recommendation rounds too
        from fedpriv.algorithms.recommend import RecommendConfig

        kw["recommend"] = RecommendConfig(mechanism="cgem", epsilon=2.0, candidates=15, sensitivity="quantile")
    cfg = ALSConfig(rank=3, steps=2)
    job = FlowerJob(algorithm, 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), tmp_path / "job", users_per_node=6, secrets=RunSecrets(7), **kw)
    run_job(FakeGrid(10, client_app=rec), job)
    res = _replay(rec.log, tmp_path)
    assert res["errors"] == [] and res["messages"] == len(rec.log) > 10
    assert {"train", "evaluate"} <= set(res["types"])
    if algorithm == "adadpals":
        assert any(t.startswith("query.rec") for t in res["types"]), res["types"]
    assert res["after_import"] == [] and res["after_messages"] == [], res


def test_personalization_messages_load_no_heavy_module(tmp_path):
    from fedpriv.algorithms.pam import PAMConfig
    from fedpriv.data.personal import make_personal
    from fedpriv.algorithms import pam
    from fedpriv.flower.block_server import BlockJob

    rec = _Recorder()
    job = BlockJob(pam.FAMILY, "pam", 4.0, 1e-5, PAMConfig(), make_personal(60, 8, 6, 2, 0.01, seed=1), tmp_path / "job", users_per_node=6, secrets=RunSecrets(3))
    run_job(FakeGrid(10, client_app=rec), job)
    res = _replay(rec.log, tmp_path)
    assert res["errors"] == [] and res["messages"] == len(rec.log) > 10
    assert res["after_import"] == [] and res["after_messages"] == [], res


# ------------------------------------------------------------------------------ numpy kernels
def _reference_stats(factors, index, indptr, weights, targets):
    n_seg, d = len(indptr) - 1, factors.shape[1]
    A, b, c = np.zeros((n_seg, d, d)), np.zeros((n_seg, d)), np.zeros(n_seg)
    for s in range(n_seg):
        for r in range(indptr[s], indptr[s + 1]):
            x, w, y = factors[index[r]].astype(np.float64), max(weights[r], 0.0), targets[r]
            A[s] += w * np.outer(x, x)
            b[s] += w * y * x
            c[s] += w * y * y
    return A, b, c


@pytest.mark.parametrize("counts", [[0, 3, 0, 700, 1, 1300, 0], [2000, 0, 900, 5]])
def test_numpy_segment_stats_match_the_per_segment_sums(counts):
    """The numpy back end (what a ClientApp uses) on segments of every kind: empty ones, one
    entry, several pieces of 512, negative weights (clipped to 0 as in the torch path)."""
    rng = np.random.default_rng(5)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    n, d = int(indptr[-1]), 4
    factors = rng.normal(size=(50, d)).astype(np.float32)
    index = rng.integers(0, 50, n)
    weights = rng.uniform(-0.2, 2.0, n)
    targets = rng.normal(size=n)
    got = kernels._segment_stats_numpy(factors, index, indptr, weights, targets)  # noqa: SLF001
    A, b, c = _reference_stats(factors, index, indptr, weights, targets)
    scale = max(1.0, np.abs(A).max())
    assert np.allclose(got.A, A, atol=2e-5 * scale) and np.allclose(got.b, b, atol=2e-5 * scale) and np.allclose(got.c, c, atol=2e-5 * scale)
    assert np.all(got.A[np.diff(indptr) == 0] == 0)


def test_numpy_solves_handle_singular_and_regular_systems():
    rng = np.random.default_rng(2)
    d, n = 4, 40
    M = rng.normal(size=(n, 6, d))
    A = np.einsum("nki,nkj->nij", M, M)
    A[3] = 0.0  # an empty user: all zero
    A[7] = np.outer(np.ones(d), np.ones(d))  # singular (rank 1)
    b = rng.normal(size=(n, d))
    b[3] = 0.0
    reg = np.full(n, 0.5)
    reg[7] = 0.0  # singular and unregularised: least squares
    x = kernels._solve_spd_numpy(A, b, reg)  # noqa: SLF001
    for i in range(n):
        ref = np.linalg.lstsq(A[i] + reg[i] * np.eye(d), b[i], rcond=None)[0]
        assert np.allclose(x[i], ref, atol=1e-3 * max(1.0, np.abs(ref).max())), i
    assert np.all(x[3] == 0.0)
