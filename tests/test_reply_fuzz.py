"""Fuzzed replies: a malformed, non-finite, over-bound, wrong-shape or replayed reply is rejected
and logged, never summed; the privacy ledger (the only noise source, whose records epsilon is
computed from) is unchanged; the run completes, or stops with a clear FedprivError.

More than 1,000 fuzz cases per aggregation mode (central and secure) go through the ServerApp's
own reply path: :meth:`fedpriv.flower.rounds.Rounds.gather` (reply attribution, duplicates,
error replies) with the very ``decode`` callable the ServerApp gave it (the codec's checks in
central mode; the checks of channel keys, shares, masked words and unmask shares in secure
mode). The cases are seeded mutations of a node's honest reply of the round (:class:`Fuzzer`):
a missing record, array or key; a wrong dtype (int, bool, complex, bytes, str for floats, and
the like); an array that does not decode (pickled objects, empty, garbage or truncated bytes,
a torch stype); a wrong shape (transposed, extra dimension, truncated, extended, empty,
scalar); NaN and +-inf; values x 1e6 (over the bound); a declared user count that is negative,
above ``users_per_node``, 0 with a non-zero contribution, huge, or not an int; negative
evaluation sums; replays (an earlier round's reply message, another node's reply message, two
replies to one message, a reply of another message type); and in secure mode, keys of the
wrong size or type, ciphertexts for the wrong neighbours, masked words beyond 2^bits, an
earlier sum's masked words, mask key or unmask shares, another node's share or unmask content,
shares at the wrong Shamir index or of nodes not asked about.

Batching (1,000 full runs per mode would take many minutes; here about half a minute of CPU):

* **Shadow gathers** (the 1,000+ cases per mode, :class:`Shadow`). One run per mode (4 nodes of
  20 users, rank 2, 2 steps; central mode gathers 7 rounds: users, mean, counts, bias, two
  steps, evaluation; secure mode 22: the channel keys, then share, mask and unmask for each of
  those 7 sums) with ``Rounds.gather`` spied on. After each real gather the spy runs more
  gathers of the same round (its content, nodes and ``decode``) over a stub grid: in each, one
  node (in turn) re-sends its honest reply and the three others send fuzz cases, until
  ``PER_ROUND`` cases went through. Every shadow gather must accept the honest node only and
  log a reason for each fuzzed reply. Their results are never summed, and they must leave no
  trace: the run's ledger and released state are bit for bit those of a plain honest run.
* **End-to-end runs** (the oracle, :func:`test_fuzzed_replies_in_a_run_are_a_drop_out`). The
  replies of bad nodes are replaced in the run itself by fuzz cases (central: every
  contribution round of two bad nodes; secure: one of the share, mask or unmask rounds of one
  bad node in every sum). The run must equal the run in which those nodes send nothing in
  those same rounds (a drop-out): identical ledger records and identical released state
  (central: the seeded ledger draws the same noise for the same exact sums; secure: the nodes'
  noise shares are seeded and the masks cancel), every fuzzed reply in ``rejected_replies``
  with its reason, nothing non-finite. A copy of another node's masked words or mask key
  rejects both replies. Beyond the dropout the plan tolerates, the secure run stops with a
  PrivacyError, releases nothing more and writes nothing.

Not fuzzed as malformed, because the server cannot tell them from an honest reply and the
guarantee does not depend on them (:func:`test_what_the_server_cannot_tell_is_bounded`): a
well-formed, in-bound central contribution that repeats an earlier one or another node's (any
in-bound vector is a node's choice; the bound is what the sensitivity needs), a declared user
count above the node's real count but within ``users_per_node`` (the bound uses the declared
count), and an unknown extra entry next to the expected ones (never read). Nor, in secure mode,
forged masked words in range or forged shares at the right index: the server cannot check
masked values, and such a node spoils the sum, which the range check of the unmasked sum
catches (fedpriv.privacy.secagg, "Trust assumptions").
"""

from __future__ import annotations

import collections
import io
import json
import logging
import math
import struct
import uuid
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from fedpriv.errors import FedprivError, PrivacyError
from fedpriv.flower import codec
from fedpriv.flower.counters import RoundCounters
from fedpriv.flower.rounds import Rounds
from fedpriv.flower.server_app import run_job
from fedpriv.run import run
from fedpriv.testing.local_grid import LocalGrid

DATA = "synthetic-mf:users=80,items=40,ratings=2400,seed=5"
UPN = 20  # users per node: 4 nodes
PER_ROUND = {"central": 143, "secure": 46}  # shadow cases after each real gather (7 and 22 gathers)
CASES = 1000
TIMEOUT = "no reply before the round timeout"


# ---------------------------------------------------------------------------- runs
class FuzzGrid(LocalGrid):
    """The in-process grid, recording every round (each node's message and honest reply), where
    ``tamper(grid, node, message, honest reply)`` may replace a node's reply by a list of
    replies (none: the node stays silent; None: the honest reply)."""

    def __init__(self, n: int, tamper=None, client_app=None):
        super().__init__(n, client_app=client_app)
        self.tamper = tamper
        self.history: list[tuple[str, dict]] = []  # (message type, {node: (message, honest reply)})
        self.current: dict = {}

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        honest = super().send_and_receive(messages, timeout)  # (it gives every message an id, as a SuperLink does)
        msg_of = {m.metadata.message_id: m for m in messages}
        self.current = {}
        for rep in honest:
            m = msg_of[rep.metadata.reply_to_message_id]
            self.current[m.metadata.dst_node_id] = (m, rep)
        out = []
        for m in messages:
            nid = m.metadata.dst_node_id
            if nid in self.current:
                got = self.tamper(self, nid, *self.current[nid]) if self.tamper is not None else None
                out.extend([self.current[nid][1]] if got is None else got)
        self.history.append((messages[0].metadata.message_type if messages else "", self.current))
        return out


def _run(agg: str, grid: LocalGrid, work_dir, users_per_node: int = UPN, **overrides):
    """(metrics, ledger records, FlowerResult) of adadpals on ``grid`` through fedpriv.run."""
    out = {}

    def runner(job, n):
        assert n == grid.n_partitions
        out["result"] = run_job(grid, job)
        return out["result"]

    ov = {"rank": "2", "steps": "2", "users_per_node": str(users_per_node), "aggregation": agg, **overrides}
    m, led = run("adadpals", DATA, epsilon=3.0, overrides=ov, noise_seed=3, engine="flower", progress=False, second_opinion=False,
                 flower_runner=runner, work_dir=work_dir)
    return m, led, out["result"]


