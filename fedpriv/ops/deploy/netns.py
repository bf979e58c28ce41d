"""A SuperNode in a network namespace of its own (``fedpriv deploy up``).

Flower's SuperNode serves its Runtime API (where its ClientApp processes get their task) on
``127.0.0.1:PORT`` over plain HTTP. In subprocess isolation (Flower 1.39 to 1.42, the default)
that API asks for no credential before handing out a task: ``/v1/runtime/acquire-task`` returns
a pending task and its token to any caller (``flower-supernode`` logs that it ignores
``--superexec-auth-secret-file`` in this mode), and with that token ``pull-task-input`` returns
the node's ``context.state``: its client key (``fedpriv-secrets``) and its secure-summation state
(``fedpriv-secagg``: channel key, mask keys, shares). Whatever shares the SuperNode's network
namespace can reach that port: on a host where every SuperNode runs in the host's namespace
(``deploy up`` before this module, ``network_mode: host`` containers), that is every process on
the host (``tests/test_hostnet.py`` shows the attack and its defence).

This wrapper puts the SuperNode, and so its SuperExec and ClientApp processes, in a new network
namespace with only a loopback interface: its Runtime API port exists there only. It still
reaches the SuperLink on the host's loopback through a relay: the child that enters the new
namespace opens a listening socket on ``127.0.0.1:PORT`` there (the SuperLink's port, the same
address the SuperNode's ``--superlink`` names), hands it to this parent process (which stayed in
the host's namespace) over a socket pair, and execs the SuperNode. The parent accepts on that
socket and connects each connection to the same address in the host's namespace. TLS runs
end to end through the relay (the SuperNode still checks the SuperLink's certificate), so the
relay sees only ciphertext.

Root enters a new network namespace directly; another user through a new user namespace (its
own uid and gid mapped to themselves, no other privilege): :func:`unavailable` says why
neither works. Only the standard library: this file runs as a script (``python netns.py
--forward PORT [--forward PORT ...] -- COMMAND ...``), without importing the package.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import signal
import socket
import struct
import sys
import threading

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
LOOPBACK = "127.0.0.1"


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_own_network() -> None:
    """Move this process into a new network namespace and bring its loopback up (root: directly;
    another user: inside a new user namespace mapping only its own uid and gid)."""
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        _unshare(CLONE_NEWNET)
    else:
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # `ip link set lo up`
        ifr = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def network_namespace(pid: int | str = "self") -> int:
    """The inode of the network namespace of ``pid`` (equal inodes: the same namespace)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def unavailable() -> str | None:
    """None if this process can start a command in a network namespace of its own; else why not
    (a fresh interpreter tries it and exits: no fork of a threaded caller)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {sys.platform})"
    import subprocess

    try:
        r = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--check"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if r.returncode == 0 else ((r.stdout + r.stderr).strip().splitlines() or [f"exit {r.returncode}"])[-1]


def _check() -> int:
    try:
        enter_own_network()
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


# ------------------------------------------------------------------------------ the relay
def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _serve(listener: socket.socket, connect) -> None:
    """Accept on ``listener`` and join each connection to a new one from ``connect()``."""
    while True:
        try:
            inner, _ = listener.accept()
        except OSError:
            return
        try:
            outer = connect()
            outer.settimeout(None)
        except OSError:
            inner.close()
            continue
        for a, b in ((inner, outer), (outer, inner)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _to_port(port: int):
    """A connector to ``127.0.0.1:port`` in this process's namespace."""
    return lambda: socket.create_connection((LOOPBACK, port), timeout=10)


def _to_unix(path: str):
    """A connector to the Unix socket ``path``."""

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect(path)
        except OSError:
            s.close()
            raise
        return s

    return connect


