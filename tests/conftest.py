from __future__ import annotations

import signal
import threading
from pathlib import Path

import numpy as np
import pytest


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config):
    """A SIGTERM (a stopped `bash scripts/test.sh`, a CI timeout) takes pytest's Ctrl-C path: the
    running test's clean-up stops what it started (a deployment's SuperLink, SuperNodes and
    apps) instead of the process dying with them still running."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)

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


def als_config(algorithm: str, **values):
    """An ALSConfig as written for ``algorithm`` (no algorithm defaults, no rule): the shared
    keys as fields, the algorithm's own keys (DP-SGD, the encoder family) in its options; the
    own keys of other algorithms are left out, so one set of values serves every algorithm."""
    from fedpriv.algorithms import registry
    from fedpriv.algorithms.als import ALSConfig

    return ALSConfig.as_written({k: v for k, v in values.items() if registry.readers(k) is None or algorithm in registry.readers(k)}, algorithm)


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


#: The default suite's slowest tests (seconds measured on this project's 2-core machine, default
#: suite of 2026-11-26, then a --durations=0 profile of what was left: 716 s, of which these
#: 34 took 188 s): marked ``slow`` here, they run in the slow suite of scripts/test.sh so
#: that the default suite stays under 10 minutes. The documentation-snippet and fuzz tests stay.
SLOW_TESTS = {
    # tuning around a test-defined engine: test_one_path runs Tuned around the Flower engine against the in-process one
    "tests/test_run_layer.py::test_private_tuning_wraps_a_new_engine_without_it_knowing": 14,
    # secure mode of the top-k family: the Flower-grid agreement tests (marker flower, CI on 1.42) run it too
    "tests/test_topk.py::test_topk_lowrank_secure_mode_is_a_skellam_sketch": 6,
    "tests/test_topk.py::test_secure_mode_releases_the_statistic_as_a_secure_sum": 4,
    # the device sampler's float attack at 2**-53 stays in the default suite (the same lattice, one step away here)
    "tests/test_float_noise.py::test_the_attack_is_at_chance_with_the_lattice_discrete_gaussian[lattice-device-torch:cpu-0.75-grid-step]": 9,
    # the GPU page's smoke run of benchmarks/gpu_check.sh on torch:cpu (the benchmarks' --device paths, gpu_cli)
    "tests/test_doc_snippets.py::test_shell_block[docs/how-to/gpu.md#3]": 31,
    # the GPU page's CPU check of benchmarks/gpu_scale.py: tests/test_device.py checks the same path
    "tests/test_doc_snippets.py::test_shell_block[docs/how-to/gpu.md#2]": 8,
    # own-data.md#2 runs the same command first; tuning in process runs in tests/test_one_path.py (against the Flower engine)
    "tests/test_doc_snippets.py::test_shell_block[docs/how-to/own-data.md#1]": 9,
    "tests/test_doc_snippets.py::test_shell_block[docs/how-to/tuning.md#1]": 14,
    "tests/test_ledger.py::test_every_algorithm_draws_noise_only_through_the_ledger[am-dpsgd]": 10,
    "tests/test_privacy_plan.py::test_sampled_plan_has_no_rho_and_tuned_plan_no_pld": 10,
    "tests/test_partitioned.py::test_the_server_starts_from_public_metadata_only[am-ssp]": 8,
    "tests/test_privacy_plan.py::test_private_tuning_run_is_accounted_as_one_repeat_and_select": 8,
    "tests/test_ssp.py::test_id_only_encoder_reaches_the_item_solve": 7,
    "tests/test_privacy_plan.py::test_calibration_with_tuning_meets_the_target": 7,
    "tests/test_cli.py::test_module_entry_point_exit_code": 7,
    "tests/test_ranking.py::test_the_private_bias_model_ranks_by_its_released_popularity": 7,
    "tests/test_eval_measurement.py::test_without_released_counts_the_buckets_follow_the_item_ids": 7,
    "tests/test_server_view.py::test_secure_recommendation_shows_the_server_nothing_per_node": 6,
    "tests/test_api.py::test_saved_model_recommends_the_same_in_a_fresh_process": 6,
    "tests/test_ranking.py::test_model_api": 5,
    "tests/test_api.py::test_am_ssp_model_keeps_its_encoder": 5,
    "tests/test_packaging.py::test_pip_install_keeps_the_installed_flower": 5,
    "tests/test_skellam_orders.py::test_central_plans_and_ledgers_keep_their_orders_and_multipliers": 5,
    "tests/test_catalogue_declared.py::test_private_run_without_catalogue_exits_2_and_writes_nothing": 5,
    "tests/test_skellam_orders.py::test_a_secure_plan_spends_at_most_its_target_at_integer_orders[5.0]": 5,
    "tests/test_server_view.py::test_nodes_that_add_too_little_noise_are_caught": 5,
    "tests/test_ledger.py::test_private_tuning_draws_only_through_the_ledger": 5,
    "tests/test_typed_configs.py::test_train_and_plan_take_a_typed_configuration": 5,
    "tests/test_packaging.py::test_the_import_check_catches_an_optional_import_left_undeclared": 5,
    "tests/test_privacy_plan.py::test_calibrated_plan_pld_matches_the_exact_gaussian_within_1_percent[20.0]": 5,
    "tests/test_recommend.py::test_run_writes_the_recommendation_and_composes_its_epsilon": 5,
    "tests/test_secure_aggregation.py::test_secure_and_central_models_are_alike_and_secure_runs_are_reproducible_for_a_seed": 5,
    "tests/test_pam.py::test_exponential_mechanism_net_scores_and_accounting": 5,
    "tests/test_server_view.py::test_secure_mode_shows_the_server_nothing_per_node[default-factor-step]": 5,
    "tests/test_eval_measurement.py::test_each_model_is_measured_once[secure]": 5,
    "tests/test_partitioned.py::test_the_server_starts_from_public_metadata_only[adadpals]": 4,
    "tests/test_api.py::test_api_reproduces_the_cli_metrics": 4,
    "tests/test_sensitivity.py::test_one_adversarial_user_moves_each_release_by_at_most_its_sensitivity[am-dpsgd]": 4,
    "tests/test_node_policy.py::test_red_team_server_deviant_prints_a_line_per_deviation_and_its_positive_control": 4,
    "tests/test_server_view.py::test_secure_mode_shows_the_server_nothing_per_node[noise-aware-defaults]": 4,
    "tests/test_server_view.py::test_the_command_prints_one_json_line_and_fails_on_a_leak": 4,
    "tests/test_server_view.py::test_a_count_with_a_little_noise_in_every_masked_reply_is_decoded": 4,
    "tests/test_noise_aware.py::test_no_default_run_is_worse_than_the_private_bias_model[synthetic-400-400-200-20000]": 84,
    "tests/test_noise_aware.py::test_no_default_run_is_worse_than_the_private_bias_model[synthetic-1.5k-1500-400-45000]": 80,
    "tests/test_neighbours.py::test_removing_a_renumbered_user_moves_each_release_within_its_sensitivity[dpsgd]": 55,
    "tests/test_neighbours.py::test_removing_a_renumbered_user_moves_each_release_within_its_sensitivity[am-dpsgd]": 49,
    "tests/test_packaging.py::test_the_wheel_installs_outside_the_checkout_and_runs": 34,
    "tests/test_defaults_floor.py::test_default_runs_never_lose_to_the_private_bias_model[10.0-synthetic-mf:users=600,items=120,ratings=15000,seed=5]": 33,
    "tests/test_flower_resume.py::test_an_interrupted_job_resumes_to_the_same_result[am-dpsgd-1]": 32,
    "tests/test_red_team.py::test_default_outputs_give_nothing_away": 31,
    "tests/test_defaults_floor.py::test_default_runs_never_lose_to_the_private_bias_model[10.0-synthetic-mf:users=1500,items=400,ratings=40000,seed=6,select=1]": 31,
    "tests/test_defaults_floor.py::test_default_runs_never_lose_to_the_private_bias_model[2.0-synthetic-mf:users=600,items=120,ratings=15000,seed=5]": 30,
    "tests/test_defaults_floor.py::test_default_runs_never_lose_to_the_private_bias_model[2.0-synthetic-mf:users=1500,items=400,ratings=40000,seed=6,select=1]": 26,
    "tests/test_cli.py::test_default_noise_is_secret_and_a_noise_seed_reproduces": 21,
    "tests/test_noise_aware.py::test_the_one_shot_releases_of_the_dp_sgd_baselines_spend_at_most_a_fifth": 17,
    "tests/test_one_path.py::test_the_one_job_example_runs_and_its_engines_agree": 15,
    "tests/test_defaults_floor.py::test_default_runs_never_lose_to_the_private_bias_model[0.5-synthetic-mf:users=600,items=120,ratings=15000,seed=5]": 14,
    "tests/test_defaults_floor.py::test_default_runs_never_lose_to_the_private_bias_model[0.5-synthetic-mf:users=1500,items=400,ratings=40000,seed=6,select=1]": 14,
    "tests/test_server_view.py::test_secure_mode_over_a_sparse_neighbour_graph": 14,
    "tests/test_ssp.py::test_each_variant_is_accounted_like_its_closed_form[am-dpsgd]": 14,
    "tests/test_red_team.py::test_a_published_noise_seed_is_found_and_exploited": 14,
    "tests/test_skellam_orders.py::test_a_secure_plan_spends_at_most_its_target_at_integer_orders[20.0]": 13,
    "tests/test_privacy_plan.py::test_fair_allocation_gives_each_sampled_release_its_rdp_fraction_at_the_optimal_order": 13,
    "tests/test_bias_model.py::test_the_bias_models_feature_prior_is_post_processing_and_pays_on_real_data": 13,
    "tests/test_partitioned.py::test_the_server_starts_from_public_metadata_only[am-dpsgd]": 11,
    "tests/test_ledger.py::test_every_algorithm_draws_noise_only_through_the_ledger[dpsgd]": 10,
    "tests/test_secure_strategy.py::test_the_example_app_trains_a_torch_model_under_secure_aggregation": 9,
    "tests/test_noise_aware.py::test_on_implicit_data_no_default_ranks_worse_than_the_private_bias_model": 9,
    "tests/test_clean_stops.py::test_an_in_process_run_stops_on_each_signal_with_one_line[2]": 9,
    "tests/test_pam.py::test_one_user_moves_each_release_by_at_most_its_sensitivity": 8,
    "tests/test_clean_stops.py::test_an_in_process_run_stops_on_each_signal_with_one_line[15]": 8,
    "tests/test_clean_stops.py::test_an_in_process_run_stops_on_each_signal_with_one_line[1]": 8,
    "tests/test_secure_aggregation.py::test_the_plan_shows_secure_multipliers": 8,
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
