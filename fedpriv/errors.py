"""Error types shared by the package.

Every error raised on bad user input is a :class:`FedprivError`; the CLI turns it into a
one-line message on stderr and a non-zero exit code, without writing any output file.
"""

from __future__ import annotations


class FedprivError(Exception):
    """Base class for errors caused by bad input or configuration."""


class DataError(FedprivError, ValueError):
    """Bad input data: names the file and (when known) the 1-based line number."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f":{line}"
            where += ": "
        super().__init__(where + message)


class ConfigError(FedprivError, ValueError):
    """Bad configuration value: names the field."""

    def __init__(self, message: str, *, field: str | None = None):
        self.field = field
        super().__init__((f"{field}: " if field else "") + message)


class PrivacyError(FedprivError, RuntimeError):
    """A privacy invariant would be violated (unaccounted release, bound exceeded, ...)."""
