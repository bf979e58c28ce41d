"""Command line: ``fedpriv run ALGORITHM --data SPEC [--epsilon E --delta D] [--set k=v ...] --out DIR``.

``--engine inprocess`` (default) trains in this process; ``--engine flower`` runs the job with
``flwr run`` on Flower's local simulation runtime (:mod:`fedpriv.flower.launcher`)."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import FedprivError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedpriv", description="Federated user-level DP recommendation.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train and evaluate one algorithm on one data set")
    r.add_argument("algorithm", help="als, dpals-uniform, dpals-tail, adadpals, dpsgd, am-ssp, am-ssp1, am-ssp-convex, am-dpsgd")
    r.add_argument("--data", required=True, help="ml-100k:PATH, ml-1m:PATH, ml-10m:PATH, ml-20m:PATH, ml-latest:PATH, lastfm:PATH or synthetic-mf:users=N,items=M,ratings=R,seed=S")
    r.add_argument("--epsilon", type=float, default=None, help="target epsilon (private algorithms)")
    r.add_argument("--delta", type=float, default=1e-5)
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="hyperparameter or run option (repeatable)")
    r.add_argument(
        "--engine",
        default="inprocess",
        help="inprocess (default: this process) or flower (`flwr run` on Flower's local simulation runtime; "
        "its SuperLink is stopped when the job ends)",
    )
    r.add_argument("--nodes", type=int, default=None, help="flower engine: number of simulated nodes (default: ceil(training users / users-per-node))")
    r.add_argument("--users-per-node", type=int, default=None, help="flower engine: users held by each node (default 1)")
    r.add_argument("--secure-noise", action="store_true", help="draw all noise from the OS CSPRNG (runs are then not reproducible from --set seed=...)")
    r.add_argument("--out", required=True, help="output folder for metrics.json and ledger.json")
    r.add_argument("--quiet", action="store_true", help="no progress bar; flower engine: Flower's log is not shown")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
    except FedprivError as exc:
        print(f"fedpriv: error: {exc}", file=sys.stderr)
        return 2
    return 1


def _run(args) -> int:
    from .run import parse_overrides, run, write_outputs

    overrides = parse_overrides(args.overrides)
    if args.secure_noise:
        overrides["secure_noise"] = "true"
    if args.engine == "flower":
        from .flower.launcher import flwr_run

        metrics = flwr_run(
            args.algorithm,
            args.data,
            epsilon=args.epsilon,
            delta=args.delta,
            overrides=overrides,
            out=args.out,
            nodes=args.nodes,
            users_per_node=args.users_per_node,
            quiet=args.quiet,
        )
        _print_summary(metrics)
        return 0
    if args.nodes is not None:
        overrides["nodes"] = str(args.nodes)
    if args.users_per_node is not None:
        overrides["users_per_node"] = str(args.users_per_node)
    metrics, ledger = run(
        args.algorithm,
        args.data,
        epsilon=args.epsilon,
        delta=args.delta,
        overrides=overrides,
        engine=args.engine,
        progress=not args.quiet,
    )
    write_outputs(args.out, metrics, ledger)
    _print_summary(metrics)
    return 0


def _print_summary(metrics: dict) -> None:
    keys = [k for k in metrics if k.startswith(("test_", "valid_")) and not k.endswith("sliced")]
    summary = {k: metrics[k] for k in ("algorithm", "dataset", "epsilon", "epsilon_spent", *keys, "wall_seconds")}
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
