"""Private recommendation over Flower (:mod:`fedpriv.algorithms.recommend`): the node handlers
(``query.rec_hist``, ``query.recommend``) and the server's two rounds. Thin wrappers: the node,
aggregator and server functions are the ones the in-process engine calls."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from ..algorithms import recommend
from ..privacy.ledger import PrivacyLedger
from ..privacy.target import ADD_REMOVE
from .codec import checked_array, decode_state, to_array

log = logging.getLogger("fedpriv.flower")


def _cfg_record(cfg: recommend.RecommendConfig, has_test: bool) -> ConfigRecord:
    return ConfigRecord({"json": json.dumps({**dataclasses.asdict(cfg), "has_test": bool(has_test)})})


def _cfg_of(content: RecordDict) -> tuple[recommend.RecommendConfig, bool]:
    d = json.loads(str(content.config_records["rec_cfg"]["json"]))
    has_test = bool(d.pop("has_test", False))
    d["quantiles"] = tuple(d["quantiles"])
    cfg = recommend.RecommendConfig(**d)
    cfg.validate()
    return cfg, has_test


def register_recommend_handlers(app) -> None:
    """Add the recommendation handlers to fedpriv's ClientApp."""
    from .node_policy import check_recommendation, node_policy, refuse
    from .node_secrets import with_keys
    from .partition import data_dir_of, load_shard

    def setup(msg: Message, context: Context):
        state, data_dir, upn = decode_state(msg.content)
        data_dir = data_dir_of(context.node_config, data_dir)  # a deployed node's own folder, if any
        pid = int(context.node_config.get("partition-id", 0))
        cfg, has_test = _cfg_of(msg.content)
        rec = msg.content.array_records["rec"]
        return state, data_dir, upn, pid, cfg, has_test, rec["candidates"].numpy().astype(np.int64)

    @app.query("rec_hist")
    def rec_hist(msg: Message, context: Context) -> Message:
        if (
            node_policy(context).aggregation == "secure"
        ):  # plaintext histogram (secure mode: secagg_mask, kind rec_hist)
            raise refuse(
                "plaintext handler 'rec_hist'",
                "this node is configured for secure aggregation (policy-aggregation=secure)",
            )
        state, data_dir, upn, pid, cfg, _, cand = setup(msg, context)
        shard = load_shard(data_dir, "train", pid, upn)
        hist = recommend.client_histogram(shard, state, cand, cfg)
        return Message(
            RecordDict(
                {"rec": ArrayRecord({"hist": to_array(hist)}), "meta": ConfigRecord({"n_users": shard.n_users})}
            ),
            reply_to=msg,
        )

    @app.query("recommend")
    def recommend_(msg: Message, context: Context) -> Message:
        """One local-DP pick per user of the node. Its epsilon (the message's) is checked against
        the node's own policy and recorded in the node ledger before any pick is drawn
        (:func:`fedpriv.flower.node_policy.check_recommendation`: a cap and a number per run)."""
        state, data_dir, upn, pid, cfg, has_test, cand = setup(msg, context)
        check_recommendation(context, cfg.epsilon, len(cand))
        rec = msg.content.array_records["rec"]
        shard, reproducible = with_keys(
            load_shard(data_dir, "train", pid, upn), data_dir, msg.content.config_records["cfg"], context
        )
        held = load_shard(data_dir, "test", pid, upn) if has_test else None
        rep = recommend.client_recommend(
            shard, state, cand, rec["lo"].numpy(), rec["hi"].numpy(), cfg, held, reproducible=reproducible
        )
        sums = {k: to_array(np.asarray(v, np.float64)) for k, v in rep.sums.items()}
        if (
            state.config.aggregation.secure or node_policy(context).aggregation == "secure"
        ):  # kept on the node for the secure measurement (rec_eval)
            context.state[EVAL_KEY] = ArrayRecord(sums)
            sums = {}
        arrays = {"picks": to_array(rep.picks.astype(np.int64)), **sums}
        return Message(
            RecordDict({"rec": ArrayRecord(arrays), "meta": ConfigRecord({"records": json.dumps(rep.records)})}),
            reply_to=msg,
        )


EVAL_KEY = "fedpriv-rec-eval"


