"""How the training users are split over nodes: one rule for every engine.

``--nodes`` and ``--users-per-node`` (``nodes`` / ``users_per_node`` in Python) mean the same on
the in-process engine (each node is a shard of users whose client code runs in this process)
and on the Flower engines (each node is a SuperNode):

- ``--nodes N`` alone: the users are split into blocks of ``ceil(users / N)``, one per node (when
  the blocks fill fewer than N nodes, e.g. 943 users over 500 nodes fill 472 blocks of 2, the
  run uses that many and says so);
- ``--users-per-node U`` alone: ``ceil(users / U)`` nodes of U users (the last holds the rest);
- both: N nodes of U users, which must hold every user (N x U >= users; nodes beyond the
  blocks hold no user and say so);
- neither: the engine's default: the in-process engine runs one node (every user in one shard)
  in central mode, and :data:`SECURE_USERS_PER_NODE` users per node in secure mode, which needs
  several nodes; the Flower engines run one node per user.

Nodes are checked against the users: a node holds at least one user (N <= users), and a layout
that makes the run trivial (one node for every user) is warned about
(:class:`~fedpriv.errors.FedprivWarning`)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from ..errors import ConfigError, FedprivWarning

#: users per node of a secure run on the in-process engine when no layout is given (the
#: ``flwr run .`` main job's ``users-per-node`` too): secure aggregation needs several nodes
SECURE_USERS_PER_NODE = 20


@dataclass(frozen=True)
class NodeLayout:
    """``nodes`` nodes of at most ``users_per_node`` users each over ``n_users`` users."""

    n_users: int
    nodes: int
    users_per_node: int

    @property
    def partitions(self) -> int:
        """The nodes that hold users (blocks of ``users_per_node``)."""
        return -(-self.n_users // self.users_per_node)


def _count(value, field: str) -> int | None:
    """A node option as an int >= 1 (None or 0: not given)."""
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        f = float(value)
        if f == 0:
            return None
        if not (f.is_integer() and f >= 1):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"must be an integer >= 1, got {value!r}", field=field) from None
    return int(f)


def node_layout(
    n_users: int,
    *,
    nodes=None,
    users_per_node=None,
    default_users_per_node: int | None = None,
    nodes_field: str = "--nodes",
    users_field: str = "--users-per-node",
) -> NodeLayout:
    """The layout of ``n_users`` training users (module docstring); ``default_users_per_node``:
    the engine's default when neither option is given (None: one node for every user). Raises
    ConfigError naming the option; warns (FedprivWarning) where the layout makes the run trivial."""
    n_users = int(n_users)
    if n_users < 1:
        raise ConfigError("the training split holds no user", field=nodes_field)
    n, u = _count(nodes, nodes_field), _count(users_per_node, users_field)
    if n is not None and n > n_users:
        raise ConfigError(
            f"{n:,} nodes for {n_users:,} training users: every node holds at least one user; give at most {n_users:,}",
            field=nodes_field,
        )
    if n is not None and u is not None:
        blocks = -(-n_users // u)
        if n < blocks:
            raise ConfigError(
                f"{n:,} nodes of {u:,} users hold only {n * u:,} of the {n_users:,} training users: give at least "
                f"{blocks:,} nodes, "
                f"or --nodes alone to split the users over {n:,} nodes",
                field=nodes_field,
            )
        if n > blocks:
            _warn(
                f"{n - blocks:,} of the {n:,} nodes hold no user ({n_users:,} users in blocks of {u:,} fill {blocks:,} "
                f"nodes)"
            )
        layout = NodeLayout(n_users, n, u)
    elif n is not None:
        u = math.ceil(n_users / n)
        blocks = -(-n_users // u)
        if blocks < n:
            _warn(f"{n_users:,} users in blocks of {u:,} fill {blocks:,} nodes, not {n:,}: the run uses {blocks:,}")
        layout = NodeLayout(n_users, blocks, u)
    elif u is not None:
        if u > n_users:
            _warn(f"{users_field} {u:,} is more than the {n_users:,} training users: one node holds every user")
        layout = NodeLayout(n_users, -(-n_users // u), u)
    elif default_users_per_node is not None:
        u = max(1, min(int(default_users_per_node), n_users))
        layout = NodeLayout(n_users, -(-n_users // u), u)
    else:
        layout = NodeLayout(n_users, n_users, 1)
    if layout.nodes == 1 and (n is not None or u is not None):
        _warn(
            "the federation is one node holding every user: nothing is federated, and secure aggregation needs at "
            "least 2 nodes"
        )
    return layout


def _warn(message: str) -> None:
    warnings.warn(message, FedprivWarning, stacklevel=3)