def _state_arrays(state) -> dict:
    """The released values of a public state."""
    out = {"mean": np.asarray(state.mean), "n_users": np.asarray(state.n_users)}
    for k in ("item_factors", "item_bias", "counts_hat", "omega", "item_support"):
        if getattr(state, k) is not None:
            out[k] = np.asarray(getattr(state, k))
    return out


def _assert_same_release(a, b) -> None:
    """Two FlowerResults released the same state, bit for bit, and nothing non-finite."""
    sa, sb = _state_arrays(a.state), _state_arrays(b.state)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert np.all(np.isfinite(sa[k])), k
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    assert a.valid_rmse == b.valid_rmse and a.test_rmse == b.test_rmse


# ---------------------------------------------------------------------------- fuzz cases
def _clone(rd: RecordDict) -> RecordDict:
    """A copy of a reply's records to mutate (its arrays are shared: they are replaced, never
    changed in place)."""
    out = RecordDict()
    for k, rec in rd.array_records.items():
        out[k] = ArrayRecord(dict(rec.items()))
    for k, rec in rd.config_records.items():
        out[k] = ConfigRecord(dict(rec))
    return out


def _reply(content: RecordDict, msg: Message) -> Message:
    return Message(content, reply_to=msg)


def _kind(content: RecordDict) -> str:
    """Which reply this is: a central contribution or evaluation, or a secure round's reply."""
    arrays, cfgs = content.array_records, content.config_records
    if "contrib" in arrays:
        return "contrib"
    if "eval" in arrays:
        return "eval"
    if "masked" in arrays:
        return "masked"
    if "self" in cfgs:
        return "unmask"
    if "ciphertexts" in cfgs:
        return "share"
    if "secagg" in cfgs and "signature" in cfgs["secagg"] and "channel_key" not in cfgs["secagg"]:
        return "consistency"  # authenticated nodes' view signature
    if "secagg" in cfgs:
        return "keys"
    if "meta" in cfgs:
        return "info"
    raise AssertionError(f"unknown reply {list(arrays)} {list(cfgs)}")


BAD_DTYPES = {"f": ("int64", "int32", "uint8", "bool", "complex128", "S8", "U4"),
              "i": ("float64", "float32", "uint64", "bool", "complex128", "S8", "U4"),
              "u": ("int64", "float64", "uint32", "int32", "bool", "S8", "U4")}


@dataclass
class Case:
    klass: str  # the fuzz class (the report counts by class)
    make: Callable[[Message], list[Message]]  # the replies the node sends for the message of the round


