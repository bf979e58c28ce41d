"""Floating-point attacks on the Gaussian noise of central releases (issue 41).

The attack (Mironov, CCS 2012, adapted to Gaussian noise; in the terms of Jin et al., IEEE S&P
2022, a check of which outputs a candidate input can reach given the sampler's float structure):
the adversary knows the two neighbouring values ``x0`` and ``x1`` a release may hold and sees
the released vector. A floating-point sampler returns ``fl(x + n)`` with ``n`` a float. Take
``x0 = 0`` and ``x1 = 2**-53``: wherever |n| lies in [1, 2) (about a quarter of the
coordinates at std 1), the exact sum ``x1 + n`` falls exactly half-way between two floats and
round-half-to-even makes the output's last mantissa bit 0, while from ``x0`` the output is ``n``
itself, whose last bit is a fair coin. So an odd last bit in that binade is unreachable from
``x1``: the values differ by 2**-53 (a Gaussian with std 1 hides such a shift completely:
privacy loss about 1e-16), yet one release tells them apart.

Rather than hard-coding that rule, the test *learns* a low-bit distinguisher: per coordinate
the feature is (binade of |output|, last mantissa bit), its frequencies under ``x0`` and
``x1`` are estimated from training releases, and fresh releases are classified by their
log-likelihood ratio. Positive control: the old samplers (Box-Muller on ``os.urandom``, and
numpy's normal for a seeded ledger, exactly as the ledger drew them before) are told apart far
above chance. The ledger's lattice discrete Gaussian (:mod:`fedpriv.privacy.sampling`) stays
at chance, secure and seeded, and so does its draw on a device (:mod:`fedpriv.privacy.device_sampling`,
on torch's CPU device everywhere and on CUDA where present). The sampler's distribution is checked against the exact discrete
Gaussian, also through its exact (arbitrary-precision) path alone.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from fedpriv.privacy import sampling
from fedpriv.privacy.ledger import PrivacyLedger, secure_standard_normal
from fedpriv.util import device

D = 64  # coordinates per release
TRAIN, TEST = 200, 400  # releases per input
X0, X1 = 0.0, 2.0**-53
SENS, Z = 1.0, 1.0  # std 1


def _old_secure(x: float, rng) -> np.ndarray:
    """The ledger's previous default draw: value + std * Box-Muller(os.urandom)."""
    return np.full(D, x) + SENS * Z * secure_standard_normal((D,))


def _old_seeded(x: float, rng) -> np.ndarray:
    """The ledger's previous seeded draw: value + numpy's normal(0, std)."""
    return np.full(D, x) + rng.normal(0.0, SENS * Z, size=D)


def _new_secure(x: float, rng) -> np.ndarray:
    return PrivacyLedger().gaussian("stat", np.full(D, x), sensitivity=SENS, noise_multiplier=Z)


def _new_seeded(x: float, rng) -> np.ndarray:
    return PrivacyLedger(seed=int(rng.integers(2**62))).gaussian("stat", np.full(D, x), sensitivity=SENS, noise_multiplier=Z)


def _on_device(name: str):
    """Releases by one ledger drawing on ``name`` (fedpriv.privacy.device_sampling)."""
    ledger = PrivacyLedger()

    def release(x: float, rng) -> np.ndarray:
        with device.use(name):
            return ledger.gaussian("stat", np.full(D, x), sensitivity=SENS, noise_multiplier=Z)

    release.__name__ = f"device-{name}"
    return release


def _features(out: np.ndarray) -> np.ndarray:
    """Cell per coordinate: binade of |out| (clipped to [-4, 4]) and the last mantissa bit."""
    out = np.asarray(out, dtype=np.float64)
    _, e = np.frexp(np.abs(out))
    binade = np.clip(e, -4, 4) + 4
    last = (out.view(np.uint64) & np.uint64(1)).astype(np.int64)
    return binade * 2 + last


def _attack_accuracy(release, seed: int, x0: float = X0, x1: float = X1) -> float:
    """Accuracy of the learned low-bit distinguisher between x0 and x1 on fresh releases."""
    rng = np.random.default_rng(seed)
    cells = 9 * 2
    counts = {x: np.ones(cells) for x in (x0, x1)}  # Laplace smoothing
    for x in (x0, x1):
        for _ in range(TRAIN):
            counts[x] += np.bincount(_features(release(x, rng)), minlength=cells)
    llr = np.log(counts[x0] / counts[x0].sum()) - np.log(counts[x1] / counts[x1].sum())
    right = 0
    for x in (x0, x1):
        for _ in range(TEST):
            score = llr[_features(release(x, rng))].sum()
            right += (score > 0) == (x == x0)
    return right / (2 * TEST)


@pytest.mark.parametrize("release", [_old_secure, _old_seeded], ids=["box-muller", "numpy-normal"])
def test_the_attack_tells_neighbours_apart_with_floating_point_noise(release):
    """Positive control: the floating-point samplers leak which of two values 2**-53 apart was
    released (chance is 0.5; a Gaussian of std 1 permits about 0.5 + 1e-16)."""
    assert _attack_accuracy(release, seed=1) > 0.95


