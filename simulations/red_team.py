"""Red-team check: the known attacks on a default run's outputs, on a node's view of the
messages and on the server's view of the replies. It prints, per attack, what it recovers.

The run: ``--algorithm`` at ``--epsilon`` on ``--data`` (a generated set is written in the
ML-100K layout and read back through the real loader), over an in-process Flower grid
(:class:`fedpriv.testing.local_grid.LocalGrid`, the real ServerApp loop and ClientApp) whose
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
   change). Runs: ``--neighbour-algorithms``, each ``ALG`` or ``ALG+KEY[=VALUE]...`` (e.g.
   ``adadpals+bias_stage``: the bias stage and its "bias" release; ``bias``: the private bias
   model; ``adadpals+defaults=noise-aware``: the rule's own choice, on small data the bias model
   alone). ``unmeasured`` lists planned releases the runs did not measure (must be empty).
3. Sample inference (DP-SGD). The attacker predicts each round's Poisson sample from public
   values: the per-(round, user) hash of the published seed and the dense user index that
   fedpriv used before issue 15, and ``RunSecrets(seed)`` keys for every published integer.
   Compared with the sample the users really drew: precision against the chance level q.
4. The server's view (``--aggregation central|secure``: only this check runs). ONE USER PER
   NODE: D is ``--data`` restricted to the ``--nodes`` users with the smallest raw ids, D' the
   same users with one user's data changed (half its ratings removed, the rest set to other
   values), both through the loader. Three runs (A1, A2 on D, B on D') with the same noise seed
   (the ledger noise and the nodes' noise shares fixed; secure aggregation's masks, keys and
   neighbour graph are fresh OS randomness each run) record every reply the server receives
   (``LocalGrid(reply_observer=...)``), by message type, round (the server's round log) and
   partition. A reply entry (config or array entry, by record and key) equal in A1 and A2 but
   different in B is a per-node value the server sees in plaintext (deterministic given the
   data); entries that differ between A1 and A2 are random (masks, keys, ciphertexts). The
   same rule on each reply's size (bytes as the round counters measure them, with random
   bytes counted by their length) lists the data-dependent sizes. Also the epsilon that holds
   against a node knowing its own noise share
   (:func:`fedpriv.privacy.accounting.epsilon_vs_colluders` of the run's ledger). Central
   mode is the positive control: its trusted server sees every node's clipped sums. Caveat:
   a node's local-DP output (the recommendation's picks) is drawn from keys the fixed noise
   seed fixes too; if it moves between D and D' it is listed, though it is a noised release.
   Prints one JSON line: ``server_plaintext_fields``, ``data_dependent_sizes``,
   ``epsilon_vs_one_node``, ``epsilon_target``; ``--out`` writes the whole report (by
   partition, the random entries, rounds that did not line up). ``--set KEY=VALUE``: config
   overrides of its runs (e.g. ``rank=2 steps=1`` for a factor step, ``recommend=mgem``).

    python simulations/red_team.py --data synthetic-mf:users=300,items=120,ratings=9000,seed=3 --out results/red_team.json
    python simulations/red_team.py --data ml-100k:../shared/data/ml-100k/ml-100k.zip --epsilon 1 --aggregation secure --nodes 24

Exit status 1 when any attack recovers something (``--noise-seed`` makes the run reproducible:
attack 1 then recovers the noise when that seed is published, a check of its power); with
``--aggregation``, when either list is non-empty or ``epsilon_vs_one_node`` exceeds the target
(``--epsilon``; with a recommendation phase, the RDP epsilon its records claim) by over 0.1%.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedpriv.algorithms import als, dpsgd  # noqa: E402
from fedpriv.algorithms.shards import shard_users  # noqa: E402
from fedpriv.data.export import write_interactions_ml100k, write_ml100k  # noqa: E402
from fedpriv.data.loaders import load_dataset  # noqa: E402
from fedpriv.data.spec import load_spec, parse_data_spec  # noqa: E402
from fedpriv.data.splits import random_split  # noqa: E402
from fedpriv.engine.inprocess import train_inprocess  # noqa: E402
from fedpriv.flower import codec  # noqa: E402
from fedpriv.testing.local_grid import LocalGrid  # noqa: E402
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
#: attack 2's default runs: the factor models, DP-SGD, the private bias model and AdaDPALS with
#: its bias stage (the noise-aware defaults' usual choice: the "bias" release, then the steps)
NEIGHBOUR_ALGORITHMS = ("adadpals", "adadpals+bias_stage", "adadpals+defaults=noise-aware", "bias", "dpals-uniform", "dpals-tail", "dpsgd", "am-ssp", "am-dpsgd")
#: the small run of attack 2 (every algorithm that reads a key and does not fix it)
RENUMBERING_BASE = {"rank": "4", "steps": "2", "sgd_sampling_rate": "0.2"}


def neighbour_config(entry: str) -> tuple[str, als.ALSConfig]:
    """``ALG`` or ``ALG+KEY[=VALUE]...`` (``+KEY`` alone: KEY=true) -> (algorithm, config).
    The config is :data:`RENUMBERING_BASE` on the engine's fixed defaults (no bias stage, no
    noise-aware rule), plus the entry's keys; an algorithm defined by its own fixed defaults
    (``bias``: rank 0) starts from them instead (its noise-aware rule included), with the base
    keys it reads and does not set itself."""
    from fedpriv.algorithms import registry

    algorithm, *mods = entry.split("+")
    extra = {}
    for m in mods:
        key, eq, value = m.partition("=")
        extra[key.strip()] = value.strip() if eq else "true"
    spec = registry.get(algorithm)
    if not spec.fixed:
        return algorithm, als.ALSConfig.from_overrides({**RENUMBERING_BASE, **extra})
    own = dict(spec.defaults)
    base = {k: v for k, v in RENUMBERING_BASE.items() if k not in own and (registry.readers(k) is None or algorithm in registry.readers(k))}
    return algorithm, als.ALSConfig.from_overrides({**base, **extra}, algorithm)


def renumbering(ds_d, folder: Path, algorithms: list[str], epsilon: float) -> dict:
    """Attack 2 over ``algorithms`` (entries of :func:`neighbour_config`). Per entry: each
    release's largest exact-sum move over its declared sensitivity, ``holds`` (every move
    within 1) and ``unmeasured``: releases the run planned (its final config) that the
    neighbouring runs did not measure (must be empty, else the check was vacuous there)."""
    inter = ds_d.interactions
    target = int(np.min(inter.user_ids[np.unique(inter.users)]))
    # both sides written in the same layout (the same public item metadata) and read back
    ds_d = load_dataset("ml-100k", write_interactions_ml100k(folder / "D_full", inter), rating_range=ds_d.rating_range)
    ds_p = load_dataset("ml-100k", write_interactions_ml100k(folder / "D_prime", inter, without_user=target), rating_range=ds_d.rating_range)
    out: dict = {"removed_raw_user": target, "n_items": [int(inter.n_items), int(ds_p.interactions.n_items)]}
    secrets_seed = int.from_bytes(np.random.bytes(8), "little")  # only the secret randomness is fixed
    for entry in algorithms:
        algorithm, cfg = neighbour_config(entry)
        ledgers, final = [], None
        for ds in (ds_d, ds_p):
            # noise-aware runs: the run's budget on the ledger, so the rule (bias model, bias stage) chooses as in a real run
            budget = (epsilon, 1e-5) if cfg.defaults == "noise-aware" else None
            led = ReplayLedger(replay=ledgers[0] if ledgers else None, budget=budget)
            res = train_inprocess(algorithm, random_split(ds.interactions).train, cfg, rating_range=ds.rating_range, epsilon=epsilon,
                                  item_features=ds.item_features, progress=False, secrets=RunSecrets(secrets_seed), ledger=led)
            final = final or res.state.config  # the noise-aware rule's choice (the same on D', which replays D's count)
            ledgers.append(led)
        moved = influence(*ledgers)
        planned = {p.name for p in als.plan_releases(algorithm, final, False)}
        out[entry] = {"max_move_over_sensitivity": moved, "holds": all(v <= 1 + 1e-5 for v in moved.values()),
                      "unmeasured": sorted(planned - set(moved))}
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


# ---------------------------------------------------------------------------- the server's view
def one_user_per_node_sets(ds, n_nodes: int, folder: Path):
    """D: the data set restricted to the ``n_nodes`` users with the smallest raw ids; D': the
    same users, but the one with the most ratings (``target``) has every other rating of its
    (by raw item id) removed and the rest set to another value (lo + hi - r, or hi for the
    middle). Both written in the ML-100K layout (the whole item catalogue) and read back through
    the real loader with D's rating range, so users, items and partitions line up."""
    inter = ds.interactions
    raw_u = np.asarray(inter.user_ids)[inter.users]
    raw_i = np.asarray(inter.item_ids)[inter.items]
    ratings = np.asarray(inter.ratings, dtype=np.float64)
    chosen = np.unique(raw_u)[:n_nodes]
    if len(chosen) < 2:
        raise ValueError(f"the server-view check needs at least 2 users with ratings, the data has {len(chosen)}")
    keep = np.isin(raw_u, chosen)
    raw_u, raw_i, ratings = raw_u[keep], raw_i[keep], ratings[keep]
    ids, n_of = np.unique(raw_u, return_counts=True)
    target = int(ids[np.argmax(n_of)])
    mine = np.flatnonzero(raw_u == target)
    mine = mine[np.argsort(raw_i[mine], kind="stable")]
    drop, change = mine[1::2], mine[0::2]
    lo, hi = (float(x) for x in ds.rating_range)
    new = ratings.copy()
    flipped = lo + hi - ratings[change]
    new[change] = np.where(np.abs(flipped - ratings[change]) < 1e-9, hi, flipped)
    left = np.ones(len(raw_u), dtype=bool)
    left[drop] = False
    d = load_dataset("ml-100k", write_ml100k(folder / "D_nodes", raw_u, raw_i, ratings, inter.item_ids), rating_range=ds.rating_range)
    d_prime = load_dataset("ml-100k", write_ml100k(folder / "D_nodes_prime", raw_u[left], raw_i[left], new[left], inter.item_ids), rating_range=ds.rating_range)
    if d.interactions.n_users != d_prime.interactions.n_users or not np.array_equal(d.interactions.user_ids, d_prime.interactions.user_ids):
        raise AssertionError("D and D' do not hold the same users: the partitions would not line up")
    return d, d_prime, {"raw_user": target, "partition": int(np.flatnonzero(np.asarray(d.interactions.user_ids) == target)[0]),
                        "ratings": [int(len(mine)), int(len(mine) - len(drop))]}


