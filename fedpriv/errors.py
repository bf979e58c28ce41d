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
        self.reason = message
        super().__init__((f"{field}: " if field else "") + message)

    def renamed(self, names: dict[str, str]) -> ConfigError:
        """The same error naming ``names[field]`` instead (a flag at the command line, the
        keyword in Python); itself when the field has no other name."""
        if self.field not in names:
            return self
        return ConfigError(self.reason, field=names[self.field])


def did_you_mean(name, known) -> str:
    """ "; did you mean 'x'?" naming the closest of ``known`` to ``name`` (nothing when none is close)."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class PrivacyError(FedprivError, RuntimeError):
    """A privacy invariant would be violated (unaccounted release, bound exceeded, ...)."""


class FedprivWarning(UserWarning):
    """A choice that runs but is probably not what was meant (a trivial node layout, an epsilon
    that protects nothing); the CLI prints it as one ``fedpriv: warning:`` line."""
