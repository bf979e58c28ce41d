"""Budget planning: split a target (epsilon, delta) across an algorithm's releases, calibrate every
noise multiplier, and report epsilon from RDP and from PLD side by side, plus zCDP rho, before any
training (``fedpriv privacy plan``).

The plan is the algorithm's own release plan (:func:`fedpriv.algorithms.als.plan_releases`: the
shares of user count, mean, counts and of each alternating step), optionally wrapped as one run
of private tuning (:mod:`fedpriv.run.tuning`: a validation-score release is added to every run and
the whole is accounted as dp-accounting's ``RepeatAndSelectDpEvent``). The records it reports are
exactly those a run writes to its ledger (with the real L2 sensitivities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError
from .accounting import (
    ADD_REMOVE,
    REPLACE_INVARIANT,
    REPLACE_ONE,
    Calibration,
    PlannedRelease,
    calibrate,
    PLD_MAX_EPSILON,
    epsilon_pld_second_opinion,
    epsilon_rdp,
    pld_supported,
    zcdp_rho,
)
from .ledger import Release, RepeatAndSelect

SCORE_RELEASE = "valid_score"


@dataclass(frozen=True)
class TuningPlan:
    """Private tuning by random stopping: K ~ D_{shape, gamma(mean)} runs, each a random
    candidate; ``share`` of one run's budget pays for its private validation score."""

    mean: float = 5.0
    shape: float = 1.0
    share: float = 0.05
    score_clip: float = 0.0  # 0: (half the rating range)^2

    def validate(self) -> None:
        from . import tnb

        tnb.check(self.shape, self.mean)
        if not (0 < self.share < 1):
            raise ConfigError(f"must be in (0, 1), got {self.share}", field="tune_share")
        if not (self.score_clip >= 0 and math.isfinite(self.score_clip)):
            raise ConfigError(f"must be a finite number >= 0, got {self.score_clip}", field="tune_score_clip")

    def clip(self, rating_range: tuple[float, float]) -> float:
        return self.score_clip or ((rating_range[1] - rating_range[0]) / 2.0) ** 2


def score_sensitivity(clip: float) -> float:
    """Each user contributes min(own validation loss, clip) to the score release."""
    return float(clip)


