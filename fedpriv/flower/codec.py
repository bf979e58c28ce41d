"""Message contents: public state down, per-node contributions up, and the validation of every
reply before it may be summed.

Contributions are sparse: item ids, upper triangles of the d x d blocks, d-vectors. A reply is
rejected (and logged by the caller) when it is malformed (missing keys, wrong shapes or dtypes,
item ids out of range or repeated), non-finite, or larger than its declared bound: a node that
declares ``n_users`` users may move each release by at most ``n_users`` times the per-user L2
sensitivity (triangle inequality).
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from ..algorithms import als
from ..algorithms.kernels import from_upper, upper
from ..algorithms.options import Sampled, of


class RejectedReply(ValueError):
    """A reply that must not be summed; the message says why."""


def to_array(x) -> Array:
    """``x`` as a Flower Array (C-contiguous: a message carries the buffer as is)."""
    return Array(np.ascontiguousarray(x))


# ------------------------------------------------------------------ server -> clients
# what the clients read (the bias stage's item_support stays on the server: only its item solve reads it)
STATE_ARRAYS = ("item_factors", "item_bias", "counts_hat", "omega", "encoder_params", "item_item")


def encode_state(
    state: als.PublicState, data_dir: str, users_per_node: int, round_index: int = 0, key_file: str | None = None
) -> RecordDict:
    """The broadcast: released values and public choices only. ``key_file``: reproducible-noise
    runs only, the path of the clients' key file (:mod:`fedpriv.flower.node_secrets`)."""
    arrays = {}
    for key in STATE_ARRAYS:
        value = getattr(state, key)
        if value is not None:
            arrays[key] = to_array(value)
    cfg = ConfigRecord(
        {
            "algorithm": state.algorithm,
            "config": json.dumps(state.config.to_dict()),
            "n_items": state.n_items,
            "n_users": state.n_users,
            "rating_lo": float(state.rating_range[0]),
            "rating_hi": float(state.rating_range[1]),
            "implicit": bool(state.implicit),
            "mean": float(state.mean),
            "data_dir": data_dir,
            "users_per_node": int(users_per_node),
            "round": int(round_index),
            # one id per broadcast: a worker serving many nodes decodes each broadcast once
            "state_id": uuid.uuid4().hex,
        }
    )
    if key_file:
        cfg["client_key_file"] = str(key_file)
    rd = RecordDict({"state": ArrayRecord(arrays), "cfg": cfg})
    return rd


_DECODED: OrderedDict = OrderedDict()  # state_id -> decoded broadcast (read-only on clients)


def decode_state(content: RecordDict) -> tuple[als.PublicState, str, int]:
    """(state, data folder, users per node); the round index is :func:`round_of`. The decoded
    state of a broadcast is cached per worker by its ``state_id`` (client code never mutates
    it)."""
    key = content.config_records["cfg"].get("state_id")
    if key is not None and key in _DECODED:
        return _DECODED[key]
    out = _decode_state(content)
    if key is not None:
        _DECODED[key] = out
        while len(_DECODED) > 2:
            _DECODED.popitem(last=False)
    return out


def _decode_state(content: RecordDict) -> tuple[als.PublicState, str, int]:
    cfg = content.config_records["cfg"]
    arrays = content.array_records["state"]
    state = als.PublicState(
        algorithm=str(cfg["algorithm"]),
        config=als.ALSConfig.from_dict(json.loads(str(cfg["config"])), str(cfg["algorithm"])),
        n_items=int(cfg["n_items"]),
        n_users=int(cfg["n_users"]),
        rating_range=(float(cfg["rating_lo"]), float(cfg["rating_hi"])),
        implicit=bool(cfg["implicit"]),
        mean=float(cfg["mean"]),
    )
    for key in STATE_ARRAYS:
        if key in arrays:
            setattr(state, key, arrays[key].numpy())
    return state, str(cfg["data_dir"]), int(cfg["users_per_node"])


def round_of(content: RecordDict) -> int:
    return int(content.config_records["cfg"].get("round", 0))


# ------------------------------------------------------------------ clients -> server
def _contrib(arrays: dict, n_users: int) -> RecordDict:
    """A node's reply: its contribution arrays and the number of users it sums over."""
    return RecordDict({"contrib": ArrayRecord(arrays), "meta": ConfigRecord({"n_users": int(n_users)})})


def encode_vector(values: np.ndarray, n_users: int) -> RecordDict:
    return _contrib({"values": to_array(np.asarray(values, np.float64))}, n_users)


def encode_item_stats(stats: als.ItemStats, n_users: int) -> RecordDict:
    arrays = {
        "item_ids": to_array(stats.item_ids.astype(np.int64)),
        "A_upper": to_array(upper(stats.A)),
        "b": to_array(stats.b),
    }
    if stats.gravity is not None:
        arrays["gravity_upper"] = to_array(upper(np.asarray(stats.gravity, np.float32)))
    return _contrib(arrays, n_users)