class Fuzzer:
    """Seeded mutations of a node's honest reply of the round (and replays of the run's earlier
    replies). Classes are drawn in shuffled cycles, so every class applicable to a reply kind
    comes up."""

    CLASSES = {
        "contrib": ("missing record", "missing array", "wrong dtype", "undecodable array", "wrong shape", "non-finite", "over bound",
                    "declared count", "stale reply", "another node's reply", "duplicate", "wrong message type"),
        "eval": ("missing record", "missing array", "wrong dtype", "undecodable array", "wrong shape", "non-finite", "negative sums",
                 "stale reply", "another node's reply", "duplicate", "wrong message type"),
        "keys": ("missing record", "missing key", "wrong key bytes", "stale reply", "another node's reply", "duplicate", "wrong message type"),
        "share": ("missing record", "missing key", "wrong key bytes", "wrong ciphertexts", "replayed mask key", "another node's content",
                  "stale reply", "another node's reply", "duplicate", "wrong message type"),
        "masked": ("missing record", "missing array", "wrong dtype", "undecodable array", "wrong shape", "out-of-range words",
                   "replayed words", "stale reply", "another node's reply", "duplicate", "wrong message type"),
        "consistency": ("missing record", "wrong signature bytes", "stale reply", "another node's reply", "duplicate", "wrong message type"),
        "unmask": ("missing record", "malformed share", "share index", "unexpected owner", "another node's content", "replayed shares",
                   "stale reply", "another node's reply", "duplicate", "wrong message type"),
    }

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.cycles: dict[str, list[str]] = {}

    # ---------------------------------------------------------------- drawing
    def _next_class(self, kind: str) -> str:
        cycle = self.cycles.setdefault(kind, [])
        if not cycle:
            classes = self.CLASSES[kind]
            cycle.extend(classes[i] for i in self.rng.permutation(len(classes)))
        return cycle.pop()

    def case(self, grid: FuzzGrid, nid: int, honest: Message, shadow: bool) -> Case:
        """The next case for node ``nid``, whose honest reply of the round is ``honest``
        (``shadow``: the case goes to a shadow gather, after the round)."""
        kind = _kind(honest.content)
        for _ in range(50):
            klass = self._next_class(kind)
            make = getattr(self, "_" + klass.replace(" ", "_").replace("-", "_").replace("'", ""))(kind, grid, nid, honest, shadow)
            if make is not None:  # (None: the class does not apply to this reply, e.g. no earlier reply to replay)
                return Case(klass, make)
        raise AssertionError(f"no applicable fuzz class for {kind}")

    def _pick(self, seq):
        seq = list(seq)
        return seq[int(self.rng.integers(len(seq)))] if seq else None

    def _content(self, honest: Message, mutate) -> Callable[[Message], list[Message]]:
        """A fresh reply to the round's message with ``mutate`` applied to a copy of the content."""
        content = _clone(honest.content)
        mutate(content)
        return lambda msg: [_reply(content, msg)]

    @staticmethod
    def _record(kind: str) -> str:
        return {"contrib": "contrib", "eval": "eval", "masked": "masked"}[kind]

    def _array_key(self, content: RecordDict, kind: str, float_only=False, nonzero=False) -> str | None:
        rec = content.array_records[self._record(kind)]
        keys = [k for k in rec if (not float_only or rec[k].numpy().dtype.kind == "f") and (not nonzero or np.any(rec[k].numpy() != 0))]
        return self._pick(sorted(keys))

    # ---------------------------------------------------------------- classes of every kind
    def _missing_record(self, kind, grid, nid, honest, shadow):
        names = list(honest.content.array_records) + list(honest.content.config_records)
        name = self._pick(sorted(names))

        def mutate(c):
            del c[name]
        return self._content(honest, mutate)

    def _missing_array(self, kind, grid, nid, honest, shadow):
        key = self._array_key(honest.content, kind)

        def mutate(c):
            del c.array_records[self._record(kind)][key]
        return self._content(honest, mutate)

    def _wrong_dtype(self, kind, grid, nid, honest, shadow):
        key = self._array_key(honest.content, kind)
        x = honest.content.array_records[self._record(kind)][key].numpy()
        dt = self._pick(BAD_DTYPES[x.dtype.kind])

        def mutate(c):
            c.array_records[self._record(kind)][key] = Array(np.ascontiguousarray(x.astype(dt)))
        return self._content(honest, mutate)

    def _undecodable_array(self, kind, grid, nid, honest, shadow):
        key = self._array_key(honest.content, kind)
        a = honest.content.array_records[self._record(kind)][key]
        how = self._pick(["object", "empty", "garbage", "truncated", "stype"])
        if how == "object":
            buf = io.BytesIO()
            np.save(buf, np.array([1.0, "a", None], dtype=object), allow_pickle=True)
            new = Array(dtype="object", shape=(3,), stype=a.stype, data=buf.getvalue())
        elif how == "empty":
            new = Array(dtype=a.dtype, shape=tuple(a.shape), stype=a.stype, data=b"")
        elif how == "garbage":
            new = Array(dtype=a.dtype, shape=tuple(a.shape), stype=a.stype, data=self.rng.bytes(int(self.rng.integers(1, 64))))
        elif how == "truncated":
            new = Array(dtype=a.dtype, shape=tuple(a.shape), stype=a.stype, data=bytes(a.data)[: max(1, len(a.data) - 9)])
        else:
            new = Array(dtype=a.dtype, shape=tuple(a.shape), stype="torch", data=bytes(a.data))

        def mutate(c):
            c.array_records[self._record(kind)][key] = new
        return self._content(honest, mutate)

    def _wrong_shape(self, kind, grid, nid, honest, shadow):
        key = self._array_key(honest.content, kind)
        x = honest.content.array_records[self._record(kind)][key].numpy()
        options = ["extra dim", "extended", "scalar"]
        if len(x):
            options += ["truncated", "empty"]
        if x.ndim == 2 and x.shape[0] != x.shape[1]:
            options += ["transposed", "flattened"]
        if x.ndim == 1:
            options += ["column"]
        how = self._pick(options)
        y = {"extra dim": lambda: x[None], "extended": lambda: np.concatenate([x, np.zeros((1, *x.shape[1:]), x.dtype)]),
             "scalar": lambda: np.asarray(x.ravel()[0] if x.size else 0, dtype=x.dtype), "truncated": lambda: x[:-1], "empty": lambda: x[:0],
             "transposed": lambda: x.T, "flattened": lambda: x.ravel(), "column": lambda: x[:, None]}[how]()

        def mutate(c):
            c.array_records[self._record(kind)][key] = Array(np.ascontiguousarray(y) if y.ndim else y)  # (ascontiguousarray makes a 0-d array 1-d)
        return self._content(honest, mutate)

    def _non_finite(self, kind, grid, nid, honest, shadow):
        key = self._array_key(honest.content, kind, float_only=True)
        if key is None:
            return None
        x = honest.content.array_records[self._record(kind)][key].numpy().copy()
        if not x.size:
            return None
        x.flat[int(self.rng.integers(x.size))] = self._pick([np.nan, np.inf, -np.inf])

        def mutate(c):
            c.array_records[self._record(kind)][key] = Array(x)
        return self._content(honest, mutate)

    def _over_bound(self, kind, grid, nid, honest, shadow):
        key = self._array_key(honest.content, kind, float_only=True, nonzero=True)
        if key is None:
            return None
        x = honest.content.array_records[self._record(kind)][key].numpy() * 1e6
        if np.linalg.norm(x) < 1e6:
            x.flat[int(np.argmax(np.abs(x)))] = 1e6

        def mutate(c):
            c.array_records[self._record(kind)][key] = Array(np.ascontiguousarray(x))
        return self._content(honest, mutate)

    def _negative_sums(self, kind, grid, nid, honest, shadow):
        key = self._array_key(honest.content, kind)
        x = honest.content.array_records["eval"][key].numpy().copy()
        i = int(self.rng.integers(x.size))
        x[i] = -abs(x[i]) - 1.0

        def mutate(c):
            c.array_records["eval"][key] = Array(x)
        return self._content(honest, mutate)

    def _declared_count(self, kind, grid, nid, honest, shadow):
        nonzero = any(np.any(a.numpy() != 0) for a in honest.content.array_records["contrib"].values())
        options = [-1, -UPN, UPN + 1, 10**9, 2**63 - 1, float(UPN), 1.5, math.inf, -math.inf, math.nan, str(UPN), str(UPN).encode(), True, [UPN]]
        if nonzero:
            options.append(0)  # smaller than its real count: the bound is 0
        value = self._pick(range(len(options) + 1))
        if value == len(options):  # no count at all

            def mutate(c):
                c["meta"] = ConfigRecord({"users": UPN})
        else:

            def mutate(c):
                c["meta"] = ConfigRecord({"n_users": options[value]})
        return self._content(honest, mutate)

    def _earlier(self, grid: FuzzGrid, nid: int | None, kind: str | None = None, other: bool = False) -> list[Message]:
        """The run's earlier non-error replies (of ``nid``, or of other nodes), of reply kind ``kind``."""
        out = []
        for _, rnd in grid.history:
            if rnd is grid.current:  # (the shadow gathers come after the round is recorded)
                continue
            for n, (_, rep) in rnd.items():
                if rep.has_error() or (n == nid) == other:
                    continue
                if kind is None or _kind(rep.content) == kind:
                    out.append(rep)
        return out

    def _stale_reply(self, kind, grid, nid, honest, shadow):
        old = self._pick(self._earlier(grid, nid))
        return (lambda msg: [old]) if old is not None else None

    def _another_nodes_reply(self, kind, grid, nid, honest, shadow):
        """Another node's reply message (it answers that node's message, of this round in the
        shadow, of an earlier round in the run)."""
        pool = [rep for n, (_, rep) in grid.current.items() if n != nid] if shadow else self._earlier(grid, nid, other=True)
        other = self._pick(pool)
        return (lambda msg: [other]) if other is not None else None

    def _duplicate(self, kind, grid, nid, honest, shadow):
        how = self._pick(["same", "then fuzzed", "fuzzed first"])
        fuzzed = self._content(honest, lambda c: c.array_records.clear() or c.config_records.clear())
        same = lambda msg: [_reply(honest.content, msg)]  # noqa: E731
        if how == "same":
            return lambda msg: same(msg) + same(msg)
        if how == "then fuzzed":
            return lambda msg: same(msg) + fuzzed(msg)
        return lambda msg: fuzzed(msg) + same(msg)

    def _wrong_message_type(self, kind, grid, nid, honest, shadow):
        wrong = self._pick([t for t in ("train", "evaluate", "query.users", "query.mean", "query.secagg_mask", "query.secagg_share", "query.info")
                            if t != honest.metadata.message_type])

        def make(msg):
            rep = _reply(honest.content, msg)
            rep.metadata.message_type = wrong
            return [rep]
        return make

    # ---------------------------------------------------------------- secure kinds
    def _missing_key(self, kind, grid, nid, honest, shadow):
        key = "channel_key" if kind == "keys" else "mask_key"

        def mutate(c):
            c["secagg"] = ConfigRecord({k: v for k, v in c.config_records["secagg"].items() if k != key})
        return self._content(honest, mutate)

    def _wrong_key_bytes(self, kind, grid, nid, honest, shadow):
        key = "channel_key" if kind == "keys" else "mask_key"
        good = bytes(honest.content.config_records["secagg"][key])
        bad = self._pick([good[:31], good + b"\0", b"", good.hex(), 7, 1.5, [1, 2]])

        def mutate(c):
            c["secagg"] = ConfigRecord({key: bad})
        return self._content(honest, mutate)

    def _wrong_signature_bytes(self, kind, grid, nid, honest, shadow):
        good = bytes(honest.content.config_records["secagg"]["signature"])
        bad = self._pick([good[:63], good + b"\0", b"", good.hex(), 7, 1.5, [1, 2]])

        def mutate(c):
            c["secagg"] = ConfigRecord({"signature": bad})
        return self._content(honest, mutate)

    def _wrong_ciphertexts(self, kind, grid, nid, honest, shadow):
        cts = dict(honest.content.config_records["ciphertexts"])
        how = self._pick(["missing", "extra", "not an id", "not bytes"])
        if how == "missing":
            cts.pop(self._pick(sorted(cts)))
        elif how == "extra":
            cts[str(10**6 + int(self.rng.integers(1000)))] = self.rng.bytes(92)
        elif how == "not an id":
            cts["node"] = cts.pop(self._pick(sorted(cts)))
        else:
            cts[self._pick(sorted(cts))] = "not bytes"

        def mutate(c):
            c["ciphertexts"] = ConfigRecord(cts)
        return self._content(honest, mutate)

    def _replayed_mask_key(self, kind, grid, nid, honest, shadow):
        """The mask key of an earlier sum (this node's or another's): keys are fresh per sum."""
        old = self._pick(self._earlier(grid, nid, "share") + self._earlier(grid, nid, "share", other=True))
        if old is None:
            return None

        def mutate(c):
            c["secagg"] = ConfigRecord({"mask_key": bytes(old.content.config_records["secagg"]["mask_key"])})
        return self._content(honest, mutate)

    def _another_nodes_content(self, kind, grid, nid, honest, shadow):
        """Another node's reply content of this round, sent as this node's."""
        other = self._pick([rep for n, (_, rep) in grid.current.items() if n != nid and not rep.has_error()])
        if other is None:
            return None
        return self._content(other, lambda c: None)

    def _out_of_range_words(self, kind, grid, nid, honest, shadow):
        """A word at or beyond 2^bits (field elements out of range; none exist at 64 bits)."""
        bits = int(grid.current[nid][0].content.config_records["secagg"]["bits"])
        y = honest.content.array_records["masked"]["y"].numpy().copy()
        if bits >= 64 or not y.size:
            return None
        y[int(self.rng.integers(y.size))] |= np.uint64(1) << np.uint64(int(self.rng.integers(bits, 64)))
        return self._content(honest, lambda c: c.__setitem__("masked", ArrayRecord({"y": Array(y)})))

    def _replayed_words(self, kind, grid, nid, honest, shadow):
        """This node's masked words of an earlier sum (same length when there is one)."""
        n = len(honest.content.array_records["masked"]["y"].numpy())
        old = self._earlier(grid, nid, "masked")
        same = [r for r in old if len(r.content.array_records["masked"]["y"].numpy()) == n]
        pick = self._pick(same or old)
        return self._content(pick, lambda c: None) if pick is not None else None

    def _malformed_share(self, kind, grid, nid, honest, shadow):
        part = self._pick([p for p in ("self", "pairwise") if len(honest.content.config_records[p])])
        rec = dict(honest.content.config_records[part])
        owner = self._pick(sorted(rec))
        how = self._pick(["short", "long", "not bytes", "owner not an id"])
        if how == "short":
            rec[owner] = bytes(rec[owner])[:-1]
        elif how == "long":
            rec[owner] = bytes(rec[owner]) + b"\0"
        elif how == "not bytes":
            rec[owner] = bytes(rec[owner]).hex()
        else:
            rec["node-" + owner] = rec.pop(owner)

        def mutate(c):
            c[part] = ConfigRecord(rec)
        return self._content(honest, mutate)

    def _share_index(self, kind, grid, nid, honest, shadow):
        """A share whose Shamir index is out of range, or another holder's index."""
        part = self._pick([p for p in ("self", "pairwise") if len(honest.content.config_records[p])])
        rec = dict(honest.content.config_records[part])
        owner = self._pick(sorted(rec))
        (index,) = struct.unpack(">I", bytes(rec[owner])[:4])
        new = self._pick([0, 2**32 - 1, 10**6, index + 1 if index < 4 else index - 1])
        rec[owner] = struct.pack(">I", new) + bytes(rec[owner])[4:]

        def mutate(c):
            c[part] = ConfigRecord(rec)
        return self._content(honest, mutate)

    def _unexpected_owner(self, kind, grid, nid, honest, shadow):
        """A share of a node the server did not ask about, or of the wrong kind."""
        selfs, pairs = dict(honest.content.config_records["self"]), dict(honest.content.config_records["pairwise"])
        how = self._pick(["unknown node", "self share as pairwise"] + (["pairwise share as self"] if pairs else []))
        if how == "unknown node":
            (selfs if self.rng.integers(2) else pairs)[str(10**6 + 7)] = next(iter(selfs.values()))
        elif how == "self share as pairwise":
            owner = self._pick(sorted(selfs))
            pairs[owner] = selfs.pop(owner)
        else:
            owner = self._pick(sorted(pairs))
            selfs[owner] = pairs.pop(owner)

        def mutate(c):
            c["self"], c["pairwise"] = ConfigRecord(selfs), ConfigRecord(pairs)
        return self._content(honest, mutate)

    def _replayed_shares(self, kind, grid, nid, honest, shadow):
        """This node's unmask reply content of an earlier sum."""
        old = self._pick(self._earlier(grid, nid, "unmask"))
        return self._content(old, lambda c: None) if old is not None else None


