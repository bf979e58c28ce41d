"""One run, the same for every engine: the engine trains the plan (:class:`~fedpriv.run.base.Trained`),
the plan's evaluation measures it, and the ledger gives every epsilon of ``metrics.json``. A rating
plan runs through :func:`run_ratings` (its ratings here, or on the nodes of a deployment), a
block family's through :func:`run_blocks`. Private tuning wraps the
engine (:class:`~fedpriv.run.tuning.Tuned`)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass

from ..algorithms import als
from ..algorithms.metrics import run_header
from ..errors import PrivacyError
from ..privacy.accounting import ADD_REMOVE, epsilon_bounds, epsilon_pld_second_opinion, epsilon_spent
from ..privacy.randomness import RunSecrets
from .base import Trained, check_options, engine_options
from .inputs import noise_statement
from .outputs import _clean, delta_warning
from .report import Outcome, RunReport, verdicts


@dataclass
class Finished:
    """A finished run: ``metrics.json``, the ledger records, the released state and the
    training interactions held here (None on a deployment's server and for personalization)."""

    metrics: dict
    records: list[dict]
    state: object
    train: object | None


def execute(plan, engine, *, progress: bool = False, second_opinion: bool = True) -> Outcome:
    """Run ``plan`` on ``engine``: the :class:`~fedpriv.run.report.Outcome`."""
    secrets = RunSecrets(plan.job.noise_seed)
    check_options(engine, {**plan.job.params, **engine_options(engine)})
    # the engines train the plan's own (frozen) config; the noise-aware rule gives the state a new one
    run = run_blocks if plan.family.blocks else run_ratings
    done = run(plan, engine, secrets, progress=progress, second_opinion=second_opinion)
    return Outcome(
        RunReport.from_metrics(done.metrics),
        done.records,
        plan.released_model(done),
        done.state,
        done.train,
        plan.dataset,
    )


def _run_options(plan, engine):
    return engine.layout(dataclasses.replace(plan.options, **engine_options(engine)), plan)


def _header(plan, engine, cfg, secrets: RunSecrets, data: dict) -> dict:
    """The first keys of ``metrics.json``: the run, the data, the randomness, the aggregation."""
    job = plan.job
    return {
        **run_header(
            job.algorithm, plan.spec, engine.name, cfg.seed, job.epsilon, job.delta, plan.private, plan.protocol
        ),
        **data,
        **noise_statement(secrets),
        # who saw exact sums: the ServerApp's aggregator step (central) or nobody (secure)
        "aggregation": cfg.aggregation.mode,
        # a deployment (its enrolled count is public): the relation every epsilon here holds under
        **({"neighbouring_relation": job.relation} if plan.private and job.relation != ADD_REMOVE else {}),
    }


def _data_keys(plan) -> dict:
    """The data keys of a rating run's ``metrics.json``: of the ratings held here, or of a
    partitioned deployment's public metadata (the ratings stay on the nodes)."""
    if plan.here:
        inter = plan.dataset.interactions
        return {
            "n_users": int(inter.n_users),
            "n_items": int(inter.n_items),
            "n_ratings": len(inter),
            "duplicates_dropped": int(plan.dataset.duplicates_dropped),
        }
    public = plan.public
    return {
        "n_users": int(public.n_users),
        "n_items": int(public.n_items),
        "n_ratings": None,  # held by the nodes only
        "data_source": public.source,
        "server_holds_ratings": False,
        "duplicates_dropped": None,
    }


def run_ratings(plan, engine, secrets: RunSecrets, *, progress: bool = False, second_opinion: bool = True) -> Finished:
    """A rating run, its ratings held here or on the nodes: trained by ``engine`` (wrapped by the
    tuning when ``tune`` is set), measured by the plan's evaluation."""
    from .tuning import Tuned

    t0 = time.perf_counter()
    opts = _run_options(plan, engine)
    metrics = _header(plan, engine, plan.config, secrets, _data_keys(plan))
    trainer = Tuned(engine) if opts.tune else engine
    trained = trainer.train(plan, opts, secrets, progress=progress)
    opts = trained.options or opts
    metrics.update(trained.measured)
    metrics.update(trained.counters)
    plan.evaluation.measure(trained.state, plan.split, metrics, on_nodes=trained.on_nodes or not plan.here)
    metrics.update(trained.after)
    if trained.recommendation is not None:
        metrics["recommendation"] = trained.recommendation
    metrics, records = finish(metrics, trained, plan, engine.name, opts, t0, second_opinion)
    return Finished(metrics, records, trained.state, plan.split.train if plan.here else None)


def _recommendation_phase(metrics: dict, trained: Trained, plan, delta: float) -> tuple:
    """The recommendation phase's own ledger, composed with training for the run's epsilon:
    (the releases to account, private)."""
    rec_cfg, ledger, rec_ledger = plan.recommend, trained.ledger, trained.rec_ledger
    assert rec_ledger is not None, "a recommendation phase has its own ledger"
    metrics["recommendation"].update(
        {
            "mechanism": rec_cfg.mechanism,
            "sensitivity_source": rec_cfg.sensitivity,
            "epsilon_select": rec_cfg.epsilon,
            "epsilon": epsilon_bounds(rec_ledger, delta, relation=plan.job.relation)[0],
            "params": rec_cfg.params,
            # the score histogram (quantile source) is a secure sum in secure mode
            "aggregation": trained.state.config.aggregation.mode,
        }
    )
    metrics["epsilon_training"] = epsilon_bounds(ledger, delta, relation=plan.job.relation)[0] if plan.private else None
    return ([*ledger.releases, *rec_ledger.releases] if plan.private else rec_ledger), True


def _epsilons(metrics: dict, ledger, delta: float, private: bool, second_opinion: bool, relation: str) -> None:
    if private:
        metrics["epsilon_spent"] = epsilon_spent(
            ledger, delta, relation=relation
        )  # a tuning seen by the nodes: every run, over the law of K
        metrics["epsilon_spent_pld"] = (
            epsilon_pld_second_opinion(ledger, delta, metrics["epsilon_spent"], relation=relation)
            if second_opinion
            else None
        )
    else:
        metrics["epsilon_spent"] = None
        metrics["epsilon_spent_pld"] = None


def finish(
    metrics: dict, trained: Trained, plan, engine_name: str, opts, t0: float, second_opinion: bool
) -> tuple[dict, list[dict]]:
    """The run's epsilon (dp-accounting, from the ledger), noise multipliers, timings and
    config in ``metrics``; returns (metrics, ledger records)."""
    state, job = trained.state, plan.job
    records, ledger, private = trained.ledger.to_list(), trained.ledger, plan.private
    _same_relation(ledger, plan)
    if trained.rec_ledger is not None:
        ledger, private = _recommendation_phase(metrics, trained, plan, job.delta)
        records = records + trained.rec_ledger.to_list()
    _epsilons(metrics, ledger, job.delta, private, second_opinion, job.relation)
    metrics["noise_multipliers"] = dict(state.multipliers)
    metrics["released_mean"] = state.mean
    metrics["released_n_users"] = (
        int(state.n_users) if private and als.needs_user_count(job.algorithm, state.config) else None
    )
    if state.choice is not None:
        metrics["noise_aware"] = state.choice
    warning = delta_warning(job.delta, metrics["released_n_users"] or metrics.get("n_users")) if private else None
    if warning:
        metrics["delta_warning"] = warning
    metrics["timings"] = trained.timings
    # a tuned run's total time would tell how many runs K were drawn: K stays hidden
    metrics["wall_seconds"] = None if opts.tune else time.perf_counter() - t0
    metrics["config"] = {
        "algorithm": job.algorithm,
        "data": str(plan.spec),
        "engine": engine_name,
        "epsilon": job.epsilon,
        "delta": job.delta,
        **asdict(opts),
        "protocol": plan.protocol,
        **state.config.to_dict(),
    }  # noise-aware runs: what the rule chose
    metrics["verdict"] = verdicts(_clean(metrics))  # against the trivial references of the task
    return _clean(metrics), records


def _same_relation(ledger, plan) -> None:
    """A private run's engine calibrates under the job's relation: its ledger carries it (else the
    reported epsilon would hold under one relation for a run calibrated under another)."""
    relation = getattr(ledger, "relation", ADD_REMOVE)
    if plan.private and relation != plan.job.relation:
        raise PrivacyError(f"the run's ledger accounts under {relation!r}, the job under {plan.job.relation!r}")


def run_blocks(plan, engine, secrets: RunSecrets, *, progress: bool = False, second_opinion: bool = True) -> Finished:
    """A block family's run (:class:`~fedpriv.algorithms.families.Family`: DP model
    personalization, ...): (metrics, ledger records, released state), the CLI contract."""
    from ..privacy.accounting import zcdp_rho

    t0 = time.perf_counter()
    job, cfg, data, family = plan.job, plan.config, plan.dataset, plan.family
    opts = _run_options(plan, engine)
    trained = engine.train(plan, opts, secrets, progress=progress)
    state, ledger, private = trained.state, trained.ledger, plan.private
    _same_relation(ledger, plan)
    measured = dict(trained.measured)
    plan.evaluation.measure(state, data, measured, on_nodes=trained.on_nodes)
    metrics = {
        **run_header(job.algorithm, plan.spec, engine.name, cfg.seed, job.epsilon, job.delta, private, plan.protocol),
        "n_users": plan.n_users,
        **family.report_keys(data, state),
        **measured,
        "references": family.references(data),
        **_personal_epsilons(ledger, job.delta, private, job.relation),
        "rho_zcdp": zcdp_rho(ledger, relation=job.relation) if private else None,
        "noise_multipliers": dict(state.multipliers),
        "aggregation": cfg.aggregation.mode,
        **trained.counters,
        "timings": trained.timings,
        "wall_seconds": time.perf_counter() - t0,
        "config": {
            "algorithm": job.algorithm,
            "data": str(plan.spec),
            "engine": engine.name,
            "epsilon": job.epsilon,
            "delta": job.delta,
            "users_per_node": trained.users_per_node,
            **cfg.to_dict(),
        },
    }
    metrics.update(noise_statement(secrets))
    metrics["verdict"] = verdicts(_clean(metrics))
    return Finished(_clean(metrics), ledger.to_list(), state, None)


def _personal_epsilons(ledger, delta: float, private: bool, relation: str) -> dict:
    """epsilon_spent by the rule of :func:`~fedpriv.privacy.accounting.epsilon_bounds` (the pure
    epsilon counts when every release is pure DP, as for pam-exp), with the RDP and PLD values."""
    if not private:
        return {"epsilon_spent": None, "epsilon_spent_pld": None}
    spent, rdp, pure = epsilon_bounds(ledger, delta, relation=relation)
    out: dict[str, object] = {"epsilon_spent": spent, "epsilon_spent_rdp": rdp}
    out["epsilon_spent_pld"] = epsilon_pld_second_opinion(ledger, delta, spent, relation=relation)
    if pure is not None:
        out["epsilon_pure"] = pure
    if relation != ADD_REMOVE:  # a deployment (its enrolled count is public): every epsilon here holds under it
        out["neighbouring_relation"] = relation
    return out
