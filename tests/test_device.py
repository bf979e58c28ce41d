"""The device option (fedpriv.util.device): the GPU path of the statistics kernels.

The path runs everywhere: ``torch:cpu`` is the very code the GPU runs, on torch's CPU device,
so CPU/GPU parity is checked on every machine; the ``cuda`` cases run where torch sees a GPU and
skip elsewhere. Parity means: under one noise seed the ledgers are identical (noise is drawn by
the ledger on the CPU whatever the device) and the released models and metrics agree to float32
rounding."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import fedpriv
from fedpriv.algorithms import kernels
from fedpriv.errors import ConfigError
from fedpriv.util import device

DATA = "synthetic-mf:users=1500,items=200,ratings=40000,seed=5,select=1.5"
RUNS = [
    ("adadpals", dict(rank=8, steps=3, defaults="fixed")),
    ("topk", dict(topk_items=120)),
    ("topk-lowrank", dict(topk_items=120)),
    ("dpsgd", dict(rank=4, steps=2, defaults="fixed")),  # its clients' clipped gradient rows on the device
]
#: the encoder family: its server fit (the encoder's parameters, Adam) runs on the device; on
#: torch's CPU device that is the CPU, so those cases are in the slow suite
ENCODER_RUNS = [
    ("am-ssp", dict(rank=4, steps=2, defaults="fixed")),
    ("am-ssp-convex", dict(rank=4, steps=2, defaults="fixed")),
    ("am-dpsgd", dict(rank=4, steps=2, defaults="fixed")),
]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


DEVICES = ["torch:cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _cuda(), reason="no CUDA device on this machine"))]


@pytest.fixture(scope="module")
def data():
    return fedpriv.load_data(DATA)


def _model(state) -> np.ndarray:
    for key in ("item_item", "item_factors", "item_bias"):
        v = getattr(state, key)
        if v is not None and np.size(v):
            return np.asarray(v, dtype=np.float64)
    raise AssertionError("no released model")


_NO_CUDA = pytest.mark.skipif(not _cuda(), reason="no CUDA device on this machine")
CASES = (
    [pytest.param("torch:cpu", a, p, id=f"{a}-torch:cpu") for a, p in RUNS]
    + [pytest.param("cuda", a, p, id=f"{a}-cuda", marks=_NO_CUDA) for a, p in RUNS]
    + [pytest.param("torch:cpu", a, p, id=f"{a}-torch:cpu", marks=pytest.mark.slow) for a, p in ENCODER_RUNS]
    + [pytest.param("cuda", a, p, id=f"{a}-cuda", marks=_NO_CUDA) for a, p in ENCODER_RUNS]
)


@pytest.mark.parametrize("dev,algorithm,params", CASES)
def test_a_run_on_the_device_has_the_cpu_runs_ledger_and_its_model(data, dev, algorithm, params):
    cpu = fedpriv.train(algorithm, data, epsilon=5.0, noise_seed=3, second_opinion=False, **params)
    gpu = fedpriv.train(algorithm, data, epsilon=5.0, noise_seed=3, second_opinion=False, engine_options={"device": dev}, **params)
    assert gpu.ledger == cpu.ledger  # every noise value, std and count
    a, b = _model(gpu.model.state), _model(cpu.model.state)
    assert a.shape == b.shape
    assert np.max(np.abs(a - b)) <= 1e-4 * max(np.max(np.abs(b)), 1.0), np.max(np.abs(a - b))
    for key in ("test_rmse", "valid_rmse", "test_logloss"):
        if cpu.metrics.get(key) is not None:
            assert gpu.metrics[key] == pytest.approx(cpu.metrics[key], rel=1e-5)
    if "ranking" in cpu.metrics:
        assert gpu.metrics["ranking"]["recall"] == pytest.approx(cpu.metrics["ranking"]["recall"], abs=0.01)
    assert gpu.metrics["epsilon_spent"] == cpu.metrics["epsilon_spent"]


@pytest.mark.parametrize("dev", DEVICES)
def test_each_kernel_matches_the_cpu_back_end(dev):
    rng = np.random.default_rng(0)
    n_src, d, n_seg = 300, 6, 40
    factors = rng.normal(size=(n_src, d)).astype(np.float32)
    counts = rng.integers(0, 30, n_seg)
    counts[3] = 700  # one segment over the piece length
    indptr = np.concatenate([[0], np.cumsum(counts)])
    index = rng.integers(0, n_src, indptr[-1])
    weights, targets = rng.uniform(-0.2, 2.0, indptr[-1]), rng.normal(size=indptr[-1])
    order = rng.permutation(indptr[-1])
    ref = kernels.segment_stats(factors, index, indptr, weights, targets, order=order)
    A = rng.normal(size=(50, d, d)).astype(np.float32)
    A = A @ A.transpose(0, 2, 1)
    A[7] = 0.0  # singular with zero ridge: the least-squares fallback
    b = rng.normal(size=(50, d))
    reg = np.where(np.arange(50) == 7, 0.0, 0.5)
    S = rng.normal(size=(50, d, d)).astype(np.float32)  # indefinite: projected
    X = sp.random(80, 30, density=0.2, random_state=1, format="csr")
    M = X.T @ X + 3 * sp.eye(30)
    Q = np.linalg.qr(rng.normal(size=(30, 4)))[0]
    refs = (kernels.solve_spd(A, b, reg), kernels.project_psd(S, 0.1), kernels.project_psd_solve(S, b, 0.1, 0.5),
            kernels.sparse_gram(X), kernels.inverse(M.toarray()), kernels.sparse_sketch(X, Q))
    with device.use(dev):
        got = kernels.segment_stats(factors, index, indptr, weights, targets, order=order)
        outs = (kernels.solve_spd(A, b, reg), kernels.project_psd(S, 0.1), kernels.project_psd_solve(S, b, 0.1, 0.5),
                kernels.sparse_gram(X), kernels.inverse(M.toarray()), kernels.sparse_sketch(X, Q))
    for x, y in ((got.A, ref.A), (got.b, ref.b), (got.c, ref.c)):
        assert np.allclose(x, y, rtol=1e-4, atol=1e-3)
    for x, y in zip(outs, refs):
        assert x.shape == y.shape and np.all(np.isfinite(x))
        assert np.allclose(x, y, rtol=1e-3, atol=1e-3), np.max(np.abs(x - y))


@pytest.mark.parametrize("dev", DEVICES)
def test_the_fused_user_solve_equals_the_sums_then_the_solves(dev):
    """segment_solve (the users' local least squares; on a device the Gram blocks stay there)
    against segment_stats then solve_spd on the same device and on the CPU, with the gravity
    term and a user whose system the float32 Cholesky rejects (no ratings, zero ridge: the
    float64 fallback gives 0)."""
    rng = np.random.default_rng(1)
    n_src, d, n_seg = 120, 5, 60
    V = rng.normal(size=(n_src, d)).astype(np.float32)
    counts = rng.integers(1, 25, n_seg)
    counts[4], counts[9] = 0, 400  # no ratings; one segment over the piece length
    indptr = np.concatenate([[0], np.cumsum(counts)])
    index, y = rng.integers(0, n_src, indptr[-1]), rng.normal(size=indptr[-1])
    reg = np.where(np.arange(n_seg) == 4, 0.0, 0.1 * np.maximum(counts, 1))
    gravity = (0.3 * V.T.astype(np.float64) @ V).astype(np.float32)
    for extra in (None, gravity):
        def composed():
            st = kernels.segment_stats(V, index, indptr, targets=y)
            return kernels.solve_spd(st.A if extra is None else st.A + extra, st.b, reg)

        cpu = composed()
        with device.use(dev):
            fused, ref = kernels.segment_solve(V, index, indptr, y, reg, extra), composed()
        assert np.all(np.isfinite(fused)) and np.array_equal(fused[4], np.zeros(d))  # the fallback's minimum-norm solution
        assert np.array_equal(fused, ref)  # the same float32 sums and solves, without the round trip
        assert np.allclose(fused, cpu, rtol=1e-4, atol=1e-5)


def _read_only(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("dev", DEVICES)
def test_a_shards_read_only_index_arrays_stay_on_the_device_between_calls(dev):
    """The device path copies a read-only index array (a shard's) to the device once and keeps
    it; per call only the factors, weights and targets travel (float32). The positive control:
    the same arrays, writeable, are copied on every call. The sums are the same either way."""
    rng = np.random.default_rng(2)
    n_src, d, n_seg, n = 50, 4, 30, 20_000
    F = rng.normal(size=(n_src, d)).astype(np.float32)
    indptr = np.concatenate([[0], np.sort(rng.integers(0, n, n_seg - 1)), [n]])
    index, order = rng.integers(0, n_src, n), rng.permutation(n)
    w, y = rng.uniform(0, 1, n), rng.normal(size=n)
    ref = kernels.segment_stats(F, index, indptr, w, y, order=order)
    index_bytes = 2 * n * 8  # the int64 index and order

    def moved(idx, o):
        before = device.transfers["to_device"]
        with device.use(dev):
            got = kernels.segment_stats(F, idx, indptr, w, y, order=o)
        assert np.allclose(got.A, ref.A, rtol=1e-4, atol=1e-3) and np.allclose(got.b, ref.b, rtol=1e-4, atol=1e-3)
        return device.transfers["to_device"] - before

    fixed_index, fixed_order = _read_only(index), _read_only(order)
    first, second = moved(fixed_index, fixed_order), moved(fixed_index, fixed_order)
    assert first - second >= index_bytes  # the second call found both on the device
    assert second <= F.nbytes + 2 * 4 * n + 4096  # the factors, the float32 weights and targets (and the plan's first copy: none)
    writeable = [moved(index, order) for _ in range(2)]
    assert min(writeable) - second >= index_bytes  # copied every time
    view = fixed_index[: indptr[10]]  # a view of read-only memory is kept too
    with device.use(dev):
        for _ in range(2):
            kernels.segment_stats(F, view, indptr[:11])


@pytest.mark.parametrize("dev", DEVICES)
def test_out_of_range_entries_are_errors_on_the_device_path_too(dev):
    """The device path checks its index and order bounds (once for a kept array) and raises
    what the CPU back ends raise."""
    F = np.ones((10, 4), np.float32)
    indptr = np.array([0, 2, 5])
    with device.use(dev):
        for bad in (10, -1):
            for make in (np.array, _read_only):
                for _ in range(2):  # the second call of a read-only array reads the kept bounds
                    with pytest.raises(IndexError, match="index holds entries outside"):
                        kernels.segment_stats(F, make([0, 1, 2, bad, 3]), indptr, weights=np.ones(5))
                    with pytest.raises(IndexError, match="index holds entries outside"):
                        kernels.segment_solve(F, make([0, 1, 2, bad, 3]), indptr, np.ones(5), 0.1)
        with pytest.raises(IndexError, match="order holds entries outside"):
            kernels.segment_stats(F, np.arange(5), indptr, weights=np.ones(5), order=_read_only([0, 1, 2, 3, 5]))


def test_a_shards_index_arrays_are_its_own_and_read_only():
    from fedpriv.algorithms.shards import UserShard

    items = np.array([3, 1, 2, 1], np.int32)
    shard = UserShard(np.arange(2), np.array([0, 2, 4]), items, np.ones(4, np.float32))
    items[0] = 0  # the caller's array stays the caller's
    assert shard.items[0] == 3 and shard.items.dtype == np.int32 and shard.ratings.dtype == np.float32
    for a in (shard.items, shard.ratings, shard.by_item_order, shard.by_item_local_users, shard.local_user_of_rating):
        assert not a.flags.writeable


def test_the_device_is_checked_and_scoped():
    with pytest.raises(ConfigError) as e:
        with device.use("tpu"):
            pass
    assert e.value.field == "device" and "tpu" in str(e.value)
    if not _cuda():
        with pytest.raises(ConfigError, match="no CUDA device"):
            fedpriv.train("bias", DATA, epsilon=5.0, engine_options={"device": "cuda"})
    with device.use("torch:cpu"):
        assert device.current() == "torch:cpu" and device.torch_device() is not None
    assert device.current() == "cpu" and device.torch_device() is None  # back after the block


def test_the_cli_refuses_a_device_this_machine_lacks_before_anything_starts(tmp_path, capsys):
    from fedpriv.cli import main

    for engine in ("flower", "inprocess"):
        rc = main(["run", "bias", "--data", DATA, "--epsilon", "5", "--engine", engine, "--device", "tpu", "--out", str(tmp_path / "o")])
        assert rc == 2 and "--device" in capsys.readouterr().err
        assert not (tmp_path / "o").exists()


@pytest.mark.flower  # a Flower grid: runs on the newest supported Flower (scripts/test.sh)
def test_the_flower_server_computes_on_its_device_with_the_same_ledger(tmp_path, monkeypatch):
    """The Flower engine's server side (item solves, the ServerApp's fits) on the device path
    (``FlowerCallback(device="torch:cpu")``: the GPU code on the CPU) gives the CPU run's ledger
    and model; the nodes stay on the CPU (their own configuration). The counter is the positive
    control: without the device the path is not taken."""
    from fedpriv.algorithms import device_kernels
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import FlowerCallback, Job
    from fedpriv.testing.local_grid import LocalGrid

    calls = []
    real = device_kernels._cholesky  # the device's solves: solve_on_device and the fused user solve
    monkeypatch.setattr(device_kernels, "_cholesky", lambda *a, **k: calls.append(1) or real(*a, **k))
    plan = Job("adadpals", DATA, epsilon=5.0, noise_seed=4, params={"rank": 4, "steps": 2, "defaults": "fixed"}).prepare()
    runs, counts = {}, {}
    for name in (None, "torch:cpu"):
        calls.clear()
        runs[name] = plan.execute(FlowerCallback(runner=lambda job, n: run_job(LocalGrid(n), job), users_per_node=500, device=name), second_opinion=False)
        counts[name] = len(calls)
    assert counts[None] == 0 and counts["torch:cpu"] > 0
    assert runs["torch:cpu"].ledger == runs[None].ledger
    a, b = runs["torch:cpu"].state.item_factors, runs[None].state.item_factors
    assert np.max(np.abs(a - b)) <= 1e-4 * max(np.max(np.abs(b)), 1.0)


def test_flwr_run_passes_the_server_device_in_the_run_config():
    from fedpriv.ops.launcher import job_run_config
    from fedpriv.run import Job

    job = Job("bias", DATA, epsilon=5.0)
    assert job_run_config(job, DATA, users_per_node=10, nodes=2, round_timeout=0, node_wait=1, server_device="cuda")["server-device"] == "cuda"
    assert job_run_config(job, DATA, users_per_node=10, nodes=2, round_timeout=0, node_wait=1)["server-device"] == "cpu"


@pytest.mark.flower  # a Flower grid: runs on the newest supported Flower (scripts/test.sh)
def test_a_node_computes_on_its_own_configured_device(tmp_path, monkeypatch):
    """A node whose own configuration names a device (here ``FEDPRIV_NODE_DEVICE=torch:cpu``, as
    FlowerSimulation(node_device=...) sets it for its workers) runs its training step on the
    device path, and the run's ledger and model are the CPU run's; without the setting it does
    not (the positive control of the counter)."""
    from fedpriv.algorithms import device_kernels
    from fedpriv.flower.node_device import ENV
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import FlowerCallback, Job
    from fedpriv.testing.local_grid import LocalGrid

    calls = []
    real = device_kernels.stats_on_device
    monkeypatch.setattr(device_kernels, "stats_on_device", lambda *a, **k: calls.append(1) or real(*a, **k))
    plan = Job("adadpals", DATA, epsilon=5.0, noise_seed=4, params={"rank": 4, "steps": 2, "defaults": "fixed"}).prepare()
    runs = {}
    for name in ("cpu", "torch:cpu"):
        if name == "torch:cpu":
            monkeypatch.setenv(ENV, name)
        calls.clear()
        runs[name] = plan.execute(FlowerCallback(runner=lambda job, n: run_job(LocalGrid(n), job), users_per_node=500, work_dir=tmp_path / name.replace(":", "-")))
        runs[name + "_calls"] = len(calls)
    assert runs["cpu_calls"] == 0 and runs["torch:cpu_calls"] > 0
    assert runs["torch:cpu"].ledger == runs["cpu"].ledger
    a, b = runs["torch:cpu"].state.item_factors, runs["cpu"].state.item_factors
    assert np.max(np.abs(a - b)) <= 1e-4 * max(np.max(np.abs(b)), 1.0)


def test_a_gpu_share_is_refused_where_there_is_no_gpu_and_a_gpu_node_needs_one():
    from fedpriv.flower.simulation import _check_gpu_share

    with pytest.raises(ConfigError) as e:
        _check_gpu_share(0.0, "cuda", local=True)
    assert e.value.field == "node_device"
    with pytest.raises(ConfigError):
        _check_gpu_share(-1.0, None, local=True)
    _check_gpu_share(0.0, None, local=True)  # the default: no share, the CPU
    if not _cuda():
        with pytest.raises(ConfigError, match="no CUDA device") as e:
            _check_gpu_share(0.5, "cuda", local=True)
        assert e.value.field == "gpus_per_node"


def test_the_low_rank_sketch_fixes_its_singular_vectors_signs():
    """Two back ends may return a singular vector with either sign (a CUDA run's float32 sketch
    did, on the H200): the released factors take one sign per column, so flipped columns give the
    same factors, and the scores F F^T are those of the unsigned vectors."""
    from fedpriv.algorithms.topk import canonical_signs

    U = np.linalg.qr(np.random.default_rng(0).normal(size=(30, 5)))[0]
    flipped = U * np.array([1, -1, -1, 1, -1])
    assert np.array_equal(canonical_signs(U), canonical_signs(flipped))
    assert not np.array_equal(U, flipped)  # the control: the input did differ
    C = canonical_signs(U)
    assert np.allclose(C @ C.T, U @ U.T)
    assert np.all(C[np.argmax(np.abs(C), axis=0), np.arange(5)] > 0)


@pytest.mark.parametrize("dev", [pytest.param("torch:cpu", marks=pytest.mark.slow), *DEVICES[1:]])  # torch:cpu: 17 s of encoder fits
def test_am_dpsgd_clients_take_their_per_user_gradients_on_the_device(dev, monkeypatch):
    from fedpriv.algorithms import ssp

    seen = []
    real = ssp.per_user_clipped_gradient

    def spy(encoder, *a, **kw):
        seen.append(encoder.offset.device.type)
        return real(encoder, *a, **kw)

    monkeypatch.setattr("fedpriv.algorithms.ssp.per_user_clipped_gradient", spy)  # the name the clients call
    data = fedpriv.load_data("synthetic-mf:users=150,items=40,ratings=2000,seed=5")
    fedpriv.train("am-dpsgd", data, epsilon=5.0, second_opinion=False, rank=2, steps=1, defaults="fixed", engine_options={"device": dev})
    assert seen, "the clients' gradient was never taken"
    assert set(seen) == {"cpu" if dev == "torch:cpu" else "cuda"}


@pytest.mark.parametrize("dev", DEVICES)
def test_a_release_noised_on_the_device_is_solved_there_without_a_copy_back(dev):
    """The ledger's device noise returns a read-only release and keeps its device copy; the
    server's solve of it copies nothing to the device, and gives the solve of a writeable copy
    of the same release (the positive control, which is copied). The kept copy goes with the
    release."""
    import gc

    from fedpriv.privacy.ledger import PrivacyLedger

    rng = np.random.default_rng(3)
    n, d = 40, 5
    A = rng.normal(size=(n, d, d))
    A = A @ A.transpose(0, 2, 1)
    b = rng.normal(size=(n, d))
    with device.use(dev):
        led = PrivacyLedger()
        released = led.gaussian("A", A, sensitivity=1.0, noise_multiplier=2.0, symmetric=True)
        assert not released.flags.writeable and np.array_equal(released, np.swapaxes(released, 1, 2))
        before = device.transfers["to_device"]
        x = kernels.project_psd_solve(released, b, 0.1, 0.5)
        kept_bytes = device.transfers["to_device"] - before
        before = device.transfers["to_device"]
        y = kernels.project_psd_solve(np.array(released), b, 0.1, 0.5)
        copied_bytes = device.transfers["to_device"] - before
    assert np.array_equal(x, y)
    assert copied_bytes - kept_bytes >= A.nbytes // 2  # the writeable copy crossed (as float32), the release did not
    assert kept_bytes <= b.nbytes
    kept = len(device._kept)
    del released
    gc.collect()
    assert len(device._kept) == kept - 1


@pytest.mark.parametrize("dev", DEVICES)
def test_dpsgd_clients_clipped_gradient_rows_are_the_cpus_on_the_device(dev, monkeypatch):
    """Federated DP-SGD's client sum (kernels.clipped_gradient_rows) on the device: the same
    items and gradient rows as the CPU's, with users whose gradients are clipped, one under the
    clip and one with zero residuals; the device kernel ran (the counter), and on the CPU it
    does not (the positive control)."""
    from fedpriv.algorithms import device_kernels

    rng = np.random.default_rng(4)
    n_users, n_items, d1 = 40, 30, 5
    X = np.hstack([rng.normal(size=(n_users, d1 - 1)), np.ones((n_users, 1))])
    theta = rng.normal(size=(n_items, d1))
    rows = np.sort(rng.integers(0, n_users, 600))
    items = rng.integers(0, n_items, 600)
    y = rng.normal(size=600) * 3
    y[rows == 5] = np.einsum("nd,nd->n", X[rows[rows == 5]], theta[items[rows == 5]])  # user 5: zero residuals
    calls = []
    real = device_kernels.gradient_rows_on_device
    monkeypatch.setattr(device_kernels, "gradient_rows_on_device", lambda *a: calls.append(1) or real(*a))
    for clip in (0.5, 1e6):
        ids, G = kernels.clipped_gradient_rows(X, theta, rows, items, y, clip)
        assert not calls
        with device.use(dev):
            ids_d, G_d = kernels.clipped_gradient_rows(X, theta, rows, items, y, clip)
        assert len(calls) == 1
        calls.clear()
        assert np.array_equal(ids, ids_d) and G_d.dtype == np.float64
        assert np.allclose(G_d, G, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dev", DEVICES)
def test_targets_made_on_the_device_are_the_hosts(dev):
    """kernels.Targets (ratings less the mean, less per-item and per-user terms, clipped) made
    on the device give exactly the sums and solves of the same targets made on the host and
    passed as an array; the shard's ratings stay on the device between calls (the positive
    control: a writeable copy of them is copied each time); a bad term index is an error."""
    rng = np.random.default_rng(5)
    n_src, d, n_seg, n = 60, 4, 25, 3000
    F = rng.normal(size=(n_src, d)).astype(np.float32)
    indptr = np.concatenate([[0], np.sort(rng.integers(0, n, n_seg - 1)), [n]])
    index, order = _read_only(rng.integers(0, n_src, n)), _read_only(rng.permutation(n))
    ratings = _read_only(rng.integers(1, 6, n).astype(np.float32))
    items, users = _read_only(rng.integers(0, 40, n)), _read_only(rng.integers(0, n_seg, n))
    item_bias, user_bias = rng.normal(size=40), rng.normal(size=n_seg) * 3
    ratings_copy = np.array(ratings)
    for implicit in (False, True):
        base = None if implicit else ratings
        y = kernels.Targets(n, base, 0.0 if implicit else 3.5).minus(item_bias, items).minus(user_bias, users).clipped(1.2)
        host = y.values()
        assert np.max(np.abs(host)) <= 1.2 and len(np.unique(host)) > 10
        with device.use(dev):
            a = kernels.segment_stats(F, index, indptr, weights=np.ones(n), targets=y, order=order)
            b = kernels.segment_stats(F, index, indptr, weights=np.ones(n), targets=host, order=order)
            x = kernels.segment_solve(F, index, indptr, y, 0.3)
            x_host = kernels.segment_solve(F, index, indptr, host, 0.3)
        assert np.array_equal(a.A, b.A) and np.array_equal(a.b, b.b) and np.array_equal(a.c, b.c)
        assert np.array_equal(x, x_host)
        assert np.allclose(x, kernels.segment_solve(F, index, indptr, y, 0.3), rtol=1e-4, atol=1e-5)  # the CPU back end
    with device.use(dev):
        kept = lambda r: kernels.segment_stats(F, index, indptr, targets=kernels.Targets(n, r, 3.5), order=order)  # noqa: E731
        kept(ratings)
        before = device.transfers["to_device"]
        kept(ratings)
        kept_bytes = device.transfers["to_device"] - before
        before = device.transfers["to_device"]
        kept(ratings_copy)
        assert device.transfers["to_device"] - before - kept_bytes >= ratings.nbytes
        with pytest.raises(IndexError, match="targets: index holds entries outside"):
            kernels.segment_stats(F, index, indptr, targets=kernels.Targets(n, ratings, 3.5).minus(item_bias[:30], items))


@pytest.mark.parametrize("dev", DEVICES)
def test_item_sums_made_on_the_device_are_the_hosts_and_go_to_the_noise_without_a_copy(dev):
    """The shards' item statistics summed on the device (kernels.sum_rows, as sum_item_stats
    does) equal the host's float64 sums exactly; the ledger's device noise reads them there
    (nothing is copied to the device), and checks their finiteness there: a non-finite sum is
    refused on the device path as on the host (the positive control of the check)."""
    from fedpriv.errors import PrivacyError
    from fedpriv.privacy.ledger import PrivacyLedger

    rng = np.random.default_rng(6)
    n_items, d = 30, 4
    pieces = [(np.sort(rng.choice(n_items, 12, replace=False)), rng.normal(size=(12, d, d)).astype(np.float32)) for _ in range(3)]
    host = kernels.sum_rows((n_items, d, d), pieces)
    with device.use(dev):
        on_device = kernels.sum_rows((n_items, d, d), pieces)
        assert np.array_equal(on_device, host) and not on_device.flags.writeable
        led = PrivacyLedger()
        before = device.transfers["to_device"]
        led.gaussian("A", on_device, sensitivity=1.0, noise_multiplier=2.0)
        assert device.transfers["to_device"] == before  # read where it was summed
        bad = [(pieces[0][0], np.where(np.arange(12)[:, None, None] == 3, np.inf, pieces[0][1]))]
        with pytest.raises(PrivacyError, match="non-finite"):
            led.gaussian("B", kernels.sum_rows((n_items, d, d), bad), sensitivity=1.0, noise_multiplier=2.0)
    assert [r.name for r in led.releases] == ["A"]


@pytest.mark.parametrize("dev", DEVICES)
def test_a_non_private_run_on_the_device_is_the_cpu_runs(data, dev):
    """Without noise the device's sums go straight to the server's solve (read where they were
    made): the model and metrics are the CPU run's to float32 rounding."""
    cpu = fedpriv.train("als", data, rank=4, steps=2)
    gpu = fedpriv.train("als", data, rank=4, steps=2, engine_options={"device": dev})
    a, b = gpu.model.state.item_factors, cpu.model.state.item_factors
    assert np.max(np.abs(a - b)) <= 1e-4 * max(np.max(np.abs(b)), 1.0)
    assert gpu.metrics["test_rmse"] == pytest.approx(cpu.metrics["test_rmse"], rel=1e-5)


