"""Node side of secure aggregation (``aggregation = "secure"``): the SecAgg+ rounds of
:mod:`fedpriv.privacy.secagg` over Flower messages, with the node's noise share added before
masking (:mod:`fedpriv.algorithms.secure`, :mod:`fedpriv.privacy.distributed`).

The node's secure-summation state (its channel key, each open release's mask key, self-mask
seed and the shares it holds) lives in its own ``context.state`` between messages: a SuperNode
runs every message in a fresh ClientApp process, and ``context.state`` never leaves the node.

Messages (all ``query``): ``secagg_keys`` (advertise the channel key, once per run),
``secagg_share`` (fresh mask key and self-mask seed, shared with the neighbours),
``secagg_mask`` (the node's words: clipped sums, quantized, plus its noise share, masked),
``secagg_unmask`` (shares of the survivors' self-mask seeds and the dropped nodes' mask keys).

Before it draws its noise share, a node checks the round's plan against its own policy
(:func:`fedpriv.flower.node_policy.check_plan`): the sensitivity its own clipping gives, its noise
floor under its own contributor and colluder assumptions, its per-run budget (node ledger in
``context.state``) and its number of noised sums. A refused plan gets an error reply.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from ..algorithms import als, secure
from ..errors import PrivacyError
from ..privacy.randomness import node_noise_rng
from . import codec
from .node_eval import node_eval
from .node_policy import check_plan
from .node_secrets import with_keys
from .partition import data_dir_of, load_shard, node_feature_table

if TYPE_CHECKING:
    from ..privacy.secagg import SecAggNode, SecAggParams

STATE_KEY = "fedpriv-secagg"


def _node(context: Context, node_id: int) -> SecAggNode:
    from ..privacy.secagg import SecAggNode  # secure rounds only

    rec = context.state.config_records.get(STATE_KEY)
    if rec is None or "blob" not in rec:
        return SecAggNode(node_id)
    return SecAggNode.restore(node_id, bytes(rec["blob"]))


def _save(context: Context, node: SecAggNode) -> None:
    context.state[STATE_KEY] = ConfigRecord({"blob": node.export_state()})


def _ids(rec) -> dict[int, bytes]:
    return {int(k): bytes(v) for k, v in rec.items()}


def _by_id(d: dict[int, bytes]) -> ConfigRecord:
    return ConfigRecord({str(k): v for k, v in d.items()})


def _release(cfg) -> tuple[bytes, SecAggParams]:
    from ..privacy.secagg import SecAggParams

    return str(cfg["label"]).encode(), SecAggParams(int(cfg["bits"]), int(cfg["degree"]), int(cfg["threshold"]))


def keys(msg: Message, context: Context) -> Message:
    """Advertise this node's channel public key (a fresh node state for the run)."""
    from ..privacy.secagg import SecAggNode  # secure rounds only

    node = SecAggNode(context.node_id)
    _save(context, node)
    return Message(RecordDict({"secagg": ConfigRecord({"channel_key": node.channel_key()})}), reply_to=msg)


def share(msg: Message, context: Context) -> Message:
    """A fresh mask key and self-mask seed for this release, Shamir-shared with the neighbours."""
    node = _node(context, context.node_id)
    label, params = _release(msg.content.config_records["secagg"])
    mask_key, ciphertexts = node.share(label, params, _ids(msg.content.config_records["channel_keys"]))
    _save(context, node)
    return Message(RecordDict({"secagg": ConfigRecord({"mask_key": mask_key}), "ciphertexts": _by_id(ciphertexts)}), reply_to=msg)


MEASUREMENTS = ("eval", "pam_eval", "rec_eval")  # kinds summed exactly (no noise): aggregate measurements only


def _plan(sec, kind: str):
    """The round's plan; an exact (noiseless) sum is accepted for the measurement kinds only, so
    a server cannot ask for a model statistic without its noise share."""
    from ..privacy.distributed import ExactPlan, plan_from_dict

    plan = plan_from_dict(json.loads(str(sec["plan"])))
    if isinstance(plan, ExactPlan) != (kind in MEASUREMENTS):
        raise PrivacyError(f"secure round {kind!r}: refused a plan {'without' if isinstance(plan, ExactPlan) else 'with'} noise for this kind")
    return plan


