"""Run a job through Flower's own runtime path: ``flwr run APP --stream``.

``flwr run`` starts a local SuperLink (simulation mode) that runs the fedpriv ServerApp and one
ClientApp per simulated node. :func:`flwr_run_plan` (the :class:`fedpriv.run.FlwrRun` engine) prepares
everything that command needs, so users do not have to:

* a minimal Flower app folder (``pyproject.toml`` only) whose components point at the
  *installed* fedpriv modules, so it works for a pip-installed fedpriv, not only from the repo;
* a fresh ``FLWR_HOME`` and fresh loopback ports per call, so the SuperLink it starts is ours
  alone and can be found by its command line;
* the offline environment (no telemetry, update check or dependency installation).

The SuperLink stays alive after ``flwr run`` returns; it is always stopped here, by PID, with
the processes it started. Every input is checked before anything starts (the same checks as
:meth:`fedpriv.run.Job.prepare`, whose plan also gives the number of partitions), so
bad input fails fast with a :class:`~fedpriv.errors.FedprivError` and writes nothing.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..util import atomic
from ..util.processes import (
    descendant_pids,
    pid_alive,
    pids_matching,
    pids_with_env,
    process_cmdline,
    stop_all,
    terminate_pids,
)  # noqa: F401 - re-exported
from ..algorithms.names import is_private
from ..errors import ConfigError, FedprivError
from ..run import FlowerOptions, Outcome, RunReport
from ..run.nodes import node_layout

HOME_PREFIX = "fedpriv-flwr-"  # temporary folders of this module: marks our SuperLinks
APP_NAME = "fedpriv-job"
STOP_SECONDS = 15.0  # SIGTERM, then SIGKILL after this long
TAIL_LINES = 80
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colour codes, stripped from captured output
# lines of Flower's log that mislead a fedpriv user: the federation's size is fedpriv's
# --nodes, not Flower's default or its simulation-config command
FLOWER_NOISE = re.compile(
    r"default simulated SuperNodes changed|To change federation size|"
    r"flwr federation simulation-config|Manually terminating ClientAppActor"
)
SUPERLINK_SLOW = "Failed to start local SuperLink"  # Flower's message when its SuperLink took over 15 s to start
ERROR_LINE = re.compile(
    r"\b(?:ConfigError|DataError|PrivacyError|FedprivError): (.+)$"
)  # a fedpriv error in `flwr run` output: group 1 the reason


# ------------------------------------------------------------------------------ validation
def flower_partitions(plan, users_per_node: int) -> int:
    """The checks a Flower run makes before anything starts, on a prepared plan (the privacy
    calibration, and what a Flower run refuses), and the number of partitions: the nodes it
    needs."""
    if plan.public is not None and users_per_node != plan.public.users_per_node:
        raise ConfigError(
            f"the partition put {plan.public.users_per_node} users on each node, got {users_per_node}",
            field="users-per-node",
        )
    plan.check_budget()
    return plan.partitions(users_per_node)


def _int_option(name: str, given, params: dict, key: str) -> int | None:
    """``--nodes``/``--users-per-node`` or the same key among the job's parameters."""
    raw = params.pop(key, None)
    value = given if given is not None else raw
    if value is None:
        return None
    try:
        f = float(value)
        if not (f.is_integer() and f >= 1):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"must be an integer >= 1, got {value!r}", field=name) from None
    return int(f)


def absolute_data_spec(data: str) -> str:
    """The data spec with an absolute path (the ServerApp does not run in our folder)."""
    from ..data.spec import parse_data_spec

    spec = parse_data_spec(data)
    if spec.path is None:
        return data
    spec.path = str(Path(spec.path).expanduser().resolve())
    return str(spec)


