"""DP model personalization over Flower: node data, messages, client handlers and the server
loop. Each node holds the samples (x, y) of its block of users in memory-mapped files; it
receives the public embedding U and returns only clipped statistics (the personal vectors v_j
are solved and kept on the node). The aggregator step and the server step are the functions of
:mod:`fedpriv.algorithms.pam`, as in the in-process engine."""

from __future__ import annotations

import json
import math
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from ..algorithms import pam
from ..engine.loop import Hooks, make_aggregator, step_seconds, train_rounds
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import RunSecrets
from . import codec
from .counters import RoundCounters
from .rounds import Rounds, wait_for_nodes
from .node_secrets import write_raw_ids

log = logging.getLogger("fedpriv.flower")


@dataclass
class PamJob:
    algorithm: str
    epsilon: float | None
    delta: float
    cfg: pam.PAMConfig
    data: object  # PersonalData
    work_dir: Path | None
    users_per_node: int = 1
    round_timeout: float | None = None
    node_wait_seconds: float = 120.0
    secrets: RunSecrets = field(default_factory=RunSecrets, repr=False)  # never sent to a node
    progress: bool = False  # one line per round and a summary table on stdout (fedpriv.flower.progress), as for the rating algorithms

    def n_parts(self) -> int:
        return -(-self.data.n_users // self.users_per_node)

    def validate_plan(self) -> None:
        """All checks of a run (config, privacy calibration) without training."""
        pam.new_pam_state(
            self.algorithm, self.cfg, self.data.d, self.data.k, self.data.samples, self.epsilon, self.delta
        )


@dataclass
class PamResult(RoundCounters):
    state: pam.PAMState
    ledger: PrivacyLedger
    evaluation: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    nodes: int = 0


# ------------------------------------------------------------------ node data
def write_pam_partitions(folder: Path, data) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "pam_X.npy", np.ascontiguousarray(data.X, dtype=np.float32))
    np.save(folder / "pam_y.npy", np.ascontiguousarray(data.y, dtype=np.float32))
    # ground truth: measurement only (population MSE on the nodes), never a training input
    np.save(folder / "pam_V_star.npy", data.V_star)
    np.save(folder / "pam_U_star.npy", data.U_star)
    (folder / "pam_meta.json").write_text(json.dumps({"n_users": data.n_users, "noise": data.noise}))
    write_raw_ids(folder, data.user_ids)
    return str(folder)


# ------------------------------------------------------------------ messages
def encode_pam_state(
    state: pam.PAMState, data_dir: str, users_per_node: int, group: int | None = None, key_file: str | None = None
) -> RecordDict:
    """``group``: the disjoint schedule's group of this step (each node's users know their own
    groups; the server never learns them); ``key_file``: reproducible-noise runs only."""
    arrays = {}
    if state.U is not None:
        arrays["U"] = codec.to_array(state.U)
    if state.theta is not None:
        arrays["theta"] = codec.to_array(state.theta)
    cfg = ConfigRecord(
        {
            "algorithm": state.algorithm,
            "config": json.dumps(state.config.to_dict()),
            "d": state.d,
            "k": state.k,
            "samples": state.samples,
            "data_dir": data_dir,
            "users_per_node": int(users_per_node),
            "group": -1 if group is None else int(group),
        }
    )
    if key_file:
        cfg["client_key_file"] = str(key_file)
    return RecordDict({"state": ArrayRecord(arrays), "cfg": cfg})


def _decode(
    content: RecordDict,
    keys: dict[str, int],
    bounds: dict[str, float],
    max_users: int,
    ranges: dict[str, float] | None = None,
) -> dict[str, np.ndarray]:
    """Validated arrays of a reply: lengths, dtypes, finite values, L2 norms within ``n`` times
    the per-user ``bounds``, and entries within [0, n * ranges[key]] for the keys in ``ranges``
    (exponential-mechanism scores: each user's term is in [0, sensitivity])."""
    n, arrays = codec.unpack_contribution(content, max_users)
    out = {}
    for key, length in keys.items():
        v = codec.checked_array(arrays, key, 1, "f")
        if len(v) != length:
            raise codec.RejectedReply(f"malformed: {key} has length {len(v)}, expected {length}")
        if key in bounds:
            codec.check_norm(key, v, n * bounds[key])
        if ranges and key in ranges and len(v) and (v.min() < 0 or v.max() > n * ranges[key] * (1 + 1e-9)):
            raise codec.RejectedReply(
                f"over bound: {key} outside [0, {n * ranges[key]:.6g}] (min {v.min():.6g}, max {v.max():.6g})"
            )
        out[key] = v
    return out