def mask(msg: Message, context: Context) -> Message:
    """The node's masked words for the round: its clipped sums (the algorithm's declared parts),
    scaled, rounded, plus its Skellam noise share, plus its masks, mod 2^bits; or, for a
    measurement (evaluation sums), its sums in fixed point, masked."""
    content = msg.content
    sec = content.config_records["secagg"]
    kind, step = str(sec["kind"]), int(sec["step"])
    plan = _plan(sec, kind)
    if kind.startswith("pam_"):  # DP model personalization: the node's block of users
        return _mask_pam(msg, context, kind, step, plan)
    if kind == "eval":
        return masked_reply(msg, context, plan.encode(node_eval(msg, context)))
    if kind == "rec_eval":  # kept on the node by its recommendation reply
        from .recommend_handlers import pop_eval_sums

        return masked_reply(msg, context, plan.encode(pop_eval_sums(context, plan)))
    state, data_dir, upn = codec.decode_state(content)
    folder = data_dir_of(context.node_config, data_dir)
    shard = load_shard(folder, "train", int(context.node_config.get("partition-id", 0)), upn)
    shard, reproducible = with_keys(shard, folder, content.config_records["cfg"], context)
    if kind == "rec_hist":  # the recommendation's score histogram
        from .recommend_handlers import _cfg_of
        from ..algorithms import recommend

        rec_cfg, _ = _cfg_of(content)
        candidates = content.array_records["rec"]["candidates"].numpy().astype("int64")
        values = secure.node_histogram(shard, state, candidates, rec_cfg)
        own = [(recommend.HIST_RELEASE, len(candidates) * rec_cfg.bins, float(np.sqrt(len(candidates))))]  # one count per candidate and user
    else:
        table = node_feature_table(context.node_config, data_dir, state.config) if kind == "step" and state.spec.clients_need_encoder else None
        values = secure.node_values(kind, shard, state, step, table)
        own = [(p.name, p.length, als.sensitivity(p.name, state.config, state.rating_range)) for p in secure.declared(kind, state)]  # this node's own clipping bound
    check_plan(context, kind, plan, own)  # the node's own floor and budget, before its noise share is drawn
    words = secure.node_words(plan, values, secure.node_rng(shard, secure.label(kind, step), reproducible))
    return masked_reply(msg, context, words)


def _mask_pam(msg: Message, context: Context, kind: str, step: int, plan) -> Message:
    from ..algorithms import pam
    from ..privacy.distributed import encode
    from .pam_client import decode_pam_state, node_block

    state, users, X, y, V, U, meta, keys, reproducible = node_block(msg, context, with_keys=True)
    if kind == "pam_eval":
        return masked_reply(msg, context, plan.encode({"values": pam.client_eval_sums(X, y, V, U, state, meta["noise"])}))
    values = pam.pam_node_values(kind, X, y, state)
    group = decode_pam_state(msg.content)[3]  # disjoint schedule: only this group's users contribute (parallel composition)
    own = [(n, k, pam.pam_sensitivity(n, state)) for n, k in pam.summed_parts(kind, state)]  # this node's own clipping bound
    check_plan(context, kind, plan, own, None if group is None else (state.config.epochs, group))
    words = encode(plan, values, node_noise_rng(keys, f"{kind}-{step}", reproducible))
    return masked_reply(msg, context, words)


def masked_reply(msg: Message, context: Context, words: np.ndarray) -> Message:
    """Mask this node's words for the round of ``msg`` (with the shares and neighbours' keys the
    message carries), keep the node's state, and reply with the masked words only: no count or
    other value of the node's in plaintext, and a size fixed by the public plan."""
    content = msg.content
    node = _node(context, context.node_id)
    label, _ = _release(content.config_records["secagg"])
    y = node.mask(label, words, _ids(content.config_records["mask_keys"]), _ids(content.config_records["ciphertexts"]))
    _save(context, node)
    return Message(RecordDict({"masked": ArrayRecord({"y": codec.to_array(y)})}), reply_to=msg)


def unmask(msg: Message, context: Context) -> Message:
    """Shares for the server to unmask the sum: refused (an error reply) if it asks for both
    shares of one node."""
    node = _node(context, context.node_id)
    sec = msg.content.config_records["secagg"]
    label, _ = _release(sec)
    survivors = [int(v) for v in np.asarray(msg.content.array_records["lists"]["survivors"].numpy(), dtype=np.uint64)]
    dropped = [int(v) for v in np.asarray(msg.content.array_records["lists"]["dropped"].numpy(), dtype=np.uint64)]
    reply = node.unmask(label, survivors, dropped)
    node.forget(label)
    _save(context, node)
    return Message(RecordDict({"self": _by_id(reply["self"]), "pairwise": _by_id(reply["pairwise"])}), reply_to=msg)


def register_secure_handlers(app) -> None:
    """The secure-aggregation handlers on ``app``."""
    for name, handler in (("secagg_keys", keys), ("secagg_share", share), ("secagg_mask", mask), ("secagg_unmask", unmask)):
        app.query(name)(handler)
