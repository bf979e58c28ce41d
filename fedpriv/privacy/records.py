"""Ledger records: frozen values, one per kind of release, each with its dp-accounting event
(:meth:`Release.to_event`). The ledger (:mod:`fedpriv.privacy.ledger`) makes them; the
accountants (:mod:`fedpriv.privacy.accounting`) compose them; neither imports the other's
module for them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..errors import PrivacyError


def _self_composed(event, count: int):
    import dp_accounting

    return event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count)


@dataclass(frozen=True)
class Release:
    """One kind of noisy release, released ``count`` times with identical parameters."""

    name: str
    mechanism: str
    sensitivity: float
    noise_std: float
    count: int = 1
    sampling_rate: float | None = None
    dim: int = 0
    groups: int = 1  # the count is spread over this many disjoint user groups (parallel composition)
    pure_epsilon: float | None = None  # pure mechanisms (exponential, laplace, selection): their epsilon
    disjoint: bool = False  # every call under this name concerned new, distinct users: count and groups grow together
    l1_sensitivity: float | None = None  # skellam (distributed noise): the integer L1 sensitivity
    shares: int | None = None  # skellam: the nodes' noise shares summed in the release
    colluders: int | None = None  # skellam: shares not counted in noise_std (nodes that may know theirs)

    @property
    def noise_multiplier(self) -> float:
        return self.noise_std / self.sensitivity

    @property
    def accounted_count(self) -> int:
        """Releases each user took part in: ceil(count / groups)."""
        return -(-int(self.count) // int(self.groups))

    def key(self) -> tuple:
        if self.disjoint:
            # calls on disjoint users under one name merge whatever their sensitivity, noise
            # scale (same epsilon) and size: each user is accounted once, by the pure epsilon
            return (self.name, self.mechanism, self.sampling_rate, self.pure_epsilon, True)
        return (
            self.name,
            self.mechanism,
            self.sensitivity,
            self.noise_std,
            self.sampling_rate,
            self.dim,
            self.groups,
            self.pure_epsilon,
            False,
            self.l1_sensitivity,
            self.shares,
            self.colluders,
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        for optional in ("l1_sensitivity", "shares", "colluders"):
            if d[optional] is None:
                del d[optional]
        d["noise_multiplier"] = self.noise_multiplier
        return d

    def merged(self, other: "Release") -> "Release":
        """This record and ``other`` (same :meth:`key`) as one record."""
        if not self.disjoint:
            return replace(self, count=self.count + other.count)
        # calls on disjoint users: informational fields keep the largest call's values
        big = other if other.sensitivity > self.sensitivity else self
        return replace(
            self,
            count=self.count + other.count,
            groups=self.groups + other.groups,
            sensitivity=big.sensitivity,
            noise_std=big.noise_std,
            dim=max(self.dim, other.dim),
        )

    def to_event(self):
        """The dp-accounting event of this record (dp-accounting is imported here, on use)."""
        import dp_accounting

        if self.mechanism == "exponential":
            # epsilon-bounded range => epsilon^2 / 8 zCDP (Cesar and Rogers 2021, Lemma 3.2)
            return _self_composed(dp_accounting.dp_event.ZCDpEvent(self.pure_epsilon**2 / 8.0), self.accounted_count)
        if self.mechanism == "selection":
            # pure epsilon-DP => epsilon^2 / 2 zCDP (Bun and Steinke 2016, Prop. 1.4)
            return _self_composed(dp_accounting.dp_event.ZCDpEvent(self.pure_epsilon**2 / 2.0), self.accounted_count)
        if self.mechanism == "laplace":
            return _self_composed(dp_accounting.LaplaceDpEvent(self.noise_multiplier), self.accounted_count)
        if self.mechanism == "skellam":
            # distributed Skellam noise (fedpriv.privacy.distributed): (xi, rho)-zCDP, unsampled
            from .distributed import skellam_zcdp

            rho, xi = skellam_zcdp(self.sensitivity, float(self.l1_sensitivity), self.noise_std)
            return _self_composed(dp_accounting.dp_event.ZCDpEvent(rho, xi), self.accounted_count)
        if self.mechanism != "gaussian":
            raise PrivacyError(f"release {self.name!r}: no accountant event for mechanism {self.mechanism!r}")
        event = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sampling_rate is not None and self.sampling_rate < 1:
            event = dp_accounting.PoissonSampledDpEvent(self.sampling_rate, event)
        return _self_composed(event, self.accounted_count)


@dataclass(frozen=True)
class RepeatAndSelect:
    """Private tuning by random stopping (Papernot and Steinke 2022): a run whose releases are
    ``releases`` was repeated a random number of times K ~ D_{shape, gamma(mean)} (``runs`` is
    the K drawn) and only the best run's output was kept. Accounted as dp-accounting's
    ``RepeatAndSelectDpEvent`` over one run's releases: the guarantee is over the random K."""

    name: str
    mean: float
    shape: float
    runs: int
    releases: tuple[Release, ...]
    mechanism: str = "repeat_and_select"
    count: int = 1

    @property
    def sampling_rate(self) -> float | None:
        rates = [r.sampling_rate for r in self.releases if r.sampling_rate not in (None, 1.0)]
        return rates[0] if rates else None

    def key(self) -> tuple:
        return (self.name, self.mechanism, self.mean, self.shape, tuple(r.key() + (r.count,) for r in self.releases))

    def __post_init__(self) -> None:
        object.__setattr__(self, "releases", tuple(self.releases))

    def to_event(self):
        """dp-accounting's RepeatAndSelectDpEvent over one run's releases."""
        import dp_accounting

        inner = dp_accounting.ComposedDpEvent([r.to_event() for r in self.releases])
        return dp_accounting.dp_event.RepeatAndSelectDpEvent(inner, self.mean, self.shape)

    def to_dict(self) -> dict:
        """The record as written to ``ledger.json``: without ``runs`` (K is part of what the
        repeat-and-select guarantee keeps hidden)."""
        return {
            "name": self.name,
            "mechanism": self.mechanism,
            "mean": self.mean,
            "shape": self.shape,
            "count": self.count,
            "releases": [r.to_dict() for r in self.releases],
        }


