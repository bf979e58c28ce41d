"""DP model personalization on a Flower node: its block of users' samples (memory-mapped
files), the broadcast state, and the handlers (``query.pam_*``). The personal vectors v_j are
solved and kept here; only clipped statistics leave the node. Imports no server code."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from ..algorithms import pam
from . import codec
from .partition import node_users


@lru_cache(maxsize=4)
def _mapped(folder: str):
    f = Path(folder)
    return (
        np.load(f / "pam_X.npy", mmap_mode="r"),
        np.load(f / "pam_y.npy", mmap_mode="r"),
        np.load(f / "pam_V_star.npy", mmap_mode="r"),
        np.load(f / "pam_U_star.npy"),
        json.loads((f / "pam_meta.json").read_text()),
    )


@lru_cache(maxsize=64)
def load_block(folder: str, partition_id: int, users_per_node: int):
    """The block of one node (cached per worker process, like the rating shards): its users and
    their samples, ground truth and the data's metadata, read-only."""
    X, y, V, U, meta = _mapped(folder)
    users = node_users(partition_id, users_per_node, meta["n_users"])
    block = (users, np.asarray(X[users]), np.asarray(y[users]), np.asarray(V[users]))
    for a in block:
        a.setflags(write=False)
    return (*block, U, meta)


# ------------------------------------------------------------------ messages
def decode_pam_state(content: RecordDict):
    cfg = content.config_records["cfg"]
    arrays = content.array_records["state"]
    state = pam.PAMState(
        str(cfg["algorithm"]),
        pam.PAMConfig.from_overrides(json.loads(str(cfg["config"]))),
        int(cfg["d"]),
        int(cfg["k"]),
        int(cfg["samples"]),
        {},
    )
    state.U = arrays["U"].numpy() if "U" in arrays else None
    state.theta = arrays["theta"].numpy() if "theta" in arrays else None
    group = int(cfg.get("group", -1))
    return state, str(cfg["data_dir"]), int(cfg["users_per_node"]), None if group < 0 else group


def _reply(msg: Message, arrays: dict, n_users: int) -> Message:
    rd = RecordDict(
        {
            "contrib": ArrayRecord({k: codec.to_array(np.asarray(v, np.float64)) for k, v in arrays.items()}),
            "meta": ConfigRecord({"n_users": int(n_users)}),
        }
    )
    return Message(rd, reply_to=msg)


def node_block(msg: Message, context: Context, with_keys: bool = False):
    """(state, users, X, y, V, U, meta, block keys, reproducible) of this node for the round of
    ``msg``: with the disjoint schedule, only the users of the step's group (drawn by each user
    from its secret key); ``block keys``: the secret keys of all the block's users, derived only
    when needed (the disjoint schedule, or ``with_keys``), else None."""
    from ..privacy.randomness import user_keys
    from .node_secrets import node_key, raw_user_ids

    state, data_dir, upn, group = decode_pam_state(msg.content)
    users, X, y, V, U, meta = load_block(data_dir, int(context.node_config.get("partition-id", 0)), upn)
    keys, reproducible = None, False
    if with_keys or group is not None:
        key, reproducible = node_key(msg.content.config_records["cfg"], context)
        keys = user_keys(key, raw_user_ids(data_dir, users))
    if group is not None:  # disjoint schedule: only the users of this step's group contribute
        keep = pam.user_groups(keys, state.config.epochs) == group
        users, X, y, V = users[keep], X[keep], y[keep], V[keep]
    return state, users, X, y, V, U, meta, keys, reproducible


# ------------------------------------------------------------------ client handlers
def register_pam_handlers(app) -> None:
    """Add the personalization handlers to fedpriv's ClientApp."""

    def pid(context: Context) -> int:
        return int(context.node_config.get("partition-id", 0))

    def block(msg: Message, context: Context):
        from .node_policy import node_policy, refuse

        if node_policy(context).aggregation == "secure":  # every caller of block() is a plaintext handler
            raise refuse(
                f"plaintext handler {msg.metadata.message_type!r}",
                "this node is configured for secure aggregation (policy-aggregation=secure)",
            )
        return node_block(msg, context)[:7]

    @app.query("pam_info")
    def pam_info(msg: Message, context: Context) -> Message:
        return Message(
            RecordDict({"meta": ConfigRecord({"partition_id": pid(context)})}), reply_to=msg
        )  # configuration, not data

    @app.query("pam_init")
    def pam_init(msg: Message, context: Context) -> Message:
        state, users, X, y, *_ = block(msg, context)
        return _reply(msg, {"values": pam.client_init_stats(X, y, state)}, len(users))

    @app.query("pam_step")
    def pam_step(msg: Message, context: Context) -> Message:
        state, users, X, y, *_ = block(msg, context)
        A, b = pam.client_step_stats(X, y, state)
        return _reply(msg, {"A_upper": A, "b": b}, len(users))

    @app.query("pam_exp")
    def pam_exp(msg: Message, context: Context) -> Message:
        state, users, X, y, *_ = block(msg, context)
        return _reply(msg, {"scores": pam.client_exp_scores(X, y, state)}, len(users))

    @app.query("pam_eval")
    def pam_eval(msg: Message, context: Context) -> Message:
        state, users, X, y, V, U, meta = block(msg, context)
        return _reply(msg, {"values": pam.client_eval_sums(X, y, V, U, state, meta["noise"])}, len(users))


# ------------------------------------------------------------------ server loop
