"""Which algorithms are private: the one rule every entry point (run, the Flower launcher and
ServerApp, deployments, experiment configs) asks."""

from __future__ import annotations


def is_private(algorithm: str) -> bool:
    """True for the algorithms that release only through the ledger (they need an epsilon)."""
    from ..errors import ConfigError
    from .families import family_of

    try:
        family = family_of(algorithm)
    except ConfigError:
        return True  # an unknown name: the run refuses it later, naming the known ones
    return family.private(algorithm)
