"""Node side of secure aggregation (``aggregation = "secure"``): the SecAgg+ rounds of
:mod:`fedpriv.privacy.secagg` over Flower messages, with the node's noise share added before
masking (:mod:`fedpriv.algorithms.secure`, :mod:`fedpriv.privacy.distributed`).

The node's secure-summation state (its channel key, each open release's mask key, self-mask
seed and the shares it holds) lives in its own ``context.state`` between messages: a SuperNode
runs every message in a fresh ClientApp process, and ``context.state`` never leaves the node.

Messages (all ``query``): ``secagg_keys`` (advertise the channel key, once per run),
``secagg_share`` (fresh mask key and self-mask seed, shared with the neighbours),
``secagg_mask`` (the node's words: clipped sums, quantized, plus its noise share, masked),
``secagg_consistency`` (authenticated nodes: a signature over the survivor set shown),
``secagg_unmask`` (shares of the survivors' self-mask seeds and the dropped nodes' mask keys).

A node with a signing identity (:mod:`fedpriv.flower.node_identity`, from its own configuration)
signs its channel key, encrypts shares only to roster-signed neighbour keys and unmasks only a
view that the threshold of its share holders signed (:mod:`fedpriv.privacy.secagg_auth`).

Before it draws its noise share, a node checks the round's plan against its own policy
(:func:`fedpriv.flower.node_policy.check_plan`): the sensitivity its own clipping gives, each
part's scale against the public rule, its noise floor under its own contributor and colluder
assumptions, its budget (the node ledger, on its disk where its policy names one) and its number
of noised sums. It counts its peers itself: a share round with fewer members than its policy's
``min_contributors`` (with an identity: fewer distinct roster-signed members) and an unmask
request with fewer survivors are refused. Its masked words are bound to a digest of everything
they depend on (:func:`content_digest`: the plan, the broadcast state or model, the candidates);
an authenticated node with a floor reveals only when every survivor signed that same digest.
Measurement sums are counted per run. A refusal gets an error reply naming its defence.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from ..algorithms import als, secure
from ..errors import PrivacyError
from ..privacy.randomness import node_noise_rng
from . import codec
from .node_eval import node_eval
from .node_policy import check_measurement, check_plan, node_policy
from .node_secrets import with_keys
from .partition import data_dir_of, load_shard, node_feature_table

if TYPE_CHECKING:
    from ..privacy.secagg import SecAggNode, SecAggParams

STATE_KEY = "fedpriv-secagg"
log = logging.getLogger("fedpriv.flower")


def _node(context: Context, node_id: int, identity=None) -> SecAggNode:
    from ..privacy.secagg import SecAggNode  # secure rounds only

    rec = context.state.config_records.get(STATE_KEY)
    if rec is None or "blob" not in rec:
        return SecAggNode(node_id, identity)
    return SecAggNode.restore(node_id, bytes(rec["blob"]), identity)


def _save(context: Context, node: SecAggNode) -> None:
    context.state[STATE_KEY] = ConfigRecord({"blob": node.export_state()})


def _ids(rec) -> dict[int, bytes]:
    return {int(k): bytes(v) for k, v in rec.items()}


def _by_id(d: dict[int, bytes]) -> ConfigRecord:
    return ConfigRecord({str(k): v for k, v in d.items()})


def _release(cfg) -> tuple[bytes, SecAggParams]:
    from ..privacy.secagg import SecAggParams

    return str(cfg["label"]).encode(), SecAggParams(int(cfg["bits"]), int(cfg["degree"]), int(cfg["threshold"]))


def _run_context(context: Context, job_label: str) -> bytes:
    """The run a node's channel key belongs to, as bound into its signatures: the run id from the
    node's own context (assigned by the SuperLink) and the job label of the keys round."""
    return f"flower-run={int(context.run_id)};job={job_label}".encode()


def _refused(what: str, context: Context, exc: Exception) -> None:
    log.error("node %s refused %s: %s", context.node_id, what, exc)


def keys(msg: Message, context: Context) -> Message:
    """Advertise this node's channel public key (a fresh node state for the run); a node with a
    signing identity (:mod:`fedpriv.flower.node_identity`) signs it, bound to its roster name,
    its node id and the run."""
    from ..privacy.secagg import SecAggNode  # secure rounds only
    from .node_identity import node_identity

    identity = node_identity(context)
    job = str(msg.content.config_records["secagg"]["run"]) if "secagg" in msg.content.config_records else ""
    node = SecAggNode(context.node_id, identity, _run_context(context, job))
    _save(context, node)
    if identity is None:
        return Message(RecordDict({"secagg": ConfigRecord({"channel_key": node.channel_key()})}), reply_to=msg)
    key, name, signature = node.advertisement()
    return Message(
        RecordDict({"secagg": ConfigRecord({"channel_key": key, "name": name, "signature": signature})}), reply_to=msg
    )


