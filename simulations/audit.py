"""Issue 5 / 15: empirical privacy audit of the Gaussian releases of the statistics algorithms
(AdaDPALS, DPALS-uniform / -tail, AM-SSP, ...), on neighbouring data sets read through the real
loaders.

Neighbouring data sets. For each audited user (below), the script writes D = the ``--data`` set
plus that user, and D' = the ``--data`` set alone, in the MovieLens-100K layout
(:func:`fedpriv.data.export.write_ml100k`: raw user ids ``inter.user_ids[inter.users]``, raw item
ids ``inter.item_ids[inter.items]``, ratings as they are, the public catalogue
``inter.item_ids``), each in a temporary folder, and reads both back with the real loader,
``load_dataset("ml-100k", folder)``, which renumbers the users densely in raw id order. The
audited user gets a raw id smaller than every other raw user id, so removing it renumbers every
other user (``renumbered_users`` counts them; it must be > 0); its ratings are on raw item ids
of the catalogue, which the loader keeps whole (``n_items`` is the same on both sides).

Only the secret randomness is fixed: one :class:`~fedpriv.privacy.randomness.RunSecrets` (from
``--seed``) gives every user of D and of D' its key, ``user_keys(secrets.client_key(), raw
ids)``, so a user makes the same random choices (DPALS's sampled items, ...) on both sides
whatever its dense id. The exact (pre-noise) sums with and without the user are computed by the
algorithm's own client functions on shards of the loaded D and D' (D: the audited user's own
shard and one shard of all the others; D': one shard of all its users; shards only group what is
summed, and this grouping keeps float32 accumulation inside a shard out of the difference).

The audit. For each algorithm and epsilon the script builds the public state the way the
in-process engine does (calibrated multipliers; user count, mean and counts released on D;
weights and initial item embeddings), once, and uses it for both sides. It then releases both
exact sums many times through the real release function (``als.release_item_stats``,
``ssp.release_ssp_stats``; ``als.release_gaussian`` / ``als.release_counts`` for the pre-processing
releases), the noise drawn by a :class:`~fedpriv.privacy.ledger.PrivacyLedger`, and thresholds
the projection of each output on the exact difference
(:func:`fedpriv.privacy.audit.audit_gaussian_release`): the Clopper-Pearson lower bound on
epsilon must never exceed the epsilon dp-accounting gives to the ledger records of one trial's
draws.

The audited user is chosen per release, from public values only (the catalogue, the rating
range, the data-independent initial embeddings), to reach the declared sensitivity: it rates
every item, all at the top of the range (user count, mean, counts), or half at the top and half
at the bottom, split by the first coordinate of the broadcast item embeddings (item statistics:
its centred ratings minus its bias exceed ``rating_clip``, and with the large initial embeddings
of ``init_scale=1`` its vector reaches ``user_clip``). The L2 norm of the actual difference is
reported next to the sensitivity and must not exceed it. One trial = one release; trials are
vectorised (k trials stacked in one ledger call, whose record is split back into per-trial
records for the accounting).

``--broken-noise-factor F`` divides the noise multipliers by F before the audited releases: a
self-check that the audit has power. The ledger still accounts what was drawn (``ok`` keeps
holding), and the lower bound must exceed the epsilon claimed for the calibrated, unbroken
multiplier (``exceeds_claimed``).

Usage:
  python simulations/audit.py --data synthetic-mf:users=300,items=200,ratings=6000,seed=3 \\
      --algorithms adadpals dpals-uniform am-ssp --epsilon 1 5 --trials 20000 --out results/audit.json
Exit status 1 if any ``ok`` (or ``sensitivity_ok``; with F != 1 any ``exceeds_claimed``) is false.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from fedpriv.algorithms import als, protocol, ssp
from fedpriv.algorithms.shards import UserShard, shard_users
from fedpriv.data.export import write_ml100k
from fedpriv.data.loaders import Dataset, load_dataset
from fedpriv.data.spec import load_spec, parse_data_spec
from fedpriv.engine.inprocess import new_state
from fedpriv.privacy.accounting import epsilon_pld, epsilon_rdp
from fedpriv.privacy.audit import audit_gaussian_release
from fedpriv.privacy.ledger import PrivacyLedger, Release
from fedpriv.privacy.randomness import RunSecrets, user_keys
from fedpriv.privacy.symmetric import upper

AUDITABLE = tuple(a for a in als.ALGORITHMS if a != "als" and protocol.contribution_kind(a) == "stats")
SETUP_RELEASES = ("users", "mean", "counts")
STATS_RELEASES = ("item_stats_A", "item_stats_b", "gravity")
SYMMETRIC = ("item_stats_A", "gravity")
# the statistics kernels accumulate in float32: a difference may exceed the sensitivity by
# float32 rounding (~1e-7 relative), which the check tolerates (the excess is reported)
SENSITIVITY_RTOL = 1e-6
# large initial item embeddings: the worst-case user's local solve exceeds user_clip
AUDIT_OVERRIDES = {"init_scale": 1.0}


# ---------------------------------------------------------------------------- worst-case users
def user_shard(user_id: int, items: np.ndarray, ratings: np.ndarray) -> UserShard:
    return UserShard(
        user_ids=np.array([user_id], dtype=np.int64),
        indptr=np.array([0, len(items)], dtype=np.int64),
        items=np.asarray(items, dtype=np.int32),
        ratings=np.asarray(ratings, dtype=np.float32),
    )


def top_rating_user(user_id: int, n_items: int, rating_range: tuple[float, float]) -> UserShard:
    """Rates every item at the top of the range: reaches the user-count, mean and counts
    sensitivities (when there are at least ``mean_cap`` and ``count_cap`` items)."""
    return user_shard(user_id, np.arange(n_items), np.full(n_items, rating_range[1]))


def split_user(user_id: int, state: als.PublicState, k: int) -> UserShard:
    """Rates every item, at the top of the range on the half of the items with the largest
    coordinate ``k`` of the broadcast embedding and at the bottom on the other half."""
    n = state.n_items
    lo, hi = state.rating_range
    order = np.argsort(-state.item_factors[:, k], kind="stable")
    ratings = np.full(n, lo)
    ratings[order[: n // 2]] = hi
    return user_shard(user_id, np.arange(n), ratings)


def released_user_vector(user: UserShard, state: als.PublicState) -> np.ndarray:
    """The user's vector as it enters the item statistics (clipped, with the bias coordinate)."""
    U, _ = als.split_user_vectors(als.client_user_vectors(user, state), state)
    return als.released_user_vectors(U, state)[0]