def param_text(value) -> str:
    """A job parameter as the run config's ``set`` holds it (``key=value,...``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def job_run_config(
    job,
    data: str,
    *,
    users_per_node: int,
    nodes: int,
    round_timeout: float,
    node_wait: float,
    params: dict | None = None,
    server_device: str | None = None,
) -> dict:
    """The run config (``flwr run --run-config``) of ``job``: its parameters (``params``, default
    the job's) as the ``key=value,...`` of ``set`` (a value holding ',' or ';' is an error naming
    its key), a tuning grid under ``tune``, and the Flower keys. ``nodes``: the nodes the
    ServerApp reports (every registered node is polled); ``server_device``: where the ServerApp
    computes (``server-device``; the nodes take theirs from their own configuration). The job's
    neighbouring relation goes as ``neighbouring`` (:func:`fedpriv.ops.flwr_app.relation_of_run_config`)."""
    texts = {str(k): param_text(v) for k, v in (job.params if params is None else params).items()}
    tune = texts.pop("tune", "")  # a tuning grid ("key=v1/v2;key2=...") has a run-config key of its own
    for key, value in texts.items():
        if "," in value or ";" in value:
            raise ConfigError(f"a value given to the flower engine cannot contain ',' or ';', got {value!r}", field=key)
    return {
        "algorithm": job.algorithm,
        "data": data,
        "epsilon": run_config_epsilon_value(job.algorithm, job.epsilon),
        "delta": float(job.delta),
        "users-per-node": users_per_node,
        "set": ",".join([*(f"{k}={v}" for k, v in texts.items()), f"nodes={nodes}"]),
        "round-timeout": float(round_timeout),
        "node-wait": float(node_wait),
        "tune": tune,
        "server-device": server_device or "cpu",
        "neighbouring": job.relation,
    }


def raise_run_failure(code: int, tail: list[str], no_output: str) -> None:
    """A failed ``flwr run``: the last fedpriv error in its output (else the exit code, or
    ``no_output`` when it exited 0), with the output's last lines."""
    reasons = [m.group(1) for line in tail if (m := ERROR_LINE.search(line))]
    what = f"`flwr run` exited with code {code}" if code != 0 else no_output
    raise FedprivError((f"{reasons[-1]} ({what})" if reasons else what) + "; last output:\n" + "\n".join(tail[-40:]))


def data_for_server(plan, work: Path) -> str:
    """The data spec the ServerApp of a ``flwr run`` subprocess reads: a built-in spec as is
    (absolute), anything else (csv/parquet with options, a DataFrame, a Dataset) written once
    to ``work/data`` as ``saved:DIR``."""
    from ..data.spec import FILE_KINDS, PUBLIC_KIND, SAVED_KIND, SYNTHETIC_KINDS

    spec = plan.spec
    if plan.job.dataset is None and (
        spec.kind in FILE_KINDS or spec.kind in SYNTHETIC_KINDS or spec.kind in (PUBLIC_KIND, SAVED_KIND)
    ):
        return absolute_data_spec(str(spec))
    from ..data.saved import save_dataset

    return f"{SAVED_KIND}:{save_dataset(plan.dataset, work / 'data')}"


# ------------------------------------------------------------------------------ app folder
def toml_value(v) -> str:
    """``v`` as a TOML value (bool, int, float, else a basic string)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    return json.dumps(str(v))  # a TOML basic string (ASCII, JSON escapes)


def write_app_folder(app_dir: Path) -> None:
    """A Flower app folder whose components are the installed fedpriv ServerApp/ClientApp.
    The run-config defaults are placeholders: the real values come with ``--run-config`` (an
    empty ``data`` makes the ServerApp fail loudly if they do not arrive)."""
    try:
        from importlib.metadata import version

        fedpriv_version = version("fedpriv")
    except Exception:  # noqa: BLE001 - not installed as a distribution (e.g. on sys.path only)
        fedpriv_version = "0.1.0"
    app_dir.mkdir(parents=True)
    (app_dir / "pyproject.toml").write_text(
        f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{APP_NAME}"
version = "{fedpriv_version}"
description = "One fedpriv job (components from the installed fedpriv package)"
license = {{ text = "Apache-2.0" }}
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedpriv"

[tool.flwr.app.components]
serverapp = "fedpriv.ops.flwr_app:app"
clientapp = "fedpriv.flower.client_app:app"

[tool.flwr.app.config]
algorithm = "als"
data = ""
epsilon = 1.0
delta = 1e-05
users-per-node = 1
set = ""
out = ""
round-timeout = 0.0
node-wait = 120.0
work-dir = ""
noise-seed-file = ""
tune = ""
data-options = ""
save-model = ""
server-device = "cpu"
neighbouring = "add_remove"
"""
    )


def write_run_config(path: Path, values: dict) -> None:
    """Write ``values`` as a TOML run-config file (``flwr run --run-config``)."""
    path.write_text("".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in values.items()))


