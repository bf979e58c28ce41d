"""Synthetic selection scenarios (fedpriv.studies.selection.scenarios): the orderings of the paper's
bimodal scenarios 1-3, the quantile rule, outputs and CLI glue."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from fedpriv.errors import ConfigError
from fedpriv.privacy import selection as mechanisms
from fedpriv.studies.selection import scenarios as sc

TRIALS = 600
EPS = (0.1, 1.0)
Z = 3.0  # standard errors of margin in every ordering


@pytest.fixture(scope="module")
def bimodal_rows():
    return sc.run_scenarios(EPS, TRIALS, seed=11, scenarios=["bimodal"])


def _cell(rows, scenario, mechanism, eps):
    hits = [r for r in rows if r["scenario"] == scenario and r["mechanism"] == mechanism and math.isclose(r["epsilon"], eps)]
    assert len(hits) == 1, (scenario, mechanism, eps)
    return hits[0]


def _better(rows, scenario, a, b, eps, z=Z):
    """MSE of ``a`` below the MSE of ``b`` by more than z combined standard errors."""
    ra, rb = _cell(rows, scenario, a, eps), _cell(rows, scenario, b, eps)
    margin = z * math.hypot(ra["mse_se"], rb["mse_se"])
    return ra["mse"] + margin < rb["mse"], (a, ra["mse"], b, rb["mse"], margin)


@pytest.mark.parametrize("eps", EPS)
def test_positive_correlation_mgem_and_rs_beat_rnm(bimodal_rows, eps):
    for m in ("mgem", "rs"):
        ok, info = _better(bimodal_rows, "s1-bimodal-pos", m, "rnm", eps)
        assert ok, info


def test_positive_correlation_gem_worse_than_random_at_small_eps(bimodal_rows):
    ok, info = _better(bimodal_rows, "s1-bimodal-pos", "uniform", "gem", 0.1)
    assert ok, info
    ok, info = _better(bimodal_rows, "s1-bimodal-pos", "rnm", "gem", 0.1)
    assert ok, info


@pytest.mark.parametrize("eps", EPS)
def test_negative_correlation_flips_the_order(bimodal_rows, eps):
    ok, info = _better(bimodal_rows, "s2-bimodal-neg", "gem", "rnm", eps)
    assert ok, info
    for m in ("mgem", "rs"):
        ok, info = _better(bimodal_rows, "s2-bimodal-neg", "rnm", m, eps)
        assert ok, info
    ok, info = _better(bimodal_rows, "s2-bimodal-neg", "uniform", "mgem", 0.1)
    assert ok, info


@pytest.mark.parametrize("eps", EPS)
def test_no_correlation_rnm_as_good_as_any_private_mechanism(bimodal_rows, eps):
    tol = 0.03
    rnm = _cell(bimodal_rows, "s3-bimodal-none", "rnm", eps)
    for m in mechanisms.PRIVATE:
        r = _cell(bimodal_rows, "s3-bimodal-none", m, eps)
        assert rnm["mse"] <= r["mse"] + Z * math.hypot(rnm["mse_se"], r["mse_se"]) + tol, (m, r["mse"], rnm["mse"])


def test_bimodal_correlations(bimodal_rows):
    rho = {s: _cell(bimodal_rows, s, "rnm", 1.0)["spearman"] for s in ("s1-bimodal-pos", "s2-bimodal-neg", "s3-bimodal-none")}
    assert rho["s1-bimodal-pos"] == pytest.approx(1.0)
    assert rho["s2-bimodal-neg"] == pytest.approx(-1.0)
    assert rho["s3-bimodal-none"] == pytest.approx(0.0, abs=1e-12)


def test_rows_have_required_keys_and_cover_the_grid(bimodal_rows):
    labels = set(mechanisms.NAMES)
    assert {r["mechanism"] for r in bimodal_rows} == labels  # variants only on polarised scenarios
    assert len(bimodal_rows) == 3 * len(labels) * len(EPS)
    for r in bimodal_rows:
        assert set(sc.ROW_KEYS) <= set(r)
        assert r["trials"] == TRIALS and r["mse"] >= 0 and r["mse_se"] >= 0


# ------------------------------------------------------------------------------ quantile rule
def test_sensitivities_are_quantile_ranges_and_scores_are_clipped():
    inst = sc.materialise(sc.SCENARIOS["s4-pos"], 500, seed=3)
    lo, hi = np.quantile(inst.raw, [0.05, 0.95], axis=0)
    np.testing.assert_allclose(inst.sensitivities, hi - lo)
    np.testing.assert_array_equal(inst.scores, np.clip(inst.raw, lo, hi))
    assert np.all(inst.scores >= lo) and np.all(inst.scores <= hi)
    assert np.mean(inst.scores != inst.raw) == pytest.approx(0.1, abs=0.01)  # 5 % clipped each side
    np.testing.assert_array_equal(inst.opt, inst.scores.max(axis=1))
    assert mechanisms.spearman(inst.scores, inst.sensitivities).mean() > 0.5


def test_polarised_sensitivities_are_per_group_quantile_ranges():
    T = 400
    inst = sc.materialise(sc.SCENARIOS["s7-polarised-strong"], T, seed=3)
    assert inst.sensitivities.shape == (T, sc.K)
    rho = mechanisms.spearman(inst.scores, inst.sensitivities)
    for rows, sign in ((slice(0, T // 2), 1), (slice(T // 2, T), -1)):
        lo, hi = np.quantile(inst.raw[rows], [0.05, 0.95], axis=0)
        np.testing.assert_allclose(inst.sensitivities[rows], np.broadcast_to(hi - lo, (T // 2, sc.K)))
        np.testing.assert_array_equal(inst.scores[rows], np.clip(inst.raw[rows], lo, hi))
        assert sign * rho[rows].mean() > 0.5


def test_bimodal_scores_are_fixed_with_explicit_sensitivities():
    inst = sc.materialise(sc.SCENARIOS["s1-bimodal-pos"], 50, seed=0)
    assert np.all(inst.scores == inst.scores[0]) and set(np.unique(inst.scores)) == {0.0, 1.0}
    assert set(np.unique(inst.sensitivities)) == {sc.BIMODAL_SENS_LOW, sc.BIMODAL_SENS_HIGH}


def test_correlation_family_goes_from_negative_to_positive():
    rhos = [mechanisms.spearman(*(lambda i: (i.scores, i.sensitivities))(sc.materialise(sc.SCENARIOS[n], 100, seed=0))).mean()
            for n in sc.SCENARIOS if sc.SCENARIOS[n].group == "correlation"]
    assert len(rhos) == 7 and rhos[0] < -0.7 and rhos[-1] > 0.7 and abs(rhos[3]) < 0.3


# ------------------------------------------------------------------------------ reproducibility / ledger
def test_cells_are_reproducible_and_independent_of_the_other_cells(bimodal_rows):
    rows = sc.run_scenarios([1.0], TRIALS, seed=11, scenarios=["s2-bimodal-neg"], mechanisms=["rs", "rnm"])
    for r in rows:
        assert r == _cell(bimodal_rows, "s2-bimodal-neg", r["mechanism"], 1.0)


def test_private_cells_draw_through_one_ledger_select(monkeypatch):
    from fedpriv.privacy import ledger

    calls = []
    orig = ledger.PrivacyLedger.select

    def spy(self, name, mechanism, scores, sensitivities, **kw):
        calls.append((mechanism, np.shape(scores)))
        return orig(self, name, mechanism, scores, sensitivities, **kw)

    monkeypatch.setattr(ledger.PrivacyLedger, "select", spy)
    sc.run_scenarios([0.5], 40, seed=0, scenarios=["s3-bimodal-none"], mechanisms=["gem", "rnmh", "cgem"])
    assert calls == [("gem", (40, sc.K)), ("cgem", (40, sc.K))]  # rnmh is not private: not through the ledger


def test_every_random_draw_is_sanctioned(strictly_guarded_rng):
    """Scores are drawn under public_draws, selection noise inside the ledger (rnmh: public)."""
    rows = sc.run_scenarios([1.0], 40, seed=0, scenarios=["s4-pos", "s7-polarised-strong"])
    assert rows and strictly_guarded_rng == []


# ------------------------------------------------------------------------------ outputs and CLI
def _args(argv):
    p = argparse.ArgumentParser()
    sc.add_scenarios_arguments(p)
    return p.parse_args(argv)


def test_outputs_json_and_nonempty_pngs(tmp_path):
    rows = sc.run_scenarios([0.1, 1.0], 60, seed=0, scenarios=["s1-bimodal-pos", "corr-3", "corr+3", "s7-polarised-strong"],
                            mechanisms=["rnm", "gem", "uniform"])
    out = tmp_path / "a" / "b"
    paths = sc.write_scenario_outputs(rows, out)
    assert json.loads((out / "selection.json").read_text()) == rows
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["selection_bimodal.png", "selection_correlation.png", "selection_correlation_relative.png",
                    "selection_polarised.png"]
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert sorted(p.name for p in out.iterdir()) == sorted(pngs + ["selection.json"])
    assert [p.name for p in tmp_path.iterdir()] == ["a"] and [p.name for p in (tmp_path / "a").iterdir()] == ["b"]
    assert {p.name for p in paths} == set(pngs) | {"selection.json"}


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    rows = sc.run_scenarios([1.0], 30, seed=0, scenarios=["s1-bimodal-pos"], mechanisms=["rnm"])

    def boom(*a, **k):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(sc, "_plot_group", boom)
    with pytest.raises(RuntimeError):
        sc.write_scenario_outputs(rows, tmp_path / "new" / "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, field", [
    (["--epsilons", "0"], "--epsilons"),
    (["--epsilons", "1", "nan"], "--epsilons"),
    (["--trials", "5"], "--trials"),
    (["--scenarios", "s99"], "--scenarios"),
    (["--mechanisms", "rnm", "bogus"], "--mechanisms"),
    (["--seed", "-1"], "--seed"),
])
def test_command_rejects_bad_values_and_writes_nothing(tmp_path, argv, field, capsys):
    out = tmp_path / "x" / "y"
    with pytest.raises(ConfigError) as e:
        sc.scenarios_command(_args(["--out", str(out), "--trials", "30"] + argv if "--trials" not in argv else ["--out", str(out)] + argv))
    assert e.value.field == field
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out == ""


def test_command_rejects_out_that_is_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("keep")
    with pytest.raises(ConfigError) as e:
        sc.scenarios_command(_args(["--out", str(f), "--trials", "30", "--epsilons", "1"]))
    assert e.value.field == "--out" and f.read_text() == "keep"


def test_quick_defaults(monkeypatch, tmp_path):
    seen = {}
    real = sc.run_scenarios

    def fake(eps, trials, seed, scenarios, mechanisms, progress=None):
        seen.update(eps=tuple(eps), trials=trials, seed=seed, progress=progress is not None)
        return real([1.0], 30, seed, ["s1-bimodal-pos"], ["rnm"], progress=progress)

    monkeypatch.setattr(sc, "run_scenarios", fake)
    assert sc.scenarios_command(_args(["--out", str(tmp_path / "q"), "--quick", "--seed", "4"])) == 0
    assert seen == {"eps": sc.QUICK_EPSILONS, "trials": sc.QUICK_TRIALS, "seed": 4, "progress": True}  # a line per scenario (stderr)
    assert sc.scenarios_command(_args(["--out", str(tmp_path / "d")])) == 0
    assert seen["eps"] == sc.DEFAULT_EPSILONS and seen["trials"] == sc.DEFAULT_TRIALS


def test_command_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    rc = sc.scenarios_command(_args(["--out", str(out), "--scenarios", "s1-bimodal-pos", "s3-bimodal-none", "--epsilons", "0.1", "1",
                           "--trials", "50", "--mechanisms", "rnm", "mgem", "uniform"]))
    assert rc == 0
    text = capsys.readouterr().out
    assert "s1-bimodal-pos" in text and "mgem" in text and "epsilon=0.1" in text
    rows = json.loads((out / "selection.json").read_text())
    assert len(rows) == 2 * 3 * 2 and (out / "selection_bimodal.png").stat().st_size > 0


def test_script_runs(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "simulations" / "selection_scenarios.py"
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "s"), "--scenarios", "s2-bimodal-neg",
                        "--epsilons", "1", "--trials", "30", "--mechanisms", "rnm"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "s" / "selection.json").exists()
    bad = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "t"), "--epsilons", "-0.5"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--epsilons" in bad.stderr and not (tmp_path / "t").exists()


def test_the_command_reports_progress_after_each_scenario(tmp_path, capsys):
    """Issue 58 item 7: a run of over 10 seconds says how far it is (stderr, a line a scenario)."""
    assert sc.scenarios_command(_args(["--out", str(tmp_path / "p"), "--scenarios", "s1-bimodal-pos", "s3-bimodal-none", "--epsilons", "1",
                                       "--trials", "30", "--mechanisms", "rnm"])) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("scenarios: 2 to run") and [e.split(" done")[0] for e in err[1:]] == ["scenarios: 1/2", "scenarios: 2/2"]
