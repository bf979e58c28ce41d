"""Every block family over Flower (:class:`~fedpriv.algorithms.families.Family`: DP model
personalization and any family a user adds): node data, messages and the server loop. Each
node holds its block of users in files of the family's; it receives the broadcast public state
and returns only clipped statistics, checked against the family's per-user bounds before they
are summed. The aggregator and server steps are the family's own, as in the in-process engine
(:mod:`fedpriv.engine.blocks`); the node side is :mod:`fedpriv.flower.block_client`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from ..algorithms.families import EVAL_KIND, Family, ReplyPart
from ..engine.loop import Hooks, make_aggregator, step_seconds, train_rounds
from ..privacy.accounting import ADD_REMOVE
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets
from . import codec
from .counters import RoundCounters
from .node_secrets import write_raw_ids
from .rounds import Rounds, job_rounds, wait_for_nodes

log = logging.getLogger("fedpriv.flower")

#: the message type of every block family's rounds (the kind travels in the message)
ROUND = "query.block"
INFO = "query.block_info"


@dataclass
class BlockJob:
    """One run of a block family on Flower: what the ServerApp needs (never sent whole)."""

    family: Family
    algorithm: str
    epsilon: float | None
    delta: float
    cfg: object
    data: object
    work_dir: Path | None
    users_per_node: int = 1
    round_timeout: float | None = None
    node_wait_seconds: float = 120.0
    secrets: RunSecrets = field(default_factory=RunSecrets, repr=False)  # never sent to a node
    progress: bool = False  # one line per round and a summary table on stdout (fedpriv.flower.progress)
    relation: str = ADD_REMOVE

    @property
    def n_users(self) -> int:
        return self.family.n_users(self.data)

    def serve(self, grid) -> BlockResult:
        return run_block_job(grid, self)

    def n_parts(self) -> int:
        return -(-self.n_users // self.users_per_node)


@dataclass
class BlockResult(RoundCounters):
    state: object
    ledger: PrivacyLedger
    evaluation: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    nodes: int = 0


# ------------------------------------------------------------------ node data and messages
def write_block_data(family: Family, folder: Path, data) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    family.write_node_data(folder, data)
    write_raw_ids(folder, family.user_ids(data))
    return str(folder)


def encode_block_state(
    family: Family,
    state,
    data_dir: str,
    users_per_node: int,
    kind: str = "",
    group: int | None = None,
    key_file: str | None = None,
) -> RecordDict:
    """The broadcast of one round: the family's public state, the round's ``kind`` and, for a
    disjoint schedule, its ``group`` (each node's users know their own groups; the server never
    learns them); ``key_file``: reproducible-noise runs only."""
    arrays, scalars = family.encode_state(state)
    cfg = ConfigRecord(
        {
            **scalars,
            "family": family.name,
            "kind": kind,
            "data_dir": data_dir,
            "users_per_node": int(users_per_node),
            "group": -1 if group is None else int(group),
        }
    )
    if key_file:
        cfg["client_key_file"] = str(key_file)
    return RecordDict({"state": ArrayRecord({k: codec.to_array(v) for k, v in arrays.items()}), "cfg": cfg})


def decode_reply(content: RecordDict, parts: list[ReplyPart], max_users: int, bounded: bool) -> dict[str, np.ndarray]:
    """Validated arrays of a reply: lengths, dtypes, finite values and, when ``bounded`` (a
    private run), L2 norms within ``n`` times each part's per-user bound and entries within
    [0, n * entry_range] where the part declares one."""
    n, arrays = codec.unpack_contribution(content, max_users)
    out = {}
    for part in parts:
        v = codec.checked_array(arrays, part.name, 1, "f")
        if len(v) != part.length:
            raise codec.RejectedReply(f"malformed: {part.name} has length {len(v)}, expected {part.length}")
        if bounded:
            codec.check_norm(part.name, v, n * part.bound)
        top = None if part.entry_range is None else n * part.entry_range
        if bounded and top is not None and len(v) and (v.min() < 0 or v.max() > top * (1 + 1e-9)):
            raise codec.RejectedReply(
                f"over bound: {part.name} outside [0, {top:.6g}] (min {v.min():.6g}, max {v.max():.6g})"
            )
        out[part.name] = v
    return out


class _GridBlockTransport:
    """A block family's rounds over a Flower Grid (:class:`fedpriv.engine.loop.Transport`): one
    message per node, every reply validated against the family's bounds before it is summed."""

    def __init__(self, job: BlockJob, rounds: Rounds, state, data_dir: str, key_file: str | None):
        self.job, self.rounds, self.state, self.data_dir, self.key_file = job, rounds, state, data_dir, key_file
        self.family, self.upn = job.family, job.users_per_node
        self.secure = None
        if state.config.aggregation.secure:
            from .secure_server import SecureRounds

            self.secure = SecureRounds(rounds, self.upn, colluders=state.config.aggregation.collusion)

    def content(self, kind: str, group: int | None = None) -> RecordDict:
        return encode_block_state(self.family, self.state, self.data_dir, self.upn, kind, group, self.key_file)

    def start(self, state, server) -> None:
        pass

    def prepare(self, step: int) -> None:
        pass

    def population(self) -> tuple[int, int]:
        return self.secure.population()

    def secure_sum(self, kind: str, plan, state, step: int, group=None):
        return self.secure.secure_sum(kind, plan, self.content(kind, group), step)

    def collect(self, kind: str, name: str, parts: list[ReplyPart], group=None, bounded=True) -> dict[str, np.ndarray]:
        total = {p.name: np.zeros(p.length) for p in parts}
        bounded = bounded and self.family.private(self.state.algorithm)

        def decode(nid, rep):
            return decode_reply(rep.content, parts, self.upn, bounded)

        for _, vals in self.rounds.gather(ROUND, self.content(kind, group), name, decode):
            for key in total:
                total[key] += vals[key]
        return total

    def sums(self, kind: str, state, step: int = 0, group=None) -> tuple:
        """A round's checked, summed replies, in the order of the round's parts."""
        parts = self.family.reply_parts(kind, state)
        total = self.collect(kind, self.family.round_label(kind, step, state), parts, group)
        return tuple(total[p.name] for p in parts)


