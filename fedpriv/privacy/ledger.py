"""The privacy ledger: the one place in fedpriv where noise is drawn.

Every noisy release goes through a method of :class:`PrivacyLedger` (``gaussian``, ``laplace``,
``exponential``, ``select`` for private selection, ``repetitions`` for private tuning), which
draws the noise from the ledger's own generator and records the release (mechanism,
sensitivity, noise scale, sampling rate, dimension, how many times) before returning the
noised value. The
accountant (:mod:`fedpriv.privacy.accounting`) computes (epsilon, delta) from these records
alone. Algorithms never call a random normal generator for noise themselves; data-independent
Gaussian draws (e.g. a random initialisation) go through :func:`public_gaussian` so that a test
can tell the two apart.

A ledger may carry a budget: a release that would take the accounted epsilon past it raises
:class:`~fedpriv.errors.PrivacyError` *before* any noise is drawn or value returned.
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..util.draws import _sanctioned, drawing_context, public_draws, public_gaussian  # noqa: F401 - re-exported
from ..errors import PrivacyError
from ..util.threads import map_chunks
from . import selection as mech
from .records import Release, RepeatAndSelect, records_from_list
from .sampling import lattice_gaussian
from .target import ADD_REMOVE, check_relation
from .symmetric import from_upper, upper


def _secure_uniform(n: int) -> np.ndarray:
    """n uniforms in (0, 1] with 53 random bits each, from the operating system's CSPRNG."""
    bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
    return (bits.astype(np.float64) + 1.0) * (1.0 / 9007199254740992.0)


def secure_standard_normal(shape) -> np.ndarray:
    """Standard Gaussians from ``os.urandom`` by the Box-Muller transform (large draws are split
    over the kernels' threads: ``os.urandom`` and numpy's ufuncs release the GIL). No longer
    the ledger's release noise (floating point: open to the low-bit attacks that
    :mod:`fedpriv.privacy.sampling` closes); kept as the floating-point baseline of
    ``tests/test_float_noise.py`` and ``benchmarks/noise_cost.py``."""
    n = int(np.prod(shape, dtype=np.int64))
    m = (n + 1) // 2
    out = np.empty(2 * m, dtype=np.float64)

    def part(s: slice) -> None:
        r = np.sqrt(-2.0 * np.log(_secure_uniform(s.stop - s.start)))
        t = 2.0 * np.pi * _secure_uniform(s.stop - s.start)
        out[s] = r * np.cos(t)
        out[m + s.start : m + s.stop] = r * np.sin(t)

    map_chunks(part, m, min_chunk=1 << 16)
    return out[:n].reshape(shape)


def _positive(name: str, what: str, value: float) -> None:
    """Refuse a release whose ``what`` (sensitivity, epsilon, ...) is not finite and > 0."""
    if not (math.isfinite(value) and value > 0):
        raise PrivacyError(f"release {name!r}: {what} must be finite and > 0, got {value}")


def _array(value):
    """``value`` as an array: a :class:`fedpriv.util.device.DeviceArray` (sums made on a device)
    as it is, with no copy to the host; anything else through ``np.asarray``."""
    from ..util.device import DeviceArray

    return value if isinstance(value, DeviceArray) else np.asarray(value)


def _all_finite(value: np.ndarray) -> bool:
    """Whether every entry of ``value`` is finite: checked on the device where the value has a
    kept device copy there (:func:`fedpriv.util.device.kept`: sums made on the device)."""
    from ..util import device

    dev = device.torch_device()
    if dev is not None:
        t = device.kept(value, dev)
        if t is not None:
            return bool(device.torch_device_module().isfinite(t).all())
    return bool(np.all(np.isfinite(value)))