_MISSING = ("<missing>",)


def _value(v):
    """A comparable form of one record entry (arrays: dtype, shape and bytes)."""
    if hasattr(v, "stype") and hasattr(v, "data"):  # flwr Array
        return ("array", str(v.dtype), tuple(v.shape), bytes(v.data))
    if isinstance(v, (bytes, bytearray)):
        return ("bytes", bytes(v))
    if isinstance(v, list):
        return ("list", tuple(_value(x) for x in v))
    return (type(v).__name__, v)


def _reply_view(reply) -> tuple[dict, dict, int | None, dict]:
    """What the server reads in one reply: {(record, key): value}, {record: its keys}, the
    payload size in bytes as the round counters measure it (:func:`fedpriv.flower.codec.payload_bytes`;
    None for an error reply), and per entry (that measure's bytes of it, the same with a bytes
    value counted by its length instead of its printed form)."""
    if reply.has_error():
        fields = {("error", "code"): _value(int(reply.error.code)), ("error", "reason"): _value(str(reply.error.reason))}
        return fields, {"error": frozenset(("code", "reason"))}, None, {}
    content = reply.content
    fields, keys, entry_bytes = {}, {}, {}
    for rec_name, rec in content.array_records.items():
        keys[rec_name] = frozenset(rec)
        for k, a in rec.items():
            fields[(rec_name, k)] = _value(a)
            entry_bytes[(rec_name, k)] = (len(a.data), len(a.data))
    for group in (content.config_records, content.metric_records):
        for rec_name, rec in group.items():
            keys[rec_name] = frozenset(rec)
            for k, v in rec.items():
                fields[(rec_name, k)] = _value(v)
                printed = len(str(k)) + len(str(v))
                entry_bytes[(rec_name, k)] = (printed, len(str(k)) + len(v) if isinstance(v, (bytes, bytearray)) else printed)
    size = codec.payload_bytes(content)
    if content.metric_records:  # not counted by the round counters, but the server receives them
        size += sum(entry_bytes[(r, k)][0] for r, rec in content.metric_records.items() for k in rec)
    return fields, keys, size, entry_bytes


