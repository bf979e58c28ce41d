"""Command line: ``fedpriv run ALGORITHM --data SPEC [--epsilon E --delta D] [--set k=v ...] --out DIR``.

Every command builds a :class:`fedpriv.run.Job` (the flags are parsed here: the only place,
with the ``flwr run`` run-config reader, where a job's values are strings) and runs its plan on
an engine: ``--engine inprocess`` (default) in this process, ``--engine flower`` with
``flwr run`` on Flower's local simulation runtime (:class:`fedpriv.ops.launcher.FlwrRun`)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from .errors import ConfigError, DataError, FedprivError


#: the subcommands and their help; :data:`ADDERS` adds each one's arguments and sets the handler
#: of its leaf parsers (``set_defaults(handler=...)``): dispatch never goes by name. The adders
#: import their modules, so :func:`main` builds only the chosen command's arguments
#: (``fedpriv --help`` and ``--version`` load no torch, Flower or data code).
COMMANDS: dict[str, str] = {
    "run": "train and evaluate one algorithm on one data set",
    "privacy": "privacy tools",
    "recommend": "top-k unseen items for one user from a saved model: the user's vector is solved locally from their "
                 "own ratings (no privacy cost)",
    "selection": "private selection with heterogeneous sensitivities: synthetic scenarios, bandit under shift",
    "deploy": "Flower deployment runtime on loopback: SuperLink + SuperNodes (TLS, node authentication, per-node "
              "data); up, run, down",
    "experiment": "run experiment configs (TOML) into a results folder, resumably: tidy CSV, tables, PNG plots, "
                  "per-run ledgers",
    "report": "render a results folder of `fedpriv experiment` into one self-contained HTML page",
}


def _add_run(r: argparse.ArgumentParser) -> None:
    from .algorithms import model_table

    r.set_defaults(handler=_run)
    # the table of models by task, from the registry (docs/reference/cli.md and the README show the same)
    r.formatter_class = argparse.RawDescriptionHelpFormatter
    r.epilog = model_table.model_table("text") + "\n\nthe personalization models train on synthetic-personal data only."
    r.add_argument("algorithm", help="the model to train: one of the table below (models by task)")
    r.add_argument(
        "--data",
        required=True,
        help="ml-100k:PATH, ml-1m:PATH, ml-10m:PATH, ml-20m:PATH, ml-latest:PATH, lastfm:PATH, jester:PATH, csv:PATH, "
             "parquet:PATH (your own ratings; see --data-opt), synthetic-mf:users=N,items=M,ratings=R,seed=S or "
             "synthetic-personal:users=N,samples=M,d=D,k=K,noise=S,seed=R",
    )
    r.add_argument(
        "--data-opt",
        dest="data_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="csv/parquet option (repeatable): user=COL, item=COL, rating=COL, sep=',', header=1, rating_range=LO,HI "
             "(required for explicit ratings), implicit=1, duplicates=error|last, items=FILE (the item catalogue: a "
             "header line, then one item id per line; private algorithms need it or features=), features=PATH (item "
             "features table; it lists the catalogue too), feature_item=COL, categorical=A;B, numeric=C, "
             "multi_sep='|', name=COL, bins=5",
    )
    r.add_argument(
        "--save-model",
        default=None,
        metavar="DIR",
        help="write the released model (item embeddings and biases, encoder, mean, config, ledger; no metric, no data "
             "path) to DIR (every engine)",
    )
    r.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results of an earlier run in --out and the model in --save-model (refused otherwise)",
    )
    r.add_argument("--epsilon", type=float, default=None, help="target epsilon (private algorithms)")
    r.add_argument(
        "--delta",
        type=float,
        default=1e-5,
        help="target delta of a private run: the probability that the epsilon guarantee may fail; "
        "keep it well below 1 / (number of users) (default 1e-5; a larger one is warned about)",
    )
    r.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="hyperparameter or run option (repeatable); e.g. recommend=mgem rec_epsilon=1 rec_sensitivity=quantile: "
             "after training every user reports one item by private selection",
    )
    r.add_argument(
        "--engine",
        default="inprocess",
        help="inprocess (default: this process), flower (`flwr run` on Flower's local simulation runtime; "
        "its SuperLink is stopped when the job ends) or ray (Flower's simulation runtime in this process)",
    )
    r.add_argument(
        "--aggregation",
        choices=("central", "secure"),
        default=None,
        help="who sees exact sums: central (a trusted aggregator step adds the noise; default) or secure (nodes add "
             "distributed Skellam noise and mask their words: the server learns only noised sums)",
    )
    r.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="number of nodes the training users are split over, on every engine (alone: ceil(users / N) users per "
             "node; default: "
        "inprocess one node in central mode and 20 users per node in secure mode, flower one node per user)",
    )
    r.add_argument(
        "--users-per-node",
        type=int,
        default=None,
        help="users held by each node, on every engine (default: see --nodes)",
    )
    r.add_argument(
        "--device",
        default=None,
        help="where the statistics and solves compute, 'cpu' (default) or 'cuda'/'cuda:N': the in-process engine's "
             "clients and server, or the Flower ServerApp (each node: its own `device` node config); the same releases "
             "and ledger; the noise is drawn on the device, keyed with 128 bits of OS entropy (a --noise-seed run "
             "draws it on the CPU)",
    )
    r.add_argument(
        "--noise-seed",
        type=int,
        default=None,
        metavar="N",
        help="reproducible noise and user sampling from N (tests, debugging). By default every noise value comes from "
             "the OS CSPRNG and "
        "every user's random choices from a secret key; with a noise seed, privacy holds only against those who do not "
        "know N "
        "(metrics.json says so; N is written nowhere)",
    )
    r.add_argument(
        "--tune",
        action="append",
        default=[],
        metavar="KEY=V1/V2/...",
        help="private tuning by random stopping over these candidates (repeatable)",
    )
    r.add_argument("--tune-mean", type=float, default=None, help="expected number of tuning runs (default 5)")
    r.add_argument(
        "--tune-shape",
        type=float,
        default=None,
        help="truncated negative binomial shape: 1 geometric (default), 0 logarithmic",
    )
    r.add_argument("--out", required=True, help="output folder for metrics.json and ledger.json")
    r.add_argument("--quiet", action="store_true", help="no progress bar; flower engine: Flower's log is not shown")
    r.add_argument(
        "--max-rejected-fraction",
        type=float,
        default=None,
        metavar="F",
        help="the share of the replies asked for that may be rejected (malformed, late, node errors) before the run "
             "fails "
        "with exit status 3 (default 0.5; its outputs are still written)",
    )


def _add_privacy(pv: argparse.ArgumentParser) -> None:
    psub = pv.add_subparsers(dest="privacy_command", required=True)
    pl = psub.add_parser(
        "plan",
        help="split a target (epsilon, delta) over an algorithm's releases and print the calibrated plan; no training",
    )
    pl.set_defaults(handler=_privacy_plan)
    pl.add_argument("algorithm")
    pl.add_argument("--epsilon", type=float, required=True)
    pl.add_argument("--delta", type=float, default=1e-5)
    pl.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="hyperparameter (repeatable), e.g. steps=5, share_counts=0.1",
    )
    pl.add_argument(
        "--rating-range",
        default="1,5",
        help="LO,HI of the ratings (sets the sensitivities of mean and score; default 1,5)",
    )
    pl.add_argument(
        "--implicit", action="store_true", help="implicit feedback (held-out-users protocol: no mean release)"
    )
    pl.add_argument(
        "--tune-mean", type=float, default=None, help="plan private tuning with this expected number of runs"
    )
    pl.add_argument("--tune-shape", type=float, default=1.0)
    pl.add_argument("--tune-share", type=float, default=0.05)
    pl.add_argument(
        "--aggregation",
        choices=("central", "secure"),
        default=None,
        help="plan for secure aggregation (distributed Skellam noise: subsampled releases get no amplification)",
    )
    pl.add_argument(
        "--deployment",
        action="store_true",
        help="plan for `fedpriv deploy run`: its enrolled count is public, so the target holds under replace-one "
             "(calibrated there, as the deployment does)",
    )
    pl.add_argument("--json", action="store_true", help="print JSON instead of markdown tables")


def _add_recommend(rc: argparse.ArgumentParser) -> None:
    rc.set_defaults(handler=_recommend)
    rc.add_argument("--model", required=True, help="a model folder written by `fedpriv run --save-model`")
    rc.add_argument(
        "--ratings",
        required=True,
        help="the user's ratings: a CSV file with a header, columns item,rating (item alone for implicit feedback)",
    )
    rc.add_argument("--k", type=int, default=10, help="how many unseen items to recommend (default 10)")
    rc.add_argument("--json", action="store_true", help="print JSON lines instead of a table")


def _add_selection(sel: argparse.ArgumentParser) -> None:
    from .studies.selection import bandit, scenarios  # light modules: numpy and the ledger

    ssub = sel.add_subparsers(dest="selection_command", required=True)
    sc = ssub.add_parser(
        "scenarios",
        help="the paper's synthetic scenarios: MSE to the optimum per mechanism and epsilon (selection.json, plots)",
    )
    scenarios.add_scenarios_arguments(sc)
    sc.set_defaults(handler=scenarios.scenarios_command)
    ba = ssub.add_parser(
        "bandit",
        help="two-armed bandit with a distribution shift: UCB, Thompson sampling and private selection (bandit.json, "
             "plot)",
    )
    bandit.add_bandit_arguments(ba)
    ba.set_defaults(handler=bandit.bandit_command)


def _add_deploy(p: argparse.ArgumentParser) -> None:
    from .ops import deploy

    deploy.add_deploy_arguments(p)
    p.set_defaults(handler=deploy.deploy_command)


def _add_experiment(p: argparse.ArgumentParser) -> None:
    from .ops.experiments import runner  # light at import: the config parser

    runner.add_experiment_arguments(p)
    p.set_defaults(handler=runner.experiment_command)


def _add_report(p: argparse.ArgumentParser) -> None:
    from .ops import report  # light at import: the standard library

    report.add_report_arguments(p)
    p.set_defaults(handler=report.report_command)


ADDERS = {
    "run": _add_run,
    "privacy": _add_privacy,
    "recommend": _add_recommend,
    "selection": _add_selection,
    "deploy": _add_deploy,
    "experiment": _add_experiment,
    "report": _add_report,
}


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``only``: build the arguments of that command alone (the others are
    listed with their help), as :func:`main` does; None builds every command's."""
    p = argparse.ArgumentParser(prog="fedpriv", description="Federated user-level DP recommendation.")
    from . import __version__

    p.add_argument("--version", action="version", version=f"fedpriv {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in COMMANDS.items():
        cp = sub.add_parser(name, help=text)
        if only is None or name == only:
            ADDERS[name](cp)
    return p


def _command_of(argv: list[str]) -> str:
    """The subcommand named in ``argv`` ("" when none: --help, --version, an error)."""
    for a in argv:
        if not a.startswith("-"):
            return a if a in COMMANDS else ""
        if a in ("-h", "--help", "--version"):
            return ""
    return ""


def main(argv: list[str] | None = None) -> int:
    """Run one command; a FedprivError exits 2 with one line, a stop signal (SIGINT, SIGTERM,
    SIGHUP) stops what the command started, removes its temporary files and exits 128 + n with
    one line (:mod:`fedpriv.util.stopping`)."""
    from .util.stopping import Stopped, stop_signals

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with stop_signals(), warnings.catch_warnings():
            warnings.showwarning = _show_warning
            args = _parser(only=_command_of(argv)).parse_args(argv)
            try:
                return int(args.handler(args))
            except FedprivError as exc:
                print(f"fedpriv: error: {exc}", file=sys.stderr)
                return 2
    except Stopped as stop:
        print(f"fedpriv: {stop}: stopped what it started and removed its temporary files", file=sys.stderr)
        return stop.exit_code


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning of fedpriv's (FedprivWarning, or raised in the package) as one line on stderr;
    other packages' warnings as Python shows them."""
    from .errors import FedprivWarning

    if issubclass(category, FedprivWarning) or str(filename).startswith(str(Path(__file__).resolve().parent)):
        print(f"fedpriv: warning: {message}", file=file if file is not None else sys.stderr)
        return
    (file if file is not None else sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def _run(args) -> int:
    from .ops.engines import engine_named
    from .run.model import check_model_folder
    from .run import Job, check_results_folder, parse_overrides, write_outputs
    from .run.report import MAX_REJECTED_FRACTION, TooManyRejected, check_rejections

    limit = MAX_REJECTED_FRACTION if args.max_rejected_fraction is None else float(args.max_rejected_fraction)
    if not 0.0 <= limit <= 1.0:
        raise ConfigError(f"must be in [0, 1], got {args.max_rejected_fraction!r}", field="--max-rejected-fraction")
    params: dict = parse_overrides(args.overrides)
    if args.aggregation is not None:
        params["aggregation"] = args.aggregation
    if args.tune:
        params["tune"] = ";".join(args.tune)
    if args.tune_mean is not None:
        params["tune_mean"] = args.tune_mean
    if args.tune_shape is not None:
        params["tune_shape"] = args.tune_shape
    if args.device is not None:  # before anything starts: a device this machine lacks is refused here
        from .util.device import checked

        try:
            checked(args.device)
        except ConfigError as exc:
            raise exc.renamed({"device": "--device"}) from None
    options = {"nodes": args.nodes, "users_per_node": args.users_per_node, "device": args.device}
    if args.engine == "flower":  # the launcher prints Flower's log unless quiet
        options["quiet"] = args.quiet
    engine = engine_named(args.engine, "--engine", **options)
    # before training: a refused folder costs nothing
    check_results_folder(args.out, overwrite=args.overwrite)
    if args.save_model is not None:
        check_model_folder(args.save_model, overwrite=args.overwrite)
    job = Job(
        args.algorithm,
        args.data,
        epsilon=args.epsilon,
        delta=args.delta,
        noise_seed=args.noise_seed,
        params=params,
        data_options=parse_overrides(args.data_options, field="--data-opt"),
    )
    outcome = job.prepare().execute(engine, progress=not args.quiet)
    if args.save_model is not None and outcome.model is None:
        raise ConfigError(f"{args.algorithm} releases no shared item model to save", field="--save-model")
    write_outputs(args.out, outcome.report.to_json(), outcome.ledger)
    if args.save_model is not None:
        outcome.model.save(args.save_model, overwrite=args.overwrite)
    if not args.quiet:  # the human summary (every engine the same) on stderr; stdout keeps the JSON line
        print(outcome.report.summary(out=str(args.out.rstrip("/") + "/metrics.json")), file=sys.stderr)
    _print_summary(outcome.report.to_json())
    try:  # a run trained on what a minority of its replies sent fails (its outputs stay for the diagnosis)
        check_rejections(outcome.report, limit)
    except TooManyRejected as exc:
        print(f"fedpriv: error: {exc}", file=sys.stderr)
        return 3
    return 0


def _recommend(args) -> int:
    from .run.model import load_model, read_user_ratings

    model = load_model(args.model)
    if not hasattr(model, "recommend"):
        raise ConfigError(
            f"{args.model} is a personalization model ({model.algorithm}): it has no item catalogue to recommend from; "
            "in Python, load_model(DIR).personalize(X, y) solves a user's vector and .predict(X, v) predicts",
            field="--model",
        )
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
    rated = model.predicts_ratings  # a top-k model ranks items: no rating column
    print(f"{'rank':>4}  {'item':>{width}}  {'score':>7}  " + (f"{'rating':>6}  " if rated else "") + "name")
    for rank, r in enumerate(recs, 1):
        print(
            f"{rank:>4}  {r['item']!s:>{width}}  {r['score']:7.3f}  "
            + (f"{r['rating']:6.2f}  " if rated else "")
            + f"{r['name'] or ''}"
        )
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
    from .privacy.target import ADD_REMOVE, REPLACE_ONE

    plan = api.plan(
        args.algorithm,
        epsilon=args.epsilon,
        delta=args.delta,
        rating_range=(lo, hi),
        implicit=args.implicit,
        tuning=tuning,
        relation=REPLACE_ONE if args.deployment else ADD_REMOVE,
        **overrides,
    )
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.to_markdown(), end="" if not args.json else "\n")
    return 0


def _print_summary(metrics: dict) -> None:
    keys = [k for k in metrics if k.startswith(("test_", "valid_")) and not k.endswith("sliced")]
    summary = {k: metrics[k] for k in ("algorithm", "dataset", "epsilon", "epsilon_spent", *keys, "wall_seconds")}
    if "recommendation" in metrics:
        rec = metrics["recommendation"]
        summary["recommendation"] = {
            k: rec.get(k)
            for k in ("mechanism", "epsilon", "mse_to_best", "hit_rate", "argmax_hit_rate", "uniform_hit_rate")
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
