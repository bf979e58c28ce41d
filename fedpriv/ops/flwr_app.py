"""The Flower app of ``flwr run .`` (the components in pyproject.toml): the ServerApp reads the
job from the run config ([tool.flwr.app.config], overridable with ``flwr run . --run-config``)
and runs it as a :class:`fedpriv.run.Job` on the grid Flower hands it (:class:`fedpriv.run.FlowerGrid`). The ClientApp
component
is :mod:`fedpriv.flower.client_app` (the node imports nothing of this module). An operations module: it sits above the
run layer, which the engine modules never import."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..errors import ConfigError
from ..privacy.target import ADD_REMOVE, check_relation
from ..run import FlowerGrid, Job, parse_overrides, write_outputs
from .launcher import epsilon_of_run_config, read_noise_seed_file

log = logging.getLogger("fedpriv.flower")

# ``flwr run .``: the job comes from the run config ([tool.flwr.app.config] in pyproject.toml,
# overridable with ``flwr run . --run-config "key=value ..."``)
app = ServerApp()


def _overrides(spec: str) -> dict[str, str]:
    return parse_overrides([p for p in str(spec).replace(";", ",").split(",") if p.strip()])


def _data_options(text: str) -> dict[str, str]:
    """The run-config key ``data-options``: the csv/parquet options as a JSON object
    (``'{"rating_range": "1,5", "items": "items.csv"}'``)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"expected a JSON object of csv/parquet options, got {text!r} ({exc})", field="data-options"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"expected a JSON object of csv/parquet options, got {text!r}", field="data-options")
    return {str(k): str(v) for k, v in value.items()}


def job_of_run_config(rc) -> tuple[Job, dict]:
    """The job a run config describes, and the Flower engine options it sets (the run-config
    reader: the only place, with the command line, where the job's values are strings)."""
    algorithm = str(rc.get("algorithm", "adadpals"))
    params: dict = _overrides(rc.get("set", ""))
    if str(rc.get("tune", "") or ""):  # private tuning's grid: "key=v1/v2;key2=..." (it holds ';', so not in `set`)
        params["tune"] = str(rc["tune"])
    aggregation = str(rc.get("aggregation", "central") or "central")
    if aggregation != "central" or "aggregation" in params:
        params.setdefault(
            "aggregation", aggregation
        )  # secure: nodes add distributed noise, the server sees only noised sums
    seed_file = str(
        rc.get("noise-seed-file", "") or ""
    )  # reproducible noise (a file, never the seed in the run config)
    job = Job(
        algorithm,
        str(rc["data"]),
        epsilon=epsilon_of_run_config(rc),
        delta=float(rc.get("delta", 1e-5)),
        noise_seed=read_noise_seed_file(seed_file) if seed_file else None,
        relation=relation_of_run_config(rc),  # replace_one for `fedpriv deploy run`
        params=params,
        data_options=_data_options(str(rc.get("data-options", "") or "")),
    )
    users_per_node = int(rc.get("users-per-node", 0) or 0)
    engine = {
        # 0 (the default of `flwr run .`): the users are split over the nodes that register
        # (ceil(users / nodes)), unless `set` gives nodes or users_per_node
        "users_per_node": users_per_node or None,
        "users_from_nodes": users_per_node == 0,
        # the launcher's token (scripts/run.sh): the job runs only on nodes that report it
        "run_token": str(rc.get("run-token", "") or ""),
        "round_timeout": float(rc.get("round-timeout", 0.0)),
        "node_wait": float(rc.get("node-wait", 120.0)),
        "work_dir": str(rc.get("work-dir", "") or "") or None,  # a work dir keeps the checkpoint: rerun to resume
        "device": str(
            rc.get("server-device", "cpu") or "cpu"
        ),  # where the ServerApp computes (the nodes: their own config)
    }
    return job, engine


def relation_of_run_config(rc) -> str:
    """The neighbouring relation of every epsilon of the run (run-config key ``neighbouring``):
    ``replace_one`` for ``fedpriv deploy run`` (its enrolled count is public), else ``add_remove``."""
    return check_relation(str(rc.get("neighbouring", ADD_REMOVE) or ADD_REMOVE), field="neighbouring")


@app.main()
def server_main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    job, engine = job_of_run_config(rc)
    out = Path(str(rc.get("out", "runs/flwr"))).expanduser()
    # one line per round, then a summary table (mirrored to `flwr run --stream`); every epsilon
    # holds under the job's relation (run-config key ``neighbouring``)
    outcome = job.prepare().execute(FlowerGrid(grid=grid, **engine), progress=True)
    write_outputs(out, outcome.report.to_json(), outcome.ledger)
    log.info("fedpriv: wrote %s and %s", out / "metrics.json", out / "ledger.json")
    save_model = str(rc.get("save-model", "") or "")
    if save_model and outcome.model is not None:
        outcome.model.save(Path(save_model).expanduser())
        log.info("fedpriv: saved the released model to %s", save_model)
