"""Time and memory of :func:`fedpriv.data.synthetic.make_mf` at MovieLens-10M size.

Usage: ``python benchmarks/bench_synthetic.py [--users 70000 --items 10700 --ratings 10000000]``.
Prints one JSON object; the targets are < 60 s and < 4096 MB peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

from fedpriv.data.synthetic import make_mf

MAX_SECONDS = 60.0
MAX_RSS_MB = 4096.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def top_share(counts: np.ndarray, fraction: float = 0.1) -> float:
    """Share of all ratings held by the ``fraction`` most rated items."""
    top = max(1, int(round(fraction * len(counts))))
    return float(np.sort(counts)[::-1][:top].sum() / counts.sum())


def main(argv: list[str] | None = None) -> dict:
    """Build the data set once and print the measurements as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=70_000)
    parser.add_argument("--items", type=int, default=10_700)
    parser.add_argument("--ratings", type=int, default=10_000_000)
    parser.add_argument("--skew", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    data = make_mf(args.users, args.items, args.ratings, skew=args.skew, seed=args.seed)
    seconds = time.perf_counter() - start
    inter = data.interactions
    result = {
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "n_users": inter.n_users,
        "n_items": inter.n_items,
        "n_ratings": len(inter),
        "top10pct_item_share": round(top_share(inter.item_counts()), 4),
    }
    result["meets_time_target"] = result["seconds"] < MAX_SECONDS
    result["meets_memory_target"] = result["peak_rss_mb"] < MAX_RSS_MB
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