# ---------------------------------------------------------------------------- shadow gathers
class _Stub:
    """The grid of a shadow gather: ids as a SuperLink gives them, replies from ``deliver``."""

    def __init__(self, deliver: dict):
        self.deliver = deliver

    def send_and_receive(self, messages, timeout=None):
        out = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            make = self.deliver.get(m.metadata.dst_node_id)
            if make is not None:
                out.extend(make(m))
        return out


class Shadow:
    """The spy on ``Rounds.gather`` (see the module docstring)."""

    def __init__(self, grid: FuzzGrid, fuzzer: Fuzzer, per_round: int):
        self.grid, self.fuzzer, self.per_round = grid, fuzzer, per_round
        self.classes: collections.Counter = collections.Counter()
        self.failures: list = []

    def install(self, monkeypatch) -> None:
        real = Rounds.gather
        shadow = self

        def gather(rounds, message_type, content, name, decode, nodes=None):
            out = real(rounds, message_type, content, name, decode, nodes)
            if not isinstance(rounds.grid, _Stub):
                shadow.check(real, rounds, message_type, content, name, decode, nodes, out)
            return out

        monkeypatch.setattr(Rounds, "gather", gather)

    def check(self, real, rounds, message_type, content, name, decode, nodes, out) -> None:
        targets = list(rounds.nodes if nodes is None else nodes)
        honest = {n: rep for n, (_, rep) in self.grid.current.items() if n in targets and not rep.has_error()}
        assert {n for n, _ in out} == set(honest), name
        order = sorted(honest)
        done = 0
        log = logging.getLogger("fedpriv.flower")
        level = log.level
        log.setLevel(logging.ERROR)  # the rejections are counted below, not printed
        try:
            for g in range(10**6):
                if done >= self.per_round:
                    break
                keep = order[g % len(order)]  # the honest node of this shadow gather; the others send fuzz cases
                cases = {b: self.fuzzer.case(self.grid, b, honest[b], shadow=True) for b in order if b != keep}
                done += len(cases)
                deliver = {b: c.make for b, c in cases.items()}
                deliver[keep] = lambda m: [_reply(honest[keep].content, m)]
                sr = Rounds(_Stub(deliver), targets, RoundCounters(), None)
                classes = sorted(c.klass for c in cases.values())
                try:
                    got = {n for n, _ in real(sr, message_type, content, name, decode, nodes=targets)}
                except Exception as exc:  # noqa: BLE001 - the finding: a crash instead of a rejection
                    self.failures.append((name, classes, f"raised {type(exc).__name__}: {exc}"))
                    continue
                logged = [r for r in sr.result.rejected if r["reason"] != TIMEOUT]
                if got != {keep}:
                    self.failures.extend((name, cases[b].klass, "accepted") for b in got - {keep})
                    if keep not in got:
                        self.failures.append((name, classes, "the honest node was rejected"))
                elif len(logged) != len(cases) or not all(r["reason"] for r in logged):  # one reason per fuzzed reply
                    self.failures.append((name, classes, "not logged"))
                else:
                    self.classes.update(c.klass for c in cases.values())
        finally:
            log.setLevel(level)