def test_a_kept_copy_is_found_under_either_cuda_name_of_its_gpu():  # "cuda" in the name: gpu_check.sh runs it on the GPU
    """torch names the current GPU "cuda" where a run asks for it and "cuda:N" on the tensors
    it makes there: a copy kept under one name is found under the other (on a machine without
    a GPU the names are compared as if GPU 0 were current)."""
    import torch

    a = np.arange(5.0)
    a.flags.writeable = False
    marker = object()
    device.keep(a, torch.device("cuda:0") if not _cuda() else torch.device(f"cuda:{torch.cuda.current_device()}"), marker)
    assert device.kept(a, torch.device("cuda")) is marker
    assert device.kept(a, torch.device("cpu")) is None
    b = np.arange(5.0)  # writeable: never kept
    device.keep(b, torch.device("cpu"), marker)
    assert device.kept(b, torch.device("cpu")) is None


@pytest.mark.parametrize("dev", DEVICES)
def test_kept_weights_are_read_in_the_order_they_were_kept_for(dev):
    """Read-only weights are kept on the device in the order they were prepared for; another
    order (a new array, read-only or not) prepares them again, so the sums are always those
    of the order given."""
    rng = np.random.default_rng(7)
    n_src, d, n_seg, n = 20, 3, 8, 500
    F = rng.normal(size=(n_src, d)).astype(np.float32)
    indptr = np.concatenate([[0], np.sort(rng.integers(0, n, n_seg - 1)), [n]])
    index = _read_only(rng.integers(0, n_src, n))
    w = _read_only(rng.uniform(0, 1, n))
    for make in (_read_only, np.array):
        for seed in range(3):
            order = make(np.random.default_rng(seed).permutation(n))
            ref = kernels.segment_stats(F, index, indptr, weights=w, order=order)
            with device.use(dev):
                got = kernels.segment_stats(F, index, indptr, weights=w, order=order)
            assert np.allclose(got.A, ref.A, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dev", DEVICES)
def test_a_device_array_reads_as_a_read_only_numpy_array_copied_once(dev):
    """What a device kernel leaves on the device reads as a numpy array wherever host code reads
    it: its shape, dtype and length copy nothing; an integer-and-slice index copies only that
    part; the whole crosses once, read-only, and is not copied again; numpy's operators and
    functions give the host array's results; a change of dtype stays on the device."""
    import torch

    with device.use(dev):
        tdev = device.torch_device()
        values = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
        x = device.DeviceArray(torch.from_numpy(values.copy()).to(tdev), tdev)
        before = device.transfers["to_host"]
        assert (x.shape, x.dtype, len(x), x.ndim, x.size) == ((2, 3, 4), np.float64, 2, 3, 24)
        assert device.transfers["to_host"] == before
        assert np.array_equal(x[:, -1, -1], values[:, -1, -1])
        assert device.transfers["to_host"] - before == 2 * 8  # the two entries asked for
        y = x.astype(np.float32)
        assert isinstance(y, device.DeviceArray) and y.dtype == np.float32 and x.astype(np.float64, copy=False) is x
        assert device.transfers["to_host"] - before == 2 * 8
        host = np.asarray(x)
        assert np.array_equal(host, values) and not host.flags.writeable
        with pytest.raises(ValueError):
            host[0, 0, 0] = 1.0
        assert device.transfers["to_host"] - before == 2 * 8 + values.nbytes
        assert np.array_equal(x + 1, values + 1) and np.array_equal(values - x, 0 * values)
        assert float(np.sum(x)) == x.sum() == values.sum() and np.array_equal(x.T, values.T)
        assert np.array_equal(np.concatenate([x, x]), np.concatenate([values, values]))
        assert device.transfers["to_host"] - before == 2 * 8 + values.nbytes  # the host copy, read again
        assert device.kept(x, tdev) is x.tensor and device.kept(host, tdev) is x.tensor


def _adadpals_step_state(inter, d: int, steps: int = 2):
    """A private AdaDPALS state ready for its steps, its setup releases taken as exact (the
    steps' transfers are measured, not the setup's), and its ledger."""
    from fedpriv.algorithms import als
    from fedpriv.engine.inprocess import new_state

    state, ledger = new_state("adadpals", als.ALSConfig(rank=d, steps=steps), inter, (1.0, 5.0), False, 5.0, 1e-5)
    state.mean, state.n_users, state.counts_hat = 3.5, inter.n_users, inter.item_counts().astype(np.float64)
    als.server_weights(state)  # the server's own rule, from those counts
    als.server_init(state)
    return state, ledger


@pytest.mark.parametrize("dev", DEVICES)
def test_an_adadpals_step_keeps_its_item_side_on_the_device(dev):
    """A private AdaDPALS step on the device: the users' solves, their clipped rows, the shard's
    item statistics, their sums, the ledger's noise and the server's solve stay there. What
    crosses to the host is the item solve's result; what crosses to the device is the item
    factors and a few item-long vectors (the targets' bias terms). The positive control: a host
    read of the release moves the statistics."""
    from fedpriv.algorithms import als
    from fedpriv.algorithms.shards import shard_users
    from fedpriv.data.synthetic import make_mf

    inter = make_mf(300, 2000, 20_000, seed=1).interactions  # many items: the statistics dominate
    d = 16
    stats_bytes = inter.n_items * (d + 1) ** 2 * 4  # one float32 copy of the item statistics
    with device.use(dev):
        state, ledger = _adadpals_step_state(inter, d)
        shard = shard_users(inter)
        als.server_item_update(*als.release_item_stats(*als.sum_item_stats([als.client_item_stats(shard, state)], state.n_items, d + 1), state, ledger), state)
        before, sent = device.transfers["to_host"], device.transfers["to_device"]
        part = als.client_item_stats(shard, state)
        A, b, g = als.release_item_stats(*als.sum_item_stats([part], state.n_items, d + 1), state, ledger)
        als.server_item_update(A, b, g, state)
        moved, sent = device.transfers["to_host"] - before, device.transfers["to_device"] - sent
        assert isinstance(A, device.DeviceArray) and isinstance(part.A, device.DeviceArray)
        assert isinstance(state.item_factors, np.ndarray) and state.item_factors.shape == (inter.n_items, d)
        assert moved <= 8 * inter.n_items * (d + 1) < stats_bytes  # the server's item solve, nothing else
        assert sent <= 4 * inter.n_items * d + 8 * 4 * inter.n_items  # the item factors, a few item-long vectors: nothing per user or per rating
        before = device.transfers["to_host"]
        np.asarray(A)
        assert device.transfers["to_host"] - before >= 2 * stats_bytes  # float64: the control crosses
    assert [(r.name, r.count) for r in ledger.releases] == [("item_stats_A", 2), ("item_stats_b", 2)]


@pytest.mark.parametrize("dev", DEVICES)
def test_nothing_a_run_keeps_is_left_on_the_device(data, dev):
    """The device's arrays stay inside a step: a trained model's state and its saved form
    hold numpy arrays only (a DeviceArray in the state would tie the model to the device)."""
    import dataclasses

    res = fedpriv.train("adadpals", data, rank=4, steps=2, defaults="fixed", epsilon=5.0, engine_options={"device": dev})
    state = res.model.state
    kinds = {f.name: type(getattr(state, f.name)) for f in dataclasses.fields(state)}
    assert not [k for k, t in kinds.items() if t is device.DeviceArray]
    assert isinstance(state.item_factors, np.ndarray)


@pytest.mark.parametrize("dev", DEVICES)
def test_the_encoder_servers_projected_release_is_read_on_the_device(dev):
    """AM-SSP's server fit reads the projected release where the projection left it
    (device.as_tensor copies nothing to the device); the control, the same values from the
    host, is copied. Both give the host projection's values."""
    import torch

    rng = np.random.default_rng(8)
    A = rng.normal(size=(50, 6, 6))
    A = A + np.swapaxes(A, 1, 2)  # symmetric, indefinite: the projection clips
    host = kernels.project_psd(A, 0.1)
    with device.use(dev):
        tdev = device.torch_device()
        projected = kernels.project_psd(A, 0.1)
        before = device.transfers["to_device"]
        t = device.as_tensor(projected, tdev, torch.float32)
        assert device.transfers["to_device"] == before
        u = device.as_tensor(np.array(projected), tdev, torch.float32)
        assert device.transfers["to_device"] - before == A.size * 4
    assert np.allclose(t.cpu().numpy(), host, atol=1e-4) and np.array_equal(t.cpu().numpy(), u.cpu().numpy())


@pytest.mark.parametrize("dev", DEVICES)
def test_a_steady_step_in_many_user_chunks_copies_no_packing_again(dev, monkeypatch):
    """A shard whose user solve runs in many chunks (d = 128 at the ML-10M shape: 9; at the MSD
    shape: 72) has a packing per chunk: all stay cached with their device copies, and the item
    factors the chunks share are copied once, so a steady step copies only factors to the
    device. The control: with the packings dropped before the step, their slots cross again."""
    from fedpriv.algorithms import als
    from fedpriv.algorithms.shards import shard_users
    from fedpriv.data.synthetic import make_mf

    inter = make_mf(600, 150, 12_000, seed=2).interactions
    d = 6
    monkeypatch.setattr(als, "USER_CHUNK_FLOATS", 40 * (d + 2) ** 2)  # 40 users a chunk: 15 chunks
    # the users' rows; per chunk, two item-long vectors (the targets' bias tables); the item
    # factors once (not once per chunk: 15 copies of them would exceed this)
    factor_bytes = 8 * inter.n_users * (d + 2) + 8 * 2 * 15 * inter.n_items

    def step(state, ledger, shard):
        before = device.transfers["to_device"]
        part = als.client_item_stats(shard, state)
        als.server_item_update(*als.release_item_stats(*als.sum_item_stats([part], state.n_items, d + 1), state, ledger), state)
        return device.transfers["to_device"] - before

    with device.use(dev):
        state, ledger = _adadpals_step_state(inter, d, steps=3)
        shard = shard_users(inter)
        step(state, ledger, shard)
        steady = step(state, ledger, shard)
        kernels._plans.clear()
        rebuilt = step(state, ledger, shard)
    assert steady <= factor_bytes
    assert rebuilt - steady >= 8 * 2 * len(inter)  # the slots of the chunks' and the items' packings


@pytest.mark.parametrize("dev", DEVICES)
def test_users_rows_clipped_on_the_device_are_the_hosts(dev):
    """The users' rows as they enter the item statistics (kernels.released_rows: clipping, the
    bias column), made on the device from rows solved there, equal the host's
    (privacy.clipping.clip_rows) to float64 rounding: non-finite rows become zero, long rows are
    scaled to the bound, short rows are kept. A row stack made of pieces on the device stays
    there."""
    import torch

    rng = np.random.default_rng(9)
    U = rng.normal(size=(40, 5)) * rng.uniform(0.1, 3.0, size=(40, 1))
    U[3, 2] = np.nan
    U[7, 0] = np.inf
    host = kernels.released_rows(U, 1.5, 0.7)
    with device.use(dev):
        tdev = device.torch_device()
        pieces = [device.DeviceArray(torch.from_numpy(U[:25].copy()).to(tdev), tdev), device.DeviceArray(torch.from_numpy(U[25:].copy()).to(tdev), tdev)]
        stacked = kernels.stack_rows(pieces, 5)
        assert isinstance(stacked, device.DeviceArray)
        got = kernels.released_rows(stacked, 1.5, 0.7)
        assert isinstance(got, device.DeviceArray) and got.shape == (40, 6)
        unclipped = np.asarray(kernels.released_rows(stacked, None, None))
    got = np.asarray(got)
    assert np.allclose(got, host, rtol=1e-12, atol=1e-15)
    assert np.all(got[[3, 7], :5] == 0.0) and np.all(got[:, 5] == 0.7)
    assert np.max(np.linalg.norm(got[:, :5], axis=1)) <= 1.5 * (1 + 1e-12)
    finite = np.isfinite(U).all(axis=1)
    short = finite & (np.linalg.norm(np.where(finite[:, None], U, 0.0), axis=1) <= 1.5)
    assert short.any() and (finite & ~short).any() and np.array_equal(got[short, :5], U[short])  # short rows as they were
    assert np.array_equal(np.nan_to_num(unclipped[~np.isfinite(U).all(axis=1)], nan=1.0), np.zeros((2, 5)))


@pytest.mark.parametrize("dev", DEVICES)
def test_the_device_solves_leave_their_inputs_as_they_were(dev):
    """solve_spd does not write to the caller's A (overwrite_a is False by default) on any
    device: on torch's CPU device the copy to the "device" used to share the caller's memory,
    and the solve added its ridge to the caller's diagonal. The CPU back end is the control."""
    rng = np.random.default_rng(10)
    A = rng.normal(size=(40, 4, 4)).astype(np.float32)
    A = A @ A.transpose(0, 2, 1)
    b = rng.normal(size=(40, 4)).astype(np.float32)
    A0, b0 = A.copy(), b.copy()
    x_cpu = kernels.solve_spd(A, b, 0.5)
    assert np.array_equal(A, A0)
    with device.use(dev):
        x = kernels.solve_spd(A, b, 0.5)
        kernels.project_psd_solve(A, b, 0.1, 0.5)
    assert np.array_equal(A, A0) and np.array_equal(b, b0)
    assert np.allclose(x, x_cpu, rtol=1e-4, atol=1e-5)


def _indefinite(rng, n: int, d: int) -> np.ndarray:
    """Noised Gram matrices: indefinite, their scales spread over six decades (float32)."""
    G = rng.normal(size=(n, d, 2 * d))
    A = G @ G.transpose(0, 2, 1) * np.logspace(-3, 3, n)[:, None, None]
    N = rng.normal(size=(n, d, d)) * 5
    return (A + (N + N.transpose(0, 2, 1)) / 2).astype(np.float32)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("d", [33, 129])
def test_clipping_by_the_matrix_sign_is_the_eigendecompositions(dev, d, monkeypatch):
    """Above cuSOLVER's batched size (d + 1 = 33 at rank 32) a GPU clips the noised statistics
    by the matrix sign's Newton iteration (device_kernels._sign) in place of an eigendecomposition
    on the CPU. Run here on the device path with the CPU added: no matrix is decomposed, and
    the projection and the fused solve equal the CPU back end's (eigh) to float32 rounding. A
    singular matrix, where the inverse fails, is decomposed instead."""
    from fedpriv.algorithms import device_kernels

    monkeypatch.setattr(device_kernels, "SIGN_ITERATION", {"cpu", "cuda"})
    rng = np.random.default_rng(11)
    n = 40
    A = _indefinite(rng, n, d)
    A[5] = 0.0  # at floor 0: singular, outside (Cholesky fails), and the inverse fails
    A[6] = np.eye(d) * 4.0  # inside: solved as it is
    b = rng.normal(size=(n, d))
    ref_p, ref_x = kernels.project_psd(A, 0.0), kernels.project_psd_solve(A, b, 0.0, 0.5)
    decomposed = []
    eigh = device_kernels._eigh
    monkeypatch.setattr(device_kernels, "_eigh", lambda torch, X: (decomposed.append(len(X)), eigh(torch, X))[1])
    with device.use(dev):
        p = np.asarray(kernels.project_psd(A, 0.0))
        x = kernels.project_psd_solve(A, b, 0.0, 0.5)
    assert decomposed == [1, 1]  # the singular matrix, once per call
    scale = np.maximum(np.abs(ref_p).reshape(n, -1).max(axis=1), 1.0)
    assert np.max(np.abs(p - ref_p).reshape(n, -1).max(axis=1) / scale) < 1e-5
    assert np.max(np.abs(x - ref_x)) < 1e-5 * np.max(np.abs(ref_x))
    assert np.all(np.linalg.eigvalsh(p.astype(np.float64)) >= -1e-5 * scale[:, None])


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", ["all inside", "all outside", "mixed"])
def test_the_device_clipping_takes_each_branch_right(dev, case):
    """project_psd and project_psd_solve on a device keep (or solve) the matrices above the
    floor as they are and clip the others; the batch where none, all (the noised statistics'
    usual case: no plain solve is made and the batch is not copied) or some are clipped each
    equals the CPU back end's. The control: the clipped solution differs from the plain solve
    of the same indefinite matrices."""
    rng = np.random.default_rng(12)
    n, d = 30, 6
    G = rng.normal(size=(n, d, 2 * d))
    pd_ = (G @ G.transpose(0, 2, 1) + np.eye(d)).astype(np.float32)
    N = rng.normal(size=(n, d, d))
    indefinite = (N + N.transpose(0, 2, 1)).astype(np.float32)
    A = {"all inside": pd_, "all outside": indefinite, "mixed": np.where((np.arange(n) % 3 == 0)[:, None, None], pd_, indefinite)}[case]
    b = rng.normal(size=(n, d))
    outside = np.linalg.eigvalsh(A.astype(np.float64)).min(axis=1) < 0.1
    assert outside.sum() == {"all inside": 0, "all outside": n, "mixed": n - n // 3}[case]
    ref, ref_p = kernels.project_psd_solve(A, b, 0.1, 0.5), kernels.project_psd(A, 0.1)
    with device.use(dev):
        x = kernels.project_psd_solve(A, b, 0.1, 0.5)
        p = np.asarray(kernels.project_psd(A, 0.1))
    assert x.dtype == np.float64 and x.shape == (n, d)
    assert np.allclose(x, ref, rtol=1e-4, atol=1e-4 * np.max(np.abs(ref)))
    assert np.allclose(p, ref_p, rtol=1e-4, atol=1e-4 * np.max(np.abs(ref_p)))
    assert np.array_equal(p[~outside], A[~outside])  # the matrices above the floor as they were
    if outside.any():
        plain = np.linalg.solve(A[outside].astype(np.float64) + 0.5 * np.eye(d), b[outside][..., None])[..., 0]
        assert not np.allclose(x[outside], plain, rtol=1e-2, atol=1e-2)


def test_an_unconverged_sign_iteration_is_caught_and_decomposed(monkeypatch):
    """The positive control of the convergence check: cut to 4 steps, the iteration has not
    converged for most matrices, and its clipping would be wrong; each such matrix is reported
    and decomposed, so the result still equals the eigendecomposition's."""
    import torch

    from fedpriv.algorithms import device_kernels

    monkeypatch.setattr(device_kernels, "SIGN_ITERATION", {"cpu"})
    monkeypatch.setattr(device_kernels, "_SIGN_STEPS", 4)
    A = torch.from_numpy(_indefinite(np.random.default_rng(12), 30, 33))
    S, ok = device_kernels._sign(torch, A.double())
    B = A.double()
    early = 0.5 * (B + S @ B)
    exact = device_kernels._clip_by_eigh(torch, A, 0.0).double()
    wrong = (early - exact).flatten(1).abs().max(dim=1).values > 1e-5 * exact.flatten(1).abs().max(dim=1).values
    assert int((~ok).sum()) >= 20 and bool(wrong[~ok].any()) and not bool(wrong[ok].any())
    clipped = device_kernels._clip(torch, A, 0.0)
    assert torch.allclose(clipped, exact.float(), rtol=1e-4, atol=1e-4 * float(exact.abs().max()))


def test_a_rank_40_run_clipped_by_the_matrix_sign_has_the_cpu_runs_ledger_and_model(data, monkeypatch):
    """A whole private run at rank 40 (40 x 40 item statistics, every one indefinite after
    its noise) with the sign iteration on the device path: the CPU run's ledger, and its
    model and metrics to float32 rounding."""
    from fedpriv.algorithms import device_kernels

    monkeypatch.setattr(device_kernels, "SIGN_ITERATION", {"cpu"})
    calls = []
    sign = device_kernels._sign
    monkeypatch.setattr(device_kernels, "_sign", lambda torch, B: (calls.append(len(B)), sign(torch, B))[1])
    params = dict(rank=40, steps=2, defaults="fixed", epsilon=5.0, noise_seed=4, second_opinion=False)
    cpu = fedpriv.train("adadpals", data, **params)
    dev = fedpriv.train("adadpals", data, engine_options={"device": "torch:cpu"}, **params)
    assert len(calls) == 2 and sum(calls) >= 2 * 150  # each step's server solve: most of the 200 items by the sign iteration
    assert dev.ledger == cpu.ledger
    a, b = _model(dev.model.state), _model(cpu.model.state)
    assert np.max(np.abs(a - b)) <= 1e-4 * max(np.max(np.abs(b)), 1.0), np.max(np.abs(a - b))
    assert dev.metrics["test_rmse"] == pytest.approx(cpu.metrics["test_rmse"], rel=1e-5)
