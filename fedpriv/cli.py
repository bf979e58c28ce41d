"""Command line: ``fedpriv run ALGORITHM --data SPEC [--epsilon E --delta D] [--set k=v ...] --out DIR``.

Every command builds a :class:`fedpriv.run.Job` (the flags are parsed here: the only place,
with the ``flwr run`` run-config reader, where a job's values are strings) and runs its plan on
an engine: ``--engine inprocess`` (default) in this process, ``--engine flower`` with
``flwr run`` on Flower's local simulation runtime (:class:`fedpriv.ops.launcher.FlwrRun`)."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import ConfigError, DataError, FedprivError, did_you_mean


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedpriv", description="Federated user-level DP recommendation.")
    from . import __version__

    p.add_argument("--version", action="version", version=f"fedpriv {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train and evaluate one algorithm on one data set")
    from .algorithms import registry

    r.add_argument("algorithm", help=f"{', '.join(registry.names())}; on synthetic-personal data: pam, pam-exp, pam-own-data, pam-single-model, pam-nonprivate")
    r.add_argument("--data", required=True, help="ml-100k:PATH, ml-1m:PATH, ml-10m:PATH, ml-20m:PATH, ml-latest:PATH, lastfm:PATH, jester:PATH, csv:PATH, parquet:PATH (your own ratings; see --data-opt), synthetic-mf:users=N,items=M,ratings=R,seed=S or synthetic-personal:users=N,samples=M,d=D,k=K,noise=S,seed=R")
    r.add_argument("--data-opt", dest="data_options", action="append", default=[], metavar="KEY=VALUE", help="csv/parquet option (repeatable): user=COL, item=COL, rating=COL, sep=',', header=1, rating_range=LO,HI (required for explicit ratings), implicit=1, duplicates=error|last, items=FILE (the item catalogue: a header line, then one item id per line; private algorithms need it or features=), features=PATH (item features table; it lists the catalogue too), feature_item=COL, categorical=A;B, numeric=C, multi_sep='|', name=COL, bins=5")
    r.add_argument("--save-model", default=None, metavar="DIR", help="write the released model (item embeddings and biases, encoder, mean, config, ledger; no metric, no data path) to DIR (every engine)")
    r.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out and the model in --save-model (refused otherwise)")
    r.add_argument("--epsilon", type=float, default=None, help="target epsilon (private algorithms)")
    r.add_argument("--delta", type=float, default=1e-5)
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="hyperparameter or run option (repeatable); e.g. recommend=mgem rec_epsilon=1 rec_sensitivity=quantile: after training every user reports one item by private selection")
    r.add_argument(
        "--engine",
        default="inprocess",
        help="inprocess (default: this process) or flower (`flwr run` on Flower's local simulation runtime; "
        "its SuperLink is stopped when the job ends)",
    )
    r.add_argument("--aggregation", choices=("central", "secure"), default=None, help="who sees exact sums: central (a trusted aggregator step adds the noise; default) or secure (nodes add distributed Skellam noise and mask their words: the server learns only noised sums)")
    r.add_argument("--nodes", type=int, default=None, help="flower engine: number of simulated nodes (default: ceil(training users / users-per-node))")
    r.add_argument("--users-per-node", type=int, default=None, help="flower engine: users held by each node (default 1)")
    r.add_argument(
        "--noise-seed", type=int, default=None, metavar="N",
        help="reproducible noise and user sampling from N (tests, debugging). By default every noise value comes from the OS CSPRNG and "
        "every user's random choices from a secret key; with a noise seed, privacy holds only against those who do not know N "
        "(metrics.json says so; N is written nowhere)",
    )
    r.add_argument("--tune", action="append", default=[], metavar="KEY=V1/V2/...", help="private tuning by random stopping over these candidates (repeatable; in-process engine)")
    r.add_argument("--tune-mean", type=float, default=None, help="expected number of tuning runs (default 5)")
    r.add_argument("--tune-shape", type=float, default=None, help="truncated negative binomial shape: 1 geometric (default), 0 logarithmic")
    r.add_argument("--out", required=True, help="output folder for metrics.json and ledger.json")
    r.add_argument("--quiet", action="store_true", help="no progress bar; flower engine: Flower's log is not shown")

    pv = sub.add_parser("privacy", help="privacy tools")
    psub = pv.add_subparsers(dest="privacy_command", required=True)
    pl = psub.add_parser("plan", help="split a target (epsilon, delta) over an algorithm's releases and print the calibrated plan; no training")
    pl.add_argument("algorithm")
    pl.add_argument("--epsilon", type=float, required=True)
    pl.add_argument("--delta", type=float, default=1e-5)
    pl.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="hyperparameter (repeatable), e.g. steps=5, share_counts=0.1")
    pl.add_argument("--rating-range", default="1,5", help="LO,HI of the ratings (sets the sensitivities of mean and score; default 1,5)")
    pl.add_argument("--implicit", action="store_true", help="implicit feedback (held-out-users protocol: no mean release)")
    pl.add_argument("--tune-mean", type=float, default=None, help="plan private tuning with this expected number of runs")
    pl.add_argument("--tune-shape", type=float, default=1.0)
    pl.add_argument("--tune-share", type=float, default=0.05)
    pl.add_argument("--aggregation", choices=("central", "secure"), default=None, help="plan for secure aggregation (distributed Skellam noise: subsampled releases get no amplification)")
    pl.add_argument("--json", action="store_true", help="print JSON instead of markdown tables")
    rc = sub.add_parser("recommend", help="top-k unseen items for one user from a saved model: the user's vector is solved locally from their own ratings (no privacy cost)")
    rc.add_argument("--model", required=True, help="a model folder written by `fedpriv run --save-model`")
    rc.add_argument("--ratings", required=True, help="the user's ratings: a CSV file with a header, columns item,rating (item alone for implicit feedback)")
    rc.add_argument("--k", type=int, default=10)
    rc.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    sel = sub.add_parser("selection", help="private selection with heterogeneous sensitivities: synthetic scenarios, bandit under shift")
    ssub = sel.add_subparsers(dest="selection_command", required=True)
    from .ops import deploy  # light at import: flwr and the data code load on use
    from .studies.selection import bandit, scenarios  # light modules: numpy and the ledger

    deploy.add_deploy_arguments(sub.add_parser("deploy", help="Flower deployment runtime on loopback: SuperLink + SuperNodes (TLS, node authentication, per-node data); up, run, down"))
    scenarios.add_scenarios_arguments(ssub.add_parser("scenarios", help="the paper's synthetic scenarios: MSE to the optimum per mechanism and epsilon (selection.json, plots)"))
    bandit.add_bandit_arguments(ssub.add_parser("bandit", help="two-armed bandit with a distribution shift: UCB, Thompson sampling and private selection (bandit.json, plot)"))
    from .ops import report  # light at import: the standard library
    from .ops.experiments import (
        runner as experiments_runner,  # light at import: the config parser
    )

    experiments_runner.add_experiment_arguments(sub.add_parser("experiment", help="run experiment configs (TOML) into a results folder, resumably: tidy CSV, tables, PNG plots, per-run ledgers"))
    report.add_report_arguments(sub.add_parser("report", help="render a results folder of `fedpriv experiment` into one self-contained HTML page"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "privacy":
            return _privacy_plan(args)
        if args.command == "recommend":
            return _recommend(args)
        if args.command == "deploy":
            from .ops import deploy

            return deploy.deploy_command(args)
        if args.command == "experiment":
            from .ops.experiments import runner as experiments_runner

            return experiments_runner.experiment_command(args)
        if args.command == "report":
            from .ops import report

            return report.report_command(args)
        if args.command == "selection":
            from .studies.selection import bandit, scenarios

            return (scenarios if args.selection_command == "scenarios" else bandit).command(args)
    except FedprivError as exc:
        print(f"fedpriv: error: {exc}", file=sys.stderr)
        return 2
    return 1


def _run(args) -> int:
    from .ops.launcher import FlwrRun
    from .run.model import check_model_folder
    from .run import InProcess, Job, check_results_folder, parse_overrides, write_outputs

    params: dict = parse_overrides(args.overrides)
    if args.aggregation is not None:
        params["aggregation"] = args.aggregation
    if args.tune:
        params["tune"] = ";".join(args.tune)
    if args.tune_mean is not None:
        params["tune_mean"] = args.tune_mean
    if args.tune_shape is not None:
        params["tune_shape"] = args.tune_shape
    if args.engine == "flower":
        engine = FlwrRun(nodes=args.nodes, users_per_node=args.users_per_node, quiet=args.quiet)
    elif args.engine == "inprocess":
        for key in ("nodes", "users_per_node"):  # recorded in the config as on every engine
            if getattr(args, key) is not None:
                params[key] = getattr(args, key)
        engine = InProcess()
    else:
        raise ConfigError(f"unknown engine {args.engine!r} (known: inprocess, flower){did_you_mean(args.engine, ('inprocess', 'flower'))}", field="--engine")
    # before training: a refused folder costs nothing
    check_results_folder(args.out, overwrite=args.overwrite)
    if args.save_model is not None:
        check_model_folder(args.save_model, overwrite=args.overwrite)
    job = Job(args.algorithm, args.data, epsilon=args.epsilon, delta=args.delta, noise_seed=args.noise_seed, params=params,
              data_options=parse_overrides(args.data_options, field="--data-opt"))
    outcome = job.prepare().execute(engine, progress=not args.quiet)
    if args.save_model is not None and outcome.model is None:
        raise ConfigError(f"{args.algorithm} releases no shared item model to save", field="--save-model")
    write_outputs(args.out, outcome.report.to_json(), outcome.ledger)
    if args.save_model is not None:
        outcome.model.save(args.save_model, overwrite=args.overwrite)
    if not args.quiet:  # the human summary (every engine the same) on stderr; stdout keeps the JSON line
        print(outcome.report.summary(out=str(args.out.rstrip("/") + "/metrics.json")), file=sys.stderr)
    _print_summary(outcome.report.to_json())
    return 0


def _recommend(args) -> int:
    from .run.model import load_model, read_user_ratings

    model = load_model(args.model)
    if not hasattr(model, "recommend"):
        raise ConfigError(f"{args.model} is a personalization model ({model.algorithm}): it has no item catalogue to recommend from; "
                          "in Python, load_model(DIR).personalize(X, y) solves a user's vector and .predict(X, v) predicts", field="--model")
    items, ratings = read_user_ratings(args.ratings, implicit=model.state.implicit)
    try:
        recs = model.recommend(items, ratings, k=args.k)
    except DataError as exc:  # name the user's file
        if exc.path is not None:
            raise
        raise DataError(str(exc), path=args.ratings) from None
    if args.json:
        for rank, r in enumerate(recs, 1):
            print(json.dumps({"rank": rank, **r}))
        return 0
    width = max([len(str(r["item"])) for r in recs] + [4])
    print(f"{'rank':>4}  {'item':>{width}}  {'score':>7}  {'rating':>6}  name")
    for rank, r in enumerate(recs, 1):
        print(f"{rank:>4}  {r['item']!s:>{width}}  {r['score']:7.3f}  {r['rating']:6.2f}  {r['name'] or ''}")
    return 0


def _privacy_plan(args) -> int:
    from . import api
    from .privacy.plan import TuningPlan
    from .run import parse_overrides

    try:
        lo, hi = (float(x) for x in args.rating_range.split(","))
    except ValueError:
        raise ConfigError(f"expected LO,HI, got {args.rating_range!r}", field="--rating-range") from None
    overrides = parse_overrides(args.overrides)
    if args.aggregation is not None:
        overrides["aggregation"] = args.aggregation
    tuning = None if args.tune_mean is None else TuningPlan(args.tune_mean, args.tune_shape, args.tune_share)
    plan = api.plan(args.algorithm, epsilon=args.epsilon, delta=args.delta, rating_range=(lo, hi), implicit=args.implicit, tuning=tuning, **overrides)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.to_markdown(), end="" if not args.json else "\n")
    return 0


def _print_summary(metrics: dict) -> None:
    keys = [k for k in metrics if k.startswith(("test_", "valid_")) and not k.endswith("sliced")]
    summary = {k: metrics[k] for k in ("algorithm", "dataset", "epsilon", "epsilon_spent", *keys, "wall_seconds")}
    if "recommendation" in metrics:
        rec = metrics["recommendation"]
        summary["recommendation"] = {k: rec.get(k) for k in ("mechanism", "epsilon", "mse_to_best", "hit_rate", "argmax_hit_rate", "uniform_hit_rate")}
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
