"""Distributed-DP secure summation for any Flower app that trains an ``ArrayRecord`` model.

Server side: :class:`SecureDPFedAvg`, a Message-API strategy (a :class:`flwr.serverapp.strategy.
FedAvg` whose training rounds go through secure aggregation): each sampled node trains, clips
its model update to ``clipping_norm``, adds its share of Skellam noise and masks it; the server
learns only the noised sum of the clipped updates, adds its mean to the model, and records every
round in a :class:`fedpriv.privacy.ledger.PrivacyLedger` (epsilon from dp-accounting).

Client side: :func:`secure_client_app` wraps an ordinary train function: the function trains as
usual and returns its ``arrays``; the wrapper checks the round's plan against the node's own
policy (:mod:`fedpriv.flower.node_policy`, from the node's configuration) and turns the update
into masked words.

The privacy unit is one node (cross-device: one user per node). Nodes are sampled by FedAvg's
rule, but the accounting gives no credit for sampling (distributed Skellam noise has no
subsampled accountant event). Evaluation rounds are secure measurement sums too: each sampled node
runs its evaluate function and sends only masked words of its ``num-examples`` and its
``num-examples``-weighted metrics (``evaluate_metrics``), so the server learns the weighted
averages over the nodes, exactly, and no node's own metrics. A node of
:func:`secure_client_app` refuses a plaintext evaluation request. The averages are a measurement
outside the ledger: exact, not noised.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from ..errors import ConfigError
from ..privacy import distributed
from ..privacy.accounting import ADD_REMOVE, RdpAccountant, calibrate, check_relation
from ..privacy.distributed import ExactPlan, plan_from_dict
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import node_noise_rng
from ..privacy.records import PlannedRelease
from . import secure_client
from .counters import RoundCounters
from .node_policy import check_plan
from .rounds import Rounds
from .secure_server import SecureRounds

log = logging.getLogger("fedpriv.flower")
RELEASE = "update"
EVAL_KIND = "fedavg_eval"  # the evaluation's secure measurement sum


def flatten(arrays: ArrayRecord) -> np.ndarray:
    """The model's arrays, in key order, as one float64 vector."""
    return (
        np.concatenate([np.asarray(arrays[k].numpy(), dtype=np.float64).ravel() for k in arrays])
        if len(arrays)
        else np.zeros(0)
    )


def unflatten(vector: np.ndarray, like: ArrayRecord) -> ArrayRecord:
    """``vector`` shaped (and typed) as the arrays of ``like``."""
    out, at = {}, 0
    for k in like:
        ref = like[k].numpy()
        out[k] = Array(vector[at : at + ref.size].reshape(ref.shape).astype(ref.dtype))
        at += ref.size
    return ArrayRecord(out)