# ------------------------------------------------------------------------------ processes
def superlink_pids(flwr_home: str | os.PathLike | None = None) -> list[int]:
    """PIDs of the local SuperLinks started with ``flwr_home`` as FLWR_HOME; without it, of
    every local SuperLink started by this module (FLWR_HOME in one of its temporary folders)."""
    if flwr_home is not None:
        return pids_matching("flower-superlink", f"{Path(flwr_home)}/local-superlink")
    return [
        p
        for p in pids_matching("flower-superlink", "/local-superlink")
        if re.search(rf"/{HOME_PREFIX}[^/ ]*/home/local-superlink", process_cmdline(p))
    ]


def stop_superlinks(
    flwr_home: str | os.PathLike, seconds: float = STOP_SECONDS, sweep_seconds: float = 5.0
) -> list[int]:
    """Stop the SuperLink(s) of ``flwr_home`` by PID, then whatever they started that is still
    running (ServerApp, simulation and Ray processes); returns the SuperLink PIDs."""
    pids = superlink_pids(flwr_home)
    if pids:
        below = descendant_pids(pids)  # taken before the SuperLink goes: its children are re-parented
        terminate_pids(pids, seconds)
        left = [p for p in below if pid_alive(p)]
        if left:
            terminate_pids(left, sweep_seconds)
    # whatever is left of the run (Ray's daemons and workers, a detached SuperExec): every
    # process started under this FLWR_HOME carries it in its environment
    stop_all(lambda: pids_with_env("FLWR_HOME", str(flwr_home)), sweep_seconds)
    return pids


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Ray's sockets live under its temporary folder, and a Unix socket path holds at most 107 bytes
#: (Ray adds about 70): a longer folder than this makes Flower's simulation crash
RAY_TMPDIR_MAX = 36


def ray_temp_dir(work: Path) -> Path:
    """A new folder for Ray's session files of one run: ``work/r`` when that path is short
    enough for Ray's sockets, else a new folder in /tmp (with any TMPDIR, however long). The
    caller removes it."""
    if len(str(work / "r")) <= RAY_TMPDIR_MAX:
        (work / "r").mkdir()
        return work / "r"
    return Path(tempfile.mkdtemp(prefix="fedpriv-ray-", dir="/tmp" if os.path.isdir("/tmp") else None))


def flwr_env(flwr_home: Path, ray_tmp: Path | None = None) -> dict[str, str]:
    """The environment of a ``flwr`` process: offline, our bin folder first on PATH, ``flwr_home``
    as FLWR_HOME, fresh loopback ports; ``ray_tmp``: Ray's temporary folder (:func:`ray_temp_dir`),
    so that a run's session files go with the run."""
    from ..flower.simulation import OFFLINE_ENV

    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    no_proxy = ",".join(x for x in (env.get("NO_PROXY", ""), "127.0.0.1,localhost") if x)
    env.update(
        FLWR_HOME=str(flwr_home),
        # flwr starts `flower-superlink` from PATH: ours first
        PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]),
        # our own loopback ports: no clash with (or reuse of) another local SuperLink
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(_free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(_free_port()),
        NO_PROXY=no_proxy,
        no_proxy=no_proxy,
        PYTHONUNBUFFERED="1",
    )
    if ray_tmp is not None:
        env["RAY_TMPDIR"] = str(ray_tmp)
    return env


def _flwr_command(bin_dir: Path) -> list[str]:
    exe = bin_dir / "flwr"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("flwr")
    if found is None:
        raise FedprivError(
            f"the `flwr` command was not found (looked in {bin_dir} and on PATH); install flwr[simulation]"
        )
    return [found]


def run_streaming(cmd: list[str], *, cwd: Path, env: dict, quiet: bool, timeout: float | None) -> tuple[int, list[str]]:
    """Run ``cmd`` with stdout+stderr merged; echo it to our stderr unless ``quiet``; returns
    (exit code, the last lines). The command is killed on timeout or interrupt."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    # its own session: a Ctrl-C at the terminal reaches fedpriv alone, which stops the run
    # (fedpriv.util.stopping) instead of `flwr` printing its traceback
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )
    colour = sys.stderr.isatty()

    def pump():
        for line in proc.stdout:
            plain = ANSI_ESCAPE.sub("", line.rstrip("\n"))
            tail.append(plain)
            if not quiet and not FLOWER_NOISE.search(plain):
                sys.stderr.write(line if colour else plain + "\n")  # no colour codes in a log file
                sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FedprivError(
            f"`flwr run` did not finish within {timeout:g} s; last output:\n" + "\n".join(tail)
        ) from None
    finally:
        if proc.poll() is None:
            stop_all(lambda: [proc.pid] if proc.poll() is None else [], 5.0, rounds=1)
            proc.wait()
        reader.join(timeout=5)
        proc.stdout.close()
    return code, list(tail)


# ------------------------------------------------------------------------------ the launcher
@dataclass(frozen=True)
class FlwrRun(FlowerOptions):
    """``flwr run`` on Flower's local simulation federation, in a subprocess with its own
    SuperLink, FLWR_HOME and ports (stopped by PID at the end): what ``--engine flower`` means,
    on the command line and in Python. Data that is not a built-in spec is written once to the
    job's work folder and read there; the released model comes back from the ServerApp."""

    quiet: bool = False
    timeout: float | None = None
    flwr_home: str | os.PathLike | None = None

    def execute(self, plan, *, progress: bool = False, second_opinion: bool = True) -> Outcome:
        metrics, records, model = flwr_run_plan(
            plan, self, quiet=self.quiet or not progress, second_opinion=second_opinion
        )
        return Outcome(RunReport.from_metrics(metrics), records, model, None, None, plan.dataset)


