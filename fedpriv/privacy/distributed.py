"""Distributed noise for secure aggregation: every node quantizes its clipped contribution, adds
its share of Skellam noise and works in Z_(2^bits), so that the modular sum of the nodes' words
(what secure summation reveals) is already the noised release.

The mechanism (the multi-dimensional Skellam mechanism, Agarwal, Kairouz and Liu, NeurIPS 2021):

- **Scaling and rounding.** A release of real L2 sensitivity ``c`` (one user's clipped
  contribution) is scaled by ``s`` integers per unit and rounded to the nearest integer, once per
  node, on the node's sum. Two neighbouring data sets differ by one user's contribution ``x``, on
  the coordinates ``x`` touches; rounding moves each of them by less than 1, so the integer L2
  sensitivity is ``Delta2 = c s + sqrt(length)`` and the L1 one ``Delta1 <= min(Delta2^2,
  sqrt(length) Delta2)``. No random rotation is needed: the words are 64 bits wide and ``s`` makes
  the rounding term a ``ROUNDING_SHARE`` of ``c s``.
- **Noise shares, sized against colluding nodes.** Each node adds Skellam(lambda, lambda) noise,
  lambda = sigma^2 / (2 (n_min - c)), the difference of two Poisson draws; sums of Skellam
  variables are Skellam. A node knows its own share, and ``c`` colluding nodes (``colluders``,
  the run option ``secure_collusion``, default 1) know theirs: what is left to them of a release
  of ``n >= n_min`` shares is ``(n - c) sigma^2 / (n_min - c) >= sigma^2``, the calibrated
  noise. The ledger records that guaranteed noise (:func:`released_std`), so the reported
  epsilon holds against the server together with any ``c`` nodes. With fewer than ``n_min``
  contributors the server must not unmask (:meth:`DistributedPlan.check_contributors`).
- **Accounting.** Skellam noise of variance sigma^2 satisfies, at every order alpha >= 1,
  eps(alpha) <= alpha Delta2^2 / (2 sigma^2) + ((2 alpha - 1) Delta2^2 + 6 Delta1) / (4 sigma^4)
  (Agarwal et al., the first branch of their bound), i.e. (xi, rho)-zCDP with
  rho = Delta2^2 / (2 sigma^2) + Delta2^2 / (2 sigma^4) and xi = (6 Delta1 - Delta2^2) / (4 sigma^4)
  (``Release.to_event``: dp-accounting's ``ZCDpEvent``). Choosing sigma = kappa z Delta2 with
  kappa^2 = 1 + 3.5 / (z Delta2)^2 makes this no larger than the Gaussian mechanism's
  alpha / (2 z^2) at every order alpha >= 1 (with Delta1 <= Delta2^2): a plan calibrated for
  Gaussian noise of multiplier z stays within its budget. Subsampled releases get no
  amplification (dp-accounting has no subsampled Skellam event): in secure mode the calibration
  plans them unsampled.
- **Range.** The sum of the nodes' words is at most ``max_users c s + n_nodes / 2`` in absolute
  value before noise; with the noise tail (``TAIL`` standard deviations) that gives the range R
  and ``bits = ceil(log2(2 R + 1)) + 1``. The server decodes the centred sum and refuses one
  outside [-R, R] (a wrap-around, or a node that sent words outside its declared bounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..util.draws import _sanctioned
from ..errors import PrivacyError

ROUNDING_SHARE = 1e-4  # sqrt(length) (the rounding's worst case) <= this share of c * s
MIN_WORDS_PER_UNIT = 2.0**20  # c * s at least this many integers
TAIL = 14.0  # standard deviations of the summed noise inside the range (P(|N| > 14 sd) < 1e-44 per word)
MAX_BITS = 64


def kappa(noise_multiplier: float, delta2: float) -> float:
    """Factor on z * Delta2 that keeps Skellam's RDP below the Gaussian's at every order >= 1."""
    return math.sqrt(1.0 + 3.5 / (noise_multiplier * delta2) ** 2)


def skellam_zcdp(delta2: float, delta1: float, std: float) -> tuple[float, float]:
    """(rho, xi) of the Skellam mechanism with integer sensitivities ``delta2`` (L2), ``delta1``
    (L1) and noise standard deviation ``std``."""
    v = std * std
    rho = delta2 * delta2 / (2.0 * v) + delta2 * delta2 / (2.0 * v * v)
    xi = max(0.0, (6.0 * delta1 - delta2 * delta2) / (4.0 * v * v))
    return rho, xi


@dataclass(frozen=True)
class PartPlan:
    """One release inside a secure round: ``length`` words of the round's vector."""

    name: str
    length: int
    sensitivity: float  # L2, real units: one user's clipped contribution
    noise_multiplier: float  # z of the central calibration
    scale: float  # integers per real unit
    offset: int = 0  # first word of this part in the round's vector

    @property
    def delta2(self) -> float:
        """Integer L2 sensitivity after scaling and rounding."""
        return self.sensitivity * self.scale + math.sqrt(self.length)

    @property
    def delta1(self) -> float:
        return min(self.delta2**2, math.sqrt(self.length) * self.delta2)

    @property
    def std(self) -> float:
        """Standard deviation of the planned total noise (integer units, n_min contributors)."""
        return kappa(self.noise_multiplier, self.delta2) * self.noise_multiplier * self.delta2


