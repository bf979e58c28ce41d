"""The in-process Grid of the ServerApp loop tests (:class:`fedpriv.flower.local_grid.LocalGrid`)."""

from fedpriv.flower.local_grid import LocalGrid as FakeGrid

__all__ = ["FakeGrid"]
