"""One ``fedpriv run`` command, timed, with its peak GPU memory: the issue-43 figures of a whole
command (data generation excluded) on a device.

    python benchmarks/gpu_cli.py adadpals --data "synthetic-mf:users=136677,items=20108,ratings=10000000,seed=1,select=1.5" --device cuda --out runs/ml20m

Runs the command in this process (so torch's allocator statistics see it) and prints one JSON
object: the arguments, the exit status, ``wall_seconds`` of the command and ``train_seconds``
(metrics.json's ``wall_seconds``: training and evaluation, the data's generation excluded), the
released epsilon, the model the defaults chose and ``peak_gpu_bytes`` (torch's peak allocation;
null off CUDA)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> int:
    import torch

    from fedpriv.cli import main as cli

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    rc = cli(["run", *argv])
    wall = time.perf_counter() - t
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    metrics = json.loads((Path(out) / "metrics.json").read_text()) if out and (Path(out) / "metrics.json").exists() else {}
    print(json.dumps({
        "args": argv, "rc": rc, "wall_seconds": round(wall, 2), "train_seconds": metrics.get("wall_seconds"),
        "epsilon_spent": metrics.get("epsilon_spent"), "n_users": metrics.get("n_users"), "n_ratings": metrics.get("n_ratings"),
        "model": (metrics.get("noise_aware") or {}).get("model"),
        "test_rmse": metrics.get("test_rmse"), "recall_at_10": (metrics.get("ranking") or {}).get("recall"),
        "timings": metrics.get("timings"), "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
    }), flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
