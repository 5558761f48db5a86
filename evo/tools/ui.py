"""The process handling behind `kernel-factory ui`: refuse a port that is taken, say where the server listens once
it does, and stop the server's whole process tree (the MLflow CLI starts uvicorn/gunicorn children) on Ctrl-C or
SIGTERM, so that no orphan keeps the port."""
from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Mapping, Sequence, TextIO

from ..config import ConfigError

STOP_GRACE_S = 10.0      # what the server gets to shut down after SIGTERM before its group is killed
LISTEN_DEADLINE_S = 180.0  # MLflow's UI listens after about 7 s; a loaded machine takes longer, a broken one never
POLL_S = 0.25            # between connect attempts, spent waiting on the server process (so its end is seen at once)


def check_port(host: str, port: int) -> None:
    """A clear error now, rather than a server that dies on its own later with a traceback. SO_REUSEADDR, as the
    server sets it: the port of a UI stopped a moment ago stays in TIME_WAIT for a minute, and is free to listen on."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is already in use; stop what holds it or pass "
                                  f"--port with a free one") from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def listens(host: str, port: int) -> bool:
    """Whether a TCP connect to the port succeeds (a wildcard host is reached through loopback)."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=POLL_S):
            return True
    except OSError:
        return False


def wait_listening(proc: subprocess.Popen, host: str, port: int, deadline_s: float) -> int | None:
    """None once the server accepts a connection; its exit code if it ends first; -1 past the deadline."""
    end = time.monotonic() + deadline_s
    while not listens(host, port):
        try:
            return proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if time.monotonic() > end:
                return -1
    return None


def stop_tree(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the server's process group (its own session), then SIGKILL to whatever is left of it."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        try:   # the leader is gone; its children may not be
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        break


def serve(argv: Sequence[str], host: str, port: int, env: Mapping[str, str] | None = None,
          out: TextIO | None = None, deadline_s: float = LISTEN_DEADLINE_S) -> int:
    """Run a server command in its own session until it ends, or until Ctrl-C / SIGTERM stop it and its children
    (the interrupt is raised again, so the CLI exits 130 or 143). It says that it listens once a connect succeeds."""
    out = out or sys.stderr
    check_port(host, port)
    proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, start_new_session=True)
    try:
        ended = wait_listening(proc, host, port, deadline_s)
        if ended == -1:
            stop_tree(proc)
            print(f"kernel-factory: error: the MLflow UI did not listen on {host}:{port} within {deadline_s:.0f} s; "
                  f"stopped it (its own messages above say why)", file=out, flush=True)
            return 1
        if ended is not None:
            print(f"kernel-factory: error: the MLflow UI ended (exit code {ended}) before it listened on "
                  f"{host}:{port}; its own messages above say why", file=out, flush=True)
            return ended or 1
        where = ("only; --host 0.0.0.0 shares it" if host in ("127.0.0.1", "localhost", "::1")
                 else "(reachable from other machines)")
        print(f"MLflow UI on http://{host}:{port}, listening on {host} {where}; Ctrl-C stops it", file=out,
              flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        stop_tree(proc)
        print(f"MLflow UI on {host}:{port} stopped", file=out, flush=True)
        raise
