"""The papers' scale on a device: end-to-end private training on synthetic sets shaped like
ML-20M (136,677 users, 20,108 items, 10M ratings) and the Million Song Dataset (571,355 users,
41,140 items, 33.6M ratings), on ``--device`` (``cuda``) and, with ``--cpu``, on this machine's
CPU back end (the native kernel) for comparison.

    python benchmarks/gpu_scale.py --device cuda --cpu [--shape ml20m --shape msd] [--parity-shape ml20m] [--out DIR]

Each (shape, algorithm) prints one JSON line: the training time (the in-process engine's rounds:
every client's statistics, the ledger's noise on the CPU, the server's solves), the time per
alternating step (the default noise: OS entropy, drawn on the CPU's threads), the peak GPU
memory (torch's allocator), the bytes of one user's reply (the arrays of a one-user client step
for the user with most ratings: what a node of one user sends up, before encoding), and the
released epsilon (from the ledger). It also checks CPU/GPU parity: the two devices' ledger
records are identical, and on ``--parity-shape`` shapes, under one noise seed, ``max_rel_diff``
compares the released models (a seeded ledger draws its noise on one thread: slower).

Algorithms: ``adadpals`` at rank 32 with 3 alternating steps (fixed, the shape of the issue's
step figures), ``topk`` (EASE on the released co-occurrence of at most 2,000 head items) and
``topk-lowrank`` (the rank-32 sketch of the co-occurrence), at epsilon 5 (delta 1e-5)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "ml20m": dict(users=136_677, items=20_108, ratings=10_000_000),
    "msd": dict(users=571_355, items=41_140, ratings=33_600_000),
    "small": dict(users=20_000, items=3_000, ratings=600_000),  # a quick local check of this script
    "tiny": dict(users=1_000, items=300, ratings=20_000),  # the documentation's check (tests/test_doc_snippets.py)
}
RUNS = {
    "adadpals": dict(rank="32", steps="3", defaults="fixed"),
    "topk": dict(),
    "topk-lowrank": dict(),
}


def _reply_bytes(obj) -> int:
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (list, tuple)):
        return sum(_reply_bytes(x) for x in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_reply_bytes(getattr(obj, f)) for f in obj.__dataclass_fields__)
    return 0


def one_run(inter, algorithm: str, device_name: str, epsilon: float, seed: int | None) -> tuple[dict, object, list]:
    """One training run on ``device_name``; ``seed`` None: the default noise (OS entropy)."""
    import torch

    from fedpriv.algorithms import als, protocol
    from fedpriv.algorithms.shards import shard_users
    from fedpriv.engine.inprocess import train_inprocess
    from fedpriv.privacy.accounting import epsilon_spent
    from fedpriv.privacy.randomness import RunSecrets
    from fedpriv.util import device

    cfg = als.ALSConfig.from_overrides(dict(RUNS[algorithm]), algorithm)
    cuda = device_name.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    with device.use(device_name):
        res = train_inprocess(algorithm, inter, cfg, rating_range=(1.0, 5.0), epsilon=epsilon, delta=1e-5, progress=False, secrets=RunSecrets(noise_seed=seed))
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    steps = [round(s["client_seconds"] + s["aggregate_seconds"] + s["server_seconds"], 3) for s in res.timings.get("steps", [])]
    phases = [[round(s[k], 3) for k in ("client_seconds", "aggregate_seconds", "server_seconds")] for s in res.timings.get("steps", [])]
    one = shard_users(inter, np.array([int(np.argmax(np.bincount(inter.users)))]))  # the user with most ratings
    reply = protocol.client_step(one, res.state, 0, None) if res.state.spec.steps_of(res.state.config) else None
    row = {
        "algorithm": algorithm, "device": device_name, "rank": res.state.config.rank, "steps": res.state.spec.steps_of(res.state.config),
        "model": (res.state.choice or {}).get("model"),
        "train_seconds": round(seconds, 2), "setup_seconds": round(res.timings.get("setup_seconds", 0.0), 2), "step_seconds": steps,
        "client_aggregate_server_seconds": phases, "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
        "reply_bytes_busiest_user": _reply_bytes(reply), "busiest_user_ratings": int(one.n_ratings),
        "epsilon": round(epsilon_spent(res.ledger, 1e-5), 4),
    }
    return row, res.state, res.ledger.to_list()


def _model_of(state) -> np.ndarray:
    for key in ("item_item", "item_factors", "item_bias"):
        v = getattr(state, key, None)
        if v is not None and np.size(v):
            return np.asarray(v, dtype=np.float64)
    return np.zeros(0)


def compare(row: dict, inter, algorithm: str, a, shape: str, ledger: list) -> None:
    """The CPU figures beside the device's, and (``--parity-shape``) the seeded model parity."""
    cpu_row, _, cpu_ledger = one_run(inter, algorithm, "cpu", a.epsilon, seed=None)
    row["ledgers_identical"] = cpu_ledger == ledger  # the records (names, stds, counts): no noise value
    row["cpu_train_seconds"] = cpu_row["train_seconds"]
    row["cpu_step_seconds"] = cpu_row["step_seconds"]
    row["speedup"] = round(cpu_row["train_seconds"] / max(row["train_seconds"], 1e-9), 2)
    if shape in (a.parity_shape or []):
        _, state, seeded = one_run(inter, algorithm, a.device, a.epsilon, seed=11)
        _, cpu_state, cpu_seeded = one_run(inter, algorithm, "cpu", a.epsilon, seed=11)
        g, c = _model_of(state), _model_of(cpu_state)
        row["seeded_ledgers_identical"] = seeded == cpu_seeded
        row["max_rel_diff"] = float(np.max(np.abs(g - c)) / max(np.max(np.abs(c)), 1e-30)) if g.shape == c.shape and c.size else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), help="default: ml20m and msd")
    p.add_argument("--algorithm", action="append", choices=sorted(RUNS), help="default: all")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cpu", action="store_true", help="also run each on the CPU back end (its time and the parity checks)")
    p.add_argument("--parity-shape", action="append", choices=sorted(SHAPES), help="with --cpu: also run both devices under one noise seed on this shape and compare the released models")
    p.add_argument("--epsilon", type=float, default=5.0)
    p.add_argument("--out", default=None, help="also append the JSON lines to DIR/gpu_scale.jsonl")
    a = p.parse_args(argv)
    import fedpriv

    out = Path(a.out) / "gpu_scale.jsonl" if a.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)

    def emit(row: dict) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if out:
            with out.open("a") as f:
                f.write(line + "\n")

    for shape in a.shape or ["ml20m", "msd"]:
        s = SHAPES[shape]
        t = time.perf_counter()
        inter = fedpriv.load_data(f"synthetic-mf:users={s['users']},items={s['items']},ratings={s['ratings']},seed=1,select=1.5").interactions
        emit({"shape": shape, "users": inter.n_users, "items": inter.n_items, "ratings": int(len(inter.users)), "generate_seconds": round(time.perf_counter() - t, 1)})
        for algorithm in a.algorithm or list(RUNS):
            row, _, ledger = one_run(inter, algorithm, a.device, a.epsilon, seed=None)
            row["shape"] = shape
            if a.cpu:
                compare(row, inter, algorithm, a, shape, ledger)
            emit(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
