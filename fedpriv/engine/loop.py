"""The one training loop of every family (the rating algorithms and DP model personalization),
for both engines and both aggregation modes.

The round order is written here once: the setup rounds (the rating family's user count, mean,
item counts and bias stage; pam's private initialization), the server's setup, then one round
per step: clients' contributions, the aggregator's release, the server's step. What differs is
passed in:

- the algorithm's family says which rounds to run and what each releases
  (:mod:`fedpriv.algorithms.rounds`: the rating algorithms and DP model personalization);
- a *transport* brings the clients' contributions: :class:`fedpriv.engine.inprocess.ShardTransport` calls
  the client functions on in-process user shards; the Flower ServerApp's transport
  (:mod:`fedpriv.flower.server_app`) sends messages over a Grid (Ray simulation, gRPC
  deployment or the in-process LocalGrid) and validates every reply;
- an *aggregator* sums and noises the declared releases: :class:`CentralAggregator` (the
  trusted aggregator: the only code that sees exact sums; it adds the noise through the ledger);
- *hooks* for what the engine does around the steps (checkpoints, measurement curves, progress).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from ..algorithms import als, recommend
from ..algorithms.rounds import rounds_of
from ..privacy import distributed
from ..errors import PrivacyError
from ..privacy.ledger import PrivacyLedger


class Transport(Protocol):
    """How the loop reaches the clients (one transport per engine and kind of client data:
    rating shards, personal sample blocks)."""

    def sums(self, kind: str, state, step: int = 0, group: int | None = None) -> tuple:
        """Central mode: the exact sums of the clients' clipped contributions to round ``kind``
        (the users of ``group`` only, when given), each reply checked by the transport, in the
        order of the round's parts."""

    def start(self, state, server) -> None:
        """Called once the server is set up (or restored), before the first step."""

    def prepare(self, step: int) -> None:
        """Called before each step's release (e.g. to take in nodes that rejoined)."""

    def population(self) -> tuple[int, int]:
        """(nodes asked, a public bound on their users): what a secure round is planned for."""

    def secure_sum(
        self, kind: str, plan, state, step: int, group: int | None = None
    ) -> tuple[Callable[[], np.ndarray], int]:
        """Secure mode: (unmask, contributors) for the round ``kind``: ``unmask()`` reveals the
        modular sum of the contributors' words (each node's quantized sums plus its noise
        share); it is called only after the ledger's budget check."""


class RatingTransport:
    """The central-mode sums of the rating algorithms' rounds, from a transport's ``vector``
    (a setup release's summed vector) and ``step`` (the clients' step contributions, which the
    algorithm's step sums)."""

    def vector(self, kind: str, length: int, state: als.PublicState) -> np.ndarray:
        """The clients' summed vector of the pre-processing release ``kind``."""
        raise NotImplementedError

    def step(self, state: als.PublicState, step: int) -> list:
        """The clients' contributions to alternating step ``step``."""
        raise NotImplementedError

    def sums(self, kind: str, state: als.PublicState, step: int = 0, group: int | None = None) -> tuple:
        if kind == "step":
            return state.spec.alternating_step().sums(self.step(state, step), state)
        return (self.vector(kind, als.pre_release_length(kind, state), state),)


class CentralAggregator:
    """Central mode: sums the clients' contributions and noises each declared release once,
    through the ledger, by the family's release function
    (:meth:`fedpriv.algorithms.rounds.RatingRounds.release`): the only code that sees exact sums."""

    def __init__(self, ledger: PrivacyLedger | None):
        self.ledger = ledger
        self.client_seconds = 0.0

    def run(self, kind: str, transport: Transport, state, step: int = 0, group: int | None = None):
        """One round: the transport's exact sums, released through the ledger."""
        t = time.perf_counter()
        sums = transport.sums(kind, state, step, group)
        self.client_seconds = time.perf_counter() - t
        return rounds_of(state).release(kind, sums, state, self.ledger)