def _loopback_listener(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((LOOPBACK, port))
    s.listen(64)
    return s


def _exec(command: list[str]) -> None:  # pragma: no cover (a forked child)
    """Replace this (forked) process by ``command``; exit 127, naming it, if it cannot run."""
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"fedpriv netns: cannot run {command[0]}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)


def _run_child(command: list[str], pid: int | None = None) -> int:
    """Wait for the child ``pid`` (forked by the caller) or start ``command``; signals to this
    process go to the child. Returns the child's exit status."""
    if pid is None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover (child)
            _exec(command)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if status else 0


def run_in_own_network(ports: list[int], command: list[str]) -> int:
    """Start ``command`` in a network namespace of its own where ``127.0.0.1:port`` (each of
    ``ports``) leads to the same address in this one; returns its exit status."""
    parent_sock, child_sock = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child: becomes the SuperNode)
        parent_sock.close()
        try:
            enter_own_network()
            listeners = [_loopback_listener(port) for port in ports]
            socket.send_fds(child_sock, [b"ok"], [s.fileno() for s in listeners])
        except BaseException as exc:  # noqa: BLE001
            print(
                f"fedpriv netns: could not give the SuperNode a network namespace of its own: {exc}",
                file=sys.stderr,
                flush=True,
            )
            child_sock.send(b"no")
            os._exit(70)
        for s in listeners:
            s.close()
        child_sock.close()
        _exec(command)
    child_sock.close()
    msg, fds, _, _ = socket.recv_fds(parent_sock, 16, len(ports))
    parent_sock.close()
    if msg == b"ok" and len(fds) == len(ports):
        for fd, port in zip(fds, ports):
            threading.Thread(target=_serve, args=(socket.socket(fileno=fd), _to_port(port)), daemon=True).start()
    return _run_child(command, pid)


# ------------------------------------------- containers: the same relay over a Unix socket
# A SuperNode container runs with ``network_mode: none`` (Docker gives it a network namespace
# with only a loopback interface, so its Runtime API port exists in that container only). The
# SuperLink's port reaches it through a Unix socket in a folder both sides mount: the
# ``relay`` service (the host's network) listens on ``DIR/superlink.sock`` and connects to
# ``127.0.0.1:PORT`` (:func:`unix_gateway`); in the node's container, ``127.0.0.1:PORT`` is a
# listener that connects to that socket (:func:`run_via_unix`). No capability, no bridge and no
# iptables rule is needed; TLS still runs end to end.
def unix_gateway(path: str, port: int) -> int:
    """Listen on the Unix socket ``path`` and join each connection to ``127.0.0.1:port``; runs
    until SIGTERM/SIGINT (the socket file is removed then)."""
    if os.path.exists(path) and not os.path.isdir(path):
        os.unlink(path)  # a stale socket of an earlier run
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)  # the nodes' containers may run under another uid
    listener.listen(64)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=_serve, args=(listener, _to_port(port)), daemon=True).start()
    print(f"fedpriv relay: {path} -> {LOOPBACK}:{port}", flush=True)
    stop.wait()
    listener.close()
    try:
        os.unlink(path)
    except OSError:
        pass
    return 0


def run_via_unix(forwards: list[tuple[int, str]], command: list[str]) -> int:
    """Start ``command`` where ``127.0.0.1:port`` (this process's own network, e.g. a container's)
    leads to the Unix socket ``path``, for each ``(port, path)``; returns its exit status."""
    for port, path in forwards:
        threading.Thread(target=_serve, args=(_loopback_listener(port), _to_unix(path)), daemon=True).start()
    return _run_child(command)


def _forward_spec(text: str) -> tuple[int, str]:
    port, sep, path = text.partition("=")
    if not sep or not port.isdigit() or not path:
        raise argparse.ArgumentTypeError(f"expected PORT=SOCKET_PATH, got {text!r}")
    return int(port), path


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="netns.py",
        description="run COMMAND in a network namespace of its own "
        "(--forward PORT: 127.0.0.1:PORT there leads to 127.0.0.1:PORT here); "
        "or, in a container of its own network, with --via-unix PORT=SOCKET "
        "(127.0.0.1:PORT leads to the Unix socket SOCKET); "
        "or serve --unix-gateway SOCKET --to PORT (the Unix socket SOCKET leads to 127.0.0.1:PORT)",
    )
    parser.add_argument("--forward", type=int, action="append", default=[], metavar="PORT")
    parser.add_argument("--via-unix", type=_forward_spec, action="append", default=[], metavar="PORT=SOCKET")
    parser.add_argument("--unix-gateway", metavar="SOCKET")
    parser.add_argument("--to", type=int, metavar="PORT")
    parser.add_argument("--check", action="store_true", help="only check that a network namespace can be made here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.check:
        return _check()
    if args.unix_gateway:
        if args.to is None:
            parser.error("--unix-gateway needs --to PORT")
        return unix_gateway(args.unix_gateway, args.to)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    if args.via_unix and args.forward:
        parser.error("--via-unix and --forward exclude each other")
    code = run_via_unix(args.via_unix, command) if args.via_unix else run_in_own_network(args.forward, command)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(_main())
