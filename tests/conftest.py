from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not present at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def small_mf():
    from fedpriv.data.synthetic import make_mf

    return make_mf(300, 120, 6000, rank=3, seed=3)


def adversarial_interactions(rng, n_users: int, n_items: int, n_background: int, n_ratings: int, rating: float):
    """``n_background`` random in-range ratings by users 0..n_users-2, plus the last user rating
    ``n_ratings`` distinct items with ``rating`` (duplicate pairs keep the last)."""
    from fedpriv.data.interactions import Interactions

    users = rng.integers(0, n_users - 1, n_background)
    items = rng.integers(0, n_items, n_background)
    vals = rng.uniform(1, 5, n_background)
    adv = rng.choice(n_items, size=n_ratings, replace=False)
    users = np.concatenate([users, np.full(n_ratings, n_users - 1)])
    items = np.concatenate([items, adv])
    vals = np.concatenate([vals, np.full(n_ratings, rating)])
    key = users * n_items + items
    _, first = np.unique(key[::-1], return_index=True)
    keep = np.sort(len(key) - 1 - first)
    return Interactions(users[keep], items[keep], vals[keep], n_users, n_items)


# ---------------------------------------------------------------- noise-draw guards
NOISE_DRAWS = (
    "normal", "standard_normal", "multivariate_normal", "multivariate_hypergeometric", "laplace", "exponential",
    "standard_exponential", "gumbel", "logseries", "negative_binomial", "geometric",
)
ALL_DRAWS = NOISE_DRAWS + (
    "random", "integers", "choice", "uniform", "beta", "binomial", "poisson", "gamma", "standard_gamma",
    "permutation", "shuffle", "permuted",
)


def install_rng_guard(monkeypatch, methods, legacy, *, torch_guard: bool) -> list[str]:
    """Swap numpy's Generator (and default_rng) for a subclass whose ``methods`` fail outside a
    ledger draw or a declared public draw; the ``legacy`` global np.random functions fail
    outright; with ``torch_guard`` torch's Gaussian samplers are guarded too. Returns the list of
    offending draws (also raised as AssertionError where they happen)."""
    from fedpriv.privacy import ledger as ledger_mod

    offenders: list[str] = []
    real_generator = np.random.Generator

    def _guard(name):
        def method(self, *a, **k):
            if ledger_mod.drawing_context() is None:
                offenders.append(name)
                raise AssertionError(f"draw Generator.{name} outside the privacy ledger")
            return getattr(real_generator, name)(self, *a, **k)

        return method

    guarded = type("GuardedGenerator", (real_generator,), {n: _guard(n) for n in methods if hasattr(real_generator, n)})
    real_default_rng = np.random.default_rng
    monkeypatch.setattr(np.random, "Generator", guarded)
    monkeypatch.setattr(np.random, "default_rng", lambda seed=None: guarded(real_default_rng(seed).bit_generator))

    def _legacy(*a, **k):
        raise AssertionError("legacy global np.random draw")

    for name in legacy:
        monkeypatch.setattr(np.random, name, _legacy)
    if torch_guard:
        import torch

        def _torch_guard(name, real):
            def fn(*a, **k):
                if ledger_mod.drawing_context() is None:
                    offenders.append(f"torch.{name}")
                    raise AssertionError(f"Gaussian draw torch.{name} outside the privacy ledger")
                return real(*a, **k)

            return fn

        for name in ("randn", "randn_like", "normal"):
            monkeypatch.setattr(torch, name, _torch_guard(name, getattr(torch, name)))
        monkeypatch.setattr(torch.Tensor, "normal_", _torch_guard("Tensor.normal_", torch.Tensor.normal_))
    return offenders


@pytest.fixture
def guarded_rng(monkeypatch):
    """Any noise draw (Gaussian, Laplace, exponential, Gumbel, the random-stopping counts; numpy
    or torch Gaussian) outside the ledger (or a declared public draw) fails the test."""
    return install_rng_guard(monkeypatch, NOISE_DRAWS, ("normal", "standard_normal", "randn"), torch_guard=True)


@pytest.fixture
def strictly_guarded_rng(monkeypatch):
    """Every numpy draw, uniform ones included, outside the ledger or a declared public draw fails."""
    legacy = ("normal", "standard_normal", "randn", "rand", "random", "laplace", "exponential", "gumbel", "randint", "choice", "uniform")
    return install_rng_guard(monkeypatch, ALL_DRAWS, legacy, torch_guard=False)


def keyed_shard(inter, users=None, seed: int = 0):
    """A user shard whose users carry secret keys (from a reproducible RunSecrets(seed)), keyed
    by their raw ids: what the engines build for client steps that make random choices."""
    from fedpriv.algorithms.shards import shard_users
    from fedpriv.privacy.randomness import RunSecrets, user_keys

    return shard_users(inter, users, user_keys(RunSecrets(seed).client_key(), inter.user_ids))


def load_script(name: str):
    """A script of ``simulations/`` loaded as a module (scripts are not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "simulations" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pytest_terminal_summary(terminalreporter):
    """Print what the import-layer contract checked (tests/test_layers.py), pass or fail."""
    import sys

    mod = sys.modules.get("test_layers")
    for line in getattr(mod, "SUMMARY", []):
        terminalreporter.write_line(line)
