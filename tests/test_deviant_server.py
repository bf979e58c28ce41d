"""The deviating server of the red team (simulations/deviant_server.py, ``red_team.py --server
deviant``) against fedpriv's real node code: every line, with the nodes' own policy, recovers
nothing and is refused by the line's own defence (``refused_by``, parsed from the nodes' error
replies); its positive control, the same nodes and policy with only that defence turned off
(:func:`fedpriv.privacy.defences.disabled`), recovers. Also the server-view check's decoding of
raw bytes (a leak packed in 8 bytes is caught as the same leak sent as a float)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from conftest import load_script

DATA = "synthetic-mf:users=48,items=30,ratings=1200,seed=3"
NODES = 6


@pytest.fixture(scope="module")
def dev():
    return load_script("deviant_server")


@pytest.fixture(scope="module")
def setup(dev, tmp_path_factory):
    return dev.Setup(DATA, nodes=NODES, epsilon=1.0, work=tmp_path_factory.mktemp("deviant"))


@pytest.fixture(autouse=True)
def _quiet():
    import logging

    log = logging.getLogger("fedpriv.flower")
    level = log.level
    log.setLevel(logging.CRITICAL)
    yield
    log.setLevel(level)


#: line -> (function of deviant_server, its defence)
LINES = {
    "a": ("plaintext_handler", "plaintext-handler"),
    "b": ("low_noise_plan", "node-budget"),
    "c": ("key_file", "key-file"),
    "e": ("repeated_sums", "node-budget"),
    "g": ("few_contributors", "min-contributors"),
    "h1": ("split_plans", "plan-scale"),
    "h2": ("split_models", "view-consistency"),
    "i1": ("recommend_probe", "recommend-epsilon"),
    "i2": ("repeated_probes", "recommend-count"),
    "j": ("eval_buckets", "eval-buckets"),
    "k": ("budget_across_runs", "node-budget"),
    "l": ("node_restart", "node-budget"),
}

#: positive controls that do not recover (a defect to fix on the node side, not in the test):
#: turning recommend-count off leaves recommend-epsilon to refuse the second query at the cap
#: (the node ledger composes the run's queries), so repeated queries gain nothing
CONTROL_DEFECTS: dict[str, str] = {}  # a line whose control does not recover would be listed here, with why (none now)


def test_the_deviant_rounds_use_the_runs_colluders_and_an_honest_sum_passes_the_policy(dev, setup):
    """Item 8: the server's rounds carry the run's colluders (1), so the Shamir threshold is the
    one the nodes' policy accepts: an honest sum under the defence is answered by every node."""
    server = dev.DeviantServer(setup, True)
    assert server.secure.colluders == server.grid.node_policy.colluders == 1
    got = server.secure_sum("users", setup.users_plan(), setup.content())
    assert got is not None and got[1] == setup.nodes and server.errors == []


@pytest.mark.parametrize("line", sorted(LINES))
def test_with_the_defence_nothing_is_recovered_and_the_lines_own_defence_refuses(dev, setup, line):
    fn, defence_id = LINES[line]
    out = getattr(dev, fn)(setup, True)
    assert out["deviation"] == line and out["defence"] is True and out["defence_id"] == defence_id
    assert out["recovered"] is False, out
    assert out["refused_by"] == defence_id, out["refusals"]


@pytest.mark.parametrize("line", [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=CONTROL_DEFECTS[k])) if k in CONTROL_DEFECTS else k
                                  for k in sorted(LINES)])
def test_the_positive_control_with_only_that_defence_off_recovers(dev, setup, line):
    from fedpriv.privacy import defences

    fn, defence_id = LINES[line]
    out = getattr(dev, fn)(setup, False)
    assert out["defence"] is False and out["disabled"] == [defence_id]
    assert all(defences.active(d) for d in defences.DEFENCES)  # turned off inside the line only
    assert out["recovered"] is True, (out["refused_by"], out["refusals"])


def test_what_the_new_lines_obtain(dev, setup):
    """The numbers behind the verdicts: (g) two shares of noise, (h1) the victim's own share
    alone, (h2) the victim's exact difference, (j) exact per-item sums, (k) the memory ledger
    lets three runs through."""
    g = dev.few_contributors(setup, False)
    assert g["contributors"] == 2 and g["noise_ratio"] == pytest.approx(np.sqrt(1 / (NODES - 1)))
    h1 = dev.split_plans(setup, False)
    assert h1["noise_ratio"] < 0.5 and h1["released_count"] is not None
    h2 = dev.split_models(setup, False)
    assert h2["measurements_obtained"] == 2
    assert all(np.allclose(h2["obtained_difference"][k], v, atol=1e-4) for k, v in h2["victim_true_difference"].items())
    j = dev.eval_buckets(setup, False)
    assert j["obtained_per_item"] is not None and sum(j["true_per_item"]["valid_n"]) > 0
    k = dev.budget_across_runs(setup, True)
    assert k["sums_obtained"] == 1 and k["memory_ledger"]["recovered"] is True and k["memory_ledger"]["sums_obtained"] == 3