def run_config_epsilon_value(algorithm: str, epsilon: float | None) -> float:
    """The run config's ``epsilon``: the target of a private algorithm; a placeholder (1.0, which
    :func:`epsilon_of_run_config` reads back as None) for the others, since a run config holds
    no null."""
    return float(epsilon) if is_private(algorithm) and epsilon is not None else 1.0


def epsilon_of_run_config(run_config) -> float | None:
    """The epsilon a ServerApp runs with: None for a non-private algorithm."""
    return float(run_config["epsilon"]) if is_private(str(run_config.get("algorithm", "adadpals"))) else None


def write_noise_seed_file(path: Path, seed: int) -> str:
    """The noise seed of a reproducible run, in a file only its owner can read."""
    return str(atomic.write_text(path, f"{int(seed)}\n", mode=0o600))


def read_noise_seed_file(path: str) -> int:
    """The seed of ``noise-seed-file`` (a single integer); errors name the file."""
    try:
        text = Path(path).read_text().strip()
        return int(text)
    except OSError as exc:
        raise ConfigError(f"cannot read the noise seed file: {exc}", field="noise-seed-file") from None
    except ValueError:
        raise ConfigError(f"{path}: expected one integer", field="noise-seed-file") from None


def node_policy_file(plan, work: Path, *, nodes: int) -> str:
    """Write ``work/node-policy.json``, the simulated nodes' own policy (:meth:`NodePolicy.for_config
    <fedpriv.flower.node_policy.NodePolicy.for_config>` of the plan's options), and return its
    path: each node keeps its ledger in ``work/node-ledger/node-{partition}.json`` (the run's
    folder, removed with it) and caps its recommendation epsilon at the plan's (when the job
    has a recommendation phase)."""
    from ..flower.node_policy import NodePolicy

    job = plan.job
    rec = getattr(plan, "recommend", None)
    policy = NodePolicy.for_config(
        plan.config,
        epsilon=job.epsilon,
        delta=job.delta,
        nodes=nodes,
        reproducible=job.noise_seed is not None,
        ledger=str(Path(work) / "node-ledger" / "node-{partition}.json"),
        recommend=rec,
    )
    return policy.write(Path(work) / "node-policy.json")