def triu_norm(x: np.ndarray) -> float:
    """Norm of the upper triangle of x x^T (what the symmetric release of A sees)."""
    return float(np.sqrt(0.5 * (np.sum(x**4) + np.sum(x**2) ** 2)))


def stats_user(user_id: int, state: als.PublicState) -> UserShard:
    """Worst case for the item statistics: a user split along one embedding coordinate (its
    centred ratings minus its bias exceed ``rating_clip``, its vector reaches ``user_clip``);
    of the ``rank`` coordinates, the one whose vector has the largest upper triangle of x x^T
    (the A difference is largest when x is concentrated on one coordinate)."""
    users = [split_user(user_id, state, k) for k in range(state.item_factors.shape[1])]
    return max(users, key=lambda u: triu_norm(released_user_vector(u, state)))


def initial_embeddings(state: als.PublicState, features) -> als.PublicState:
    """A copy of the state with the step-0 item embeddings (data-independent: a seeded random
    initialisation or encoder), to choose the audited user's ratings before the setup releases."""
    probe = copy.deepcopy(state)
    probe.counts_hat = np.ones(state.n_items)
    protocol.server_setup(probe, features)
    return probe


# ---------------------------------------------------------------------------- neighbouring data sets
def audited_raw_id(inter) -> int:
    """A raw user id smaller than every raw user id of the base data: removing the audited user
    then renumbers every other user."""
    ids = np.asarray(inter.user_ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"the audit writes integer raw user ids; the data has {ids.dtype} ids")
    return int(ids.min()) - 1


def check_catalogue(loaded: Dataset, base: Dataset) -> None:
    """The loader keeps the base data's public catalogue (same raw item ids, same dense order),
    so the base data's item features and the audited user's dense items apply to it."""
    if not np.array_equal(np.asarray(loaded.interactions.item_ids), np.asarray(base.interactions.item_ids)):
        raise ValueError("the item catalogue read back differs from the data's (its raw item ids must be sorted, as the loaders make them)")