class SecureAggregator:
    """Secure mode: every round is a secure sum of the nodes' quantized words, each carrying the
    node's Skellam noise share; the transport reveals only the modular sum (secure summation
    over Flower, or its arithmetic simulated in process), the ledger checks the budget and
    records each part before it is decoded. No code here sees an exact sum."""

    def __init__(self, ledger: PrivacyLedger | None, dropout: float = 0.0, colluders: int = 1):
        self.ledger, self.dropout, self.colluders = ledger, dropout, colluders
        self.client_seconds = 0.0

    def run(self, kind: str, transport, state, step: int = 0, group: int | None = None):
        family = rounds_of(state)
        family.check_secure(state)
        n_nodes, max_users = transport.population()

        def gather(plan):
            t = time.perf_counter()
            out = (
                transport.secure_sum(kind, plan, state, step)
                if group is None
                else transport.secure_sum(kind, plan, state, step, group)
            )
            self.client_seconds = time.perf_counter() - t
            return out

        # the budget check comes first; only then is the sum unmasked, decoded and recorded
        values, proxy = distributed.secure_round(
            self.ledger,
            family.secure_parts(kind, state),
            n_nodes=n_nodes,
            max_users=max_users,
            dropout=self.dropout,
            colluders=self.colluders,
            secure_sum=gather,
            groups=family.groups(state) if group is not None else 1,
        )
        # post-processing: the family's own release function, given the decoded (already noised)
        # sums through the stand-in ledger, which checks each part against the plan
        parts = family.declared_parts(kind, state)
        sums = [None] * (max(p.index for p in parts) + 1)
        for p in parts:
            sums[p.index] = p.unflatten(values[p.name])
        out = family.release(kind, tuple(sums), state, proxy)
        missing = {p.name for p in parts} - proxy.used
        if missing:
            raise PrivacyError(f"secure round {kind!r}: parts {sorted(missing)} were decoded but not released")
        return out


def make_aggregator(cfg, ledger: PrivacyLedger | None):
    """The aggregator of the engine options ``cfg.engine``."""
    if cfg.aggregation.secure:
        return SecureAggregator(ledger, cfg.aggregation.dropout, cfg.aggregation.collusion)
    return CentralAggregator(ledger)


@dataclass
class Hooks:
    """Optional callbacks around the loop: ``after_setup(state, server)`` once the
    setup releases are made, ``before_step(step)`` before each step's release,
    ``after_step(step, state, server, seconds)`` after it (returns True to stop there)."""

    after_setup: Callable | None = None
    before_step: Callable | None = None
    after_step: Callable | None = None
    timings: list = field(default_factory=list)  # per step: client, aggregate and server seconds


def step_seconds(timings: list[dict]) -> list[dict]:
    """Per step, its whole time (clients, aggregation and server), from :attr:`Hooks.timings`."""
    return [{"seconds": t["client_seconds"] + t["aggregate_seconds"] + t["server_seconds"]} for t in timings]


def train_rounds(
    transport: Transport,
    aggregator: CentralAggregator | SecureAggregator,
    state,
    *,
    item_features=None,
    server=None,
    first_step: int = 0,
    resumed: bool = False,
    hooks: Hooks | None = None,
    progress=None,
):
    """Run any family's rounds (:mod:`fedpriv.algorithms.rounds`): the setup releases, the
    server's setup, then one release and server step per step. Returns the server (the encoder
    server of the encoder family, else None). ``resumed``: the state, ledger and server come
    from a checkpoint taken after step ``first_step`` (the setup releases are not made again).
    ``progress``: wraps the step range (e.g. tqdm)."""
    hooks = hooks or Hooks()
    family = rounds_of(state)
    if isinstance(aggregator, SecureAggregator):
        family.check_secure(state)
    t0 = time.perf_counter()
    if not resumed:
        for kind in family.setup_kinds(state):
            family.take(kind, aggregator.run(kind, transport, state), state, aggregator.ledger)
        server = family.server_setup(state, item_features)
        if hooks.after_setup is not None:
            hooks.after_setup(state, server)
    transport.start(state, server)
    kind = family.step_kind(state)
    steps = range(first_step, family.n_steps(state))
    for step in progress(steps) if progress is not None else steps:
        transport.prepare(step)
        if hooks.before_step is not None:
            hooks.before_step(step)
        ts = time.perf_counter()
        release = aggregator.run(kind, transport, state, step, family.group(state, step))
        ta = time.perf_counter()
        family.server_step(release, state, server)
        release = None  # on a device, its memory is free for the next step's statistics
        te = time.perf_counter()
        client = aggregator.client_seconds
        hooks.timings.append(
            {"client_seconds": client, "aggregate_seconds": ta - ts - client, "server_seconds": te - ta}
        )
        if hooks.after_step is not None and hooks.after_step(step, state, server, te - t0):
            break
    return server