@dataclass
class BudgetPlan:
    algorithm: str
    epsilon: float
    delta: float
    planned: list[PlannedRelease]
    sensitivities: dict[str, float]
    calibration: Calibration
    tuning: TuningPlan | None = None
    notes: list[str] = field(default_factory=list)
    one_shot: tuple[str, ...] = ()  # the pre-processing releases (made once, before the steps)

    @property
    def integer_orders(self) -> bool:
        """Calibrated and accounted at integer RDP orders only (secure mode: Skellam noise)."""
        return self.calibration.integer_orders

    @property
    def relation(self) -> str:
        """The neighbouring relation the target holds under (``replace_one`` for a deployment,
        whose enrolled count is public; ``add_remove`` otherwise)."""
        return self.calibration.relation

    @property
    def multipliers(self) -> dict[str, float]:
        return dict(self.calibration.multipliers)

    def run_records(self) -> list[Release]:
        """The ledger records of one run (one training, or one run of the tuning)."""
        out = []
        for p in self.planned:
            z = self.calibration.multipliers[p.name]
            s = self.sensitivities[p.name]
            out.append(Release(p.name, "gaussian", s, z * s, p.count, p.sampling_rate))
        return out

    def records(self) -> list:
        rels = self.run_records()
        if self.tuning is None:
            return rels
        return [RepeatAndSelect("tuning", self.tuning.mean, self.tuning.shape, 0, rels)]

    def rows(self) -> list[dict]:
        total = sum(p.share * p.count for p in self.planned)
        rows = []
        for rel, p in zip(self.run_records(), self.planned):
            rows.append(
                {
                    "release": p.name,
                    "count": p.count,
                    "budget_fraction": p.share * p.count / total,  # of one run's RDP budget
                    "sampling_rate": p.sampling_rate,
                    "sensitivity": rel.sensitivity,
                    "noise_multiplier": rel.noise_multiplier,
                    "noise_std": rel.noise_std,
                    "epsilon_alone": epsilon_rdp(
                        [rel], self.delta, integer_orders=self.integer_orders, relation=self.relation
                    ),
                }
            )
        return rows

    def summary(self) -> dict:
        recs = self.records()
        sampled = any(p.sampling_rate not in (None, 1.0) for p in self.planned)
        rel = self.relation
        rdp = epsilon_rdp(recs, self.delta, integer_orders=self.integer_orders, relation=rel)
        out = {
            "algorithm": self.algorithm,
            "epsilon_target": self.epsilon,
            "delta": self.delta,
            "neighbouring_relation": rel,
            "epsilon_rdp": rdp,
            "epsilon_pld": epsilon_pld_second_opinion(recs, self.delta, rdp, relation=rel),
            "rho_zcdp": None if (sampled or self.tuning is not None) else zcdp_rho(recs, relation=rel),
            "rho_zcdp_one_run": None if sampled else zcdp_rho(self.run_records(), relation=rel),
            "epsilon_one_shot": self.epsilon_one_shot(),
            "tuning": None
            if self.tuning is None
            else {"mean_runs": self.tuning.mean, "shape": self.tuning.shape, "score_share": self.tuning.share},
            "notes": list(self.notes),
        }
        return out

    def epsilon_one_shot(self) -> float | None:
        """RDP epsilon of the pre-processing releases alone (one run), or None without any."""
        rels = [r for r in self.run_records() if r.name in self.one_shot]
        return (
            epsilon_rdp(rels, self.delta, integer_orders=self.integer_orders, relation=self.relation) if rels else None
        )

    def to_dict(self) -> dict:
        return {**self.summary(), "releases": self.rows()}

    def to_markdown(self) -> str:
        s = self.summary()
        fmt = lambda x: "-" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x))  # noqa: E731
        lines = [
            f"# privacy plan: {self.algorithm}, target epsilon {fmt(self.epsilon)}, delta {self.delta:g}",
            "",
            f"Neighbouring relation: {RELATION_TEXT[self.relation]}.",
            "",
            "| release | count | budget fraction | sampling rate | L2 sensitivity | noise multiplier | noise std | "
            "epsilon alone (RDP) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rows():
            lines.append(
                f"| {r['release']} | {r['count']} | {r['budget_fraction']:.4f} | {fmt(r['sampling_rate'])} | "
                f"{fmt(r['sensitivity'])} | "
                f"{fmt(r['noise_multiplier'])} | {fmt(r['noise_std'])} | {fmt(r['epsilon_alone'])} |"
            )
        pld = (
            fmt(s["epsilon_pld"])
            if s["epsilon_pld"] is not None
            else _no_pld(self.records(), s["epsilon_rdp"], self.relation)
        )
        lines += [
            "",
            "| accountant | value |",
            "|---|---|",
            f"| epsilon (RDP, dp-accounting{', integer orders' if self.integer_orders else ''}) | "
            f"{fmt(s['epsilon_rdp'])} |",
            f"| epsilon (PLD, dp-accounting) | {pld} |",
            f"| zCDP rho | "
            f"{fmt(s['rho_zcdp']) if s['rho_zcdp'] is not None else 'not defined (sampled releases or tuning)'} |",
        ]
        if s["epsilon_one_shot"] is not None:
            lines.append(
                f"| epsilon of the one-shot releases alone "
                f"({', '.join(r for r in self.one_shot if r in {p.name for p in self.planned})}) | "
                f"{fmt(s['epsilon_one_shot'])} ({s['epsilon_one_shot'] / self.epsilon:.1%} of the target) |"
            )
        if self.tuning is not None:
            lines.append(
                f"| tuning | random stopping, E[K] = {self.tuning.mean:g}, shape {self.tuning.shape:g}; rho of one run "
                f"{fmt(s['rho_zcdp_one_run'])} |"
            )
        for n in self.notes:
            lines.append(f"\n{n}")
        return "\n".join(lines) + "\n"


def calibrated_plan(
    algorithm: str,
    planned: list[PlannedRelease],
    sensitivities: dict[str, float],
    epsilon: float,
    delta: float,
    *,
    rating_range: tuple[float, float] = (1.0, 5.0),
    tuning: TuningPlan | None = None,
    integer_orders: bool = False,
    relation: str = ADD_REMOVE,
) -> BudgetPlan:
    """Calibrate a release plan (the algorithm's releases and their L2 sensitivities, from the
    algorithm layer: :func:`fedpriv.algorithms.plans.budget_plan`) to (epsilon, delta);
    ``integer_orders``: at integer RDP orders only (secure mode, see :func:`calibrate`);
    ``relation``: the neighbouring relation of the target (default add/remove; ``fedpriv privacy
    plan --deployment`` plans under replace-one, as ``fedpriv deploy run`` calibrates)."""
    if not planned:
        raise ConfigError(f"algorithm {algorithm!r} is not private: it has no releases to plan", field="algorithm")
    sens = dict(sensitivities)
    repeat = None
    if tuning is not None:
        tuning.validate()
        planned = [PlannedRelease(p.name, p.count, p.share * (1 - tuning.share), p.sampling_rate) for p in planned]
        planned.append(
            PlannedRelease(
                SCORE_RELEASE, 1, tuning.share * sum(p.share * p.count for p in planned) / (1 - tuning.share)
            )
        )
        sens[SCORE_RELEASE] = score_sensitivity(tuning.clip(rating_range))
        repeat = (tuning.mean, tuning.shape)
    cal = calibrate(planned, epsilon, delta, repeat=repeat, integer_orders=integer_orders, relation=relation)
    notes = []
    if cal.relation == REPLACE_ONE:
        free = [p.name for p in planned if p.name in REPLACE_INVARIANT]
        notes.append(
            "Replace-one (a deployment: public/meta.json publishes the exact number of enrolled users, so adding or "
            "removing a user is "
            "not hidden; one user's data replaced by anybody's is): every release moves by at most twice its "
            "add/remove "
            "sensitivity (the sensitivities above are the add/remove ones the ledger records), Poisson-sampled "
            "releases are "
            "accounted unsampled (dp-accounting's RDP accountant has no sampled event under replace-one)"
            + (f", and the released user count ({', '.join(free)}) costs nothing (it cannot move)" if free else "")
            + ". The epsilon above holds under replace-one, as `fedpriv deploy run` reports it."
        )
    if tuning is not None:
        notes.append(
            "PLD accounting does not cover repeat-and-select: epsilon is from RDP (Papernot and Steinke 2022, Theorem "
            "2, in dp-accounting)."
        )
    return BudgetPlan(algorithm, epsilon, delta, planned, sens, cal, tuning, notes)


RELATION_TEXT = {
    ADD_REMOVE: "add/remove one user (the user count is not published exactly)",
    REPLACE_ONE: "replace one user's data (the enrolled count is public, as in a deployment)",
}


def _no_pld(records, epsilon_rdp: float, relation: str = ADD_REMOVE) -> str:
    """Why a plan's table shows no PLD epsilon."""
    if not pld_supported(records, relation):
        return "not supported for this plan"
    return f"not computed above epsilon {PLD_MAX_EPSILON:g} (bounded time and memory)"


class AllRunsBudgetPlan(BudgetPlan):
    """A tuned plan whose K runs are all seen (the Flower engines): its record is one
    ``repeat_and_compose`` (:func:`fedpriv.privacy.accounting.epsilon_all_runs`)."""

    def records(self) -> list:
        from .records import RepeatAndCompose

        return [RepeatAndCompose("tuning", self.tuning.mean, self.tuning.shape, 0, tuple(self.run_records()))]

    def summary(self) -> dict:
        from .accounting import epsilon_all_runs

        recs = self.records()
        return {
            "algorithm": self.algorithm,
            "epsilon_target": self.epsilon,
            "delta": self.delta,
            "epsilon_rdp": epsilon_all_runs(
                recs, self.delta, integer_orders=self.integer_orders, relation=self.relation
            ),
            "epsilon_pld": None,
            "rho_zcdp": None,
            "rho_zcdp_one_run": None
            if any(p.sampling_rate not in (None, 1.0) for p in self.planned)
            else zcdp_rho(self.run_records()),
            "epsilon_one_shot": self.epsilon_one_shot(),
            "tuning": {
                "mean_runs": self.tuning.mean,
                "shape": self.tuning.shape,
                "score_share": self.tuning.share,
                "view": "all runs",
            },
            "notes": list(self.notes),
        }


def all_runs_plan(plan: BudgetPlan) -> AllRunsBudgetPlan:
    """``plan`` (a tuned plan, :func:`calibrated_plan` with ``tuning``) recalibrated for a tuning
    whose K runs are all seen, K included: the composition of every run, over the public law of
    K, spends the target (:func:`fedpriv.privacy.accounting.calibrate_all_runs`)."""
    from .accounting import calibrate_all_runs

    if plan.tuning is None:
        raise ConfigError("an all-runs plan is a tuned plan: give tuning", field="tune")
    cal = calibrate_all_runs(
        plan.planned,
        plan.epsilon,
        plan.delta,
        plan.tuning.mean,
        plan.tuning.shape,
        integer_orders=plan.integer_orders,
        relation=plan.relation,
    )
    notes = [
        "Tuning seen by the nodes: every run and K are seen, so epsilon is that of the k-fold composition of one run, "
        "its delta averaged over the public law of K (dp-accounting's RDP per k; the tail past a public cut added to "
        "delta)."
    ]
    return AllRunsBudgetPlan(
        plan.algorithm,
        plan.epsilon,
        plan.delta,
        list(plan.planned),
        dict(plan.sensitivities),
        cal,
        plan.tuning,
        notes,
        plan.one_shot,
    )


def all_runs_plan_of(plan: BudgetPlan, tuning: TuningPlan, rating_range: tuple[float, float]) -> AllRunsBudgetPlan:
    """The all-runs plan (:func:`all_runs_plan`) built from an untuned plan of the same
    algorithm and config: the score release added as :func:`calibrated_plan` adds it, without
    calibrating the repeat-and-select plan first (its RDP is slow to compute)."""
    from .accounting import calibrate_all_runs

    tuning.validate()
    planned = [PlannedRelease(p.name, p.count, p.share * (1 - tuning.share), p.sampling_rate) for p in plan.planned]
    planned.append(
        PlannedRelease(SCORE_RELEASE, 1, tuning.share * sum(p.share * p.count for p in planned) / (1 - tuning.share))
    )
    sens = {**plan.sensitivities, SCORE_RELEASE: score_sensitivity(tuning.clip(rating_range))}
    cal = calibrate_all_runs(
        planned,
        plan.epsilon,
        plan.delta,
        tuning.mean,
        tuning.shape,
        integer_orders=plan.integer_orders,
        relation=plan.relation,
    )
    notes = [
        "Tuning seen by the nodes: every run and K are seen, so epsilon is that of the k-fold composition of one run, "
        "its delta averaged over the public law of K (dp-accounting's RDP per k; the tail past a public cut added to "
        "delta)."
    ]
    return AllRunsBudgetPlan(plan.algorithm, plan.epsilon, plan.delta, planned, sens, cal, tuning, notes, plan.one_shot)