class _GridPamTransport:
    """The personalization rounds over a Flower Grid (:class:`fedpriv.engine.loop.Transport`):
    one message per node, every reply validated against its per-user bounds (:func:`_decode`)
    before it is summed."""

    def __init__(self, rounds: Rounds, state: pam.PAMState, data_dir: str, users_per_node: int, key_file: str | None):
        self.rounds, self.state, self.data_dir, self.upn, self.key_file = (
            rounds,
            state,
            data_dir,
            users_per_node,
            key_file,
        )
        self.secure = None
        if state.config.aggregation.secure:
            from .secure_server import SecureRounds

            self.secure = SecureRounds(rounds, users_per_node, colluders=state.config.aggregation.collusion)

    def start(self, state, server) -> None:
        pass

    def prepare(self, step: int) -> None:
        pass

    def population(self) -> tuple[int, int]:
        return self.secure.population()

    def secure_sum(self, kind: str, plan, state: pam.PAMState, step: int, group=None):
        return self.secure.secure_sum(
            kind, plan, encode_pam_state(state, self.data_dir, self.upn, group, self.key_file), step
        )

    def collect(
        self, kind: str, name: str, keys: dict[str, int], bounds: dict[str, float], group=None, ranges=None
    ) -> dict[str, np.ndarray]:
        state = self.state
        total = {key: np.zeros(n) for key, n in keys.items()}
        content = encode_pam_state(state, self.data_dir, self.upn, group, self.key_file)
        decode = lambda nid, rep: _decode(
            rep.content, keys, bounds if state.private else {}, self.upn, ranges if state.private else None
        )  # noqa: E731
        for _, vals in self.rounds.gather(f"query.{kind}", content, name, decode):
            for key in total:
                total[key] += vals[key]
        return total

    def sums(self, kind: str, state: pam.PAMState, step: int = 0, group=None) -> tuple:
        """A round's checked, summed replies, in the order of the round's parts."""
        if kind == "pam_init":
            d = state.d
            return (
                self.collect(
                    kind, "init", {"values": d * (d + 1) // 2}, {"values": pam.pam_sensitivity("init_M", state)}
                )["values"],
            )
        if kind == "pam_exp":
            # every entry of a user's score vector is in [0, s]: L2 norm <= s sqrt(N) per user
            n, s_user = len(pam.exp_net(state)), pam.pam_sensitivity("exp_U", state)
            return (
                self.collect(kind, "exp", {"scores": n}, {"scores": s_user * math.sqrt(n)}, ranges={"scores": s_user})[
                    "scores"
                ],
            )
        (name_a, n_a, *_), (name_b, n_b, *_) = pam.summed_parts(kind, state)
        label = "single" if name_a == "single_A" else f"step{step + 1}"
        bounds = {"A_upper": pam.pam_sensitivity(name_a, state), "b": pam.pam_sensitivity(name_b, state)}
        tot = self.collect(kind, label, {"A_upper": n_a, "b": n_b}, bounds, group)
        return tot["A_upper"], tot["b"]


def run_pam_job(grid, job: PamJob) -> PamResult:
    t0 = time.perf_counter()
    data = job.data
    state, ledger = pam.new_pam_state(
        job.algorithm, job.cfg, data.d, data.k, data.samples, job.epsilon, job.delta, job.secrets.ledger_seed()
    )
    result = PamResult(state=state, ledger=ledger)
    n_parts = job.n_parts()
    data_dir = write_pam_partitions(Path(job.work_dir) / "node-data", data)
    key_file = None
    if job.secrets.reproducible:
        from .node_secrets import write_key_file

        key_file = write_key_file(job.work_dir, job.secrets.client_key())
    nodes = wait_for_nodes(grid, n_parts, job.node_wait_seconds)
    if len(nodes) < n_parts:
        from ..errors import ConfigError

        raise ConfigError(
            f"{n_parts} partitions of {job.users_per_node} users need {n_parts} nodes; {len(nodes)} registered",
            field="users-per-node",
        )
    progress = None
    if job.progress:
        from .progress import Progress

        progress = Progress(job.delta, lambda: result.ledger, job.epsilon)
    rounds = Rounds(grid, nodes, result, job.round_timeout, progress=progress)
    upn = job.users_per_node

    partition_of: dict[int, int] = {}
    for nid, rep in rounds.ask("query.pam_info", encode_pam_state(state, data_dir, upn), "info", timeout=None):
        try:
            pid = rep.content.config_records["meta"]["partition_id"]
        except KeyError as exc:
            rounds.reject("info", nid, f"malformed info reply ({exc})")
            continue
        if isinstance(pid, bool) or not isinstance(pid, int):  # not int(): it overflows on inf
            rounds.reject("info", nid, f"malformed info reply (partition id {pid!r} is not an integer)")
            continue
        partition_of[nid] = pid
    rounds.nodes = [n for n in sorted(partition_of, key=partition_of.get) if partition_of[n] < n_parts]
    result.nodes = len(rounds.nodes)

    transport = _GridPamTransport(rounds, state, data_dir, upn, key_file)
    hooks = Hooks()
    train_rounds(transport, make_aggregator(job.cfg, ledger), state, hooks=hooks)
    result.timings = {"steps": step_seconds(hooks.timings), "train_seconds": time.perf_counter() - t0}

    before = (result.rounds, result.bytes_up, result.bytes_down)  # evaluation is measurement
    if transport.secure is not None:  # the totals only, never one node's sums
        tot = transport.secure.measure(
            "pam_eval", [("values", 2)], encode_pam_state(state, data_dir, upn, None, key_file)
        )
    else:
        tot = transport.collect("pam_eval", "evaluate", {"values": 2}, {})
    result.rounds, result.bytes_up, result.bytes_down = before
    result.evaluation = {"test_mse": float(tot["values"][0] / max(tot["values"][1], 1.0) + data.noise**2)}
    result.evaluation["subspace_error"] = pam.subspace_error(state.U, data.U_star) if state.U is not None else None
    if progress is not None:
        shown = {"test MSE": result.evaluation["test_mse"], "subspace error": result.evaluation["subspace_error"]}
        progress.summary(
            result.round_log, result.rejected, {k: v for k, v in shown.items() if v is not None}, counters=result
        )
    return result


def run_pam_job_local(job: PamJob, nodes: int, runner) -> PamResult:
    """Run ``job`` with ``runner(job, n_nodes)`` (a Flower simulation, a grid) in a work folder
    of its own unless the job names one (removed afterwards)."""
    import shutil

    from ..util.workdirs import owned_tempdir

    own_dir = job.work_dir is None
    if own_dir:
        job.work_dir = owned_tempdir("fedpriv-pam-")  # a killed run's folder goes with the next run
    try:
        return runner(job, nodes or job.n_parts())
    finally:
        if own_dir:
            shutil.rmtree(job.work_dir, ignore_errors=True)
