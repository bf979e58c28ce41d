"""Noise drawn on the device (fedpriv.privacy.device_sampling): the ledger's lattice discrete
Gaussian, vectorised in torch, keyed with 128 bits of OS entropy per ledger.

The law is the CPU sampler's (the exact discrete Gaussian); a default device run's noise is
secret (two runs differ; the only seed is os.urandom: fixing it fixes the noise, the positive
control); a seeded ledger draws on the CPU on every device, so seeded runs are reproducible and
identical across devices. Cases run on torch's CPU device everywhere and on CUDA where present."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from fedpriv.privacy import device_sampling as ds
from fedpriv.privacy import sampling as cpu
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.util import device

torch = pytest.importorskip("torch")
DEVICES = ["torch:cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"))]


def _tdev(name: str):
    return torch.device("cpu" if name == "torch:cpu" else name)


def _pmf_z(k: np.ndarray, sigma2: float) -> float:
    """The largest |z| of the empirical frequencies against the exact pmf, over the values of
    -8..8 expected at least 20 times (one draw of a value expected 0.01 times is a z of 9:
    at sigma2 = 2 and 400,000 draws, one |value| of 8 in about 40 runs failed a correct
    sampler)."""
    ys = np.arange(-40, 41)
    p = np.exp(-(ys**2) / (2 * sigma2))
    p /= p.sum()
    n = len(k)
    emp = np.bincount(k + 40, minlength=81)[:81] / n
    inner = (np.abs(ys) <= 8) & (n * p >= 20)
    return float(np.max(np.abs(emp - p)[inner] / np.sqrt(p * (1 - p) / n)[inner]))


@pytest.mark.parametrize("dev,generators", [
    pytest.param("torch:cpu", None, id="torch:cpu"), pytest.param("torch:cpu", True, id="torch:cpu-generators"),
    pytest.param("cuda", None, id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")),
])
def test_the_device_sampler_draws_the_exact_discrete_gaussian(dev, generators):
    """The law, from either source of bits: the CPU's (torch:cpu) and the keyed generators
    combined (a GPU's; on the CPU their combination is checked, not the CPU generator's strength)."""
    bits = ds.DeviceBits(torch, _tdev(dev), generators)
    k = ds.discrete_gaussian_on_device(bits, 2.0, 400_000).cpu().numpy()
    assert _pmf_z(k, 2.0) < 5.5
    # a large variance: mean 0 and variance sigma2 (the discrete law's variance is sigma2 to 1e-9 there)
    big = ds.discrete_gaussian_on_device(bits, 1e8, 200_000).cpu().numpy().astype(np.float64)
    assert abs(big.mean()) < 5 * 1e4 / math.sqrt(len(big))
    assert abs(big.var() / 1e8 - 1) < 5 * math.sqrt(2 / len(big))
    # the CPU sampler, same law: the control that the test can see a wrong law
    assert _pmf_z(cpu.discrete_gaussian(cpu.BitSource(None), 2.0, 400_000), 2.0) < 5.5
    assert _pmf_z(k, 2.6) > 10


def test_the_exact_settlement_runs_and_keeps_the_law(monkeypatch):
    """With a wide margin most comparisons are settled by the CPU's exact routines: the law is
    unchanged (the routines and the device path agree), and the counter shows they ran."""
    calls = {"bernoulli": 0, "log": 0}
    exact_b, exact_l = cpu._exact_bernoulli_exp, cpu._exact_floor_neglog

    def b(*a):
        calls["bernoulli"] += 1
        return exact_b(*a)

    def lg(*a):
        calls["log"] += 1
        return exact_l(*a)

    monkeypatch.setattr(cpu, "_REL_MARGIN", 2.0**-6)
    monkeypatch.setattr(cpu, "_exact_bernoulli_exp", b)
    monkeypatch.setattr(cpu, "_exact_floor_neglog", lg)
    k = ds.discrete_gaussian_on_device(ds.DeviceBits(torch, torch.device("cpu")), 2.0, 60_000).numpy()
    assert calls["bernoulli"] > 500 and calls["log"] > 100
    assert _pmf_z(k, 2.0) < 5.5


def _release(ledger: PrivacyLedger, dev: str, value: np.ndarray) -> np.ndarray:
    with device.use(dev):
        return ledger.gaussian("x", value, sensitivity=1.0, noise_multiplier=1.0, symmetric=value.ndim == 3)


@pytest.mark.parametrize("dev", DEVICES)
def test_default_device_noise_is_secret_and_seeded_noise_is_the_cpus(dev, monkeypatch):
    value = np.random.default_rng(0).normal(size=(50, 4, 4))
    value = value + value.transpose(0, 2, 1)
    made = []
    init = ds.DeviceBits.__init__
    monkeypatch.setattr(ds.DeviceBits, "__init__", lambda self, *a: (made.append(1), init(self, *a))[1])
    a, b = _release(PrivacyLedger(), dev, value), _release(PrivacyLedger(), dev, value)
    assert len(made) == 2  # the device path drew them: one key per ledger
    assert not np.array_equal(a, b)
    assert np.allclose(a, a.transpose(0, 2, 1)) and 0.5 < np.std(a - value) < 2.0
    # a seeded ledger draws on the CPU on every device: reproducible and the CPU run's noise
    s_dev, s_cpu = _release(PrivacyLedger(seed=3), dev, value), _release(PrivacyLedger(seed=3), "cpu", value)
    assert np.array_equal(s_dev, s_cpu) and len(made) == 2
    # one ledger's releases continue its stream (no counter reused within a run)
    led = PrivacyLedger()
    first, second = _release(led, dev, value), _release(led, dev, value)
    assert not np.array_equal(first, second) and len(made) == 3


def _fixed_entropy(monkeypatch) -> tuple[list, callable]:
    """os.urandom replaced by a fixed byte stream (``restart()`` starts it again); the sizes
    asked are recorded."""
    asked, stream = [], {"rng": np.random.default_rng(0)}

    def fixed(n: int) -> bytes:
        asked.append(n)
        return stream["rng"].bytes(n)

    monkeypatch.setattr(ds.os, "urandom", fixed)
    return asked, lambda: stream.update(rng=np.random.default_rng(0))


def test_the_os_entropy_is_the_only_seed(monkeypatch):
    """Fixing os.urandom fixes the device noise (the positive control that nothing else seeds
    it), for the CPU device's bits and for the generators (each keyed with 8 bytes: 4 x 64 bits)."""
    asked, restart = _fixed_entropy(monkeypatch)
    value = np.linspace(-1, 1, 1000)
    a = _release(PrivacyLedger(), "torch:cpu", value)
    restart()
    b = _release(PrivacyLedger(), "torch:cpu", value)
    assert np.array_equal(a, b) and asked
    asked.clear()
    restart()
    g1 = ds.discrete_gaussian_on_device(ds.DeviceBits(torch, torch.device("cpu"), True), 50.0, 1000)
    assert asked == [8] * 4
    restart()
    assert torch.equal(g1, ds.discrete_gaussian_on_device(ds.DeviceBits(torch, torch.device("cpu"), True), 50.0, 1000))


