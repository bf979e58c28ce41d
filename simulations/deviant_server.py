"""Red team: a server that deviates from the protocol, against the real node code.

Every deviation of issue 41 item 1 is played by a server written here (the honest ServerApp's
round machinery, :class:`fedpriv.flower.secure_server.SecureRounds`, driven with what a deviating
server would send) against fedpriv's real ClientApp, over the in-process grid
(:class:`fedpriv.testing.local_grid.LocalGrid`: real Messages and Contexts, each node with its
own ``context.state``). Each deviation runs twice: with the nodes' own policy from the user's
options (:meth:`fedpriv.flower.node_policy.NodePolicy.for_run`: the defence) and with the
permissive policy (no defence: the positive control, which must recover).

- (a) plaintext handler: a central-mode query (``query.counts``) to secure-mode nodes; recovered
  when the replies sum to the exact item counts.
- (b) low-noise plan: a plan with z x 1e-6, and one with n_nodes = min_contributors = 10^6 (each
  node's share sized for a million nodes); recovered when the released user count is within 0.5
  of the true one (the honest release's noise std is reported).
- (c) key file: the server names a key file whose bytes it chose; it regenerates every node's
  noise share from it and subtracts them; recovered when the result is the exact count.
- (e) repeated sums: the same honest user-count sum asked ``repeats`` times; recovered when the
  releases the server obtained compose (dp-accounting) to more than the run's epsilon.
- (d) key substitution and (f) a Shamir threshold too low for a colluding node are another
  module's (``deviant_keys.key_substitution``, ``deviant_keys.colluding_threshold``, on the
  node class the secure handlers run, which get the colluders from the node's policy); their
  lines join these when it is there.

Each deviation returns one dict: {"deviation", "name", "defence", "recovered", ...what the
server obtained}.
"""

from __future__ import annotations

import math
import os
import sys
import shutil
import tempfile
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedpriv.algorithms import als  # noqa: E402
from fedpriv.data.spec import load_spec, parse_data_spec  # noqa: E402
from fedpriv.data.splits import random_split  # noqa: E402
from fedpriv.engine.inprocess import new_state  # noqa: E402
from fedpriv.errors import PrivacyError  # noqa: E402
from fedpriv.flower import codec  # noqa: E402
from fedpriv.flower.counters import RoundCounters  # noqa: E402
from fedpriv.flower.node_policy import NodePolicy  # noqa: E402
from fedpriv.flower.node_secrets import raw_user_ids  # noqa: E402
from fedpriv.flower.partition import load_shard, write_partitions  # noqa: E402
from fedpriv.flower.rounds import Rounds  # noqa: E402
from fedpriv.flower.secure_server import SecureRounds  # noqa: E402
from fedpriv.privacy import distributed  # noqa: E402
from fedpriv.privacy.accounting import epsilon_rdp  # noqa: E402
from fedpriv.privacy.ledger import PrivacyLedger  # noqa: E402
from fedpriv.privacy.randomness import RunSecrets, user_keys  # noqa: E402
from fedpriv.testing.local_grid import LocalGrid  # noqa: E402

DELTA = 1e-5


class LyingPlan(distributed.DistributedPlan):
    """A plan whose server skips its own contributor check (a deviating server unmasks anyway)."""

    def check_contributors(self, n: int) -> None:
        return None


