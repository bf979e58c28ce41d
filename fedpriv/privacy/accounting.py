"""Accounting over the ledger with dp-accounting (RDP primary, PLD second opinion), and
calibration of noise multipliers to a target (epsilon, delta).

Nothing here draws noise or looks at data: epsilon is a function of ledger records (or of a
plan of future releases) only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import dp_accounting
import numpy as np
from absl import logging as absl_logging
from dp_accounting.pld import common, pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from ..errors import ConfigError, PrivacyError
from .records import PlannedRelease, Release, RepeatAndSelect  # noqa: F401 - PlannedRelease re-exported
from .target import ADD_REMOVE, RELATIONS, REPLACE_ONE, check_relation  # noqa: F401 - re-exported

# dp-accounting logs (through absl) every fractional order it excludes for lack of convergence;
# the excluded orders only make epsilon more conservative
absl_logging.set_verbosity(absl_logging.ERROR)

# Dense RDP orders for (unsampled) Gaussian compositions, whose RDP is closed form: the
# accountant's epsilon is within 1e-4 (relative) of the continuous optimum.
RDP_ORDERS = np.unique(np.concatenate([1.0 + np.geomspace(0.011, 2000.0, 600), [4096.0, 8192.0]]))
# Poisson-subsampled Gaussians are computed by series at each order (slow for fractional
# orders): dp-accounting's default orders plus a few more integer ones.
SAMPLED_RDP_ORDERS = np.unique(
    np.concatenate(
        [[1 + x / 10.0 for x in range(1, 100)], np.arange(11, 65), [80, 96, 128, 192, 256, 512, 1024]]
    ).astype(float)
)


# Integer RDP orders, for every ledger or plan with distributed Skellam noise ("skellam" records).
# The Skellam mechanism's RDP bound (Agarwal, Kairouz and Liu, NeurIPS 2021, Theorem 3.5 and
# Corollary 3.6: eps(a) <= a D2^2 / (2 mu) + min(((2a - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu)),
# mu the noise variance; arXiv:2110.04995) is stated for integer orders a > 1 only, and Google's
# implementation (google-research/federated, distributed_dp/accounting_utils.py) casts its orders to
# int. A record's ZCDpEvent(rho, xi) would be evaluated by dp-accounting at any order it is given, so
# the orders are restricted here: at a < 2 nothing is proven, and between integers the bound is not
# claimed. RDP composes order by order, so a mixed ledger (skellam with gaussian, pure, ...) is
# evaluated at these orders for the whole composition; fewer orders only make epsilon larger. Every
# integer up to 256 (the optimal order of a Gaussian composition at epsilon >= 0.1, delta = 1e-5 is
# below it), then about 2.4% apart up to 8192 (the largest of RDP_ORDERS; costs < 1e-4 relative there).
INTEGER_RDP_ORDERS = np.unique(np.concatenate([np.arange(2, 257), np.round(np.geomspace(256, 8192, 150))])).astype(
    float
)
# with Poisson-sampled releases too (their RDP is a series at each order): the integer ones of
# SAMPLED_RDP_ORDERS
INTEGER_SAMPLED_RDP_ORDERS = SAMPLED_RDP_ORDERS[SAMPLED_RDP_ORDERS == np.floor(SAMPLED_RDP_ORDERS)]
# mechanisms whose RDP bound holds at integer orders only
INTEGER_ORDER_MECHANISMS = ("skellam",)


# ---------------------------------------------------------------------- neighbouring relation
# the relations are fedpriv.privacy.target's (re-exported): every function here takes the relation
# as an argument; given none, one that reads records takes a ledger's own (PrivacyLedger.relation)
# and add/remove for plain records, and calibration takes add/remove
#: releases that do not move when one user's data is replaced by another's: the released user
#: count (its replace-one sensitivity is 0, so it costs nothing under that relation)
REPLACE_INVARIANT = ("users",)


def relation_of(releases, relation: str | None = None) -> str:
    """The neighbouring relation to account ``releases`` under: ``relation`` when given (checked),
    else the ledger's own (a :class:`~fedpriv.privacy.ledger.PrivacyLedger` carries the relation
    of its run), else :data:`ADD_REMOVE`."""
    if relation is None:
        relation = getattr(releases, "relation", None) or ADD_REMOVE
    return check_relation(relation)


def replace_one_record(r):
    """The ledger record ``r`` (add/remove sensitivities, as the ledger records them) restated
    for the replace-one relation, or None when the release cannot move (:data:`REPLACE_INVARIANT`).

    Replacing user u by v is removing u then adding v, so every release moves by at most twice
    its add/remove sensitivity (the triangle inequality): L2 and L1 sensitivities double, and a
    pure epsilon doubles (group privacy of two). The noise is unchanged, so the noise multiplier
    halves. A Poisson-sampled release loses its sampling rate: dp-accounting's RDP accountant has
    no Poisson-sampled event under REPLACE_ONE, and the unsampled Gaussian of the doubled
    sensitivity bounds it (for each coupled sample the two sums differ by at most 2 x the
    sensitivity, and the Renyi divergence is jointly convex over the mixture). Disjoint groups
    stay disjoint: the replaced user keeps their slot (node), so one group's release moves."""
    if isinstance(r, RepeatAndSelect):
        inner = tuple(x for x in (replace_one_record(x) for x in r.releases) if x is not None)
        return dataclasses.replace(r, releases=inner) if inner else None
    if r.name in REPLACE_INVARIANT and r.mechanism in ("gaussian", "skellam"):
        return None
    changes: dict = {"sensitivity": 2.0 * r.sensitivity}
    if r.mechanism == "gaussian":
        changes["sampling_rate"] = None
    if r.l1_sensitivity is not None:
        changes["l1_sensitivity"] = 2.0 * r.l1_sensitivity
    if r.pure_epsilon is not None:
        changes["pure_epsilon"] = 2.0 * r.pure_epsilon
    return dataclasses.replace(r, **changes)


