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
enforced by the honest node code (docs/explanations/trust-and-threat-models.md).
"""

from __future__ import annotations

import json
import logging
import os
import uuid

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from ..errors import PrivacyError
from ..privacy.distributed import DistributedPlan, ExactPlan
from ..privacy.secagg import SecAggError, SecAggServer, plan_params
from .codec import RejectedReply
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

    # ------------------------------------------------------------------ per run
    def advertise(self) -> None:
        """The channel keys of the serving nodes that have none yet (once per node and job;
        nodes that answer take part)."""

        def decode(nid, rep):
            key = rep.content.config_records["secagg"]["channel_key"]
            if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
                raise RejectedReply("malformed: channel key is not 32 bytes")
            return bytes(key)

        missing = [n for n in self.rounds.nodes if n not in self.asked]
        self.asked.update(missing)
        if missing:
            self.channel_keys.update(self.rounds.gather("query.secagg_keys", RecordDict({"secagg": ConfigRecord({"run": self.run_label})}), "secagg_keys", decode, nodes=missing))

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
            return bytes(mask_key), cts

        shares = dict(self.rounds.gather("query.secagg_share", share_content, f"{name}:share", decode_share, nodes=nodes))
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
            y = rep.content.array_records["masked"]["y"].numpy()
            if y.dtype != np.uint64 or y.shape != (plan.length,):
                raise RejectedReply(f"malformed: masked words of dtype {y.dtype} and shape {y.shape}, expected uint64 ({plan.length},)")
            if plan.bits < 64 and y.size and int(y.max()) >> plan.bits:
                raise RejectedReply(f"malformed: masked words beyond 2^{plan.bits}")
            return y

        masked = dict(self.rounds.gather(self.mask_message_type, mask_content, name, decode_masked, nodes=sorted(routed)))
        if len(masked) < params.threshold:
            raise PrivacyError(f"secure round {name!r}: {len(masked)} masked replies, fewer than the threshold {params.threshold}; nothing is released")
        survivors, dropped = server.unmask_request(list(shares), list(masked))
        plan.check_contributors(len(survivors))

        def unmask() -> np.ndarray:
            lists = ArrayRecord({"survivors": Array(np.asarray(survivors, dtype=np.uint64)), "dropped": Array(np.asarray(dropped, dtype=np.uint64))})
            content3 = RecordDict({"secagg": ConfigRecord(sec), "lists": lists})

            @_rejecting
            def decode_unmask(nid, rep):
                return {"self": _by_id(rep.content.config_records["self"]), "pairwise": _by_id(rep.content.config_records["pairwise"])}

            replies = dict(self.rounds.gather("query.secagg_unmask", content3, f"{name}:unmask", decode_unmask, nodes=survivors))
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
