"""A fault-injecting ClientApp for resilience tests and benchmarks: it wraps the real handlers
and, for a fraction of messages, raises, stalls past the round timeout, or replies with garbage
(non-finite values, values over the declared bound, malformed records). The server must
complete the run, log every rejected reply, and keep the ledger complete."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from ..flower import client_app as real

GARBAGE = ("nan", "huge", "malformed")


def _garble(reply: Message, kind: str) -> Message:
    content = reply.content
    if kind == "malformed" or "contrib" not in content.array_records:
        return _malformed(reply)
    rec = content.array_records["contrib"]
    key = "b" if "b" in rec else "values"
    x = rec[key].numpy().copy()
    if x.size:
        x.flat[0] = np.nan if kind == "nan" else 1e12
    rec[key] = Array(x)
    return reply


def _malformed(reply: Message) -> Message:
    reply.content.array_records.clear()
    reply.content.array_records["contrib"] = ArrayRecord({"junk": Array(np.zeros((2, 2, 2)))})
    return reply


class _Wrapping:
    """Registers each handler on ``app`` wrapped by ``wrap`` (the ClientApp decorator interface)."""

    def __init__(self, app: ClientApp, wrap):
        self.app, self.wrap = app, wrap

    def query(self, *args, **kwargs):
        return lambda handler: self.app.query(*args, **kwargs)(self.wrap(handler))

    def train(self, *args, **kwargs):
        return lambda handler: self.app.train(*args, **kwargs)(self.wrap(handler))

    def evaluate(self, *args, **kwargs):
        return lambda handler: self.app.evaluate(*args, **kwargs)(self.wrap(handler))


def make_chaos_app(
    fault_rate: float, *, modes=("raise", "timeout", "garbage"), stall_seconds: float = 12.0
) -> ClientApp:
    """A ClientApp where each message fails with probability ``fault_rate`` in one of ``modes``."""
    app = ClientApp()

    def wrap(handler):
        def run(msg: Message, context: Context) -> Message:
            rng = random.Random(msg.metadata.message_id)
            if rng.random() >= fault_rate:
                return handler(msg, context)
            mode = rng.choice(modes)
            if mode == "raise":
                raise RuntimeError("chaos: injected client failure")
            if mode == "timeout":
                time.sleep(stall_seconds)
                return handler(msg, context)
            return _garble(handler(msg, context), rng.choice(GARBAGE))

        return run

    real.register_handlers(_Wrapping(app, wrap))  # every handler of the real app, each wrapped
    return app


def kill_when(seen: Callable[[], bool], kill: Callable[[], object], interval: float = 0.1):
    """Fault injection from outside: call ``kill()`` (end a process, a container) as soon as
    ``seen()`` is true (a marker in its log), polling every ``interval`` seconds in a daemon
    thread. Returns (killed, done, thread): set ``done`` and join ``thread`` when the run is over."""
    killed, done = threading.Event(), threading.Event()

    def watch():
        while not done.is_set():
            if seen():
                kill()
                killed.set()
                return
            time.sleep(interval)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return killed, done, thread
