"""Neighbouring data sets as a user sees them: D and D' = D minus one user, both written in the
ML-100K layout and read back through the real loader (so every user after the removed one is
renumbered), split by the real split and trained by the real engine.

Only the secret randomness is fixed (one reproducible :class:`RunSecrets` for both runs: the
same noise seed means every remaining user makes the same random choices, keyed by its raw id).
The D' run replays the noised outputs of the D run (:class:`ReplayLedger`), so both runs see the
same public state at every release: the difference of the two exact (pre-noise) sums is then the
removed user's whole influence on that release, which must stay within the sensitivity the
aggregator declared, for every release of the run.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import als_config
from neighbour_data import neighbouring_ml100k, synthetic_ratings

from fedpriv.algorithms import als, pam, registry
from fedpriv.data.personal import make_personal
from fedpriv.data.splits import random_split
from fedpriv.engine.inprocess import train_inprocess
from fedpriv.engine.blocks import train_blocks
from fedpriv.privacy.neighbours import ReplayLedger, influence
from fedpriv.privacy.randomness import RunSecrets

TOL = 1 + 1e-5
ALGORITHMS = ("adadpals", "dpals-uniform", "dpals-tail", "dpsgd", "am-ssp", "am-dpsgd")


@pytest.fixture(scope="module")
def raw():
    # 80 users with raw ids 1000, 1007, ...; items 1..40 rated, a catalogue of 45 (5 never rated)
    return synthetic_ratings(80, 40, 1400, seed=3)


def _neighbours(tmp_path, raw, remove_user):
    users, items, ratings = raw
    return neighbouring_ml100k(tmp_path, users, items, ratings, np.arange(1, 46), remove_user)


def _removable(raw) -> list[int]:
    """The user with the most ratings and a user in the middle of the id order."""
    users = raw[0]
    ids, counts = np.unique(users, return_counts=True)
    return [int(ids[np.argmax(counts)]), int(ids[len(ids) // 2])]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_removing_a_renumbered_user_moves_each_release_within_its_sensitivity(tmp_path, raw, algorithm):
    cfg = als_config(algorithm, rank=3, steps=2, k=8, sgd_sampling_rate=0.5, ssp_steps=3, init_scale=1.0)
    worst = {}
    for n, user in enumerate(_removable(raw)):
        d, d_prime = _neighbours(tmp_path / str(n), raw, user)
        assert d.interactions.n_users == d_prime.interactions.n_users + 1  # renumbered
        assert d.interactions.n_items == d_prime.interactions.n_items == 45  # the public catalogue
        train, train_prime = random_split(d.interactions).train, random_split(d_prime.interactions).train
        common = dict(rating_range=(1.0, 5.0), epsilon=2.0, progress=False, users_per_shard=16)
        if registry.get(algorithm).encoder:
            common["item_features"] = d.item_features
        on_d = ReplayLedger()
        train_inprocess(algorithm, train, cfg, secrets=RunSecrets(77), ledger=on_d, **common)
        if registry.get(algorithm).encoder:
            common["item_features"] = d_prime.item_features
        on_d_prime = ReplayLedger(replay=on_d)
        train_inprocess(algorithm, train_prime, cfg, secrets=RunSecrets(77), ledger=on_d_prime, **common)
        planned = {p.name for p in als.plan_releases(algorithm, cfg, False)}
        moved = influence(on_d, on_d_prime)
        assert set(moved) == planned
        for name, ratio in moved.items():
            assert ratio <= TOL, f"{algorithm}: removing user {user} moves {name} by {ratio:.3f} x its sensitivity"
            worst[name] = max(worst.get(name, 0.0), ratio)
    # the removed users do move the releases (the check is not vacuous); the user count by its whole sensitivity
    assert worst.get("users", 1.0) == pytest.approx(1.0)
    sampled = {p.name for p in als.plan_releases(algorithm, cfg, False) if p.sampling_rate is not None}
    assert all(v > 0.01 for k, v in worst.items() if k not in sampled), worst


@pytest.mark.parametrize("schedule", ["full", "disjoint"])
def test_pam_removing_a_user_moves_each_release_within_its_sensitivity(schedule):
    data = make_personal(300, 8, 6, 2, 0.01, seed=5)
    cfg = pam.PAMConfig(schedule=schedule, epochs=3)
    for index in (0, 150, 299):
        on_d = ReplayLedger()
        train_blocks(pam.FAMILY, "pam", data, cfg, epsilon=2.0, delta=1e-6, users_per_shard=64, secrets=RunSecrets(5), ledger=on_d)
        on_d_prime = ReplayLedger(replay=on_d)
        train_blocks(pam.FAMILY, "pam", data.without(index), cfg, epsilon=2.0, delta=1e-6, users_per_shard=64, secrets=RunSecrets(5), ledger=on_d_prime)
        moved = influence(on_d, on_d_prime)
        assert set(moved) == {"init_M", "am_A", "am_b"}
        assert all(r <= TOL for r in moved.values()), moved
        if schedule == "disjoint":
            # the user sits in exactly one group: only that step's statistics move (parallel composition)
            steps = [np.linalg.norm(a[1] - b[1]) for a, b in zip(on_d.exact, on_d_prime.exact) if a[0] == "am_A"]
            # (the others differ by rounding only: removing a user shifts the blocks that sum them)
            assert sum(s > 1e-9 * max(steps) for s in steps) <= 1, steps


def test_user_choices_do_not_move_when_another_user_leaves():
    """The users' secret choices (pam's group) are keyed by raw ids: removing one user and
    renumbering the rest leaves every other user's group as it was."""
    from fedpriv.algorithms.pam import user_groups
    from fedpriv.privacy.randomness import user_keys

    data = make_personal(1000, 4, 3, 1, 0.01, seed=1)
    key = RunSecrets(3).client_key()
    before = user_groups(user_keys(key, data.user_ids), 5)
    after = user_groups(user_keys(key, data.without(17).user_ids), 5)
    assert np.array_equal(np.delete(before, 17), after)


