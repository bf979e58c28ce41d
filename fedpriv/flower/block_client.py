"""Every block family on a Flower node (:class:`~fedpriv.algorithms.families.Family`): its
block of users (the family's files), the broadcast state, and two handlers (``query.block_info``
and ``query.block``, the round's kind in the message). Personal vectors and every other value of
a user stay here; only the family's clipped statistics leave the node. The family is looked up
in this node's own catalogue (the families its operator installed), never loaded from a message.
Imports no server code."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from ..algorithms.families import EVAL_KIND, Family, family_named
from . import codec


@lru_cache(maxsize=64)
def load_block(family: Family, folder: str, partition_id: int, users_per_node: int):
    """(users, block) of one node (cached per worker process, like the rating shards)."""
    return family.load_block(folder, partition_id, users_per_node)


def decode_block_state(content: RecordDict):
    """(family, state, kind, data folder, users per node, group) of a round's message."""
    cfg = content.config_records["cfg"]
    family = family_named(str(cfg["family"]))
    arrays = {k: v.numpy() for k, v in content.array_records["state"].items()}
    state = family.decode_state(arrays, dict(cfg))
    group = int(cfg.get("group", -1))
    return (
        family,
        state,
        str(cfg["kind"]),
        str(cfg["data_dir"]),
        int(cfg["users_per_node"]),
        (None if group < 0 else group),
    )


def _reply(msg: Message, arrays: dict, n_users: int) -> Message:
    rd = RecordDict(
        {
            "contrib": ArrayRecord({k: codec.to_array(np.asarray(v, np.float64)) for k, v in arrays.items()}),
            "meta": ConfigRecord({"n_users": int(n_users)}),
        }
    )
    return Message(rd, reply_to=msg)


def node_block(msg: Message, context: Context, with_keys: bool = False):
    """(family, state, kind, users, block, block keys, reproducible, group) of this node for the
    round of ``msg``: with a disjoint schedule only the users of the step's group (drawn by each
    user from its secret key); ``block keys``: the secret keys of the block's users, derived only
    when needed (a disjoint schedule, or ``with_keys``), else None."""
    from ..privacy.randomness import user_keys
    from .node_secrets import node_key, raw_user_ids

    family, state, kind, data_dir, upn, group = decode_block_state(msg.content)
    users, block = load_block(family, data_dir, int(context.node_config.get("partition-id", 0)), upn)
    keys, reproducible = None, False
    if with_keys or group is not None:
        key, reproducible = node_key(msg.content.config_records["cfg"], context)
        keys = user_keys(key, raw_user_ids(data_dir, users))
    if group is not None:  # disjoint schedule: only the users of this step's group contribute
        keep = family.user_groups(keys, state) == group
        users = users[keep]
        block = family.block(block, np.flatnonzero(keep))
    return family, state, kind, users, block, keys, reproducible, group


# ------------------------------------------------------------------ client handlers
def register_block_handlers(app) -> None:
    """Add the block families' handlers to fedpriv's ClientApp."""

    @app.query("block_info")
    def block_info(msg: Message, context: Context) -> Message:
        pid = int(context.node_config.get("partition-id", 0))
        return Message(RecordDict({"meta": ConfigRecord({"partition_id": pid})}), reply_to=msg)  # not data

    @app.query("block")
    def block_round(msg: Message, context: Context) -> Message:
        from .node_policy import node_policy, refuse

        if node_policy(context).aggregation == "secure":  # a plaintext handler
            raise refuse(
                f"plaintext handler {msg.metadata.message_type!r}",
                "this node is configured for secure aggregation (policy-aggregation=secure)",
            )
        family, state, kind, users, block, *_ = node_block(msg, context)
        if kind == EVAL_KIND:
            return _reply(msg, {"values": family.eval_sums(block, state)}, len(users))
        parts = family.reply_parts(kind, state)
        return _reply(msg, {p.name: v for p, v in zip(parts, family.client_round(kind, block, state))}, len(users))