@dataclass
class PrivacyLedger:
    """Draws the noise of every release and records it.

    By default (``seed=None``) every noise value comes from the operating system's
    cryptographically secure generator (``os.urandom``): nobody can regenerate it, from a seed
    or from earlier draws. ``seed=N`` asks for reproducible noise from ``PCG64(N)``: its privacy
    holds only against those who do not know N (engine-agreement tests,
    :class:`fedpriv.privacy.randomness.RunSecrets` with a noise seed); the seed is never written
    out (``repr`` hides it, records do not hold it). ``secure=True`` forces the OS generator even
    when a seed is given. Gaussian releases are floating-point safe in both modes: the value is
    rounded to a power-of-two lattice and exact discrete Gaussian noise is added in integers
    (:mod:`fedpriv.privacy.sampling`; the floating-point attacks of Mironov 2012 and Jin et al.
    2022 find nothing in the low bits). Laplace, exponential and selection noise are still
    sampled in floating point.
    ``budget``: optional (epsilon, delta); a release that would take ``accountant``'s epsilon
    of the records past it is refused before anything is drawn. The accountant is an object
    with ``epsilon(records, delta)`` (:mod:`fedpriv.privacy.accounting`: RDP, PLD, pure,
    best-of), given by the caller: the ledger imports no accounting.
    ``relation``: the neighbouring relation of the run (:mod:`fedpriv.privacy.target`;
    ``replace_one`` for a deployment). The records keep their add/remove sensitivities; the
    relation travels with the ledger, so that every epsilon read from it (its budget check, the
    run's ``metrics.json``, the noise-aware rule) holds under it. An accountant made without a
    relation is bound to the ledger's; one made with another relation is refused.
    """

    seed: int | None = field(default=None, repr=False)
    secure: bool = False
    budget: tuple[float, float] | None = None
    releases: list[Release | RepeatAndSelect] = field(default_factory=list)
    accountant: object = field(default=None, repr=False)
    relation: str = ADD_REMOVE

    def __post_init__(self) -> None:
        if self.budget is not None and self.accountant is None:
            raise PrivacyError(
                "a ledger with a budget needs an accountant (fedpriv.privacy.accounting.BestOfAccountant(), ...)"
            )
        check_relation(self.relation, field="relation")
        self._bind_accountant()
        if self.secure or self.seed is None:
            self.secure, self.seed, self._rng = True, None, None
        else:
            self._rng = np.random.Generator(np.random.PCG64(self.seed))

    def _bind_accountant(self) -> None:
        """The accountant accounts under the ledger's relation: one made without a relation (None)
        is bound to it (a copy: the caller's object is left as it is); an accountant of another
        relation is refused, and so is one that states none for a ledger that is not add/remove."""
        acc = self.accountant
        if acc is None:
            return
        if not hasattr(acc, "relation"):
            if self.relation != ADD_REMOVE:
                raise PrivacyError(
                    f"a {self.relation} ledger needs an accountant that accounts under it (a `relation` attribute)"
                )
            return
        if acc.relation is None:
            acc = copy.copy(acc)
            acc.relation = self.relation
            self.accountant = acc
        elif acc.relation != self.relation:
            raise PrivacyError(f"the ledger accounts under {self.relation!r}, its accountant under {acc.relation!r}")

    def __getstate__(self) -> dict:
        """A copy or pickle of the ledger leaves its device generators behind: it keys its own on
        its first device draw (two ledgers never continue one stream of secret noise)."""
        state = dict(self.__dict__)
        state.pop("_device_bits", None)
        return state

    @property
    def reproducible(self) -> bool:
        """True when the noise comes from a seed (anyone holding it can regenerate the noise)."""
        return self._rng is not None

    # ------------------------------------------------------------------ recording
    @staticmethod
    def _with(records: list, rel: Release | RepeatAndSelect) -> list:
        """``records`` with ``rel`` recorded: merged into the record of the same key, or added."""
        out = list(records)
        if isinstance(rel, Release):
            for i, r in enumerate(out):
                if isinstance(r, Release) and r.key() == rel.key():
                    out[i] = r.merged(rel)
                    return out
        out.append(rel)
        return out

    def _record(self, rel: Release | RepeatAndSelect) -> None:
        self.releases[:] = self._with(self.releases, rel)

    def merge(self, records) -> None:
        """Record releases made elsewhere (e.g. the clients' private selections of a
        recommendation), after the same budget check as a release of this ledger: all of them
        or none."""
        records = list(records)
        after = list(self.releases)
        for rel in records:
            if not isinstance(rel, (Release, RepeatAndSelect)):
                raise PrivacyError(f"not a ledger record: {rel!r}")
            after = self._with(after, rel)
        self._check_total(after, records[-1].name if records else "merge")
        self.releases[:] = after

    def state_dict(self) -> dict:
        """The records, the relation and the generator's state (a checkpoint of this ledger)."""
        return {
            "records": self.to_list(),
            "budget": self.budget,
            "relation": self.relation,
            "rng": None if self._rng is None else self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (a reproducible ledger continues its stream; the state of a
        ledger under another relation is refused)."""
        relation = state.get("relation", ADD_REMOVE)
        if relation != self.relation:
            raise PrivacyError(f"a ledger state under {relation!r} cannot be loaded into a {self.relation!r} ledger")
        self.releases[:] = records_from_list(state["records"])
        self.budget = tuple(state["budget"]) if state.get("budget") is not None else None
        if state.get("rng") is not None:
            if self._rng is None:
                raise PrivacyError("a seeded ledger's state cannot be loaded into a ledger that draws from the OS")
            self._rng.bit_generator.state = state["rng"]

    def _check_budget(self, rel: Release | RepeatAndSelect) -> None:
        if self.budget is not None:
            self._check_total(self._with(self.releases, rel), rel.name)

    def _check_total(self, records: list, name: str) -> None:
        if self.budget is None:
            return
        eps_budget, delta = self.budget
        eps = self.accountant.epsilon(records, delta)
        if eps > eps_budget * (1 + 1e-3):
            raise PrivacyError(
                f"release {name!r} would bring epsilon to {eps:.4f} > budget {eps_budget:.4f} "
                f"(delta={delta:g}); nothing was released"
            )

    # ------------------------------------------------------------------ mechanisms
    def gaussian(
        self,
        name: str,
        value: np.ndarray,
        *,
        sensitivity: float,
        noise_multiplier: float,
        symmetric: bool = False,
        sampling_rate: float | None = None,
        groups: int = 1,
    ) -> np.ndarray:
        """Release ``value + N(0, (noise_multiplier * sensitivity)^2)`` and record it.

        ``sensitivity`` is the L2 sensitivity of ``value`` to one user (add/remove). With
        ``symmetric=True`` the last two axes are square symmetric matrices: noise is drawn for
        the upper triangle (diagonal included) and mirrored, so the sensitivity must be the one
        of the upper-triangle vector (at most the Frobenius norm of one user's contribution).
        ``sampling_rate`` marks a release over a Poisson sample of users with that rate.
        ``groups=G`` marks a release made once per disjoint group of users, G groups in turn (each
        user contributes to one of every G such releases): accounted as ceil(count / G) releases.
        """
        value = _array(value)
        _positive(name, "sensitivity", sensitivity)
        _positive(name, "noise multiplier", noise_multiplier)
        if sampling_rate is not None and not (0 < sampling_rate <= 1):
            raise PrivacyError(f"release {name!r}: sampling rate must be in (0, 1], got {sampling_rate}")
        if not _all_finite(value):
            raise PrivacyError(f"release {name!r}: the value to release has non-finite entries")
        std = float(noise_multiplier * sensitivity)
        if symmetric:
            if value.ndim < 2 or value.shape[-1] != value.shape[-2]:
                raise PrivacyError(f"release {name!r}: symmetric release needs square last axes, got {value.shape}")
            d = value.shape[-1]
            dim = int(np.prod(value.shape[:-2], dtype=np.int64)) * d * (d + 1) // 2
        else:
            dim = int(value.size)
        if not (int(groups) == groups and groups >= 1):
            raise PrivacyError(f"release {name!r}: groups must be an integer >= 1, got {groups}")
        rel = Release(name, "gaussian", float(sensitivity), std, 1, sampling_rate, dim, int(groups))
        self._check_budget(rel)
        with _sanctioned(f"ledger:{name}"):
            noised = self._noised(value, float(sensitivity), float(noise_multiplier), symmetric)
        self._record(rel)
        return noised.astype(value.dtype if value.dtype.kind == "f" else np.float64, copy=False)

    def skellam_round(self, plan, unmask, contributors: int, groups: int = 1) -> dict[str, np.ndarray]:
        """Record the releases of a secure round whose noise the nodes added (distributed
        Skellam shares, :mod:`fedpriv.privacy.distributed`). The contributors and the budget are
        checked first (all parts of the round, or none); then ``unmask()`` reveals the noised
        sums, {part name: values} (it may refuse, e.g. a wrap-around: then nothing is recorded);
        then every part is recorded with the noise guaranteed by ``contributors`` shares when
        ``plan.colluders`` of them may be known (:func:`fedpriv.privacy.distributed.released_std`). ``groups``: as for
        :meth:`gaussian` (a round over one of G disjoint groups of users)."""
        from .distributed import released_std

        plan.check_contributors(contributors)
        rels = [
            Release(
                p.name,
                "skellam",
                float(p.delta2),
                released_std(plan, p, contributors),
                1,
                None,
                int(p.length),
                int(groups),
                l1_sensitivity=float(p.delta1),
                shares=int(contributors),
                colluders=int(plan.colluders),
            )
            for p in plan.parts
        ]
        after = list(self.releases)
        for rel in rels:
            after = self._with(after, rel)
        self._check_total(after, ", ".join(r.name for r in rels))
        values = unmask()
        self.releases[:] = after
        return values

    def exponential(
        self,
        name: str,
        scores: np.ndarray,
        *,
        epsilon: float,
        sensitivity: float,
        monotone: bool = False,
        disjoint: bool = False,
    ) -> int:
        """Exponential mechanism: return index i with probability proportional to
        exp(-epsilon * scores[i] / (c * sensitivity)) (lower scores are better), c = 1 when the
        scores are ``monotone`` (adding a user never decreases any score, removing one never
        increases any: every per-user term is in [0, sensitivity]) and c = 2 otherwise. It is
        pure epsilon-DP (McSherry and Talwar 2007) and epsilon-bounded-range, hence
        epsilon^2/8-zCDP (Cesar and Rogers 2021, Lemma 3.2), which is what the accountant
        composes. Sampled by the Gumbel-max trick from the ledger's generator. ``disjoint=True``
        declares that every call under this name concerns new, distinct users (e.g. disjoint
        windows of observations): each user is then accounted once for the name.
        """
        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim != 1 or len(scores) == 0:
            raise PrivacyError(f"release {name!r}: scores must be a non-empty vector, got shape {scores.shape}")
        if not np.all(np.isfinite(scores)):
            raise PrivacyError(f"release {name!r}: the scores have non-finite entries")
        _positive(name, "sensitivity", sensitivity)
        _positive(name, "epsilon", epsilon)
        scale = (1.0 if monotone else 2.0) * float(sensitivity) / float(epsilon)
        rel = Release(
            name, "exponential", float(sensitivity), scale, 1, None, int(len(scores)), 1, float(epsilon), bool(disjoint)
        )
        self._check_budget(rel)
        with _sanctioned(f"ledger:{name}"):
            u = self._rng.random(len(scores)) if self._rng is not None else _secure_uniform(len(scores))
        gumbel = -np.log(-np.log(np.clip(u, 1e-300, 1.0 - 1e-16)))
        self._record(rel)
        return int(np.argmax(-scores / scale + gumbel))

    def laplace(
        self, name: str, value: np.ndarray, *, sensitivity: float, epsilon: float, disjoint: bool = False
    ) -> np.ndarray:
        """Release ``value + Laplace(sensitivity / epsilon)`` per entry: pure epsilon-DP when
        ``sensitivity`` is the L1 sensitivity of ``value`` to one user. ``disjoint=True``
        declares that every call under this name concerns new, distinct users (e.g. the nodes of
        one level of a counting tree cover disjoint time intervals): each user is accounted once
        for the name."""
        value = np.asarray(value, dtype=np.float64)
        _positive(name, "sensitivity", sensitivity)
        _positive(name, "epsilon", epsilon)
        if not np.all(np.isfinite(value)):
            raise PrivacyError(f"release {name!r}: the value to release has non-finite entries")
        scale = float(sensitivity) / float(epsilon)
        rel = Release(
            name, "laplace", float(sensitivity), scale, 1, None, int(value.size), 1, float(epsilon), bool(disjoint)
        )
        self._check_budget(rel)
        with _sanctioned(f"ledger:{name}"):
            if self._rng is not None:
                noise = self._rng.laplace(0.0, scale, size=value.shape)
            else:  # inverse CDF of two secure uniforms' difference of exponentials
                noise = scale * (np.log(_secure_uniform(value.size)) - np.log(_secure_uniform(value.size))).reshape(
                    value.shape
                )
        self._record(rel)
        return value + noise

    def select(
        self, name: str, mechanism: str, scores: np.ndarray, sensitivities: np.ndarray, *, epsilon: float, **params
    ) -> np.ndarray:
        """Private selection (:mod:`fedpriv.privacy.selection`): one candidate index per row of
        ``scores`` (n users x k candidates), each row a *different user's own* scores with
        per-candidate sensitivities ``sensitivities`` ((k,) or (n, k)). Every private mechanism
        there is pure ``epsilon``-DP for the user of its row (local DP of the report), so the
        release is recorded once per user (parallel composition over the rows). Repeated calls
        under one name are declared to concern new, distinct users; select again for the same
        users under another name. The non-private reference ``rnmh`` is refused."""
        if mechanism not in mech.PRIVATE:
            raise PrivacyError(
                f"release {name!r}: {mechanism!r} is not a private selection mechanism (private: "
                f"{', '.join(mech.PRIVATE)})"
            )
        _positive(name, "epsilon", epsilon)
        q = np.asarray(scores, dtype=np.float64)
        n = 1 if q.ndim == 1 else int(q.shape[0])
        k = int(q.shape[-1]) if q.ndim >= 1 else 0
        sens = np.asarray(sensitivities, dtype=np.float64)
        smax = float(np.max(sens)) if sens.size else float("nan")
        if not (math.isfinite(smax) and smax > 0):
            raise PrivacyError(f"release {name!r}: sensitivities must be finite and > 0")
        rel = Release(name, "selection", smax, 2.0 * smax / float(epsilon), n, None, k, n, float(epsilon), True)
        self._check_budget(rel)
        # secure ledgers: a generator freshly seeded with 128 bits from the OS for this call
        rng = (
            self._rng
            if self._rng is not None
            else np.random.Generator(np.random.PCG64(int.from_bytes(os.urandom(16), "little")))
        )
        with _sanctioned(f"ledger:{name}"):
            out = mech.select(mechanism, q, sens, float(epsilon), rng, **params)
        self._record(rel)
        return out

    # ------------------------------------------------------------------ private tuning
    def repetitions(self, name: str, *, shape: float, mean: float) -> int:
        """Draw the number of runs K of private tuning from the ledger's generator (the secure
        one with ``secure=True``); :meth:`repeat_and_select` then records the tuning."""
        from . import tnb

        tnb.check(shape, mean)
        with _sanctioned(f"ledger:{name}"):
            if self._rng is not None:
                return tnb.sample(self._rng, shape, mean)
            return tnb.sample(
                np.random.Generator(np.random.PCG64(int.from_bytes(os.urandom(16), "little"))), shape, mean
            )

    def repeat_and_select(
        self, name: str, runs: list["PrivacyLedger"], *, shape: float, mean: float
    ) -> RepeatAndSelect:
        """Record tuning whose runs used the ledgers ``runs`` (one per run, all with the same
        releases: every candidate shares one calibrated plan). Refused, before anything is
        recorded, if the runs differ or if the budget would be exceeded."""
        if not runs:
            raise PrivacyError(f"release {name!r}: tuning needs at least one run")

        def accounted(led: "PrivacyLedger") -> list:
            # what the accountant reads (dims and sensitivities may differ between candidates)
            return sorted(
                (r.name, r.mechanism, round(r.noise_multiplier, 12), r.sampling_rate, r.accounted_count)
                for r in led.releases
            )

        first = accounted(runs[0])
        for i, led in enumerate(runs[1:], start=1):
            if accounted(led) != first:
                raise PrivacyError(
                    f"release {name!r}: run {i} made other releases than run 0; tuning needs one plan for every "
                    f"candidate"
                )
        if any(isinstance(r, RepeatAndSelect) for r in runs[0].releases):
            raise PrivacyError(f"release {name!r}: nested tuning is not supported")
        rec = RepeatAndSelect(name, float(mean), float(shape), len(runs), tuple(runs[0].releases))
        self._check_budget(rec)
        self.releases.append(rec)
        return rec

    def repeat_and_compose(self, name: str, runs: list["PrivacyLedger"], *, shape: float, mean: float):
        """Record tuning whose K runs (the ledgers ``runs``, one plan for every candidate) are all
        seen, K included (the Flower engines: every node receives each run's releases):
        a ``repeat_and_compose`` record, accounted by
        :func:`fedpriv.privacy.accounting.epsilon_all_runs` (this ledger's accountant must be
        :class:`~fedpriv.privacy.accounting.AllRunsAccountant`). Refused, before anything is
        recorded, if the runs differ or if the budget would be exceeded."""
        from .records import RepeatAndCompose

        if not runs:
            raise PrivacyError(f"release {name!r}: tuning needs at least one run")
        def accounted(led):
            return sorted(
                (r.name, r.mechanism, round(r.noise_multiplier, 12), r.sampling_rate, r.accounted_count)
                for r in led.releases
            )

        first = accounted(runs[0])
        for i, led in enumerate(runs[1:], start=1):
            if accounted(led) != first:
                raise PrivacyError(
                    f"release {name!r}: run {i} made other releases than run 0; tuning needs one plan for every "
                    f"candidate"
                )
        if any(not isinstance(r, Release) for r in runs[0].releases):
            raise PrivacyError(f"release {name!r}: nested tuning is not supported")
        rec = RepeatAndCompose(name, float(mean), float(shape), len(runs), tuple(runs[0].releases))
        self._check_budget(rec)
        self.releases.append(rec)
        return rec

    def _noised(self, value: np.ndarray, sensitivity: float, noise_multiplier: float, symmetric: bool) -> np.ndarray:
        """``value`` plus Gaussian noise of std ``noise_multiplier * sensitivity`` (at least),
        floating-point safe: the lattice discrete Gaussian of :func:`fedpriv.privacy.sampling.lattice_gaussian`
        from this ledger's generator (reproducible) or the OS's. Symmetric releases noise the
        upper triangles and mirror the released triangles (post-processing)."""
        bits = self._bits_for_device()
        if bits is not None:  # a value on the device (a DeviceArray) is noised there and stays there
            from .device_sampling import release

            return release(value, sensitivity, noise_multiplier, symmetric, bits)
        value = np.asarray(value, dtype=np.float64)
        if symmetric:
            return from_upper(lattice_gaussian(upper(value), sensitivity, noise_multiplier, self._rng), value.shape[-1])
        return lattice_gaussian(value, sensitivity, noise_multiplier, self._rng)

    def _bits_for_device(self):
        """On a torch device (:func:`fedpriv.util.device.use`) and without a seed: this ledger's
        random bits there (:class:`fedpriv.privacy.device_sampling.DeviceBits`, keyed with OS
        entropy on its first draw on that device); None otherwise: the CPU path, which a seeded
        ledger always takes, so its noise is the same on every device."""
        from ..util import device

        dev = device.torch_device()
        if dev is None or self._rng is not None:
            return None
        bits = self.__dict__.get("_device_bits")
        if bits is None or bits.dev != dev:
            from .device_sampling import DeviceBits

            bits = self.__dict__["_device_bits"] = DeviceBits(device.torch_device_module(), dev)
        return bits

    # ------------------------------------------------------------------ output
    def to_list(self) -> list[dict]:
        return [r.to_dict() for r in self.releases]

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_list(), indent=2) + "\n")

    @staticmethod
    def releases_from_list(items: list[dict]) -> list[Release | RepeatAndSelect]:
        """Records from ``ledger.json`` (:func:`fedpriv.privacy.records.records_from_list`)."""
        return records_from_list(items)
