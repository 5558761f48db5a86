"""A simulated GPU worker: a process that holds each request for the latency the recording measured, so that the
pool, the queue and the loop can be run and measured at scale on a machine without GPUs (replay + workers.count).
It answers nothing of its own: the replay evaluator's recorded result is the answer; this only takes the time."""
from __future__ import annotations

import multiprocessing
import time
from typing import Any, Mapping

from .pool import WorkerDied

START_TIMEOUT_S = 300.0


def serve(conn) -> None:
    """Say ready, then hold each request for its `gpu_s` and echo its id."""
    conn.send({"op": "ready"})
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg.get("op") == "stop":
            return
        began = time.perf_counter()
        time.sleep(max(0.0, float(msg.get("gpu_s", 0.0))))
        conn.send({"op": "result", "id": msg.get("id"), "status": "ok", "gpu_s": time.perf_counter() - began})


def hold(request: Mapping[str, Any]) -> dict[str, Any]:
    """The same, in the caller's process (a Ray actor is already a process of its own)."""
    began = time.perf_counter()
    time.sleep(max(0.0, float(request.get("gpu_s", 0.0))))
    return {"op": "result", "id": request.get("id"), "status": "ok", "gpu_s": time.perf_counter() - began}


class SimWorker:
    """A local simulated worker process; a Worker for pool.Pool."""

    def __init__(self, index: int):
        ctx = multiprocessing.get_context("spawn")
        self.name = f"sim{index}"
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child,), daemon=True, name=f"kf-sim-worker-{index}")
        self.proc.start()
        child.close()
        # Started before the run asks anything: a GPU worker too is ready before its first candidate.
        if not self.conn.poll(START_TIMEOUT_S) or self.conn.recv().get("op") != "ready":
            self.close()
            raise WorkerDied(f"simulated worker {self.name} did not start within {START_TIMEOUT_S:.0f} s")

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        try:
            self.conn.send(dict(request))
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerDied(f"simulated worker {self.name} (pid {self.proc.pid}) is gone: "
                             f"{type(exc).__name__}") from exc

    def close(self) -> None:
        try:
            self.conn.send({"op": "stop"})
        except (OSError, ValueError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()
