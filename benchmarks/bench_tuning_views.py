"""Utility of private tuning's three accountings at one reported epsilon (issue 41, item 2):
test RMSE on ML-100K of

* ``none``: no tuning, one run of the base config at epsilon;
* ``selected``: tuning accounted for the selected run with K hidden (repeat_and_select; the
  in-process engine);
* ``all``: tuning accounted for every run and K (repeat_and_compose; what a Flower node sees);
* ``select-then-run``: tuning hidden from the nodes (repeat_and_select at eps1) then one fresh
  run of the selected candidate at eps2, both composed to epsilon (what "nodes see only the
  selected run" would cost on Flower).

Runs in process (the Flower engine selects and trains as the in-process engine does under a
noise seed: tests/test_one_path.py). One JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import time

from fedpriv.run import InProcess, Job


def split_epsilon(algorithm: str, base: dict, tuning, epsilon: float, delta: float) -> tuple[float, float]:
    """(eps1, eps2): one common noise scale s for the hidden tuning (repeat-and-select, its runs at
    scale s) and the final run (at scale s), composed to ``epsilon`` (dp-accounting RDP)."""
    from fedpriv.algorithms.als import ALSConfig
    from fedpriv.algorithms.plans import budget_plan
    from fedpriv.privacy.accounting import _plan_releases, epsilon_rdp
    from fedpriv.privacy.records import RepeatAndSelect

    cfg = ALSConfig.from_overrides(dict(base), algorithm)
    tuned, plain = budget_plan(algorithm, cfg, epsilon, delta, tuning=tuning), budget_plan(algorithm, cfg, epsilon, delta)

    def parts(s):
        return [RepeatAndSelect("tuning", tuning.mean, tuning.shape, 0, tuple(_plan_releases(tuned.planned, s)))], _plan_releases(plain.planned, s)

    lo, hi = tuned.calibration.scale, 4 * tuned.calibration.scale
    for _ in range(14):
        mid = (lo * hi) ** 0.5
        a, b = parts(mid)
        if epsilon_rdp(a + b, delta) > epsilon:
            lo = mid
        else:
            hi = mid
    a, b = parts(hi)
    return epsilon_rdp(a, delta), epsilon_rdp(b, delta)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--grid", default="reg_item_private=0.5/5/50")
    ap.add_argument("--mean", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--variants", default="none,selected,all,select-then-run")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    from fedpriv.privacy.plan import TuningPlan

    base = dict(p.split("=", 1) for p in args.set)
    tune = {"tune": args.grid, "tune_mean": args.mean}
    for rep in range(args.first, args.first + args.repeats):
        for variant in args.variants.split(","):
            t0 = time.perf_counter()
            extra = {}
            if variant == "none":
                out = Job("adadpals", args.data, epsilon=args.epsilon, delta=args.delta, params=base).prepare().execute(InProcess())
            elif variant in ("selected", "all"):
                out = Job("adadpals", args.data, epsilon=args.epsilon, delta=args.delta, params={**base, **tune, "tune_view": variant}).prepare().execute(InProcess())
            else:
                eps1, eps2 = split_epsilon("adadpals", base, TuningPlan(mean=args.mean), args.epsilon, args.delta)
                sel = Job("adadpals", args.data, epsilon=eps1, delta=args.delta, params={**base, **tune}).prepare().execute(InProcess())
                chosen = {k: str(v) for k, v in sel.report["tuning"]["selected"].items()}
                out = Job("adadpals", args.data, epsilon=eps2, delta=args.delta, params={**base, **chosen}).prepare().execute(InProcess())
                extra = {"eps1": eps1, "eps2": eps2, "selected": chosen}
            m = out.report.to_json()
            print(json.dumps({"variant": variant, "repeat": rep, "epsilon": args.epsilon, "grid": args.grid, "mean_runs": args.mean,
                              "test_rmse": m.get("test_rmse"), "valid_rmse": m.get("valid_rmse"), "epsilon_spent": m.get("epsilon_spent"),
                              "selected": (m.get("tuning") or {}).get("selected"), "noise_multipliers": m.get("noise_multipliers"),
                              "seconds": round(time.perf_counter() - t0, 1), **extra}), flush=True)


if __name__ == "__main__":
    main()
