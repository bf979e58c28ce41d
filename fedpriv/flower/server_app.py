"""The fedpriv ServerApp: the alternating loop over Flower messages.

Rounds: node info, private user count, private mean, private counts, then one round per alternating step, then
evaluation. Every reply is validated (:mod:`fedpriv.flower.codec`) before it may be summed;
rejected replies are logged with their reason and left out. The secure-aggregator step (sum,
then noise through the ledger) is :func:`fedpriv.algorithms.als.release_item_stats` and friends,
the same functions as the in-process engine; the server step then only sees noised releases.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from ..util import atomic
from ..algorithms import evaluation, metrics
from ..algorithms import als, protocol
from ..engine.inprocess import new_state
from ..errors import ConfigError, FedprivError, PrivacyError
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets
from ..privacy.target import ADD_REMOVE
from . import codec
from .counters import RoundCounters
from .rounds import Rounds, job_rounds, wait_for_nodes
from .secure_server import SecureRounds
from ..engine.loop import Hooks, RatingTransport, make_aggregator, train_rounds
from .node_secrets import write_key_file
from .partition import write_feature_table, write_partitions

log = logging.getLogger("fedpriv.flower")


@dataclass
class FlowerJob:
    """What the ServerApp runs; built from the run config (``flwr run``) or by our CLI."""

    algorithm: str
    epsilon: float | None
    delta: float
    cfg: als.ALSConfig
    train: object  # Interactions; None when the server holds no ratings (``public``)
    valid: object | None  # None: no node-side RMSE evaluation (held-out-users protocol)
    test: object | None
    rating_range: tuple[float, float]
    work_dir: Path
    users_per_node: int = 1
    round_timeout: float | None = None
    node_wait_seconds: float = 120.0
    info_attempts: int = 5
    eval_every: int = 0  # > 0: also evaluate after every eval_every steps (a measurement curve)
    implicit: bool = False  # implicit feedback (held-out-users protocol): no mean release
    item_features: object = None  # public item features (encoder algorithms)
    recommend: object = None  # RecommendConfig: private recommendation rounds after training
    checkpoint: bool = True  # write work_dir/checkpoint.pkl after every step; resume from it
    interrupt_after: int | None = None  # testing hook: stop (as if killed) after this step's checkpoint
    # the run's secret randomness: fresh OS randomness unless a noise seed asked for reproducible
    # noise (never sent to a node; a reproducible run's nodes read the clients' key from a file)
    secrets: RunSecrets = field(default_factory=RunSecrets, repr=False)
    # a partitioned deployment (fedpriv.data.public.PublicData): the server holds public metadata
    # only, every node splits its own users' ratings and evaluates them
    public: object = None
    progress: bool = False  # one line per round and a summary table on stdout (fedpriv.flower.progress)
    # one run of private tuning (fedpriv.run.tuning): the noise multipliers of the whole tuning
    # plan (the run's ledger then has no budget of its own) and the clip of its validation score
    multipliers: dict | None = None
    tune_score_clip: float | None = None
    # ``flwr run .`` without users-per-node (0 in the run config): after the node wait, the users
    # are split over the nodes that registered (ceil(n_users / nodes)); users_per_node is then set
    users_from_nodes: bool = False
    # the launcher's run token (scripts/run.sh): every serving node must report the same
    # FEDPRIV_RUN_TOKEN in its info reply, else the job runs in a federation it did not start
    run_token: str = ""
    # the neighbouring relation every epsilon holds under (the job's: fedpriv.run.Job.relation;
    # replace_one for a deployment): calibration, the noise-aware rule and the ledgers use it
    relation: str = ADD_REMOVE

    def serve(self, grid: Grid) -> FlowerResult:
        return serve_ratings(grid, self)

    @property
    def shape(self):
        """``n_users`` and ``n_items``: of the training ratings, or of the public metadata."""
        return self.train if self.train is not None else self.public

    @property
    def n_users(self) -> int:
        return int(self.shape.n_users)

    @property
    def evaluates_on_nodes(self) -> bool:
        """RMSE (or log-loss) sums on the nodes: the random split."""
        return self.valid is not None or self.public is not None


@dataclass
class FlowerResult(RoundCounters):
    state: als.PublicState
    ledger: PrivacyLedger
    valid_rmse: float = math.nan
    valid_sliced: list = field(default_factory=list)
    test_rmse: float = math.nan
    test_sliced: list = field(default_factory=list)
    curve: list = field(default_factory=list)  # per evaluated step: protocol rounds, bytes, seconds, valid RMSE
    logistic: dict = field(default_factory=dict)  # am-ssp-convex: per part, log-loss, accuracy, sliced
    recommendation: dict = field(default_factory=dict)  # private recommendation summary
    rec_ledger: PrivacyLedger | None = None
    rec_picks: np.ndarray | None = None  # reported item per global user id (-1: no report)
    resumed_from: int | None = None  # the step a resumed job restarted after
    score_total: np.ndarray | None = (
        None  # private tuning: the exact sum of the nodes' clipped scores (noised by the caller's ledger)
    )


class JobInterrupted(FedprivError):
    """The job stopped between rounds; run it again with the same work dir to resume."""


class _Checkpoint:
    """``work_dir/checkpoint.pkl``, replaced atomically after every step: the public state, the
    ledger (its records and its generator's state), the encoder server, the next step and the
    round counters. A job resumes from it when the checkpoint's fingerprint (algorithm, budget,
    hyperparameters, data shape) matches. Before each step's release ``release.marker`` notes
    the step. A job that stopped between that marker and the step's checkpoint may already have
    released noised values; releasing the step again would add fresh noise to a possibly
    different sum (OS randomness) or, worse, the very same noise to a different sum (a seeded
    ledger restored from the checkpoint: the difference of the two releases would be exact). So
    resuming past an interrupted release is refused in both modes; start a new job."""

    def __init__(self, job: FlowerJob):
        import hashlib
        import json

        self.path = Path(job.work_dir) / "checkpoint.pkl"
        self.marker = Path(job.work_dir) / "release.marker"
        key = {
            "algorithm": job.algorithm,
            "epsilon": job.epsilon,
            "delta": job.delta,
            "cfg": job.cfg.to_dict(),
            "n_users": job.n_users,
            "n_items": int(job.shape.n_items),
            "n_ratings": int(len(job.train)) if job.train is not None else job.public.source,
            "users_per_node": job.users_per_node,
            "rating_range": list(job.rating_range),
            # another relation is another job (add/remove, the default, keeps the fingerprints it had)
            **({"relation": job.relation} if job.relation != ADD_REMOVE else {}),
        }
        self.fingerprint = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()

    def load(self):
        import pickle

        if not self.path.exists():
            if self.marker.exists():
                raise PrivacyError(
                    f"{self.marker}: the job stopped during its first releases; resuming would release them twice. "
                    f"Start a new job."
                )
            return None
        with open(self.path, "rb") as f:
            saved = pickle.load(f)
        if saved.get("fingerprint") != self.fingerprint:
            log.warning("checkpoint %s belongs to another job: starting afresh", self.path)
            return None
        if self.marker.exists() and int(self.marker.read_text() or -1) >= saved["step"]:
            raise PrivacyError(
                f"{self.marker}: the job stopped during the release of step {int(self.marker.read_text()) + 1}; "
                "releasing it again (new noise, or a seeded ledger's same noise on another sum) would release twice. "
                "Start a new job."
            )
        return saved

    def mark_release(self, step: int) -> None:
        self.marker.write_text(str(step))

    def save(self, step: int, state, ledger, server, result) -> None:
        import pickle

        counters = {
            "rounds": result.rounds,
            "bytes_up": result.bytes_up,
            "bytes_down": result.bytes_down,
            "round_log": list(result.round_log),
            "rejected": list(result.rejected),
        }
        blob = {
            "fingerprint": self.fingerprint,
            "step": step,
            "state": state,
            "ledger": ledger,
            "server": server,
            "counters": counters,
            "curve": list(result.curve),
        }
        atomic.write_bytes(self.path, pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))
        if self.marker.exists():
            self.marker.unlink()


class _Nodes:
    """Which node serves which partition: asked in the info round, refreshed before every step
    (a node that rejoins under a new id takes its partition over from its old id)."""

    def __init__(self, grid: Grid, job: FlowerJob, rounds: Rounds, down):
        self.grid, self.job, self.rounds, self.down = grid, job, rounds, down
        self.n_parts = -(-job.n_users // job.users_per_node)
        self.partition_of: dict[int, int] = {}
        self.retired: set[int] = set()  # ids whose partition moved to a new id, or that never answered a rejoin query
        self.mode_of: dict[
            int, str | None
        ] = {}  # the policy mode each node reports (None: an older node that reports none)
        self.token_of: dict[int, str | None] = {}  # the run token each node reports (None: none reported)

    def ask_info(self, ids: list[int], name: str, timeout) -> None:
        self.rounds.nodes = ids
        answered = set()
        for nid, rep in self.rounds.ask("query.info", self.down(), name, timeout=timeout):
            answered.add(nid)
            try:
                pid = rep.content.config_records["meta"]["partition_id"]
            except KeyError as exc:
                self.rounds.reject(name, nid, f"malformed info reply ({exc})")
                continue
            if isinstance(pid, bool) or not isinstance(pid, int):  # not int(): it overflows on inf
                self.rounds.reject(name, nid, f"malformed info reply (partition id {pid!r} is not an integer)")
                continue
            mode = rep.content.config_records["meta"].get("policy_mode")
            self.mode_of[nid] = mode if isinstance(mode, str) else None
            token = rep.content.config_records["meta"].get("run_token")
            self.token_of[nid] = token if isinstance(token, str) and token else None
            if (
                name != "info" and self.job.run_token and self.token_of[nid] != self.job.run_token
            ):  # a stranger that joins later
                self.rounds.reject(
                    name, nid, "its run token is not this run's: a node this run's launcher did not start, left out"
                )
                self.retired.add(nid)  # not asked again
                continue
            if (
                name != "info" and self.job.cfg.aggregation.secure and self.mode_of[nid] != "secure"
            ):  # a node that joins a secure job later
                self.rounds.reject(
                    name,
                    nid,
                    f"its node policy is {_mode_text(self.mode_of[nid])}, not secure: left out of this secure job",
                )
                continue
            for old in [n for n, p in self.partition_of.items() if p == pid and n != nid]:
                log.info("partition %d moved from node %s to node %s (rejoined)", pid, old, nid)
                del self.partition_of[old]
                self.retired.add(old)
            self.partition_of[nid] = pid
        if name != "info":
            self.retired.update(set(ids) - answered)

    def _serving_where(self, reported: dict, wrong) -> list[tuple[int, int, object]]:
        """[(partition, node, what it reported)] of the serving nodes whose report in ``reported``
        (None when it reported nothing) is ``wrong``."""
        return [(self.partition_of[n], n, reported.get(n)) for n in self.serving() if wrong(reported.get(n))]

    def require_secure(self) -> None:
        """A secure job starts only on nodes whose own policy is secure (``policy-aggregation=secure``,
        reported in their info reply): a node that would also answer plaintext queries (mode
        ``any`` or ``central``), or an older node that reports no mode, protects its users from a
        server that follows the protocol only. Checked before any release; raises a ConfigError
        naming every such node, its partition and its reported mode."""
        bad = self._serving_where(self.mode_of, lambda mode: mode != "secure")
        if bad:
            raise ConfigError(
                f"refused to start a secure-aggregation job: {len(bad)} serving node(s) do not run a secure node "
                f"policy "
                f"({_listed(bad, _mode_text)}). Such a node would answer a deviating server's plaintext queries. "
                f"Configure every node with "
                "policy-aggregation=secure (`fedpriv deploy up` writes it by default), or run with aggregation central",
                field="policy-aggregation",
            )

    def require_plaintext(self) -> None:
        """A central job starts only on nodes that answer plaintext handlers: a node whose own
        policy is secure refuses every one of them (issue 57), so the job could release nothing.
        Checked before any release; raises a ConfigError naming such nodes."""
        bad = self._serving_where(self.mode_of, lambda mode: mode == "secure")
        if bad:
            raise ConfigError(
                f"refused to start a central-aggregation job: {len(bad)} serving node(s) run a secure node policy "
                f"({_listed(bad, _mode_text)}) and answer no plaintext handler. Run with aggregation secure (`fedpriv "
                f"deploy run`'s "
                "default), or give those nodes policy-aggregation=central (`fedpriv deploy up --node-policy "
                "aggregation=central`)",
                field="aggregation",
            )

    def require_token(self) -> None:
        """A job started with a run token (``run-token`` in the run config, set by scripts/run.sh)
        runs only on nodes that report the same token (their FEDPRIV_RUN_TOKEN): a serving node
        that reports another token, or none, belongs to a federation this run's launcher did not
        start (e.g. another user's local SuperLink on the same port). Checked before any release;
        raises a ConfigError naming such nodes. No token: no check (plain ``flwr run .``, deployments)."""
        if not self.job.run_token:
            return
        bad = self._serving_where(self.token_of, lambda token: token != self.job.run_token)
        if bad:
            raise ConfigError(
                f"these nodes were not started by this run's launcher: {len(bad)} of {len(self.serving())} serving "
                f"node(s) do not report "
                f"this run's token ({_listed(bad, lambda t: 'no run token' if t is None else 'another run token')}). "
                f"The run reached a federation it did not start (another SuperLink on the same "
                "address?); nothing was released. Start it again with scripts/run.sh, which uses free ports and a "
                "private FLWR_HOME",
                field="run-token",
            )

    @staticmethod
    def wait_settled(grid: Grid, seconds: float, most: int, settle: float = 3.0) -> list[int]:
        """The registered nodes once their number is known: at least one node, and no new one
        for ``settle`` seconds (or ``most`` of them: a node per user is the most a job can use),
        within ``seconds`` (the node wait)."""
        deadline = time.monotonic() + seconds
        seen, since = None, time.monotonic()
        while True:
            nodes = sorted(grid.get_node_ids())
            now = time.monotonic()
            if nodes != seen:
                seen, since = nodes, now
            if nodes and (len(nodes) >= most or now - since >= settle):
                return nodes
            if now > deadline:
                return nodes
            time.sleep(0.2)

    def serving(self) -> list[int]:
        order = sorted(self.partition_of, key=self.partition_of.get)  # sum in partition order: deterministic
        return [n for n in order if 0 <= self.partition_of[n] < self.n_parts]

    def first_info(self, nodes: list[int]) -> None:
        for _ in range(self.job.info_attempts):  # nodes that fail the info round are asked again
            # the first round also starts the workers (imports, data mapping): no round timeout
            pending = [n for n in nodes if n not in self.partition_of]
            if not pending:
                break
            self.ask_info(pending, "info", None)
        left = [n for n in nodes if n not in self.partition_of]
        if left:
            log.warning("nodes without a known partition are left out of the run: %s", left)
        self.rounds.nodes = self.serving()

    def refresh(self) -> None:
        new = sorted(set(self.grid.get_node_ids()) - set(self.partition_of) - self.retired)
        if new:
            self.ask_info(new, "rejoin", self.job.round_timeout)
        self.rounds.nodes = self.serving()


def _listed(bad: list[tuple[int, int, object]], text, most: int = 5) -> str:
    """``partition p (node n): text(what)`` for the first ``most`` of ``bad`` [(partition, node, what)], and how
    many more."""
    listed = ", ".join(f"partition {p} (node {n}): {text(w)}" for p, n, w in sorted(bad, key=lambda b: b[:2])[:most])
    return listed + (f", and {len(bad) - most} more" if len(bad) > most else "")


def _mode_text(mode: str | None) -> str:
    return "no policy mode reported (an older node)" if mode is None else f"policy mode {mode!r}"


class _GridTransport(RatingTransport):
    """The loop's clients over a Flower Grid (:class:`fedpriv.engine.loop.Transport`): one message per
    serving node; every reply is validated (:mod:`fedpriv.flower.codec`) before it is summed,
    a rejected one is logged and left out."""

    def __init__(self, job: FlowerJob, rounds: Rounds, nodes: _Nodes, down, data_dir: str):
        self.job, self.rounds, self.nodes, self.down, self.data_dir = job, rounds, nodes, down, data_dir
        self.n_params = 0
        self.secure = (
            SecureRounds(rounds, job.users_per_node, colluders=job.cfg.aggregation.collusion)
            if job.cfg.aggregation.secure
            else None
        )

    def population(self) -> tuple[int, int]:
        return self.secure.population()

    def secure_sum(self, kind: str, plan, state: als.PublicState, step: int, group: int | None = None):
        return self.secure.secure_sum(kind, plan, self.down(step), step)

    def vector(self, kind: str, length: int, state: als.PublicState) -> np.ndarray:
        total = np.zeros(length)
        for _, values in self.rounds.gather(
            f"query.{kind}",
            self.down(),
            kind,
            lambda nid, rep: codec.decode_vector(rep.content, kind, length, state, self.job.users_per_node),
        ):
            total += values
        return total

    def start(self, state: als.PublicState, server) -> None:
        if server is not None and protocol.clients_need_encoder(state.algorithm):
            if self.data_dir:  # simulation: the nodes read the public table from the broadcast folder
                write_feature_table(self.data_dir, server.encoder.table)  # (a partitioned node has its own copy)
            self.n_params = server.encoder.n_params()

    def prepare(self, step: int) -> None:
        self.nodes.refresh()

    def step(self, state: als.PublicState, step: int) -> list:
        dim = protocol.stats_dim(state)
        def decode(nid, rep):
            return codec.decode_contribution(rep.content, state, dim, self.job.users_per_node, self.n_params)

        return [part for _, part in self.rounds.gather("train", self.down(step), f"step{step + 1}", decode)]


def bucket_counts(state: als.PublicState, n_items: int) -> np.ndarray:
    """The item counts the evaluation's frequency buckets come from: the run's released (noised)
    counts, or, when it released none, zeros (the buckets are then one fixed order of the item
    ids: public). Never the training counts, even where the server holds them (simulation): the
    buckets travel to every node, and exact counts there were a statistic outside the ledger
    (removing one user changed them for about half the users tried, issue 41)."""
    counts = state.counts_hat
    return np.asarray(counts, dtype=np.float64) if counts is not None else np.zeros(n_items)


def _evaluate(
    job: FlowerJob, rounds: Rounds, result: FlowerResult, content, secure: SecureRounds | None = None
) -> tuple:
    """Evaluation on the nodes: per-bucket sums only, summed over the nodes in plaintext
    (central mode) or by a secure measurement sum (``secure``: the server learns the totals,
    never one node's sums), with buckets from :func:`bucket_counts`. Its rounds and bytes are
    measurement, kept out of the protocol's counters. Returns (valid, valid sliced, test, test
    sliced).

    What one measurement reveals: the exact totals, per bucket, of the answering nodes'
    squared errors (or log-loss and correct predictions) and of their numbers of validation and
    test ratings, for the model of ``content``; in central mode, each node's own sums. It is not
    a DP release (no noise, no ledger record). The rating numbers do not depend on the model: two
    measurements over different sets of answering nodes differ by the exact totals of the nodes
    in one set only. A job measures each model once (:func:`run_job` reuses the last curve point
    for the final evaluation instead of measuring the same model again)."""
    before = (result.rounds, result.bytes_up, result.bytes_down)
    item_counts = bucket_counts(result.state, job.shape.n_items)
    content["eval"] = ArrayRecord({"item_bucket": codec.to_array(metrics.frequency_buckets(item_counts))})
    convex = protocol.is_logistic(job.algorithm)
    keys = evaluation.eval_keys(convex)
    if secure is not None:
        sums = secure.measure("eval", [(k, 5) for k in keys], content)
    else:
        sums = {k: np.zeros(5) for k in keys}
        for _, vals in rounds.gather(
            "evaluate", content, "evaluate", lambda nid, rep: codec.decode_eval_sums(rep.content, tuple(sums))
        ):
            for k in sums:
                sums[k] += vals[k]
    result.rounds, result.bytes_up, result.bytes_down = before
    if convex:
        for part in ("valid", "test"):
            loss, acc, sliced = evaluation.logistic_from_sums(
                {k: sums[f"{part}_{k}"] for k in ("logloss", "correct", "n")}, item_counts
            )
            result.logistic[part] = {"logloss": loss, "accuracy": acc, "sliced": sliced}
        return (
            result.logistic["valid"]["logloss"],
            result.logistic["valid"]["sliced"],
            result.logistic["test"]["logloss"],
            result.logistic["test"]["sliced"],
        )
    valid = evaluation.rmse_from_sums(sums["valid_sse"], sums["valid_n"], item_counts)
    test = evaluation.rmse_from_sums(sums["test_sse"], sums["test_n"], item_counts)
    return (*valid, *test)


def _tune_score(job: FlowerJob, rounds: Rounds, content) -> np.ndarray:
    """Private tuning's score round (central mode): every node's sum of its users' clipped
    validation MSEs, checked against its bound and summed; the tuning adds the noise."""
    if job.cfg.aggregation.mode != "central":
        raise ConfigError("private tuning on the Flower engine scores in central mode only", field="tune")
    content["tune"] = ConfigRecord({"clip": float(job.tune_score_clip)})
    total = np.zeros(1)
    for _, value in rounds.gather(
        "query.tune_score",
        content,
        "tune_score",
        lambda nid, rep: codec.decode_score(rep.content, job.tune_score_clip, job.users_per_node),
    ):
        total += value
    return total


def run_job(grid: Grid, job) -> FlowerResult:
    """One job over the nodes of ``grid``: a rating job (:class:`FlowerJob`) or a block family's
    (:class:`~fedpriv.flower.block_server.BlockJob`), each served by its own ``serve``."""
    from ..util import threads

    threads.configure()  # the server's solves: its kernels' threads and allocator
    operate = getattr(
        grid, "operate_for", None
    )  # an in-process grid whose nodes the caller operates (fedpriv.testing.local_grid)
    if operate is not None:
        operate(job)
    return job.serve(grid)


def serve_ratings(grid: Grid, job: FlowerJob) -> FlowerResult:
    """A rating job: the info round, then the loop of :func:`fedpriv.engine.loop.train_rounds`
    (checkpointed after every step), the evaluation and the private recommendation."""
    cfg, n_users = job.cfg, job.n_users
    if job.train is not None:  # simulation: the server writes the nodes' folders
        parts = {"train": job.train, "valid": job.valid, "test": job.test}
        data_dir = str(
            write_partitions(
                job.work_dir / "node-data", {k: v for k, v in parts.items() if v is not None}, {"n_users": n_users}
            )
        )
    else:  # partitioned deployment: every node reads its own data-dir; nothing to broadcast
        data_dir = ""
        Path(job.work_dir).mkdir(parents=True, exist_ok=True)
    state, ledger = new_state(
        job.algorithm,
        cfg,
        job.shape,
        job.rating_range,
        job.implicit,
        job.epsilon,
        job.delta,
        multipliers=job.multipliers,
        secrets=job.secrets,
        relation=job.relation,
    )
    result = FlowerResult(state=state, ledger=ledger)
    # reproducible runs only: the nodes read the clients' key (derived from the noise seed) from a file
    key_file = write_key_file(job.work_dir, job.secrets.client_key()) if job.secrets.reproducible else None

    def down(round_index: int = 0):
        """The broadcast public state of this round, encoded once for every node."""
        return codec.encode_state(result.state, data_dir, job.users_per_node, round_index, key_file)

    if job.users_from_nodes:  # users-per-node 0: split the users over the nodes that register
        registered = _Nodes.wait_settled(grid, job.node_wait_seconds, n_users)
        if not registered:
            raise ConfigError(
                f"no node registered within the node wait ({job.node_wait_seconds:g} s)", field="node-wait"
            )
        job.users_per_node = -(-n_users // len(registered))
        log.info(
            "users-per-node %d: %d users over the %d registered nodes", job.users_per_node, n_users, len(registered)
        )
    n_parts = -(-n_users // job.users_per_node)
    registered = registered if job.users_from_nodes else wait_for_nodes(grid, n_parts, job.node_wait_seconds)
    rounds = job_rounds(grid, job, result, registered, n_parts)
    nodes = _Nodes(grid, job, rounds, down)
    nodes.first_info(registered)
    nodes.require_token()  # before any release: the serving nodes are this run's own
    if cfg.aggregation.secure:  # before any release: every serving node's own policy must be secure
        nodes.require_secure()
    else:  # and a central job's nodes must answer plaintext
        nodes.require_plaintext()

    ckpt = _Checkpoint(job) if job.checkpoint else None
    saved = ckpt.load() if ckpt is not None else None
    server, first_step = None, 0
    if saved is not None:  # resume: the model, the next step, the ledger (with its generator), the counters
        state, ledger, server, first_step = saved["state"], saved["ledger"], saved["server"], saved["step"]
        result.state, result.ledger = state, ledger
        for key in ("rounds", "bytes_up", "bytes_down"):
            setattr(result, key, getattr(result, key) + saved["counters"][key])
        result.round_log[:0] = saved["counters"]["round_log"]
        result.rejected[:0] = saved["counters"]["rejected"]
        result.curve = saved["curve"]
        result.resumed_from = first_step
        log.info("resumed from %s after step %d", ckpt.path, first_step)
    elif ckpt is not None:
        ckpt.mark_release(-1)

    t_start = [time.perf_counter()]  # protocol time (evaluation rounds are subtracted)

    measured: dict = {}  # the last measurement: {"step": steps done, "values": _evaluate's tuple}

    def after_step(step, state, server, seconds):
        if job.evaluates_on_nodes and job.eval_every and ((step + 1) % job.eval_every == 0 or step + 1 == cfg.steps):
            spent = time.perf_counter() - t_start[0]  # protocol time, before the measurement
            values = _evaluate(job, rounds, result, down(), transport.secure)
            measured.update(step=step + 1, values=values)
            valid = values[0]
            result.curve.append(
                {
                    "step": step + 1,
                    "rounds": result.rounds,
                    "bytes_up": result.bytes_up,
                    "bytes_down": result.bytes_down,
                    "seconds": spent,
                    "valid_rmse": valid,
                }
            )
            t_start[0] += time.perf_counter() - t_start[0] - spent  # exclude evaluation time
        if ckpt is not None:
            ckpt.save(step + 1, state, ledger, server, result)
            if job.interrupt_after == step + 1:
                raise JobInterrupted(f"interrupted after step {step + 1} (checkpoint {ckpt.path})")
        return False

    hooks = Hooks(
        after_setup=(lambda state, server: ckpt.save(0, state, ledger, server, result)) if ckpt is not None else None,
        before_step=ckpt.mark_release if ckpt is not None else None,
        after_step=after_step,
    )
    transport = _GridTransport(job, rounds, nodes, down, data_dir)
    train_rounds(
        transport,
        make_aggregator(cfg, ledger),
        state,
        item_features=job.item_features,
        server=server,
        first_step=first_step,
        resumed=saved is not None,
        hooks=hooks,
    )

    if job.tune_score_clip is not None:
        result.score_total = _tune_score(job, rounds, down())
    if job.evaluates_on_nodes:
        if measured.get("step") == cfg.steps:  # the final model was just measured (eval_every): not twice
            values = measured["values"]
        else:
            values = _evaluate(job, rounds, result, down(), transport.secure)
        result.valid_rmse, result.valid_sliced, result.test_rmse, result.test_sliced = values
    if job.recommend is not None:
        from .partition import node_users
        from .recommend_handlers import run_recommend_rounds

        users_of = {nid: node_users(nodes.partition_of[nid], job.users_per_node, n_users) for nid in rounds.nodes}
        summary, result.rec_ledger, reports = run_recommend_rounds(
            rounds,
            state,
            down(),
            {nid: len(u) for nid, u in users_of.items()},
            job.recommend,
            job.secrets.ledger_seed("recommend"),
            job.test is not None or job.public is not None,
            secure=transport.secure,
            relation=job.relation,
        )
        result.recommendation = summary
        result.rec_picks = np.full(n_users, -1, dtype=np.int64)
        for nid, items in reports.items():
            result.rec_picks[users_of[nid]] = items
    progress = rounds.progress
    if progress is not None:
        shown = (
            {"valid RMSE": result.valid_rmse, "test RMSE": result.test_rmse}
            if not result.logistic
            else {
                "valid log-loss": result.logistic["valid"]["logloss"],
                "test log-loss": result.logistic["test"]["logloss"],
            }
        )
        progress.summary(result.round_log, result.rejected, {k: v for k, v in shown.items() if v == v}, counters=result)
    return result


def make_server_app(job: FlowerJob, sink: dict) -> ServerApp:
    """A ServerApp that runs ``job`` and leaves its :class:`FlowerResult` in ``sink['result']``
    (or the error in ``sink['error']``)."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            sink["result"] = run_job(grid, job)
        except FedprivError as exc:
            sink["error"] = exc
            log.error("fedpriv job failed: %s", exc)

    return server
