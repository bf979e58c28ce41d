"""A node's evaluation sums (per frequency bucket, on its validation and test ratings) for the
model and buckets a message carries: sent in plaintext by the central-mode ``evaluate`` handler
(:mod:`fedpriv.flower.client_app`), as a secure measurement sum in secure mode
(:mod:`fedpriv.flower.secure_client`, kind ``eval``)."""

from __future__ import annotations

from flwr.app import Context, Message

from ..algorithms import evaluation
from ..algorithms import protocol
from . import codec
from .partition import data_dir_of, load_shard


def node_eval(msg: Message, context: Context) -> dict:
    """This node's per-bucket evaluation sums for the model and buckets of ``msg``."""
    state, data_dir, upn = codec.decode_state(msg.content)
    data_dir = data_dir_of(context.node_config, data_dir)
    pid = int(context.node_config.get("partition-id", 0))
    item_bucket = msg.content.array_records["eval"]["item_bucket"].numpy()
    shards = [load_shard(data_dir, part, pid, upn) for part in ("train", "valid", "test")]
    return evaluation.node_eval_sums(state, *shards, item_bucket, protocol.is_logistic(state.algorithm))