def _serving_nodes(grid, job: BlockJob, rounds: Rounds, content) -> list[int]:
    """The info round: each node's partition id; the serving nodes in partition order."""
    n_parts = job.n_parts()
    partition_of: dict[int, int] = {}
    for nid, rep in rounds.ask(INFO, content, "info", timeout=None):
        try:
            pid = rep.content.config_records["meta"]["partition_id"]
        except KeyError as exc:
            rounds.reject("info", nid, f"malformed info reply ({exc})")
            continue
        if isinstance(pid, bool) or not isinstance(pid, int):  # not int(): it overflows on inf
            rounds.reject("info", nid, f"malformed info reply (partition id {pid!r} is not an integer)")
            continue
        partition_of[nid] = pid
    return [n for n in sorted(partition_of, key=partition_of.get) if partition_of[n] < n_parts]


def run_block_job(grid, job: BlockJob) -> BlockResult:
    """One run of a block family over the nodes of ``grid``: the info round, the loop of
    :func:`fedpriv.engine.loop.train_rounds`, then the evaluation (a secure sum in secure mode)."""
    t0 = time.perf_counter()
    family, data = job.family, job.data
    state, ledger = family.new_state(
        job.algorithm, job.cfg, data, job.epsilon, job.delta, job.secrets.ledger_seed(), job.relation
    )
    result = BlockResult(state=state, ledger=ledger)
    n_parts = job.n_parts()
    data_dir = write_block_data(family, Path(job.work_dir) / "node-data", data)
    key_file = None
    if job.secrets.reproducible:
        from .node_secrets import write_key_file

        key_file = write_key_file(job.work_dir, job.secrets.client_key())
    rounds = job_rounds(grid, job, result, wait_for_nodes(grid, n_parts, job.node_wait_seconds), n_parts)
    rounds.nodes = _serving_nodes(grid, job, rounds, encode_block_state(family, state, data_dir, job.users_per_node))
    result.nodes = len(rounds.nodes)

    transport = _GridBlockTransport(job, rounds, state, data_dir, key_file)
    hooks = Hooks()
    train_rounds(transport, make_aggregator(job.cfg, ledger), state, hooks=hooks)
    result.timings = {"steps": step_seconds(hooks.timings), "train_seconds": time.perf_counter() - t0}

    before = (result.rounds, result.bytes_up, result.bytes_down)  # evaluation is measurement
    if transport.secure is not None:  # the totals only, never one node's sums
        tot = transport.secure.measure(EVAL_KIND, [("values", 2)], transport.content(EVAL_KIND))
    else:
        tot = transport.collect(EVAL_KIND, "evaluate", [ReplyPart("values", 2, float("inf"))], bounded=False)
    result.rounds, result.bytes_up, result.bytes_down = before
    result.evaluation = family.evaluate_sums(tot["values"], data, state)
    progress = rounds.progress
    if progress is not None:
        shown = {_label(key): value for key, value in result.evaluation.items() if value is not None}
        progress.summary(result.round_log, result.rejected, shown, counters=result)
    return result


def _label(key: str) -> str:
    """A measurement's label in the progress summary: ``test_mse`` is "test MSE"."""
    return " ".join(word.upper() if word in ("mse", "rmse") else word for word in key.split("_"))


def run_block_job_local(job: BlockJob, nodes: int, runner) -> BlockResult:
    """Run ``job`` with ``runner(job, n_nodes)`` (a Flower simulation, a grid) in a work folder
    of its own unless the job names one (removed afterwards)."""
    import shutil

    from ..util.workdirs import owned_tempdir

    own_dir = job.work_dir is None
    if own_dir:
        job.work_dir = owned_tempdir("fedpriv-blocks-")  # a killed run's folder goes with the next run
    try:
        return runner(job, nodes or job.n_parts())
    finally:
        if own_dir:
            shutil.rmtree(job.work_dir, ignore_errors=True)