# ---------------------------------------------------------------------------- the 1,000 per mode
SECURE = {"secure_dropout": "0.25"}  # 4 nodes: noise shares sized for 3, so one node may drop out of a sum
FUZZ_REPORT: dict = {}  # mode -> {class: cases} (printed by the summary test)


def _overrides(agg: str) -> dict:
    return SECURE if agg == "secure" else {}


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """The honest run of a mode: (metrics, ledger records, FlowerResult), run once."""
    cache = {}

    def get(agg: str):
        if agg not in cache:
            cache[agg] = _run(agg, FuzzGrid(4), tmp_path_factory.mktemp(f"honest-{agg}"), **_overrides(agg))
        return cache[agg]

    return get


KINDS = {"central": ("contrib", "eval"), "secure": ("keys", "share", "masked", "consistency", "unmask")}


@pytest.mark.parametrize("agg", ["central", "secure"])
def test_a_thousand_fuzzed_replies_are_rejected_and_leave_no_trace(agg, honest, tmp_path, monkeypatch):
    """The shadow gathers (module docstring): every fuzzed reply rejected with a reason, every
    honest reply beside it accepted, and the run bit for bit the honest run."""
    _, led0, res0 = honest(agg)
    grid = FuzzGrid(4)
    shadow = Shadow(grid, Fuzzer(seed={"central": 1, "secure": 2}[agg]), PER_ROUND[agg])
    shadow.install(monkeypatch)
    m, led, res = _run(agg, grid, tmp_path, **_overrides(agg))
    summary = collections.Counter((name.rstrip("0123456789"), str(klass), why[:70]) for name, klass, why in shadow.failures)
    assert not shadow.failures, "\n".join(f"{n} x {k}" for k, n in summary.most_common())
    FUZZ_REPORT[agg] = dict(shadow.classes)
    assert sum(shadow.classes.values()) >= CASES, shadow.classes
    assert set(shadow.classes) == {c for k in KINDS[agg] for c in Fuzzer.CLASSES[k]}  # every class came up
    assert m["rejected_replies"] == [] and res.rejected == []
    assert led == led0
    _assert_same_release(res, res0)