# ---------------------------------------------------------------------------- recommendation
class RecommendTransport(Protocol):
    """How the recommendation rounds reach the clients."""

    def histogram(self, state: als.PublicState, candidates: np.ndarray, cfg) -> np.ndarray:
        """The summed (candidates x bins) score histograms, each checked by the transport."""

    def reports(
        self, state: als.PublicState, candidates: np.ndarray, lo: np.ndarray, hi: np.ndarray, cfg, secure: bool = False
    ):
        """Yields (client key, users, picks, ledger records, evaluation sums) per client; with
        ``secure`` the sums stay with the clients (None) until :meth:`measure_eval`."""

    def measure_eval(self, parts: list[tuple[str, int]]) -> dict[str, np.ndarray]:
        """Secure mode: the clients' evaluation sums, totalled by a secure measurement sum."""

    def reject(self, key, reason: str) -> None:
        """A client's report failed the checks."""


def recommend_rounds(
    transport: RecommendTransport, state: als.PublicState, cfg, ledger: PrivacyLedger
) -> tuple[dict, dict]:
    """The private recommendation after training (:mod:`fedpriv.algorithms.recommend`), for both
    engines: per-candidate ranges (a private histogram, or public), then one private pick per
    user on every client; each client's report and ledger records are checked before they are
    merged (through the ledger's budget check). Returns (summary, {client key: reported items})."""
    cfg.validate()
    candidates = recommend.candidate_items(state, cfg.candidates)
    if cfg.sensitivity == "quantile" and state.config.aggregation.secure:
        lo, hi = _secure_ranges(transport, state, candidates, cfg, ledger)
    elif cfg.sensitivity == "quantile":
        lo, hi = recommend.release_ranges(
            transport.histogram(state, candidates, cfg), state, cfg, ledger, ledger.relation
        )
    else:
        lo, hi = recommend.public_ranges(state, candidates, cfg)
    sums, reports = None, {}
    secure_eval = state.config.aggregation.secure  # the server sees no client's own evaluation sums
    for key, n_users, picks, records, part in transport.reports(state, candidates, lo, hi, cfg, secure_eval):
        try:
            rels = recommend.check_report(picks, records, None if secure_eval else part, n_users, len(candidates), cfg)
        except (KeyError, ValueError, TypeError) as exc:  # RejectedReport is a ValueError
            transport.reject(key, f"recommendation reply rejected: {exc}")
            continue
        recommend.merge_records(ledger, rels)
        if not secure_eval:
            sums = recommend.add_sums(sums, part)
        reports[key] = candidates[np.asarray(picks, dtype=np.int64)]
    if secure_eval and reports:
        sums = transport.measure_eval(recommend.eval_parts())
    return recommend.summarize(sums, lo, hi), reports


def _secure_ranges(transport, state: als.PublicState, candidates: np.ndarray, cfg, ledger: PrivacyLedger):
    """Secure mode's score histogram: each node's (candidates x bins) counts, quantized with its
    Skellam share and securely summed; the ledger checks the budget before the sum is unmasked;
    the ranges are read off the noised sum by the same release function (post-processing)."""
    k = len(candidates)
    n_nodes, max_users = transport.population()
    z = recommend.hist_multiplier(cfg, integer_orders=True, relation=ledger.relation)
    parts = [(recommend.HIST_RELEASE, k * cfg.bins, float(np.sqrt(k)), z)]
    values, proxy = distributed.secure_round(
        ledger,
        parts,
        n_nodes=n_nodes,
        max_users=max_users,
        dropout=state.config.aggregation.dropout,
        colluders=state.config.aggregation.collusion,
        secure_sum=lambda plan: transport.secure_histogram(plan, state, candidates, cfg),
    )
    return recommend.release_ranges(
        values[recommend.HIST_RELEASE].reshape(k, cfg.bins), state, cfg, proxy, ledger.relation
    )
