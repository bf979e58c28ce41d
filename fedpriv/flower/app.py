"""The Flower app of ``flwr run .`` (the components in pyproject.toml): the ServerApp reads the
job from the run config ([tool.flwr.app.config], overridable with ``flwr run . --run-config``)
and runs it through :func:`fedpriv.run.run` on the grid Flower hands it. The ClientApp component
is :mod:`fedpriv.flower.client_app` (the node imports nothing of this module). An operations module: it sits above the
run layer, which the engine modules never import."""

from __future__ import annotations

import logging
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..run import parse_overrides, run, write_outputs
from .launcher import epsilon_of_run_config, read_noise_seed_file
from .server_app import run_job

log = logging.getLogger("fedpriv.flower")

# ``flwr run .``: the job comes from the run config ([tool.flwr.app.config] in pyproject.toml,
# overridable with ``flwr run . --run-config "key=value ..."``)
app = ServerApp()


def _overrides(spec: str) -> dict[str, str]:
    return parse_overrides([p for p in str(spec).replace(";", ",").split(",") if p.strip()])


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    algorithm = str(rc.get("algorithm", "adadpals"))
    epsilon = epsilon_of_run_config(rc)
    overrides = _overrides(rc.get("set", ""))
    overrides["users_per_node"] = str(rc.get("users-per-node", 1))
    aggregation = str(rc.get("aggregation", "central") or "central")
    if aggregation != "central" or "aggregation" in overrides:
        overrides.setdefault("aggregation", aggregation)  # secure: nodes add distributed noise, the server sees only noised sums
    overrides["round_timeout"] = str(rc.get("round-timeout", 0.0))
    overrides["node_wait"] = str(rc.get("node-wait", 120.0))
    work_dir = str(rc.get("work-dir", "") or "") or None  # a work dir keeps the checkpoint: rerun to resume
    seed_file = str(rc.get("noise-seed-file", "") or "")  # reproducible noise (a file, never the seed in the run config)
    if seed_file:
        noise_seed = read_noise_seed_file(seed_file)
    else:
        noise_seed = None
    out = Path(str(rc.get("out", "runs/flwr"))).expanduser()
    metrics_, ledger = run(
        algorithm,
        str(rc["data"]),
        epsilon=epsilon,
        delta=float(rc.get("delta", 1e-5)),
        overrides=overrides,
        engine="flower",
        progress=True,  # one line per round, then a summary table (mirrored to `flwr run --stream`)
        work_dir=work_dir,
        flower_runner=lambda job, n_nodes: run_job(grid, job),
        noise_seed=noise_seed,
    )
    write_outputs(out, metrics_, ledger)
    log.info("fedpriv: wrote %s and %s", out / "metrics.json", out / "ledger.json")