# ---------------------------------------------------------------------------- end to end
class Schedule:
    """The tamper of an end-to-end run: the replies of the ``bad`` nodes in the rounds ``pick``
    chooses are replaced by the next fuzz case of ``fuzzer``, or (no fuzzer: the reference run)
    by silence. ``expected`` counts the nodes the fuzzed replies must be logged under (a stray
    reply is logged under the node it claims to come from)."""

    def __init__(self, bad, pick, fuzzer: Fuzzer | None = None):
        self.bad, self.pick, self.fuzzer = set(bad), pick, fuzzer
        self.slots = 0
        self.expected: collections.Counter = collections.Counter()
        self.classes: collections.Counter = collections.Counter()

    def __call__(self, grid, nid, msg, honest_reply):
        if nid not in self.bad or honest_reply.has_error() or not self.pick(msg):
            return None
        self.slots += 1
        if self.fuzzer is None:
            return []
        case = self.fuzzer.case(grid, nid, honest_reply, shadow=False)
        replies = case.make(msg)
        self.classes[case.klass] += 1
        self.expected[replies[0].metadata.src_node_id if case.klass == "another node's reply" else nid] += 1
        return replies


def _not_info(msg) -> bool:
    return msg.metadata.message_type != "query.info"


class Rotation:
    """Secure mode: in every sum, one of its share, mask and unmask rounds, in turn (a node left
    out of a sum's share or mask round is not asked again for that sum)."""

    PHASES = ("query.secagg_share", "query.secagg_mask", "query.secagg_unmask")

    def __init__(self, offset: int = 0):
        self.offset, self.labels = offset, {}

    def __call__(self, msg) -> bool:
        sec = msg.content.config_records.get("secagg")
        if sec is None or "label" not in sec:
            return False
        phase = self.labels.setdefault(str(sec["label"]), (len(self.labels) + self.offset) % 3)
        return msg.metadata.message_type == self.PHASES[phase]


E2E = {"central": ((1001, 1003), lambda: _not_info), "secure": ((1002,), Rotation)}
E2E_REPORT: dict = {}


def _same_releases(a: list[dict], b: list[dict]) -> None:
    """The same releases, by name and mechanism (in central mode also their dimensions, counts
    and noise multipliers): what does not depend on who contributed. (The secure noise counts
    the contributors' shares, and its records merge only releases of equal noise; an adaptive
    clip, hence a sensitivity, is chosen from earlier released values.)"""
    assert {(r["name"], r["mechanism"]) for r in a} == {(r["name"], r["mechanism"]) for r in b}
    if {r["mechanism"] for r in a} == {"gaussian"}:
        keys = ("name", "count", "dim", "noise_multiplier", "sampling_rate", "groups")
        assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


@pytest.mark.parametrize("agg", ["central", "secure"])
def test_fuzzed_replies_in_a_run_are_a_drop_out(agg, honest, tmp_path):
    """The bad nodes' replies replaced in the run itself: the run equals the one where the bad
    nodes stay silent in those rounds (ledger records and released state, bit for bit), every
    fuzzed reply is in ``rejected_replies`` with its reason, nothing is non-finite."""
    _, led0, _ = honest(agg)
    bad, pick = E2E[agg]
    ref_schedule = Schedule(bad, pick())
    m_ref, led_ref, ref = _run(agg, FuzzGrid(4, ref_schedule), tmp_path / "silent", **_overrides(agg))
    assert ref_schedule.slots == {"central": 14, "secure": 7}[agg]
    assert {r["reason"] for r in ref.rejected} == {TIMEOUT}
    _same_releases(led_ref, led0)
    report = E2E_REPORT.setdefault(agg, collections.Counter())
    for seed in (11, 12):
        schedule = Schedule(bad, pick(), Fuzzer(seed))
        m, led, res = _run(agg, FuzzGrid(4, schedule), tmp_path / f"fuzz{seed}", **_overrides(agg))
        assert schedule.slots == ref_schedule.slots
        logged = [r for r in m["rejected_replies"] if r["reason"] != TIMEOUT]
        assert all(r["reason"] for r in logged)
        assert collections.Counter(r["node"] for r in logged) == schedule.expected, logged
        assert led == led_ref
        _assert_same_release(res, ref)
        for key in ("released_mean", "released_n_users", "valid_rmse", "test_rmse", "epsilon_spent"):
            assert m[key] == m_ref[key], key
        report.update(schedule.classes)


def test_more_bad_nodes_than_the_plan_tolerates_stop_the_secure_run_with_nothing_released(tmp_path, monkeypatch):
    """Two of 4 nodes send fuzzed masked words in the second sum (the mean); the noise shares
    were sized for 3 contributors: a PrivacyError, the sum is not unmasked, the ledger holds the
    first release only, and no output is written."""
    from fedpriv.flower import server_app

    ledgers = []
    real = server_app.new_state

    def new_state(*args, **kwargs):
        state, ledger = real(*args, **kwargs)
        ledgers.append(ledger)
        return state, ledger

    monkeypatch.setattr(server_app, "new_state", new_state)
    mean_mask = lambda msg: msg.metadata.message_type == "query.secagg_mask" and "/mean/" in str(msg.content.config_records["secagg"]["label"])  # noqa: E731
    schedule = Schedule((1001, 1002), mean_mask, Fuzzer(5))
    with pytest.raises(PrivacyError, match="nothing is released") as err:
        _run("secure", FuzzGrid(4, schedule), tmp_path, **SECURE)
    assert isinstance(err.value, FedprivError) and schedule.slots == 2
    assert [r.name for r in ledgers[0].releases] == ["users"]
    assert not list(tmp_path.rglob("metrics.json")) and not list(tmp_path.rglob("ledger.json"))


