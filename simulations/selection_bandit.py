"""Two-armed bandit under distribution shift with private selection (Antonova et al. 2025,
Sec. IX and Appendix H): cumulative regret of UCB, Thompson sampling and the private policies
(RNM, kRR, GEM, mGEM, RS; EM optional) when the arms' means and spreads swap at T/2.

Everything is in :mod:`fedpriv.studies.selection.bandit` (module docstring: the paper's prose vs the
parameters chosen here); this script is the same as ``fedpriv selection bandit``.

Usage:
  python simulations/selection_bandit.py --out results/bandit [--quick] [--horizon 5000 --reps 20]
      [--policies ucb,thompson,rnm,krr,gem,mgem,rs] [--eps-select 1 --eps-mean 1 --eps-quantile 1 --window 100]
Writes OUT/bandit.json and OUT/bandit.png. Exit status 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import sys

from fedpriv.errors import FedprivError
from fedpriv.studies.selection import bandit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bandit.add_bandit_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return bandit.bandit_command(args)
    except FedprivError as exc:
        print(f"selection_bandit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