def test_torch_cpu_generators_keep_32_bits_of_a_seed_so_the_cpu_device_takes_os_bits():
    """The control behind the design: seeds that differ above 32 bits give one CPU stream."""
    g1, g2 = torch.Generator(), torch.Generator()
    g1.manual_seed(5)
    g2.manual_seed(5 + (1 << 40))
    assert torch.equal(torch.randint(0, 1 << 32, (8,), generator=g1), torch.randint(0, 1 << 32, (8,), generator=g2))
    assert ds.DeviceBits(torch, torch.device("cpu")).generators == []  # the CPU device: os.urandom's words


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_a_gpu_generator_keeps_all_64_bits_of_its_seed():
    """The 2**128 claim needs each Philox key whole: seeds that differ only above 32 bits must
    give different CUDA streams."""
    g1, g2 = torch.Generator(device="cuda"), torch.Generator(device="cuda")
    g1.manual_seed(5)
    g2.manual_seed(5 + (1 << 40))
    a = torch.randint(0, 1 << 32, (8,), generator=g1, device="cuda")
    assert not torch.equal(a, torch.randint(0, 1 << 32, (8,), generator=g2, device="cuda"))
    assert len(ds.DeviceBits(torch, torch.device("cuda")).generators) * ds.DeviceBits.SEED_BYTES * 8 == 256


