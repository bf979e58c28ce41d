"""Fingerprints of seeded runs: for every algorithm on every engine, a digest of its ledger
records, its released model and its ``metrics.json`` (times left out, and byte counts: the secure rounds' key material is fresh in every run). A restructuring that
changes no number keeps every digest: ``python scripts/fingerprints.py > before.json``, change,
``python scripts/fingerprints.py --compare before.json``.

The in-process engine runs every algorithm (central and secure aggregation, a recommendation and a
private tuning); the Flower simulation runs one member of each family and the secure path."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

RATINGS = "synthetic-mf:users=120,items=40,ratings=2400,seed=3"
FEATURES = RATINGS  # synthetic-mf carries public item features
PERSONAL = "synthetic-personal:users=60,samples=12,d=4,k=2,noise=0.1,seed=2"
TIME_KEYS = {"timings", "wall_seconds", "seconds", "elapsed_seconds"}


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIME_KEYS and not k.endswith("_seconds") and not k.startswith("bytes")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _digest(obj) -> str:
    h = hashlib.sha256()
    if isinstance(obj, np.ndarray):
        h.update(str(obj.dtype).encode() + str(obj.shape).encode() + np.ascontiguousarray(obj).tobytes())
    else:
        h.update(json.dumps(obj, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _state_digest(state) -> str:
    parts = []
    for name in sorted(vars(state)):
        value = getattr(state, name)
        if isinstance(value, np.ndarray):
            parts.append((name, _digest(value)))
        elif isinstance(value, (int, float, str, bool, type(None))):
            parts.append((name, repr(value)))
    return _digest(parts)


def fingerprint(algorithm, data, engine, epsilon=2.0, **params) -> dict:
    from fedpriv.run import Job

    out = Job(algorithm, data, epsilon=epsilon, noise_seed=7, params=params).prepare().execute(engine, second_opinion=False)
    metrics = _strip(json.loads(json.dumps(out.report.to_json(), default=str)))
    return {"ledger": _digest(out.ledger), "state": _state_digest(out.state), "metrics": _digest(metrics)}


def cases():
    from fedpriv.algorithms import registry
    from fedpriv.run import FlowerSimulation, InProcess

    small = {"rank": 3, "steps": 2}
    for name in registry.names():
        spec = registry.get(name)
        data = FEATURES if spec.encoder else RATINGS
        extra = {} if name in ("popular", "bias", "topk", "ease", "topk-lowrank") else dict(small)
        yield f"inprocess/{name}", (name, data, InProcess(), {**extra})
    yield "inprocess/adadpals-secure", ("adadpals", RATINGS, InProcess(), {**small, "aggregation": "secure"})
    yield "inprocess/adadpals-recommend", ("adadpals", RATINGS, InProcess(), {**small, "recommend": "rnm"})
    yield "inprocess/adadpals-tune", ("adadpals", RATINGS, InProcess(), {**small, "tune": "rank=2/3"})
    yield "inprocess/adadpals-heldout", ("adadpals", RATINGS, InProcess(), {**small, "split": "heldout"})
    from fedpriv.algorithms import pam

    for name in pam.PAM_ALGORITHMS:
        yield f"inprocess/{name}", (name, PERSONAL, InProcess(), {"epochs": 2})
    yield "inprocess/pam-secure", ("pam", PERSONAL, InProcess(), {"epochs": 2, "aggregation": "secure"})
    yield "flower/adadpals", ("adadpals", RATINGS, FlowerSimulation(users_per_node=30), dict(small))
    yield "flower/adadpals-secure", ("adadpals", RATINGS, FlowerSimulation(users_per_node=30), {**small, "aggregation": "secure"})
    yield "flower/am-ssp", ("am-ssp", FEATURES, FlowerSimulation(users_per_node=30), dict(small))
    yield "flower/topk", ("topk", RATINGS, FlowerSimulation(users_per_node=30), {})
    yield "flower/pam", ("pam", PERSONAL, FlowerSimulation(users_per_node=15), {"epochs": 2})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--compare", help="a JSON of earlier fingerprints: exit 1 on any difference")
    ap.add_argument("--only", default="", help="cases whose name contains this")
    args = ap.parse_args(argv)
    found = {}
    for key, (alg, data, engine, params) in cases():
        if args.only not in key:
            continue
        try:
            found[key] = fingerprint(alg, data, engine, **params)
        except Exception as exc:  # recorded: a case that fails must fail the same way
            found[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(key, found[key], file=sys.stderr, flush=True)
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        diff = {k: (before.get(k), v) for k, v in found.items() if before.get(k) != v}
        print(json.dumps(diff, indent=1))
        return 1 if diff else 0
    print(json.dumps(found, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
