"""The live GPU evaluator on every GPU of a host (`workers.backend: local`, one worker process per GPU with its
own CUDA_VISIBLE_DEVICES) or of a Ray cluster (`workers.backend: ray`, one actor per GPU). Compiles run on the CPU
pool (Ray tasks under Ray) ahead of the GPUs; a bounded queue of compiled, statically checked candidates feeds the
workers. Each worker measures its own baseline at its start and every candidate's fitness is taken against the
baseline of the GPU and process that timed it. The worker's gate and timing protocol are gpu.py's, unchanged."""
from __future__ import annotations

import inspect
import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..config import ConfigError, WorkersConfig
from . import static_check
from .gpu import GpuEvaluator, hash_seed, timer_reads, _unique
from .worker_process import WorkerHandle
from .pool import Pool
from ..types import Candidate, EvalResult, Status


def local_devices(gpus: str | tuple[int, ...]) -> list[str]:
    """CUDA_VISIBLE_DEVICES values, one per worker: every GPU this process may see, or the listed indices (taken
    within an inherited CUDA_VISIBLE_DEVICES, when one is set)."""
    from cuda.bindings import runtime
    _, count = runtime.cudaGetDeviceCount()
    inherited = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    visible = inherited[:count] if inherited else [str(i) for i in range(count)]
    if gpus == "all":
        return visible
    bad = [i for i in gpus if i >= len(visible)]
    if bad:
        raise ConfigError(f"config key 'workers.gpus': {bad} not among the {len(visible)} GPU(s) visible here "
                          f"(indices 0..{len(visible) - 1})")
    return [visible[i] for i in gpus]


class GpuSlot:
    """A local pool.Worker: one worker_process.WorkerHandle whose process sees only its GPU."""

    def __init__(self, index: int, device: str, setup: dict[str, Any]):
        self.name = f"gpu{device}"
        self.handle = WorkerHandle(setup, env={"CUDA_VISIBLE_DEVICES": device})

    def ready(self) -> dict[str, Any]:
        return self.handle.ready

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        request = dict(request)
        deadline_s = float(request.pop("deadline_s"))
        reply = self.handle.ask(request, deadline_s)   # a fault or a hang: restarted there, candidate classified
        return {"baseline_us": self.handle.setup.get("baseline_us"), **reply, "restarts": self.handle.restarts}

    def close(self) -> None:
        self.handle.close()