def encode_gradient(stats: als.ItemStats, n_users: int) -> RecordDict:
    return _contrib(
        {"item_ids": to_array(stats.item_ids.astype(np.int64)), "grad": to_array(np.asarray(stats.b, np.float64))},
        n_users,
    )


def decode_gradient(content: RecordDict, state: als.PublicState, dim: int, max_users: int) -> als.ItemStats:
    """A validated DP-SGD contribution: sparse rows of the clipped per-user gradient sum."""
    n, arrays = unpack_contribution(content, max_users)
    ids = _item_ids(arrays, state.n_items)
    g = checked_array(arrays, "grad", 2, "f")
    if g.shape != (len(ids), dim):
        raise RejectedReply(f"malformed: gradient shape {g.shape} for {len(ids)} items of dimension {dim}")
    check_norm("gradient", g, n * of(state.config, Sampled).sgd_clip)
    return als.ItemStats(item_ids=ids.astype(np.int64), A=np.zeros((0, 0, 0), np.float32), b=g)


def unpack_contribution(content: RecordDict, max_users: int) -> tuple[int, ArrayRecord]:
    """(declared user count, contribution arrays) of a reply, or RejectedReply."""
    n = _declared_users(content, max_users)
    if "contrib" not in content.array_records:
        raise RejectedReply("malformed: no contribution record")
    return n, content.array_records["contrib"]


def _item_ids(arrays: ArrayRecord, n_items: int) -> np.ndarray:
    ids = checked_array(arrays, "item_ids", 1, "i")
    if len(ids) and (ids.min() < 0 or ids.max() >= n_items or len(np.unique(ids)) != len(ids)):
        raise RejectedReply("malformed: item ids out of range or repeated")
    return ids


def _declared_users(content: RecordDict, max_users: int) -> int:
    try:
        n = content.config_records["meta"]["n_users"]
    except KeyError as exc:
        raise RejectedReply(f"malformed: no declared user count ({exc})") from None
    if isinstance(n, bool) or not isinstance(n, int):  # not int(): it truncates 1.5, parses "20", overflows on inf
        raise RejectedReply(f"malformed: declared user count {n!r} is not an integer")
    if not 0 <= n <= max_users:
        raise RejectedReply(f"malformed: declared user count {n} outside [0, {max_users}]")
    return n


def checked_array(arrays: ArrayRecord, key: str, ndim: int, dtype_kind: str) -> np.ndarray:
    """``arrays[key]`` decoded, with ``ndim`` dimensions, dtype kind ``dtype_kind`` and finite floats, or
    RejectedReply."""
    if key not in arrays:
        raise RejectedReply(f"malformed: missing array {key!r}")
    try:
        x = arrays[key].numpy()
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a malformed reply
        raise RejectedReply(f"malformed: array {key!r} cannot be decoded ({exc})") from None
    if x.ndim != ndim or x.dtype.kind != dtype_kind:
        raise RejectedReply(f"malformed: array {key!r} has shape {x.shape} and dtype {x.dtype}")
    if dtype_kind == "f" and not np.all(np.isfinite(x)):
        raise RejectedReply(f"non-finite values in {key!r}")
    return x


def check_norm(name: str, x: np.ndarray, bound: float) -> None:
    """RejectedReply when the L2 norm of ``x`` exceeds ``bound`` (up to rounding)."""
    norm = float(np.linalg.norm(x))
    if norm > bound * (1 + 1e-5) + 1e-9:
        raise RejectedReply(f"over bound: ||{name}|| = {norm:.6g} > {bound:.6g}")


def decode_vector(content: RecordDict, release: str, length: int, state: als.PublicState, max_users: int) -> np.ndarray:
    """A validated vector contribution (mean: length 2; counts: length n_items)."""
    n, arrays = unpack_contribution(content, max_users)
    v = checked_array(arrays, "values", 1, "f")
    if len(v) != length:
        raise RejectedReply(f"malformed: {release} vector has length {len(v)}, expected {length}")
    if state.private:
        check_norm(release, v, n * als.sensitivity(release, state.config, state.rating_range))
    return v


def encode_parts(sums: tuple, state: als.PublicState, n_users: int) -> RecordDict:
    """The generic wire form ('parts'): the node's sums of the step's declared parts, dense
    (upper triangles of symmetric parts), one array per release name."""
    arrays = {}
    for p in state.spec.alternating_step().parts(state):
        arrays[f"part.{p.name}"] = to_array(p.flatten(sums[p.index]))
    return _contrib(arrays, n_users)


def decode_parts(content: RecordDict, state: als.PublicState, max_users: int) -> tuple:
    """A validated 'parts' contribution: every declared part present with its length, finite,
    and within the node's users times its release's sensitivity; returned as the node's sums in
    the parts' order (the form the step's ``sums`` adds)."""
    n, arrays = unpack_contribution(content, max_users)
    parts = state.spec.alternating_step().parts(state)
    out = [None] * (max(p.index for p in parts) + 1)
    for p in parts:
        v = checked_array(arrays, f"part.{p.name}", 1, "f")
        if len(v) != p.length:
            raise RejectedReply(f"malformed: part {p.name!r} has {len(v)} values, expected {p.length}")
        if state.private:
            check_norm(p.name, v, n * als.sensitivity(p.name, state.config, state.rating_range))
        out[p.index] = p.unflatten(v)
    return tuple(out)


