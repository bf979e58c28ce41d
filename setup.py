"""Everything is in pyproject.toml; this file only refuses an unsupported Python by name, before
pip resolves any dependency (pip does not check the project's own requires-python first)."""

import sys

if not (3, 11) <= sys.version_info[:2] <= (3, 13):
    sys.exit(f"fedpriv needs Python 3.11, 3.12 or 3.13 (pyproject.toml requires-python); this is Python {sys.version.split()[0]}")

from setuptools import setup  # noqa: E402

setup()
