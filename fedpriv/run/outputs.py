"""A run's outputs: ``metrics.json`` made JSON-safe, the delta warning, and the two files written
both or neither."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..errors import ConfigError


def _finite_or_none(x: float | None):
    return None if x is None or not math.isfinite(x) else x


def delta_warning(delta: float, n_users) -> str | None:
    """A warning when delta exceeds 1/n (n: the released user count, else the data's): a
    mechanism may then publish one user's whole data with probability delta and still be
    (epsilon, delta)-DP, so delta should stay well below 1/n (docs/explanations/privacy.md, "Choosing δ")."""
    if not n_users or delta is None or delta <= 1.0 / float(n_users):
        return None
    return (
        f"delta {delta:g} is larger than 1/n = {1.0 / float(n_users):.3g} for n = {int(n_users):,} users: "
        "choose delta well below 1/n (e.g. 1e-5 or 1/n^1.1)"
    )


def _clean(obj):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return _finite_or_none(float(obj))
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def check_results_folder(out_dir: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Refuse ``--out`` when it holds an earlier run's results, unless ``overwrite``."""
    out = Path(out_dir)
    if not overwrite and out.is_dir() and any((out / name).exists() for name in ("metrics.json", "ledger.json")):
        raise ConfigError(
            f"{out} holds an earlier run's results (metrics.json, ledger.json); give --overwrite to replace them, or "
            f"choose a new folder",
            field="--out",
        )


def write_outputs(out_dir: str | os.PathLike, metrics: dict, ledger: list[dict]) -> None:
    """Write both files into a temporary folder next to ``out_dir``, then move them in place:
    a failure leaves nothing half-written."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, allow_nan=False) + "\n")
        (tmp / "ledger.json").write_text(json.dumps(_clean(ledger), indent=2, allow_nan=False) + "\n")
        if not out.exists():
            os.replace(tmp, out)
            return
        for name in ("ledger.json", "metrics.json"):
            os.replace(tmp / name, out / name)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
