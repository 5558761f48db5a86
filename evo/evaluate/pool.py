"""Many workers behind one bounded queue: what keeps every GPU busy. Ready requests (rendered, compiled and
statically checked candidates) wait in the queue; one thread per worker takes the next one, asks its worker and
resolves the candidate's future. Results are keyed by candidate, never by arrival order, so a seed gives the same
run for any number of workers. A worker that dies is respawned and the candidate is asked again once (its death may
have been the host's fault), then classified as crashed. Busy time per worker and the queue's depth over time are
kept for the run's accounting.

Backends provide workers: local processes (sim_worker.py, gpu_pool.py) or Ray actors (ray_backend.py)."""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..types import Status

MAX_DEPTH_SAMPLES = 4096   # queue-depth samples kept (every second one is dropped beyond this)


class WorkerDied(Exception):
    """The worker process or actor is gone; the pool respawns it."""


class Worker(Protocol):
    """One GPU (or one simulated GPU): answers one request at a time. Failures of the candidate are replies;
    ask() raises WorkerDied only when the worker itself is gone."""

    name: str

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        ...

    def close(self) -> None:
        ...


@dataclass
class Lane:
    """One worker's thread and its books."""
    index: int
    worker: Worker
    busy_s: float = 0.0
    asked: int = 0
    respawns: int = 0
    thread: threading.Thread | None = None


@dataclass
class Job:
    key: str
    request: Mapping[str, Any]
    future: Future = field(default_factory=Future)


class Pool:
    """`spawn(i)` makes worker i (and makes it again after a death). `depth` bounds the ready queue: submit()
    blocks while it is full, so the host never runs further ahead than that."""

    def __init__(self, spawn: Callable[[int], Worker], count: int, depth: int = 0, retries: int = 1,
                 clock: Callable[[], float] = time.monotonic):
        if count < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {count}")
        self.spawn, self.retries, self.clock = spawn, retries, clock
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=depth or 2 * count)
        self.started = clock()
        self.depths: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self.futures: dict[str, Future] = {}
        self.lanes = [Lane(i, w) for i, w in enumerate(_spawn_all(spawn, count))]
        for lane in self.lanes:
            lane.thread = threading.Thread(target=self._serve, args=(lane,), daemon=True, name=f"kf-lane-{lane.index}")
            lane.thread.start()

    def submit(self, key: str, request: Mapping[str, Any]) -> Future:
        """The future of key's reply. A key asked before (in flight or answered) shares that future: the same
        candidate never reaches a worker twice, whoever asks."""
        with self._lock:
            if key in self.futures:
                return self.futures[key]
            job = Job(key, request)
            self.futures[key] = job.future
        self.queue.put(job)
        self._sample()
        return job.future

    def map(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
        """Ask every (key, request) and wait for all: replies by key."""
        futures = [(key, self.submit(key, req)) for key, req in items]
        return {key: fut.result() for key, fut in futures}

    def _sample(self) -> None:
        with self._lock:
            self.depths.append((self.clock() - self.started, self.queue.qsize()))
            if len(self.depths) > MAX_DEPTH_SAMPLES:
                self.depths = self.depths[::2]

    def _serve(self, lane: Lane) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            self._sample()
            reply = self._ask(lane, job)
            job.future.set_result(reply)

    def _ask(self, lane: Lane, job: Job) -> dict[str, Any]:
        """Ask this lane's worker; after a death, respawn it and ask again (the same lane: re-queueing could
        block behind a full queue), up to `retries` times, then report the candidate as crashed."""
        for attempt in range(self.retries + 1):
            began = self.clock()
            try:
                reply = lane.worker.ask(job.request)
            except WorkerDied as exc:
                why = str(exc)
                lane.worker = self._respawn(lane)
                continue
            except Exception as exc:  # a worker's own bug must not hang the run: a value, like any failure
                reply = {"status": Status.CRASHED.value, "message": f"{type(exc).__name__}: {exc}", "gpu_s": 0.0}
            finally:
                lane.busy_s += self.clock() - began
            lane.asked += 1
            return {**reply, "worker": lane.worker.name}
        return {"status": Status.CRASHED.value, "gpu_s": 0.0, "worker": lane.worker.name,
                "message": f"the worker died {self.retries + 1} times while running this candidate ({why})"}

    def _respawn(self, lane: Lane) -> Worker:
        lane.respawns += 1
        try:
            lane.worker.close()
        except Exception:
            pass   # it is dead already; closing is best effort
        return self.spawn(lane.index)

    def accounting(self) -> dict[str, Any]:
        """Busy seconds per worker, respawns, and the ready queue's depth over time (seconds since start)."""
        with self._lock:
            depths = list(self.depths)
        return {"workers": {lane.worker.name: {"busy_s": round(lane.busy_s, 6), "asked": lane.asked,
                                               "respawns": lane.respawns} for lane in self.lanes},
                "queue_depth": depths, "queue_limit": self.queue.maxsize,
                "held_s": self.clock() - self.started}

    def close(self) -> None:
        for _ in self.lanes:
            self.queue.put(None)
        for lane in self.lanes:
            if lane.thread is not None:
                lane.thread.join(30)
            lane.worker.close()


def _spawn_all(spawn: Callable[[int], Worker], count: int) -> list[Worker]:
    """Start every worker at once (a GPU worker's setup takes seconds); the first failure is raised after the
    others were closed."""
    made: list[Any] = [None] * count

    def one(i: int) -> None:
        try:
            made[i] = spawn(i)
        except Exception as exc:
            made[i] = exc
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [w for w in made if isinstance(w, Exception)]
    if errors:
        for w in made:
            if not isinstance(w, Exception):
                w.close()
        raise errors[0]
    return made
