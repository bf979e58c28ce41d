"""Private hyperparameter tuning by random stopping (Papernot and Steinke 2022).

Trying candidates of mu, lambda, d or a clipping norm and keeping the best costs privacy. Here:

1. the number of runs K is drawn by the ledger from the truncated negative binomial
   D_{shape, gamma(mean)} (:mod:`fedpriv.privacy.tnb`; shape 1 geometric, 0 logarithmic);
2. each run trains one candidate drawn uniformly from the grid (a public draw) with noise
   multipliers calibrated once for the whole tuning, then releases a private validation score:
   every user with validation ratings contributes min(own mean squared error, clip), summed and
   noised through the run's ledger (L2 sensitivity clip). The validation users are the same in
   every run, so the sum ranks the runs as their mean would, without a noisy denominator;
3. the run with the lowest noised score is kept; only its model, its metrics and its noised
   score are reported. K, the other runs and their scores stay inside this function: the
   accounted event (repeat-and-select) covers releasing the best run only, with K hidden.

The whole is one ``repeat_and_select`` ledger record, accounted by dp-accounting's RDP
accountant (``RepeatAndSelectDpEvent``); calibration targets its epsilon. Every candidate must
make the same releases (same plan: keys such as ``steps`` or the budget shares cannot be tuned),
otherwise one calibration would not cover them all; the grid is checked before anything runs.
"""

from __future__ import annotations

import numpy as np

from typing import Callable

from ..algorithms import als, registry
from ..algorithms.plans import budget_plan
from ..engine.inprocess import tuning_candidate
from ..errors import ConfigError
from ..privacy.accounting import ADD_REMOVE, AllRunsAccountant, BestOfAccountant
from ..privacy.ledger import PrivacyLedger, public_draws
from ..privacy.plan import SCORE_RELEASE, BudgetPlan, TuningPlan, all_runs_plan_of, score_sensitivity
from ..privacy.randomness import RunSecrets

#: what a tuning's accounting covers (``tune`` ``view``), as ``metrics.json`` states it
VIEWS = {
    "selected": "the selected run only, K hidden (repeat_and_select): every run stays inside the one process that "
                "selects",
    "all": "every run and K, as a Flower node sees them (repeat_and_compose: each k-fold composition, averaged over "
           "the public law of K)",
}


def view_of(option: str, others_see_every_run: bool) -> str:
    """The view a tuning is accounted for (``tune_view``): ``auto`` is ``selected`` where only this
    process sees the runs (in process) and ``all`` where other parties see every run (the Flower
    engines' nodes); ``selected`` is refused there."""
    if option not in ("auto", *VIEWS):
        raise ConfigError(f"must be auto, {' or '.join(VIEWS)}, got {option!r}", field="tune_view")
    if others_see_every_run:
        if option == "selected":
            raise ConfigError(
                "on the Flower engines every node sees every run of the tuning: its epsilon must cover them all "
                "(tune_view=all)",
                field="tune_view",
            )
        return "all"
    return "selected" if option == "auto" else option


PLAN_KEYS = (
    "steps",
    "share_users",
    "share_mean",
    "share_counts",
    "share_b",
    "share_gravity",
    "gravity",
    "ssp_resamples",
    "ssp_steps",
    "sgd_sampling_rate",
)


def parse_grid(text: str) -> dict[str, list[str]]:
    """``"mu=0/0.25/0.5;reg_user=0.05/0.1"`` -> {key: [values]} (values split on '/')."""
    grid: dict[str, list[str]] = {}
    for part in [p for p in text.split(";") if p.strip()]:
        key, eq, values = part.partition("=")
        key = key.strip()
        vals = [v.strip() for v in values.split("/") if v.strip()]
        if not eq or not key or not vals:
            raise ConfigError(f"expected key=v1/v2/..., got {part!r}", field="tune")
        if key in grid:
            raise ConfigError(f"key {key!r} given twice", field="tune")
        grid[key] = vals
    if not grid:
        raise ConfigError("give at least one key=v1/v2/...", field="tune")
    return grid


