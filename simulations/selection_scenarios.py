"""Synthetic private-selection scenarios of Antonova et al. (SaTML 2025), §VI-VII: MSE of every
selection mechanism against epsilon on the bimodal, more realistic, increasing-correlation and
polarised scenarios (:mod:`fedpriv.studies.selection.scenarios`; same as ``fedpriv selection scenarios``).

Usage:
  python simulations/selection_scenarios.py --out results/selection            # full run
  python simulations/selection_scenarios.py --out /tmp/sel --quick             # smoke run (< 30 s)
  python simulations/selection_scenarios.py --out /tmp/sel --scenarios bimodal --epsilons 0.1 1 --trials 5000
Writes OUT/selection.json and OUT/selection_*.png; prints a summary table.
"""

from __future__ import annotations

import argparse
import sys

from fedpriv.errors import FedprivError
from fedpriv.studies.selection import scenarios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    scenarios.add_scenarios_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return scenarios.scenarios_command(args)
    except FedprivError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
