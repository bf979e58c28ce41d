"""Neighbouring runs: how far one user moves each release, measured on the real pipeline.

Run a job on D with a :class:`ReplayLedger`, then the same job on D' (D minus one user, loaded
and renumbered by the real loaders) with a ``ReplayLedger(replay=<the first>)`` and the same
secret randomness. The second run is handed the first run's noised outputs, so both see the same
public state at every release; :func:`influence` then compares the exact (pre-noise) sums
release by release: their difference is the removed user's whole influence, which must stay
within the sensitivity the aggregator declared. Used by the neighbour tests, the audit and the
red-team check.
"""

from __future__ import annotations

import numpy as np

from .ledger import PrivacyLedger
from .symmetric import upper


class ReplayLedger(PrivacyLedger):
    """Records the exact value and declared sensitivity of every Gaussian release. Without
    ``replay`` it releases as a seeded ledger; with ``replay`` (the ledger of the run on D) it
    returns that run's noised output of the same release instead. ``budget``: (epsilon, delta)
    as a run's own ledger has it, so that the noise-aware defaults (which read the budget after
    the user count's release, e.g. to choose the bias stage) choose as in that run; without it
    they keep the config as given."""

    def __init__(
        self, replay: "ReplayLedger | None" = None, seed: int = 2024, budget: tuple[float, float] | None = None
    ):
        accountant = None
        if budget is not None:
            from .accounting import BestOfAccountant

            accountant = BestOfAccountant()
        super().__init__(seed=seed, budget=budget, accountant=accountant)
        self.replay = replay
        self.exact: list[tuple[str, np.ndarray, float, bool]] = []
        self.noised: list[np.ndarray] = []

    def gaussian(self, name, value, *, sensitivity, noise_multiplier, symmetric=False, sampling_rate=None, groups=1):
        i = len(self.exact)
        self.exact.append((name, np.array(value, dtype=np.float64), float(sensitivity), bool(symmetric)))
        if self.replay is None:
            out = super().gaussian(
                name,
                value,
                sensitivity=sensitivity,
                noise_multiplier=noise_multiplier,
                symmetric=symmetric,
                sampling_rate=sampling_rate,
                groups=groups,
            )
        else:
            if i >= len(self.replay.exact) or self.replay.exact[i][0] != name:
                raise AssertionError(f"release {i}: {name!r} on D' does not match the run on D")
            out = self.replay.noised[i].copy()
        self.noised.append(np.array(out, copy=True))
        return out


def influence(on_d: ReplayLedger, on_d_prime: ReplayLedger) -> dict[str, float]:
    """Per release name: the largest ||exact(D) - exact(D')|| / declared sensitivity."""
    names, names_prime = [e[0] for e in on_d.exact], [e[0] for e in on_d_prime.exact]
    if names != names_prime:
        raise AssertionError(f"the runs made different releases: {names} vs {names_prime}")
    out: dict[str, float] = {}
    for (name, a, sens, sym), (_, b, sens_b, _) in zip(on_d.exact, on_d_prime.exact, strict=True):
        if sens != sens_b or a.shape != b.shape:
            raise AssertionError(f"{name}: declared sensitivity or shape differs between the runs")
        diff = upper(a - b) if sym else a - b
        out[name] = max(out.get(name, 0.0), float(np.linalg.norm(diff)) / sens)
    return out