def candidate_configs(base: dict, grid: dict[str, list[str]], algorithm: str | None = None) -> list[als.ALSConfig]:
    """Every grid point as a validated config (errors name the key; with ``algorithm``, a key
    it does not read is an error)."""
    keys = list(grid)
    out = []
    for idx in np.ndindex(*[len(grid[k]) for k in keys]):
        over = {**base, **{k: grid[k][i] for k, i in zip(keys, idx)}}
        out.append(als.ALSConfig.from_overrides(over, algorithm))
    return out


def check_same_plan(algorithm: str, configs: list[als.ALSConfig], implicit: bool, grid: dict) -> None:
    ref = als.plan_releases(algorithm, configs[0], implicit)
    for cfg in configs[1:]:
        if als.plan_releases(algorithm, cfg, implicit) != ref:
            bad = [k for k in grid if k in PLAN_KEYS] or list(grid)
            raise ConfigError(
                "candidates change the release plan (number of releases or budget shares); tune other keys",
                field=f"tune: {bad[0]}",
            )


#: ``train_candidate(cfg, multipliers, secrets, clip, index) -> (result, run ledger, exact score sum)``:
#: one run of the tuning on an engine (``result`` has ``state``)
CandidateRunner = Callable[..., tuple]


def tune(
    algorithm: str,
    split,
    base_overrides: dict,
    grid: dict[str, list[str]],
    tuning: TuningPlan,
    *,
    rating_range: tuple[float, float],
    epsilon: float,
    delta: float,
    item_features=None,
    progress: bool = False,
    secrets: RunSecrets | None = None,
    train_candidate: CandidateRunner | None = None,
    view: str = "selected",
    relation: str = ADD_REMOVE,
) -> tuple[object, PrivacyLedger, dict, BudgetPlan]:
    """Run private tuning; returns (train result of the selected run, the tuning ledger, a
    report of the selected run only, the budget plan). ``train_candidate``: one run on another
    engine (default: in process, the score computed over every user at once). ``view``: what the
    accounting covers (:data:`VIEWS`): ``"selected"``, the selected run with K hidden (one
    ``repeat_and_select`` record; only where nobody but this process sees the other runs, i.e.
    in process), or ``"all"``, every run and K seen (one ``repeat_and_compose`` record, the view
    of a Flower node; calibrated by :func:`fedpriv.privacy.plan.all_runs_plan`). A
    ``train_candidate`` whose runs other parties see needs ``"all"``. ``relation``: the job's
    neighbouring relation (calibrated under; the tuning ledger carries it)."""
    if view not in VIEWS:
        raise ConfigError(f"must be one of {', '.join(VIEWS)}, got {view!r}", field="tune_view")
    if train_candidate is None:
        train_candidate = tuning_candidate(algorithm, split, rating_range, epsilon, delta, item_features)
    configs, plan = _calibrated(algorithm, base_overrides, grid, tuning, rating_range, epsilon, delta, view, relation)
    clip = tuning.clip(rating_range)
    secrets = secrets if secrets is not None else RunSecrets()
    accountant = AllRunsAccountant() if view == "all" else BestOfAccountant()
    parent = PrivacyLedger(
        seed=secrets.ledger_seed("tuning"), budget=(epsilon, delta), accountant=accountant, relation=relation
    )
    k_runs = parent.repetitions("tuning_runs", shape=tuning.shape, mean=tuning.mean)
    # the candidate of each run is drawn from secret randomness: a public sequence of candidates
    # would tell how many runs it took to reach the selected one (a bound on K)
    pick_rng = np.random.default_rng(int.from_bytes(secrets.derive("tuning-candidates")[:16], "little"))
    ledgers, best = [], None
    for r in range(k_runs):
        with public_draws("tuning candidate"):
            c = int(pick_rng.integers(len(configs)))
        cfg = configs[c]  # same public seed in every run: a per-run seed in the output would reveal the run's index
        res, run_ledger, total = train_candidate(cfg, plan.multipliers, secrets.child(f"run{r}"), clip, r)
        noisy = run_ledger.gaussian(
            SCORE_RELEASE, total, sensitivity=score_sensitivity(clip), noise_multiplier=plan.multipliers[SCORE_RELEASE]
        )
        score = float(noisy[0])
        ledgers.append(run_ledger)
        if best is None or score < best[0]:
            best = (score, {k: getattr(cfg, k) for k in grid}, res)
    if view == "all":
        parent.repeat_and_compose("tuning", ledgers, shape=tuning.shape, mean=tuning.mean)
    else:
        parent.repeat_and_select("tuning", ledgers, shape=tuning.shape, mean=tuning.mean)
    assert best is not None, "a tuning runs at least one candidate"
    return best[2], parent, _selected_report(grid, len(configs), tuning, clip, best), plan