class PoolAsker:
    """What GpuEvaluator calls its worker, over the pool: retime requests go to whichever GPU is free."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.ready: dict[str, Any] = pool.lanes[0].worker.ready()
        self._n = 0

    def ask(self, request: Mapping[str, Any], deadline_s: float) -> dict[str, Any]:
        self._n += 1
        return self.pool.submit(f"{request['op']}:{request['id']}:{self._n}",
                                {**request, "deadline_s": deadline_s}).result()

    @property
    def restarts(self) -> int:
        return sum(lane.respawns for lane in self.pool.lanes)

    def close(self) -> None:
        self.pool.close()


class PooledGpuEvaluator(GpuEvaluator):
    """GpuEvaluator with one worker per GPU behind a pool. Option (besides GpuEvaluator's, from config
    `workers`): the backend, its GPUs or cluster address, and the ready queue's depth."""

    def __init__(self, *args: Any, workers: WorkersConfig, **kwargs: Any):
        self.workers_cfg = workers
        self._first: dict[str, str] = {}   # launch identity -> the candidate that ran it
        super().__init__(*args, **kwargs)
        if workers.backend == "ray":   # compiles as Ray tasks from here on (the known-good one ran locally)
            from .ray_backend import RayCompiler
            self.compiler.close()
            self.compiler = RayCompiler(str(Path(self.compiler.cache.root)), workers.address)

    def start_workers(self, setup: dict[str, Any]) -> PoolAsker:
        w = self.workers_cfg
        setup = {k: v for k, v in setup.items() if k not in ("baseline_us", "copy_gbps")}  # each GPU its own
        if w.backend == "ray":
            from . import ray_backend
            count = ray_backend.gpu_count(w.address)
            if count < 1:
                raise ConfigError(f"config key 'workers.address': the Ray cluster at {w.address!r} has no GPU")
            spawn = ray_backend.spawner(w.address, ray_backend.GpuActor, setup)
        else:
            devices = local_devices(w.gpus)
            count = len(devices)
            spawn = lambda i: GpuSlot(i, devices[i], setup)   # noqa: E731
        self.pool = Pool(spawn, count, w.queue_depth)
        return PoolAsker(self.pool)

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        """Each candidate enters the ready queue as soon as its binaries exist; the GPUs take them in turn."""
        results = static_check.refusals(self.problem.template(), candidates, "gpu")
        owner: dict[str, list[tuple[Candidate, str]]] = {}
        jobs = []
        for cand in (c for c in candidates if c.id not in results):
            for dt, job in zip(self.dtypes, self._jobs(cand)):
                owner.setdefault(job.key, []).append((cand, dt))
                jobs.append(job)
        built: dict[str, dict] = {c.id: {} for c in candidates}
        queued: dict[str, tuple[Future, str, dict, tuple]] = {}
        for out in self.compiler.compile_many(_unique(jobs)):
            for cand, dt in owner[out.key]:
                built[cand.id][dt] = out
                if len(built[cand.id]) == len(self.dtypes) and cand.id not in results and cand.id not in queued:
                    early = self._queue(cand, built[cand.id])
                    if isinstance(early, EvalResult):
                        results[cand.id] = early
                    else:
                        queued[cand.id] = early
        for cid, (future, key, build, flags) in queued.items():
            results[cid] = self._answer(cid, future.result(), key, build, flags)
        return [results[c.id] for c in candidates]

    def _queue(self, cand: Candidate, outputs: Mapping[str, Any]) -> EvalResult | tuple:
        """A result known before the GPU (compile error, binary seen before, timer reads), or the queued ask."""
        known, build, cubins, key = self.before_gpu(cand, outputs)
        if known is not None:
            return known
        refused = timer_reads(cubins) if cand.genome.patch else None
        if refused:
            return EvalResult(cand.id, Status.REJECTED, build=build, evaluator="gpu", message=refused)
        # Keyed by what the GPU would run: a binary-identical twin in flight shares the first one's answer.
        request = {"op": "eval", "id": cand.id, "genes": cand.genome.gene_dict, "cubins": cubins,
                   "seed": hash_seed(self.seed, cand.id), "deadline_s": self.deadline_s(), **self._legs}
        future = self.pool.submit(key + (":first" if self._legs else ""), request)   # racing's first leg: its own
        self._first.setdefault(key, cand.id)
        self.cubins.setdefault(cand.id, cubins)
        return future, key, build, self.sass_flags(cand, outputs)

    def _answer(self, cid: str, reply: Mapping[str, Any], key: str, build, flags) -> EvalResult:
        if self._first.get(key) != cid:   # the twin of a candidate that ran
            first = self.seen.reuse(cid, key, build)
            if first is not None:
                return first
        result = self.result(cid, reply, build, flags)
        if result.status is not Status.OK:
            self.cubins.pop(cid, None)
        self.seen.remember(key, result)
        return result

    def accounting(self) -> dict[str, Any]:
        return {"backend": self.workers_cfg.backend, "simulated": False, "compile_s": self.compiler.compile_s,
                "compiled": self.compiler.compiled, **self.pool.accounting(), **super().accounting()}


# The config's `evaluator.gpu` options are checked against the constructor's signature (build.construct): show
# GpuEvaluator's options plus `workers`, not *args/**kwargs.
_BASE = inspect.signature(GpuEvaluator.__init__)
PooledGpuEvaluator.__init__.__signature__ = _BASE.replace(  # type: ignore[attr-defined]
    parameters=[*_BASE.parameters.values(), inspect.Parameter("workers", inspect.Parameter.KEYWORD_ONLY)])