def server_view_run(algorithm: str, ds, epsilon: float, noise_seed: int, overrides: dict, work_dir: Path, delta: float = 1e-5, client_app=None) -> dict:
    """One run over the in-process grid, one user per node, recording every reply the server
    receives by round (message type, round name from the server's round log, occurrence) and
    partition; returns the replies, the run's ledger records and its metrics. ``client_app``: the
    nodes' app (default fedpriv's ClientApp; tests pass a leaking one to check the attack's power)."""
    calls: list[str] = []  # the message type of every round sent (one send_and_receive each)
    got: list = []  # (call index, node id, fields, keys, size, bytes per entry)
    box: dict = {}

    def on_round(grid, message_type):
        if message_type != "get_node_ids":
            calls.append(message_type)

    def on_reply(nid, reply):
        got.append((len(calls) - 1, nid, *_reply_view(reply)))

    def runner(job, n):
        grid = LocalGrid(n, client_app=client_app, on_round=on_round, reply_observer=on_reply)
        box["grid"] = grid
        box["result"] = res = run_job(grid, job)
        return res

    metrics, _ = run(algorithm, "ml-100k:loaded", epsilon=epsilon, delta=delta, dataset=ds, engine="flower", progress=False,
                     overrides={**overrides, "users_per_node": "1"}, noise_seed=noise_seed, flower_runner=runner, work_dir=work_dir,
                     second_opinion=False)
    res, grid = box["result"], box["grid"]
    # the round names of the server's log: one entry per round; a round asking no node sends nothing
    names = [r["round"] for r in res.round_log if r.get("nodes", 1) > 0]
    if len(names) != len(calls):
        names = [f"#{calls[:i].count(t)}" for i, t in enumerate(calls)]
    seen: dict = {}
    rounds = []
    for t, name in zip(calls, names):
        k = seen[(t, name)] = seen.get((t, name), -1) + 1
        rounds.append((t, name, k))
    replies = {}
    for i, nid, fields, keys, size, entry_bytes in got:
        replies[(rounds[i], grid.partition[nid])] = {"fields": fields, "keys": keys, "size": size, "entry_bytes": entry_bytes}
    records = [*res.ledger.releases, *(res.rec_ledger.releases if res.rec_ledger is not None else [])]
    return {"replies": replies, "rounds": rounds, "records": records, "metrics": metrics}