def _adverts(content) -> dict[int, tuple[str, bytes]] | None:
    recs = content.config_records
    if "channel_names" not in recs or "channel_sigs" not in recs:
        return None
    sigs = recs["channel_sigs"]
    return {int(k): (str(v), bytes(sigs[k])) for k, v in recs["channel_names"].items() if k in sigs}


def _graph(content, sec):
    if "graph" not in content.array_records or "graph_seed" not in sec:
        return None
    members = np.asarray(content.array_records["graph"]["members"].numpy(), dtype=np.uint64)
    return [int(v) for v in members], bytes(sec["graph_seed"])


PER_NODE = ("mask_keys", "ciphertexts")  # the records of a mask message that differ from node to node


def content_digest(content: RecordDict, skip: tuple[str, ...] = PER_NODE) -> bytes:
    """SHA-256 of everything in ``content`` but its per-node records ``skip``: the plan, the
    broadcast state or model, the candidates or buckets, in a canonical order (record names and
    keys sorted; arrays by dtype, shape and bytes; config values by type and value)."""
    h = hashlib.sha256(b"fedpriv mask content v1")

    def put(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "big") + data)

    for group, kind in ((content.array_records, b"A"), (content.config_records, b"C"), (content.metric_records, b"M")):
        for name in sorted(group):
            if name in skip:
                continue
            put(kind + name.encode())
            rec = group[name]
            for key in sorted(rec):
                v = rec[key]
                put(key.encode())
                if kind == b"A":
                    put(f"{v.dtype}:{tuple(v.shape)}".encode())
                    put(bytes(v.data))
                else:
                    put(
                        f"{type(v).__name__}:".encode()
                        + (bytes(v) if isinstance(v, (bytes, bytearray)) else repr(v).encode())
                    )
    return h.digest()


def share(msg: Message, context: Context) -> Message:
    """A fresh mask key and self-mask seed for this release, Shamir-shared with the neighbours.
    An authenticated node first checks every neighbour's key against its roster and the
    neighbours against the public graph; every node checks the Shamir threshold against the
    colluders of its own policy (``2t > degree + 1 + colluders``); it refuses (an error reply,
    logged) otherwise."""
    from .node_identity import node_identity

    node = _node(context, context.node_id, node_identity(context))
    sec = msg.content.config_records["secagg"]
    label, params = _release(sec)
    policy = node_policy(context)
    colluders = policy.colluders or 0  # the node's own assumptions, never the message's
    members = _ids(msg.content.config_records["member_keys"]) if "member_keys" in msg.content.config_records else None
    try:
        mask_key, ciphertexts = node.share(
            label,
            params,
            _ids(msg.content.config_records["channel_keys"]),
            adverts=_adverts(msg.content),
            graph=_graph(msg.content, sec),
            colluders=colluders,
            min_contributors=policy.min_contributors,
            member_keys=members,
        )
    except PrivacyError as exc:
        _refused(f"share of release {label!r}", context, exc)
        raise
    _save(context, node)
    return Message(
        RecordDict({"secagg": ConfigRecord({"mask_key": mask_key}), "ciphertexts": _by_id(ciphertexts)}), reply_to=msg
    )


MEASUREMENTS = ("eval", "block_eval", "rec_eval")  # kinds summed exactly (no noise): aggregate measurements only


def _plan(sec, kind: str):
    """The round's plan; an exact (noiseless) sum is accepted for the measurement kinds only, so
    a server cannot ask for a model statistic without its noise share."""
    from ..privacy.distributed import ExactPlan, plan_from_dict

    plan = plan_from_dict(json.loads(str(sec["plan"])))
    if isinstance(plan, ExactPlan) != (kind in MEASUREMENTS):
        raise PrivacyError(
            f"secure round {kind!r}: refused a plan "
            f"{'without' if isinstance(plan, ExactPlan) else 'with'} noise for this kind"
        )
    return plan


def mask(msg: Message, context: Context) -> Message:
    """The node's masked words for the round: its clipped sums (the algorithm's declared parts),
    scaled, rounded, plus its Skellam noise share, plus its masks, mod 2^bits; or, for a
    measurement (evaluation sums), its sums in fixed point, masked."""
    content = msg.content
    sec = content.config_records["secagg"]
    kind, step = str(sec["kind"]), int(sec["step"])
    plan = _plan(sec, kind)
    if kind in MEASUREMENTS:
        check_measurement(context, kind)  # counted per run, before any sum is computed
    if "family" in content.config_records.get("cfg", {}):  # a block family: the node's block of users
        return _mask_block(msg, context, kind, step, plan)
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
        own = [
            (recommend.HIST_RELEASE, len(candidates) * rec_cfg.bins, float(np.sqrt(len(candidates))))
        ]  # one count per candidate and user
    else:
        table = (
            node_feature_table(context.node_config, data_dir, state.config)
            if kind == "step" and state.spec.clients_need_encoder
            else None
        )
        values = secure.node_values(kind, shard, state, step, table)
        own = [
            (p.name, p.length, als.sensitivity(p.name, state.config, state.rating_range))
            for p in secure.declared(kind, state)
        ]  # this node's own clipping bound
    check_plan(context, kind, plan, own)  # the node's own floor and budget, before its noise share is drawn
    words = secure.node_words(plan, values, secure.node_rng(shard, secure.label(kind, step), reproducible))
    return masked_reply(msg, context, words)


