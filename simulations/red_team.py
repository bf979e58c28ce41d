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
   alone). ``unmeasured`` lists planned releases the runs did not measure, ``unmoved`` measured
   releases the removed user did not move (both must be empty). An algorithm that samples its
   users (DP-SGD, AM-DPSGD) removes instead the smallest raw id among the users its run on D
   really sampled (the real sampling code, the run's keys): a user never sampled moves nothing.
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
   data). An entry that differs between A1 and A2 is not dropped but decoded: it is listed too
   when its value in B is farther from its values on D than ``DECODE_FACTOR`` times its largest
   run-to-run move on D (``n_ratings + U(0, 1e-6)`` is caught; masks, keys and ciphertexts move
   as much between runs on D; a bytes entry is read as little-endian float64 words, so the same
   value packed as 8 raw bytes is caught too). The same rule as for entries on each reply's size (bytes as the
   round counters measure them, with random bytes counted by their length) lists the
   data-dependent sizes, and on the rounds (their number per message type and round name, and
   the replies of each) the data-dependent rounds. The noise actually added: a run N1 on D
   with fresh noise (no seed; each node holding A1's client key, so the users' choices are A1's)
   whose server replays A1's releases, so that every release has the same exact sum in A1 and
   N1: the variance of their differences against the ledger's std gives ``noise_ratio``
   (measured std / ledger std, pooled over every released coordinate; in secure mode about
   sqrt(n / (n - c)), the ledger leaving out ``c`` colluders' shares), and a one-sided
   chi-square test per release lists in ``noise_short_releases`` a release with less noise than
   planned. Also the epsilon that holds against a node knowing its own noise share
   (:func:`fedpriv.privacy.accounting.epsilon_vs_colluders` of the run's ledger), and the same
   with the measured noise (``epsilon_vs_one_node_measured``, a point estimate). The default
   run makes a factor step (``rank=2 steps=1``, unless ``--set`` gives rank, steps or
   defaults). Central mode is the positive control: its trusted server sees every node's
   clipped sums. Caveat: a node's local-DP output (the recommendation's picks) is drawn from
   keys the fixed noise seed fixes too; if it moves between D and D' it is listed, though it is
   a noised release. Prints one JSON line: ``server_plaintext_fields``,
   ``data_dependent_sizes``, ``data_dependent_rounds``, ``epsilon_vs_one_node``,
   ``epsilon_target``, ``noise_ratio``, ``noise_short_releases``,
   ``epsilon_vs_one_node_measured``; ``--out`` writes the whole report (by partition, the
   decoded and the random entries, the noise by release, rounds that did not line up). ``--set
   KEY=VALUE``: config overrides of its runs (e.g. ``defaults=noise-aware`` for the rule's own
   choice, ``recommend=mgem``).

    python simulations/red_team.py --data synthetic-mf:users=300,items=120,ratings=9000,seed=3 --out results/red_team.json
    python simulations/red_team.py --data ml-100k:../shared/data/ml-100k/ml-100k.zip --epsilon 1 --aggregation secure

Exit status 1 when any attack recovers something (``--noise-seed`` makes the run reproducible:
attack 1 then recovers the noise when that seed is published, a check of its power); with
``--aggregation``, when any of the three lists or ``noise_short_releases`` is non-empty, when
``epsilon_vs_one_node`` exceeds the target (``--epsilon``; with a recommendation phase, the RDP
epsilon its records claim) by over 0.1%, or when ``noise_ratio`` is below 0.95 beyond its
sampling error (a one-sided test; on ML-100K its standard error is about 0.006).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedpriv.algorithms import als, dpsgd  # noqa: E402
from fedpriv.algorithms.options import JSON_KEYS, DPSGDOptions  # noqa: E402
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
from fedpriv.privacy.sampling import lattice_gaussian  # noqa: E402
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
            rng = make(seed)  # the ledger's own sampler, in the ledger's order: a lattice release of zeros is its noise
            noise = {name: lattice_gaussian(np.zeros(size), records[name]["sensitivity"], records[name]["noise_std"] / records[name]["sensitivity"], rng)
                     for name, size in order}
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
        base = {k: v for k, v in RENUMBERING_BASE.items() if registry.readers(k) is None or algorithm in registry.readers(k)}
        return algorithm, als.ALSConfig.as_written({**base, **extra}, algorithm)
    own = dict(spec.defaults)
    base = {k: v for k, v in RENUMBERING_BASE.items() if k not in own and (registry.readers(k) is None or algorithm in registry.readers(k))}
    return algorithm, als.ALSConfig.from_overrides({**base, **extra}, algorithm)


def _samples_users(algorithm: str) -> bool:
    """Does ``algorithm`` Poisson-sample its users each round (it reads ``sgd_sampling_rate``)?"""
    from fedpriv.algorithms import registry

    readers = registry.readers("sgd_sampling_rate")
    return readers is not None and algorithm in readers


def sampled_raw_users(train, state, secrets: RunSecrets) -> dict[int, int]:
    """Raw user id -> the number of rounds (of ``state.config.steps``) whose Poisson sample drew
    it, through the real sampling (:func:`fedpriv.algorithms.dpsgd.sampled_users`, the users'
    keys from the run's client key)."""
    shard = shard_users(train, keys=user_keys(secrets.client_key(), train.user_ids))
    drawn = sum(dpsgd.sampled_users(shard, state, r).astype(np.int64) for r in range(int(state.config.steps)))
    raw = np.asarray(train.user_ids)
    return {int(raw[u]): int(n) for u, n in enumerate(np.atleast_1d(drawn)) if n > 0}


def renumbering(ds_d, folder: Path, algorithms: list[str], epsilon: float) -> dict:
    """Attack 2 over ``algorithms`` (entries of :func:`neighbour_config`). Per entry: each
    release's largest exact-sum move over its declared sensitivity, ``holds`` (every move
    within 1), ``unmeasured``: releases the run planned (its final config) that the
    neighbouring runs did not measure, and ``unmoved``: measured releases that the removed user
    did not move at all (both must be empty, else the check was vacuous there). The removed user
    is the one with the smallest raw id; for an algorithm that samples its users (DP-SGD), the
    smallest raw id among the users its run on D really sampled (``removed_raw_user``,
    ``removed_user_sampled_rounds``): a user never sampled moves nothing."""
    inter = ds_d.interactions
    target = int(np.min(inter.user_ids[np.unique(inter.users)]))
    # both sides written in the same layout (the same public item metadata) and read back
    ds_d = load_dataset("ml-100k", write_interactions_ml100k(folder / "D_full", inter), rating_range=ds_d.rating_range)
    primes: dict[int, object] = {}

    def without(user: int):
        if user not in primes:
            primes[user] = load_dataset("ml-100k", write_interactions_ml100k(folder / f"D_prime_{user}", inter, without_user=user), rating_range=ds_d.rating_range)
        return primes[user]

    out: dict = {"removed_raw_user": target, "n_items": [int(inter.n_items), int(without(target).interactions.n_items)]}
    secrets_seed = int.from_bytes(np.random.bytes(8), "little")  # only the secret randomness is fixed
    train_d = random_split(ds_d.interactions).train
    for entry in algorithms:
        algorithm, cfg = neighbour_config(entry)
        # noise-aware runs: the run's budget on the ledger, so the rule (bias model, bias stage) chooses as in a real run
        budget = (epsilon, 1e-5) if cfg.defaults == "noise-aware" else None

        def train(ds, replay=None):
            led = ReplayLedger(replay=replay, budget=budget)
            res = train_inprocess(algorithm, random_split(ds.interactions).train, cfg, rating_range=ds.rating_range, epsilon=epsilon,
                                  item_features=ds.item_features, progress=False, secrets=RunSecrets(secrets_seed), ledger=led)
            return res, led

        res, led_d = train(ds_d)
        final = res.state.config  # the noise-aware rule's choice (the same on D', which replays D's count)
        removed, info = target, {}
        if _samples_users(algorithm):
            drawn = sampled_raw_users(train_d, res.state, RunSecrets(secrets_seed))
            if drawn:
                removed = target if target in drawn else min(drawn)
            info = {"removed_raw_user": removed, "removed_user_sampled_rounds": drawn.get(removed, 0), "users_sampled": len(drawn)}
        _, led_p = train(without(removed), replay=led_d)
        moved = influence(led_d, led_p)
        planned = {p.name for p in als.plan_releases(algorithm, final, False)}
        out[entry] = {"max_move_over_sensitivity": moved, "holds": all(v <= 1 + 1e-5 for v in moved.values()),
                      "unmeasured": sorted(planned - set(moved)), "unmoved": sorted(k for k, v in moved.items() if v == 0.0), **info}
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
    cfg = als.ALSConfig(rank=3, steps=rounds, options=DPSGDOptions(sgd_sampling_rate=q))
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


@contextmanager
def _release_tap(log: list, replay: list | None = None):
    """Record every Gaussian (central) and Skellam (secure) release the server's ledger makes,
    in order: (mechanism, {name: (released values, the ledger's std, the std honest nodes add)}),
    in real units (a secure round's integer words divided by the part's scale). With ``replay``
    (the log of another run on the same data) each release returns that run's value instead, so
    the public state, and with it every later exact sum, is the same in both runs: the two
    released values of one release then differ by their noise only."""
    from fedpriv.privacy.distributed import released_std
    from fedpriv.privacy.ledger import PrivacyLedger

    real_skellam, real_gaussian = PrivacyLedger.skellam_round, PrivacyLedger.gaussian

    def replayed(i: int, mechanism: str, names: list[str]):
        if replay is None:
            return None
        if i >= len(replay) or replay[i][0] != mechanism or sorted(replay[i][1]) != sorted(names):
            raise AssertionError(f"release {i}: {mechanism} {names} does not match the replayed run")
        return {n: np.array(v[0], copy=True) for n, v in replay[i][1].items()}

    def skellam_round(self, plan, unmask, contributors, groups=1):
        values = real_skellam(self, plan, unmask, contributors, groups)
        entry = {}
        for part in plan.parts:
            ledger_std = released_std(plan, part, contributors) / part.scale
            honest_std = math.sqrt(plan.share_variance(part) * contributors) / part.scale
            entry[part.name] = (np.array(values[part.name], dtype=np.float64, copy=True), ledger_std, honest_std)
        log.append(("skellam", entry))
        out = replayed(len(log) - 1, "skellam", list(entry))
        return values if out is None else out

    def gaussian(self, name, value, *, sensitivity, noise_multiplier, **kw):
        released = real_gaussian(self, name, value, sensitivity=sensitivity, noise_multiplier=noise_multiplier, **kw)
        std = float(noise_multiplier) * float(sensitivity)
        log.append(("gaussian", {name: (np.array(released, dtype=np.float64, copy=True), std, std)}))
        out = replayed(len(log) - 1, "gaussian", [name])
        return released if out is None else out[name].astype(np.asarray(released).dtype, copy=False)

    PrivacyLedger.skellam_round, PrivacyLedger.gaussian = skellam_round, gaussian
    try:
        yield log
    finally:
        PrivacyLedger.skellam_round, PrivacyLedger.gaussian = real_skellam, real_gaussian


def server_view_run(algorithm: str, ds, epsilon: float, noise_seed: int | None, overrides: dict, work_dir: Path, delta: float = 1e-5, client_app=None,
                    replay: list | None = None, client_key: bytes | None = None) -> dict:
    """One run over the in-process grid, one user per node, recording every reply the server
    receives by round (message type, round name from the server's round log, occurrence) and
    partition, and every release the server's ledger makes (:func:`_release_tap`); returns the
    replies, the releases, the run's ledger records and its metrics. ``client_app``: the nodes'
    app (default fedpriv's ClientApp; tests pass a leaking one to check the attack's power).
    ``replay``: the releases of an earlier run on the same data, returned in place of this run's
    (the same public state, this run's noise recorded). ``client_key``: each node's client key,
    set in its own state before the run (a node that kept its key): with ``noise_seed=None`` the
    users' choices are then those of a run whose key it is, the noise shares fresh."""
    calls: list[str] = []  # the message type of every round sent (one send_and_receive each)
    got: list = []  # (call index, node id, fields, keys, size, bytes per entry)
    box: dict = {}

    def on_round(grid, message_type):
        if message_type != "get_node_ids":
            calls.append(message_type)

    def on_reply(nid, reply):
        got.append((len(calls) - 1, nid, *_reply_view(reply)))

    def runner(job, n):
        policy = None
        agg = getattr(job.cfg, "aggregation", None)
        if agg is not None and agg.mode == "secure":  # the user's own nodes: a secure policy from the run's options (a secure job needs one)
            from fedpriv.flower.node_policy import NodePolicy

            # the launcher's policy (fedpriv.ops.launcher.node_policy_file), its ledger in memory: each run of the check is a run of its own
            policy = NodePolicy.for_config(job.cfg, epsilon=job.epsilon, delta=job.delta, nodes=n, reproducible=True, recommend=getattr(job, "recommend", None))
        grid = LocalGrid(n, client_app=client_app, on_round=on_round, reply_observer=on_reply, node_policy=policy)
        if client_key is not None:
            from flwr.app import ConfigRecord, RecordDict

            from fedpriv.flower.node_secrets import STATE_KEY

            for nid in grid.partition:
                grid.states[nid] = RecordDict({STATE_KEY: ConfigRecord({"client_key": bytes(client_key)})})
        box["grid"] = grid
        box["result"] = res = run_job(grid, job)
        return res

    with _release_tap([], replay) as releases:
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
    return {"replies": replies, "rounds": rounds, "records": records, "metrics": metrics, "releases": releases}


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


#: a changing plaintext entry is decoded as carrying data when its move between D and D' exceeds
#: this many times its largest move between runs on D (random values, e.g. masked words, move
#: about as much between D and D' as between runs on D)
DECODE_FACTOR = 100.0


def _numbers(v) -> np.ndarray | None:
    """The numbers of one entry's comparable form (:func:`_value`), or None when it holds none."""
    kind = v[0] if isinstance(v, tuple) and v else None
    if kind == "array":
        try:
            dt = np.dtype(v[1])
        except TypeError:
            return None
        if dt.kind not in "biuf":
            return None
        return np.frombuffer(v[3], dtype=dt).astype(np.float64).reshape(-1)
    if kind in ("int", "float", "bool"):
        return np.array([float(v[1])])
    if kind == "bytes":
        return _bytes_numbers(v[1])
    if kind == "list":
        parts = [_numbers(x) for x in v[1]]
        return None if any(x is None for x in parts) else (np.concatenate(parts) if parts else np.zeros(0))
    return None


#: raw bytes are read as little-endian float64 words when every word is a plausible number:
#: zero, or finite with a magnitude in [2^-30, 2^53] (a count, a sum, a rate: ``struct.pack('<d',
#: n_ratings)``); random bytes (keys, ciphertexts, signatures) give such words for about 4% of
#: 8-byte words, so an entry is decoded only when it is plausible in every run and partition
BYTES_PLAUSIBLE = (2.0**-30, 2.0**53)


def _bytes_numbers(b) -> np.ndarray | None:
    """The float64 words of a raw bytes value (a leak packed as bytes), or None when its length is
    not a multiple of 8 or a word is not a plausible number (:data:`BYTES_PLAUSIBLE`)."""
    b = bytes(b)
    if not b or len(b) % 8:
        return None
    x = np.frombuffer(b, dtype="<f8").astype(np.float64)
    with np.errstate(invalid="ignore"):
        mag = np.abs(x)
        ok = np.isfinite(x) & ((x == 0) | ((mag >= BYTES_PLAUSIBLE[0]) & (mag <= BYTES_PLAUSIBLE[1])))
    return x if bool(np.all(ok)) else None


def _decode(rows: list[tuple[int, list, object]]) -> list[int]:
    """The partitions whose changing plaintext entry moved with their data. ``rows``: (partition,
    its values in the runs on D, its value on D'), over every partition of one (round, entry).
    The run-to-run spread on D is the largest coordinate move between any two runs on D over all
    partitions; a partition whose value on D' is farther than :data:`DECODE_FACTOR` times that
    from each of its values on D, at some coordinate, is listed (``n_ratings + U(0, 1e-6)``
    moves by 1e-6 between runs on D and by the ratings removed on D')."""
    nums = []
    for part, va, vb in rows:
        xs = [_numbers(v) for v in (*va, vb)]
        if any(x is None for x in xs) or len({x.shape for x in xs}) != 1:
            return []  # not numbers, or of changing shapes (the size rule sees those)
        nums.append((part, xs[:-1], xs[-1]))
    spread = max((float(np.max(np.abs(x - y), initial=0.0)) for _, xa, _ in nums for i, x in enumerate(xa) for y in xa[i + 1:]), default=0.0)
    if not math.isfinite(spread):
        return []
    out = []
    for part, xa, xb in nums:
        if xb.size == 0:
            continue
        move = np.min(np.stack([np.abs(xb - x) for x in xa]), axis=0)  # per coordinate, to the nearest run on D
        if float(np.max(move)) > DECODE_FACTOR * spread:
            out.append(part)
    return out


def _round_profile(view: dict) -> dict:
    """Per round (message type, name): the number of replies of each of its occurrences."""
    out: dict = {}
    for t, name, k in view["rounds"]:
        out.setdefault((t, name), []).append(sum(1 for (r, _) in view["replies"] if r == (t, name, k)))
    return {key: tuple(v) for key, v in out.items()}


def data_dependent_rounds(d_runs: list[dict], b: dict) -> list[str]:
    """Rounds whose number (or whose number of replies) is the same in every run on D and
    different on D', or outside its range over the runs on D: the server's schedule then moves
    with a user's data (a leak, whatever the messages hold)."""
    profiles, pb = [_round_profile(a) for a in d_runs], _round_profile(b)
    out = []
    for key in sorted(set(pb).union(*profiles), key=str):
        va, vb = [p.get(key, ()) for p in profiles], pb.get(key, ())
        counts = [len(v) for v in va]
        if (all(v == va[0] for v in va) and vb != va[0]) or not (min(counts) <= len(vb) <= max(counts)):
            out.append(f"{key[0]}:{key[1]}")
    return out


def compare_views(a1: dict, a2: dict, b: dict, *more: dict) -> dict:
    """The attack on the server's view: a reply entry (or size) equal in the runs on D
    (``a1``, ``a2`` and ``more``: deterministic given the data) but different in the run on D'
    carries a per-node value. Entries that differ between runs on D (masks, keys, ciphertexts)
    are decoded rather than dropped (:func:`_decode`: listed when their move on D' is far beyond
    their spread on D); the presence of an entry is compared only in records whose key set
    is the same in every run on D. Sizes: the counters' measure, each random bytes entry counted
    by its length. Rounds: :func:`data_dependent_rounds`. More runs on D make a random value
    less likely to repeat by chance (a random neighbour set drawn twice alike)."""
    fields: dict[str, set] = {}
    sizes: dict[str, set] = {}
    random_names: set[str] = set()
    to_decode: dict[tuple, list] = {}
    d_runs = [a1, a2, *more]
    unaligned = sorted({f"{t}:{n}#{k}" for a in (a2, *more, b) for (t, n, k) in set(a1["rounds"]) ^ set(a["rounds"])})
    for key in sorted(set(b["replies"]).intersection(*(a["replies"] for a in d_runs)), key=str):
        (t, name, k), part = key
        ra, rb = [a["replies"][key] for a in d_runs], b["replies"][key]
        r1 = ra[0]
        rand = _random_entries(ra)
        random_names |= {f"{t}:{rec}.{field}" for rec, field in rand}
        for entry in rand:
            if not _random_record(ra, entry[0]) and all(entry in r["fields"] for r in (*ra, rb)):
                to_decode.setdefault(((t, name, k), entry), []).append((part, [r["fields"][entry] for r in ra], rb["fields"][entry]))
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
    decoded: dict[str, set] = {}
    for ((t, _, _), entry), rows in to_decode.items():
        moved = _decode(rows)
        if moved:
            decoded.setdefault(f"{t}:{entry[0]}.{entry[1]}", set()).update(moved)
    for name, parts in decoded.items():
        fields.setdefault(name, set()).update(parts)
    return {
        "server_plaintext_fields": sorted(fields),
        "data_dependent_sizes": sorted(sizes),
        "data_dependent_rounds": data_dependent_rounds(d_runs, b),
        "fields_by_partition": {k: sorted(v) for k, v in sorted(fields.items())},
        "sizes_by_partition": {k: sorted(v) for k, v in sorted(sizes.items())},
        "decoded_fields": sorted(decoded),
        "random_fields": sorted(random_names),
        "unaligned_rounds": unaligned,
    }


#: the server view's pass rule on the noise: measured std / ledger std at least this
NOISE_RATIO_MIN = 0.95
#: a release whose measured variance is below its planned one at this level (one-sided,
#: Bonferroni over the releases) is listed in ``noise_short_releases``
NOISE_TEST_LEVEL = 1e-4


def measure_noise(logs: list[list]) -> dict:
    """The noise actually added, from repeated releases: ``logs`` holds the releases of runs on
    the same data with the same public state (:func:`_release_tap`, the later runs replaying the
    first), so that each release's exact sum is the same in every run and the released values
    differ by their noise only. Per release name: the pooled sample variance over its
    coordinates and runs (``runs - 1`` degrees of freedom per coordinate) against the ledger's
    variance (``ratio``: measured std / ledger std) and against the variance honest nodes add
    (in secure mode the colluders' shares too, which the ledger does not count): a one-sided
    chi-square test flags a release with less noise than planned. ``noise_ratio``: the ratio
    pooled over every release (every coordinate weighted alike); ``below_min``: it is below
    :data:`NOISE_RATIO_MIN` beyond its sampling error (one-sided chi-square test at
    :data:`NOISE_TEST_LEVEL`; with thousands of degrees of freedom, as on ML-100K, that is the
    ratio itself below it)."""
    from scipy.stats import chi2

    if len(logs) < 2:
        raise ValueError("measuring the noise needs at least two runs on the same data")
    n = len(logs[0])
    for i, log in enumerate(logs[1:], start=1):
        if len(log) != n or any(x[0] != y[0] or sorted(x[1]) != sorted(y[1]) for x, y in zip(logs[0], log)):
            raise AssertionError(f"run {i} made other releases than the first: the public states did not line up")
    acc: dict[str, list] = {}  # name -> [sum sq / ledger var, sum sq / honest var, dof]
    for j in range(n):
        for name, (_, ledger_std, honest_std) in logs[0][j][1].items():
            x = np.stack([log[j][1][name][0].ravel() for log in logs])  # runs x coordinates
            if x.shape[1] == 0:
                continue
            ss = float(np.sum((x - x.mean(axis=0)) ** 2))
            a = acc.setdefault(name, [0.0, 0.0, 0])
            a[0] += ss / ledger_std**2
            a[1] += ss / honest_std**2
            a[2] += (len(logs) - 1) * x.shape[1]
    by_release, short = {}, []
    for name, (s_ledger, s_honest, dof) in sorted(acc.items()):
        p = float(chi2.cdf(s_honest, dof))
        by_release[name] = {"ratio": math.sqrt(s_ledger / dof), "ratio_to_honest": math.sqrt(s_honest / dof), "dof": dof, "p_low": p}
        if p < NOISE_TEST_LEVEL / max(1, len(acc)):
            short.append(name)
    dof = sum(a[2] for a in acc.values())
    s_ledger = sum(a[0] for a in acc.values())
    ratio = math.sqrt(s_ledger / dof) if dof else math.nan
    # one-sided: is the pooled variance below NOISE_RATIO_MIN^2 of the ledger's beyond its sampling error?
    p_below = float(chi2.cdf(s_ledger / NOISE_RATIO_MIN**2, dof)) if dof else 0.0
    to_honest = math.sqrt(sum(a[1] for a in acc.values()) / dof) if dof else math.nan
    return {"noise_ratio": ratio, "ratio_to_honest": to_honest, "dof": dof, "p_below_min": p_below, "below_min": p_below < NOISE_TEST_LEVEL,
            "by_release": by_release, "short_releases": short}


def _measured_records(records: list, measured: dict) -> list:
    """The ledger's records with the noise as measured: each measured release's ledger std
    times the pooled measured std over the std honest nodes add (pooled over every release: a
    release measured on one coordinate, such as the user count, has too wide a sampling error
    on its own; a release short of noise on its own is the per-release test's)."""
    import dataclasses

    rho = measured["ratio_to_honest"]
    return [dataclasses.replace(r, noise_std=r.noise_std * rho) if r.name in measured["by_release"] else r for r in records]


def server_view(data: str, *, aggregation: str = "secure", algorithm: str = "adadpals", epsilon: float = 1.0, nodes: int = 24,
                overrides: dict | None = None, noise_seed: int | None = None, delta: float = 1e-5, client_app=None, d_runs: int = 2,
                noise_runs: int = 1) -> dict:
    """Does the server's view of a run leak a per-node value? Runs with one user per node
    (``d_runs`` runs A1, A2, ... on D, B on the neighbouring D' of :func:`one_user_per_node_sets`), all with the same
    reproducible noise (ledger noise and node noise shares fixed; secure aggregation's masks,
    keys and neighbour graph fresh OS randomness each run), compared by :func:`compare_views`.
    Then ``noise_runs`` runs N1, ... on D with fresh noise (no noise seed: the ledger's and the
    nodes' noise from the OS), each node holding A1's client key (the same users' choices) and
    the server's releases replayed from A1 (the same public state): :func:`measure_noise` of A1
    and those gives the noise actually added (``noise_runs=0``: not measured, ``noise_ratio``
    None; for tests of the other rules only). Also the epsilon that holds against a node that
    knows its own noise share (:func:`fedpriv.privacy.accounting.epsilon_vs_colluders` of the
    run's ledger), and the same with the noise as measured (``epsilon_vs_one_node_measured``: a
    point estimate, every release's ledger std times the pooled measured over planned std).
    Default config: a factor step
    (``rank=2 steps=1``) for the algorithms that read them, unless ``overrides`` set them."""
    from fedpriv.algorithms import registry
    from fedpriv.privacy.accounting import epsilon_vs_colluders

    overrides = dict(overrides or {})
    spec = registry.get(algorithm)
    if not spec.fixed and not {"rank", "steps", "defaults"} & set(overrides):
        overrides = {"rank": "2", "steps": "1", **overrides}  # a factor step by default
    overrides["aggregation"] = aggregation
    seed = noise_seed if noise_seed is not None else int.from_bytes(os.urandom(7), "little")  # fixed for the runs A and B only
    with tempfile.TemporaryDirectory(prefix="fedpriv-server-view-") as tmp:
        folder = Path(tmp)
        d, d_prime, changed = one_user_per_node_sets(dataset_through_loader(data, folder), nodes, folder)
        sets = [(f"A{i + 1}", d) for i in range(max(2, int(d_runs)))] + [("B", d_prime)]
        runs = {name: server_view_run(algorithm, ds, epsilon, seed, overrides, folder / name, delta, client_app) for name, ds in sets}
        key = RunSecrets(seed).client_key()
        noise = [server_view_run(algorithm, d, epsilon, None, overrides, folder / f"N{i + 1}", delta, client_app, replay=runs["A1"]["releases"], client_key=key)
                 for i in range(max(0, int(noise_runs)))]
    out = compare_views(*[runs[name] for name, _ in sets if name != "B"][:2], runs["B"], *[runs[name] for name, _ in sets if name not in ("A1", "A2", "B")])
    measured = measure_noise([runs["A1"]["releases"], *(r["releases"] for r in noise)]) if noise else {
        "noise_ratio": None, "dof": 0, "below_min": False, "by_release": {}, "short_releases": []}  # noise_runs=0: not measured (tests of other rules)
    eps = max(epsilon_vs_colluders(r["records"], delta, colluders=1) for r in runs.values())
    eps_measured = epsilon_vs_colluders(_measured_records(runs["A1"]["records"], measured), delta, colluders=1) if noise else None
    # the target: the asked epsilon; with a recommendation phase (its own budget on top), the RDP
    # epsilon the run's records claim, by the same accountant as epsilon_vs_colluders
    target = float(epsilon)
    if runs["A1"]["metrics"].get("recommendation"):
        from fedpriv.privacy.accounting import epsilon_rdp

        target = max(epsilon_rdp(r["records"], delta) for r in runs.values())
    ratio = measured["noise_ratio"]
    return {
        "server_plaintext_fields": out["server_plaintext_fields"],
        "data_dependent_sizes": out["data_dependent_sizes"],
        "data_dependent_rounds": out["data_dependent_rounds"],
        "epsilon_vs_one_node": eps,
        "epsilon_target": target,
        "noise_ratio": ratio,
        "noise_short_releases": measured["short_releases"],
        "epsilon_vs_one_node_measured": eps_measured,
        "leaks": bool(out["server_plaintext_fields"] or out["data_dependent_sizes"] or out["data_dependent_rounds"] or eps > target * (1 + 1e-3)
                      or measured["below_min"] or measured["short_releases"]),
        "detail": {
            "data": data, "aggregation": aggregation, "algorithm": algorithm, "nodes": int(d.interactions.n_users), "changed_user": changed,
            "config": {k: runs["A1"]["metrics"]["config"].get(k) for k in ("rank", "steps", "bias_stage", "defaults")},
            "replies_per_run": {k: len(r["replies"]) for k, r in runs.items()},
            "rounds_per_run": {k: len(r["rounds"]) for k, r in runs.items()},
            "noise": {k: measured.get(k) for k in ("dof", "ratio_to_honest", "p_below_min", "by_release")} | {"runs": 1 + len(noise)},
            **{k: out[k] for k in ("fields_by_partition", "sizes_by_partition", "decoded_fields", "random_fields", "unaligned_rounds")},
        },
    }


#: the keys of the server view's one JSON line
SERVER_VIEW_LINE = ("server_plaintext_fields", "data_dependent_sizes", "data_dependent_rounds", "epsilon_vs_one_node", "epsilon_target",
                    "noise_ratio", "noise_short_releases", "epsilon_vs_one_node_measured")


# ---------------------------------------------------------------------------- script
def red_team(data: str, *, algorithm: str = "adadpals", epsilon: float = 1.0, noise_seed: int | None = None, small_seeds: int = 2000,
             neighbour_algorithms=("adadpals", "adadpals+bias_stage", "bias", "dpals-uniform", "dpsgd"), users_per_node: int = 5) -> dict:
    with tempfile.TemporaryDirectory(prefix="fedpriv-red-team-") as tmp:
        folder = Path(tmp)
        ds = dataset_through_loader(data, folder)
        pub = published_run(algorithm, ds, epsilon, noise_seed, users_per_node)
        candidates = published_integers(pub, small_seeds)
        train = random_split(ds.interactions).train
        cfg = als.ALSConfig.from_dict({k: v for k, v in pub["metrics"]["config"].items() if k in als.ALSConfig.__dataclass_fields__ or k in JSON_KEYS}, algorithm)
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


def deviant_line_holds(line: dict) -> bool:
    """A deviation line of ``--server deviant`` as it must be: with the defence, nothing recovered
    and the nodes' refusals naming the line's own defence (``refused_by == defence_id``); the
    positive control (only that defence off) recovers."""
    if line["defence"]:
        return line["recovered"] is False and line.get("refused_by") == line.get("defence_id")
    return line["recovered"] is True


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
    p.add_argument("--deviations", default="abcdefghijkl", help="--server deviant: the deviations to play (letters, default all)")
    p.add_argument("--server", choices=("honest", "deviant"), default="honest",
                   help="deviant: a server that deviates from the protocol against the real node code (simulations/deviant_server.py); "
                        "one JSON line per deviation with the nodes' defence on, then the positive controls (only that defence off); "
                        "exit status 1 unless every defence line recovers nothing and is refused by its own defence and every control recovers")
    a = p.parse_args(argv)
    if a.server == "deviant":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from deviant_server import deviations

        lines = deviations(a.data, epsilon=a.epsilon, nodes=a.nodes, algorithm=a.algorithm, which=a.deviations)
        for line in lines:
            print(json.dumps(line, default=float), flush=True)
        return 0 if all(deviant_line_holds(line) for line in lines) else 1
    if a.aggregation is not None:
        from fedpriv.run import parse_overrides

        report = server_view(a.data, aggregation=a.aggregation, algorithm=a.algorithm, epsilon=a.epsilon, nodes=a.nodes,
                             overrides=parse_overrides(a.overrides), noise_seed=a.noise_seed)
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(report, indent=2, default=float) + "\n")
        print(json.dumps({k: report[k] for k in SERVER_VIEW_LINE}, default=float))
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
