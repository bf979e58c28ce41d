"""Noise drawn on the device (fedpriv.privacy.device_sampling): the ledger's lattice discrete
Gaussian, vectorised in torch, keyed with 128 bits of OS entropy per ledger.

The law is the CPU sampler's (the exact discrete Gaussian); a default device run's noise is
secret (two runs differ; the only seed is os.urandom: fixing it fixes the noise, the positive
control); a seeded ledger draws on the CPU on every device, so seeded runs are reproducible and
identical across devices. Cases run on torch's CPU device everywhere and on CUDA where present."""

from __future__ import annotations

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
    """The largest |z| of the empirical frequencies of -8..8 against the exact pmf."""
    ys = np.arange(-40, 41)
    p = np.exp(-(ys**2) / (2 * sigma2))
    p /= p.sum()
    n = len(k)
    emp = np.bincount(k + 40, minlength=81)[:81] / n
    inner = np.abs(ys) <= 8
    return float(np.max(np.abs(emp - p)[inner] / np.sqrt(p * (1 - p) / n)[inner]))


@pytest.mark.parametrize("dev", DEVICES)
def test_the_device_sampler_draws_the_exact_discrete_gaussian(dev):
    bits = ds.DeviceBits(torch, _tdev(dev))
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


def test_the_key_is_128_bits_of_os_entropy_and_nothing_else(monkeypatch):
    """Fixing os.urandom fixes the device noise (it is the only seed); each ledger takes 16 bytes."""
    asked = []

    def fixed(n):
        asked.append(n)
        return bytes([len(asked) % 4 + 1]) * n  # the four generators of a ledger: distinct seeds

    monkeypatch.setattr(ds.os, "urandom", fixed)
    value = np.linspace(-1, 1, 1000)
    a, b = _release(PrivacyLedger(), "torch:cpu", value), _release(PrivacyLedger(), "torch:cpu", value)
    assert np.array_equal(a, b)
    assert asked == [4] * 8  # 4 x 32 bits per ledger


def test_each_generator_is_seeded_within_what_torch_keeps_of_a_seed():
    """torch's CPU generator keeps 32 bits of a seed (the control below: seeds that differ above
    them give one stream), so each of the four generators takes 32 bits: 128 in all."""
    g1, g2 = torch.Generator(), torch.Generator()
    g1.manual_seed(5)
    g2.manual_seed(5 + (1 << 40))
    assert torch.equal(torch.randint(0, 1 << 32, (8,), generator=g1), torch.randint(0, 1 << 32, (8,), generator=g2))
    bits = ds.DeviceBits(torch, torch.device("cpu"))
    assert len(bits.generators) * ds.DeviceBits.SEED_BYTES * 8 == 128
    assert all(g.initial_seed() < 2**32 for g in bits.generators)


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
    """The device cuts the upper triangles and mirrors them itself: under one key, the symmetric
    release equals the same key's release of the numpy triangles, mirrored by numpy."""
    from fedpriv.privacy.symmetric import from_upper, upper

    keys = iter([b"\x05" * 4, b"\x07" * 4, b"\x09" * 4, b"\x0b" * 4] * 2)
    monkeypatch.setattr(ds.os, "urandom", lambda n: next(keys))
    rng = np.random.default_rng(1)
    value = rng.normal(size=(30, 5, 5))
    value = value + value.transpose(0, 2, 1)
    sym = _release(PrivacyLedger(), "torch:cpu", value)
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