def records_under(releases, relation: str | None = None) -> list:
    """The records of ``releases`` (a ledger or records) with the sensitivities of ``relation``
    (the ledger records add/remove ones; :func:`replace_one_record` for replace-one)."""
    relation = relation_of(releases, relation)
    rels = _as_releases(releases)
    if relation == ADD_REMOVE:
        return rels
    return [x for x in (replace_one_record(r) for r in rels) if x is not None]


def dp_relation(relation: str = ADD_REMOVE) -> dp_accounting.NeighboringRelation:
    """dp-accounting's NeighboringRelation of ``relation``."""
    return (
        dp_accounting.NeighboringRelation.REPLACE_ONE
        if check_relation(relation) == REPLACE_ONE
        else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )


def _flat(rels) -> list[Release]:
    out: list[Release] = []
    for r in rels:
        out += _flat(r.releases) if isinstance(r, RepeatAndSelect) else [r]
    return out


def needs_integer_orders(releases) -> bool:
    """Whether the releases (a ledger, records or plan records) hold a mechanism whose RDP bound is
    proven at integer orders only (distributed Skellam noise): then every order used to account
    them is an integer (:data:`INTEGER_RDP_ORDERS`)."""
    return any(r.mechanism in INTEGER_ORDER_MECHANISMS for r in _flat(_as_releases(releases)))


def _orders(rels, integer_orders: bool = False) -> np.ndarray:
    """The RDP orders to account ``rels`` at: integer ones when asked or when a record needs them."""
    sampled = any(r.sampling_rate not in (None, 1.0) for r in rels)
    if integer_orders or needs_integer_orders(rels):
        return INTEGER_SAMPLED_RDP_ORDERS if sampled else INTEGER_RDP_ORDERS
    return SAMPLED_RDP_ORDERS if sampled else RDP_ORDERS


def release_event(rel: Release | RepeatAndSelect) -> dp_accounting.DpEvent:
    """The dp-accounting event of one ledger record (:meth:`Release.to_event`)."""
    return rel.to_event()


def ledger_event(releases: Iterable[Release]) -> dp_accounting.DpEvent:
    return dp_accounting.ComposedDpEvent([release_event(r) for r in releases])


def _as_releases(releases) -> list[Release]:
    if hasattr(releases, "releases"):
        return list(releases.releases)
    return list(releases)


def _epsilon(accountant, releases, delta: float) -> float:
    rels = _as_releases(releases)
    if not rels:
        return 0.0
    accountant.compose(ledger_event(rels))
    return float(accountant.get_epsilon(delta))


def epsilon_rdp(releases, delta: float, *, integer_orders: bool = False, relation: str | None = None) -> float:
    """Epsilon of the composed releases (a ledger or a list of Release) at ``delta``, via RDP.
    ``integer_orders``: at integer orders only (as for a ledger with a skellam record, always).
    ``relation``: the neighbouring relation (default :func:`relation_of` the releases: a ledger's
    own, else add/remove; the records' sensitivities are restated for it by :func:`records_under`)."""
    relation = relation_of(releases, relation)
    integer_orders = integer_orders or needs_integer_orders(releases)
    rels = records_under(releases, relation)
    acc = rdp_privacy_accountant.RdpAccountant(
        orders=_orders(rels, integer_orders), neighboring_relation=dp_relation(relation)
    )
    return _epsilon(acc, rels, delta)


def pld_supported(releases, relation: str | None = None) -> bool:
    """PLD accounting covers Gaussian (and Poisson-sampled) and Laplace releases, not private
    tuning, the exponential mechanism, private selection nor distributed Skellam noise (whose
    bound is an RDP one, at integer orders); under replace-one, not Laplace either (dp-accounting's
    PLD accountant has no Laplace event for that relation)."""
    allowed = ("gaussian", "laplace") if relation_of(releases, relation) == ADD_REMOVE else ("gaussian",)
    return not any(isinstance(r, RepeatAndSelect) or r.mechanism not in allowed for r in _as_releases(releases))