class SecureDPFedAvg(FedAvg):
    """FedAvg with secure summation of clipped, distributedly noised model updates.

    ``noise_multiplier``: z of each round's Skellam noise (in units of ``clipping_norm``); or give
    ``epsilon`` (and ``delta``, ``num_rounds``) and z is calibrated so that the rounds spend it.
    ``dropout``: the fraction of sampled nodes that may drop (the noise shares are sized for the
    rest; a round with fewer contributors releases nothing). ``collusion``: how many nodes may
    pool their own noise shares; the noise without them still meets z (default 1: the guarantee
    holds against every node, which knows its own share). ``ledger``: where the rounds are
    recorded (default: a new ledger with the epsilon budget). ``evaluate_metrics``: the names of
    the metrics the nodes' evaluate function reports (with ``num-examples``, FedAvg's
    ``weighted_by_key``); each evaluation round is a secure sum of them, and evaluation
    (``fraction_evaluate`` > 0) needs them: a plaintext evaluation round is never sent.
    ``relation``: the neighbouring relation the epsilon holds under (``add_remove``, or
    ``replace_one`` where the number of users is public); a given ``ledger`` must carry it.
    """

    def __init__(
        self,
        *,
        clipping_norm: float,
        noise_multiplier: float | None = None,
        epsilon: float | None = None,
        delta: float = 1e-5,
        num_rounds: int | None = None,
        dropout: float = 0.0,
        collusion: int = 1,
        ledger: PrivacyLedger | None = None,
        round_timeout: float | None = None,
        evaluate_metrics: tuple[str, ...] | list[str] = (),
        relation: str = ADD_REMOVE,
        **fedavg_kwargs,
    ):
        super().__init__(**fedavg_kwargs)
        check_relation(relation, field="relation")
        if ledger is not None and ledger.relation != relation:
            raise ConfigError(f"the ledger accounts under {ledger.relation!r}, not {relation!r}", field="relation")
        if isinstance(evaluate_metrics, str) or not all(isinstance(k, str) and k for k in evaluate_metrics):
            raise ConfigError(f"must be a list of metric names, got {evaluate_metrics!r}", field="evaluate_metrics")
        self.evaluate_metrics = tuple(k for k in evaluate_metrics if k != self.weighted_by_key)
        if not (clipping_norm > 0 and np.isfinite(clipping_norm)):
            raise ConfigError(f"must be a finite number > 0, got {clipping_norm}", field="clipping_norm")
        if (noise_multiplier is None) == (epsilon is None):
            raise ConfigError("give exactly one of noise_multiplier and epsilon", field="noise_multiplier")
        if epsilon is not None:
            if num_rounds is None:
                raise ConfigError("calibrating to an epsilon needs num_rounds", field="num_rounds")
            # Skellam noise: its RDP bound (hence this calibration) holds at integer orders only
            noise_multiplier = calibrate(
                [PlannedRelease(RELEASE, int(num_rounds), 1.0)], epsilon, delta, integer_orders=True, relation=relation
            ).multipliers[RELEASE]
        if not (0 <= dropout < 1):
            raise ConfigError(f"must be in [0, 1), got {dropout}", field="dropout")
        if not (isinstance(collusion, int) and collusion >= 0):
            raise ConfigError(f"must be an integer >= 0, got {collusion!r}", field="collusion")
        self.clipping_norm, self.noise_multiplier, self.dropout, self.delta = (
            float(clipping_norm),
            float(noise_multiplier),
            dropout,
            delta,
        )
        self.collusion = collusion
        budget = (epsilon, delta) if epsilon is not None else None
        self.ledger = (
            ledger
            if ledger is not None
            else PrivacyLedger(budget=budget, accountant=RdpAccountant() if budget else None, relation=relation)
        )
        self.round_timeout = round_timeout
        self.counters = RoundCounters()

    def summary(self) -> None:
        log.info(
            "SecureDPFedAvg: clipping norm %g, noise multiplier %g, dropout %g (distributed Skellam noise, SecAgg+)",
            self.clipping_norm,
            self.noise_multiplier,
            self.dropout,
        )

    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon spent so far, computed by dp-accounting from the ledger."""
        return RdpAccountant().epsilon(self.ledger, self.delta if delta is None else delta)  # under its relation

    def _secure_round(
        self, grid: Grid, server_round: int, arrays: ArrayRecord, config: ConfigRecord, secure: SecureRounds
    ) -> ArrayRecord | None:
        messages = list(self.configure_train(server_round, arrays, config, grid))
        nodes = [m.metadata.dst_node_id for m in messages]
        if len(nodes) < 2:
            log.warning("round %d: %d sampled node(s); secure summation needs 2", server_round, len(nodes))
            return None
        secure.rounds.nodes = nodes
        n = len(nodes)
        length = sum(arrays[k].numpy().size for k in arrays)
        content = RecordDict(
            {
                self.arrayrecord_key: arrays,
                self.configrecord_key: ConfigRecord(dict(config, clipping_norm=self.clipping_norm)),
            }
        )
        counted = []

        def gather(plan):
            unmask, contributors = secure.secure_sum(RELEASE, plan, content, server_round)
            counted.append(contributors)
            return unmask, contributors

        values, _ = distributed.secure_round(
            self.ledger,
            [(RELEASE, length, self.clipping_norm, self.noise_multiplier)],
            n_nodes=n,
            max_users=n,
            dropout=self.dropout,
            colluders=self.collusion,
            secure_sum=gather,
        )
        mean_update = values[RELEASE] / counted[0]  # post-processing: the count of contributors is public
        return unflatten(flatten(arrays) + mean_update, arrays)

    def _secure_evaluate(
        self, grid: Grid, server_round: int, arrays: ArrayRecord, config: ConfigRecord, secure: SecureRounds
    ) -> MetricRecord | None:
        """One evaluation round as a secure measurement sum over the sampled nodes: the totals of
        ``weighted_by_key`` and of each metric times it, hence the weighted averages; no node's
        own metrics reach the server. None with fewer than 2 sampled nodes (nothing is sent)."""
        messages = list(self.configure_evaluate(server_round, arrays, config, grid))
        nodes = [m.metadata.dst_node_id for m in messages]
        if not nodes:
            return None
        if len(nodes) < 2:
            log.warning("round %d: %d node(s) sampled for evaluation; a secure sum needs 2", server_round, len(nodes))
            return None
        secure.rounds.nodes = nodes
        content = RecordDict(
            {
                self.arrayrecord_key: arrays,
                self.configrecord_key: messages[0].content.config_records[self.configrecord_key],
            }
        )
        plan = ExactPlan(
            tuple((k, 1) for k in (self.weighted_by_key, *self.evaluate_metrics)),
            n_nodes=len(nodes),
            min_contributors=2,
        )
        before, secure.mask_message_type = secure.mask_message_type, "evaluate"  # the round whose handler evaluates
        try:
            unmask, _ = secure.secure_sum(EVAL_KIND, plan, content, server_round)
            totals = plan.decode(unmask())
        finally:
            secure.mask_message_type = before
        weight = float(totals[self.weighted_by_key][0])
        if not weight > 0:
            return None
        return MetricRecord({k: float(totals[k][0]) / weight for k in self.evaluate_metrics})

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        on_round: Callable[[int, float, MetricRecord | None], None] | None = None,
    ) -> Result:
        """FedAvg's loop, each training round a secure sum (keys once, then share, train and
        mask, unmask). Returns Flower's Result; the epsilon is :meth:`epsilon`. ``on_round(round,
        epsilon spent so far, the nodes' aggregated evaluation metrics)`` after every round
        (progress lines)."""
        self.summary()
        if self.fraction_evaluate > 0 and not self.evaluate_metrics:
            raise ConfigError(
                "evaluation on the nodes is a secure sum of named metrics: "
                "give evaluate_metrics (what the nodes' evaluate function reports), or fraction_evaluate=0",
                field="evaluate_metrics",
            )
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        rounds = Rounds(grid, sorted(grid.get_node_ids()), self.counters, self.round_timeout or timeout)
        secure = SecureRounds(rounds, users_per_node=1, mask_message_type="train", colluders=self.collusion)
        result, arrays = Result(), initial_arrays
        if evaluate_fn is not None:
            res = evaluate_fn(0, arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        t0 = time.time()
        for server_round in range(1, num_rounds + 1):
            updated = self._secure_round(grid, server_round, arrays, train_config, secure)
            if updated is not None:
                arrays = result.arrays = updated
            log.info("round %d: epsilon %.4f (delta %g) spent so far", server_round, self.epsilon(), self.delta)
            metrics = self._secure_evaluate(grid, server_round, arrays, ConfigRecord(dict(evaluate_config)), secure)
            if metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = metrics
            if evaluate_fn is not None:
                res = evaluate_fn(server_round, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[server_round] = res
            if on_round is not None:
                on_round(server_round, self.epsilon(), metrics)
        log.info("SecureDPFedAvg finished in %.2fs: epsilon %.4f", time.time() - t0, self.epsilon())
        result.arrays = arrays
        return result


# ---------------------------------------------------------------------------- client side
def _clip(update: np.ndarray, norm: float) -> np.ndarray:
    n = float(np.linalg.norm(update))
    return update if n <= norm else update * (norm / n)


def secure_train(train_fn: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """Wrap a ClientApp train function for :class:`SecureDPFedAvg`: ``train_fn`` trains and
    returns a reply with ``arrays`` as usual; the wrapper clips the update (reply arrays minus the
    received ones) to the round's clipping norm, checks the round's plan against the node's own
    policy (:func:`fedpriv.flower.node_policy.check_plan`: the plan's sensitivity covers that norm,
    its noise as the node counts contributors and colluders, the node's budget over the rounds),
    quantizes the update, adds this node's Skellam noise share (OS randomness) and masks it. Only
    the masked words leave the node: the reply's metrics are dropped."""

    def train(msg: Message, context: Context) -> Message:
        sec = msg.content.config_records.get("secagg")
        if sec is None:
            raise ConfigError("this node only trains under secure aggregation (SecureDPFedAvg)", field="secagg")
        reply = train_fn(msg, context)
        before = msg.content.array_records["arrays"]
        after = reply.content.array_records["arrays"]
        clip = float(msg.content.config_records["config"]["clipping_norm"])
        update = _clip(flatten(after) - flatten(before), clip)
        plan = distributed.DistributedPlan.from_dict(json.loads(str(sec["plan"])))
        # the node's own policy, before its noise share is drawn: the plan's sensitivity covers the
        # norm this node clipped to, its noise (as this node counts contributors and colluders) is
        # above the node's floor, and the release fits the node's budget
        check_plan(context, RELEASE, plan, [(RELEASE, update.size, clip)])
        words = distributed.encode(plan, {RELEASE: update}, node_noise_rng(None, str(sec["label"]), reproducible=False))
        return secure_client.masked_reply(msg, context, words)

    return train


def secure_evaluate(evaluate_fn: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """Wrap a ClientApp evaluate function for :class:`SecureDPFedAvg`: ``evaluate_fn`` returns
    its metrics as usual (a MetricRecord with ``num-examples``); the wrapper sends only masked
    words of the metrics the server's exact measurement plan names (``num-examples``, and each
    metric times it). A plaintext evaluation request (no secure round) is refused, as is a plan
    that is not an exact measurement of this kind."""

    def evaluate(msg: Message, context: Context) -> Message:
        sec = msg.content.config_records.get("secagg")
        if sec is None:
            raise ConfigError(
                "this node evaluates only under secure aggregation (SecureDPFedAvg): it sends no plaintext metrics",
                field="secagg",
            )
        plan = plan_from_dict(json.loads(str(sec["plan"])))
        if str(sec.get("kind")) != EVAL_KIND or not isinstance(plan, ExactPlan) or not plan.parts:
            raise ConfigError(
                f"refused an evaluation round of kind {sec.get('kind')!r} with a {type(plan).__name__}", field="secagg"
            )
        reply = evaluate_fn(msg, context)
        records = list(reply.content.metric_records.values())
        if len(records) != 1:
            raise ConfigError(
                f"the evaluate function must reply with one MetricRecord, got {len(records)}", field="evaluate_fn"
            )
        metrics, (weight_key, _) = records[0], plan.parts[0]
        missing = [k for k, _ in plan.parts if k not in metrics]
        if missing:
            raise ConfigError(f"the evaluate function reported no {', '.join(missing)}", field="evaluate_metrics")
        weight = float(metrics[weight_key])
        values = {k: np.array([weight if k == weight_key else weight * float(metrics[k])]) for k, _ in plan.parts}
        return secure_client.masked_reply(msg, context, plan.encode(values))

    return evaluate


def secure_client_app(
    train_fn: Callable[[Message, Context], Message], evaluate_fn: Callable[[Message, Context], Message] | None = None
) -> ClientApp:
    """A ClientApp for :class:`SecureDPFedAvg`: the secure-summation handlers, ``train_fn``
    under :func:`secure_train`, and ``evaluate_fn`` under :func:`secure_evaluate`."""
    app = ClientApp()
    for name, handler in (
        ("secagg_keys", secure_client.keys),
        ("secagg_share", secure_client.share),
        ("secagg_consistency", secure_client.consistency),
        ("secagg_unmask", secure_client.unmask),
    ):
        app.query(name)(handler)
    app.train()(secure_train(train_fn))
    if evaluate_fn is not None:
        app.evaluate()(secure_evaluate(evaluate_fn))
    return app


__all__ = ["SecureDPFedAvg", "flatten", "secure_client_app", "secure_evaluate", "secure_train", "unflatten"]
