"""The replay evaluator behind a pool of simulated workers (`workers.count`): the answers are the recording's, and
each candidate that the recording says took the GPU time holds one worker for that long (x workers.time_scale).
This runs the scale-out machinery (queue, workers, respawns, Ray actors, steady-state search) without a GPU, and
measures its throughput with the latencies recorded on the real one."""
from __future__ import annotations

import threading
from typing import Any, Sequence

from .pool import Pool
from .replay import ReplayEvaluator
from ..protocols import EvaluatorInfo
from ..types import Candidate, EvalResult


class PooledReplay:
    """An Evaluator: ReplayEvaluator's results, after the pool's workers have held each one for its gpu_s."""

    def __init__(self, inner: ReplayEvaluator, pool: Pool, time_scale: float, backend: str):
        self.inner, self.pool, self.time_scale, self.backend = inner, pool, time_scale, backend
        self.info: EvaluatorInfo = inner.info
        self.space = inner.space
        self._lock = threading.Lock()   # steady-state search evaluates from several threads

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        with self._lock:
            results = self.inner.evaluate(candidates)
        return self._hold(results)

    def time_first(self, candidates: Sequence[Candidate], cases: Sequence[str]) -> list[EvalResult]:
        with self._lock:
            results = self.inner.time_first(candidates, cases)
        return self._hold(results)

    def time_rest(self, candidates: Sequence[Candidate], first: Sequence[EvalResult]) -> list[EvalResult]:
        with self._lock:
            results = self.inner.time_rest(candidates, first)
        return self._hold(results)

    def _hold(self, results: list[EvalResult]) -> list[EvalResult]:
        """The pool's workers hold each result for the GPU time it charges (racing: each leg's own)."""
        timed = [(r.candidate_id, {"op": "eval", "id": r.candidate_id, "gpu_s": r.gpu_s * self.time_scale})
                 for r in results if r.gpu_s > 0]
        self.pool.map(timed)
        return results   # keyed answers from the recording: the same whichever worker held which candidate

    def accounting(self) -> dict[str, Any]:
        return {"backend": self.backend, "simulated": True, "time_scale": self.time_scale, **self.pool.accounting()}

    def close(self) -> None:
        self.pool.close()
        self.inner.close()


def simulate(inner: ReplayEvaluator, backend: str, count: int, depth: int, time_scale: float,
             address: str = "auto") -> PooledReplay:
    """`count` simulated workers: local processes, or Ray actors that each take one (possibly fake) GPU."""
    if backend == "ray":
        from . import ray_backend
        spawn = ray_backend.spawner(address, ray_backend.SimActor)
    else:
        from .sim_worker import SimWorker
        spawn = SimWorker
    return PooledReplay(inner, Pool(spawn, count, depth), time_scale, backend)
