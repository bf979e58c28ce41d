"""An in-process stand-in for Flower's Grid: every message is handled at once by fedpriv's
ClientApp, in this process, as the node of its partition would (each node keeps its own
``context.state`` across messages, as a SuperNode does). Nodes can be killed (they stop replying
but stay listed, as on a SuperLink until their heartbeat expires) and can rejoin under a new
node id. Used to test the ServerApp's loop (resume, rejoin) without Ray or processes, and by the
red-team check (``observer`` sees every message a node receives, ``reply_observer`` every reply
the server receives). A handler that raises gives an error reply, as on a SuperNode. Every
message gets an id on push and its reply answers that id, as on a SuperLink.

Each node gets a signing identity for authenticated secure aggregation, made for this grid (a
temporary folder of keys, mode 0600, and the roster; node-config ``fedpriv-identity``, removed
with the grid): ``identity=False`` runs the nodes unauthenticated.

Node policy (:mod:`fedpriv.flower.node_policy`): the caller operates every node of this grid.
``node_policy`` (a NodePolicy) is put in every node's config as a SuperNode's ``--node-config``
would carry it; without it, the nodes read the file named by ``FEDPRIV_NODE_POLICY`` when that is
set, else they run the permissive policy in the mode of the job they serve (:meth:`operate_for`;
everything in one process: no trust boundary for a node policy to defend; the tests and the red
team pass a policy where they test one)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
import weakref

from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode
from flwr.common import RecordDict
from flwr.supercore.task_identity import TaskIdentity


class LocalGrid:
    def __init__(
        self,
        n_nodes: int,
        client_app=None,
        on_round=None,
        observer=None,
        run_config: dict | None = None,
        node_config=None,
        reply_observer=None,
        identity: bool = True,
        node_policy=None,
    ):
        if client_app is None:
            from fedpriv.flower.client_app import app as client_app
        for key in ("run_id", "node_id", "task_id"):  # Message() needs a task identity
            try:
                getattr(TaskIdentity, key)
            except RuntimeError:
                setattr(TaskIdentity, key, 1)
        self.app = client_app
        self.partition = {1000 + i: i for i in range(n_nodes)}  # node id -> partition id
        self.n_partitions = n_nodes
        self.dead: set[int] = set()
        self.on_round = on_round  # called with (grid, message_type or "get_node_ids") before each round / node listing
        self.message_types: list[str] = []
        self.observer = observer  # called with (node id, message) for every message a node receives
        self.reply_observer = (
            reply_observer  # called with (node id, reply) for every reply the server receives (error replies too)
        )
        self.run_config = dict(run_config or {})  # the run config every node's context carries
        self.states: dict[
            int, RecordDict
        ] = {}  # each node's own context.state, kept across messages (as a SuperNode does)
        self.node_config = node_config  # partition id -> extra node config (e.g. a deployment node's own data-dir)
        self.identities: dict[int, str] = {}  # partition id -> its identity folder (node-config fedpriv-identity)
        if identity:
            from fedpriv.flower.node_identity import CONFIG_KEY, provision

            folder = tempfile.mkdtemp(prefix="fedpriv-identity-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, folder, True)
            self.identities = {p: str(d) for p, d in provision(folder, n_nodes).items()}
            self._identity_key = CONFIG_KEY
        self.node_policy = node_policy  # every node's own policy (fedpriv.flower.node_policy.NodePolicy), or None
        self.mode = "any"  # the permissive default's mode: "secure" while a secure job is served (operate_for)

    def operate_for(self, job) -> None:
        """The caller, who operates every node of this grid, serves ``job`` with them
        (:func:`fedpriv.flower.server_app.run_job` calls it before its first message): without a
        policy of the caller's, the nodes run the permissive policy in the job's mode, so a
        secure job finds secure nodes (the ServerApp refuses others) and a central job plaintext
        ones. The mode is the caller's (the job object in this process), never a message's."""
        aggregation = getattr(getattr(job, "cfg", None), "aggregation", None)
        self.mode = "secure" if getattr(aggregation, "secure", False) else "any"

    def _policy_items(self) -> dict:
        import os

        from fedpriv.flower.node_policy import POLICY_ENV, NodePolicy

        if self.node_policy is not None:
            return self.node_policy.node_config_items()
        return (
            {}
            if os.environ.get(POLICY_ENV)
            else NodePolicy.permissive().with_changes(aggregation=self.mode).node_config_items()
        )

    def get_node_ids(self) -> list[int]:
        if self.on_round is not None:
            self.on_round(self, "get_node_ids")
        return sorted(self.partition)

    def kill(self, partition: int) -> int:
        nid = next(n for n, p in self.partition.items() if p == partition and n not in self.dead)
        self.dead.add(nid)
        return nid

    def rejoin(self, partition: int) -> int:
        """The node of ``partition`` comes back under a new node id."""
        nid = max(self.partition) + 1
        self.partition[nid] = partition
        return nid

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if messages:
            self.message_types.append(messages[0].metadata.message_type)
            if self.on_round is not None:
                self.on_round(self, messages[0].metadata.message_type)
        replies = []
        for msg in messages:
            if not msg.metadata.message_id:  # as a SuperLink does on push: replies answer this id
                msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            nid = msg.metadata.dst_node_id
            if nid not in self.partition or nid in self.dead:
                continue  # no reply before the timeout
            if self.observer is not None:
                self.observer(nid, msg)
            state = self.states.setdefault(nid, RecordDict())
            node_config = {"partition-id": self.partition[nid], "num-partitions": self.n_partitions}
            if self.partition[nid] in self.identities:
                node_config[self._identity_key] = self.identities[self.partition[nid]]
            node_config.update(self._policy_items())
            if self.node_config is not None:
                node_config.update(self.node_config(self.partition[nid]))
            ctx = Context(run_id=1, node_id=nid, node_config=node_config, state=state, run_config=self.run_config)
            try:
                reply = self.app(msg, ctx)
            except Exception as exc:  # noqa: BLE001 - as a SuperNode does: the node's error becomes an error reply
                reply = Message(
                    error=Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc).__name__}: {exc}"),
                    reply_to=msg,
                )
            if self.reply_observer is not None:
                self.reply_observer(nid, reply)
            replies.append(reply)
        return replies
