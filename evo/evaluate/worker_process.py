"""The GPU worker's process, seen from the parent: whether a GPU is usable here, starting the worker (spawned, on the
GPU its environment names), its setup and known-good proof, the watchdog that kills it past a deadline, restarts
after a fault, and parking it between the short runs of a campaign. What it runs is worker.py; gpu.py asks it."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from typing import Any, Mapping

from . import worker
from ..types import Status


def gpu_unavailable_reason() -> str | None:
    """None when a CUDA GPU and driver are usable here; else why not (one line)."""
    try:
        from cuda.bindings import runtime
        err, count = runtime.cudaGetDeviceCount()
    except Exception as exc:
        return f"CUDA runtime not usable ({type(exc).__name__}: {exc})"
    if err != runtime.cudaError_t.cudaSuccess:
        return f"no NVIDIA driver or GPU found ({err.name})"
    return None if count > 0 else "no CUDA device found"


class WorkerError(RuntimeError):
    """The GPU worker could not be started (setup failed or took too long)."""


_PARKED: dict[tuple, tuple[Any, Any]] = {}   # env -> (process, pipe) of a worker kept alive between evaluators
_PARKING = [False]


@contextlib.contextmanager
def parked_workers():
    """Inside: a closed evaluator's worker process stays alive and the next evaluator on the same GPU takes it over
    with its own setup (new cases, baseline and known-good check), so that a campaign of many short runs pays the
    worker's start (CUDA context, torch import) once. Outside: every parked worker is stopped."""
    _PARKING[0] = True
    try:
        yield
    finally:
        _PARKING[0] = False
        for proc, conn in _PARKED.values():
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send({"op": "stop"})
            proc.join(20)
            if proc.is_alive():
                proc.kill()
        _PARKED.clear()


class WorkerHandle:
    """One worker process and its pipe. Restarts it (reusing the measured baseline) after a fault or a hang."""

    def __init__(self, setup: dict[str, Any], setup_timeout_s: float = 600.0, env: Mapping[str, str] | None = None):
        self.setup = setup
        self.setup_timeout_s = setup_timeout_s
        self.env = dict(env or {})   # e.g. CUDA_VISIBLE_DEVICES: the GPU this worker owns (gpu_pool.py)
        self.restarts = 0
        self.ready: dict[str, Any] = {}
        self._start()

    def _start(self) -> None:
        parked = _PARKED.pop(tuple(sorted(self.env.items())), None)
        if parked is not None and parked[0].is_alive():
            self.proc, self.conn = parked
        else:
            ctx = multiprocessing.get_context("spawn")
            self.conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=worker.serve, args=(child,), daemon=True, name="kf-gpu-worker")
            with _environment(self.env):   # a spawned child takes the parent's environment at start
                self.proc.start()
            child.close()
        self.conn.send(self.setup)
        if not self.conn.poll(self.setup_timeout_s):
            self._kill()
            raise WorkerError(f"the GPU worker did not get ready within {self.setup_timeout_s:.0f} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            raise WorkerError(f"the GPU worker died during setup (exit code {self.proc.exitcode})") from None
        if msg["op"] != "ready":
            raise WorkerError(f"the GPU worker failed during setup:\n{msg.get('message', msg)}")
        self.ready = msg
        self.setup = {**self.setup, "baseline_us": msg["baseline_us"], "copy_gbps": msg["copy_gbps"],
                      "graph_mode": msg.get("graph_mode", {})}

    def _kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._start()

    def ask(self, request: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        self.conn.send(request)
        if not self.conn.poll(deadline_s):
            self._restart()
            return {"status": Status.TIMEOUT.value, "gpu_s": deadline_s,
                    "message": f"no answer within the {deadline_s:.0f} s watchdog deadline; worker killed"}
        try:
            reply = self.conn.recv()
        except EOFError:
            code = self.proc.exitcode
            self._restart()
            return {"status": Status.CRASHED.value, "gpu_s": 0.0,
                    "message": f"the GPU worker died (exit code {code}) while running this candidate"}
        if request.get("op") == "eval" and reply.get("baseline_us"):
            self.setup["baseline_us"] = reply["baseline_us"]   # a restart adopts the latest measurement
        if reply.get("fatal"):
            self._restart()
        return reply

    def close(self) -> None:
        key = tuple(sorted(self.env.items()))
        if _PARKING[0] and self.proc.is_alive() and key not in _PARKED:
            _PARKED[key] = (self.proc, self.conn)
            return
        try:
            self.conn.send({"op": "stop"})
            self.proc.join(20)
        except (OSError, BrokenPipeError):
            pass
        self._kill()


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _environment(env: Mapping[str, str]):
    """os.environ with `env` applied, for the duration of a child's start (serialized: one start at a time)."""
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