def flwr_run_plan(plan, engine, *, quiet: bool = False, second_opinion: bool = True):
    """Run a prepared plan with ``flwr run`` on ``engine``'s nodes (a :class:`~fedpriv.run.FlwrRun`:
    default one node per partition of its users per node, default 1); returns (metrics, ledger
    records, released model or None). Everything is checked before ``flwr run`` starts.

    ``engine.flwr_home`` (an empty or missing folder) replaces the temporary FLWR_HOME, e.g. to
    find the SuperLink from outside; it is not removed. ``engine.timeout`` bounds the call. A
    reproducible run's noise seed goes to the ServerApp in a file readable by this user only
    (run-config key ``noise-seed-file``), never in the run config itself, which every node can read."""
    from ..flower.node_identity import ENV as NODE_IDENTITY_ENV, provision as provision_identities
    from ..run.model import load_model, public_data_label

    t0 = time.perf_counter()
    job = plan.job
    params = dict(job.params)
    upn = _int_option("--users-per-node", engine.users_per_node, params, "users_per_node")
    n_nodes = _int_option("--nodes", engine.nodes, params, "nodes")
    round_timeout = float(
        engine.round_timeout if engine.round_timeout is not None else params.pop("round_timeout", 0.0)
    )
    node_wait = float(engine.node_wait if engine.node_wait is not None else params.pop("node_wait", 120.0))
    if plan.public is not None and upn is None:
        upn = int(plan.public.users_per_node)
    layout = node_layout(plan.n_users, nodes=n_nodes, users_per_node=upn)
    n_nodes, upn = layout.nodes, layout.users_per_node
    flower_partitions(plan, upn)
    run_config = job_run_config(
        job,
        "",
        users_per_node=upn,
        nodes=n_nodes,
        round_timeout=round_timeout,
        node_wait=node_wait,
        params=params,
        server_device=engine.device,
    )
    work = Path(tempfile.mkdtemp(prefix=HOME_PREFIX)).resolve()
    home = Path(engine.flwr_home).expanduser().resolve() if engine.flwr_home is not None else work / "home"
    ray_tmp = None
    try:
        run_config["data"] = data_for_server(plan, work)
        home.mkdir(parents=True, exist_ok=True)
        app_dir, job_out, model_dir = work / "app", work / "out", work / "model"
        write_app_folder(app_dir)
        run_config["out"] = str(job_out)
        run_config["save-model"] = str(model_dir)
        if job.noise_seed is not None:
            run_config["noise-seed-file"] = write_noise_seed_file(work / "noise-seed", job.noise_seed)
        write_run_config(work / "run-config.toml", run_config)
        ray_tmp = ray_temp_dir(work)  # removed with the run (its own folder when work's path is long)
        env = flwr_env(home, ray_tmp)
        from ..flower.node_policy import POLICY_ENV

        # the nodes' own policy (fedpriv.flower.node_policy), from the user's options (the user
        # operates every simulated node; never from the run config, which the server reads), with
        # a file ledger per node in the run's folder (every job of the run, every candidate of a
        # private tuning included, runs in this one `flwr run`: one ledger bounds them all)
        env[POLICY_ENV] = node_policy_file(plan, work, nodes=n_nodes)
        # every temporary file of the run's processes (the ServerApp's copy of the node data, the
        # nodes' splits) lands in the run's folder: removed with it, even when they are killed
        (work / "tmp").mkdir()
        env["TMPDIR"] = str(work / "tmp")
        if not env.get(NODE_IDENTITY_ENV):  # the nodes' signing keys and roster, removed with the run
            provision_identities(work / "identity", n_nodes)
            env[NODE_IDENTITY_ENV] = str(work / "identity")
        cmd = [
            *_flwr_command(Path(sys.executable).parent),
            "run",
            str(app_dir),
            "--stream",
            "--federation-config",
            f"num-supernodes={n_nodes}",
            "--run-config",
            str(work / "run-config.toml"),
        ]
        for attempt in range(2):
            try:
                code, tail = run_streaming(cmd, cwd=work, env=env, quiet=quiet, timeout=engine.timeout)
            except BaseException:  # a stop signal (fedpriv.util.stopping), a timeout: stop it all now
                stop_superlinks(home, seconds=2.0, sweep_seconds=2.0)
                raise
            stop_superlinks(home)
            if attempt == 0 and code != 0 and any(SUPERLINK_SLOW in line for line in tail):
                # a busy machine: Flower gives its local SuperLink 15 s to start; once more, on fresh ports
                env.update({k: v for k, v in flwr_env(home, ray_tmp).items() if k.startswith("FLWR_LOCAL_")})
                continue
            break
        metrics_path, ledger_path = job_out / "metrics.json", job_out / "ledger.json"
        if code != 0 or not (metrics_path.is_file() and ledger_path.is_file()):
            raise_run_failure(code, tail, "`flwr run` wrote no metrics.json")
        metrics = json.loads(metrics_path.read_text())
        ledger = json.loads(ledger_path.read_text())
        model = load_model(model_dir) if model_dir.is_dir() else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if ray_tmp is not None:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    if run_config["data"].startswith("saved:"):  # name the user's data, not the work folder it went through
        metrics["dataset"] = str(plan.spec)
        if isinstance(metrics.get("config"), dict):
            metrics["config"]["data"] = str(plan.spec)
        if model is not None:
            model.info["dataset"] = public_data_label(str(plan.spec))
    # with Flower start-up and stop; none for a tuned run: its time would tell the number of runs K
    metrics["launcher_wall_seconds"] = None if metrics.get("tuning") else time.perf_counter() - t0
    return metrics, ledger, model
