"""Where a node computes: its own configuration, never a message.

A SuperNode started with ``--node-config "device='cuda'"`` (or a simulated node whose worker
has ``FEDPRIV_NODE_DEVICE=cuda``, which :class:`fedpriv.run.FlowerSimulation` sets from its
``node_device``) runs its training step's statistics kernels on that device
(:mod:`fedpriv.util.device`); the default is the CPU. The device changes where the node's
arithmetic runs, never what it sends: its noise shares and its clipping are those of the CPU
path."""

from __future__ import annotations

import functools
import os

from ..util import device

ENV = "FEDPRIV_NODE_DEVICE"


def node_device(context) -> str:
    """The node's device: node config ``device``, else ``$FEDPRIV_NODE_DEVICE``, else "cpu"."""
    return str(context.node_config.get("device") or os.environ.get(ENV) or "cpu")


def on_node_device(handler):
    """``handler(msg, context)`` run on the node's own device."""

    @functools.wraps(handler)
    def wrapped(msg, context):
        with device.use(node_device(context)):
            return handler(msg, context)

    return wrapped
