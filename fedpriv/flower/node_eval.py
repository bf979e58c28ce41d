"""A node's evaluation sums (per frequency bucket, on its validation and test ratings) for the
model and buckets a message carries: sent in plaintext by the central-mode ``evaluate`` handler
(:mod:`fedpriv.flower.client_app`), as a secure measurement sum in secure mode
(:mod:`fedpriv.flower.secure_client`, kind ``eval``)."""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message

from ..algorithms import evaluation, metrics
from ..algorithms import protocol
from ..errors import PrivacyError
from ..privacy import defences
from . import codec
from .node_policy import refuse
from .partition import data_dir_of, load_shard


def public_buckets(state) -> np.ndarray:
    """The evaluation's item buckets by the public rule, from the broadcast state alone: the
    frequency buckets of the released (noised) item counts, or of zeros when the run released
    none (one fixed order of the item ids). The server's rule too
    (:func:`fedpriv.flower.server_app.bucket_counts`)."""
    counts = state.counts_hat if state.counts_hat is not None else np.zeros(state.n_items)
    return metrics.frequency_buckets(np.asarray(counts, dtype=np.float64))


def node_eval(msg: Message, context: Context) -> dict:
    """This node's per-bucket evaluation sums for the model of ``msg``, over the buckets of the
    public rule (:func:`public_buckets`), which the node computes itself. A message whose buckets
    differ is refused (``[eval-buckets]``): a server that chose the buckets could put a few
    items of its choosing in buckets of their own and read one node's exact sums per item."""
    state, data_dir, upn = codec.decode_state(msg.content)
    data_dir = data_dir_of(context.node_config, data_dir)
    pid = int(context.node_config.get("partition-id", 0))
    sent = msg.content.array_records["eval"]["item_bucket"].numpy() if "eval" in msg.content.array_records else None
    item_bucket = public_buckets(state)
    if sent is not None and not np.array_equal(np.asarray(sent), item_bucket):
        if defences.active("eval-buckets"):
            raise refuse(
                "the evaluation measurement",
                "its item buckets are not the public rule's (the frequency buckets of the released counts)",
                PrivacyError,
                "eval-buckets",
            )
        item_bucket = np.asarray(sent, dtype=np.int64)  # a positive control: the message's buckets
    shards = [load_shard(data_dir, part, pid, upn) for part in ("train", "valid", "test")]
    return evaluation.node_eval_sums(state, *shards, item_bucket, protocol.is_logistic(state.algorithm))
