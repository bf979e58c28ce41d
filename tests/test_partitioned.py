"""A deployment whose server holds no ratings (issue 19): ``fedpriv deploy partition`` writes
each node's folder (its users' ratings and the public metadata) and the server's public folder;
every node splits its own users' ratings with the public seed; the ServerApp starts from
``public:DIR`` and never opens a ratings file. On the in-process grid the job gives the same
model and the same ledger as the in-process engine on the full data (same noise seed)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpriv.cli import main
from fedpriv.data.public import load_public, node_interactions
from fedpriv.data.spec import load_spec, parse_data_spec
from fedpriv.data.splits import random_split
from fedpriv.ops.deploy.nodedata import split_job, write_partition
from fedpriv.testing.local_grid import LocalGrid
from fedpriv.flower.partition import data_dir_of, load_shard
from fedpriv.flower.server_app import run_job
from fedpriv.run import run

SMALL = "synthetic-mf:users=40,items=30,ratings=800,seed=3"
UPN = 10


@pytest.fixture(scope="module")
def partition(tmp_path_factory):
    out = tmp_path_factory.mktemp("part")
    write_partition(split_job(SMALL, UPN), 4, out)
    return out


def test_partition_folders_hold_only_what_they_should(partition):
    public = sorted(p.name for p in (partition / "public").iterdir())
    assert public == ["item_features.json", "item_features.npz", "item_ids.npy", "meta.json"]  # no ratings
    meta = load_public(partition / "public")
    assert (meta.n_users, meta.n_items, meta.nodes, meta.users_per_node, meta.protocol) == (40, 30, 4, UPN, "random")
    inter = load_spec(parse_data_spec(SMALL)).interactions
    for i in range(4):
        node = partition / f"node-{i}"
        assert sorted(p.name for p in node.iterdir()) == ["public", "ratings.npz"]
        mine = node_interactions(node, meta)
        assert set(np.unique(mine.users)) <= set(range(i * UPN, (i + 1) * UPN))
        assert len(mine) == int(((inter.users >= i * UPN) & (inter.users < (i + 1) * UPN)).sum())
        raw = np.asarray(mine.user_ids)
        assert np.all(raw[: i * UPN] == -1) and np.all(raw[(i + 1) * UPN :] == -1)  # others' raw ids blanked


def test_each_node_splits_its_ratings_as_the_global_split(partition):
    split = random_split(load_spec(parse_data_spec(SMALL)).interactions, seed=1234)
    for i in range(4):
        folder = data_dir_of({"data-dir": str(partition / f"node-{i}"), "partition-id": i}, "")
        assert Path(folder).name == "split"
        for part in ("train", "valid", "test"):
            mine = load_shard(folder, part, i, UPN)
            ref = getattr(split, part)
            keep = (ref.users >= i * UPN) & (ref.users < (i + 1) * UPN)
            assert mine.n_ratings == int(keep.sum())
            order = np.lexsort((ref.items[keep], ref.users[keep]))
            assert np.array_equal(np.sort(mine.items), np.sort(ref.items[keep][order]))
            assert np.isclose(mine.ratings.sum(), ref.ratings[keep].sum())


class _Audit:
    """Files opened by the server side (the client handlers run in this process too: their
    opens are not the server's)."""

    def __init__(self):
        self.server_opens: list[str] = []
        self.in_client = False
        self.active = False
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if self.active and not self.in_client and event == "open" and isinstance(args[0], (str, bytes, Path)):
            self.server_opens.append(str(args[0]))


_AUDIT = _Audit()


@pytest.mark.parametrize("algorithm", ["adadpals", "am-ssp", "am-dpsgd"])
def test_the_server_starts_from_public_metadata_only(partition, tmp_path, algorithm):
    from fedpriv.flower.client_app import app as client_app

    def client(msg, ctx):
        _AUDIT.in_client = True
        try:
            return client_app(msg, ctx)
        finally:
            _AUDIT.in_client = False

    def runner(job, n_nodes):
        assert job.train is None and job.valid is None and job.public is not None
        _AUDIT.active = False  # the grid's deployer writes the nodes' signing identities: not the server
        grid = LocalGrid(n_nodes, client_app=client, node_config=lambda pid: {"data-dir": str(partition / f"node-{pid}")})
        _AUDIT.active = True
        return run_job(grid, job)

    overrides = {"steps": "2", "rank": "3", "users_per_node": str(UPN), "aggregation": "central"}
    _AUDIT.server_opens.clear()
    _AUDIT.active = True
    try:
        metrics, ledger = run(algorithm, f"public:{partition / 'public'}", epsilon=4.0, overrides=dict(overrides), engine="flower",
                              progress=False, work_dir=tmp_path / "work", noise_seed=7, flower_runner=runner)
    finally:
        _AUDIT.active = False
    nodes = [o for o in _AUDIT.server_opens if "/node-" in o or o.endswith(("ratings.npz", "_ratings.npy", "_items.npy"))]
    assert nodes == [], nodes  # the server never opened a node folder or a ratings file
    assert metrics["server_holds_ratings"] is False and metrics["n_ratings"] is None
    assert metrics["rejected_replies"] == []  # every node's reply was accepted
    # the same job on the in-process engine over the full data: same split, same noise seed
    ref, ref_ledger = run(algorithm, SMALL, epsilon=4.0, overrides={**overrides, "users_per_shard": str(UPN)}, engine="inprocess", progress=False, noise_seed=7)
    assert [r["name"] for r in ledger] == [r["name"] for r in ref_ledger]
    assert metrics["epsilon_spent"] == pytest.approx(ref["epsilon_spent"], rel=1e-9) and metrics["epsilon_spent"] <= 4.0
    assert metrics["test_rmse"] == pytest.approx(ref["test_rmse"], rel=1e-4)
    assert metrics["valid_rmse"] == pytest.approx(ref["valid_rmse"], rel=1e-4)


def test_partition_command_and_bad_input(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["deploy", "partition", "--data", SMALL, "--nodes", "4", "--users-per-node", str(UPN), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["nodes"] == 4 and sorted(p.name for p in out.iterdir()) == ["node-0", "node-1", "node-2", "node-3", "public"]
    bad = tmp_path / "bad"
    assert main(["deploy", "partition", "--data", SMALL, "--nodes", "3", "--users-per-node", str(UPN), "--out", str(bad)]) == 2
    assert "--nodes:" in capsys.readouterr().err and not bad.exists()
    assert main(["deploy", "partition", "--data", SMALL, "--nodes", "4", "--users-per-node", str(UPN), "--out", str(out)]) == 2
    assert "--out:" in capsys.readouterr().err  # never overwrites a partition
    assert main(["run", "adadpals", "--epsilon", "1", "--data", f"public:{out / 'public'}", "--out", str(tmp_path / "o")]) == 2
    assert "--data:" in capsys.readouterr().err  # public metadata alone cannot train in-process
    (out / "public" / "meta.json").write_text("{")
    assert main(["run", "adadpals", "--epsilon", "1", "--engine", "flower", "--data", f"public:{out / 'public'}", "--out", str(tmp_path / "o")]) == 2
    assert "meta.json" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_progress_lines_one_per_round_with_the_ledgers_epsilon(partition, tmp_path, capsys):
    """``fedpriv run --engine flower`` and ``flwr run .``: one line per round as it ends, then a
    summary table; the epsilon printed after the last release is the run's (dp-accounting)."""
    seen = {}

    def runner(job, n_nodes):
        job.progress = True
        grid = LocalGrid(n_nodes, node_config=lambda pid: {"data-dir": str(partition / f"node-{pid}")})
        seen["result"] = res = run_job(grid, job)
        return res

    metrics, _ = run("adadpals", f"public:{partition / 'public'}", epsilon=4.0, overrides={"steps": "2", "rank": "3", "users_per_node": str(UPN)},
                     engine="flower", progress=True, work_dir=tmp_path / "w", flower_runner=runner)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[fedpriv] round ")]
    log = seen["result"].round_log
    assert [line.split()[2] for line in lines] == [e["round"] for e in log]
    assert all("accepted    4/4" in line and "rejected 0" in line for line in lines), lines
    step2 = next(line for line in lines if line.split()[2] == "step2")
    assert f"epsilon {metrics['epsilon_spent']:.3f} of 4" in step2
    assert f"epsilon spent {metrics['epsilon_spent']:.4f}" in out and f"test RMSE {metrics['test_rmse']:.4f}" in out
    # the summary's protocol totals are metrics.json's rounds (one source), measurement apart
    protocol = next(line for line in out.splitlines() if line.startswith("[fedpriv]   protocol"))
    assert protocol.split()[2] == str(metrics["rounds"]), protocol
    assert "[fedpriv]   measurement" in out and "[fedpriv]   all rounds" in out
