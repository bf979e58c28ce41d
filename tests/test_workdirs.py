"""A run's temporary folder outlives a run killed outright only until the next run: the next
one removes every folder of the same prefix whose owner process is gone."""

import subprocess
import sys

from fedpriv.util.workdirs import OWNER, owned_tempdir, sweep_stale


def test_the_next_run_removes_the_folder_of_a_killed_run_and_nothing_else(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = tmp_path / "fedpriv-flower-killed"
    (killed / "node-data").mkdir(parents=True)
    (killed / OWNER).write_text(f"{dead.pid} 1\n")
    unowned = tmp_path / "fedpriv-flower-unowned"  # an older folder, or somebody else's: left alone
    unowned.mkdir()
    other_prefix = tmp_path / "fedpriv-tune-killed"
    other_prefix.mkdir()
    (other_prefix / OWNER).write_text(f"{dead.pid} 1\n")
    mine = owned_tempdir("fedpriv-flower-", tmp_path)  # a live owner: this process
    assert not killed.exists()
    assert unowned.exists() and other_prefix.exists() and mine.exists()
    assert sweep_stale("fedpriv-flower-", tmp_path) == [] and mine.exists()  # the owner runs: kept
    assert sweep_stale("fedpriv-tune-", tmp_path) == [other_prefix] and not other_prefix.exists()


def test_a_reused_pid_does_not_keep_a_stale_folder(tmp_path):
    """The owner file holds the PID and its start time: a new process with the same PID (here:
    this one, with another start time) is not the owner."""
    import os

    stale = tmp_path / "fedpriv-pam-x"
    stale.mkdir()
    (stale / OWNER).write_text(f"{os.getpid()} 1\n")  # this PID, but not this process's start time
    assert sweep_stale("fedpriv-pam-", tmp_path) == [stale] and not stale.exists()