def epsilon_pld(releases, delta: float, discretization: float = 1e-4, *, relation: str | None = None) -> float:
    """Epsilon via privacy loss distributions (tighter; a second opinion)."""
    relation = relation_of(releases, relation)
    if not pld_supported(releases, relation):
        raise PrivacyError(
            "PLD accounting does not support private tuning (repeat_and_select), the exponential mechanism, private "
            "selection or Skellam noise "
            "(nor Laplace under replace-one); use RDP"
        )
    acc = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=discretization, neighboring_relation=dp_relation(relation)
    )
    rels = _as_releases(releases)
    if relation == REPLACE_ONE:
        # dp-accounting's two accountants read a Gaussian event differently under REPLACE_ONE:
        # the RDP accountant composes the plain Gaussian's RDP (its multiplier must be relative to
        # the replace-one sensitivity, hence records_under's doubling), while the PLD one
        # models the replacement itself (mu(x + s) against mu(x - s): twice the sensitivity, with
        # Poisson sampling too), so its multiplier stays relative to the add/remove sensitivity.
        # Only the releases that cannot move are dropped.
        rels = [r for r in rels if r.name not in REPLACE_INVARIANT]
    return _epsilon(acc, rels, delta)


#: Above this epsilon the PLD second opinion is not computed. Its grid spans the privacy loss at
#: a fixed resolution, so its time and memory grow with epsilon (measured on ML-100K: 393 s at
#: epsilon 1,000; at 1e6 the process reached 21 GB and was killed), while an epsilon this large
#: protects nothing anyway. The RDP epsilon, the guarantee, is always computed.
PLD_MAX_EPSILON = 100.0


def epsilon_pld_second_opinion(
    releases, delta: float, primary: float | None, *, relation: str | None = None
) -> float | None:
    """The PLD second opinion on a ledger whose reported epsilon is ``primary``: None when PLD
    does not cover the ledger (:func:`pld_supported`) or when ``primary`` exceeds
    :data:`PLD_MAX_EPSILON` (bounded time and memory at any epsilon)."""
    relation = relation_of(releases, relation)
    if (
        primary is None
        or not math.isfinite(primary)
        or primary > PLD_MAX_EPSILON
        or not pld_supported(releases, relation)
    ):
        return None
    return epsilon_pld(releases, delta, relation=relation)


def rdp_curve(releases, *, integer_orders: bool = False, relation: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP epsilons) of the composed releases (integer orders and ``relation``: see :func:`epsilon_rdp`)."""
    relation = relation_of(releases, relation)
    integer_orders = integer_orders or needs_integer_orders(releases)
    rels = records_under(releases, relation)
    acc = rdp_privacy_accountant.RdpAccountant(
        orders=_orders(rels, integer_orders), neighboring_relation=dp_relation(relation)
    )
    acc.compose(ledger_event(rels))
    return acc.orders, acc.rdp


def zcdp_rho(releases, *, relation: str | None = None) -> float:
    """Zero-concentrated DP rho of composed *unsampled* Gaussian releases (count / (2 z^2) each),
    exponential mechanisms (epsilon^2 / 8 each, bounded range) and other pure epsilon-DP
    releases (Laplace, private selection: epsilon^2 / 2 each), under ``relation``."""
    if any(isinstance(r, Release) and r.sampling_rate not in (None, 1.0) for r in _as_releases(releases)):
        raise PrivacyError("zCDP rho is only reported for unsampled Gaussian releases and pure mechanisms")
    rels = records_under(releases, relation)
    if any(isinstance(r, RepeatAndSelect) or r.sampling_rate not in (None, 1.0) for r in rels):
        raise PrivacyError("zCDP rho is only reported for unsampled Gaussian releases and pure mechanisms")

    def rho(r: Release) -> float:
        if r.mechanism == "exponential":
            return r.pure_epsilon**2 / 8.0
        if r.mechanism in ("laplace", "selection"):
            return r.pure_epsilon**2 / 2.0
        return 1.0 / (2.0 * r.noise_multiplier**2)

    return float(sum(r.accounted_count * rho(r) for r in rels))


PURE_MECHANISMS = ("exponential", "laplace", "selection")


def _record_pld(r: Release, discretization: float):
    """dp-accounting's privacy loss distribution of one ledger record, self-composed."""
    if r.mechanism in PURE_MECHANISMS:
        pld = privacy_loss_distribution.from_privacy_parameters(
            common.DifferentialPrivacyParameters(r.pure_epsilon, 0.0)
        )
        # no tail truncation: a truncated tail is an infinite loss at delta = 0
        return pld.self_compose(r.accounted_count, tail_mass_truncation=0.0) if r.accounted_count > 1 else pld
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        r.noise_multiplier,
        sampling_prob=r.sampling_rate if r.sampling_rate is not None else 1.0,
        value_discretization_interval=discretization,
    )
    return pld.self_compose(r.accounted_count) if r.accounted_count > 1 else pld


def _composed_pld(rels, discretization: float = 1e-4):
    total = None
    for r in rels:
        pld = _record_pld(r, discretization)
        total = (
            pld
            if total is None
            else total.compose(pld, tail_mass_truncation=0.0 if r.mechanism in PURE_MECHANISMS else 1e-15)
        )
    return total


def epsilon_pure(releases, *, relation: str | None = None) -> float | None:
    """Pure-DP epsilon (delta = 0) of the composed releases when every release is pure
    (exponential mechanism, Laplace, private selection), None otherwise: dp-accounting's privacy
    loss distribution of a generic (epsilon, 0)-DP mechanism per record, self-composed and
    composed. Pure epsilon-DP implies (epsilon, delta)-DP for every delta."""
    rels = records_under(releases, relation)
    if not rels or any(isinstance(r, RepeatAndSelect) or r.mechanism not in PURE_MECHANISMS for r in rels):
        return None
    return float(_composed_pld(rels).get_epsilon_for_delta(0.0))