def _calibrated(
    algorithm: str,
    base_overrides: dict,
    grid: dict,
    tuning: TuningPlan,
    rating_range,
    epsilon: float,
    delta: float,
    view: str,
    relation: str = ADD_REMOVE,
):
    """(the grid's candidate configurations, the one budget plan that covers every run)."""
    spec = registry.get(algorithm)
    if not spec.private:
        raise ConfigError(f"tuning is for private algorithms ({algorithm} is not private)", field="tune")
    if spec.logistic:
        raise ConfigError(
            f"private tuning scores validation MSE; {algorithm} (logistic) is not supported yet", field="tune"
        )
    configs = candidate_configs(base_overrides, grid, algorithm)
    check_same_plan(algorithm, configs, False, grid)
    if view == "all":  # every run is seen: calibrated so that their composition over the law of K spends epsilon
        return configs, all_runs_plan_of(
            budget_plan(algorithm, configs[0], epsilon, delta, rating_range=rating_range, relation=relation),
            tuning,
            rating_range,
        )
    return configs, budget_plan(
        algorithm, configs[0], epsilon, delta, rating_range=rating_range, tuning=tuning, relation=relation
    )


def _selected_report(grid: dict, n_candidates: int, tuning: TuningPlan, clip: float, best: tuple) -> dict:
    """Only the selected run (its candidate and noised score); neither K, nor the other runs, nor
    the time they took (the "selected" view needs it; with "all" nothing need tell K either)."""
    return {
        "grid": grid,
        "candidates": n_candidates,
        "mean_runs": tuning.mean,
        "shape": tuning.shape,
        "score_share": tuning.share,
        "score_clip": clip,
        "selected": best[1],
        "selected_noised_score_sum": best[0],
    }


class Tuned:
    """Private tuning around any engine: the engine trains one candidate at a time
    (:meth:`~fedpriv.run.base.Engine.tuning_candidates`) and never sees the random stopping, the
    draws of candidates or the selection, which happen here (:func:`tune`). On the Flower
    engines the nodes fedpriv starts keep one node ledger for all the candidates of a tuning
    (:meth:`fedpriv.run.flower_engines.FlowerOptions.tuning_candidates`), so their own budget
    bounds the number of candidates."""

    def __init__(self, engine):
        self.engine = engine

    def train(self, plan, opts, secrets, *, progress: bool = False):
        from ..privacy.plan import TuningPlan
        from .inputs import RunOptions

        base = {k: v for k, v in plan.job.params.items() if k not in RunOptions.__dataclass_fields__}
        view = view_of(opts.tune_view, self.engine.nodes_see_every_run)
        candidates = self.engine.tuning_candidates(plan, opts)
        try:
            result, ledger, report, _ = tune(
                plan.algorithm,
                plan.split,
                base,
                parse_grid(opts.tune),
                TuningPlan(opts.tune_mean, opts.tune_shape, opts.tune_share, opts.tune_score_clip),
                rating_range=plan.rating_range,
                epsilon=plan.job.epsilon,
                delta=plan.job.delta,
                item_features=plan.dataset.item_features,
                secrets=secrets,
                train_candidate=candidates.run,
                view=view,
                relation=plan.job.relation,
            )
        finally:
            candidates.cleanup()
        trained = candidates.selected(result, ledger)
        trained.after = {"tuning": {**report, "accounting": VIEWS[view]}}
        return trained
