"""Server side of secure aggregation over Flower (``aggregation = "secure"``): the SecAgg+ rounds
of :mod:`fedpriv.privacy.secagg` that give the server the modular sum of the nodes' noised words
and nothing else (:class:`fedpriv.engine.loop.SecureAggregator` plans each round and decodes the sum
after the ledger's budget check).

Per run, once: ``secagg_keys`` (each serving node advertises its channel key; the public
neighbour graph is built over those nodes). Per release, three rounds where central mode has one:
``secagg_share``, ``secagg_mask`` (the round that carries the public state: the nodes compute
their contribution here) and ``secagg_unmask``, which is only sent after the budget check.

Every node gets the public graph (members and seed) with ``secagg_share``, and counts the
members itself. Authenticated nodes (a signing identity in their own configuration,
:mod:`fedpriv.flower.node_identity`) sign their channel keys; the server relays every member's
signed advertisement and channel key with ``secagg_share``, and runs a fourth round,
``secagg_consistency``, before ``secagg_unmask``: each survivor signs the survivor and dropped
lists it is shown, bound to a digest of what its words depend on (plan, broadcast, candidates),
and the server forwards the signatures. The nodes check all of it; the server only carries it.

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


def _signature(sig: bytes) -> list[tuple[str, bytes]]:
    return [("view signature", bytes(sig))]


def _shares(reply: dict) -> list[tuple[str, bytes]]:
    return [("share", blob) for part in reply.values() for blob in part.values()]


class SecureRounds:
    """The secure-summation rounds of one job over ``rounds`` (its serving nodes)."""

    def __init__(
        self,
        rounds: Rounds,
        users_per_node: int,
        degree: int | None = None,
        threshold: int | None = None,
        mask_message_type: str = "query.secagg_mask",
        colluders: int = 0,
    ):
        self.rounds, self.users_per_node = rounds, int(users_per_node)
        self.colluders = int(
            colluders
        )  # the run's colluding nodes: the Shamir threshold holds against them (nodes refuse a lower one)
        self.mask_message_type = mask_message_type  # the round whose message makes the node compute its contribution
        self.degree, self.threshold = degree, threshold
        self.channel_keys: dict[int, bytes] = {}
        self.adverts: dict[
            int, tuple[str, bytes]
        ] = {}  # authenticated nodes: (roster name, signature) of their channel key
        self.asked: set[int] = set()  # nodes asked for their channel key (once each)
        self.adverts_sent: dict[int, set[int]] = {}  # node -> members whose signed advertisement it was sent
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
                self.rounds.reject(
                    name, nid, "replayed: another reply of this round holds the same key, share or masked vector"
                )
            else:
                out[nid] = r
        self.seen.update(v for r in out.values() for v in values(r))
        return out

    # ------------------------------------------------------------------ per run
    def advertise(self) -> None:
        """The channel keys of the serving nodes that have none yet (once per node and job;
        nodes that answer take part)."""

        def decode(nid, rep):
            rec = rep.content.config_records["secagg"]
            key = rec["channel_key"]
            if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
                raise RejectedReply("malformed: channel key is not 32 bytes")
            self._fresh(_channel(key))
            advert = None
            if "signature" in rec:  # an authenticated node: its peers check the signature, not the server
                name, sig = rec.get("name"), rec["signature"]
                if not isinstance(name, str) or not isinstance(sig, (bytes, bytearray)):
                    raise RejectedReply("malformed: key advertisement without a name or signature bytes")
                advert = (name, bytes(sig))
            return bytes(key), advert

        missing = [n for n in self.rounds.nodes if n not in self.asked]
        self.asked.update(missing)
        if missing:
            got = dict(
                self.rounds.gather(
                    "query.secagg_keys",
                    RecordDict({"secagg": ConfigRecord({"run": self.run_label})}),
                    "secagg_keys",
                    decode,
                    nodes=missing,
                )
            )
            keys = self._unique("secagg_keys", {n: k for n, (k, _) in got.items()}, _channel)
            self.channel_keys.update(keys)
            self.adverts.update({n: got[n][1] for n in keys if got[n][1] is not None})

    @property
    def authenticated(self) -> bool:
        """Whether the nodes sign their keys (then the server relays the signatures and runs the
        consistency round; the nodes, not the server, enforce them)."""
        return bool(self.adverts)

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
            raise PrivacyError(
                f"secure round {kind!r}: {len(nodes)} node(s) with channel keys; secure summation needs at least 2"
            )
        self.count += 1
        label = f"{self.run_label}/{kind}/{step}/{self.count}"
        params = plan_params(len(nodes), plan.bits, self.degree, self.threshold, self.colluders)
        server = SecAggServer(nodes, params, seed=self.graph_seed)
        sec = {"label": label, "bits": params.bits, "degree": params.degree, "threshold": params.threshold}
        name = f"{kind}{'' if kind != 'step' else step + 1}"

        # round 1: fresh mask keys and self-mask seeds, shared with the neighbours (with, for
        # authenticated nodes, each neighbour's signed advertisement and the public graph)
        members = ArrayRecord({"members": Array(np.asarray(sorted(nodes), dtype=np.uint64))})

        def share_record(n: int) -> RecordDict:
            # the public graph (members and seed) to every node: it checks its neighbours and counts the members
            peers = server.channel_keys_for(n, self.channel_keys)
            rd = RecordDict(
                {
                    "secagg": ConfigRecord(dict(sec, graph_seed=self.graph_seed)),
                    "channel_keys": ConfigRecord({str(v): k for v, k in peers.items()}),
                    "graph": members,
                }
            )
            if self.authenticated:
                # the signed advertisements a node counts its peers by: its neighbours' every round, the
                # other members' once per job (the node keeps those it checked; it refuses a member it has not)
                sent = self.adverts_sent.setdefault(n, set())
                signed = [v for v in nodes if v in self.adverts and (v in peers or v not in sent)]
                sent.update(signed)
                rd["channel_names"] = ConfigRecord({str(v): self.adverts[v][0] for v in signed})
                rd["channel_sigs"] = ConfigRecord({str(v): self.adverts[v][1] for v in signed})
                rd["member_keys"] = ConfigRecord({str(v): self.channel_keys[v] for v in signed if v not in peers})
            return rd

        share_content = {n: share_record(n) for n in nodes}

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

        shares = dict(
            self.rounds.gather("query.secagg_share", share_content, f"{name}:share", decode_share, nodes=nodes)
        )
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
                raise RejectedReply(
                    f"malformed: masked words of dtype {y.dtype} and shape {y.shape}, expected uint64 ({plan.length},)"
                )
            if plan.bits < 64 and y.size and int(y.max()) >> plan.bits:
                raise RejectedReply(f"malformed: masked words beyond 2^{plan.bits}")
            self._fresh(_words(y))
            return y

        masked = dict(
            self.rounds.gather(self.mask_message_type, mask_content, name, decode_masked, nodes=sorted(routed))
        )
        masked = self._unique(name, masked, _words)
        if len(masked) < params.threshold:
            raise PrivacyError(
                f"secure round {name!r}: {len(masked)} masked replies, fewer than the threshold {params.threshold}; "
                "nothing is released"
            )
        survivors, dropped = server.unmask_request(list(shares), list(masked))
        plan.check_contributors(len(survivors))

        def unmask() -> np.ndarray:
            lists = ArrayRecord(
                {
                    "survivors": Array(np.asarray(survivors, dtype=np.uint64)),
                    "dropped": Array(np.asarray(dropped, dtype=np.uint64)),
                }
            )
            content3 = RecordDict({"secagg": ConfigRecord(sec), "lists": lists})
            asked = survivors
            if self.authenticated:  # consistency round: every survivor signs the view it is shown

                def decode_sig(nid, rep):
                    sig = rep.content.config_records["secagg"]["signature"]
                    if not isinstance(sig, (bytes, bytearray)) or len(sig) != 64:
                        raise RejectedReply("malformed: view signature is not 64 bytes")
                    self._fresh(_signature(sig))
                    return bytes(sig)

                sigs = dict(
                    self.rounds.gather(
                        "query.secagg_consistency",
                        RecordDict({"secagg": ConfigRecord(sec), "lists": lists}),
                        f"{name}:consistency",
                        decode_sig,
                        nodes=survivors,
                    )
                )
                sigs = self._unique(f"{name}:consistency", sigs, _signature)
                content3 = RecordDict(
                    {
                        "secagg": ConfigRecord(sec),
                        "lists": lists,
                        "signatures": ConfigRecord({str(v): s for v, s in sigs.items()}),
                    }
                )
                asked = [n for n in survivors if n in sigs]

            @_rejecting
            def decode_unmask(nid, rep):
                reply = {
                    "self": _by_id(rep.content.config_records["self"]),
                    "pairwise": _by_id(rep.content.config_records["pairwise"]),
                }
                server.check_unmask_reply(nid, reply, survivors, dropped)
                self._fresh(_shares(reply))
                return reply

            replies = dict(
                self.rounds.gather("query.secagg_unmask", content3, f"{name}:unmask", decode_unmask, nodes=asked)
            )
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
