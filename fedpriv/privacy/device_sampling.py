"""The lattice discrete Gaussian of :mod:`fedpriv.privacy.sampling`, drawn on a torch device.

The same release, the same algorithm (Canonne, Kamath and Steinke 2020, Algorithms 2 and 3,
every comparison exact), vectorised in torch so that a GPU run does not wait for the CPU's
sampler (0.55 s per alternating step at the ML-20M shape on 16 cores).

**Random bits.** :class:`DeviceBits`, one per ledger, on its first device draw:

- on a GPU: four torch generators on the device (Philox4x32-10, a counter-based generator),
  each keyed with 64 bits of ``os.urandom``; a word is the XOR of one 64-bit word of each.
  XOR-ing streams invites a meet-in-the-middle search (guess half of the keys, tabulate, match
  the other half): with four 64-bit keys that search costs 2**128. The generators advance across
  the ledger's releases, so no counter is reused within a run;
- on torch's CPU device: the words are ``os.urandom``'s (the CPU path's generator, copied).
  torch's CPU generator is a Mersenne twister that keeps only 32 bits of a seed (a test shows
  it), and its output is linear in its state: not a generator for secret noise.

**Exactness.** Each Bernoulli(exp(-x)) and each floor(-ln U) is settled in float64 where the
uniform's interval lies outside the error margin of the estimate (the margins of the CPU
sampler). The rare tries with an entry inside it are copied to the CPU and made again there by
the CPU sampler's exact decimal routines, their uniforms extended with fresh ``os.urandom`` bits.

**Speed.** A GPU waits for the host whenever a result's size must be known (a compaction, a
``nonzero``). Every decision of a batch of tries is made at once, as masks (:func:`_tries`), so a
batch waits twice: to find the tries to settle, and to keep the accepted draws. U below t takes
one word and no redraw loop. (Before, each step of a try compacted the survivors, and U's
redraws looped about log2(n) times: some 30 waits per batch.) On a GPU the decisions are
compiled (``torch.compile``) into one kernel that reads the tries' random words once: about a
sixth of the eager ops' memory traffic. The compiled version is used only after it has made
the eager version's decisions on a check batch; a compiler that fails or disagrees leaves the
eager ops (:data:`COMPILE`, :func:`_decider`).

Only :meth:`fedpriv.privacy.ledger.PrivacyLedger.gaussian` calls this (the ledger stays the
only noise source)."""

from __future__ import annotations

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
_MASK63 = (1 << 63) - 1


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

    def draws(self, k: int, n: int) -> list:
        """(k, n) tensors of 64-bit words whose XOR is the uniform words: one per generator, or
        one of ``os.urandom``'s words."""
        t = self.torch
        if not self.generators:  # the CPU path's secret bits (os.urandom)
            return [t.from_numpy(cpu.BitSource(None).words(k * n).view(np.int64).reshape(k, n)).to(self.dev)]
        # random_ from the int64 minimum with no upper end: all 64 bits
        return [
            t.empty((k, n), dtype=t.int64, device=self.dev).random_(-(1 << 63), None, generator=g)
            for g in self.generators
        ]


def _xor(parts: list):
    w = parts[0]
    for p in parts[1:]:
        w = w ^ p
    return w


def _top53(words):
    """The top 53 bits of each word, as a non-negative int64 (of a tensor's words, or of one
    word as a Python int: the same bits)."""
    return (words >> 11) & _MASK53


def _compare_exp(torch, r, x_hat):
    """U < exp(-x) per entry, U uniform with the 53 bits ``r``, against the float64 estimate
    exp(-x_hat) (the CPU sampler's ``_bernoulli_exp``): the decision, and where U's interval
    lies within the estimate's error margin (those are settled exactly, :func:`_settle`)."""
    u = r.to(torch.float64) * cpu._TWO53 + 2.0**-54  # the middle of U's interval: exact
    p = torch.exp(-x_hat)
    return u < p, (u - p).abs_() < p * cpu._REL_MARGIN + (cpu._ABS_MARGIN + 2.0**-54)


