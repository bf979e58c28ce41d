"""Red-team check: the known attacks on a default run's outputs and on a node's view of the
messages. It prints, per attack, what it recovers.

The run: ``--algorithm`` at ``--epsilon`` on ``--data`` (a generated set is written in the
ML-100K layout and read back through the real loader), over an in-process Flower grid
(:class:`fedpriv.flower.local_grid.LocalGrid`, the real ServerApp loop and ClientApp) whose
observer keeps every message a node receives. Published: ``metrics.json``, ``ledger.json`` and
those messages.

1. Noise regeneration. Every integer found in the published text (and 0..``--small-seeds``) is
   tried as a seed of the noise generator, as the ledger would use it (``PCG64(seed)``) and as a
   ``--noise-seed`` would (``RunSecrets(seed)``). With the regenerated noise subtracted from the
   released item counts (a node sees them in the broadcast), the attack recovers the exact
   counts when the residual is at rounding level.
2. Renumbering. D' = D minus the user with the smallest raw id, through the loader (every other
   user renumbered), the same job with only the secret randomness fixed: the largest move of each
   release's exact sum, over its declared sensitivity (> 1: the removed user was not the only
   change). Algorithms: ``--neighbour-algorithms``.
3. Sample inference (DP-SGD). The attacker predicts each round's Poisson sample from public
   values: the per-(round, user) hash of the published seed and the dense user index that
   fedpriv used before issue 15, and ``RunSecrets(seed)`` keys for every published integer.
   Compared with the sample the users really drew: precision against the chance level q.

    python simulations/red_team.py --data synthetic-mf:users=300,items=120,ratings=9000,seed=3 --out results/red_team.json

Exit status 1 when any attack recovers something (``--noise-seed`` makes the run reproducible:
attack 1 then recovers the noise when that seed is published, a check of its power).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedpriv.algorithms import als, dpsgd  # noqa: E402
from fedpriv.algorithms.shards import shard_users  # noqa: E402
from fedpriv.data.export import write_interactions_ml100k  # noqa: E402
from fedpriv.data.loaders import load_dataset  # noqa: E402
from fedpriv.data.spec import load_spec, parse_data_spec  # noqa: E402
from fedpriv.data.splits import random_split  # noqa: E402
from fedpriv.engine import train_inprocess  # noqa: E402
from fedpriv.flower.local_grid import LocalGrid  # noqa: E402
from fedpriv.flower.server_app import run_job  # noqa: E402
from fedpriv.privacy.neighbours import ReplayLedger, influence  # noqa: E402
from fedpriv.privacy.randomness import RunSecrets, user_keys  # noqa: E402
from fedpriv.run import run  # noqa: E402

_INT = re.compile(r"(?<![\w.])-?\d{1,19}(?![\w.])")
_SPLITMIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


# ---------------------------------------------------------------------------- the published run
def dataset_through_loader(data: str, folder: Path):
    """The data set as the real loader reads it (generated sets are written out first)."""
    spec = parse_data_spec(data)
    if spec.path is not None:
        return load_dataset(spec.kind, spec.path)
    ds = load_spec(spec)
    return load_dataset("ml-100k", write_interactions_ml100k(folder / "D", ds.interactions))


def published_run(algorithm: str, ds, epsilon: float, noise_seed: int | None, users_per_node: int) -> dict:
    """A run over the in-process grid; returns metrics, ledger and every message a node got."""
    seen: list = []

    def observer(node, msg):
        cfg = msg.content.config_records
        arrays = msg.content.array_records
        seen.append({"type": msg.metadata.message_type, "config": {k: dict(v) for k, v in cfg.items()}, "arrays": {k: {n: a.numpy() for n, a in rec.items()} for k, rec in arrays.items()}})

    metrics, ledger = run(
        algorithm, "ml-100k:loaded", epsilon=epsilon, dataset=ds, engine="flower", progress=False,
        # one factor step: the run releases item counts (the attack's target) whatever the rule picks
        overrides={"users_per_node": str(users_per_node), "steps": "1"}, noise_seed=noise_seed,
        flower_runner=lambda job, n: run_job(LocalGrid(n, observer=observer), job),
    )
    return {"metrics": metrics, "ledger": ledger, "messages": seen}


def published_integers(pub: dict, small: int) -> list[int]:
    text = json.dumps(pub["metrics"]) + json.dumps(pub["ledger"]) + json.dumps([m["config"] for m in pub["messages"]], default=str)
    found = {int(t) for t in _INT.findall(text) if abs(int(t)) < 2**63}
    return sorted(found | set(range(small + 1)))


# ---------------------------------------------------------------------------- attack 1
def noise_regeneration(pub: dict, train, cfg: als.ALSConfig, candidates: list[int]) -> dict:
    """Subtract regenerated noise from the released counts; recovered when the rest is exact."""
    records = {r["name"]: r for r in pub["ledger"]}
    if "counts" not in records:
        return {"applicable": False, "why": "the run releases no item counts"}
    released = next((m["arrays"]["state"]["counts_hat"] for m in reversed(pub["messages"]) if "counts_hat" in m["arrays"].get("state", {})), None)
    if released is None:
        return {"applicable": False, "why": "no node saw released counts"}
    exact = als.client_counts(shard_users(train), cfg, train.n_items, True)
    order = [(name, size) for name, size in (("users", 1), ("mean", 2), ("counts", train.n_items)) if name in records]
    best = (math.inf, None, None)
    for seed in candidates:
        for how, make in (("PCG64(seed)", lambda s: np.random.Generator(np.random.PCG64(abs(s)))),
                          ("RunSecrets(seed)", lambda s: np.random.Generator(np.random.PCG64(RunSecrets(s).ledger_seed())))):
            rng = make(seed)
            noise = {name: rng.normal(0.0, records[name]["noise_std"], size=size) for name, size in order}
            residual = float(np.max(np.abs(released - noise["counts"] - exact)))
            if residual < best[0]:
                best = (residual, seed, how)
    std = records["counts"]["noise_std"]
    return {
        "applicable": True,
        "candidates": len(candidates),
        "noise_std": std,
        "best_residual": best[0],
        "best_residual_over_noise_std": best[0] / std,
        "best_candidate_kind": best[2],
        "recovered": best[0] < 1e-6 * max(1.0, std),
    }


# ---------------------------------------------------------------------------- attack 2
def renumbering(ds_d, folder: Path, algorithms: list[str], epsilon: float) -> dict:
    inter = ds_d.interactions
    target = int(np.min(inter.user_ids[np.unique(inter.users)]))
    # both sides written in the same layout (the same public item metadata) and read back
    ds_d = load_dataset("ml-100k", write_interactions_ml100k(folder / "D_full", inter), rating_range=ds_d.rating_range)
    ds_p = load_dataset("ml-100k", write_interactions_ml100k(folder / "D_prime", inter, without_user=target), rating_range=ds_d.rating_range)
    out: dict = {"removed_raw_user": target, "n_items": [int(inter.n_items), int(ds_p.interactions.n_items)]}
    cfg = als.ALSConfig(rank=4, steps=2, sgd_sampling_rate=0.2)
    secrets_seed = int.from_bytes(np.random.bytes(8), "little")  # only the secret randomness is fixed
    for algorithm in algorithms:
        ledgers = []
        for ds in (ds_d, ds_p):
            led = ReplayLedger(replay=ledgers[0] if ledgers else None)
            train_inprocess(algorithm, random_split(ds.interactions).train, cfg, rating_range=ds.rating_range, epsilon=epsilon,
                            item_features=ds.item_features, progress=False, secrets=RunSecrets(secrets_seed), ledger=led)
            ledgers.append(led)
        moved = influence(*ledgers)
        out[algorithm] = {"max_move_over_sensitivity": moved, "holds": all(v <= 1 + 1e-5 for v in moved.values())}
    out["recovered"] = not all(v["holds"] for k, v in out.items() if isinstance(v, dict))
    return out


# ---------------------------------------------------------------------------- attack 3
def _old_hash(seed: int, a: np.ndarray) -> np.ndarray:
    """The per-(round, user) hash fedpriv used before issue 15 (public seed, dense user id)."""
    g, m1, m2 = (np.uint64(c) for c in _SPLITMIX)
    with np.errstate(over="ignore"):
        x = np.uint64(seed % 2**64) * g
        x = x ^ (np.asarray(a, dtype=np.uint64) * m1)
        x = x + g
        x = (x ^ (x >> np.uint64(30))) * m1
        x = (x ^ (x >> np.uint64(27))) * m2
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def sample_inference(ds, candidates: list[int], rounds: int, q: float, epsilon: float, noise_seed: int | None = None) -> dict:
    train = random_split(ds.interactions).train
    cfg = als.ALSConfig(rank=3, steps=rounds, sgd_sampling_rate=q)
    secrets = RunSecrets(noise_seed)  # the run's secrets: the harness holds them to know the truth
    res = train_inprocess("dpsgd", train, cfg, rating_range=ds.rating_range, epsilon=epsilon, progress=False, secrets=secrets)
    shard = shard_users(train, keys=user_keys(secrets.client_key(), train.user_ids))
    actual = np.stack([dpsgd.sampled_users(shard, res.state, r) for r in range(rounds)])
    best = {"precision": 0.0}
    dense = np.arange(train.n_users)
    for seed in candidates:
        guesses = {
            "old public hash": np.stack([_old_hash(seed * 1_000_003 + r, dense) < q for r in range(rounds)]),
            "RunSecrets(seed) keys": np.stack([dpsgd.sampled_users(shard_users(train, keys=user_keys(RunSecrets(seed).client_key(), train.user_ids)), res.state, r) for r in range(rounds)]),
        }
        for how, guess in guesses.items():
            n = int(guess.sum())
            if n == 0:
                continue
            precision = float((guess & actual).sum()) / n
            if precision > best["precision"]:
                best = {"precision": precision, "predicted": n, "seed_kind": how}
    # the best of 2 x len(candidates) guessers: a Bonferroni-corrected one-sided level of 1e-3
    n = max(best.get("predicted", 1), 1)
    z = NormalDist().inv_cdf(1 - 1e-3 / (2 * len(candidates)))
    threshold = q + z * math.sqrt(q * (1 - q) / n)
    return {**best, "chance": q, "threshold": threshold, "rounds": rounds, "users": int(train.n_users), "recovered": best["precision"] > threshold}


# ---------------------------------------------------------------------------- script
def red_team(data: str, *, algorithm: str = "adadpals", epsilon: float = 1.0, noise_seed: int | None = None, small_seeds: int = 2000,
             neighbour_algorithms=("adadpals", "dpals-uniform", "dpsgd"), users_per_node: int = 5) -> dict:
    with tempfile.TemporaryDirectory(prefix="fedpriv-red-team-") as tmp:
        folder = Path(tmp)
        ds = dataset_through_loader(data, folder)
        pub = published_run(algorithm, ds, epsilon, noise_seed, users_per_node)
        candidates = published_integers(pub, small_seeds)
        train = random_split(ds.interactions).train
        cfg = als.ALSConfig.from_overrides({k: v for k, v in pub["metrics"]["config"].items() if k in als.ALSConfig.__dataclass_fields__})
        report = {
            "data": data,
            "algorithm": algorithm,
            "epsilon": epsilon,
            "noise": pub["metrics"].get("noise"),
            "published": {"messages_seen_by_nodes": len(pub["messages"]), "integers_tried": len(candidates)},
            "noise_regeneration": noise_regeneration(pub, train, cfg, candidates),
            "renumbering": renumbering(ds, folder, list(neighbour_algorithms), epsilon),
            "sample_inference": sample_inference(ds, candidates, rounds=3, q=0.2, epsilon=epsilon, noise_seed=noise_seed),
        }
    report["recovered_anything"] = any(v.get("recovered", False) for v in report.values() if isinstance(v, dict))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="synthetic-mf:users=300,items=120,ratings=9000,seed=3")
    p.add_argument("--algorithm", default="adadpals")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--noise-seed", type=int, default=None, help="make the attacked run reproducible (a power check of attack 1)")
    p.add_argument("--small-seeds", type=int, default=2000, help="also try the seeds 0..N")
    p.add_argument("--neighbour-algorithms", nargs="+", default=["adadpals", "dpals-uniform", "dpals-tail", "dpsgd", "am-ssp", "am-dpsgd"])
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    report = red_team(a.data, algorithm=a.algorithm, epsilon=a.epsilon, noise_seed=a.noise_seed, small_seeds=a.small_seeds, neighbour_algorithms=a.neighbour_algorithms)
    text = json.dumps(report, indent=2, default=float)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    print(text)
    return 1 if report["recovered_anything"] else 0


if __name__ == "__main__":
    sys.exit(main())
