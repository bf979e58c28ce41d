"""Counters shared by the results of every Flower job."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class RoundCounters:
    """Protocol counters of a Flower run: rounds, bytes measured from the serialized messages,
    the per-round log and the rejected replies (filled by ``fedpriv.flower.rounds.Rounds``)."""

    rounds: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    round_log: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