def _floor_neglog(torch, r):
    """floor(-ln U) per entry, U uniform with the 53 bits ``r`` (the CPU sampler's
    ``_geometric_e1``): the value (0 where unsure), and where U's interval
    [U, U + 2**-53) may reach two integers of -ln (settled exactly, :func:`_settle`)."""
    lo = r.to(torch.float64) * cpu._TWO53
    e = -torch.log(lo + 2.0**-54)
    reach = 2.0**-53 / lo + (e + 1.0) * cpu._REL_MARGIN  # inf where U's interval starts at 0
    a, b = torch.floor(e - reach), torch.floor(e + reach)
    return torch.nan_to_num(a, neginf=0.0).to(torch.int64), a != b


def _decide(parts: list, t, last_in_range, q, two_sigma2):
    """``n`` tries of CKS Algorithm 3 over Algorithm 2 from ``parts`` (:meth:`DeviceBits.draws`
    of four words per try), every decision of a try made at once, elementwise (no compaction,
    so no wait for the host, and one kernel when compiled): the proposals ``y``, whether each
    try gives a draw, and the tries to settle exactly (:func:`_settle`). One try, as the CPU
    sampler's ``discrete_laplace`` and ``discrete_gaussian``: U uniform in {0, ..., t - 1}; kept
    with probability exp(-U / t); X = U + t V, P(V >= v) = exp(-v); a random sign (refused
    when minus and X = 0); accepted with probability exp(-(X - q)**2 / (2 sigma2)), q = sigma2 / t.

    The first word gives U (its low 63 bits modulo t; the try is refused when they are above
    ``last_in_range``, the top of the largest multiple of t below 2**63: under 2**-22 of the
    tries, which leaves U uniform in the tries that stay) and the sign (its top bit); the others
    give the two Bernoulli's uniforms and V's. The numbers are 0-dimensional tensors (a compiled
    version then serves every release)."""
    import torch

    w = _xor(parts)
    w1 = w[0]
    minus = w1 < 0
    low = w1 & _MASK63
    in_range = low <= last_in_range
    u = torch.remainder(low, t)
    kept, close1 = _compare_exp(torch, _top53(w[1]), u.to(torch.float64) / t)
    v, unsure2 = _floor_neglog(torch, _top53(w[2]))
    x = u + t * v
    diff = x.to(torch.float64) - q
    accepted, close3 = _compare_exp(torch, _top53(w[3]), diff * diff / two_sigma2)
    y = torch.where(minus, -x, x)
    accepted = accepted & kept & in_range & ~(minus & (x == 0))
    return y, accepted, (close1 | unsure2 | close3) & in_range


#: device types on which :func:`_decide` is compiled (``torch.compile``: one fused kernel, about
#: a sixth of the eager ops' memory traffic), once it has agreed with the eager version on a
#: check batch; elsewhere, or where compiling fails, it runs eagerly
COMPILE = {"cuda"}
_DECIDERS: dict = {}


def _decider(dev, n_parts: int):
    """:func:`_decide` for ``n_parts`` parts of bits, compiled for ``dev`` where :data:`COMPILE`
    asks and it agrees with the eager version on a check batch (public bits, its results
    discarded), else eager."""
    if dev.type not in COMPILE:
        return _decide
    key = (dev.type, n_parts)
    if key not in _DECIDERS:
        import torch

        _DECIDERS[key] = _decide
        try:
            compiled = torch.compile(_decide, dynamic=True)
            g = torch.Generator(device=dev)
            g.manual_seed(0)
            for sigma2, n in ((2.0, 5000), (1e8, 7001)):
                parts = [
                    torch.empty((4, n), dtype=torch.int64, device=dev).random_(-(1 << 63), None, generator=g)
                    for _ in range(n_parts)
                ]
                args = _scalars(torch, dev, sigma2)
                if not all(torch.equal(a, b) for a, b in zip(compiled(parts, *args), _decide(parts, *args))):
                    raise ValueError("the compiled decisions differ from the eager ones")
            _DECIDERS[key] = compiled
        except Exception as e:  # noqa: BLE001 - any failure of the compiler: the eager version
            _not_compiled(dev, n_parts, e)
    return _DECIDERS[key]