class Setup:
    """The data on the nodes (written as a simulation's server writes it), the run's public state
    (calibrated to ``epsilon`` for the whole run, secure mode) and the true values."""

    def __init__(self, data: str, *, nodes: int, epsilon: float, algorithm: str = "adadpals", work: Path | None = None):
        ds = load_spec(parse_data_spec(data))
        split = random_split(ds.interactions, seed=1234)
        self.work = Path(work or tempfile.mkdtemp(prefix="fedpriv-deviant-"))
        if work is None:  # its own folder holds copies of the ratings: removed with the object, or at exit
            weakref.finalize(self, shutil.rmtree, str(self.work), True)
        self.nodes, self.epsilon, self.algorithm = int(nodes), float(epsilon), algorithm
        n_users = split.train.n_users
        self.upn = -(-n_users // self.nodes)
        self.nodes = -(-n_users // self.upn)  # every node holds a partition
        self.data_dir = str(write_partitions(self.work / "node-data", {"train": split.train, "valid": split.valid}, {"n_users": n_users}))
        self.cfg = als.ALSConfig.from_overrides({"aggregation": "secure", "steps": "1"}, algorithm)
        self.state, _ = new_state(algorithm, self.cfg, split.train, ds.rating_range, ds.implicit, self.epsilon, DELTA, secrets=RunSecrets(None))
        self.shards = [load_shard(self.data_dir, "train", pid, self.upn) for pid in range(self.nodes)]
        # the exact item counts the nodes hold (each user's clipped contribution, as the nodes compute it)
        self.true_counts = np.sum([als.client_vector("counts", s, self.state) for s in self.shards], axis=0)
        self.true_users = float(sum(np.sum(als.client_vector("users", s, self.state)) for s in self.shards))

    def policy(self, defence: bool) -> NodePolicy:
        """The user's own policy for its nodes (defence), or none at all (positive control)."""
        if not defence:
            return NodePolicy.permissive()
        return NodePolicy.for_run(aggregation="secure", epsilon=self.epsilon, delta=DELTA, nodes=self.nodes, dropout=0.0, collusion=1, reproducible=False)

    def content(self, key_file: str | None = None):
        return codec.encode_state(self.state, self.data_dir, self.upn, 0, key_file)

    def users_plan(self, factor: float = 1.0, n_nodes: int | None = None) -> distributed.DistributedPlan:
        """The run's user-count plan (its z and sensitivity), z times ``factor``; ``n_nodes``:
        claims that many nodes (and contributors)."""
        sens, z = als.sensitivity("users", self.cfg, self.state.rating_range), self.state.multipliers["users"]
        n = self.nodes if n_nodes is None else int(n_nodes)
        plan = distributed.plan_round([("users", 1, sens, z * factor)], max_users=self.upn * self.nodes, n_nodes=n, min_contributors=n, colluders=1)
        return LyingPlan(plan.parts, plan.max_users, plan.n_nodes, plan.min_contributors, plan.bits, plan.colluders)

    def honest_users_std(self) -> float:
        """Noise std (users) of the honest user-count release."""
        plan = self.users_plan()
        return distributed.released_std(plan, plan.parts[0], self.nodes) / plan.parts[0].scale


class DeviantServer:
    """The server's side: the honest round machinery, told to do what a deviating server does."""

    def __init__(self, setup: Setup, defence: bool):
        self.setup = setup
        self.grid = LocalGrid(setup.nodes, node_policy=setup.policy(defence))
        self.errors: list[str] = []
        self.grid.reply_observer = lambda nid, rep: self.errors.append(rep.error.reason) if rep.has_error() else None
        self.rounds = Rounds(self.grid, self.grid.get_node_ids(), RoundCounters(), None)
        self.secure = SecureRounds(self.rounds, setup.upn)

    def secure_sum(self, kind: str, plan, content):
        """(the unmasked modular sum, contributors), or None when the nodes refused."""
        try:
            unmask, contributors = self.secure.secure_sum(kind, plan, content, 0)
            return unmask(), contributors
        except PrivacyError:
            return None

    def refusals(self) -> list[str]:
        return sorted({e.split(": ", 1)[-1][:300] for e in self.errors})


def plaintext_handler(setup: Setup, defence: bool) -> dict:
    """(a) A central-mode query to secure-mode nodes: the exact item counts."""
    server = DeviantServer(setup, defence)
    total, answered = np.zeros(setup.state.n_items), 0
    for _, rep in server.rounds.ask("query.counts", setup.content(), "counts", timeout=None):
        if rep.has_error():
            continue
        total += codec.decode_vector(rep.content, "counts", setup.state.n_items, setup.state, setup.upn)
        answered += 1
    recovered = answered == setup.nodes and bool(np.allclose(total, setup.true_counts, rtol=0.0, atol=1e-9))
    return {"deviation": "a", "name": "plaintext handler", "defence": defence, "recovered": recovered, "query": "query.counts",
            "nodes_answered": answered, "nodes": setup.nodes, "exact_item_counts": recovered,
            "max_abs_error": float(np.max(np.abs(total - setup.true_counts))) if answered == setup.nodes else None, "refusals": server.refusals()}


def low_noise_plan(setup: Setup, defence: bool) -> dict:
    """(b) Plans whose noise is negligible: z x 1e-6, or shares sized for 10^6 nodes."""
    out = {"deviation": "b", "name": "low-noise plan", "defence": defence, "true_count": setup.true_users, "honest_noise_std": setup.honest_users_std()}
    recovered, refusals = False, []
    for variant, plan in (("z x 1e-6", setup.users_plan(factor=1e-6)), ("n_nodes = min_contributors = 10^6", setup.users_plan(n_nodes=10**6))):
        server = DeviantServer(setup, defence)
        got = server.secure_sum("users", plan, setup.content())
        released = None if got is None else float(distributed.decode(plan, got[0], got[1])["users"][0])
        hit = released is not None and abs(released - setup.true_users) < 0.5
        recovered |= hit
        out[variant] = {"released_count": released, "recovered": hit}
        refusals += server.refusals()
    out["recovered"] = recovered
    out["refusals"] = sorted(set(refusals))
    return out


def key_file(setup: Setup, defence: bool) -> dict:
    """(c) A key file whose bytes the server chose: it regenerates every node's noise share."""
    key = os.urandom(32)
    path = setup.work / "server-chosen.key"
    path.write_bytes(key)
    server = DeviantServer(setup, defence)
    plan = setup.users_plan()  # an honest plan: the deviation is the key file only
    got = server.secure_sum("users", plan, setup.content(str(path)))
    out = {"deviation": "c", "name": "key file", "defence": defence, "true_count": setup.true_users, "honest_noise_std": setup.honest_users_std()}
    if got is None:
        return {**out, "recovered": False, "released_count": None, "noise_removed_count": None, "refusals": server.refusals()}
    total, contributors = got
    released = float(distributed.decode(plan, total, contributors)["users"][0])
    noise = np.zeros(plan.length, dtype=np.uint64)
    for shard in setup.shards:  # each node's share, as the node draws it from the server's key
        keyed = replace(shard, user_keys=user_keys(key, raw_user_ids(setup.data_dir, shard.user_ids)))
        rng = distributed_rng(keyed)
        noise = distributed.add_words(plan, noise, distributed.encode(plan, {"users": np.zeros(1)}, rng))
    exact = float(distributed.decode(plan, (total - noise) & plan.modulus_mask, contributors)["users"][0])
    return {**out, "recovered": abs(exact - setup.true_users) < 1e-6, "released_count": released, "noise_removed_count": exact, "refusals": server.refusals()}


def distributed_rng(shard):
    from fedpriv.algorithms import secure

    return secure.node_rng(shard, secure.label("users"), True)


def single_release_factor(setup: Setup, share: float = 0.8) -> float:
    """The factor on the run's user-count z that makes one user-count release spend ``share`` of
    the run's epsilon (a run that releases that count alone would plan it so)."""
    def eps(f: float) -> float:
        led = PrivacyLedger()
        plan = setup.users_plan(factor=f)
        led.skellam_round(plan, lambda: None, setup.nodes)
        return epsilon_rdp(led, DELTA)

    lo, hi = 1e-3, 1.0  # eps decreases with the factor
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if eps(mid) > share * setup.epsilon else (lo, mid)
    return hi


def repeated_sums(setup: Setup, defence: bool, repeats: int = 10) -> dict:
    """(e) The same user-count sum, each planned within the run's budget (80% of its epsilon),
    ``repeats`` times: the average sharpens, and what the server obtained composes to more than
    the run's epsilon."""
    server = DeviantServer(setup, defence)
    ledger = PrivacyLedger()  # what the server obtained, accounted (no budget: the server's own view)
    values = []
    factor = single_release_factor(setup)
    for _ in range(repeats):
        plan = setup.users_plan(factor=factor)
        got = server.secure_sum("users", plan, setup.content())
        if got is None:
            continue
        values.append(float(ledger.skellam_round(plan, lambda: distributed.decode(plan, got[0], got[1]), got[1])["users"][0]))
    eps = epsilon_rdp(ledger, DELTA) if values else 0.0
    plan = setup.users_plan(factor=factor)
    release_std = distributed.released_std(plan, plan.parts[0], setup.nodes) / plan.parts[0].scale
    estimate = float(np.mean(values)) if values else None
    return {"deviation": "e", "name": "repeated sums", "defence": defence, "recovered": bool(eps > setup.epsilon * (1 + 1e-3)),
            "sums_asked": repeats, "sums_obtained": len(values), "epsilon_obtained": eps, "epsilon_of_run": setup.epsilon,
            "true_count": setup.true_users, "average_count": estimate, "average_std": release_std / math.sqrt(len(values)) if values else None,
            "release_noise_std": release_std, "refusals": server.refusals()}


DEVIATIONS = {"a": plaintext_handler, "b": low_noise_plan, "c": key_file, "e": repeated_sums}


def deviations(data: str, *, epsilon: float = 1.0, nodes: int = 24, algorithm: str = "adadpals", which: str = "abcdef") -> list[dict]:
    """Every deviation with the defence on, then every positive control (defence off): one dict each."""
    import logging

    quiet = logging.getLogger("fedpriv.flower")  # every refusal is logged once per node: keep the output to the result lines
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _deviations(data, epsilon=epsilon, nodes=nodes, algorithm=algorithm, which=which)
    finally:
        quiet.setLevel(level)


def _deviations(data: str, *, epsilon: float, nodes: int, algorithm: str, which: str) -> list[dict]:
    setup = Setup(data, nodes=nodes, epsilon=epsilon, algorithm=algorithm)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # deviant_keys sits beside this file
    try:
        from deviant_keys import colluding_threshold, key_substitution  # (d), (f): another module's, when it is there
    except ImportError:
        key_substitution = colluding_threshold = None
    out = []
    for defence in (True, False):
        for d in sorted(which):
            if d in "df":
                if key_substitution is not None:
                    out.append((key_substitution if d == "d" else colluding_threshold)(defence))
            elif d in DEVIATIONS:
                out.append(DEVIATIONS[d](setup, defence))
    return out


if __name__ == "__main__":
    import argparse
    import json

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="synthetic-mf:users=240,items=80,ratings=4800,seed=3")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--nodes", type=int, default=24)
    a = p.parse_args()
    for line in deviations(a.data, epsilon=a.epsilon, nodes=a.nodes):
        print(json.dumps(line, default=float))
