"""Which algorithms are private: the one rule every entry point (run, the Flower launcher and
ServerApp, deployments, experiment configs) asks."""

from __future__ import annotations


def is_private(algorithm: str) -> bool:
    """True for the algorithms that release only through the ledger (they need an epsilon)."""
    from . import pam, registry  # light: numpy and the privacy core; the specs

    if algorithm in pam.PAM_ALGORITHMS:
        return algorithm in pam.PRIVATE
    if algorithm in registry.names():
        return registry.get(algorithm).private
    return True  # an unknown name: the run refuses it later, naming the known ones
