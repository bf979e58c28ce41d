"""Progress a person can follow: one line per protocol round as it ends (the round, replies
accepted and rejected, bytes up and down, seconds, epsilon spent so far), then a short summary
table. The epsilon is dp-accounting's, computed from the job's ledger (never estimated here).

Lines go to stdout: ``flwr run`` mirrors the ServerApp's output to ``--stream``, and
``fedpriv run --engine flower`` prints them unless ``--quiet``."""

from __future__ import annotations

import sys

from ..privacy.target import ADD_REMOVE, REPLACE_ONE


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"  # pragma: no cover


def _kind(name: str) -> str:
    """Round names grouped for the summary: step12 -> step, secure rounds by their release."""
    base = name.rstrip("0123456789")
    return base or name


class Progress:
    """Reports rounds of one job; ``ledger_of()`` returns the job's current ledger (or None);
    ``relation``: the neighbouring relation the job's epsilon holds under (the job's)."""

    def __init__(self, delta: float, ledger_of, budget: float | None = None, stream=None, relation: str = ADD_REMOVE):
        self.delta, self.ledger_of, self.budget, self.relation = delta, ledger_of, budget, relation
        self.stream = stream if stream is not None else sys.stdout
        self._eps_key: tuple | None = None
        self._eps: float | None = None

    def epsilon(self) -> float | None:
        """Epsilon spent so far (dp-accounting, from the ledger); None before any release."""
        ledger = self.ledger_of()
        releases = getattr(ledger, "releases", None) if ledger is not None else None
        if not releases:
            return None
        key = (id(ledger), tuple((r.name, getattr(r, "count", 1), getattr(r, "groups", 1)) for r in releases))
        if key != self._eps_key:  # recomputed only when a release was added
            from ..privacy.accounting import epsilon_bounds

            self._eps, self._eps_key = float(epsilon_bounds(ledger, self.delta, relation=self.relation)[0]), key
        return self._eps

    def _print(self, line: str) -> None:
        print(f"[fedpriv] {line}", file=self.stream, flush=True)

    def round_done(self, entry: dict, accepted: int, rejected: int) -> None:
        """A round's replies are in; its line is printed once the aggregator has released what
        they carried (at the next round's start, or the summary), so that its epsilon counts
        that release."""
        self.flush()
        self._pending = (entry, accepted, rejected)

    def flush(self) -> None:
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is None:
            return
        entry, accepted, rejected = pending
        eps = self.epsilon()
        spent = "-" if eps is None else f"{eps:.3f}" + (f" of {self.budget:g}" if self.budget else "")
        self._print(
            f"round {entry['round']:<12} accepted {accepted:>4}/{entry['nodes']:<4} rejected {rejected:<3} "
            f"up {_size(entry['bytes_up']):>9}  down {_size(entry['bytes_down']):>9}  {entry['seconds']:7.2f} s  "
            f"epsilon {spent}"
        )

    def summary(self, round_log: list[dict], rejected: list[dict], extra: dict | None = None, counters=None) -> None:
        """A short table: rounds grouped by kind, then the protocol's totals (``counters``: the
        run's protocol counters, the very numbers ``metrics.json`` reports as ``rounds``,
        ``bytes_up`` and ``bytes_down``) apart from the measurement rounds (evaluation), then the
        epsilon spent and the given metrics. Seconds are those spent inside rounds; the run's
        own time is in its summary."""
        self.flush()
        groups: dict[str, dict] = {}
        bad: dict[str, int] = {}
        for r in rejected:
            bad[_kind(r["round"])] = bad.get(_kind(r["round"]), 0) + 1
        for e in round_log:
            g = groups.setdefault(_kind(e["round"]), {"rounds": 0, "replies": 0, "up": 0, "down": 0, "seconds": 0.0})
            g["rounds"] += 1
            g["replies"] += e["replies"]
            g["up"] += e["bytes_up"]
            g["down"] += e["bytes_down"]
            g["seconds"] += e["seconds"]
        self._print("summary")
        self._print(
            f"  {'rounds':<12} {'count':>5} {'replies':>8} {'rejected':>8} {'up':>10} {'down':>10} {'seconds':>9}"
        )
        for kind, g in groups.items():
            self._print(
                f"  {kind:<12} {g['rounds']:>5} {g['replies']:>8} {bad.get(kind, 0):>8} {_size(g['up']):>10} "
                f"{_size(g['down']):>10} {g['seconds']:>9.2f}"
            )
        tot = {k: sum(g[k] for g in groups.values()) for k in ("rounds", "replies", "up", "down", "seconds")}
        if counters is not None:
            proto = {"rounds": int(counters.rounds), "up": int(counters.bytes_up), "down": int(counters.bytes_down)}
            self._print(
                f"  {'protocol':<12} {proto['rounds']:>5} {'':>8} {'':>8} {_size(proto['up']):>10} "
                f"{_size(proto['down']):>10} {'':>9}"
            )
            if tot["rounds"] > proto["rounds"]:
                self._print(
                    f"  {'measurement':<12} {tot['rounds'] - proto['rounds']:>5} {'':>8} {'':>8} "
                    f"{_size(tot['up'] - proto['up']):>10} "
                    f"{_size(tot['down'] - proto['down']):>10} {'':>9}  (evaluation: not part of the protocol's rounds "
                    f"and bytes)"
                )
        self._print(
            f"  {'all rounds':<12} {tot['rounds']:>5} {tot['replies']:>8} {len(rejected):>8} {_size(tot['up']):>10} "
            f"{_size(tot['down']):>10} {tot['seconds']:>9.2f}"
        )
        eps = self.epsilon()
        # a deployment: its enrolled count is public
        neighbours = ", replace-one neighbours" if self.relation == REPLACE_ONE else ""
        tail = [
            f"epsilon spent {eps:.4f} (delta {self.delta:g}{neighbours}; the guarantee, dp-accounting on the ledger)"
            if eps is not None
            else "no private release"
        ]
        tail += [
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in (extra or {}).items() if v is not None
        ]
        self._print("  " + "; ".join(tail))
