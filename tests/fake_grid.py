"""The in-process Grid of the ServerApp loop tests (:class:`fedpriv.testing.local_grid.LocalGrid`)."""

from fedpriv.testing.local_grid import LocalGrid as FakeGrid

__all__ = ["FakeGrid"]