def _not_compiled(dev, n_parts: int, error: Exception) -> None:
    """From now on the eager version on ``dev``, with a warning naming why."""
    import logging

    _DECIDERS[(dev.type, n_parts)] = _decide
    logging.getLogger(__name__).warning(
        "device noise: not compiled on %s (%s: %s); drawing with eager ops", dev, type(error).__name__, error
    )


def _scalars(torch, dev, sigma2: float) -> tuple:
    """t (:func:`fedpriv.privacy.sampling.laplace_scale`), the top of the largest multiple of t
    below 2**63, sigma2 / t and 2 sigma2: :func:`_decide`'s numbers, as 0-dimensional tensors on
    ``dev``."""
    t = cpu.laplace_scale(sigma2)
    last = ((1 << 63) // t) * t - 1
    return (
        torch.tensor(t, device=dev),
        torch.tensor(last, device=dev),
        torch.tensor(sigma2 / t, dtype=torch.float64, device=dev),
        torch.tensor(2.0 * sigma2, dtype=torch.float64, device=dev),
    )


def _tries(bits: DeviceBits, t: int, s: Fraction, sigma2: float, n: int):
    """``n`` tries (:func:`_decide`): the proposals and whether each gives a draw, the rare tries
    with a comparison inside the float estimate's margin settled on the CPU (:func:`_settle`)."""
    torch = bits.torch
    parts = bits.draws(4, n)
    args = (parts, *_scalars(torch, bits.dev, sigma2))
    decide = _decider(bits.dev, len(parts))
    try:
        y, accepted, settle = decide(*args)
    except Exception as e:  # noqa: BLE001 - a compiled version failing later (a recompile): eager, same words
        if decide is _decide:
            raise
        _not_compiled(bits.dev, len(parts), e)
        y, accepted, settle = _decide(*args)
    idx = torch.nonzero(settle).flatten()  # the one wait: almost always empty
    if len(idx):
        _settle(bits, idx, parts, t, s, y, accepted)
    return y, accepted


def _settle(bits: DeviceBits, idx, parts: list, t: int, s: Fraction, y, accepted) -> None:
    """The tries ``idx`` made again on the CPU from the same words, every comparison exact (the
    CPU sampler's decimal routines, each uniform extended with fresh ``os.urandom`` bits while
    undecided); their proposals and decisions written into ``y`` and ``accepted``."""
    torch = bits.torch
    src = cpu.BitSource(None)
    ys, oks = [], []
    for w1, w2, w3, w4 in _xor([p[:, idx] for p in parts]).t().cpu().tolist():
        neg, ui = w1 < 0, (w1 & _MASK63) % t  # as _decide reads them (Python ints: the same bits)
        ok, yi = False, 0
        if cpu._exact_bernoulli_exp(Fraction(ui, t), _top53(w2), 53, src):
            xi = ui + t * cpu._exact_floor_neglog(_top53(w3), 53, src)
            if not (neg and xi == 0):
                yi = -xi if neg else xi
                ok = cpu._exact_bernoulli_exp((xi * t - s) ** 2 / (2 * s * t * t), _top53(w4), 53, src)
        ys.append(yi)
        oks.append(ok)
    y[idx] = torch.tensor(ys, dtype=y.dtype, device=y.device)
    accepted[idx] = torch.tensor(oks, dtype=torch.bool, device=accepted.device)


def discrete_gaussian_on_device(bits: DeviceBits, sigma2: float, n: int):
    """n exact draws of the discrete Gaussian of variance parameter ``sigma2`` (CKS Algorithm 3):
    the accepted tries of :func:`_tries`, in order, in batches sized to give n at once (a
    second batch where the first falls short). Two waits for the host per batch."""
    torch = bits.torch
    s = Fraction(sigma2)
    t = cpu.laplace_scale(sigma2)
    parts, need = [], n
    while need > 0:
        y, accepted = _tries(bits, t, s, sigma2, int(need / cpu._YIELD * 1.02) + 32)
        got = y[accepted][:need]
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


def release(
    value, sensitivity: float, noise_multiplier: float, symmetric: bool, bits: DeviceBits
) -> device.DeviceArray:
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