@pytest.mark.parametrize("dev", DEVICES)
def test_two_default_runs_on_the_device_differ_and_account_as_the_cpu_run(dev):
    import fedpriv

    data = fedpriv.load_data("synthetic-mf:users=400,items=80,ratings=8000,seed=5")
    kw = dict(epsilon=5.0, second_opinion=False, rank=4, steps=2, defaults="fixed")
    runs = [fedpriv.train("adadpals", data, engine_options={"device": dev}, **kw) for _ in range(2)]
    ref = fedpriv.train("adadpals", data, **kw)
    a, b = (np.asarray(r.model.state.item_factors) for r in runs)
    assert not np.array_equal(a, b)
    assert runs[0].ledger == runs[1].ledger == ref.ledger  # the records: names, stds, counts
    assert runs[0].metrics["epsilon_spent"] == ref.metrics["epsilon_spent"]


def test_a_symmetric_release_on_the_device_noises_the_triangles_the_cpu_path_does(monkeypatch):
    """The device cuts the upper triangles and mirrors them itself: from the same entropy, the
    symmetric release equals the release of the numpy triangles, mirrored by numpy."""
    from fedpriv.privacy.symmetric import from_upper, upper

    _, restart = _fixed_entropy(monkeypatch)
    rng = np.random.default_rng(1)
    value = rng.normal(size=(30, 5, 5))
    value = value + value.transpose(0, 2, 1)
    sym = _release(PrivacyLedger(), "torch:cpu", value)
    restart()
    with device.use("torch:cpu"):
        tri = PrivacyLedger().gaussian("x", upper(value), sensitivity=1.0, noise_multiplier=1.0)
    assert np.array_equal(sym, from_upper(tri, 5))
    assert not np.array_equal(sym, value)


def test_a_copied_ledger_keys_its_own_device_generator():
    """A pickled or copied ledger (a checkpoint, a worker) draws with a key of its own: the copy
    and the original never give the same noise, and the copy's records are the original's."""
    import copy
    import pickle

    led = PrivacyLedger()
    value = np.zeros(200)
    _release(led, "torch:cpu", value)
    twins = [pickle.loads(pickle.dumps(led)), copy.deepcopy(led)]
    drawn = [_release(x, "torch:cpu", value) for x in (led, *twins)]
    assert not np.array_equal(drawn[0], drawn[1]) and not np.array_equal(drawn[0], drawn[2]) and not np.array_equal(drawn[1], drawn[2])
    assert twins[0].releases == twins[1].releases == led.releases  # one release "x", drawn twice by each
    assert [r.count for r in led.releases] == [2]


@functools.cache
def _cpu_compiler_error() -> str:
    """Why torch.compile cannot build a function for the CPU on this machine ("" where it can):
    inductor writes C++ and needs a working C++ compiler, which a machine may lack."""
    try:
        import torch._inductor  # noqa: F401

        f = torch.compile(lambda x: (x * 3 + 1) >> 1, dynamic=True)
        if not torch.equal(f(torch.arange(9)), (torch.arange(9) * 3 + 1) >> 1):
            raise ValueError("a compiled probe gave a wrong answer")
        return ""
    except Exception as e:  # noqa: BLE001 - any failure: the reason is the skip's
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit, imported by inductor
def test_the_compiled_decisions_are_the_eager_ones_and_draw_the_law(monkeypatch):
    """On a GPU the tries' decisions run compiled (torch.compile: one fused kernel), once they
    agree with the eager ones on a check batch. Compiled here on the CPU (inductor's C++):
    the same decisions on fresh words, for a small and a large variance, and the law of the
    draws. Skipped, with the compiler's error, where torch.compile cannot build for the CPU
    (no C++ compiler): the eager version then draws, tested below."""
    reason = _cpu_compiler_error()
    if reason:
        pytest.skip(f"torch.compile cannot build for the CPU on this machine ({reason})")
    monkeypatch.setattr(ds, "COMPILE", {"cpu"})
    monkeypatch.setattr(ds, "_DECIDERS", {})
    dev = torch.device("cpu")
    bits = ds.DeviceBits(torch, dev, True)
    decide = ds._decider(dev, 4)
    assert decide is not ds._decide  # compiled, and it passed its check
    for sigma2, n in ((2.0, 30_000), (1e12, 20_001)):
        parts = bits.draws(4, n)
        args = ds._scalars(torch, dev, sigma2)
        got, want = decide(parts, *args), ds._decide(parts, *args)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert want[1].float().mean() > 0.4  # the positive control: most tries give draws
    k = ds.discrete_gaussian_on_device(bits, 2.0, 200_000).numpy()
    assert _pmf_z(k, 2.0) < 5.5