def test_a_copy_of_another_nodes_masked_words_or_mask_key_rejects_both(tmp_path):
    """Within one round, node 1001 sends node 1002's masked words (the mean's sum), then node
    1002's mask key (the counts' sum). Which one is the copy is not known: both replies are
    rejected, and the run equals the one where both nodes stay silent there (6 nodes, noise
    shares sized for 4; with one colluder assumed, the Shamir threshold 4 of a node's 6 share
    holders survives two lost nodes, where 5 nodes, t = 4 of 5, would survive one)."""
    ov = {"secure_dropout": "0.4"}

    def where(msg, kind, message_type):
        sec = msg.content.config_records.get("secagg")
        return msg.metadata.message_type == message_type and sec is not None and f"/{kind}/" in str(sec.get("label", ""))

    def copier(grid, nid, msg, rep):
        if nid == 1001 and where(msg, "mean", "query.secagg_mask"):
            return [_reply(grid.current[1002][1].content, msg)]
        if nid == 1001 and where(msg, "counts", "query.secagg_share"):
            content = _clone(rep.content)
            content["secagg"] = ConfigRecord({"mask_key": grid.current[1002][1].content.config_records["secagg"]["mask_key"]})
            return [_reply(content, msg)]
        return None

    def silent(grid, nid, msg, rep):
        pair = nid in (1001, 1002)
        return [] if pair and (where(msg, "mean", "query.secagg_mask") or where(msg, "counts", "query.secagg_share")) else None

    m, led, res = _run("secure", FuzzGrid(6, copier), tmp_path / "copy", users_per_node=14, **ov)
    m_ref, led_ref, ref = _run("secure", FuzzGrid(6, silent), tmp_path / "silent", users_per_node=14, **ov)
    copies = [(r["round"], r["node"]) for r in res.rejected]
    assert sorted(copies) == [("counts:share", 1001), ("counts:share", 1002), ("mean", 1001), ("mean", 1002)]
    assert all("another reply of this round" in r["reason"] for r in res.rejected)
    assert led == led_ref
    _assert_same_release(res, ref)


# ---------------------------------------------------------------------------- the bugs it found
@pytest.mark.parametrize("count", [math.inf, -math.inf, math.nan, 1.5, float(UPN), str(UPN), str(UPN).encode(), True, [UPN]])
def test_bug_a_declared_user_count_must_be_an_int(count):
    """Found by the fuzz: the codec took ``int()`` of the declared count, which raised
    OverflowError on inf (a crash of the run, not a rejection) and accepted 1.5 (as 1), 20.0,
    "20", b"20" and True."""
    from test_flower_codec import _state

    rd = codec.encode_vector(np.array([3.0]), 1)
    rd["meta"] = ConfigRecord({"n_users": count})
    with pytest.raises(codec.RejectedReply, match="declared user count"):
        codec.decode_vector(rd, "users", 1, _state(), UPN)


def test_bug_an_info_reply_whose_partition_is_not_an_int_is_rejected():
    """Found by the fuzz: ``int()`` of an info reply's partition id raised OverflowError on inf
    (a crash) and took "2" for partition 2."""
    from types import SimpleNamespace

    from fedpriv.flower.server_app import _Nodes

    LocalGrid(1)  # Flower's task identity, for Message()
    pids = {1: 0, 2: math.inf, 3: "2", 4: 3}
    grid = _Stub({n: (lambda m, p=p: [_reply(RecordDict({"meta": ConfigRecord({"partition_id": p})}), m)]) for n, p in pids.items()})
    rounds = Rounds(grid, sorted(pids), RoundCounters(), None)
    nodes = _Nodes(grid, SimpleNamespace(n_users=4, users_per_node=1, info_attempts=2), rounds, RecordDict)
    nodes.first_info(sorted(pids))
    assert nodes.partition_of == {1: 0, 4: 3}
    assert {r["node"] for r in rounds.result.rejected} == {2, 3}
    assert all("not an integer" in r["reason"] for r in rounds.result.rejected)


def test_bug_a_reply_counts_once_and_only_as_the_answer_to_its_own_message():
    """Found by the fuzz: the server took any reply whose sender it had asked: an earlier
    round's reply sent again was summed, a reply of another message type too, and of two replies
    to one message the last was kept without a word."""
    LocalGrid(1)
    earlier = Message(RecordDict(), dst_node_id=1, message_type="train")
    earlier.metadata.__dict__["_message_id"] = "an earlier round's message"
    content = RecordDict({"meta": ConfigRecord({"n_users": 1})})

    def typed(rep, message_type):
        rep.metadata.message_type = message_type
        return rep

    def from_node(rep, nid):
        rep.metadata.__dict__["_src_node_id"] = nid
        return rep

    msgs = {}
    deliver = {
        1: lambda m: [Message(content, reply_to=earlier)],  # replayed: it answers an earlier message
        2: lambda m: [Message(content, reply_to=m), Message(content, reply_to=m)],  # two replies to one message
        3: lambda m: [typed(Message(content, reply_to=m), "evaluate")],  # another round's type
        4: lambda m: msgs.setdefault(4, m) and [Message(content, reply_to=m)],  # honest
        5: lambda m: [from_node(Message(content, reply_to=msgs[4]), 5)],  # node 5 answers node 4's message
    }
    rounds = Rounds(_Stub(deliver), [1, 2, 3, 4, 5], RoundCounters(), None)
    assert rounds.gather("train", RecordDict(), "step1", lambda nid, rep: nid) == [(4, 4)]
    reasons = {r["node"]: r["reason"] for r in rounds.result.rejected if r["reason"] != TIMEOUT}
    assert set(reasons) == {1, 2, 3, 5}
    assert "stray reply" in reasons[1] and "stray reply" in reasons[5]
    assert reasons[2].startswith("2 replies to one message") and "'evaluate' reply in a 'train' round" in reasons[3]


def _measure_app(msg, ctx):
    """A node of the secure-sum rounds only (fedpriv's own handlers), whose measurement is three ones."""
    from fedpriv.flower import secure_client
    from fedpriv.privacy.distributed import plan_from_dict

    handler = {"query.secagg_keys": secure_client.keys, "query.secagg_share": secure_client.share,
               "query.secagg_consistency": secure_client.consistency, "query.secagg_unmask": secure_client.unmask}.get(msg.metadata.message_type)
    if handler is not None:
        return handler(msg, ctx)
    plan = plan_from_dict(json.loads(str(msg.content.config_records["secagg"]["plan"])))
    return secure_client.masked_reply(msg, ctx, plan.encode({"x": np.ones(3)}))