def write_and_load(folder: Path, base: Dataset, user: UserShard | None = None, raw_user_id: int | None = None) -> Dataset:
    """The base data (plus ``user``'s ratings under ``raw_user_id``) in the ML-100K layout, read
    back with the real loader (which renumbers the users densely in raw id order)."""
    inter = base.interactions
    raw_users = np.asarray(inter.user_ids)[inter.users]
    raw_items = np.asarray(inter.item_ids)[inter.items]
    ratings = np.asarray(inter.ratings)
    n_base = len(ratings)
    if user is not None:
        raw_users = np.concatenate([np.full(user.n_ratings, raw_user_id, dtype=raw_users.dtype), raw_users])
        raw_items = np.concatenate([np.asarray(inter.item_ids)[user.items], raw_items])
        ratings = np.concatenate([user.ratings, ratings])
    write_ml100k(folder, raw_users, raw_items, ratings, inter.item_ids)
    loaded = load_dataset("ml-100k", folder, rating_range=base.rating_range)
    check_catalogue(loaded, base)
    expected = n_base + (user.n_ratings if user is not None else 0)
    if len(loaded.interactions) != expected:
        raise RuntimeError(f"{folder}: {len(loaded.interactions)} ratings read back, {expected} written")
    return loaded


class Neighbours:
    """D (the base data and the audited user) and D' (the base data alone), both as read back by
    the real loader, and their shards, keyed by one run's secrets: ``shards`` (D: the audited
    user's own shard, then the others'), ``shards_prime`` (D'); ``user``: the audited user's
    dense id in D."""

    def __init__(self, d: Dataset, d_prime: Dataset, user: int, shards: list[UserShard], shards_prime: list[UserShard]):
        self.d, self.d_prime, self.user = d, d_prime, user
        self.shards, self.shards_prime = shards, shards_prime

    @property
    def user_shard(self) -> UserShard:
        return self.shards[0]

    @property
    def renumbered_users(self) -> int:
        """Users of D' whose dense id in D' differs from their dense id in D."""
        ids, ids_prime = np.asarray(self.d.interactions.user_ids), np.asarray(self.d_prime.interactions.user_ids)
        pos = np.searchsorted(ids, ids_prime)
        if not np.array_equal(ids[np.minimum(pos, len(ids) - 1)], ids_prime):
            raise RuntimeError("a user of D' is not a user of D")
        return int(np.sum(pos != np.arange(len(ids_prime))))

    def fields(self) -> dict:
        n_items = self.d.interactions.n_items
        if self.d_prime.interactions.n_items != n_items:
            raise RuntimeError(f"n_items differs: {n_items} on D, {self.d_prime.interactions.n_items} on D'")
        return {
            "renumbered_users": self.renumbered_users,
            "n_items": n_items,
            "n_users_with": self.d.interactions.n_users,
            "n_users_without": self.d_prime.interactions.n_users,
        }


def neighbours(d: Dataset, d_prime: Dataset, raw_user_id: int, user: UserShard, secrets: RunSecrets) -> Neighbours:
    """Shards of D and D' whose users carry their secret keys, ``user_keys(client_key, raw id)``
    from the same secrets on both sides (same raw id, same key, same random choices)."""
    inter, inter_prime = d.interactions, d_prime.interactions
    ids = np.asarray(inter.user_ids)
    (where,) = np.flatnonzero(ids == raw_user_id)
    if inter_prime.n_users + 1 != inter.n_users:
        raise RuntimeError(f"D has {inter.n_users} users, D' {inter_prime.n_users}: expected one more on D")
    client_key = secrets.client_key()
    keys, keys_prime = user_keys(client_key, inter.user_ids), user_keys(client_key, inter_prime.user_ids)
    mine = shard_users(inter, np.array([where]), keys)
    if not (np.array_equal(mine.items, user.items) and np.array_equal(mine.ratings, user.ratings)):
        raise RuntimeError("the audited user's ratings read back differ from those written")
    others = shard_users(inter, np.delete(np.arange(inter.n_users), where), keys)
    return Neighbours(d, d_prime, int(where), [mine, others], [shard_users(inter_prime, keys=keys_prime)])


def total(fn: Callable[[UserShard], np.ndarray], shards: list[UserShard]) -> np.ndarray:
    return np.sum([fn(s) for s in shards], axis=0)


