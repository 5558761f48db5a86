"""The process handling behind `kernel-factory ui`: refuse a port that is taken, say where the server listens, and
stop the server's whole process tree (the MLflow CLI starts uvicorn/gunicorn children) on Ctrl-C or SIGTERM, so that
no orphan keeps the port."""
from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from typing import Mapping, Sequence, TextIO

from ..config import ConfigError

STOP_GRACE_S = 10.0   # what the server gets to shut down after SIGTERM before its group is killed


def check_port(host: str, port: int) -> None:
    """A clear error now, rather than a server that dies on its own later with a traceback."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is already in use; stop what holds it or pass "
                                  f"--port with a free one") from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


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
          out: TextIO | None = None) -> int:
    """Run a server command in its own session until it ends, or until Ctrl-C / SIGTERM stop it and its children
    (the interrupt is raised again, so the CLI exits 130 or 143)."""
    out = out or sys.stderr
    check_port(host, port)
    shared = "" if host in ("127.0.0.1", "localhost", "::1") else " (reachable from other machines)"
    print(f"MLflow UI on http://{host}:{port}, listening on {host} only{shared}; "
          f"--host 0.0.0.0 shares it; Ctrl-C stops it", file=out, flush=True)
    proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, start_new_session=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop_tree(proc)
        raise
