"""``flower-supernode`` for many SuperNodes on one host (``fedpriv deploy up``).

Flower (1.39 to 1.42) starts one ``flwr-clientapp`` process per message and gives it a claim window: a task
whose process has not pulled it within ``HEARTBEAT_DEFAULT_INTERVAL`` (30 s) goes back to pending
and another process is started for it. With 50 or 100 SuperNodes on 2 cores, each round starts
50 or 100 processes at once; queued behind each other (:func:`fedpriv.ops.deploy.processes.clientapp_gate`)
many miss the window, and the relaunched ones pile up until memory runs out. This entry point
runs Flower's own SuperNode with that window set to ``FEDPRIV_CLIENTAPP_CLAIM_SECONDS``
(default 600 s) in the SuperNode's task store; nothing else changes. The window also bounds how
long a crashed ClientApp's task stays running (twice the window): the ServerApp's round timeout
still decides when a node's reply is given up."""

from __future__ import annotations

import os
import sys

CLAIM_ENV = "FEDPRIV_CLIENTAPP_CLAIM_SECONDS"


def supernode_main() -> None:
    window = float(os.environ.get(CLAIM_ENV, "600") or 600)
    from flwr.supercore.corestate import in_memory_corestate, sql_corestate

    for module in (in_memory_corestate, sql_corestate):  # the task stores bind the constant at import
        module.HEARTBEAT_DEFAULT_INTERVAL = window
    from flwr.supernode.cli import flower_supernode

    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    supernode_main()
