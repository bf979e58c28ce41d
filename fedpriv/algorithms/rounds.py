"""The one protocol the training loop (:func:`fedpriv.engine.loop.train_rounds`) drives, for
every family: the rating algorithms (ALS family, the bias model, the encoder family, DP-SGD) and
DP model personalization (pam and its baselines).

A run is a sequence of *rounds*, each named by a *kind*: first the setup rounds (the rating
family's user count, mean, item counts and bias stage; pam's private initialization), then one
round per step (``step_kind``), over all users or one disjoint group. For every round the
family declares:

- ``release(kind, sums, state, ledger)``: the noised release of the clients' exact sums, drawn
  through the ledger (central mode) or taken from a secure sum (:class:`~fedpriv.privacy.
  distributed.Prereleased`); the only place a family touches noise;
- ``secure_parts(kind, state)``: the parts of the round (release name, words, sensitivity, noise
  multiplier), from which a secure round is planned and each node's words encoded, and
  ``declared_parts(kind, state)``: the same parts as :class:`~fedpriv.algorithms.steps.Part`
  (name, place in ``sums``, shape), by which the decoded words become ``release``'s sums;
- ``take(kind, value, state, ledger)`` after a setup round, ``server_setup`` once, and
  ``server_step`` after each step: post-processing on the server.

The transports (one per engine and family's data: rating shards or personal sample blocks)
return a round's exact sums (central) or its securely summed words (secure); the aggregator
objects of :mod:`fedpriv.engine.loop` decide which. A new family implements this protocol; a
new algorithm of the rating family registers an :class:`~fedpriv.algorithms.registry.
AlgorithmSpec` (its own step object, releases and options) and needs none of this.
"""

from __future__ import annotations

from collections.abc import Iterator

from . import als, defaults, protocol, secure


class RatingRounds:
    """The rating algorithms' rounds (the releases of :mod:`fedpriv.algorithms.als` and the
    registered alternating step)."""

    name = "rating"

    def setup_kinds(self, state: als.PublicState) -> Iterator[str]:
        """The setup rounds, in order; read lazily (the noise-aware rule, applied once the user
        count is released, decides whether the counts and the bias stage follow)."""
        alg = state.algorithm
        if state.private and als.needs_user_count(alg, state.config):
            yield "users"
        if als.needs_mean(alg, state.implicit):
            yield "mean"
        if als.needs_counts(alg, state.config):
            yield "counts"
        if als.has_bias_stage(alg, state.config):
            yield "bias"

    def take(self, kind: str, value, state: als.PublicState, ledger) -> None:
        if kind == "users":
            state.n_users = value
            if state.config.defaults == "noise-aware":
                # the rule reads the released count (post-processing) and the rest of the plan
                # is calibrated for its choice, the count's release composed as it was made
                defaults.apply(state, ledger)
        elif kind == "mean":
            state.mean = value
        elif kind == "counts":
            state.counts_hat = value
        elif kind == "bias":
            state.item_bias = value

    def server_setup(self, state: als.PublicState, features):
        return protocol.server_setup(state, features)

    def n_steps(self, state: als.PublicState) -> int:
        return state.spec.steps_of(state.config)

    def step_kind(self, state: als.PublicState) -> str:
        return "step"

    def group(self, state: als.PublicState, step: int) -> int | None:
        return None

    def groups(self, state: als.PublicState) -> int:
        return 1

    def release(self, kind: str, sums: tuple, state: als.PublicState, ledger):
        if kind == "step":
            return state.spec.alternating_step().release(tuple(sums), state, ledger)
        return als.PRE_RELEASE_FUNCTIONS[kind](sums[0], state, ledger)

    def server_step(self, release, state: als.PublicState, server) -> None:
        protocol.server_step(release, state, server)

    def check_secure(self, state: als.PublicState) -> None:
        secure.check_secure(state)

    def secure_parts(self, kind: str, state: als.PublicState) -> list[tuple[str, int, float, float]]:
        return secure.round_parts(kind, state)

    def declared_parts(self, kind: str, state: als.PublicState) -> list:
        return secure.declared(kind, state)


RATING = RatingRounds()


def rounds_of(state):
    """The rounds of the family whose public state this is (:func:`fedpriv.algorithms.families.family_of`)."""
    from .families import family_of

    return family_of(state.algorithm).rounds