def epsilon_mixed_pld(releases, delta: float, *, relation: str | None = None) -> float | None:
    """Epsilon at ``delta`` of a ledger that mixes pure releases with Gaussian ones, by
    composing dp-accounting's privacy loss distributions of every record (generic (epsilon,
    0)-DP for the pure ones); None when the ledger has no pure release or holds private tuning.
    (RDP turns a pure epsilon into epsilon^2/2-zCDP, which is loose at small delta.) Under
    replace-one the records are restated (:func:`records_under`: unsampled, doubled sensitivities),
    and an unsampled Gaussian's PLD is the same for both relations at its multiplier."""
    rels = records_under(releases, relation)
    if not rels or not any(isinstance(r, Release) and r.mechanism in PURE_MECHANISMS for r in rels):
        return None
    if any(isinstance(r, RepeatAndSelect) or r.mechanism not in (*PURE_MECHANISMS, "gaussian") for r in rels):
        return None
    return float(_composed_pld(rels).get_epsilon_for_delta(delta))


def epsilon_bounds(releases, delta: float, *, relation: str | None = None) -> tuple[float, float, float | None]:
    """(epsilon spent, RDP epsilon, pure epsilon or None) at ``delta``: the spent epsilon is the
    smaller of the RDP bound and, when the ledger holds pure releases, the composition of
    dp-accounting's privacy loss distributions of its records (when every release is pure,
    this is the pure bound: pure epsilon-DP implies (epsilon, delta)-DP). The one rule for every
    reported or budgeted epsilon. ``relation``: the neighbouring relation (default
    :func:`relation_of` the releases: a ledger's own, else add/remove)."""
    relation = relation_of(releases, relation)
    rdp = epsilon_rdp(releases, delta, relation=relation)
    pure = epsilon_pure(releases, relation=relation)
    if pure is not None:
        return min(rdp, pure), rdp, pure
    mixed = epsilon_mixed_pld(releases, delta, relation=relation)
    return (rdp if mixed is None else min(rdp, mixed)), rdp, None


# ---------------------------------------------------------------------- accountants
class _Accountant:
    """An accountant accounts under its ``relation``; None (the default): the relation of the
    ledger that takes it (:class:`~fedpriv.privacy.ledger.PrivacyLedger` binds it to its own), or,
    unbound, of what it is given (:func:`relation_of`: a ledger's own, add/remove for records)."""

    def __init__(self, relation: str | None = None):
        self.relation = None if relation is None else check_relation(relation)


class RdpAccountant(_Accountant):
    """Epsilon by dp-accounting's RDP accountant."""

    def epsilon(self, records, delta: float) -> float:
        return epsilon_rdp(records, delta, relation=self.relation)


class PldAccountant(_Accountant):
    """Epsilon by privacy loss distributions (Gaussian, sampled Gaussian and Laplace records)."""

    def __init__(self, discretization: float = 1e-4, relation: str | None = None):
        super().__init__(relation)
        self.discretization = discretization

    def epsilon(self, records, delta: float) -> float:
        return epsilon_pld(records, delta, self.discretization, relation=self.relation)


class PureAccountant(_Accountant):
    """Pure epsilon of records that are all pure (exponential, Laplace, selection)."""

    def epsilon(self, records, delta: float) -> float:
        eps = epsilon_pure(records, relation=self.relation)
        if eps is None and _as_releases(records):
            raise PrivacyError("the pure accountant takes pure releases only (exponential, laplace, selection)")
        return 0.0 if eps is None else eps


class BestOfAccountant(_Accountant):
    """The smallest of the applicable bounds (:func:`epsilon_bounds`): the one rule of every
    reported or budgeted epsilon."""

    def epsilon(self, records, delta: float) -> float:
        return epsilon_bounds(records, delta, relation=self.relation)[0]


# ---------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class Calibration:
    multipliers: dict[str, float]
    epsilon: float
    delta: float
    scale: float
    share_rule: dict[str, float] | None = None  # fair allocation only: what z = s / sqrt(share) gave
    integer_orders: bool = False  # calibrated at integer RDP orders (secure mode: Skellam noise)
    relation: str = ADD_REMOVE  # the neighbouring relation the target holds under

    def multiplier(self, name: str) -> float:
        return self.multipliers[name]


def _plan_releases(
    plan: Sequence[PlannedRelease], scale: float, order: float | None = None, pinned: dict[str, float] | None = None
) -> list[Release]:
    """The plan's records at ``scale``: z = scale / sqrt(share) (the share rule), or with
    ``order`` the fair rule of :func:`fair_multiplier` for the Poisson-sampled releases;
    ``pinned`` releases keep their given multiplier (already made)."""
    out = []
    for p in plan:
        if p.count <= 0:
            continue
        if pinned and p.name in pinned:
            out.append(Release(p.name, "gaussian", 1.0, float(pinned[p.name]), p.count, p.sampling_rate))
            continue
        z = scale / math.sqrt(p.share)
        if order is not None and p.sampling_rate is not None and p.sampling_rate < 1:
            z = fair_multiplier(p.sampling_rate, z, order)
        out.append(Release(p.name, "gaussian", 1.0, z, p.count, p.sampling_rate))
    return out