def test_a_decider_that_cannot_compile_fails_or_disagrees_gives_way_to_the_eager_one(monkeypatch, caplog):
    """Where compiling is asked for (a GPU; here the CPU, switched on) and does not work, the
    eager decisions draw, with the law: a compiler that fails (no C++ compiler, say) leaves the
    eager version with a warning naming why; a compiled function that fails after its check (a
    recompile) gives way on the same words; one that disagrees on the check batch is refused
    (the positive control: it would shift every draw by one). None needs a working compiler."""
    import logging

    monkeypatch.setattr(ds, "COMPILE", {"cpu"})
    monkeypatch.setattr(ds, "_DECIDERS", {})
    dev = torch.device("cpu")
    bits = ds.DeviceBits(torch, dev, True)

    def no_compiler(f, **kw):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    with caplog.at_level(logging.WARNING, logger=ds.__name__):
        assert ds._decider(dev, 4) is ds._decide
    assert "not compiled on cpu" in caplog.text and "no C++ compiler found" in caplog.text
    k = ds.discrete_gaussian_on_device(bits, 2.0, 100_000).numpy()
    assert _pmf_z(k, 2.0) < 5.5

    def failing(parts, *a):
        raise RuntimeError("recompile failed")

    ds._DECIDERS[("cpu", 4)] = failing
    k = ds.discrete_gaussian_on_device(bits, 2.0, 100_000).numpy()
    assert ds._DECIDERS[("cpu", 4)] is ds._decide and _pmf_z(k, 2.0) < 5.5

    def shifted(f, **kw):  # "compiles" to the eager function with every proposal moved by one
        return lambda parts, *a: (lambda y, acc, st: (y + 1, acc, st))(*f(parts, *a))

    monkeypatch.setattr(ds, "_DECIDERS", {})
    monkeypatch.setattr(torch, "compile", shifted)
    assert ds._decider(dev, 4) is ds._decide
    monkeypatch.setattr(ds, "_DECIDERS", {})
    monkeypatch.setattr(torch, "compile", lambda f, **kw: lambda parts, *a: f(parts, *a))  # the control: one that agrees is taken
    assert ds._decider(dev, 4) is not ds._decide


@pytest.mark.parametrize("dev,generators", [
    pytest.param("torch:cpu", None, id="torch:cpu"), pytest.param("torch:cpu", True, id="torch:cpu-generators"),
    pytest.param("cuda", None, id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")),
])
def test_every_bit_of_the_device_words_is_a_fair_coin(dev, generators):
    """The words the tries read use all 64 bits (the sign and U's low 63, the uniforms' top 53):
    each bit is 1 half of the time, on the generators' full-range draws (``random_`` from the
    int64 minimum) as on os.urandom's. The control: draws below 2**62 fail it."""
    n = 200_000
    bits = ds.DeviceBits(torch, _tdev(dev), generators)
    words = ds._xor(bits.draws(3, n)).reshape(-1).cpu()

    def worst_z(w):
        ones = torch.stack([((w >> b) & 1).sum() for b in range(64)]).double()
        return float(((ones - len(w) / 2) / math.sqrt(len(w) / 4)).abs().max())

    assert worst_z(words) < 6
    assert worst_z(torch.empty(3 * n, dtype=torch.int64).random_(0, 2**62)) > 100  # the top bits never set
