"""The algorithms: pure client / aggregator / server functions. Importing the package registers
every rating algorithm (:mod:`fedpriv.algorithms.registry`); an algorithm in a module of its own
is listed here."""

from . import dpals_uniform  # noqa: F401 - registers itself
