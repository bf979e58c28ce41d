"""The fedpriv ClientApp: one node holds one user or a shard of users (``partition-id`` in the
node config, ``users_per_node`` from the server). Handlers are thin wrappers of the client
functions of :mod:`fedpriv.algorithms.als`; nothing but clipped contributions and evaluation
sums leaves the node."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from .. import evaluation
from ..algorithms import als, protocol
from . import codec
from .pam_client import register as register_pam_handlers
from .recommend_handlers import register as register_recommend_handlers
from .secure_client import register as register_secure_handlers
from .node_secrets import with_keys
from .partition import data_dir_of, load_shard, node_feature_table


def _partition_id(context: Context) -> int:
    return int(context.node_config.get("partition-id", 0))


def _shard(msg: Message, context: Context, part: str = "train"):
    state, data_dir, upn = codec.decode_state(msg.content)
    return state, load_shard(data_dir_of(context.node_config, data_dir), part, _partition_id(context), upn)


def info(msg: Message, context: Context) -> Message:
    state, shard = _shard(msg, context)
    meta = ConfigRecord({"partition_id": _partition_id(context), "n_users": shard.n_users, "n_ratings": shard.n_ratings})
    return Message(RecordDict({"meta": meta}), reply_to=msg)


def _pre_release(kind: str):
    """The handler of one pre-processing release ('users', 'mean' or 'counts')."""

    def handler(msg: Message, context: Context) -> Message:
        state, shard = _shard(msg, context)
        return Message(codec.encode_vector(als.client_vector(kind, shard, state), shard.n_users), reply_to=msg)

    handler.__name__ = kind
    return handler


def train(msg: Message, context: Context) -> Message:
    """Local user update, then the shard's clipped contribution: weighted per-item statistics
    (ALS family, AM-SSP), logistic statistics (AM-SSP-convex) or the sampled users' clipped
    gradients (DP-SGD, AM-DPSGD)."""
    state, data_dir, upn = codec.decode_state(msg.content)
    folder = data_dir_of(context.node_config, data_dir)
    shard = load_shard(folder, "train", _partition_id(context), upn)
    shard, _ = with_keys(shard, folder, msg.content.config_records["cfg"], context)  # the users' own randomness
    table = node_feature_table(context.node_config, data_dir, state.config) if protocol.clients_need_encoder(state.algorithm) else None  # public features
    contribution = protocol.client_step(shard, state, codec.round_of(msg.content), table)
    return Message(codec.encode_contribution(contribution, state, shard.n_users), reply_to=msg)


def evaluate(msg: Message, context: Context) -> Message:
    """Per-bucket squared errors on the node's validation and test ratings."""
    state, data_dir, upn = codec.decode_state(msg.content)
    data_dir = data_dir_of(context.node_config, data_dir)
    pid = _partition_id(context)
    item_bucket = msg.content.array_records["eval"]["item_bucket"].numpy()
    history = load_shard(data_dir, "train", pid, upn)
    out = {}
    if protocol.is_logistic(state.algorithm):
        for part in ("valid", "test"):
            sums = evaluation.shard_logistic_sums(state, history, load_shard(data_dir, part, pid, upn), item_bucket)
            out.update({f"{part}_{k}": codec._arr(v) for k, v in sums.items()})  # noqa: SLF001
        return Message(RecordDict({"eval": ArrayRecord(out)}), reply_to=msg)
    for part in ("valid", "test"):
        sse, cnt = evaluation.shard_squared_errors(state, history, load_shard(data_dir, part, pid, upn), item_bucket)
        out[f"{part}_sse"] = codec._arr(sse)  # noqa: SLF001
        out[f"{part}_n"] = codec._arr(cnt)  # noqa: SLF001
    return Message(RecordDict({"eval": ArrayRecord(out)}), reply_to=msg)


def register_handlers(app) -> None:
    """Every handler of a fedpriv node on ``app``: a ClientApp, or anything with its ``query``,
    ``train`` and ``evaluate`` decorators (the fault injector wraps each handler this way)."""
    app.query("info")(info)
    for kind in als.PRE_RELEASES:
        app.query(kind)(_pre_release(kind))
    app.train()(train)
    app.evaluate()(evaluate)
    register_pam_handlers(app)  # DP model personalization (fedpriv.flower.pam_client)
    register_recommend_handlers(app)  # private recommendation (fedpriv.flower.recommend_handlers)
    register_secure_handlers(app)  # secure aggregation rounds (fedpriv.flower.secure_client)


app = ClientApp()
register_handlers(app)
