"""Clean stops: SIGINT, SIGTERM and SIGHUP become one exception, :class:`Stopped`, raised in the
main thread, so that every ``finally`` on the way out runs (child processes stopped, temporary
folders removed) before the command exits ``128 + n`` with one line.

Python's own defaults differ per signal: SIGINT raises ``KeyboardInterrupt`` (a traceback
unless caught), SIGTERM and SIGHUP end the process at once, without running any ``finally``:
a run stopped by ``timeout``, by a CI cancellation or by a closed terminal would leave its
processes and its temporary copies of the data behind. :func:`stop_signals` installs one
handler for all three for the duration of a command:

    with stop_signals():
        ...  # a signal raises Stopped(signum) here

The first signal raises :class:`Stopped`; the handlers then ignore the same signals while the
``finally`` blocks clean up (a second Ctrl-C does not cut the clean-up short). ``Stopped`` is a
``BaseException``, like ``KeyboardInterrupt``: an ``except Exception`` on the way does not
swallow it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


class Stopped(BaseException):
    """A stop signal arrived: ``signum`` is the signal, :attr:`exit_code` is ``128 + signum``."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"stopped by {signal_name(self.signum)}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _ignore_stop_signals() -> None:
    for s in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Stopped` in this (main) thread while the
    block runs; the previous handlers come back afterwards. Outside the main thread (where
    Python cannot install handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def handler(signum, frame):
        _ignore_stop_signals()  # the clean-up runs to its end
        raise Stopped(signum)

    for s in STOP_SIGNALS:
        if previous[s] is signal.SIG_IGN and s != signal.SIGINT:  # e.g. nohup: SIGHUP stays ignored
            continue
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(s, h if h is not None else signal.SIG_DFL)