def _mask_block(msg: Message, context: Context, kind: str, step: int, plan) -> Message:
    """A block family's masked words (:mod:`fedpriv.flower.block_client`): its evaluation sums
    (a measurement), or its clipped statistics plus this node's noise share."""
    from ..algorithms.families import block_values
    from ..privacy.distributed import encode
    from .block_client import node_block

    family, state, _, users, block, keys, reproducible, group = node_block(msg, context, with_keys=True)
    if kind in MEASUREMENTS:
        return masked_reply(msg, context, plan.encode({"values": family.eval_sums(block, state)}))
    values = block_values(family, kind, block, state)
    # this node's own clipping bound; a disjoint schedule: only this group's users contribute
    own = family.part_bounds(kind, state)
    check_plan(context, kind, plan, own, None if group is None else (family.rounds.groups(state), group))
    words = encode(plan, values, node_noise_rng(keys, f"{kind}-{step}", reproducible))
    return masked_reply(msg, context, words)


def masked_reply(msg: Message, context: Context, words: np.ndarray) -> Message:
    """Mask this node's words for the round of ``msg`` (with the shares and neighbours' keys the
    message carries), keep the node's state, and reply with the masked words only: no count or
    other value of the node's in plaintext, and a size fixed by the public plan."""
    content = msg.content
    node = _node(context, context.node_id)
    label, _ = _release(content.config_records["secagg"])
    y = node.mask(
        label,
        words,
        _ids(content.config_records["mask_keys"]),
        _ids(content.config_records["ciphertexts"]),
        bound=content_digest(content),
    )
    _save(context, node)
    return Message(RecordDict({"masked": ArrayRecord({"y": codec.to_array(y)})}), reply_to=msg)


def _lists(content) -> tuple[list[int], list[int]]:
    lists = content.array_records["lists"]
    return (
        [int(v) for v in np.asarray(lists["survivors"].numpy(), dtype=np.uint64)],
        [int(v) for v in np.asarray(lists["dropped"].numpy(), dtype=np.uint64)],
    )


def consistency(msg: Message, context: Context) -> Message:
    """The consistency round (authenticated nodes): the node's signature over the survivors and
    dropped nodes it is shown for the release (with the graph of its share round)."""
    from .node_identity import node_identity

    node = _node(context, context.node_id, node_identity(context))
    label, _ = _release(msg.content.config_records["secagg"])
    survivors, dropped = _lists(msg.content)
    try:
        signature = node.consistency(label, survivors, dropped)
    except PrivacyError as exc:
        _refused(f"the consistency round of release {label!r}", context, exc)
        raise
    _save(context, node)
    return Message(RecordDict({"secagg": ConfigRecord({"signature": signature})}), reply_to=msg)


def unmask(msg: Message, context: Context) -> Message:
    """Shares for the server to unmask the sum: refused (an error reply) if it asks for both
    shares of one node, or, on an authenticated node, unless the threshold of its share holders
    signed the view it signed in the consistency round (the signatures the message carries)."""
    from .node_identity import node_identity

    node = _node(context, context.node_id, node_identity(context))
    sec = msg.content.config_records["secagg"]
    label, _ = _release(sec)
    survivors, dropped = _lists(msg.content)
    sigs = msg.content.config_records.get("signatures")
    signatures = None if sigs is None else {int(k): bytes(v) for k, v in sigs.items()}
    try:
        reply = node.unmask(label, survivors, dropped, signatures)
    except PrivacyError as exc:
        _refused(f"to unmask release {label!r}", context, exc)
        raise
    node.forget(label)
    _save(context, node)
    return Message(RecordDict({"self": _by_id(reply["self"]), "pairwise": _by_id(reply["pairwise"])}), reply_to=msg)


def register_secure_handlers(app) -> None:
    """The secure-aggregation handlers on ``app``."""
    from .node_device import on_node_device

    for name, handler in (
        ("secagg_keys", keys),
        ("secagg_share", share),
        ("secagg_mask", on_node_device(mask)),
        ("secagg_consistency", consistency),
        ("secagg_unmask", unmask),
    ):
        app.query(name)(handler)