def _random_entries(ra: list[dict]) -> set:
    """The entries of one reply that are random: present in two runs on D (``ra``: the reply in
    each run on D) with different values, or in a record whose key set differs between runs on
    D (keys named by random neighbours)."""
    r1 = ra[0]
    out = {e for r in ra[1:] for e in set(r1["fields"]) & set(r["fields"]) if r1["fields"][e] != r["fields"][e]}
    for r in ra:
        out |= {e for e in r["fields"] if _random_record(ra, e[0])}
    return out


def _random_record(ra: list[dict], record: str) -> bool:
    return any(ra[0]["keys"].get(record) != r["keys"].get(record) for r in ra[1:])


def _size_without_printed_noise(r: dict, random_entries: set, ra: list[dict]):
    """The reply's size with each random bytes entry (``random_entries``, or any entry of a
    record whose keys differ between the runs on D, ``ra``) counted by its length, not by its
    printed form (whose length varies with the random bytes themselves)."""
    if r["size"] is None:
        return None
    return r["size"] - sum(printed - raw for e, (printed, raw) in r["entry_bytes"].items() if e in random_entries or _random_record(ra, e[0]))


def compare_views(a1: dict, a2: dict, b: dict, *more: dict) -> dict:
    """The attack on the server's view: a reply entry (or size) equal in the runs on D
    (``a1``, ``a2`` and ``more``: deterministic given the data) but different in the run on D'
    carries a per-node value. Entries that differ between runs on D (masks, keys, ciphertexts)
    are random and left out; the presence of an entry is compared only in records whose key set
    is the same in every run on D. Sizes: the counters' measure, each random bytes entry counted
    by its length. More runs on D make a random value less likely to repeat by chance (a random
    neighbour set drawn twice alike)."""
    fields: dict[str, set] = {}
    sizes: dict[str, set] = {}
    random_names: set[str] = set()
    d_runs = [a1, a2, *more]
    unaligned = sorted({f"{t}:{n}#{k}" for a in (a2, *more, b) for (t, n, k) in set(a1["rounds"]) ^ set(a["rounds"])})
    for key in sorted(set(b["replies"]).intersection(*(a["replies"] for a in d_runs)), key=str):
        (t, name, k), part = key
        ra, rb = [a["replies"][key] for a in d_runs], b["replies"][key]
        r1 = ra[0]
        rand = _random_entries(ra)
        random_names |= {f"{t}:{rec}.{field}" for rec, field in rand}
        sa = [_size_without_printed_noise(r, rand, ra) for r in ra]
        sb = _size_without_printed_noise(rb, rand, ra)
        if len(set(sa)) == 1 and sa[0] != sb:
            sizes.setdefault(f"{t}:{name}" + (f"#{k}" if k else ""), set()).add(part)
        for entry in set(rb["fields"]).union(*(r["fields"] for r in ra)) - rand:
            if _random_record(ra, entry[0]):
                continue  # an entry of a record whose keys are random, present on D' only
            v1, vb = r1["fields"].get(entry, _MISSING), rb["fields"].get(entry, _MISSING)
            if vb != v1:  # (v1 == v2 here: a deterministic entry, or one absent in both runs on D)
                fields.setdefault(f"{t}:{entry[0]}.{entry[1]}", set()).add(part)
    return {
        "server_plaintext_fields": sorted(fields),
        "data_dependent_sizes": sorted(sizes),
        "fields_by_partition": {k: sorted(v) for k, v in sorted(fields.items())},
        "sizes_by_partition": {k: sorted(v) for k, v in sorted(sizes.items())},
        "random_fields": sorted(random_names),
        "unaligned_rounds": unaligned,
    }