def _sampled_rdp(q: float, z: float, order: float) -> float:
    """RDP at one order of a Poisson-sampled Gaussian (dp-accounting's own formula, through its
    public accountant at that single order)."""
    acc = rdp_privacy_accountant.RdpAccountant(orders=[float(order)])
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
    return float(acc.rdp[0])


def fair_multiplier(q: float, z_share: float, order: float) -> float:
    """The noise multiplier of a Poisson-sampled (rate ``q``) Gaussian release that spends, at
    RDP order ``order``, what an unsampled release of multiplier ``z_share`` would: its share of
    the composed privacy loss. Without it the share rule z = s / sqrt(share) ignores the
    amplification by sampling and over-noises the sampled release."""
    target = order / (2.0 * z_share * z_share)
    lo, hi = 1e-3, z_share  # the sampled release at z_share spends less than its share: z <= z_share
    if _sampled_rdp(q, hi, order) >= target:
        return hi
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if _sampled_rdp(q, mid, order) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-5:
            break
    return hi  # spends at most its share at ``order``


def _bisect_scale(eps, epsilon: float, lo: float, hi: float, step: float, rtol: float) -> tuple[float, float, float]:
    """(lo, hi, eps(hi)) for a noise scale with eps(lo) > epsilon >= eps(hi), eps(hi) within
    ``rtol`` of the target: bracket by factors of ``step``, then bisect geometrically."""
    while eps(hi) > epsilon:
        lo, hi = hi, hi * step
        if hi > 1e9:
            raise PrivacyError("calibration failed: epsilon target unreachable")
    while eps(lo) < epsilon:
        lo /= step
        if lo < 1e-12:
            raise PrivacyError("calibration failed: epsilon target too large for this plan")
    e_hi = eps(hi)
    while (epsilon - e_hi) / epsilon > rtol and hi / lo > 1 + 1e-12:
        mid = math.sqrt(lo * hi)
        e = eps(mid)
        if e > epsilon:
            lo = mid
        else:
            hi, e_hi = mid, e
    return lo, hi, e_hi


def calibrate(
    plan: Sequence[PlannedRelease],
    epsilon: float,
    delta: float,
    rtol: float = 1e-4,
    repeat: tuple[float, float] | None = None,
    fair: bool = True,
    pinned: dict[str, float] | None = None,
    *,
    integer_orders: bool = False,
    relation: str = ADD_REMOVE,
) -> Calibration:
    """Find the noise multipliers so that the composed plan spends ``epsilon`` at ``delta``.

    Bisection (in log scale) on one common scale s with z_k = s / sqrt(share_k) (the share
    rule); the composed epsilon is decreasing in s. With Poisson-sampled releases and ``fair``
    (the default), a sampled release instead gets the multiplier that spends its share of the
    RDP at the composition's optimal order (:func:`fair_multiplier`), found by the same
    bisection at that order. The result satisfies eps(plan) <= epsilon and is within
    ``rtol`` of it (relative). With ``repeat=(mean, shape)`` the plan is one run of private
    tuning by random stopping and the target is the epsilon of the whole tuning
    (``RepeatAndSelectDpEvent``). ``pinned``: releases already made with these multipliers
    (composed as they are; the others share what is left of ``epsilon``). ``integer_orders``:
    the target is met at integer RDP orders only (:data:`INTEGER_RDP_ORDERS`), as secure mode
    needs: its releases carry Skellam noise, accounted at integer orders, whose RDP is at most
    the Gaussian's of the same multiplier at every order (:mod:`fedpriv.privacy.distributed`).
    ``relation``: the neighbouring relation the target holds under (default
    :data:`ADD_REMOVE`); the multipliers stay relative to the add/remove sensitivities the
    ledger records. Under replace-one every release costs what :func:`replace_one_record` says
    (twice the sensitivity, no amplification by sampling, the user count free), so sampled
    releases are planned unsampled (no fair rule).
    """
    relation = check_relation(relation)
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ConfigError(f"must be a finite positive number, got {epsilon}", field="epsilon")
    if not (0 < delta < 1):
        raise ConfigError(f"must be in (0, 1), got {delta}", field="delta")
    plan = [p for p in plan if p.count > 0]
    if not plan:
        raise ConfigError("the plan has no release to calibrate", field="plan")
    for p in plan:
        if not p.share > 0:
            raise ConfigError(f"share of {p.name!r} must be > 0", field="plan")

    if pinned:
        unknown = set(pinned) - {p.name for p in plan}
        if unknown:
            raise ConfigError(f"pinned releases {sorted(unknown)} are not in the plan", field="plan")
        if any(p.sampling_rate is not None and p.sampling_rate < 1 for p in plan) or repeat is not None:
            raise ConfigError("pinned releases are supported for plans of unsampled releases only", field="plan")
    integer = bool(integer_orders)
    if relation == REPLACE_ONE:
        if not any(p.name not in REPLACE_INVARIANT for p in plan):
            raise ConfigError(
                "under replace-one the plan's only release (the user count) costs nothing: nothing to calibrate",
                field="plan",
            )
        cal = _calibrate_scale(
            plan, epsilon, delta, rtol, repeat, None, pinned=pinned, integer_orders=integer, relation=relation
        )
        return dataclasses.replace(cal, relation=relation)
    share_rule = _calibrate_scale(plan, epsilon, delta, rtol, repeat, None, pinned=pinned, integer_orders=integer)
    if fair and any(p.sampling_rate is not None and p.sampling_rate < 1 for p in plan):
        # fair rule: at the optimal order of the composition, every release spends its share of
        # the RDP; iterate the order a few times (it moves little once the sampled releases
        # get their fair, smaller multipliers)
        order = _optimal_order(_plan_releases(plan, share_rule.scale), delta, integer)
        cal = share_rule
        for _ in range(4):
            if repeat is None:
                cal = _calibrate_at_order(plan, epsilon, delta, order, integer)
            else:
                cal = _calibrate_scale(
                    plan, epsilon, delta, rtol, repeat, order, start=cal.scale, integer_orders=integer
                )
            new = _optimal_order(_plan_releases(plan, cal.scale, order), delta, integer)
            if new == order:
                break
            order = new
        return dataclasses.replace(cal, share_rule=dict(share_rule.multipliers))
    return share_rule