# the private bias model and the bias stage (the noise-aware defaults' usual choice): every
# release, the stage's "bias" release (per item: sum of weights, sum of clipped residuals) included
BIAS_RUNS = {
    "bias": ("bias", lambda: als.ALSConfig.from_overrides({}, "bias")),
    "adadpals+bias_stage": ("adadpals", lambda: als.ALSConfig(rank=3, steps=2, init_scale=1.0, bias_stage=True)),
    "dpals-uniform+bias_stage": ("dpals-uniform", lambda: als.ALSConfig(rank=3, steps=2, k=8, init_scale=1.0, bias_stage=True)),
    # the noise-aware defaults on this small set: the bias model alone (rank 0, no steps)
    "adadpals-noise-aware": ("adadpals", lambda: als.ALSConfig.from_overrides({}, "adadpals")),
}


@pytest.mark.parametrize("run", list(BIAS_RUNS))
def test_removing_a_renumbered_user_moves_the_bias_releases_within_their_sensitivity(tmp_path, raw, run):
    algorithm, make_cfg = BIAS_RUNS[run]
    worst = {}
    for n, user in enumerate(_removable(raw)):
        d, d_prime = _neighbours(tmp_path / str(n), raw, user)
        common = dict(rating_range=(1.0, 5.0), epsilon=2.0, progress=False, users_per_shard=16)
        # with the run's budget, as its own ledger: the noise-aware rule chooses as in a real run
        on_d = ReplayLedger(budget=(2.0, 1e-5))
        res = train_inprocess(algorithm, random_split(d.interactions).train, make_cfg(), secrets=RunSecrets(77), ledger=on_d, **common)
        on_d_prime = ReplayLedger(replay=on_d, budget=(2.0, 1e-5))  # D' replays D's released count: the rule chooses the same plan
        res_prime = train_inprocess(algorithm, random_split(d_prime.interactions).train, make_cfg(), secrets=RunSecrets(77), ledger=on_d_prime, **common)
        cfg = res.state.config
        assert res_prime.state.config == cfg
        planned = {p.name for p in als.plan_releases(algorithm, cfg, False)}
        moved = influence(on_d, on_d_prime)
        assert set(moved) == planned
        for name, ratio in moved.items():
            assert ratio <= TOL, f"{run}: removing user {user} moves {name} by {ratio:.3f} x its sensitivity"
            worst[name] = max(worst.get(name, 0.0), ratio)
    if algorithm == "bias":  # the bias model's step: rank-0 item statistics (kappa alone)
        assert cfg.rank == 0 and {"item_stats_A", "item_stats_b"} <= set(worst) and "bias" not in worst
    else:
        assert cfg.bias_stage and "bias" in worst
    if run == "adadpals-noise-aware":
        assert (cfg.rank, cfg.steps) == (0, 0) and set(worst) == {"users", "mean", "bias"}
    assert all(v > 0.01 for v in worst.values()), worst