@pytest.mark.parametrize("letter", ["d", "f"])
def test_the_key_lines_name_their_defence(letter):
    keys = load_script("deviant_keys")
    fn, defence_id = (keys.key_substitution, "key-substitution") if letter == "d" else (keys.colluding_threshold, "shamir-threshold")
    on, off = fn(True), fn(False)
    assert on["recovered"] is False and on["refused_by"] == on["defence_id"] == defence_id
    assert off["recovered"] is True and off["disabled"] == [defence_id]


def test_red_team_exit_rule_reads_refused_by():
    rt = load_script("red_team")
    ok = {"defence": True, "recovered": False, "refused_by": "plan-scale", "defence_id": "plan-scale"}
    assert rt.deviant_line_holds(ok)
    assert not rt.deviant_line_holds({**ok, "refused_by": "node-budget"})  # held, but by another defence
    assert rt.deviant_line_holds({"defence": False, "recovered": True}) and not rt.deviant_line_holds({"defence": False, "recovered": False})


def test_red_team_server_deviant_prints_the_new_lines(capsys):
    rt = load_script("red_team")
    code = rt.main(["--server", "deviant", "--data", DATA, "--nodes", str(NODES), "--deviations", "ghjkl"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert sorted((x["deviation"], x["defence"]) for x in lines) == sorted((d, f) for d in ("g", "h1", "h2", "j", "k", "l") for f in (True, False))
    assert all(rt.deviant_line_holds(x) for x in lines) and code == 0


# ---------------------------------------------------------------- the server view: raw bytes
def _views(value_of):
    """A1, A2 on D and B on D' (partition 2's n: 10 -> 5), every reply carrying ``value_of(n)``
    and random masked words."""
    rng = np.random.default_rng(0)
    r = ("query.secagg_mask", "secagg_mask", 0)
    out = []
    for run in range(3):
        replies = {}
        for part in range(5):
            n = 5 if (run == 2 and part == 2) else 10 + part
            fields = {("leak", "n"): value_of(n, rng), ("masked", "y"): ("array", "<u8", (4,), rng.integers(0, 2**63, 4, dtype=np.uint64).tobytes())}
            keys = {"leak": frozenset({"n"}), "masked": frozenset({"y"})}
            replies[(r, part)] = {"fields": fields, "keys": keys, "size": None, "entry_bytes": {}}
        out.append({"replies": replies, "rounds": [r]})
    return out


@pytest.mark.parametrize("how", ["float", "bytes"])
def test_a_count_packed_in_raw_bytes_is_decoded_like_the_same_count_as_a_float(how):
    """``n_ratings + U(0, 1e-6)`` sent as 8 raw bytes (``struct.pack('<d', ...)``) is caught as
    the same leak sent as a float (the positive control)."""
    rt = load_script("red_team")

    def value(n, rng):
        x = n + rng.uniform(0, 1e-6)
        return ("float", x) if how == "float" else ("bytes", struct.pack("<d", x))

    out = rt.compare_views(*_views(value))
    assert out["server_plaintext_fields"] == ["query.secagg_mask:leak.n"] and out["decoded_fields"] == ["query.secagg_mask:leak.n"]
    assert out["fields_by_partition"]["query.secagg_mask:leak.n"] == [2]


def test_random_bytes_are_not_decoded_as_a_leak():
    """Keys, ciphertexts and signatures (random bytes, 32 or 64 long) move as much on D' as
    between runs on D, and mostly do not read as plausible numbers: nothing is listed."""
    import os

    rt = load_script("red_team")
    for length in (8, 32, 64):
        out = rt.compare_views(*_views(lambda n, rng: ("bytes", os.urandom(length))))
        assert out["server_plaintext_fields"] == [] and out["decoded_fields"] == [], length
    assert rt._numbers(("bytes", struct.pack("<d", 12.5))).tolist() == [12.5]
    assert rt._numbers(("bytes", b"\xff" * 8)) is None and rt._numbers(("bytes", b"abc")) is None