def _calibrate_at_order(plan, epsilon: float, delta: float, order: float, integer_orders: bool = False) -> Calibration:
    """The fair rule's scale for one RDP order, without composing the whole curve at each try:
    at ``order`` every release spends exactly its share (``count * share * order / (2 s^2)``
    in all), so the scale whose conversion at that order gives ``epsilon`` is a 1-D bisection.
    The plan's epsilon (the minimum over all orders) is then at most ``epsilon``."""
    mass = sum(p.count * p.share for p in plan)

    def eps_at(scale: float) -> float:
        return float(rdp_privacy_accountant.compute_epsilon([order], [mass * order / (2.0 * scale * scale)], delta)[0])

    lo, hi = 1e-6, 1.0
    while eps_at(hi) > epsilon:
        lo, hi = hi, hi * 4
        if hi > 1e9:
            raise PrivacyError("calibration failed: epsilon target unreachable")
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if eps_at(mid) > epsilon:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    rels = _plan_releases(plan, hi, order)
    return Calibration(
        multipliers={r.name: r.noise_std for r in rels},
        epsilon=epsilon_rdp(rels, delta, integer_orders=integer_orders),
        delta=delta,
        scale=hi,
        integer_orders=integer_orders,
    )


def _optimal_order(rels: list[Release], delta: float, integer_orders: bool = False) -> float:
    orders, rdp = rdp_curve(rels, integer_orders=integer_orders)
    return float(rdp_privacy_accountant.compute_epsilon(orders, rdp, delta)[1])


def _calibrate_scale(
    plan,
    epsilon: float,
    delta: float,
    rtol: float,
    repeat,
    order: float | None,
    start: float = 1.0,
    pinned=None,
    integer_orders: bool = False,
    relation: str = ADD_REMOVE,
) -> Calibration:
    """Bisection on the common scale (see :func:`calibrate`); ``order``: the fair rule's order;
    ``start``: a guess of the scale (the bracket grows from it)."""

    def eps(scale: float) -> float:
        rels = _plan_releases(plan, scale, order, pinned)
        if repeat is not None:
            rels = [RepeatAndSelect("tuning", float(repeat[0]), float(repeat[1]), 0, rels)]
        return epsilon_rdp(rels, delta, integer_orders=integer_orders, relation=relation)

    lo, hi, e_hi = _bisect_scale(eps, epsilon, start / 2.0, start, 4.0, rtol)
    return Calibration(
        multipliers={r.name: r.noise_std for r in _plan_releases(plan, hi, order, pinned)},
        epsilon=e_hi,
        delta=delta,
        scale=hi,
        integer_orders=integer_orders,
        relation=relation,
    )


def gaussian_epsilon_closed_form(rho: float, delta: float) -> float:
    """Closed-form epsilon of a Gaussian mechanism composition with RDP curve eps(a) = rho * a,
    using the same RDP->DP conversion as dp-accounting (Balle et al. 2020, Prop. 12) minimised
    over continuous orders a > 1. Independent of dp-accounting: used to cross-check it."""
    from scipy.optimize import minimize_scalar

    def f(log_am1: float) -> float:
        a = 1.0 + math.exp(log_am1)
        return rho * a + math.log1p(-1.0 / a) - math.log(delta * a) / (a - 1.0)

    res = minimize_scalar(f, bounds=(math.log(1e-3), math.log(1e5)), method="bounded", options={"xatol": 1e-10})
    return max(0.0, float(res.fun))


def epsilon_vs_colluders(records, delta: float, colluders: int = 1, *, relation: str | None = None) -> float:
    """The epsilon (RDP, from the ledger's ``records``) that holds against the server together
    with ``colluders`` nodes that know their own noise shares: every skellam record whose
    guarantee counted fewer colluders is recomputed with only ``shares - colluders`` shares of
    noise (Gaussian records, drawn by a trusted aggregator, are unchanged). Infinite when a
    release had no more than ``colluders`` shares."""
    relation = relation_of(records, relation)
    out = []
    for r in getattr(records, "releases", records):
        if isinstance(r, Release) and r.mechanism == "skellam" and (r.colluders or 0) < colluders:
            shares, known = int(r.shares or 0), int(r.colluders or 0)
            if shares <= colluders:
                return math.inf
            # std^2 = (shares - known) v  =>  (shares - colluders) v of noise left
            r = dataclasses.replace(
                r, noise_std=r.noise_std * math.sqrt((shares - colluders) / (shares - known)), colluders=int(colluders)
            )
        out.append(r)
    return epsilon_rdp(out, delta, relation=relation)


