"""Server side of secure aggregation over Flower (``aggregation = "secure"``): the SecAgg+ rounds
of :mod:`fedpriv.privacy.secagg` that give the server the modular sum of the nodes' noised words
and nothing else (:class:`fedpriv.engine.loop.SecureAggregator` plans each round and decodes the sum
after the ledger's budget check).

Per run, once: ``secagg_keys`` (each serving node advertises its channel key; the public
neighbour graph is built over those nodes). Per release, three rounds where central mode has one:
``secagg_share``, ``secagg_mask`` (the round that carries the public state: the nodes compute
their contribution here) and ``secagg_unmask``, which is only sent after the budget check.

The server cannot check a masked reply's norm: it checks its format and size, and the unmasked
sum against its declared range (:func:`fedpriv.privacy.distributed.decode`). Clipping is
enforced by the honest node code (docs/explanations/trust-and-threat-models.md). Keys, shares
and masked words are fresh randomness in every honest reply: one that repeats an earlier
round's, or another reply's of the same round, is a replay or a copy and is rejected.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import uuid

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from ..errors import PrivacyError
from ..privacy.distributed import DistributedPlan, ExactPlan
from ..privacy.secagg import SecAggError, SecAggServer, plan_params
from .codec import RejectedReply, checked_array
from .rounds import Rounds

log = logging.getLogger("fedpriv.flower")

KEY_BYTES = 32


def _rejecting(fn):
    """Turn a secure-aggregation refusal of one reply into a rejected reply."""

    def wrapped(nid, rep):
        try:
            return fn(nid, rep)
        except SecAggError as exc:
            raise RejectedReply(str(exc)) from None

    return wrapped


def _by_id(rec) -> dict[int, bytes]:
    out = {}
    for k, v in rec.items():
        if not isinstance(v, (bytes, bytearray)):
            raise RejectedReply(f"malformed: entry {k!r} is not bytes")
        out[int(k)] = bytes(v)
    return out


def _channel(key: bytes) -> list[tuple[str, bytes]]:
    return [("channel key", bytes(key))]


def _mask_key(share: tuple) -> list[tuple[str, bytes]]:
    return [("mask key", bytes(share[0]))]


def _words(y: np.ndarray) -> list[tuple[str, bytes]]:
    # an empty vector (a release with nothing to sum, e.g. the bias model's factor part) is
    # the same in every honest reply: it carries no mask to replay
    return [("masked words", hashlib.sha256(y.tobytes()).digest())] if y.size else []


def _shares(reply: dict) -> list[tuple[str, bytes]]:
    return [("share", blob) for part in reply.values() for blob in part.values()]


class SecureRounds:
    """The secure-summation rounds of one job over ``rounds`` (its serving nodes)."""

    def __init__(self, rounds: Rounds, users_per_node: int, degree: int | None = None, threshold: int | None = None, mask_message_type: str = "query.secagg_mask"):
        self.rounds, self.users_per_node = rounds, int(users_per_node)
        self.mask_message_type = mask_message_type  # the round whose message makes the node compute its contribution
        self.degree, self.threshold = degree, threshold
        self.channel_keys: dict[int, bytes] = {}
        self.asked: set[int] = set()  # nodes asked for their channel key (once each)
        self.graph_seed = os.urandom(32)  # public: the neighbour graph
        self.run_label = uuid.uuid4().hex  # public: makes every release label of this job new
        self.count = 0
        self.seen: set[tuple[str, bytes]] = set()  # every key, share and masked vector (digest) accepted in this job

    # ------------------------------------------------------------------ replays
    def _fresh(self, values) -> None:
        """RejectedReply if a reply repeats a value accepted in an earlier round of this job."""
        if any(v in self.seen for v in values):
            raise RejectedReply("replayed: a key, share or masked vector already received in an earlier round")

    def _unique(self, name: str, accepted: dict, values) -> dict:
        """``accepted`` without the replies that hold a value (``values(reply)``) that another
        reply of this round holds too: a copy, and as the original is not known, every copy is
        rejected. The values kept are remembered for :meth:`_fresh`."""
        count = collections.Counter(v for r in accepted.values() for v in set(values(r)))
        out = {}
        for nid, r in accepted.items():
            if any(count[v] > 1 for v in set(values(r))):
                self.rounds.reject(name, nid, "replayed: another reply of this round holds the same key, share or masked vector")
            else:
                out[nid] = r
        self.seen.update(v for r in out.values() for v in values(r))
        return out

    # ------------------------------------------------------------------ per run
    def advertise(self) -> None:
        """The channel keys of the serving nodes that have none yet (once per node and job;
        nodes that answer take part)."""

        def decode(nid, rep):
            key = rep.content.config_records["secagg"]["channel_key"]
            if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
                raise RejectedReply("malformed: channel key is not 32 bytes")
            self._fresh(_channel(key))
            return bytes(key)

        missing = [n for n in self.rounds.nodes if n not in self.asked]
        self.asked.update(missing)
        if missing:
            keys = dict(self.rounds.gather("query.secagg_keys", RecordDict({"secagg": ConfigRecord({"run": self.run_label})}), "secagg_keys", decode, nodes=missing))
            self.channel_keys.update(self._unique("secagg_keys", keys, _channel))

    def population(self) -> tuple[int, int]:
        nodes = self._nodes()
        return len(nodes), max(1, self.users_per_node * len(nodes))

    def _nodes(self) -> list[int]:
        self.advertise()
        return [n for n in self.rounds.nodes if n in self.channel_keys]

    # ------------------------------------------------------------------ per release
    def secure_sum(self, kind: str, plan: DistributedPlan | ExactPlan, content: RecordDict, step: int):
        """Rounds ``share`` and ``mask`` of one release; returns (unmask, contributors), where
        ``unmask()`` runs the ``unmask`` round and returns the modular sum. Raises PrivacyError
        (nothing released) when fewer nodes contribute than the plan's noise needs."""
        nodes = self._nodes()
        if len(nodes) < 2:
            raise PrivacyError(f"secure round {kind!r}: {len(nodes)} node(s) with channel keys; secure summation needs at least 2")
        self.count += 1
        label = f"{self.run_label}/{kind}/{step}/{self.count}"
        params = plan_params(len(nodes), plan.bits, self.degree, self.threshold)
        server = SecAggServer(nodes, params, seed=self.graph_seed)
        sec = {"label": label, "bits": params.bits, "degree": params.degree, "threshold": params.threshold}
        name = f"{kind}{'' if kind != 'step' else step + 1}"

        # round 1: fresh mask keys and self-mask seeds, shared with the neighbours
        share_content = {n: RecordDict({"secagg": ConfigRecord(sec), "channel_keys": ConfigRecord({str(v): k for v, k in server.channel_keys_for(n, self.channel_keys).items()})}) for n in nodes}

        @_rejecting
        def decode_share(nid, rep):
            mask_key = rep.content.config_records["secagg"]["mask_key"]
            cts = _by_id(rep.content.config_records["ciphertexts"])
            if not isinstance(mask_key, (bytes, bytearray)) or len(mask_key) != KEY_BYTES:
                raise RejectedReply("malformed: mask key is not 32 bytes")
            if set(cts) != set(server.graph[nid]):
                raise RejectedReply("malformed: not one share ciphertext per neighbour")
            self._fresh(_mask_key((mask_key, cts)))
            return bytes(mask_key), cts

        shares = dict(self.rounds.gather("query.secagg_share", share_content, f"{name}:share", decode_share, nodes=nodes))
        shares = self._unique(f"{name}:share", shares, _mask_key)
        routed = server.route(shares)

        # round 2: the nodes' contributions, quantized and noised, then masked
        mask_sec = dict(sec, kind=kind, step=int(step), plan=json.dumps(plan.to_dict()))
        mask_content = {}
        for n, (keys, cts) in routed.items():
            rd = RecordDict(dict(content.items()))
            rd["secagg"] = ConfigRecord(mask_sec)
            rd["mask_keys"] = ConfigRecord({str(v): k for v, k in keys.items()})
            rd["ciphertexts"] = ConfigRecord({str(v): c for v, c in cts.items()})
            mask_content[n] = rd

        def decode_masked(nid, rep):
            if "masked" not in rep.content.array_records:
                raise RejectedReply("malformed: no masked record")
            y = checked_array(rep.content.array_records["masked"], "y", 1, "u")
            if y.dtype != np.uint64 or y.shape != (plan.length,):
                raise RejectedReply(f"malformed: masked words of dtype {y.dtype} and shape {y.shape}, expected uint64 ({plan.length},)")
            if plan.bits < 64 and y.size and int(y.max()) >> plan.bits:
                raise RejectedReply(f"malformed: masked words beyond 2^{plan.bits}")
            self._fresh(_words(y))
            return y

        masked = dict(self.rounds.gather(self.mask_message_type, mask_content, name, decode_masked, nodes=sorted(routed)))
        masked = self._unique(name, masked, _words)
        if len(masked) < params.threshold:
            raise PrivacyError(f"secure round {name!r}: {len(masked)} masked replies, fewer than the threshold {params.threshold}; nothing is released")
        survivors, dropped = server.unmask_request(list(shares), list(masked))
        plan.check_contributors(len(survivors))

        def unmask() -> np.ndarray:
            lists = ArrayRecord({"survivors": Array(np.asarray(survivors, dtype=np.uint64)), "dropped": Array(np.asarray(dropped, dtype=np.uint64))})
            content3 = RecordDict({"secagg": ConfigRecord(sec), "lists": lists})

            @_rejecting
            def decode_unmask(nid, rep):
                reply = {"self": _by_id(rep.content.config_records["self"]), "pairwise": _by_id(rep.content.config_records["pairwise"])}
                server.check_unmask_reply(nid, reply, survivors, dropped)
                self._fresh(_shares(reply))
                return reply

            replies = dict(self.rounds.gather("query.secagg_unmask", content3, f"{name}:unmask", decode_unmask, nodes=survivors))
            replies = self._unique(f"{name}:unmask", replies, _shares)
            mask_keys = {n: s[0] for n, s in shares.items()}
            try:
                return server.unmask(label.encode(), plan.length, mask_keys, masked, replies)
            except SecAggError as exc:
                raise PrivacyError(f"secure round {name!r}: {exc}; nothing is released") from None

        return unmask, len(survivors)

    def measure(self, kind: str, parts: list[tuple[str, int]], content: RecordDict) -> dict[str, np.ndarray]:
        """An aggregate measurement (``kind`` in :data:`fedpriv.flower.secure_client.MEASUREMENTS`):
        the exact totals of the nodes' ``parts`` over a secure sum (no noise, no ledger record);
        the server never sees one node's values."""
        plan = ExactPlan(tuple((str(n), int(k)) for n, k in parts), max(1, len(self._nodes())))
        unmask, _ = self.secure_sum(kind, plan, content, 0)
        return plan.decode(unmask())
