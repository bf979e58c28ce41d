"""The named defences of a node against a deviating server, one identifier each.

Every refusal a node makes names the check that refused, in the form ``[identifier]`` inside
its message (:func:`tag`), so that logs, error replies and the red team
(``simulations/red_team.py --server deviant``, its ``"refused_by"`` field) can say which defence
held (:func:`refused_by`).

:func:`disabled` turns one defence off **in this process** for a positive control (the red team
and the tests: the attack must then succeed). Nothing else turns a defence off: not a message,
not the run config, not the node's policy. A node process never calls it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

#: identifier -> what the node checks
DEFENCES: dict[str, str] = {
    "plaintext-handler": "a secure node answers no plaintext handler",
    "plan-parts": "the plan's parts, lengths and sensitivities are the ones the node's own clipping gives",
    "plan-scale": "each part's scale is the public rule's, recomputed by the node",
    "noise-floor": "the noise the node counts on (its own contributors and colluders) meets its floor",
    "node-budget": "the node's ledger (on its disk, across runs) stays within its budget",
    "secure-sums": "at most max_secure_sums noised sums per run",
    "key-file": "a key file named by the server is read only with reproducible noise enabled",
    "key-substitution": "a neighbour's channel key must carry its roster signature",
    "shamir-threshold": "the Shamir threshold holds against the node's own colluders",
    "min-contributors": "members and survivors of a sum number at least the node's min_contributors",
    "roster": "every member of a sum carries a roster signature under a distinct roster name",
    "view-consistency": "every survivor signed the same digest of plan, broadcast, candidates and members",
    "recommend-epsilon": "a recommendation's epsilon is capped by the node's recommendation budget",
    "recommend-count": "at most max_recommendations recommendation queries per run",
    "eval-buckets": "evaluation buckets come from the public rule the node computes itself",
    "measurement-count": "at most max_measurements exact measurement sums per run",
}

_off: set[str] = set()
_TAG = re.compile(r"\[([a-z][a-z-]*)\]")


def _known(name: str) -> str:
    if name not in DEFENCES:
        raise KeyError(f"unknown defence {name!r} (known: {', '.join(DEFENCES)})")
    return name


def active(name: str) -> bool:
    """Whether the defence ``name`` is on (always, unless a positive control turned it off)."""
    return _known(name) not in _off


def tag(name: str) -> str:
    """``[name]``: how a refusal's message names its defence."""
    return f"[{_known(name)}]"


def refused_by(text: str) -> str | None:
    """The defence a refusal's message names (its first ``[identifier]``), or None."""
    for m in _TAG.finditer(str(text)):
        if m.group(1) in DEFENCES:
            return m.group(1)
    return None


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Turn the defences ``names`` off inside the block, in this process only (positive
    controls of the red team and the tests)."""
    added = [n for n in map(_known, names) if n not in _off]
    _off.update(added)
    try:
        yield
    finally:
        _off.difference_update(added)


__all__ = ["DEFENCES", "active", "disabled", "refused_by", "tag"]
