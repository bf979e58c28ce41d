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
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from .. import atomic, evaluation, metrics
from ..algorithms import als, protocol
from ..engine import new_state
from ..errors import ConfigError, FedprivError, PrivacyError
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets
from . import codec
from .counters import RoundCounters
from .rounds import Rounds, wait_for_nodes
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
    train: object  # Interactions
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
        key = {"algorithm": job.algorithm, "epsilon": job.epsilon, "delta": job.delta, "cfg": job.cfg.to_dict(),
               "n_users": int(job.train.n_users), "n_items": int(job.train.n_items), "n_ratings": int(len(job.train)),
               "users_per_node": job.users_per_node, "rating_range": list(job.rating_range)}
        self.fingerprint = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()

    def load(self):
        import pickle

        if not self.path.exists():
            if self.marker.exists():
                raise PrivacyError(f"{self.marker}: the job stopped during its first releases; resuming would release them twice. Start a new job.")
            return None
        with open(self.path, "rb") as f:
            saved = pickle.load(f)
        if saved.get("fingerprint") != self.fingerprint:
            log.warning("checkpoint %s belongs to another job: starting afresh", self.path)
            return None
        if self.marker.exists() and int(self.marker.read_text() or -1) >= saved["step"]:
            raise PrivacyError(
                f"{self.marker}: the job stopped during the release of step {int(self.marker.read_text()) + 1}; "
                "releasing it again (new noise, or a seeded ledger's same noise on another sum) would release twice. Start a new job."
            )
        return saved

    def mark_release(self, step: int) -> None:
        self.marker.write_text(str(step))

    def save(self, step: int, state, ledger, server, result) -> None:
        import pickle

        counters = {"rounds": result.rounds, "bytes_up": result.bytes_up, "bytes_down": result.bytes_down,
                    "round_log": list(result.round_log), "rejected": list(result.rejected)}
        blob = {"fingerprint": self.fingerprint, "step": step, "state": state, "ledger": ledger, "server": server,
                "counters": counters, "curve": list(result.curve)}
        atomic.write_bytes(self.path, pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))
        if self.marker.exists():
            self.marker.unlink()