#: the lattice's grid for these releases: X1 rounds to the same lattice point as X0, while
#: 0.75 grid steps round to the next one (the outputs then differ by one step of noise whose
#: std is thousands of steps: a privacy loss of about 1e-4, so the attack must stay at chance)
GRID = sampling.lattice_for(SENS, Z, D).grid


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("x1", [X1, 0.75 * GRID], ids=["2^-53", "0.75-grid-step"])
@pytest.mark.parametrize("release", [
    _new_secure, _new_seeded, _on_device("torch:cpu"),
    pytest.param(_on_device("cuda"), marks=pytest.mark.skipif(not _cuda(), reason="no CUDA device on this machine")),
], ids=["lattice-os", "lattice-seeded", "lattice-device-torch:cpu", "lattice-device-cuda"])
def test_the_attack_is_at_chance_with_the_lattice_discrete_gaussian(release, x1):
    acc = _attack_accuracy(release, seed=2, x1=x1)
    assert abs(acc - 0.5) < 0.08, acc  # 800 guesses: the std of a fair accuracy is 0.018


def test_released_values_lie_on_a_power_of_two_lattice_with_the_recorded_scale():
    led = PrivacyLedger(seed=3)
    x = np.linspace(-5.0, 5.0, 20_000) + 1e-9
    out = led.gaussian("stat", x, sensitivity=2.0, noise_multiplier=1.5)
    lat = sampling.lattice_for(2.0, 1.5, x.size)
    assert math.log2(lat.grid) == int(math.log2(lat.grid))
    assert np.all(out / lat.grid == np.round(out / lat.grid))
    # the rounded statistic's sensitivity bound, and noise at least the recorded std
    assert 2.0 + lat.grid * math.sqrt(x.size) <= lat.sensitivity <= 2.0 * (1 + 2.0 ** -(sampling.SLACK_BITS - 1))
    assert lat.std >= 1.5 * lat.sensitivity >= led.releases[0].noise_std
    assert np.std(out - x) == pytest.approx(3.0, rel=0.03)
    assert abs(np.mean(out - x)) < 0.1


def test_seeded_lattice_noise_is_reproducible_and_continues_from_a_checkpoint():
    a, b = PrivacyLedger(seed=9), PrivacyLedger(seed=9)
    x = np.arange(30.0).reshape(5, 6)
    assert np.array_equal(a.gaussian("s", x, sensitivity=1, noise_multiplier=2), b.gaussian("s", x, sensitivity=1, noise_multiplier=2))
    state = a.state_dict()
    c = PrivacyLedger(seed=1)
    c.load_state_dict(state)
    assert np.array_equal(a.gaussian("t", x, sensitivity=1, noise_multiplier=2), c.gaussian("t", x, sensitivity=1, noise_multiplier=2))
    assert not np.array_equal(PrivacyLedger().gaussian("s", x, sensitivity=1, noise_multiplier=2),
                              PrivacyLedger().gaussian("s", x, sensitivity=1, noise_multiplier=2))


def _pmf(sigma2: float, support: np.ndarray) -> np.ndarray:
    w = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma2))
    big = np.arange(-400, 401)
    return w / np.exp(-(big.astype(np.float64) ** 2) / (2 * sigma2)).sum()


def _chi2_pvalue(draws: np.ndarray, sigma2: float) -> float:
    from scipy import stats

    lim = int(4 * math.sqrt(sigma2)) + 1
    support = np.arange(-lim, lim + 1)
    p = _pmf(sigma2, support)
    obs = np.array([(draws < -lim).sum(), *[(draws == y).sum() for y in support], (draws > lim).sum()], dtype=float)
    tail = (1 - p.sum()) / 2
    exp = np.array([tail, *p, tail]) * len(draws)
    keep = exp > 5
    obs = np.append(obs[keep], obs[~keep].sum())
    exp = np.append(exp[keep], exp[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("sigma2", [0.6, 2.5, 30.25])
def test_discrete_gaussian_has_the_exact_distribution(sigma2):
    draws = sampling.discrete_gaussian(sampling.BitSource(np.random.default_rng(4)), sigma2, 120_000)
    assert _chi2_pvalue(draws, sigma2) > 1e-4
    assert np.var(draws) == pytest.approx(sum(y * y * q for y, q in zip(range(-400, 401), _pmf(sigma2, np.arange(-400, 401)))), rel=0.03)


def test_the_exact_path_alone_has_the_exact_distribution(monkeypatch):
    """With no trust in floating point (every comparison settled in exact arithmetic, more
    random bits drawn where needed), the draws still follow the discrete Gaussian."""
    monkeypatch.setattr(sampling, "_REL_MARGIN", 1.0)
    draws = sampling.discrete_gaussian(sampling.BitSource(np.random.default_rng(5)), 2.5, 1500)
    assert _chi2_pvalue(draws, 2.5) > 1e-4
    src = sampling.BitSource(np.random.default_rng(6))
    hits = [sampling._exact_bernoulli_exp(Fraction(1), int(src.words(1)[0] >> np.uint64(11)), 53, src) for _ in range(2000)]
    assert np.mean(hits) == pytest.approx(math.exp(-1), abs=0.03)


def test_os_bits_in_threads_follow_the_same_law(monkeypatch):
    monkeypatch.setenv("FEDPRIV_THREADS", "2")
    out = sampling.lattice_gaussian(np.zeros(200_000), 1.0, 1.0)
    assert np.std(out) == pytest.approx(1.0, rel=0.01) and abs(np.mean(out)) < 0.01
    assert abs(np.corrcoef(out[:100_000], out[100_000:])[0, 1]) < 0.01