def decode_contribution(content: RecordDict, state: als.PublicState, dim: int, max_users: int, n_params: int = 0):
    """A validated contribution of one alternating step, by the algorithm's contribution kind
    (:attr:`fedpriv.algorithms.registry.AlgorithmSpec.contribution`)."""
    kind = state.spec.contribution
    if kind == "parts":
        return decode_parts(content, state, max_users)
    if kind == "gradient":
        return decode_gradient(content, state, dim, max_users)
    if kind == "flat":
        return decode_vector(content, "encoder_grad", n_params, state, max_users)
    if kind == "convex":
        return decode_item_stats(content, state, dim, max_users, ("item_stats_H", "item_stats_g"))
    return decode_item_stats(content, state, dim, max_users)


def encode_contribution(contribution, state: als.PublicState, n_users: int) -> RecordDict:
    kind = state.spec.contribution
    if kind == "parts":
        return encode_parts(contribution, state, n_users)
    if kind == "gradient":
        return encode_gradient(contribution, n_users)
    if kind == "flat":
        return encode_vector(contribution, n_users)
    return encode_item_stats(contribution, n_users)


def decode_item_stats(
    content: RecordDict,
    state: als.PublicState,
    dim: int,
    max_users: int,
    names: tuple[str, str] = ("item_stats_A", "item_stats_b"),
) -> als.ItemStats:
    """A validated item-statistics contribution; ``names``: the releases of its matrix and vector
    parts (their per-user L2 bounds), e.g. ("item_stats_H", "item_stats_g") for am-ssp-convex."""
    n, arrays = unpack_contribution(content, max_users)
    ids = _item_ids(arrays, state.n_items)
    tri = checked_array(arrays, "A_upper", 2, "f")
    b = checked_array(arrays, "b", 2, "f")
    k = len(ids)
    if tri.shape != (k, dim * (dim + 1) // 2) or b.shape != (k, dim):
        raise RejectedReply(f"malformed: shapes {tri.shape}, {b.shape} for {k} items of dimension {dim}")
    gravity = None
    if state.config.gravity > 0 and not state.spec.logistic:  # the logistic statistics have no gravity term
        g = checked_array(arrays, "gravity_upper", 1, "f")
        if g.shape != (dim * (dim + 1) // 2,):
            raise RejectedReply(f"malformed: gravity has shape {g.shape}")
        gravity = from_upper(g, dim)
    if state.private:
        cfg, rr = state.config, state.rating_range
        check_norm(names[0], tri, n * als.sensitivity(names[0], cfg, rr))
        check_norm(names[1], b, n * als.sensitivity(names[1], cfg, rr))
        if gravity is not None:
            check_norm("gravity", g, n * als.sensitivity("gravity", cfg, rr))
    return als.ItemStats(item_ids=ids.astype(np.int64), A=from_upper(tri, dim), b=b, gravity=gravity)


def decode_score(content: RecordDict, clip: float, max_users: int) -> np.ndarray:
    """A validated private-tuning score contribution: one value, the sum over the node's
    declared users of min(user's validation MSE, clip), so in [0, users x clip]."""
    n, arrays = unpack_contribution(content, max_users)
    v = checked_array(arrays, "values", 1, "f")
    if v.shape != (1,):
        raise RejectedReply(f"malformed: a tuning score has one value, got shape {v.shape}")
    if v[0] < 0 or v[0] > n * clip * (1 + 1e-9):
        raise RejectedReply(f"over bound: tuning score {float(v[0]):.6g} outside [0, {n} users x clip {clip:g}]")
    return np.asarray(v, dtype=np.float64)


def decode_eval_sums(content: RecordDict, keys: tuple[str, ...], n_buckets: int = 5) -> dict[str, np.ndarray]:
    """Validated per-bucket evaluation sums (finite, non-negative, one value per bucket)."""
    if "eval" not in content.array_records:
        raise RejectedReply("malformed: no evaluation record")
    rec = content.array_records["eval"]
    vals = {k: checked_array(rec, k, 1, "f") for k in keys}
    if any(v.shape != (n_buckets,) or np.any(v < 0) for v in vals.values()):
        raise RejectedReply("malformed: evaluation sums must be non-negative, one per bucket")
    return vals


def payload_bytes(content: RecordDict) -> int:
    """Bytes of a message's payload: array buffers plus the serialized config values."""
    total = 0
    for rec in content.array_records.values():
        total += sum(len(a.data) for a in rec.values())
    for rec in content.config_records.values():
        total += sum(len(str(k)) + len(str(v)) for k, v in rec.items())
    return total