def run_job(grid: Grid, job: FlowerJob) -> FlowerResult:
    """The alternating loop of one job over the nodes of ``grid``."""
    from .pam_server import PamJob, run_pam_job

    if isinstance(job, PamJob):  # DP model personalization: its own rounds
        return run_pam_job(grid, job)
    t_start = time.perf_counter()  # protocol time (evaluation rounds are subtracted)
    cfg = job.cfg
    n_users = job.train.n_users
    n_parts = -(-n_users // job.users_per_node)
    parts = {"train": job.train, "valid": job.valid, "test": job.test}
    data_dir = str(write_partitions(job.work_dir / "node-data", {k: v for k, v in parts.items() if v is not None}, {"n_users": n_users}))
    state, ledger = new_state(job.algorithm, cfg, job.train, job.rating_range, job.implicit, job.epsilon, job.delta, secrets=job.secrets)
    result = FlowerResult(state=state, ledger=ledger)
    # reproducible runs only: the nodes read the clients' key (derived from the noise seed) from a file
    key_file = write_key_file(job.work_dir, job.secrets.client_key()) if job.secrets.reproducible else None

    nodes = wait_for_nodes(grid, n_parts, job.node_wait_seconds)
    if len(nodes) < n_parts:
        raise ConfigError(f"{n_parts} partitions of {job.users_per_node} users need {n_parts} nodes; {len(nodes)} registered", field="users-per-node")
    rounds = Rounds(grid, nodes, result, job.round_timeout)
    def down(round_index: int = 0):
        """The broadcast public state of this round, encoded once for every node."""
        return codec.encode_state(state, data_dir, job.users_per_node, round_index, key_file)

    # node -> partition (each node maps its own data; the server learns only ids and sizes)
    partition_of: dict[int, int] = {}
    retired: set[int] = set()  # ids whose partition moved to a new id, or that never answered a rejoin query

    def ask_info(ids: list[int], name: str, timeout) -> None:
        rounds.nodes = ids
        answered = set()
        for nid, rep in rounds.ask("query.info", down(), name, timeout=timeout):
            answered.add(nid)
            try:
                pid = int(rep.content.config_records["meta"]["partition_id"])
            except (KeyError, TypeError, ValueError) as exc:
                rounds.reject(name, nid, f"malformed info reply ({exc})")
                continue
            for old in [n for n, p in partition_of.items() if p == pid and n != nid]:
                log.info("partition %d moved from node %s to node %s (rejoined)", pid, old, nid)
                del partition_of[old]
                retired.add(old)
            partition_of[nid] = pid
        if name != "info":
            retired.update(set(ids) - answered)

    def serving_nodes() -> list[int]:
        order = sorted(partition_of, key=partition_of.get)  # sum in partition order: deterministic
        return [n for n in order if 0 <= partition_of[n] < n_parts]

    for _ in range(job.info_attempts):  # nodes that fail the info round are asked again
        # the first round also starts the workers (imports, data mapping): no round timeout
        pending = [n for n in nodes if n not in partition_of]
        if not pending:
            break
        ask_info(pending, "info", None)
    left = [n for n in nodes if n not in partition_of]
    if left:
        log.warning("nodes without a known partition are left out of the run: %s", left)
    rounds.nodes = serving_nodes()
    max_users = job.users_per_node

    def refresh_nodes() -> None:
        """Nodes that (re)joined since the last round are asked for their partition; a node that
        rejoins under a new id takes its partition over from its old id."""
        new = sorted(set(grid.get_node_ids()) - set(partition_of) - retired)
        if new:
            ask_info(new, "rejoin", job.round_timeout)
        rounds.nodes = serving_nodes()

    def collect_vectors(message_type: str, release: str, length: int) -> np.ndarray:
        total = np.zeros(length)
        replies = dict(rounds.ask(message_type, down(), release))
        for nid in rounds.nodes:
            if nid not in replies:
                continue
            try:
                total += codec.decode_vector(replies[nid].content, release, length, state, max_users)
            except codec.RejectedReply as exc:
                rounds.reject(release, nid, str(exc))
        return total

    ckpt = _Checkpoint(job) if job.checkpoint else None
    saved = ckpt.load() if ckpt is not None else None
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
    else:
        first_step = 0
        if ckpt is not None:
            ckpt.mark_release(-1)
        if state.private and als.needs_user_count(job.algorithm):
            state.n_users = als.release_user_count(collect_vectors("query.users", "users", 1), state, ledger)
        if als.needs_mean(job.algorithm, state.implicit):
            state.mean = als.release_mean(collect_vectors("query.mean", "mean", 2), state, ledger)
        if als.needs_counts(job.algorithm):
            state.counts_hat = als.release_counts(collect_vectors("query.counts", "counts", state.n_items), state, ledger)
        server = protocol.server_setup(state, job.item_features)
        if ckpt is not None:
            ckpt.save(0, state, ledger, server, result)
    n_params = 0
    if server is not None and job.algorithm == "am-dpsgd":
        write_feature_table(data_dir, server.encoder.table)  # public: clients rebuild the encoder
        n_params = server.encoder.n_params()

    item_counts = job.train.item_counts()
    bucket = metrics.frequency_buckets(item_counts)

    def evaluate():
        """Evaluation on the nodes: per-bucket sums only. Its rounds and bytes are measurement,
        kept out of the protocol's counters."""
        before = (result.rounds, result.bytes_up, result.bytes_down)

        content = down()
        content["eval"] = ArrayRecord({"item_bucket": codec._arr(bucket)})  # noqa: SLF001
        convex = job.algorithm == "am-ssp-convex"
        keys = [f"{p}_{k}" for p in ("valid", "test") for k in (("logloss", "correct", "n") if convex else ("sse", "n"))]
        sums = {k: np.zeros(5) for k in keys}
        for nid, rep in rounds.ask("evaluate", content, "evaluate"):
            try:
                vals = codec.decode_eval_sums(rep.content, tuple(sums))
            except codec.RejectedReply as exc:
                rounds.reject("evaluate", nid, str(exc))
                continue
            for k in sums:
                sums[k] += vals[k]
        result.rounds, result.bytes_up, result.bytes_down = before
        if convex:
            for part in ("valid", "test"):
                loss, acc, sliced = evaluation.logistic_from_sums({k: sums[f"{part}_{k}"] for k in ("logloss", "correct", "n")}, item_counts)
                result.logistic[part] = {"logloss": loss, "accuracy": acc, "sliced": sliced}
            return (result.logistic["valid"]["logloss"], result.logistic["valid"]["sliced"], result.logistic["test"]["logloss"], result.logistic["test"]["sliced"])
        valid = evaluation.rmse_from_sums(sums["valid_sse"], sums["valid_n"], item_counts)
        test = evaluation.rmse_from_sums(sums["test_sse"], sums["test_n"], item_counts)
        return (*valid, *test)

    dim = protocol.stats_dim(state)
    for step in range(first_step, cfg.steps):
        name = f"step{step + 1}"
        refresh_nodes()
        if ckpt is not None:
            ckpt.mark_release(step)
        replies = dict(rounds.ask("train", down(step), name))
        parts = []
        for nid in rounds.nodes:
            if nid not in replies:
                continue
            try:
                parts.append(codec.decode_contribution(replies[nid].content, state, dim, max_users, n_params))
            except codec.RejectedReply as exc:
                rounds.reject(name, nid, str(exc))
        protocol.server_step(protocol.aggregate(parts, state, ledger), state, server)
        if job.valid is not None and job.eval_every and ((step + 1) % job.eval_every == 0 or step + 1 == cfg.steps):
            seconds = time.perf_counter() - t_start  # protocol time, before the measurement
            valid = evaluate()[0]
            result.curve.append({"step": step + 1, "rounds": result.rounds, "bytes_up": result.bytes_up, "bytes_down": result.bytes_down, "seconds": seconds, "valid_rmse": valid})
            t_start += time.perf_counter() - t_start - seconds  # exclude evaluation time
        if ckpt is not None:
            ckpt.save(step + 1, state, ledger, server, result)
            if job.interrupt_after == step + 1:
                raise JobInterrupted(f"interrupted after step {step + 1} (checkpoint {ckpt.path})")

    if job.valid is not None:
        result.valid_rmse, result.valid_sliced, result.test_rmse, result.test_sliced = evaluate()
    if job.recommend is not None:
        from .partition import node_users
        from .recommend_handlers import run_rounds

        users_of = {nid: node_users(partition_of[nid], job.users_per_node, n_users) for nid in rounds.nodes}
        summary, result.rec_ledger, reports = run_rounds(
            rounds, state, down(), {nid: len(u) for nid, u in users_of.items()}, job.recommend, job.secrets.ledger_seed("recommend"), job.test is not None
        )
        result.recommendation = summary
        result.rec_picks = np.full(n_users, -1, dtype=np.int64)
        for nid, items in reports.items():
            result.rec_picks[users_of[nid]] = items
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