def server_view(data: str, *, aggregation: str = "secure", algorithm: str = "adadpals", epsilon: float = 1.0, nodes: int = 24,
                overrides: dict | None = None, noise_seed: int | None = None, delta: float = 1e-5, client_app=None, d_runs: int = 2) -> dict:
    """Does the server's view of a run leak a per-node value? Runs with one user per node
    (``d_runs`` runs A1, A2, ... on D, B on the neighbouring D' of :func:`one_user_per_node_sets`), all with the same
    reproducible noise (ledger noise and node noise shares fixed; secure aggregation's masks,
    keys and neighbour graph fresh OS randomness each run), compared by :func:`compare_views`.
    Also the epsilon that holds against a node that knows its own noise share
    (:func:`fedpriv.privacy.accounting.epsilon_vs_colluders` of the run's ledger)."""
    from fedpriv.privacy.accounting import epsilon_vs_colluders

    overrides = {**dict(overrides or {}), "aggregation": aggregation}
    seed = noise_seed if noise_seed is not None else int.from_bytes(os.urandom(7), "little")  # fixed for the three runs only
    with tempfile.TemporaryDirectory(prefix="fedpriv-server-view-") as tmp:
        folder = Path(tmp)
        d, d_prime, changed = one_user_per_node_sets(dataset_through_loader(data, folder), nodes, folder)
        sets = [(f"A{i + 1}", d) for i in range(max(2, int(d_runs)))] + [("B", d_prime)]
        runs = {name: server_view_run(algorithm, ds, epsilon, seed, overrides, folder / name, delta, client_app) for name, ds in sets}
    out = compare_views(*[runs[name] for name, _ in sets if name != "B"][:2], runs["B"], *[runs[name] for name, _ in sets if name not in ("A1", "A2", "B")])
    eps = max(epsilon_vs_colluders(r["records"], delta, colluders=1) for r in runs.values())
    # the target: the asked epsilon; with a recommendation phase (its own budget on top), the RDP
    # epsilon the run's records claim, by the same accountant as epsilon_vs_colluders
    target = float(epsilon)
    if runs["A1"]["metrics"].get("recommendation"):
        from fedpriv.privacy.accounting import epsilon_rdp

        target = max(epsilon_rdp(r["records"], delta) for r in runs.values())
    return {
        "server_plaintext_fields": out["server_plaintext_fields"],
        "data_dependent_sizes": out["data_dependent_sizes"],
        "epsilon_vs_one_node": eps,
        "epsilon_target": target,
        "leaks": bool(out["server_plaintext_fields"] or out["data_dependent_sizes"] or eps > target * (1 + 1e-3)),
        "detail": {
            "data": data, "aggregation": aggregation, "algorithm": algorithm, "nodes": int(d.interactions.n_users), "changed_user": changed,
            "config": {k: runs["A1"]["metrics"]["config"].get(k) for k in ("rank", "steps", "bias_stage", "defaults")},
            "replies_per_run": {k: len(r["replies"]) for k, r in runs.items()},
            **{k: out[k] for k in ("fields_by_partition", "sizes_by_partition", "random_fields", "unaligned_rounds")},
        },
    }


