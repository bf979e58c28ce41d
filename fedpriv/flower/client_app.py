"""The fedpriv ClientApp: one node holds one user or a shard of users (``partition-id`` in the
node config, ``users_per_node`` from the server). Handlers are thin wrappers of the client
functions of :mod:`fedpriv.algorithms.als`; nothing but clipped contributions and evaluation
sums leaves the node."""

from __future__ import annotations

import os

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from ..algorithms import evaluation
from ..errors import ConfigError
from ..algorithms import als, protocol
from . import codec
from .block_client import register_block_handlers
from .recommend_handlers import register_recommend_handlers
from .secure_client import register_secure_handlers
from .node_device import on_node_device
from .node_eval import node_eval
from .node_policy import node_policy, plaintext, refuse
from .node_secrets import with_keys
from .partition import data_dir_of, load_shard, node_feature_table


def _partition_id(context: Context) -> int:
    return int(context.node_config.get("partition-id", 0))


def _shard(msg: Message, context: Context, part: str = "train"):
    state, data_dir, upn = codec.decode_state(msg.content)
    return state, load_shard(data_dir_of(context.node_config, data_dir), part, _partition_id(context), upn)


def info(msg: Message, context: Context) -> Message:
    """The node's partition id and how its operator configured it: its policy mode
    (``policy_mode``: its ``policy-aggregation``, ``"invalid"`` for a policy that does not
    parse), whether it keeps an on-disk ledger (``policy_ledger``) and whether it has a signing
    identity (``identity``), and the run token of the launcher that started it (``run_token``:
    its FEDPRIV_RUN_TOKEN; no key when unset). Configuration, not data (no count of users or ratings); the
    ServerApp refuses to start a secure job on nodes not configured for it."""
    from .node_identity import identity_folder

    try:
        policy = node_policy(context)
        mode, ledger = policy.aggregation, policy.ledger is not None
    except ConfigError:  # the node's other handlers refuse with the reason; here its mode is unusable
        mode, ledger = "invalid", False
    meta = {
        "partition_id": _partition_id(context),
        "policy_mode": mode,
        "policy_ledger": ledger,
        "identity": identity_folder(getattr(context, "node_config", None)) is not None,
    }
    # the launcher's token (scripts/run.sh exports it to the `flwr run` it starts, whose simulated
    # nodes inherit it): the ServerApp checks that it runs on its own nodes. Sent only when set
    # (the server reads a missing key as "": no token), so a node without one answers as before
    token = os.environ.get("FEDPRIV_RUN_TOKEN", "")
    if token:
        meta["run_token"] = token
    return Message(RecordDict({"meta": ConfigRecord(meta)}), reply_to=msg)


def _pre_release(kind: str):
    """The handler of one pre-processing release ('users', 'mean' or 'counts')."""

    def handler(msg: Message, context: Context) -> Message:
        state, shard = _shard(msg, context)
        return Message(codec.encode_vector(als.client_vector(kind, shard, state), shard.n_users), reply_to=msg)

    handler.__name__ = kind
    return handler


def node_train(msg: Message, context: Context) -> Message:
    """Local user update, then the shard's clipped contribution: weighted per-item statistics
    (ALS family, AM-SSP), logistic statistics (AM-SSP-convex) or the sampled users' clipped
    gradients (DP-SGD, AM-DPSGD)."""
    state, data_dir, upn = codec.decode_state(msg.content)
    folder = data_dir_of(context.node_config, data_dir)
    shard = load_shard(folder, "train", _partition_id(context), upn)
    shard, _ = with_keys(shard, folder, msg.content.config_records["cfg"], context)  # the users' own randomness
    table = (
        node_feature_table(context.node_config, data_dir, state.config)
        if protocol.clients_need_encoder(state.algorithm)
        else None
    )  # public features
    contribution = protocol.client_step(shard, state, codec.round_of(msg.content), table)
    return Message(codec.encode_contribution(contribution, state, shard.n_users), reply_to=msg)


def node_evaluate(msg: Message, context: Context) -> Message:
    """Per-bucket squared errors (or log-loss) on the node's validation and test ratings, in
    plaintext: central mode only (secure mode sums them with ``secagg_mask``, kind ``eval``)."""
    sums = node_eval(msg, context)
    return Message(RecordDict({"eval": ArrayRecord({k: codec.to_array(v) for k, v in sums.items()})}), reply_to=msg)


def tune_score(msg: Message, context: Context) -> Message:
    """Private tuning (central mode): the sum over the node's users of min(own validation MSE,
    clip), users solved locally from their training ratings; the server adds the noise. The
    mode is the node's own (its policy), not the message's."""
    if node_policy(context).aggregation == "secure":  # secure mode: nothing of one node in plaintext
        raise refuse(
            "plaintext handler 'tune_score'",
            "this node is configured for secure aggregation (policy-aggregation=secure)",
        )
    state, data_dir, upn = codec.decode_state(msg.content)
    if state.config.aggregation.mode != "central":
        raise PermissionError("a node in secure mode sends no plaintext tuning score")
    folder = data_dir_of(context.node_config, data_dir)
    history, valid = (load_shard(folder, part, _partition_id(context), upn) for part in ("train", "valid"))
    clip = float(msg.content.config_records["tune"]["clip"])
    return Message(
        codec.encode_vector(evaluation.shard_clipped_score_sum(state, history, valid, clip), history.n_users),
        reply_to=msg,
    )


def register_handlers(app) -> None:
    """Every handler of a fedpriv node on ``app``: a ClientApp, or anything with its ``query``,
    ``train`` and ``evaluate`` decorators (the fault injector wraps each handler this way)."""
    app.query("info")(info)
    app.query("tune_score")(tune_score)
    for kind in als.PRE_RELEASES:
        app.query(kind)(plaintext(_pre_release(kind)))  # plaintext handlers: refused by a node whose policy is secure
    app.train()(plaintext(on_node_device(node_train), "train"))  # the node's own device (fedpriv.flower.node_device)
    app.evaluate()(plaintext(node_evaluate, "evaluate"))
    register_block_handlers(app)  # the block families: DP model personalization, ... (fedpriv.flower.block_client)
    register_recommend_handlers(app)  # private recommendation (fedpriv.flower.recommend_handlers)
    register_secure_handlers(app)  # secure aggregation rounds (fedpriv.flower.secure_client)


app = ClientApp()
register_handlers(app)