# ---------------------------------------------------------------------------- releases
class TrialLedgers:
    """Release callback of the audit: each call releases k stacked trials through a fresh
    ledger and splits its records into the records of one trial (dimension / k); every call must
    give the same per-trial records."""

    def __init__(self, run: Callable[[dict[str, np.ndarray], PrivacyLedger], dict[str, np.ndarray]], seed: int, secure: bool = False):
        self.run, self.seed, self.secure = run, seed, secure
        self.calls = 0
        self.per_trial: dict[str, list[Release]] | None = None

    def __call__(self, stacked: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        k = len(next(iter(stacked.values())))
        ledger = PrivacyLedger(seed=self.seed * 1_000_003 + self.calls, secure=self.secure)
        self.calls += 1
        out = self.run(stacked, ledger)
        recs: dict[str, list[Release]] = {}
        for r in ledger.releases:
            if r.dim % k:
                raise RuntimeError(f"{r.name}: ledger dimension {r.dim} is not a multiple of {k} trials")
            recs.setdefault(r.name, []).append(dataclasses.replace(r, dim=r.dim // k))
        if self.per_trial is None:
            self.per_trial = recs
        elif _keys(recs) != _keys(self.per_trial):
            raise RuntimeError("the ledger records of one trial changed between calls")
        return out


def _keys(recs: dict[str, list[Release]]) -> dict:
    return {n: [(*r.key(), r.count) for r in rs] for n, rs in recs.items()}


def setup_run(state: als.PublicState) -> Callable:
    """Releases of the pre-processing (the noised vectors, before the post-processing of
    ``release_user_count`` / ``release_mean``, through the same ``_release`` they call)."""

    def run(stacked, ledger):
        out = {}
        for name, x in stacked.items():
            if name == "counts":
                out[name] = als.release_counts(x, state, ledger)
            else:
                out[name] = als.release_gaussian(name, x, state, ledger)
        return out

    return run


def stats_run(state: als.PublicState) -> Callable:
    """Item-statistics release of the algorithm (as in ``protocol.aggregate``); with R noised
    copies per step (am-ssp1) the audited output is their mean."""

    def run(stacked, ledger):
        A, b, g = (stacked.get(n) for n in STATS_RELEASES)
        if state.algorithm in ("am-ssp", "am-ssp1"):
            copies = ssp.release_ssp_stats(A, b, g, state, ledger)
        else:
            copies = [als.release_item_stats(A, b, g, state, ledger)]
        return {n: np.mean([c[i] for c in copies], axis=0) for i, n in enumerate(STATS_RELEASES) if n in stacked}

    return run


# ---------------------------------------------------------------------------- one setting
def audit_setting(
    algorithm: str,
    epsilon: float,
    ds,
    cfg: als.ALSConfig,
    *,
    trials: int,
    delta: float = 1e-5,
    alpha: float = 0.05,
    broken_noise_factor: float = 1.0,
    seed: int = 0,
    secure: bool = False,
    releases: tuple[str, ...] | None = None,
) -> dict[str, dict]:
    """Audit every Gaussian release of one step of ``algorithm`` at ``epsilon`` on the base data
    ``ds`` (a loaded data set: D' is ``ds``, D is ``ds`` plus the audited user, both written and
    read back through the real loader); returns the entries by release name. ``seed`` fixes the
    run's secret randomness (the users' keys and the public state's own releases) and the
    audit's ledgers (``secure``: the audit's ledgers draw from the OS CSPRNG instead)."""
    if algorithm not in AUDITABLE:
        raise ValueError(f"cannot audit {algorithm!r} (auditable: {', '.join(AUDITABLE)})")
    train = ds.interactions
    n_items = train.n_items  # the public catalogue: the same on D and D'
    raw_uid = audited_raw_id(train)
    secrets = RunSecrets(seed)  # the only randomness fixed: the same on D and D'
    state, setup_ledger = new_state(algorithm, cfg, train, ds.rating_range, ds.implicit, epsilon, delta, secrets=secrets)
    calibrated = dict(state.multipliers)
    broken = {n: z / broken_noise_factor for n, z in calibrated.items()}
    wanted = set(releases) if releases else set(calibrated)
    if wanted - set(calibrated):
        raise ValueError(f"{algorithm} makes no release {sorted(wanted - set(calibrated))} (it makes {sorted(calibrated)})")
    entries: dict[str, dict] = {}

    def finish(name: str, res: dict, per_trial: dict[str, list[Release]], pair: Neighbours, user_norm: float | None = None) -> dict:
        recs = per_trial[name]
        accounted = epsilon_rdp(recs, delta)
        claimed = epsilon_rdp([dataclasses.replace(r, noise_std=calibrated[name] * r.sensitivity) for r in recs], delta)
        sens = als.sensitivity(name, cfg, state.rating_range)
        entry = {
            "accounted_epsilon": accounted,
            "accounted_epsilon_pld": epsilon_pld(recs, delta),
            "claimed_epsilon": claimed,
            "lower_bound": res["lower_bound"],
            "confidence": res["confidence"],
            "trials": res["trials"],
            "ok": res["lower_bound"] <= accounted,
            "sensitivity": sens,
            "difference_norm": res["difference_norm"],
            "difference_over_sensitivity": res["difference_norm"] / sens,
            "sensitivity_ok": res["difference_norm"] <= sens * (1 + SENSITIVITY_RTOL),
            "noise_multiplier": recs[0].noise_multiplier,
            "calibrated_noise_multiplier": calibrated[name],
            "draws_per_trial": sum(r.count for r in recs),
            "dim": recs[0].dim,
            "expected_separation": res["difference_norm"] * math.sqrt(sum(r.count for r in recs)) / recs[0].noise_std,
            **{k: res[k] for k in ("empirical_separation", "threshold", "selection_lower_bound", "false_positives", "false_negatives", "fpr_upper", "fnr_upper", "evaluation_trials")},
            **pair.fields(),
        }
        if user_norm is not None:
            entry["user_vector_norm"] = user_norm
            entry["user_clip"] = cfg.user_clip
        if broken_noise_factor != 1.0:
            entry["exceeds_claimed"] = res["lower_bound"] > claimed
        return entry

    contribution = {
        "users": lambda s: als.client_user_count(s),
        "mean": lambda s: als.client_mean(s, cfg, state.rating_range, True),
        "counts": lambda s: als.client_counts(s, cfg, n_items, True),
    }
    setup_names = [n for n in SETUP_RELEASES if n in calibrated and n in wanted]
    stats_names = [n for n in STATS_RELEASES if n in calibrated]
    with tempfile.TemporaryDirectory(prefix="fedpriv-audit-") as tmp:
        tmp = Path(tmp)
        d_prime = write_and_load(tmp / "d-prime", ds)  # D': the base data alone, renumbered by the loader

        # pre-processing releases (user count, mean, counts), on the state before any release
        if setup_names:
            top = top_rating_user(0, n_items, state.rating_range)
            pair = neighbours(write_and_load(tmp / "d-top", ds, top, raw_uid), d_prime, raw_uid, top, secrets)
            with_ = {n: total(contribution[n], pair.shards) for n in setup_names}
            without = {n: total(contribution[n], pair.shards_prime) for n in setup_names}
            state.multipliers = broken
            rec = TrialLedgers(setup_run(state), seed, secure)
            res = audit_gaussian_release(rec, with_, without, trials=trials, delta=delta, alpha=alpha)
            entries.update({n: finish(n, res[n], rec.per_trial, pair) for n in setup_names})
            state.multipliers = calibrated

        # one step releases all of them together (each from the same trials, with its own noise)
        if wanted & set(stats_names):
            user = stats_user(0, initial_embeddings(state, ds.item_features))
            pair = neighbours(write_and_load(tmp / "d-stats", ds, user, raw_uid), d_prime, raw_uid, user, secrets)
            # public state of step 0 as the engine builds it, on D (once: both sides use it)
            if state.private and "users" in calibrated:
                state.n_users = als.release_user_count(total(als.client_user_count, pair.shards), state, setup_ledger)
            if als.needs_mean(algorithm, ds.implicit):
                state.mean = als.release_mean(total(contribution["mean"], pair.shards), state, setup_ledger)
            if als.needs_counts(algorithm):
                state.counts_hat = als.release_counts(total(contribution["counts"], pair.shards), state, setup_ledger)
            server = protocol.server_setup(state, ds.item_features)
            table = server.encoder.table if server is not None else None

            d = protocol.stats_dim(state)
            parts = [protocol.client_step(s, state, 0, table) for s in pair.shards]
            parts_prime = [protocol.client_step(s, state, 0, table) for s in pair.shards_prime]
            with_ = dict(zip(STATS_RELEASES, als.sum_item_stats(parts, n_items, d)))
            without = dict(zip(STATS_RELEASES, als.sum_item_stats(parts_prime, n_items, d)))
            with_ = {n: with_[n] for n in stats_names}
            without = {n: without[n] for n in stats_names}
            state.multipliers = broken
            rec = TrialLedgers(stats_run(state), seed + 1, secure)
            views = {n: upper for n in stats_names if n in SYMMETRIC}
            res = audit_gaussian_release(rec, with_, without, trials=trials, delta=delta, alpha=alpha, views=views)
            norm = float(np.linalg.norm(released_user_vector(pair.user_shard, state)))
            entries.update({n: finish(n, res[n], rec.per_trial, pair, norm) for n in stats_names if n in wanted})
            state.multipliers = calibrated
    return entries


# ---------------------------------------------------------------------------- script
def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="synthetic-mf:users=300,items=200,ratings=6000,seed=3")
    p.add_argument("--algorithms", nargs="+", default=["adadpals", "am-ssp"], choices=AUDITABLE)
    p.add_argument("--epsilon", nargs="+", type=float, default=[1.0, 5.0])
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--trials", type=int, default=20000, help="releases per data set (half select the threshold, half certify)")
    p.add_argument("--alpha", type=float, default=0.05, help="each lower bound holds with confidence 1 - alpha")
    p.add_argument("--releases", nargs="+", default=None, help="audit only these release names")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help=f"ALSConfig overrides (audit defaults: {AUDIT_OVERRIDES})")
    p.add_argument("--broken-noise-factor", type=float, default=1.0, help="divide the noise multipliers by F (power self-check)")
    p.add_argument("--secure-noise", action="store_true", help="draw the noise from the ledger's CSPRNG sampler")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/audit.json")
    args = p.parse_args(argv)
    if not args.broken_noise_factor > 0:
        raise SystemExit("--broken-noise-factor must be > 0")
    overrides = {**AUDIT_OVERRIDES, **parse_overrides(args.set)}
    from fedpriv.algorithms import registry

    def config_of(alg):  # the keys this algorithm reads, as written (its own in its options)
        return als.ALSConfig.as_written({k: v for k, v in overrides.items() if registry.readers(k) is None or alg in registry.readers(k)}, alg)

    ds = load_spec(parse_data_spec(args.data))

    results: dict = {}
    flags = []
    t0 = time.perf_counter()
    for i, (alg, eps) in enumerate((a, e) for a in args.algorithms for e in args.epsilon):
        ts = time.perf_counter()
        entries = audit_setting(
            alg, eps, ds, config_of(alg), trials=args.trials, delta=args.delta, alpha=args.alpha,
            broken_noise_factor=args.broken_noise_factor, seed=args.seed + 100 * i, secure=args.secure_noise,
            releases=tuple(args.releases) if args.releases else None,
        )
        results.setdefault(alg, {})[f"{eps:g}"] = entries
        for name, e in entries.items():
            flags += [e["ok"], e["sensitivity_ok"]] + ([e["exceeds_claimed"]] if "exceeds_claimed" in e else [])
            print(
                f"{alg:10s} eps={eps:<5g} {name:13s} lower bound {e['lower_bound']:.4f} <= accounted {e['accounted_epsilon']:.4f}"
                f" (claimed {e['claimed_epsilon']:.4f}): {'ok' if e['ok'] else 'VIOLATED'};"
                f" |diff|/sensitivity {e['difference_over_sensitivity']:.3f}"
                + (f"; exceeds claimed: {e['exceeds_claimed']}" if "exceeds_claimed" in e else ""),
                file=sys.stderr,
                flush=True,
            )
        print(f"  ({alg}, eps={eps:g}: {time.perf_counter() - ts:.1f}s)", file=sys.stderr, flush=True)
    report = {
        "data": args.data,
        "delta": args.delta,
        "alpha": args.alpha,
        "trials": args.trials,
        "broken_noise_factor": args.broken_noise_factor,
        "secure_noise": args.secure_noise,
        "config_overrides": overrides,
        "seconds": time.perf_counter() - t0,
        "all_ok": all(flags),
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    return 0 if all(flags) else 1


if __name__ == "__main__":
    sys.exit(main())