@dataclass(frozen=True)
class RepeatAndCompose:
    """Private tuning by random stopping whose K runs are all seen (the Flower engines: every node
    receives each run's broadcasts and noised releases). K ~ D_{shape, gamma(mean)} is drawn
    independently of the data and is seen too; every run makes ``releases`` (one calibrated plan).
    Accounted by :func:`fedpriv.privacy.accounting.epsilon_all_runs`: for each k, dp-accounting's
    RDP of the k-fold composition gives delta_k(epsilon); the view's delta is the law of K's
    average of them (conditioning on the seen K), its tail past a public cut added whole. It is
    no single dp-accounting event, so :meth:`to_event` refuses. ``runs`` (K) is never written."""

    name: str
    mean: float
    shape: float
    runs: int
    releases: tuple[Release, ...]
    mechanism: str = "repeat_and_compose"
    count: int = 1

    @property
    def sampling_rate(self) -> float | None:
        rates = [r.sampling_rate for r in self.releases if r.sampling_rate not in (None, 1.0)]
        return rates[0] if rates else None

    def key(self) -> tuple:
        return (self.name, self.mechanism, self.mean, self.shape, tuple(r.key() + (r.count,) for r in self.releases))

    def __post_init__(self) -> None:
        object.__setattr__(self, "releases", tuple(self.releases))

    def to_event(self):
        raise PrivacyError(
            f"record {self.name!r} (repeat_and_compose) is a mixture over the law of K, not one dp-accounting event: "
            "account it with fedpriv.privacy.accounting.epsilon_all_runs"
        )

    def to_dict(self) -> dict:
        """The record as written to ``ledger.json``: without ``runs`` (no output tells K)."""
        return {
            "name": self.name,
            "mechanism": self.mechanism,
            "mean": self.mean,
            "shape": self.shape,
            "count": self.count,
            "releases": [r.to_dict() for r in self.releases],
        }


def records_from_list(items: list[dict]) -> list[Release | RepeatAndSelect]:
    """Records from their ``to_dict`` form (``ledger.json``)."""
    keys = (
        "name",
        "mechanism",
        "sensitivity",
        "noise_std",
        "count",
        "sampling_rate",
        "dim",
        "groups",
        "pure_epsilon",
        "disjoint",
        "l1_sensitivity",
        "shares",
        "colluders",
    )
    out: list[Release | RepeatAndSelect] = []
    for it in items:
        if it.get("mechanism") == "repeat_and_compose":
            out.append(
                RepeatAndCompose(it["name"], it["mean"], it["shape"], 0, tuple(records_from_list(it["releases"])))
            )  # type: ignore[arg-type]
            continue
        if it.get("mechanism") == "repeat_and_select":
            inner = records_from_list(it["releases"])
            out.append(RepeatAndSelect(it["name"], it["mean"], it["shape"], int(it.get("runs", 0)), tuple(inner)))  # type: ignore[arg-type]
        else:
            out.append(Release(**{k: it[k] for k in keys if k in it}))
    return out


@dataclass(frozen=True)
class PlannedRelease:
    """A release the run will make ``count`` times; ``share`` is its relative share of the RDP
    budget (noise multiplier z = scale / sqrt(share))."""

    name: str
    count: int
    share: float
    sampling_rate: float | None = None
