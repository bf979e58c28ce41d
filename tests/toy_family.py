"""A third family, defined in this file and nowhere in the package: the private per-item mean
rating. It is a block family (:class:`fedpriv.algorithms.families.Family`): each node holds its
users' ratings; one round releases, per item, the users' weighted counts and clipped rating
sums (each user weighted 1/sqrt(its ratings), so that one user moves the (count, sum) vector by
at most sqrt(1 + clip^2) in L2); the server divides. Registering it (:func:`registered`) is all
it takes: the in-process engine and the Flower engines run it through the package's generic
block engines, with the package's messages, reply checks, node policy and secure aggregation.

A node finds the family in its own catalogue: a process that serves it imports this module
(the Flower simulation's workers do: ``FEDPRIV_FAMILIES`` names it, as an operator would)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from fedpriv.algorithms.config import Aggregation
from fedpriv.algorithms.families import Family, ReplyPart, register_family, unregister_family
from fedpriv.algorithms.steps import Part
from fedpriv.errors import ConfigError

NAME = "toy-item-mean"
RELEASE = "toy_item_sums"


@dataclass(frozen=True)
class ItemMeanConfig:
    clip: float = 5.0  # bound on |rating|
    floor: float = 1.0  # the released mean's smallest denominator (a noised count can be ~0)
    seed: int = 0
    aggregation: Aggregation = field(default_factory=Aggregation)

    @classmethod
    def parse(cls, overrides: dict) -> ItemMeanConfig:
        agg_keys = {k: overrides[k] for k in Aggregation.KEYS if k in overrides}
        known = {f.name for f in fields(cls)} - {"aggregation"}
        for key, value in overrides.items():
            if key not in known and key not in Aggregation.KEYS:
                raise ConfigError(f"unknown key (known: {', '.join(sorted(known))})", field=key)
        cfg = cls(**{k: float(v) if k != "seed" else int(v) for k, v in overrides.items() if k in known})
        return replace(cfg, aggregation=Aggregation.parse(agg_keys))

    def to_dict(self) -> dict:
        return {"clip": self.clip, "floor": self.floor, "seed": self.seed, **self.aggregation.to_dict()}


@dataclass
class ItemMeanState:
    """The broadcast public state: released values and public choices only."""

    algorithm: str
    config: ItemMeanConfig
    n_items: int
    multipliers: dict
    private: bool = True
    means: np.ndarray | None = None


@dataclass(frozen=True)
class UserRatings:
    """The family's data, and a block of it: each user's (item, rating) pairs."""

    indptr: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    n_items: int
    user_ids: np.ndarray
    test_means: np.ndarray  # per item, of every user's ratings: measurement only

    @property
    def n_users(self) -> int:
        return len(self.indptr) - 1


def _sensitivity(cfg: ItemMeanConfig) -> float:
    return math.sqrt(1.0 + cfg.clip**2)


class ItemMeanRounds:
    """One round, one release; no setup."""

    def setup_kinds(self, state):
        return iter(())

    def take(self, kind, value, state, ledger) -> None:
        raise AssertionError("no setup round")

    def server_setup(self, state, features):
        return None

    def n_steps(self, state) -> int:
        return 1

    def step_kind(self, state) -> str:
        return "item_sums"

    def group(self, state, step: int):
        return None

    def groups(self, state) -> int:
        return 1

    def release(self, kind, sums, state, ledger):
        if not state.private:
            return sums[0]
        return ledger.gaussian(
            RELEASE, sums[0], sensitivity=_sensitivity(state.config), noise_multiplier=state.multipliers[RELEASE]
        )

    def server_step(self, release, state, server) -> None:
        counts, totals = release[: state.n_items], release[state.n_items :]
        state.means = totals / np.maximum(counts, state.config.floor)

    def check_secure(self, state) -> None:
        pass

    def secure_parts(self, kind, state):
        return [(RELEASE, 2 * state.n_items, _sensitivity(state.config), state.multipliers[RELEASE])]

    def declared_parts(self, kind, state):
        return [Part(RELEASE, 0, (2 * state.n_items,))]


class ItemMeanFamily(Family):
    name = "toy-item-means"
    rounds = ItemMeanRounds()
    protocol = "item-means"

    def algorithms(self):
        return (NAME,)

    def private(self, algorithm):
        return True

    def describe(self, algorithm):
        return "reference: ratings", "the private per-item mean rating (a test's own family)"

    def parse(self, overrides, algorithm):
        return ItemMeanConfig.parse(overrides)

    def evaluation(self, cfg):
        from fedpriv.algorithms.evaluations import BlockEvaluation

        return BlockEvaluation(self)

    def load(self, spec, dataset, algorithm):
        from fedpriv.data.spec import load_spec

        ds = dataset if dataset is not None else load_spec(spec)
        inter = ds.interactions
        csr = inter.by_user
        counts = np.bincount(inter.items, minlength=inter.n_items)
        test_means = np.bincount(inter.items, weights=inter.ratings, minlength=inter.n_items) / np.maximum(counts, 1)
        return UserRatings(csr.indptr, csr.indices, csr.data.astype(np.float64), inter.n_items,
                           np.arange(inter.n_users), test_means)

    def user_ids(self, data):
        return data.user_ids

    def new_state(self, algorithm, cfg, data, epsilon, delta, ledger_seed, relation):
        from fedpriv.privacy.accounting import BestOfAccountant, PlannedRelease, calibrate
        from fedpriv.privacy.ledger import PrivacyLedger

        multipliers = calibrate([PlannedRelease(RELEASE, 1, 1.0)], epsilon, delta,
                                integer_orders=cfg.aggregation.secure, relation=relation).multipliers
        state = ItemMeanState(algorithm, cfg, int(data.n_items), dict(multipliers))
        ledger = PrivacyLedger(seed=ledger_seed, budget=(epsilon, delta), accountant=BestOfAccountant())
        return state, ledger

    def block(self, data, users):
        users = np.asarray(users, dtype=np.int64)
        starts, ends = data.indptr[users], data.indptr[users + 1]
        take = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(users) else np.zeros(0, np.int64)
        indptr = np.concatenate([[0], np.cumsum(ends - starts)])
        return UserRatings(indptr, data.items[take], data.ratings[take], data.n_items, data.user_ids[users],
                           data.test_means)

    def client_round(self, kind, block, state):
        n = np.diff(block.indptr)
        w = np.repeat(1.0 / np.sqrt(np.maximum(n, 1)), n)
        r = np.clip(block.ratings, -state.config.clip, state.config.clip)
        counts = np.bincount(block.items, weights=w, minlength=state.n_items)
        sums = np.bincount(block.items, weights=w * r, minlength=state.n_items)
        return (np.concatenate([counts, sums]),)

    def reply_parts(self, kind, state):
        return [ReplyPart("sums", 2 * state.n_items, _sensitivity(state.config))]

    def part_bounds(self, kind, state):
        return [(RELEASE, 2 * state.n_items, _sensitivity(state.config))]

    def eval_sums(self, block, state):
        seen = block.items
        err = (state.means[seen] - block.ratings) ** 2
        return np.array([float(err.sum()), float(len(seen))])

    def evaluate_sums(self, sums, data, state):
        return {"train_rmse": float(np.sqrt(sums[0] / max(sums[1], 1.0)))}

    def write_node_data(self, folder, data) -> None:
        np.savez(folder / "toy_ratings.npz", indptr=data.indptr, items=data.items, ratings=data.ratings,
                 n_items=data.n_items, test_means=data.test_means)

    def load_block(self, folder, partition_id, users_per_node):
        from fedpriv.algorithms.shards import user_block

        with np.load(f"{folder}/toy_ratings.npz") as z:
            whole = UserRatings(z["indptr"], z["items"], z["ratings"], int(z["n_items"]),
                                np.arange(len(z["indptr"]) - 1), z["test_means"])
        users = user_block(partition_id, users_per_node, whole.n_users)
        return users, self.block(whole, users)

    def encode_state(self, state):
        arrays = {} if state.means is None else {"means": state.means}
        return arrays, {"algorithm": state.algorithm, "n_items": state.n_items, "clip": state.config.clip,
                        "floor": state.config.floor, "aggregation": state.config.aggregation.mode}

    def decode_state(self, arrays, scalars):
        cfg = ItemMeanConfig(clip=float(scalars["clip"]), floor=float(scalars["floor"]),
                             aggregation=Aggregation(mode=str(scalars["aggregation"])))
        return ItemMeanState(str(scalars["algorithm"]), cfg, int(scalars["n_items"]), {}, means=arrays.get("means"))


FAMILY = ItemMeanFamily()


def register() -> bool:
    """Put the family in this process's catalogue (True: it was not there)."""
    from fedpriv.algorithms.families import families

    if FAMILY in families():
        return False
    register_family(FAMILY)
    return True


@contextlib.contextmanager
def registered():
    """The family in the catalogue for the block's duration (a test's own family)."""
    added = register()
    try:
        yield FAMILY
    finally:
        if added:
            unregister_family(FAMILY)
