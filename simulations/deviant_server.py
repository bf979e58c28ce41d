"""Red team: a server that deviates from the protocol, against the real node code.

Every deviation of issue 41 item 1 and issue 57 item 8 is played by a server written here (the
honest ServerApp's round machinery, :class:`fedpriv.flower.secure_server.SecureRounds`, with the
run's colluders and so the run's Shamir threshold, driven with what a deviating server would
send) against fedpriv's real ClientApp, over the in-process grid
(:class:`fedpriv.testing.local_grid.LocalGrid`: real Messages and Contexts, each node with its
own ``context.state`` and, by default, a signing identity from the grid's roster). Each
deviation runs twice: with the nodes' own policy from the user's options
(:meth:`fedpriv.flower.node_policy.NodePolicy.for_run`: the defence), then as the positive
control, the same policy with only the line's own defence turned off
(:func:`fedpriv.privacy.defences.disabled`): the attack must then succeed.

- (a) plaintext handler: a central-mode query (``query.counts``) to secure-mode nodes; recovered
  when the replies sum to the exact item counts. Defence ``plaintext-handler``.
- (b) low-noise plan: a plan with z x 1e-6, and one with n_nodes = min_contributors = 10^6 (each
  node's share sized for a million nodes); recovered when the released user count is within 0.5
  of the true one (the honest release's noise std is reported). Defence ``node-budget`` (the
  node accounts the plan under its own contributor assumption; the run's policy sets no noise
  floor).
- (c) key file: the server names a key file whose bytes it chose; it regenerates every node's
  noise share from it and subtracts them; recovered when the result is the exact count.
  Defence ``key-file``.
- (d) key substitution, (f) a Shamir threshold too low for a colluding node: another module's
  (``deviant_keys``), on the node class the secure handlers run. Defences ``key-substitution``,
  ``shamir-threshold``.
- (e) repeated sums: the same honest user-count sum asked ``repeats`` times; recovered when the
  releases the server obtained compose (dp-accounting) to more than the run's epsilon.
  Defence ``node-budget``.
- (g) few contributors: the honest plan summed over 2 of the nodes (the server's own contributor
  check skipped): a release with a fraction of the noise the nodes count on. Recovered when the
  released count is within 0.5 of the 2 nodes' exact count or ``noise_ratio`` (the noise that
  holds against the run's colluder over the noise the node counts on) is below 0.5. Defence
  ``min-contributors``. Unauthenticated nodes (``identity=False``): with identities the
  ``roster`` check (fewer distinct roster names than the floor) refuses it too.
- (h1) split plans: every node but the victim gets the plan with each part's scale divided by
  2**20 (and z x 2**10, so that its budget check passes): their words carry almost nothing in
  the victim's units, and the sum decoded with the victim's plan is the victim's contribution
  plus its own noise share. Recovered as (g), on the victim's contribution. Defence
  ``plan-scale``. Unauthenticated nodes: with identities ``view-consistency`` refuses it too.
- (h2) split models: two exact evaluation measurements; in the second the victim gets another
  broadcast state (reversed item buckets) than the others: the difference of the two totals is
  the victim's own sums under two models. Recovered when it equals the victim's exact
  difference (and is not zero). Defence ``view-consistency`` (authenticated nodes).
- (i1) recommendation probe: ``query.recommend`` with epsilon 1e6 over 2 candidates and a model
  whose item biases make the first candidate score the top of its range and the second the
  middle: a user's pick is the second candidate exactly when the user rated the first.
  Recovered when every answered pick gives the rated bit. Defence ``recommend-epsilon``.
- (i2) the same probe at the cap's epsilon, asked ``repeats`` times (a majority vote).
  Defence ``recommend-count``.
- (j) evaluation buckets: an exact evaluation measurement whose ``item_bucket`` puts 4 chosen
  items in buckets 1-4 and every other item in bucket 0 (the same buckets to every node, so
  their views agree): recovered when buckets 1-4 are the exact per-item sums. Defence
  ``eval-buckets``.
- (k) budget across runs: the node ledger on disk, three runs (new run ids, the node state kept)
  each asking for one user-count sum at 80% of the budget; recovered when what the server
  obtained composes to more than the budget. Defence ``node-budget``. The control line also
  reports the same runs with the ledger in memory (``memory_ledger``).
- (l) a node restart: as (k), two runs, a fresh grid (every node's ``context.state`` wiped) on
  the same ledger files for the second. Defence ``node-budget``.

Each deviation returns one dict: {"deviation", "name", "defence", "defence_id", "recovered",
"refused_by", ...what the server obtained}; ``refused_by`` is the defence the nodes' error
replies name (:func:`fedpriv.privacy.defences.refused_by`, the most common one), None when no
node refused.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import os
import sys
import shutil
import tempfile
import uuid
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict  # noqa: E402

from fedpriv.algorithms import als, evaluation, protocol, recommend  # noqa: E402
from fedpriv.data.spec import load_spec, parse_data_spec  # noqa: E402
from fedpriv.data.splits import random_split  # noqa: E402
from fedpriv.engine.inprocess import new_state  # noqa: E402
from fedpriv.errors import PrivacyError  # noqa: E402
from fedpriv.flower import codec  # noqa: E402
from fedpriv.flower.counters import RoundCounters  # noqa: E402
from fedpriv.flower.node_eval import public_buckets  # noqa: E402
from fedpriv.flower.node_policy import NodePolicy  # noqa: E402
from fedpriv.flower.node_secrets import raw_user_ids  # noqa: E402
from fedpriv.flower.partition import load_shard, write_partitions  # noqa: E402
from fedpriv.flower.rounds import Rounds  # noqa: E402
from fedpriv.flower.secure_server import SecureRounds  # noqa: E402
from fedpriv.privacy import defences, distributed  # noqa: E402
from fedpriv.privacy.accounting import epsilon_rdp  # noqa: E402
from fedpriv.privacy.ledger import PrivacyLedger  # noqa: E402
from fedpriv.privacy.randomness import RunSecrets, user_keys  # noqa: E402
from fedpriv.testing.local_grid import LocalGrid  # noqa: E402

DELTA = 1e-5
#: the run's colluding nodes (NodePolicy.for_run(collusion=1), the default secure_collusion)
COLLUDERS = 1


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
        self.data_dir = str(write_partitions(self.work / "node-data", {"train": split.train, "valid": split.valid, "test": split.test}, {"n_users": n_users}))
        self.cfg = als.ALSConfig.from_overrides({"aggregation": "secure", "steps": "1"}, algorithm)
        self.state, _ = new_state(algorithm, self.cfg, split.train, ds.rating_range, ds.implicit, self.epsilon, DELTA, secrets=RunSecrets(None))
        self.shards = [load_shard(self.data_dir, "train", pid, self.upn) for pid in range(self.nodes)]
        # a model the server broadcasts (evaluation, recommendation): the run's state with item factors
        rng = np.random.default_rng(7)
        self.model = replace(self.state, item_factors=rng.normal(0.0, 0.3, (self.state.n_items, max(1, int(self.cfg.rank)))))
        # the exact item counts the nodes hold (each user's clipped contribution, as the nodes compute it)
        self.true_counts = np.sum([als.client_vector("counts", s, self.state) for s in self.shards], axis=0)
        self.true_users = float(sum(np.sum(als.client_vector("users", s, self.state)) for s in self.shards))

    def policy(self, defence: bool = True, ledger: str | None = None) -> NodePolicy:
        """The user's own policy for its nodes, the same for a deviation and its positive control
        (a control turns one defence off with :func:`fedpriv.privacy.defences.disabled`, never
        with another policy); ``ledger``: where the node ledger lives (None: in memory)."""
        return NodePolicy.for_run(aggregation="secure", epsilon=self.epsilon, delta=DELTA, nodes=self.nodes, dropout=0.0, collusion=COLLUDERS,
                                  reproducible=False, ledger=ledger)

    def content(self, key_file: str | None = None):
        return codec.encode_state(self.state, self.data_dir, self.upn, 0, key_file)

    def users_plan(self, factor: float = 1.0, n_nodes: int | None = None) -> distributed.DistributedPlan:
        """The run's user-count plan (its z and sensitivity), z times ``factor``; ``n_nodes``:
        claims that many nodes (and contributors)."""
        sens, z = als.sensitivity("users", self.cfg, self.state.rating_range), self.state.multipliers["users"]
        n = self.nodes if n_nodes is None else int(n_nodes)
        plan = distributed.plan_round([("users", 1, sens, z * factor)], max_users=self.upn * self.nodes, n_nodes=n, min_contributors=n, colluders=COLLUDERS)
        return LyingPlan(plan.parts, plan.max_users, plan.n_nodes, plan.min_contributors, plan.bits, plan.colluders)

    def honest_users_std(self) -> float:
        """Noise std (users) of the honest user-count release."""
        plan = self.users_plan()
        return distributed.released_std(plan, plan.parts[0], self.nodes) / plan.parts[0].scale


class RunGrid(LocalGrid):
    """A LocalGrid whose nodes see the run id ``run_id`` (LocalGrid's Contexts carry run id 1):
    set it between runs to play several runs against the same nodes (their ``context.state``
    kept)."""

    def __init__(self, n_nodes: int, *, run_id: int = 1, **kw):
        super().__init__(n_nodes, **kw)
        self.run_id = int(run_id)
        inner = self.app

        def app(msg, ctx):
            return inner(msg, Context(run_id=self.run_id, node_id=ctx.node_id, node_config=ctx.node_config, state=ctx.state, run_config=ctx.run_config))

        self.app = app


class TamperRounds(Rounds):
    """The round machinery, with what a deviating server changes in a round's messages:
    ``tamper[message_type](content, nodes)`` returns the content to send (a RecordDict for all,
    or {node: RecordDict})."""

    def __init__(self, *args, tamper: dict | None = None, **kw):
        super().__init__(*args, **kw)
        self.tamper = dict(tamper or {})

    def ask(self, message_type, content, name, timeout=..., nodes=None, report=True):
        if message_type in self.tamper:
            content = self.tamper[message_type](content, list(self.nodes if nodes is None else nodes))
        return super().ask(message_type, content, name, timeout, nodes=nodes, report=report)


_SERVERS: list[list] = []  # the servers made in each deviation being played (their nodes' error replies)


class DeviantServer:
    """The server's side: the honest round machinery (the run's colluders, so the run's Shamir
    threshold), told to do what a deviating server does. ``nodes``: the node ids its rounds
    address (default all); ``grid``: play on that grid (several runs on the same nodes);
    ``ledger``: the nodes' ledger file pattern; ``identity``: whether the nodes sign their keys
    (LocalGrid's default); ``tamper``: see :class:`TamperRounds`."""

    def __init__(self, setup: Setup, defence: bool = True, *, nodes: list[int] | None = None, grid: LocalGrid | None = None,
                 ledger: str | None = None, identity: bool = True, tamper: dict | None = None):
        self.setup = setup
        self.grid = grid if grid is not None else RunGrid(setup.nodes, node_policy=setup.policy(defence, ledger), identity=identity)
        self.errors: list[str] = []
        self.grid.reply_observer = lambda nid, rep: self.errors.append(rep.error.reason) if rep.has_error() else None
        ids = self.grid.get_node_ids() if nodes is None else list(nodes)
        self.rounds = TamperRounds(self.grid, ids, RoundCounters(), None, tamper=tamper)
        self.secure = SecureRounds(self.rounds, setup.upn, colluders=COLLUDERS)
        if _SERVERS:
            _SERVERS[-1].append(self)

    def secure_sum(self, kind: str, plan, content):
        """(the unmasked modular sum, contributors), or None when the nodes refused."""
        try:
            unmask, contributors = self.secure.secure_sum(kind, plan, content, 0)
            return unmask(), contributors
        except PrivacyError:
            return None

    def measure(self, kind: str, parts, content):
        """The exact totals of a measurement sum, or None when the nodes refused."""
        try:
            return self.secure.measure(kind, parts, content)
        except PrivacyError:
            return None

    def refusals(self) -> list[str]:
        return sorted({e.split(": ", 1)[-1][:300] for e in self.errors})


def most_common_defence(reasons) -> str | None:
    """The defence the refusals name most often (:func:`fedpriv.privacy.defences.refused_by`)."""
    named = collections.Counter(d for d in map(defences.refused_by, reasons) if d is not None)
    return named.most_common(1)[0][0] if named else None


def deviation(letter: str, name: str, defence_id: str):
    """A deviation played with the defence (``defence=True``) or as its positive control: the
    same nodes and policy with only ``defence_id`` turned off in this process. Adds the line's
    keys and ``refused_by`` (from the error replies of every server the deviation made)."""

    def wrap(fn):
        @functools.wraps(fn)
        def play(setup: Setup, defence: bool, *args, **kw) -> dict:
            _SERVERS.append([])
            try:
                with (contextlib.nullcontext() if defence else defences.disabled(defence_id)):
                    out = fn(setup, defence, *args, **kw)
            finally:
                servers = _SERVERS.pop()
            errors = [e for srv in servers for e in srv.errors]
            head = {"deviation": letter, "name": name, "defence": bool(defence), "defence_id": defence_id,
                    "recovered": bool(out.pop("recovered")), "refused_by": most_common_defence(errors)}
            if not defence:
                head["disabled"] = [defence_id]
            return {**head, **out, "refusals": sorted({e.split(": ", 1)[-1][:300] for e in errors})}

        play.letter, play.defence_id = letter, defence_id
        return play

    return wrap


@deviation("a", "plaintext handler", "plaintext-handler")
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
    return {"recovered": recovered, "query": "query.counts", "nodes_answered": answered, "nodes": setup.nodes, "exact_item_counts": recovered,
            "max_abs_error": float(np.max(np.abs(total - setup.true_counts))) if answered == setup.nodes else None}


@deviation("b", "low-noise plan", "node-budget")
def low_noise_plan(setup: Setup, defence: bool) -> dict:
    """(b) Plans whose noise is negligible: z x 1e-6, or shares sized for 10^6 nodes."""
    out = {"true_count": setup.true_users, "honest_noise_std": setup.honest_users_std()}
    recovered = False
    for variant, plan in (("z x 1e-6", setup.users_plan(factor=1e-6)), ("n_nodes = min_contributors = 10^6", setup.users_plan(n_nodes=10**6))):
        server = DeviantServer(setup, defence)
        got = server.secure_sum("users", plan, setup.content())
        released = None if got is None else float(distributed.decode(plan, got[0], got[1])["users"][0])
        hit = released is not None and abs(released - setup.true_users) < 0.5
        recovered |= hit
        out[variant] = {"released_count": released, "recovered": hit, "refused_by": most_common_defence(server.errors)}
    return {"recovered": recovered, **out}


@deviation("c", "key file", "key-file")
def key_file(setup: Setup, defence: bool) -> dict:
    """(c) A key file whose bytes the server chose: it regenerates every node's noise share."""
    key = os.urandom(32)
    path = setup.work / f"server-chosen-{uuid.uuid4().hex[:8]}.key"
    path.write_bytes(key)
    server = DeviantServer(setup, defence)
    plan = setup.users_plan()  # an honest plan: the deviation is the key file only
    got = server.secure_sum("users", plan, setup.content(str(path)))
    out = {"true_count": setup.true_users, "honest_noise_std": setup.honest_users_std()}
    if got is None:
        return {**out, "recovered": False, "released_count": None, "noise_removed_count": None}
    total, contributors = got
    released = float(distributed.decode(plan, total, contributors)["users"][0])
    noise = np.zeros(plan.length, dtype=np.uint64)
    for shard in setup.shards:  # each node's share, as the node draws it from the server's key
        keyed = replace(shard, user_keys=user_keys(key, raw_user_ids(setup.data_dir, shard.user_ids)))
        rng = distributed_rng(keyed)
        noise = distributed.add_words(plan, noise, distributed.encode(plan, {"users": np.zeros(1)}, rng))
    exact = float(distributed.decode(plan, (total - noise) & plan.modulus_mask, contributors)["users"][0])
    return {**out, "recovered": abs(exact - setup.true_users) < 1e-6, "released_count": released, "noise_removed_count": exact}


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


@deviation("e", "repeated sums", "node-budget")
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
    return {"recovered": bool(eps > setup.epsilon * (1 + 1e-3)),
            "sums_asked": repeats, "sums_obtained": len(values), "epsilon_obtained": eps, "epsilon_of_run": setup.epsilon,
            "true_count": setup.true_users, "average_count": estimate, "average_std": release_std / math.sqrt(len(values)) if values else None,
            "release_noise_std": release_std}


def _users_of(setup: Setup, partitions) -> float:
    """The exact (clipped) user count of the nodes of ``partitions``."""
    return float(sum(np.sum(als.client_vector("users", setup.shards[p], setup.state)) for p in partitions))


@deviation("g", "few contributors", "min-contributors")
def few_contributors(setup: Setup, defence: bool, members: int = 2) -> dict:
    """(g) The honest user-count plan summed over ``members`` nodes only (the server skips its
    own contributor check): the release carries the noise of ``members`` shares, of which the
    run's colluder may know one, where every node counts on ``min_contributors - colluders``.
    Unauthenticated nodes (with identities the roster check refuses too: fewer distinct roster
    names than the floor)."""
    ids = [1000 + p for p in range(members)]
    server = DeviantServer(setup, defence, nodes=ids, identity=False)
    plan = setup.users_plan()
    exact = _users_of(setup, range(members))
    got = server.secure_sum("users", plan, setup.content())
    out = {"members": members, "nodes": setup.nodes, "exact_count_of_members": exact, "honest_noise_std": setup.honest_users_std(), "identities": False}
    if got is None:
        return {**out, "recovered": False, "released_count": None, "noise_ratio": None}
    part, m = plan.parts[0], server.grid.node_policy.min_contributors
    released = float(distributed.decode(plan, got[0], got[1])["users"][0])
    ratio = distributed.released_std(plan, part, got[1]) / distributed.released_std(plan, part, m)  # noise that holds against the colluder
    return {**out, "recovered": abs(released - exact) < 0.5 or ratio < 0.5, "released_count": released, "contributors": got[1],
            "noise_ratio": ratio, "noise_ratio_without_colluders": math.sqrt(got[1] / m)}


@deviation("h1", "split plans", "plan-scale")
def split_plans(setup: Setup, defence: bool, victim: int = 0) -> dict:
    """(h1) The victim gets the honest user-count plan; every other node a plan whose scale is
    divided by 2**20 (z x 2**10: its noise, in its own units, within its budget). The sum
    decoded with the victim's plan is the victim's count, its own noise share and 2**-20 of the
    others'. Unauthenticated nodes (with identities the view check refuses too: the plan is in
    the view every survivor signs)."""
    honest = setup.users_plan()
    p = honest.parts[0]
    small = distributed.PartPlan(p.name, p.length, p.sensitivity, p.noise_multiplier * 2**10, p.scale / 2**20, p.offset)
    others = LyingPlan((small,), honest.max_users, honest.n_nodes, honest.min_contributors, honest.bits, honest.colluders)
    vid = 1000 + victim

    def tamper(content, nodes):
        out = {}
        for n, rd in content.items():
            if n != vid:
                rd = RecordDict(dict(rd.items()))
                rd["secagg"] = ConfigRecord({**dict(rd["secagg"].items()), "plan": json.dumps(others.to_dict())})
            out[n] = rd
        return out

    server = DeviantServer(setup, defence, identity=False, tamper={"query.secagg_mask": tamper})
    exact = _users_of(setup, [victim])
    got = server.secure_sum("users", honest, setup.content())
    m = server.grid.node_policy.min_contributors
    var = honest.share_variance(p) + (setup.nodes - 1) * others.share_variance(small)  # words, around the victim's count
    ratio = math.sqrt(var) / distributed.released_std(honest, p, m)
    out = {"victim_partition": victim, "victim_exact_count": exact, "honest_noise_std": setup.honest_users_std(), "identities": False,
           "other_nodes_scale_factor": 2.0**-20}
    if got is None:
        return {**out, "recovered": False, "released_count": None, "noise_ratio": None}
    released = float(distributed.decode(honest, got[0], got[1])["users"][0])
    return {**out, "recovered": abs(released - exact) < 0.5 or ratio < 0.5, "released_count": released, "error": released - exact,
            "noise_ratio": ratio}


def _eval_content(setup: Setup, state, item_bucket=None) -> RecordDict:
    content = codec.encode_state(state, setup.data_dir, setup.upn, 0, None)
    bucket = public_buckets(state) if item_bucket is None else np.asarray(item_bucket, dtype=np.int64)
    content["eval"] = ArrayRecord({"item_bucket": codec.to_array(bucket)})
    return content


def _eval_sums(setup: Setup, state, partitions, item_bucket=None) -> dict:
    """The exact evaluation sums of the nodes of ``partitions`` (as each computes them)."""
    bucket = public_buckets(state) if item_bucket is None else np.asarray(item_bucket, dtype=np.int64)
    total: dict = {}
    for pid in partitions:
        shards = [load_shard(setup.data_dir, part, pid, setup.upn) for part in ("train", "valid", "test")]
        for k, v in evaluation.node_eval_sums(state, *shards, bucket, protocol.is_logistic(state.algorithm)).items():
            total[k] = total.get(k, 0.0) + np.asarray(v, dtype=np.float64)
    return total


def _eval_parts(state) -> list[tuple[str, int]]:
    return [(k, 5) for k in evaluation.eval_keys(protocol.is_logistic(state.algorithm))]


@deviation("h2", "split models", "view-consistency")
def split_models(setup: Setup, defence: bool, victim: int = 0) -> dict:
    """(h2) Two exact evaluation measurements: the first with the run's state to every node, the
    second with another state (its item buckets reversed) to the victim only. Their difference
    is the victim's own sums under the two states."""
    S = setup.model
    base = np.asarray(S.counts_hat, dtype=np.float64) if S.counts_hat is not None else np.zeros(S.n_items)
    ranks = np.argsort(np.argsort(base, kind="stable"), kind="stable")
    S2 = replace(S, counts_hat=-ranks.astype(np.float64))  # the reversed order: other buckets, the public rule of S2
    c1, c2 = _eval_content(setup, S), _eval_content(setup, S2)
    vid = 1000 + victim

    def tamper(content, nodes):
        out = dict(content)
        rd = RecordDict(dict(c2.items()))
        for k in ("secagg", "mask_keys", "ciphertexts"):
            rd[k] = content[vid][k]
        out[vid] = rd
        return out

    server = DeviantServer(setup, defence)
    parts = _eval_parts(S)
    t1 = server.measure("eval", parts, c1)
    server.rounds.tamper["query.secagg_mask"] = tamper
    t2 = server.measure("eval", parts, c1)
    truth = {k: _eval_sums(setup, S2, [victim])[k] - _eval_sums(setup, S, [victim])[k] for k, _ in parts}
    out = {"victim_partition": victim, "measurements_obtained": int(t1 is not None) + int(t2 is not None), "identities": True,
           "victim_true_difference": {k: v.tolist() for k, v in truth.items()}}
    if t1 is None or t2 is None:
        return {**out, "recovered": False, "obtained_difference": None}
    diff = {k: np.asarray(t2[k], dtype=np.float64) - np.asarray(t1[k], dtype=np.float64) for k, _ in parts}
    exact = all(np.allclose(diff[k], truth[k], rtol=0.0, atol=1e-4) for k in diff)
    return {**out, "recovered": bool(exact and any(np.any(v != 0) for v in truth.values())), "obtained_difference": {k: v.tolist() for k, v in diff.items()}}


def _probe_setup(setup: Setup):
    """The probe: candidates (a, b) with a the item rated by about half the users; a model
    where a's item bias is +100 and b's -100 (their factors zero): a scores the top of its
    range, the rating range, and b the bottom of its range, the upper half. A user's pick is b
    exactly when the user rated a (a rated item scores the bottom of its range)."""
    S = setup.model
    raters = np.zeros(S.n_items)
    for shard in setup.shards:
        raters += np.asarray(recommend.rated_mask(shard, np.arange(S.n_items)).sum(axis=0), dtype=np.float64)
    n_users = sum(s.n_users for s in setup.shards)
    a = int(np.argmin(np.abs(raters - n_users / 2)))
    b = int(np.argmin(np.where(np.arange(S.n_items) == a, np.inf, raters)))  # any other item
    cand = np.array(sorted((a, b)), dtype=np.int64)
    r0, r1 = (float(x) for x in S.rating_range)
    bias = np.zeros(S.n_items) if S.item_bias is None else np.zeros_like(np.asarray(S.item_bias, dtype=np.float64))
    bias[a], bias[b] = 100.0, -100.0
    factors = None if S.item_factors is None else np.array(S.item_factors, copy=True)
    if factors is not None:
        factors[[a, b]] = 0.0
    probe = replace(S, item_bias=bias, item_factors=factors)
    truth = {1000 + pid: recommend.rated_mask(shard, cand)[:, int(np.flatnonzero(cand == a)[0])] for pid, shard in enumerate(setup.shards)}
    lo, hi = np.full(2, r0), np.full(2, r1)
    lo[cand == b] = (r0 + r1) / 2
    return probe, cand, a, b, (lo, hi), truth


def _recommend_probe(setup: Setup, defence: bool, epsilon: float, repeats: int, lifetime_cap: float | None = None) -> dict:
    from fedpriv.flower.recommend_handlers import _cfg_record

    probe, cand, a, b, (lo, hi), truth = _probe_setup(setup)
    cfg = recommend.RecommendConfig(mechanism="mgem", epsilon=float(epsilon), candidates=2, sensitivity="range")
    content = codec.encode_state(probe, setup.data_dir, setup.upn)
    content["rec"] = ArrayRecord({"candidates": codec.to_array(cand), "lo": codec.to_array(lo), "hi": codec.to_array(hi)})
    content["rec_cfg"] = _cfg_record(cfg, False)
    grid = None
    if lifetime_cap is not None:  # an operator's lifetime cap that covers many runs' queries
        grid = RunGrid(setup.nodes, node_policy=setup.policy(defence).with_changes(max_recommend_epsilon=float(lifetime_cap)))
    server = DeviantServer(setup, defence, grid=grid)
    ib = int(np.flatnonzero(cand == b)[0])
    votes: dict[int, list] = {}
    answers = 0
    for _ in range(repeats):
        for nid, rep in server.rounds.ask("query.recommend", content, "recommend", timeout=None):
            picks = rep.content.array_records["rec"]["picks"].numpy()
            votes.setdefault(nid, []).append(picks == ib)
            answers += 1
    share = {nid: np.mean(v, axis=0) for nid, v in votes.items()}  # each user's share of picks of b
    # one pick (i1) is read as is; repeated picks (i2) are split in two groups by a 1-D 2-means over
    # every user's share (the raters of a pick b more often, whatever the epsilon)
    cut = 0.5
    if repeats > 1 and share:
        x = np.concatenate(list(share.values()))
        for _ in range(50):
            lo_g, hi_g = x[x <= cut], x[x > cut]
            new_cut = 0.5 * ((lo_g.mean() if lo_g.size else x.min()) + (hi_g.mean() if hi_g.size else x.max()))
            if new_cut == cut:
                break
            cut = float(new_cut)
    guessed = {nid: v > cut for nid, v in share.items()}
    right = sum(int(np.sum(g == truth[nid])) for nid, g in guessed.items())
    users = sum(len(g) for g in guessed.values())
    seen = np.concatenate([truth[nid] for nid in guessed]) if guessed else np.zeros(0, bool)
    # recovered: every user's answer (one exact pick), or at least 90% of them from repeats (chance: 50%)
    need = users if repeats == 1 else math.ceil(0.9 * users)
    recovered = bool(guessed) and right >= need and bool(seen.any()) and not bool(seen.all())
    return {"recovered": recovered, "epsilon_asked": float(epsilon), "queries": repeats, "answers": answers, "nodes_answered": len(guessed),
            "candidates": cand.tolist(), "probed_item": a, "users_guessed": users, "users_right": right,
            "node_cap": server.grid.node_policy.max_recommend_epsilon}


@deviation("i1", "recommendation probe", "recommend-epsilon")
def recommend_probe(setup: Setup, defence: bool) -> dict:
    """(i1) ``query.recommend`` at epsilon 1e6: every pick says whether its user rated the probed item."""
    return _recommend_probe(setup, defence, 1e6, 1)


@deviation("i2", "repeated recommendation probes", "recommend-count")
def repeated_probes(setup: Setup, defence: bool, repeats: int = 301) -> dict:
    """(i2) The probe at epsilon 2, asked ``repeats`` times in one run: a majority vote. The
    nodes' operator set a lifetime recommendation cap of 2 x ``repeats`` (one query of epsilon 2
    per run for ``repeats`` runs), so the cap alone does not stop the repeats: the per-run count does."""
    return _recommend_probe(setup, defence, 2.0, repeats, lifetime_cap=2.0 * repeats)


@deviation("j", "evaluation buckets", "eval-buckets")
def eval_buckets(setup: Setup, defence: bool) -> dict:
    """(j) An exact evaluation measurement whose buckets put 4 chosen items (the victim node's
    first held-out items) in buckets 1-4 and every other item in bucket 0: buckets 1-4 are exact
    per-item sums. The same buckets go to every node (their views agree)."""
    valid = load_shard(setup.data_dir, "valid", 0, setup.upn)
    items = list(dict.fromkeys(int(i) for i in valid.items))[:4]
    for i in range(setup.state.n_items):  # fewer than 4 held-out items: any others
        if len(items) == 4:
            break
        if i not in items:
            items.append(i)
    bucket = np.zeros(setup.state.n_items, dtype=np.int64)
    bucket[items] = np.arange(1, 5)
    server = DeviantServer(setup, defence)
    parts = _eval_parts(setup.model)
    got = server.measure("eval", parts, _eval_content(setup, setup.model, bucket))
    truth = _eval_sums(setup, setup.model, range(setup.nodes), bucket)
    out = {"items": items, "true_per_item": {k: v[1:].tolist() for k, v in truth.items()}}
    if got is None:
        return {**out, "recovered": False, "obtained_per_item": None}
    exact = all(np.allclose(np.asarray(got[k])[1:], truth[k][1:], rtol=0.0, atol=1e-4) for k, _ in parts)
    nonzero = any(np.any(truth[k][1:] != 0) for k, _ in parts)
    return {**out, "recovered": bool(exact and nonzero), "obtained_per_item": {k: np.asarray(v)[1:].tolist() for k, v in got.items()}}


def _budget_runs(setup: Setup, grids: list[tuple[LocalGrid, int]], share: float = 0.8) -> dict:
    """One user-count sum at ``share`` of the budget in each (grid, run id); what the server
    obtained, composed."""
    ledger, values = PrivacyLedger(), []
    factor = single_release_factor(setup, share)
    for grid, run_id in grids:
        grid.run_id = run_id
        server = DeviantServer(setup, grid=grid)
        plan = setup.users_plan(factor=factor)
        got = server.secure_sum("users", plan, setup.content())
        if got is not None:
            values.append(float(ledger.skellam_round(plan, lambda: distributed.decode(plan, got[0], got[1]), got[1])["users"][0]))
    eps = epsilon_rdp(ledger, DELTA) if values else 0.0
    return {"recovered": bool(eps > setup.epsilon * (1 + 1e-3)), "runs": len(grids), "sums_obtained": len(values), "epsilon_obtained": eps,
            "budget": setup.epsilon, "share_per_run": share}


def _ledger_pattern(setup: Setup) -> str:
    return str(setup.work / f"ledgers-{uuid.uuid4().hex[:8]}" / "node-{partition}.json")


@deviation("k", "budget across runs", "node-budget")
def budget_across_runs(setup: Setup, defence: bool, runs: int = 3) -> dict:
    """(k) Three runs (new run ids, the nodes' state kept) on the node ledger files, each asking
    for one user-count sum at 80% of the budget. The defence line also reports the same runs
    with the ledger in memory (``memory_ledger``: one run's budget each)."""
    grid = RunGrid(setup.nodes, node_policy=setup.policy(True, _ledger_pattern(setup)))
    out = _budget_runs(setup, [(grid, r + 1) for r in range(runs)])
    out["ledger"] = "file"
    if defence:
        mem = RunGrid(setup.nodes, node_policy=setup.policy(True, None))
        m = _budget_runs(setup, [(mem, r + 1) for r in range(runs)])
        out["memory_ledger"] = {k: m[k] for k in ("recovered", "sums_obtained", "epsilon_obtained")}
    return out


@deviation("l", "node restart", "node-budget")
def node_restart(setup: Setup, defence: bool) -> dict:
    """(l) Two runs at 80% of the budget each; between them every node restarts (a fresh grid:
    its ``context.state`` wiped) on the same ledger files."""
    pattern = _ledger_pattern(setup)
    first, second = (RunGrid(setup.nodes, node_policy=setup.policy(True, pattern)) for _ in range(2))
    return {**_budget_runs(setup, [(first, 1), (second, 2)]), "ledger": "file", "state_wiped": True}


#: letter -> the deviations it plays ((d), (f): deviant_keys)
DEVIATIONS = {"a": [plaintext_handler], "b": [low_noise_plan], "c": [key_file], "e": [repeated_sums], "g": [few_contributors],
              "h": [split_plans, split_models], "i": [recommend_probe, repeated_probes], "j": [eval_buckets], "k": [budget_across_runs],
              "l": [node_restart]}
ALL = "abcdefghijkl"


def deviations(data: str, *, epsilon: float = 1.0, nodes: int = 24, algorithm: str = "adadpals", which: str = ALL) -> list[dict]:
    """Every deviation with the defence on, then every positive control (only the line's own
    defence off): one dict each."""
    import logging

    quiet = logging.getLogger("fedpriv.flower")  # every refusal is logged once per node: keep the output to the result lines
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
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
        for d in sorted(set(which)):
            if d in "df":
                if key_substitution is not None:
                    out.append((key_substitution if d == "d" else colluding_threshold)(defence))
            else:
                out.extend(fn(setup, defence) for fn in DEVIATIONS.get(d, []))
    return out


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="synthetic-mf:users=240,items=80,ratings=4800,seed=3")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--nodes", type=int, default=24)
    a = p.parse_args()
    for line in deviations(a.data, epsilon=a.epsilon, nodes=a.nodes):
        print(json.dumps(line, default=float))
