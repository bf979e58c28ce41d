"""What a ClientApp process pays before it handles a message: the CPU time of importing
``fedpriv.flower.client_app`` against ``flwr.clientapp`` (which it cannot avoid), measured in the
same run in fresh interpreters, interleaved, median of ``--repeats``. Prints one JSON object.

    python benchmarks/bench_client_import.py [--repeats 7]

``ratio`` is the median CPU seconds (user + system, from the child's rusage) of the fedpriv import
over flwr's; ``importtime_us`` is ``python -X importtime``'s cumulative figure of the top module
in one more run of each. Issue 19's target: ratio <= 1.5."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HEAVY = ("torch", "scipy", "dp_accounting", "pandas", "matplotlib")
TARGETS = {"python": "pass", "flwr.clientapp": "import flwr.clientapp", "fedpriv.flower.client_app": "import fedpriv.flower.client_app"}


def _cpu_of(code: str) -> float:
    before = os.times()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def _importtime_us(module: str) -> int:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], check=True, capture_output=True, text=True)
    total = 0
    for line in out.stderr.splitlines():  # "import time: self [us] | cumulative | imported package"
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s?(\S.*)$", line)
        if m and m.group(2).strip() == module:
            total = int(m.group(1))
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    cpu: dict[str, list[float]] = {k: [] for k in TARGETS}
    for _ in range(args.repeats):  # interleaved: the page cache and the machine's load hit all alike
        for name, code in TARGETS.items():
            cpu[name].append(_cpu_of(code))
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, fedpriv.flower.client_app; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    median = {k: statistics.median(v) for k, v in cpu.items()}
    result = {
        "benchmark": "client_import",
        "repeats": args.repeats,
        "cpu_seconds_median": {k: round(v, 4) for k, v in median.items()},
        "cpu_seconds_all": {k: [round(x, 4) for x in v] for k, v in cpu.items()},
        "ratio": round(median["fedpriv.flower.client_app"] / median["flwr.clientapp"], 3),
        "ratio_over_bare_python": round((median["fedpriv.flower.client_app"] - median["python"]) / max(median["flwr.clientapp"] - median["python"], 1e-9), 3),
        "importtime_us": {m: _importtime_us(m) for m in ("flwr.clientapp", "fedpriv.flower.client_app")},
        "heavy_modules_loaded": loaded,
        "target_ratio": 1.5,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