# ---------------------------------------------------------------------- tuning whose runs are all seen
# On the Flower engines every node receives each run's broadcasts and noised releases, and can
# count the runs: its view is (K, run 1, ..., run K) with K ~ D_{shape, gamma(mean)} drawn
# independently of the data. Conditioning on the seen K, for every event S and neighbours D, D':
#     P_D[S] = sum_k P[K=k] P_D[S | k] <= e^eps P_D'[S] + sum_k P[K=k] delta_k(eps),
# delta_k(eps) the delta of the k-fold composition of one run (dp-accounting's RDP of one run,
# times k, converted by dp-accounting's compute_delta). The sum is cut at N, the smallest k with
# P[K > N] <= RUNS_TAIL_FRACTION * delta, and P[K > N] is added whole (delta_k <= 1).

#: the law of K is cut where the mass left is at most this fraction of delta (added to delta whole)
RUNS_TAIL_FRACTION = 1e-3


def runs_law(shape: float, mean: float, tail: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(k = 1..N, P[K = k], P[K > N]) of K ~ D_{shape, gamma(mean)} (:mod:`fedpriv.privacy.tnb`,
    the law dp-accounting's ``RepeatAndSelectDpEvent`` uses), N the smallest k with
    P[K > k] <= ``tail``. The mass past the computed block is bounded by a geometric series
    (the ratio P[k+1]/P[k] = (1-gamma)(k+shape)/(k+1) is bounded past it)."""
    from . import tnb

    gamma = tnb.gamma_for_mean(float(shape), float(mean))
    if gamma >= 1.0:
        return np.array([1]), np.array([1.0]), 0.0
    m = 64
    while True:
        ks = np.arange(1, m + 1)
        p = tnb.pmf(ks, float(shape), gamma)
        ratio = max((1.0 - gamma) * (m + shape) / (m + 1.0), 1.0 - gamma)  # bounds every later ratio
        beyond = p[-1] * ratio / (1.0 - ratio) if ratio < 1 else math.inf
        after = np.append(np.cumsum(p[::-1])[::-1][1:], 0.0) + beyond  # P[K > k], k = ks
        if after[-1] <= tail:
            n = int(np.argmax(after <= tail))
            return ks[: n + 1], p[: n + 1], float(after[n])
        m *= 2
        if m > 1 << 24:
            raise PrivacyError(f"the law of K (shape {shape}, mean {mean}) has too heavy a tail to account")


def _split_all_runs(releases):
    """(the repeat_and_compose record, the other records) of a ledger."""
    rels = _as_releases(releases)
    tuned = [r for r in rels if getattr(r, "mechanism", None) == "repeat_and_compose"]
    if len(tuned) != 1 or any(isinstance(r, RepeatAndSelect) for r in rels):
        raise PrivacyError(
            "epsilon_all_runs accounts a ledger with exactly one repeat_and_compose record and no repeat_and_select"
        )
    return tuned[0], [r for r in rels if r is not tuned[0]]


def all_runs_rdp(releases, *, integer_orders: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """(orders, RDP of one run, RDP of the other records, (k, P[K=k]) ) of a ledger holding one
    repeat_and_compose record: dp-accounting's RDP accountant on one run's events and on the rest."""
    rec, others = _split_all_runs(releases)
    orders = _orders([*rec.releases, *others], integer_orders)
    run = rdp_privacy_accountant.RdpAccountant(orders=orders)
    run.compose(ledger_event(rec.releases))
    rest = rdp_privacy_accountant.RdpAccountant(orders=orders)
    if others:
        rest.compose(ledger_event(others))
    return np.asarray(run.orders), np.asarray(run.rdp), np.asarray(rest.rdp), (rec.shape, rec.mean)


def delta_all_runs(releases, epsilon: float, delta_target: float, *, integer_orders: bool = False) -> float:
    """The delta, at ``epsilon``, of the view of every run of a repeat_and_compose record (K seen)
    composed with the ledger's other records; the law of K is cut at ``RUNS_TAIL_FRACTION *
    delta_target``. Every delta_k comes from dp-accounting's ``compute_delta``."""
    orders, run, rest, (shape, mean) = all_runs_rdp(releases, integer_orders=integer_orders)
    ks, pk, tail = runs_law(shape, mean, RUNS_TAIL_FRACTION * delta_target)
    total = tail
    for k, p in zip(ks, pk):
        total += p * rdp_privacy_accountant.compute_delta(orders, rest + k * run, float(epsilon))[0]
    return float(min(total, 1.0))


def _fast_deltas(orders: np.ndarray, curves: np.ndarray, eps: float) -> np.ndarray:
    """dp-accounting's ``compute_delta`` (its bounds, same formula) for many RDP curves at once
    (rows of ``curves``): used inside searches only; reported values call dp-accounting itself."""
    a = orders[None, :]
    r = np.maximum(curves, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kl = np.where(r > 0, 0.5 * np.log1p(-np.exp(-r)), -np.inf)
        bound = np.where(a > 1.01, (a - 1) * (r - eps + np.log1p(-1 / a)) - np.log(a), np.inf)
    return np.minimum(np.exp(np.min(np.minimum(kl, bound), axis=1)), 1.0)


def _epsilon_of_delta(delta_at, delta: float, hi: float, rtol: float = 1e-7) -> float:
    """The smallest epsilon (to ``rtol``) with ``delta_at(epsilon) <= delta``; ``delta_at`` decreasing."""
    lo = 0.0
    while delta_at(hi) > delta:
        lo, hi = hi, hi * 2
        if hi > 1e7:
            return math.inf
    if delta_at(0.0) <= delta:
        return 0.0
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        if delta_at(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def epsilon_all_runs(
    releases, delta: float, *, integer_orders: bool = False, exact: bool = True, relation: str | None = None
) -> float:
    """Epsilon at ``delta`` of a ledger with one repeat_and_compose record: what holds against
    whoever sees every run and K (a node, on the Flower engines). The smallest epsilon with
    :func:`delta_all_runs` <= delta, every delta_k from dp-accounting's ``compute_delta``.
    (``exact=False``: without the final check by dp-accounting's own function, for searches.)
    Add/remove only (``relation``: :func:`relation_of` the releases): a tuning seen by the nodes
    is not accounted under replace-one."""
    relation = relation_of(releases, relation)
    if relation != ADD_REMOVE:
        raise PrivacyError(f"tuning whose runs the nodes see is accounted under {ADD_REMOVE!r} only, not {relation!r}")
    orders, run, rest, (shape, mean) = all_runs_rdp(releases, integer_orders=integer_orders)
    ks, pk, tail = runs_law(shape, mean, RUNS_TAIL_FRACTION * delta)
    if tail >= delta:
        return math.inf

    def fast(eps: float) -> float:
        return tail + float(pk @ _fast_deltas(orders, rest[None, :] + ks[:, None] * run[None, :], eps))

    def exact_delta(eps: float) -> float:
        return tail + sum(
            p * rdp_privacy_accountant.compute_delta(orders, rest + k * run, float(eps))[0] for k, p in zip(ks, pk)
        )

    # the search on the vectorized copy of the formula, then dp-accounting's own compute_delta
    # decides: the returned epsilon is one where dp-accounting's delta is at most ``delta``
    eps = _epsilon_of_delta(fast, delta, hi=1.0)
    while exact and math.isfinite(eps) and exact_delta(eps) > delta:
        eps *= 1 + 1e-6
    return eps


def epsilon_spent(releases, delta: float, *, relation: str | None = None) -> float:
    """The one epsilon a run reports: :func:`epsilon_all_runs` for a ledger whose tuning runs were
    all seen (repeat_and_compose), else :func:`epsilon_bounds` (``relation``: :func:`relation_of`
    the releases)."""
    relation = relation_of(releases, relation)
    if any(getattr(r, "mechanism", None) == "repeat_and_compose" for r in _as_releases(releases)):
        return epsilon_all_runs(releases, delta, relation=relation)
    return epsilon_bounds(releases, delta, relation=relation)[0]


class AllRunsAccountant(_Accountant):
    """The accountant of a tuning ledger whose runs are all seen (:func:`epsilon_spent`)."""

    def epsilon(self, records, delta: float) -> float:
        return epsilon_spent(records, delta, relation=self.relation)


def calibrate_all_runs(
    plan: Sequence[PlannedRelease],
    epsilon: float,
    delta: float,
    mean: float,
    shape: float,
    rtol: float = 1e-4,
    *,
    integer_orders: bool = False,
    relation: str = ADD_REMOVE,
) -> Calibration:
    """Noise multipliers (the share rule z_k = s / sqrt(share_k)) such that every run of the plan,
    K ~ D_{shape, gamma(mean)} runs all seen, spends ``epsilon`` at ``delta``
    (:func:`epsilon_all_runs`: add/remove only, ``relation`` another is refused); within ``rtol``
    below it. Bisection on the scale s."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ConfigError(f"must be a finite positive number, got {epsilon}", field="epsilon")
    if not (0 < delta < 1):
        raise ConfigError(f"must be in (0, 1), got {delta}", field="delta")
    plan = [p for p in plan if p.count > 0]
    if not plan:
        raise ConfigError("the plan has no release to calibrate", field="plan")

    from .records import RepeatAndCompose

    def eps(scale: float, exact: bool = False) -> float:
        return epsilon_all_runs(
            [RepeatAndCompose("tuning", float(mean), float(shape), 0, tuple(_plan_releases(plan, scale)))],
            delta,
            integer_orders=integer_orders,
            exact=exact,
            relation=relation,
        )

    lo, hi, e_hi = _bisect_scale(eps, epsilon, 0.5, 1.0, 2.0, rtol)
    e_hi = eps(hi, exact=True)  # dp-accounting's own conversion decides
    while e_hi > epsilon:
        hi *= 1 + 1e-5
        e_hi = eps(hi, exact=True)
    return Calibration(
        multipliers={r.name: r.noise_std for r in _plan_releases(plan, hi)},
        epsilon=e_hi,
        delta=delta,
        scale=hi,
        integer_orders=integer_orders,
    )
