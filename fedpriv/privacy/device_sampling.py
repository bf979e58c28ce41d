"""The lattice discrete Gaussian of :mod:`fedpriv.privacy.sampling`, drawn on a torch device.

The same release, the same algorithm (Canonne, Kamath and Steinke 2020, Algorithms 2 and 3,
every comparison exact), vectorised in torch so that a GPU run does not wait for the CPU's
sampler (0.55 s per alternating step at the ML-20M shape on 16 cores).

**Random bits.** :class:`DeviceBits`, one per ledger, on its first device draw:

- on a GPU: four torch generators on the device (Philox4x32-10, a counter-based generator),
  each keyed with 64 bits of ``os.urandom``; a word is the XOR of one 64-bit word of each
  (every word built from two 32-bit draws). XOR-ing streams invites a meet-in-the-middle search
  (guess half of the keys, tabulate, match the other half): with four 64-bit keys that search
  costs 2**128. The generators advance across the ledger's releases, so no
  counter is reused within a run;
- on torch's CPU device: the words are ``os.urandom``'s (the CPU path's generator, copied).
  torch's CPU generator is a Mersenne twister that keeps only 32 bits of a seed (a test shows
  it), and its output is linear in its state: not a generator for secret noise.

**Exactness.** Each Bernoulli(exp(-x)) and each floor(-ln U) is settled in float64 where the
uniform's interval lies outside the error margin of the estimate (the margins of the CPU
sampler). The rare entries inside it are copied to the CPU and settled there by the CPU
sampler's exact decimal routines, their uniforms extended with fresh ``os.urandom`` bits.

Only :meth:`fedpriv.privacy.ledger.PrivacyLedger.gaussian` calls this (the ledger stays the
only noise source)."""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np

from . import sampling as cpu
from .sampling import Lattice, lattice_for
from .symmetric import triangle_positions
from ..util import device

#: samples drawn per block on the device (temporaries of about 12 words of 8 bytes each)
BLOCK = 1 << 22
_MASK53 = (1 << 53) - 1


class DeviceBits:
    """Uniform 64-bit words (as int64 bit patterns) on ``dev`` (the module docstring).
    ``generators``: draw from the keyed torch generators (default: on a GPU only; a test may
    ask for them on the CPU to check the combination, not the CPU generator's strength)."""

    GENERATORS, SEED_BYTES = 4, 8

    def __init__(self, torch, dev, generators: bool | None = None):
        self.torch, self.dev = torch, dev
        self.generators = []
        if generators if generators is not None else dev.type != "cpu":
            for _ in range(self.GENERATORS):
                g = torch.Generator(device=dev)
                g.manual_seed(int.from_bytes(os.urandom(self.SEED_BYTES), "little"))
                self.generators.append(g)

    def words(self, n: int):
        t = self.torch
        if not self.generators:  # the CPU path's secret bits (os.urandom)
            return t.from_numpy(cpu.BitSource(None).words(n).view(np.int64)).to(self.dev)
        out = None
        for g in self.generators:
            halves = t.randint(0, 1 << 32, (2, n), dtype=t.int64, generator=g, device=self.dev)
            w = (halves[0] << 32) | halves[1]
            out = w if out is None else out.bitwise_xor_(w)
        return out


def _top53(words):
    """The top 53 bits of each word, as a non-negative int64."""
    return (words >> 11) & _MASK53


def _below(bits: DeviceBits, t: int, n: int):
    """n integers uniform in {0, ..., t - 1}, exactly: the low m bits of a word (2**m >= t),
    redrawn while >= t (at most half are)."""
    torch = bits.torch
    m = max(1, (t - 1).bit_length())
    if m > 62:  # the lattice's limits keep t below 2**41
        raise ValueError(f"uniform below {t}: above the device sampler's range")
    out = bits.words(n) & ((1 << m) - 1)
    redo = torch.nonzero(out >= t).flatten()
    while len(redo):
        fresh = bits.words(len(redo)) & ((1 << m) - 1)
        out[redo] = fresh
        redo = redo[fresh >= t]
    return out


def _bernoulli_exp(bits: DeviceBits, x_hat, x_exact, words=None):
    """Bernoulli(exp(-x)) per entry (the CPU sampler's ``_bernoulli_exp`` on the device): U with
    the top 53 bits of ``words`` against the float64 estimate exp(-x_hat); entries within the
    margin settled exactly on the CPU with ``x_exact(i)``."""
    torch = bits.torch
    n = len(x_hat)
    r = _top53(bits.words(n) if words is None else words)
    u = r.to(torch.float64) * cpu._TWO53 + 2.0**-54
    p = torch.exp(-x_hat.to(torch.float64))
    out = u < p
    close = torch.nonzero((u - p).abs_() < p * cpu._REL_MARGIN + (cpu._ABS_MARGIN + 2.0**-54)).flatten()
    if len(close):
        src = cpu.BitSource(None)
        rs = r[close].cpu().tolist()
        settled = [cpu._exact_bernoulli_exp(x_exact(int(i)), prefix, 53, src) for i, prefix in zip(close.cpu().tolist(), rs)]
        out[close] = torch.tensor(settled, dtype=torch.bool, device=out.device)
    return out