def pop_eval_sums(context: Context, plan) -> dict[str, np.ndarray]:
    """The evaluation sums this node's last recommendation reply kept (secure mode), once."""
    rec = context.state.array_records.get(EVAL_KEY)
    if rec is None:
        raise ValueError("no recommendation evaluation sums kept on this node")
    del context.state[EVAL_KEY]
    return {name: rec[name].numpy() for name, _ in plan.parts}


class _GridRecommendTransport:
    """The recommendation rounds over the nodes of a :class:`fedpriv.flower.rounds.Rounds`:
    every histogram and report is validated before it counts; a rejected one is logged."""

    def __init__(self, rounds, base_content: RecordDict, node_users: dict[int, int], has_test: bool, secure=None):
        self.rounds, self.base, self.node_users, self.has_test = rounds, base_content, node_users, has_test
        self.secure = secure  # the job's SecureRounds (secure mode), else None

    def population(self) -> tuple[int, int]:
        return self.secure.population()

    def secure_histogram(self, plan, state, candidates, cfg):
        return self.secure.secure_sum("rec_hist", plan, self._content(candidates, cfg, {}), 0)

    def _content(self, candidates, cfg, extra: dict) -> RecordDict:
        c = RecordDict(dict(self.base.items()))
        c["rec"] = ArrayRecord({"candidates": to_array(candidates), **{n: to_array(v) for n, v in extra.items()}})
        c["rec_cfg"] = _cfg_record(cfg, self.has_test)
        return c

    def histogram(self, state, candidates, cfg) -> np.ndarray:
        k = len(candidates)
        total = np.zeros((k, cfg.bins))

        def decode(nid, rep) -> np.ndarray:
            h = checked_array(rep.content.array_records["rec"], "hist", 2, "f")  # undecodable or non-finite: rejected
            n = self.node_users[nid]
            if (
                h.shape != (k, cfg.bins)
                or not np.all(np.isfinite(h))
                or h.min() < 0
                or np.any(h != np.round(h))
                or np.any(h.sum(axis=1) != n)
            ):
                raise ValueError(f"histogram must be ({k}, {cfg.bins}) non-negative integer counts, {n} per candidate")
            return h

        for _, h in self.rounds.gather("query.rec_hist", self._content(candidates, cfg, {}), "rec_hist", decode):
            total += h
        return total

    def measure_eval(self, parts):
        return self.secure.measure("rec_eval", parts, RecordDict())

    def reports(self, state, candidates, lo, hi, cfg, secure: bool = False):
        def decode(nid, rep) -> tuple:
            arrays = rep.content.array_records["rec"]
            part = None if secure else {key: arrays[key].numpy() for key in arrays.keys() if key != "picks"}
            if secure and set(arrays.keys()) != {"picks"}:
                raise ValueError("a secure-mode report carries its picks only")
            return arrays["picks"].numpy(), json.loads(str(rep.content.config_records["meta"]["records"])), part

        for nid, (picks, records, part) in self.rounds.gather(
            "query.recommend", self._content(candidates, cfg, {"lo": lo, "hi": hi}), "recommend", decode
        ):
            yield nid, self.node_users[nid], picks, records, part

    def reject(self, key, reason: str) -> None:
        self.rounds.reject("recommend", key, reason)


def run_recommend_rounds(
    rounds,
    state,
    base_content: RecordDict,
    node_users: dict[int, int],
    cfg: recommend.RecommendConfig,
    ledger_seed: int | None,
    has_test: bool,
    secure=None,
    relation: str = ADD_REMOVE,
):
    """The recommendation rounds (:func:`fedpriv.engine.loop.recommend_rounds`) over the nodes of
    ``rounds``: returns (summary, recommendation ledger, {node: reports as candidate item ids}).
    ``ledger_seed``: None (OS randomness) unless the run asked for reproducible noise;
    ``relation``: the job's neighbouring relation (the recommendation ledger's)."""
    from ..engine.loop import recommend_rounds

    ledger = PrivacyLedger(seed=ledger_seed, relation=relation)
    summary, reports = recommend_rounds(
        _GridRecommendTransport(rounds, base_content, node_users, has_test, secure), state, cfg, ledger
    )
    return summary, ledger, reports
