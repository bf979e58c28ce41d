"""The round machinery of the ServerApps (alternating loop, personalization): one message per
node, replies collected with byte counting, and every rejected reply logged with its reason.
A reply counts only as the one answer of its node to the node's message of this round: a reply
to another message (a replay), a second reply, or one of another message type is rejected."""

from __future__ import annotations

import logging
import time

from flwr.app import Message
from flwr.serverapp import Grid

from . import codec
from .counters import RoundCounters

log = logging.getLogger("fedpriv.flower")


class Rounds:
    """Sends one message per node and collects replies, with byte counting and rejection log."""

    def __init__(self, grid: Grid, nodes: list[int], result: RoundCounters, timeout: float | None, progress=None):
        self.grid, self.nodes, self.result, self.timeout = grid, nodes, result, timeout
        self.progress = progress  # fedpriv.flower.progress.Progress: one line per round, or None

    def ask(
        self,
        message_type: str,
        content,
        name: str,
        timeout: float | None = ...,
        nodes: list[int] | None = None,
        report: bool = True,
    ) -> list[tuple[int, Message]]:
        """One message per node (``nodes``, default the serving nodes), all with the same
        (broadcast) ``content``, or ``content[node]`` when it is a dict of per-node contents;
        ``timeout`` defaults to the job's round timeout. ``report=False``: the caller reports the
        round's progress line (after decoding the replies)."""
        if self.progress is not None:
            self.progress.flush()  # the previous round's line, with the epsilon of its release
        t0 = time.perf_counter()
        rejected_before = len(self.result.rejected)
        targets = list(self.nodes if nodes is None else nodes)
        per_node = content if isinstance(content, dict) else {nid: content for nid in targets}
        msgs = [Message(content=per_node[nid], dst_node_id=nid, message_type=message_type) for nid in targets]
        down = (
            sum(codec.payload_bytes(per_node[nid]) for nid in targets)
            if isinstance(content, dict)
            else codec.payload_bytes(content) * len(msgs)
        )
        replies = list(self.grid.send_and_receive(msgs, timeout=self.timeout if timeout is ... else timeout))
        up = 0
        ok = []
        asked = set(targets)
        # the grid gives every message an id on push (a SuperLink, LocalGrid): a reply counts only
        # as the answer to one of this round's messages, from the node it was for. Error replies
        # about an unavailable node come from the SuperLink: attribute them to that node.
        dst_of = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs}
        ids = all(dst_of) and len(dst_of) == len(msgs)
        by_node: dict[int, list] = {}
        for rep in replies:
            src, to = rep.metadata.src_node_id, rep.metadata.reply_to_message_id
            if ids and (to not in dst_of or (src in asked and src != dst_of[to])):
                self.reject(name, src, "stray reply: it answers no message of this round to its node (a replay?)")
                continue
            if src not in asked:
                src = dst_of.get(to, src)
            if rep.metadata.message_type != message_type and not rep.has_error():
                self.reject(name, src, f"malformed: a {rep.metadata.message_type!r} reply in a {message_type!r} round")
                continue
            by_node.setdefault(src, []).append(rep)
        answered = set()
        for src, reps in by_node.items():
            answered.add(src)
            if len(reps) > 1:  # which one would be the node's? none is summed
                self.reject(name, src, f"{len(reps)} replies to one message (a duplicate or replay): all rejected")
                continue
            rep = reps[0]
            if rep.has_error():
                self.reject(name, src, f"node error: {rep.error.reason}")
                continue
            up += codec.payload_bytes(rep.content)
            ok.append((src, rep))
        missing = asked - answered
        for nid in sorted(missing):
            self.reject(name, nid, "no reply before the round timeout")
        self.result.rounds += 1
        self.result.bytes_down += down
        self.result.bytes_up += up
        self.result.round_log.append(
            {
                "round": name,
                "seconds": time.perf_counter() - t0,
                "bytes_down": down,
                "bytes_up": up,
                "replies": len(ok),
                "nodes": len(targets),
            }
        )
        if report:
            self._report(len(ok), rejected_before)
        return ok

    def _report(self, accepted: int, rejected_before: int) -> None:
        """The last round's progress line: replies accepted, and replies rejected since
        ``rejected_before`` (node errors, timeouts, failed decoding)."""
        if self.progress is not None:
            self.progress.round_done(self.result.round_log[-1], accepted, len(self.result.rejected) - rejected_before)

    def gather(
        self, message_type: str, content, name: str, decode, nodes: list[int] | None = None
    ) -> list[tuple[int, object]]:
        """:meth:`ask`, then ``decode(node, reply)`` of every reply in the serving nodes' order;
        a reply whose decoding raises :class:`~fedpriv.flower.codec.RejectedReply` (or another
        ValueError, KeyError or TypeError of a malformed record) is rejected with the reason and
        left out. Returns (node, decoded value) of the accepted replies."""
        targets = list(self.nodes if nodes is None else nodes)
        rejected_before = len(self.result.rejected)
        replies = dict(self.ask(message_type, content, name, nodes=targets, report=False))
        out = []
        for nid in targets:
            if nid not in replies:
                continue
            try:
                out.append((nid, decode(nid, replies[nid])))
            except (ValueError, KeyError, TypeError) as exc:  # codec.RejectedReply is a ValueError
                self.reject(name, nid, str(exc))
        self._report(len(out), rejected_before)
        return out

    def reject(self, name: str, node: int, reason: str) -> None:
        log.warning("round %s: reply of node %s rejected: %s", name, node, reason)
        self.result.rejected.append({"round": name, "node": int(node), "reason": reason})


def job_rounds(grid: Grid, job, result: RoundCounters, registered: list[int], n_parts: int) -> Rounds:
    """The rounds of ``job`` (a rating or a block family's job) over the nodes that registered:
    a ConfigError naming users-per-node when fewer than its ``n_parts`` partitions registered;
    one progress line per round when the job asks for them."""
    if len(registered) < n_parts:
        from ..errors import ConfigError

        raise ConfigError(
            f"{n_parts} partitions of {job.users_per_node} users need {n_parts} nodes; {len(registered)} registered",
            field="users-per-node",
        )
    progress = None
    if job.progress:
        from .progress import Progress

        progress = Progress(job.delta, lambda: result.ledger, job.epsilon, relation=job.relation)
    return Rounds(grid, registered, result, job.round_timeout, progress=progress)


def wait_for_nodes(grid: Grid, n: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n or time.monotonic() > deadline:
            return nodes
        time.sleep(0.5)
