"""The fedpriv ClientApp: one node holds one user or a shard of users (``partition-id`` in the
node config, ``users_per_node`` from the server). Handlers are thin wrappers of the client
functions of :mod:`fedpriv.algorithms.als`; nothing but clipped contributions and evaluation
sums leaves the node."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from .. import evaluation
from ..algorithms import als, dpsgd
from . import codec
from .partition import load_shard

app = ClientApp()


def _partition_id(context: Context) -> int:
    return int(context.node_config.get("partition-id", 0))


def _shard(msg: Message, context: Context, part: str = "train"):
    state, data_dir, upn = codec.decode_state(msg.content)
    return state, load_shard(data_dir, part, _partition_id(context), upn)


@app.query("info")
def info(msg: Message, context: Context) -> Message:
    state, shard = _shard(msg, context)
    meta = ConfigRecord({"partition_id": _partition_id(context), "n_users": shard.n_users, "n_ratings": shard.n_ratings})
    return Message(RecordDict({"meta": meta}), reply_to=msg)


@app.query("mean")
def mean(msg: Message, context: Context) -> Message:
    state, shard = _shard(msg, context)
    total = als.client_mean(shard, state.config, state.rating_range, state.private)
    return Message(codec.encode_vector(total, shard.n_users), reply_to=msg)


@app.query("counts")
def counts(msg: Message, context: Context) -> Message:
    state, shard = _shard(msg, context)
    total = als.client_counts(shard, state.config, state.n_items, state.private)
    return Message(codec.encode_vector(total, shard.n_users), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local user update, then the shard's clipped, weighted per-item statistics (DP-SGD: the
    sampled users' clipped gradients)."""
    state, shard = _shard(msg, context)
    if state.algorithm == "dpsgd":
        grad = dpsgd.client_gradient(shard, state, codec.round_of(msg.content))
        return Message(codec.encode_gradient(grad, shard.n_users), reply_to=msg)
    stats = als.client_item_stats(shard, state)
    return Message(codec.encode_item_stats(stats, shard.n_users), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Per-bucket squared errors on the node's validation and test ratings."""
    state, data_dir, upn = codec.decode_state(msg.content)
    pid = _partition_id(context)
    item_bucket = msg.content.array_records["eval"]["item_bucket"].numpy()
    history = load_shard(data_dir, "train", pid, upn)
    out = {}
    for part in ("valid", "test"):
        sse, cnt = evaluation.shard_squared_errors(state, history, load_shard(data_dir, part, pid, upn), item_bucket)
        out[f"{part}_sse"] = codec._arr(sse)  # noqa: SLF001
        out[f"{part}_n"] = codec._arr(cnt)  # noqa: SLF001
    return Message(RecordDict({"eval": ArrayRecord(out)}), reply_to=msg)