# ---------------------------------------------------------------------------- script
def red_team(data: str, *, algorithm: str = "adadpals", epsilon: float = 1.0, noise_seed: int | None = None, small_seeds: int = 2000,
             neighbour_algorithms=("adadpals", "adadpals+bias_stage", "bias", "dpals-uniform", "dpsgd"), users_per_node: int = 5) -> dict:
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
    p.add_argument("--noise-seed", type=int, default=None, help="make the attacked run reproducible (a power check of attack 1); "
                   "with --aggregation, the noise seed of the three runs (default: a fresh one)")
    p.add_argument("--small-seeds", type=int, default=2000, help="also try the seeds 0..N")
    p.add_argument("--neighbour-algorithms", nargs="+", default=list(NEIGHBOUR_ALGORITHMS),
                   help="attack 2's runs: ALG or ALG+KEY[=VALUE]... (e.g. adadpals+bias_stage)")
    p.add_argument("--aggregation", choices=("central", "secure"), default=None,
                   help="run only the server-view check (attack 4) in this aggregation mode; prints one JSON line")
    p.add_argument("--nodes", type=int, default=24, help="attack 4: users (= nodes, one user per node)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="attack 4: a config override of its runs")
    p.add_argument("--out", default=None)
    p.add_argument("--server", choices=("honest", "deviant"), default="honest",
                   help="deviant: a server that deviates from the protocol against the real node code (simulations/deviant_server.py); "
                        "one JSON line per deviation with the nodes' defence on, then the positive controls (defence off)")
    a = p.parse_args(argv)
    if a.server == "deviant":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from deviant_server import deviations

        lines = deviations(a.data, epsilon=a.epsilon, nodes=a.nodes, algorithm=a.algorithm)
        for line in lines:
            print(json.dumps(line, default=float), flush=True)
        return 0 if all(line["recovered"] != line["defence"] for line in lines) else 1
    if a.aggregation is not None:
        from fedpriv.run import parse_overrides

        report = server_view(a.data, aggregation=a.aggregation, algorithm=a.algorithm, epsilon=a.epsilon, nodes=a.nodes,
                             overrides=parse_overrides(a.overrides), noise_seed=a.noise_seed)
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(report, indent=2, default=float) + "\n")
        print(json.dumps({k: report[k] for k in ("server_plaintext_fields", "data_dependent_sizes", "epsilon_vs_one_node", "epsilon_target")}, default=float))
        return 1 if report["leaks"] else 0
    report = red_team(a.data, algorithm=a.algorithm, epsilon=a.epsilon, noise_seed=a.noise_seed, small_seeds=a.small_seeds, neighbour_algorithms=a.neighbour_algorithms)
    text = json.dumps(report, indent=2, default=float)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    print(text)
    return 1 if report["recovered_anything"] else 0


if __name__ == "__main__":
    sys.exit(main())
