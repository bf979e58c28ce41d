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
from flwr.app import ArrayRecord, Context, Message
from flwr.serverapp import Grid, ServerApp

from .. import evaluation, metrics
from ..algorithms import als, protocol
from ..engine import new_state
from ..errors import ConfigError, FedprivError
from ..privacy.ledger import PrivacyLedger
from . import codec
from .counters import RoundCounters
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


class _Rounds:
    """Sends one message per node and collects replies, with byte counting and rejection log."""

    def __init__(self, grid: Grid, nodes: list[int], result: FlowerResult, timeout: float | None):
        self.grid, self.nodes, self.result, self.timeout = grid, nodes, result, timeout

    def ask(self, message_type: str, content, name: str, timeout: float | None = ...) -> list[tuple[int, Message]]:
        """One message per node, all with the same (broadcast) ``content``; ``timeout`` defaults
        to the job's round timeout."""
        t0 = time.perf_counter()
        per_node = codec.payload_bytes(content)
        msgs = [Message(content=content, dst_node_id=nid, message_type=message_type) for nid in self.nodes]
        down = per_node * len(msgs)
        replies = list(self.grid.send_and_receive(msgs, timeout=self.timeout if timeout is ... else timeout))
        up = 0
        ok = []
        for rep in replies:
            src = rep.metadata.src_node_id
            if rep.has_error():
                self.reject(name, src, f"node error: {rep.error.reason}")
                continue
            up += codec.payload_bytes(rep.content)
            ok.append((src, rep))
        missing = set(self.nodes) - {r.metadata.src_node_id for r in replies}
        for nid in sorted(missing):
            self.reject(name, nid, "no reply before the round timeout")
        self.result.rounds += 1
        self.result.bytes_down += down
        self.result.bytes_up += up
        self.result.round_log.append({"round": name, "seconds": time.perf_counter() - t0, "bytes_down": down, "bytes_up": up, "replies": len(ok), "nodes": len(self.nodes)})
        return ok

    def reject(self, name: str, node: int, reason: str) -> None:
        log.warning("round %s: reply of node %s rejected: %s", name, node, reason)
        self.result.rejected.append({"round": name, "node": int(node), "reason": reason})


def _wait_for_nodes(grid: Grid, n: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n or time.monotonic() > deadline:
            return nodes
        time.sleep(0.5)


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
    state, ledger = new_state(job.algorithm, cfg, job.train, job.rating_range, job.implicit, job.epsilon, job.delta)
    result = FlowerResult(state=state, ledger=ledger)

    nodes = _wait_for_nodes(grid, n_parts, job.node_wait_seconds)
    if len(nodes) < n_parts:
        raise ConfigError(f"{n_parts} partitions of {job.users_per_node} users need {n_parts} nodes; {len(nodes)} registered", field="users-per-node")
    rounds = _Rounds(grid, nodes, result, job.round_timeout)
    def down(round_index: int = 0):
        """The broadcast public state of this round, encoded once for every node."""
        return codec.encode_state(state, data_dir, job.users_per_node, round_index)

    # node -> partition (each node maps its own data; the server learns only ids and sizes)
    partition_of: dict[int, int] = {}
    for _ in range(job.info_attempts):  # nodes that fail the info round are asked again
        # the first round also starts the workers (imports, data mapping): no round timeout
        for nid, rep in rounds.ask("query.info", down(), "info", timeout=None):
            try:
                partition_of[nid] = int(rep.content.config_records["meta"]["partition_id"])
            except (KeyError, TypeError, ValueError) as exc:
                rounds.reject("info", nid, f"malformed info reply ({exc})")
        rounds.nodes = [n for n in nodes if n not in partition_of]
        if not rounds.nodes:
            break
    if rounds.nodes:
        log.warning("nodes without a known partition are left out of the run: %s", rounds.nodes)
    order = sorted(partition_of, key=partition_of.get)  # sum in partition order: deterministic
    rounds.nodes = [n for n in order if partition_of[n] < n_parts]
    max_users = job.users_per_node

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

    if state.private and als.needs_user_count(job.algorithm):
        state.n_users = als.release_user_count(collect_vectors("query.users", "users", 1), state, ledger)
    if als.needs_mean(job.algorithm, state.implicit):
        state.mean = als.release_mean(collect_vectors("query.mean", "mean", 2), state, ledger)
    if als.needs_counts(job.algorithm):
        state.counts_hat = als.release_counts(collect_vectors("query.counts", "counts", state.n_items), state, ledger)
    server = protocol.server_setup(state, job.item_features)
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
    for step in range(cfg.steps):
        name = f"step{step + 1}"
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

    if job.valid is not None:
        result.valid_rmse, result.valid_sliced, result.test_rmse, result.test_sliced = evaluate()
    if job.recommend is not None:
        from .partition import node_users
        from .recommend_handlers import run_rounds

        users_of = {nid: node_users(partition_of[nid], job.users_per_node, n_users) for nid in rounds.nodes}
        summary, result.rec_ledger, reports = run_rounds(
            rounds, state, down(), {nid: len(u) for nid, u in users_of.items()}, job.recommend, cfg.secure_noise, job.test is not None
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


# ``flwr run .``: the job comes from the run config ([tool.flwr.app.config] in pyproject.toml,
# overridable with ``flwr run . --run-config "key=value ..."``)
app = ServerApp()


def _overrides(spec: str) -> dict[str, str]:
    from ..run import parse_overrides

    return parse_overrides([p for p in str(spec).replace(";", ",").split(",") if p.strip()])


@app.main()
def main(grid: Grid, context: Context) -> None:
    from ..run import run, write_outputs

    rc = context.run_config
    algorithm = str(rc.get("algorithm", "adadpals"))
    epsilon = float(rc["epsilon"]) if algorithm != "als" else None
    overrides = _overrides(rc.get("set", ""))
    overrides["users_per_node"] = str(rc.get("users-per-node", 1))
    out = Path(str(rc.get("out", "runs/flwr"))).expanduser()
    metrics_, ledger = run(
        algorithm,
        str(rc["data"]),
        epsilon=epsilon,
        delta=float(rc.get("delta", 1e-5)),
        overrides=overrides,
        engine="flower",
        progress=False,
        flower_runner=lambda job, n_nodes: run_job(grid, job),
    )
    write_outputs(out, metrics_, ledger)
    log.info("fedpriv: wrote %s and %s", out / "metrics.json", out / "ledger.json")