def test_bug_secure_rounds_reject_undecodable_replayed_and_misindexed_replies():
    """Found by the fuzz, in six exact secure sums over 4 nodes (each node sends three ones):
    masked words whose array does not decode crashed the run (EOFError); an earlier sum's masked
    words, mask key or unmask shares sent again were accepted (the sum then unmasks to garbage:
    an exact measurement has no range to catch it); an unmask reply with a share at another
    holder's index, or of a node not asked about, made the whole sum fail. Each is now a
    rejected reply, and every sum is exact."""
    from fedpriv.flower.secure_server import SecureRounds
    from fedpriv.privacy.distributed import ExactPlan

    def sum_of(msg) -> int:
        return int(str(msg.content.config_records["secagg"]["label"]).split("/")[2])

    def tamper(grid, nid, msg, rep):
        t, i = msg.metadata.message_type, sum_of(msg) if "secagg" in msg.content.config_records and msg.metadata.message_type != "query.secagg_keys" else -1
        earlier = {n: r for (_, rnd) in grid.history for n, (m, r) in rnd.items() if m.metadata.message_type == t and sum_of(m) == 1}
        if (i, nid, t) == (0, 1001, "query.secagg_mask"):
            a = rep.content.array_records["masked"]["y"]
            return [_reply(RecordDict({"masked": ArrayRecord({"y": Array(dtype=a.dtype, shape=tuple(a.shape), stype=a.stype, data=b"")})}), msg)]
        if (i, nid, t) in ((2, 1002, "query.secagg_mask"), (4, 1000, "query.secagg_unmask")):
            return [_reply(earlier[nid].content, msg)]  # its reply of sum 1, again
        if (i, nid, t) == (3, 1003, "query.secagg_share"):
            content = _clone(rep.content)
            content["secagg"] = ConfigRecord({"mask_key": earlier[nid].content.config_records["secagg"]["mask_key"]})
            return [_reply(content, msg)]
        if (i, nid, t) == (5, 1001, "query.secagg_unmask"):
            selfs = dict(rep.content.config_records["self"])
            owner = min(k for k in selfs if int(k) != nid)
            index = struct.unpack(">I", bytes(selfs[owner])[:4])[0]
            selfs[owner] = struct.pack(">I", index % 3 + 1) + bytes(selfs[owner])[4:]  # another holder's index
            content = _clone(rep.content)
            content["self"] = ConfigRecord(selfs)
            return [_reply(content, msg)]
        return None

    grid = FuzzGrid(4, tamper, client_app=_measure_app)
    rounds = Rounds(grid, sorted(grid.partition), RoundCounters(), None)
    secure = SecureRounds(rounds, users_per_node=1)
    sums = []
    for i in range(6):
        unmask, contributors = secure.secure_sum("eval", ExactPlan((("x", 3),), n_nodes=4), RecordDict(), i)
        sums.append((ExactPlan((("x", 3),), n_nodes=4).decode(unmask())["x"].tolist(), contributors))
    assert sums == [([3.0] * 3, 3), ([4.0] * 3, 4), ([3.0] * 3, 3), ([3.0] * 3, 3), ([4.0] * 3, 4), ([4.0] * 3, 4)]
    reasons = [(r["round"], r["node"], r["reason"]) for r in rounds.result.rejected if r["reason"] != TIMEOUT]
    assert [(name, node) for name, node, _ in reasons] == [("eval", 1001), ("eval", 1002), ("eval:share", 1003), ("eval:unmask", 1000), ("eval:unmask", 1001)]
    assert "cannot be decoded" in reasons[0][2] and all("replayed" in why for _, _, why in reasons[1:4]) and "index" in reasons[4][2]


# ---------------------------------------------------------------------------- by design
def test_what_the_server_cannot_tell_is_bounded():
    """Not malformed (the module docstring): an in-bound contribution sent again, or another
    node's, decodes as any in-bound contribution; a declared count above the node's real one is
    the bound it is checked against (never above users_per_node); an unknown extra array is
    never read."""
    from test_flower_codec import _state

    st = _state()
    honest_reply = codec.encode_vector(np.array([3.0]), 3)
    assert codec.decode_vector(honest_reply, "users", 1, st, UPN).tolist() == [3.0]
    assert codec.decode_vector(codec.encode_vector(np.array([3.0]), UPN), "users", 1, st, UPN).tolist() == [3.0]
    with pytest.raises(codec.RejectedReply, match="over bound"):
        codec.decode_vector(codec.encode_vector(np.array([UPN + 1.0]), UPN), "users", 1, st, UPN)
    honest_reply.array_records["contrib"]["unknown"] = Array(np.full(4, np.nan))
    assert codec.decode_vector(honest_reply, "users", 1, st, UPN).tolist() == [3.0]


def test_fuzz_report():
    """The classes and counts of this module's fuzz cases (``pytest -s``)."""
    for agg in ("central", "secure"):
        if agg in FUZZ_REPORT:
            print(f"\n{agg}: {sum(FUZZ_REPORT[agg].values())} shadow cases {dict(sorted(FUZZ_REPORT[agg].items()))}")
        if agg in E2E_REPORT:
            print(f"{agg}: {sum(E2E_REPORT[agg].values())} end-to-end cases {dict(sorted(E2E_REPORT[agg].items()))}")


def test_honest_empty_masked_vectors_are_not_taken_for_copies():
    """A secure step of the bias model (rank 0) sums an empty factor part: every honest node's
    masked vector is the same empty vector, which is no copy (regression: every reply of
    'step1' was rejected and the run stopped)."""
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import run
    from fedpriv.testing.local_grid import LocalGrid

    m, _ = run("adadpals", "synthetic-mf:users=90,items=40,ratings=2400,seed=5", epsilon=4.0,
               overrides={"steps": "2", "aggregation": "secure", "users_per_node": "30"}, engine="flower", progress=False,
               flower_runner=lambda job, n: run_job(LocalGrid(n), job), noise_seed=3)
    assert m["config"]["rank"] == 0 and m["rejected_replies"] == [] and m["test_rmse"] is not None
