"""The registration a node process runs for the test's own family (tests/toy_family.py): named
by ``FEDPRIV_FAMILIES``, it is imported by the node's catalogue of families."""

from toy_family import register

register()
