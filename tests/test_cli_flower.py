"""``fedpriv run --engine flower``: the job goes through ``flwr run`` (a local SuperLink), and the
SuperLink with everything it started is stopped afterwards."""

import json
import time

import pytest

from fedpriv.cli import main
from fedpriv.ops import launcher

pytestmark = pytest.mark.flower  # Flower's engine: scripts/test.sh runs these on the newest Flower

SYN = "synthetic-mf:users=60,items=40,ratings=1500,seed=2"


def test_flower_engine_runs_flwr_and_leaves_nothing_running(tmp_path, monkeypatch, capsys):
    # only this run's SuperLink is checked (its own FLWR_HOME): other fedpriv runs may be alive on the machine
    seen: dict = {}
    real_stop = launcher.stop_superlinks

    def stop(flwr_home, *args, **kwargs):  # record what ran before it is stopped
        pids = launcher.superlink_pids(flwr_home)
        seen.update(home=flwr_home, processes=pids + launcher.descendant_pids(pids))
        seen["stopped"] = real_stop(flwr_home, *args, **kwargs)
        return seen["stopped"]

    monkeypatch.setattr(launcher, "stop_superlinks", stop)
    out = tmp_path / "out"
    args = ["run", "adadpals", "--data", SYN, "--epsilon", "2", "--engine", "flower", "--nodes", "20", "--users-per-node", "3"]
    t0 = time.perf_counter()
    code = main([*args, "--set", "rank=3", "--set", "steps=2", "--out", str(out), "--quiet"])
    seconds = time.perf_counter() - t0
    assert code == 0, capsys.readouterr().err[-3000:]

    m = json.loads((out / "metrics.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    assert m["engine"] == "flower" and m["algorithm"] == "adadpals" and m["nodes"] == 20 and m["users_per_node"] == 3
    assert m["epsilon_spent"] == pytest.approx(2.0, rel=1e-3)
    assert m["rounds"] == 7 and m["bytes_up"] > 0 and m["config"]["rank"] == 3 and m["config"]["steps"] == 2
    assert {r["name"] for r in ledger} >= {"mean", "counts", "item_stats_A", "item_stats_b"}
    assert sorted(p.name for p in out.iterdir()) == ["ledger.json", "metrics.json"]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["algorithm"] == "adadpals" and summary["epsilon_spent"] == pytest.approx(2.0, rel=1e-3)

    # a SuperLink of our own FLWR_HOME ran, and it and its children are gone
    assert seen["stopped"], "no SuperLink was found to stop"
    assert launcher.superlink_pids(seen["home"]) == []
    assert [p for p in seen["processes"] if launcher.pid_alive(p)] == []
    assert not seen["home"].exists()  # the temporary FLWR_HOME and app folder are removed
    print(f"flower CLI run: {seconds:.1f} s")


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--epsilon", "2", "--set", "nosuchkey=1"], "nosuchkey"),
        ([], "--epsilon"),
        (["--epsilon", "2", "--nodes", "5"], "--nodes"),  # 20 partitions of 3 users need 20 nodes
        (["--epsilon", "2", "--users-per-node", "0"], "--users-per-node"),
    ],
)
def test_flower_engine_bad_input_exits_2_before_starting_flower(tmp_path, monkeypatch, capsys, extra, needle):
    def no_flwr(*args, **kwargs):
        raise AssertionError("flwr run was started")

    monkeypatch.setattr(launcher, "run_streaming", no_flwr)
    before = launcher.superlink_pids()
    out = tmp_path / "out"
    t0 = time.perf_counter()
    code = main(["run", "adadpals", "--data", SYN, "--engine", "flower", "--users-per-node", "3", *extra, "--out", str(out), "--quiet"])
    assert code == 2
    assert needle in capsys.readouterr().err
    assert time.perf_counter() - t0 < 30
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert launcher.superlink_pids() == before


def test_flower_engine_runs_a_non_private_personalization_baseline_without_epsilon(tmp_path, monkeypatch, capsys):
    """`fedpriv run pam-own-data --engine flower` without --epsilon used to crash with a
    TypeError: the launcher decided privacy by `algorithm != "als"`. One rule now decides it,
    and the ServerApp reads the run config's placeholder back as no epsilon."""
    import tomllib

    captured = {}

    def fake_flwr(cmd, **kwargs):  # read the run config flwr would get, then fail as flwr would
        captured.update(tomllib.loads(open(cmd[cmd.index("--run-config") + 1]).read()))
        return 1, ["no flwr in this test"]

    monkeypatch.setattr(launcher, "run_streaming", fake_flwr)
    out = tmp_path / "out"
    code = main(["run", "pam-own-data", "--data", "synthetic-personal:users=40,samples=4,d=3,k=1", "--engine", "flower", "--out", str(out), "--quiet"])
    assert code == 2 and "no flwr in this test" in capsys.readouterr().err  # a clean error, no TypeError
    assert captured["algorithm"] == "pam-own-data" and launcher.epsilon_of_run_config(captured) is None
    assert launcher.epsilon_of_run_config({"algorithm": "pam", "epsilon": 2.0}) == 2.0
    assert launcher.epsilon_of_run_config({"algorithm": "als", "epsilon": 1.0}) is None