def _geometric_e1(bits: DeviceBits, n: int):
    """n draws of V with P(V >= v) = exp(-v): floor(-ln U) (the CPU sampler's ``_geometric_e1``)."""
    torch = bits.torch
    r = _top53(bits.words(n))
    lo = r.to(torch.float64) * cpu._TWO53
    e = -torch.log(lo + 2.0**-54)
    reach = 2.0**-53 / lo + (e + 1.0) * cpu._REL_MARGIN  # inf where U's interval starts at 0
    a, b = torch.floor(e - reach), torch.floor(e + reach)
    out = torch.nan_to_num(a, neginf=0.0).to(torch.int64)
    unsure = torch.nonzero(a != b).flatten()
    if len(unsure):
        src = cpu.BitSource(None)
        settled = [cpu._exact_floor_neglog(prefix, 53, src) for prefix in r[unsure].cpu().tolist()]
        out[unsure] = torch.tensor(settled, dtype=torch.int64, device=out.device)
    return out


def _discrete_laplace(bits: DeviceBits, t: int, attempts: int):
    """The accepted draws of ``attempts`` tries of CKS Algorithm 2 (discrete Laplace of scale t)."""
    torch = bits.torch
    u = _below(bits, t, attempts)
    w = bits.words(attempts)
    u_cpu = None

    def exact(i: int) -> Fraction:
        nonlocal u_cpu
        if u_cpu is None:
            u_cpu = u.cpu()
        return Fraction(int(u_cpu[i]), t)

    keep = _bernoulli_exp(bits, u.to(torch.float64) / t, exact, words=w)
    d = torch.nonzero(keep).flatten()
    x = u[d] + t * _geometric_e1(bits, len(d))
    minus = (w[d] & 1).bool()
    ok = ~(minus & (x == 0))
    return torch.where(minus, -x, x)[ok]


def discrete_gaussian_on_device(bits: DeviceBits, sigma2: float, n: int):
    """n exact draws of the discrete Gaussian of variance parameter ``sigma2`` (CKS Algorithm 3)."""
    torch = bits.torch
    s = Fraction(sigma2)
    t = math.isqrt(math.floor(s)) + 1
    q = sigma2 / t
    parts, need = [], n
    while need > 0:
        y = _discrete_laplace(bits, t, int(need / cpu._YIELD * 1.02) + 32)
        ay = y.abs()
        diff = ay.to(torch.float64) - q
        ay_cpu = None

        def exact(i: int) -> Fraction:
            nonlocal ay_cpu
            if ay_cpu is None:
                ay_cpu = ay.cpu()
            return (int(ay_cpu[i]) * t - s) ** 2 / (2 * s * t * t)

        c = _bernoulli_exp(bits, diff * diff / (2.0 * sigma2), exact)
        got = y[c][:need]
        parts.append(got)
        need -= len(got)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=bits.dev)


def lattice_gaussian_on_device(value, sensitivity: float, noise_multiplier: float, bits: DeviceBits):
    """``value`` (a float64 tensor on the bits' device) released on the lattice of
    :func:`fedpriv.privacy.sampling.lattice_gaussian`: the same grid, the same integer noise law."""
    torch = bits.torch
    lat: Lattice = lattice_for(sensitivity, noise_multiplier, value.numel())
    flat = value.reshape(-1).to(torch.float64)
    r = torch.clamp(torch.round(flat / lat.grid), -cpu._MAX_INT, cpu._MAX_INT).to(torch.int64)
    n = flat.numel()
    for i in range(0, n, BLOCK):
        j = min(i + BLOCK, n)
        r[i:j] += discrete_gaussian_on_device(bits, lat.sigma2, j - i)
    return (r.to(torch.float64) * lat.grid).reshape(value.shape)


def release(value, sensitivity: float, noise_multiplier: float, symmetric: bool, bits: DeviceBits) -> device.DeviceArray:
    """The ledger's release of ``value`` (in float64) with its noise drawn on the bits' device:
    :func:`lattice_gaussian_on_device`; with ``symmetric``, of the upper triangles of the last
    two axes, cut and mirrored on the device in the order of :mod:`fedpriv.privacy.symmetric`.
    A value already on the device (a :class:`fedpriv.util.device.DeviceArray`: sums made there,
    or a read-only array with a kept copy) is read there; another is copied there (counted in
    :data:`fedpriv.util.device.transfers`).

    The release is where its value was: the release of a DeviceArray is one (the server's
    solve reads it there, host code that reads it copies it back once); that of a host array
    is a read-only host array with its device copy kept (:func:`fedpriv.util.device.to_host_kept`)."""
    torch = bits.torch
    t = device.as_tensor(value, bits.dev, torch.float64)  # sums made on the device: read there (never written)
    if not symmetric:
        out = lattice_gaussian_on_device(t, sensitivity, noise_multiplier, bits)
    else:
        d = t.shape[-1]
        iu = torch.triu_indices(d, d, device=bits.dev)  # row by row, as numpy's
        noised = lattice_gaussian_on_device(t[..., iu[0], iu[1]], sensitivity, noise_multiplier, bits)
        out = noised[..., torch.as_tensor(triangle_positions(d), device=bits.dev)]
    if isinstance(value, device.DeviceArray):
        return device.DeviceArray(out, bits.dev)  # left on the device for the server's solve
    return device.to_host_kept(out, bits.dev)