@dataclass(frozen=True)
class DistributedPlan:
    """The public plan of one secure round: its parts, the word width and the contributors.

    ``max_users``: a public bound on the users summed (the range depends on it);
    ``n_nodes``: the nodes asked; ``min_contributors``: the noise shares are sized for this many
    (fewer surviving nodes: nothing is released); ``colluders``: the noise left after removing
    this many nodes' shares still meets the calibration.
    """

    parts: tuple[PartPlan, ...]
    max_users: int
    n_nodes: int
    min_contributors: int
    bits: int
    colluders: int = 0

    @property
    def length(self) -> int:
        return sum(p.length for p in self.parts)

    @property
    def modulus_mask(self) -> np.uint64:
        return np.uint64((1 << self.bits) - 1) if self.bits < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)

    def part(self, name: str) -> PartPlan:
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(name)

    def share_variance(self, part: PartPlan) -> float:
        """Variance of one node's Skellam share: the planned total over the shares that no
        coalition of ``colluders`` nodes knows."""
        return part.std**2 / (self.min_contributors - self.colluders)

    def range(self, part: PartPlan) -> float:
        """Largest absolute centred sum of ``part`` that is not a wrap-around."""
        signal = self.max_users * part.sensitivity * part.scale + 0.5 * self.n_nodes
        return signal + TAIL * math.sqrt(self.share_variance(part) * self.n_nodes)

    def check_contributors(self, n: int) -> None:
        """Refuse to unmask a round with fewer contributors than its noise was sized for."""
        if n < self.min_contributors:
            raise PrivacyError(
                f"secure round: {n} nodes contributed, fewer than the {self.min_contributors} "
                "its noise shares were sized for; nothing is released"
            )

    def to_dict(self) -> dict:
        """The plan as sent to the nodes (public values only)."""
        return {
            "parts": [[p.name, p.length, p.sensitivity, p.noise_multiplier, p.scale, p.offset] for p in self.parts],
            "max_users": self.max_users,
            "n_nodes": self.n_nodes,
            "min_contributors": self.min_contributors,
            "bits": self.bits,
            "colluders": self.colluders,
        }

    @staticmethod
    def from_dict(d: dict) -> "DistributedPlan":
        try:
            parts = tuple(
                PartPlan(str(n), int(k), float(c), float(z), float(s), int(o)) for n, k, c, z, s, o in d["parts"]
            )
            plan = DistributedPlan(
                parts,
                int(d["max_users"]),
                int(d["n_nodes"]),
                int(d["min_contributors"]),
                int(d["bits"]),
                int(d["colluders"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PrivacyError(f"secure round: malformed plan ({exc})") from None
        _validate(plan)
        return plan


def _validate(plan: DistributedPlan) -> None:
    if not (1 <= plan.bits <= MAX_BITS):
        raise PrivacyError(f"secure round: bits must be in [1, {MAX_BITS}], got {plan.bits}")
    if not (1 <= plan.min_contributors <= plan.n_nodes):
        raise PrivacyError(
            f"secure round: min_contributors must be in [1, n_nodes={plan.n_nodes}], got {plan.min_contributors}"
        )
    if not (0 <= plan.colluders < plan.min_contributors):
        raise PrivacyError(
            f"secure round: noise sized against {plan.colluders} colluding node(s) "
            f"needs more than {plan.colluders} contributors, "
            f"got {plan.min_contributors} (lower secure_collusion or secure_dropout, or add nodes)"
        )
    offset = 0
    for p in plan.parts:
        if p.offset != offset or p.length < 0 or not (p.sensitivity > 0 and p.noise_multiplier > 0 and p.scale > 0):
            raise PrivacyError(f"secure round: bad part {p.name!r}")
        offset += p.length
        if 2.0 * plan.range(p) + 1.0 > 2.0 ** (plan.bits - 1):
            raise PrivacyError(f"secure round: part {p.name!r} does not fit in {plan.bits} bits")


def plan_round(
    parts: list[tuple[str, int, float, float]],
    *,
    max_users: int,
    n_nodes: int,
    min_contributors: int | None = None,
    colluders: int = 1,
) -> DistributedPlan:
    """Plan a secure round of ``parts`` = [(release name, length, L2 sensitivity, z)]: the scale
    of each part, then the narrowest word width whose range holds every part. ``min_contributors``
    defaults to all ``n_nodes`` (no dropout tolerated); lower it to tolerate dropouts (each node
    then adds more noise). ``colluders``: nodes whose shares the guarantee does not count on."""
    if n_nodes < 1 or max_users < 1:
        raise PrivacyError(f"secure round: needs n_nodes >= 1 and max_users >= 1, got {n_nodes}, {max_users}")
    m = n_nodes if min_contributors is None else int(min_contributors)
    planned, offset = [], 0
    for name, length, c, z in parts:
        if not (c > 0 and z > 0 and math.isfinite(c) and math.isfinite(z)):
            raise PrivacyError(f"secure round: release {name!r} needs a finite sensitivity and noise multiplier > 0")
        words_per_unit = max(MIN_WORDS_PER_UNIT, math.sqrt(max(length, 1)) / ROUNDING_SHARE)
        planned.append(PartPlan(name, int(length), float(c), float(z), words_per_unit / c, offset))
        offset += int(length)
    c = int(colluders)
    if not (0 <= c < m):
        raise PrivacyError(
            f"secure round: noise sized against {c} colluding node(s) needs more than {c} contributing nodes, "
            f"got {m} of {n_nodes} (lower secure_collusion or secure_dropout, or add nodes)"
        )
    plan = DistributedPlan(tuple(planned), int(max_users), int(n_nodes), m, MAX_BITS, c)
    need = max((math.ceil(math.log2(2.0 * plan.range(p) + 1.0)) + 1 for p in planned), default=2)
    if need > MAX_BITS:
        raise PrivacyError(
            f"secure round: the range of {max_users} users needs {need} bits (> {MAX_BITS}); "
            "lower max_users or split the release"
        )
    plan = DistributedPlan(plan.parts, plan.max_users, plan.n_nodes, m, need, c)
    _validate(plan)
    return plan


# ---------------------------------------------------------------------------- node side
def skellam_share(rng: np.random.Generator, variance: float, size: int, *, name: str) -> np.ndarray:
    """One node's Skellam noise share (int64) of total ``variance``: Poisson - Poisson. The draw is
    sanctioned as 'node-noise:<name>' (the ledger records the release when the server unmasks)."""
    lam = variance / 2.0
    if not (lam >= 0 and math.isfinite(lam)) or lam > 1e18:
        raise PrivacyError(f"release {name!r}: Skellam share parameter {lam} out of range")
    with _sanctioned(f"node-noise:{name}"):
        return rng.poisson(lam, size).astype(np.int64) - rng.poisson(lam, size).astype(np.int64)


def encode(plan: DistributedPlan, values: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """A node's words: each part's clipped sum scaled, rounded, plus the node's noise share, mod
    2^bits (uint64). ``values`` holds every part of the plan, flattened to its length."""
    out = np.empty(plan.length, dtype=np.uint64)
    for p in plan.parts:
        x = np.asarray(values[p.name], dtype=np.float64).ravel()
        if x.size != p.length:
            raise PrivacyError(f"release {p.name!r}: {x.size} values, the plan says {p.length}")
        if not np.all(np.isfinite(x)):
            raise PrivacyError(f"release {p.name!r}: non-finite values")
        q = np.rint(x * p.scale)
        if np.any(np.abs(q) > plan.max_users * p.sensitivity * p.scale + 1.0):
            raise PrivacyError(f"release {p.name!r}: a value exceeds the declared bound of {plan.max_users} users")
        words = q.astype(np.int64) + skellam_share(rng, plan.share_variance(p), p.length, name=p.name)
        out[p.offset : p.offset + p.length] = words.astype(np.uint64)  # two's complement: mod 2^64
    return out & plan.modulus_mask


def add_words(plan: DistributedPlan, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a + b) mod 2^bits."""
    return (a.astype(np.uint64) + b.astype(np.uint64)) & plan.modulus_mask


# ---------------------------------------------------------------------------- server side
def decode(plan: DistributedPlan, total: np.ndarray, contributors: int) -> dict[str, np.ndarray]:
    """The released (noised) sums, in real units, from the modular sum of ``contributors``
    nodes' words. Refuses a round with too few contributors, and a sum outside its range (a
    wrap-around or out-of-bounds words): nothing is released then."""
    plan.check_contributors(contributors)
    total = np.asarray(total, dtype=np.uint64) & plan.modulus_mask
    if total.shape != (plan.length,):
        raise PrivacyError(f"secure round: the sum has shape {total.shape}, the plan says ({plan.length},)")
    shift = np.uint64(64 - plan.bits)
    signed = (total << shift).view(np.int64) >> np.int64(64 - plan.bits)  # centred: sign-extend the top bit
    out = {}
    for p in plan.parts:
        v = signed[p.offset : p.offset + p.length].astype(np.float64)
        if v.size and np.max(np.abs(v)) > plan.range(p):
            raise PrivacyError(
                f"release {p.name!r}: the unmasked sum is outside its range "
                "(a wrap-around, or a node sent words beyond its bounds); nothing is released"
            )
        out[p.name] = v / p.scale
    return out


def released_std(plan: DistributedPlan, part: PartPlan, contributors: int) -> float:
    """Standard deviation (integer units) of the noise guaranteed in a release of
    ``contributors`` shares: the shares of ``plan.colluders`` nodes are not counted (they may
    know them). At least the planned std when ``contributors >= plan.min_contributors``."""
    return math.sqrt(plan.share_variance(part) * (contributors - plan.colluders))


class Prereleased:
    """Stands in for the ledger when the sums were noised by the nodes: the algorithm's release
    functions call :meth:`gaussian` with the (already noised) decoded sums; it checks that the
    name, sensitivity and noise multiplier are the planned ones and returns the value as is."""

    def __init__(self, plan: DistributedPlan):
        self.plan, self.used = plan, set()

    def gaussian(
        self,
        name: str,
        value,
        *,
        sensitivity: float,
        noise_multiplier: float,
        symmetric: bool = False,
        sampling_rate=None,
        groups: int = 1,
    ):
        part = self.plan.part(name)
        if name in self.used:
            raise PrivacyError(f"release {name!r}: released twice from one secure round")
        if not (
            math.isclose(part.sensitivity, sensitivity, rel_tol=1e-12)
            and math.isclose(part.noise_multiplier, noise_multiplier, rel_tol=1e-12)
        ):
            raise PrivacyError(
                f"release {name!r}: the secure round was planned with sensitivity {part.sensitivity} "
                f"and z {part.noise_multiplier}, the release asks {sensitivity} and {noise_multiplier}"
            )
        self.used.add(name)
        return np.asarray(value, dtype=np.float64)


def secure_round(
    ledger,
    parts: list[tuple[str, int, float, float]],
    *,
    n_nodes: int,
    max_users: int,
    dropout: float,
    secure_sum,
    groups: int = 1,
    colluders: int = 1,
):
    """The one secure-aggregation step of every algorithm family and both engines: plan the round
    of ``parts`` (noise shares sized for all but ``floor(dropout * n_nodes)`` nodes, of which
    ``colluders`` may know their own shares), let
    ``secure_sum(plan)`` gather the nodes' words (returning ``(unmask, contributors)``), check the
    budget in ``ledger``, unmask, decode and record. Returns (the noised sums by part, a
    :class:`Prereleased` for the algorithm's own release functions)."""
    if not (0.0 <= dropout < 1.0):
        raise PrivacyError(f"secure round: dropout must be in [0, 1), got {dropout}")
    m = max(1, n_nodes - math.floor(dropout * n_nodes))
    plan = plan_round(parts, max_users=max_users, n_nodes=n_nodes, min_contributors=m, colluders=colluders)
    unmask, contributors = secure_sum(plan)
    values = ledger.skellam_round(plan, lambda: decode(plan, unmask(), contributors), contributors, groups=groups)
    return values, Prereleased(plan)


# ---------------------------------------------------------------------------- measurement sums
EXACT_SCALE = 2.0**32  # fixed-point integers per real unit of a measurement sum (|sum| < 2^31)


@dataclass(frozen=True)
class ExactPlan:
    """A secure sum without noise, for aggregate *measurements* (the evaluation's per-bucket
    squared errors and counts, the recommendation's hit counts): each node sends its values in
    fixed point (``EXACT_SCALE`` per unit), masked, so the server learns only the total over the
    nodes, exactly, and no node's own values. Not a release: no ledger record, and the total is
    outside the (epsilon, delta) guarantee (docs/explanations/trust-and-threat-models.md). ``parts``: (name, length)."""

    parts: tuple[tuple[str, int], ...]
    n_nodes: int
    bits: int = MAX_BITS
    min_contributors: int = 1

    @property
    def length(self) -> int:
        return sum(n for _, n in self.parts)

    def check_contributors(self, n: int) -> None:
        if n < self.min_contributors:
            raise PrivacyError(f"secure measurement: {n} nodes contributed, fewer than {self.min_contributors}")

    def bound(self) -> float:
        """Largest |value| one node may send: the total of ``n_nodes`` such values stays in range."""
        return (2.0 ** (self.bits - 1) - 1.0) / EXACT_SCALE / max(1, self.n_nodes)

    def to_dict(self) -> dict:
        return {"exact": [[n, k] for n, k in self.parts], "n_nodes": self.n_nodes, "bits": self.bits}

    def encode(self, values: dict[str, np.ndarray]) -> np.ndarray:
        """A node's words: its values in fixed point, mod 2^64 (refuses non-finite or too large values)."""
        out, at = np.empty(self.length, dtype=np.uint64), 0
        for name, k in self.parts:
            x = np.asarray(values[name], dtype=np.float64).ravel()
            if x.size != k or not np.all(np.isfinite(x)) or (k and np.max(np.abs(x)) > self.bound()):
                raise PrivacyError(
                    f"measurement {name!r}: expected {k} finite values of magnitude <= {self.bound():.3g}"
                )
            out[at : at + k] = np.rint(x * EXACT_SCALE).astype(np.int64).astype(np.uint64)
            at += k
        return out

    def decode(self, total: np.ndarray) -> dict[str, np.ndarray]:
        """The totals, in real units, from the modular sum of the nodes' words."""
        total = np.asarray(total, dtype=np.uint64)
        if total.shape != (self.length,):
            raise PrivacyError(f"secure measurement: the sum has shape {total.shape}, the plan says ({self.length},)")
        signed, out, at = total.view(np.int64).astype(np.float64) / EXACT_SCALE, {}, 0
        for name, k in self.parts:
            out[name] = signed[at : at + k]
            at += k
        return out


def plan_from_dict(d: dict) -> DistributedPlan | ExactPlan:
    """The plan a node receives: a noised round (:class:`DistributedPlan`) or a measurement sum."""
    if isinstance(d, dict) and "exact" in d:
        try:
            plan = ExactPlan(tuple((str(n), int(k)) for n, k in d["exact"]), int(d["n_nodes"]), int(d["bits"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PrivacyError(f"secure measurement: malformed plan ({exc})") from None
        if plan.bits != MAX_BITS or plan.n_nodes < 1 or any(k < 0 for _, k in plan.parts):
            raise PrivacyError("secure measurement: bad plan")
        return plan
    return DistributedPlan.from_dict(d)
