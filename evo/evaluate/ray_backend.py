"""The Ray backend (`workers: {backend: ray, address: auto}`): each GPU worker is a Ray actor that takes one GPU
(num_gpus=1, so Ray sets its CUDA_VISIBLE_DEVICES) and compiles are Ray tasks. The actors speak the same worker
protocol as the local backend (pool.Worker), so the pool, the queue and the accounting are the same.

Ray is an optional extra (`pip install 'ptx-kernel-factory[ray]'`); nothing else imports this module. Every node
of the cluster needs this package installed (the actors import it)."""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Mapping

from .compile import CompileJob, CompileOutput, Compiler, compile_one
from .pool import WorkerDied


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached: one line saying which and what to do."""


def ray_module():
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable("workers.backend 'ray' needs Ray: pip install 'ptx-kernel-factory[ray]'") from exc
    return ray


def connect(address: str) -> Any:
    """Join the cluster at `address` unless this process already did (tests start a local one themselves)."""
    ray = ray_module()
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayUnavailable(f"workers.address {address!r}: no Ray cluster to join ({exc}); start one with "
                                 f"`ray start --head` or set workers.address") from exc
    return ray


class SimActor:
    """A simulated GPU as a Ray actor: holds each request for its recorded gpu_s (sim_worker.hold)."""

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        from .sim_worker import hold
        return hold(request)

    def pid(self) -> int:
        return os.getpid()


class GpuActor:
    """A GPU worker as a Ray actor: the actor owns one GPU (Ray set CUDA_VISIBLE_DEVICES) and runs the usual
    worker process on it (worker_process.WorkerHandle: restart after a fault, watchdog, known-good proof at every start)."""

    def __init__(self, setup: dict[str, Any]):
        from .worker_process import WorkerHandle
        self.handle = WorkerHandle(setup)

    def ready(self) -> dict[str, Any]:
        return self.handle.ready

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        request = dict(request)
        deadline_s = float(request.pop("deadline_s", 600.0))
        reply = self.handle.ask(request, deadline_s)
        return {"baseline_us": self.handle.setup.get("baseline_us"), **reply, "restarts": self.handle.restarts}

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.handle.close()


class RayWorker:
    """A pool.Worker in front of one actor. The actor is not restarted by Ray: the pool respawns a fresh one."""

    def __init__(self, ray: Any, actor_cls: type, index: int, *args: Any):
        self.ray, self.name = ray, f"ray{index}"
        remote = ray.remote(num_gpus=1, num_cpus=0, max_restarts=0, max_concurrency=1)(actor_cls)
        self.actor = remote.remote(*args)
        self.pid = ray.get(self.actor.pid.remote())   # waits until the actor is placed and constructed

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        from ray.exceptions import RayActorError, WorkerCrashedError
        try:
            return self.ray.get(self.actor.ask.remote(dict(request)))
        except (RayActorError, WorkerCrashedError) as exc:
            raise WorkerDied(f"Ray actor {self.name} is gone: {type(exc).__name__}") from exc

    def ready(self) -> dict[str, Any]:
        return self.ray.get(self.actor.ready.remote())

    def close(self) -> None:
        try:
            if hasattr(self.actor, "close"):
                self.ray.get(self.actor.close.remote(), timeout=30)
        except Exception:
            pass   # a dead actor has nothing to close
        self.ray.kill(self.actor, no_restart=True)


def spawner(address: str, actor_cls: type, *args: Any) -> Callable[[int], RayWorker]:
    ray = connect(address)
    return lambda index: RayWorker(ray, actor_cls, index, *args)


def gpu_count(address: str) -> int:
    """GPUs the cluster has: one worker actor each."""
    return int(connect(address).cluster_resources().get("GPU", 0))


class RayCompiler(Compiler):
    """Compiles as Ray tasks (one CPU each) anywhere in the cluster; the cache stays with the driver."""

    def __init__(self, cache_dir: str, address: str):
        super().__init__(cache_dir, 1)
        self.ray = connect(address)
        self._task = self.ray.remote(num_cpus=1)(compile_one)

    def _compile(self, pending: list[CompileJob]) -> Iterator[CompileOutput]:
        refs = [self._task.remote(job) for job in pending]
        while refs:
            done, refs = self.ray.wait(refs, num_returns=1)
            out = self.ray.get(done[0])
            self.done(out)
            yield out

    def close(self) -> None:
        pass   # the tasks belong to the cluster
