"""First-call tuning of the exported op: on the first call of a new (GPU, dtype, M, N), time every kernel the table
holds for that dtype on the call's own tensors and keep the fastest, for this process and on disk.

Why: the learned rule picks one genome per shape from a few dozen training shapes, and on shapes left out of its
learning that pick is often well behind the best of the genomes its campaign found (docs/op.md, "Which kernel").
Timing the table's kernels on the shape itself closes most of that, as QuACK's and Triton's autotuners do, without
compiling anything: every candidate is a shipped cubin.

How it times: each candidate is launched once to load it, then in R rounds (R from 3 to 9, fewer for slow
kernels), each round every candidate in a rotated order, each launch after a write of twice the L2 size (so that
it starts with a cold L2, as `kernel-factory bench` times) between two CUDA events; the fastest median wins. A call
being captured into a CUDA graph is not tuned (it cannot be timed): it takes the rule's pick, which is not kept.
Every candidate writes the call's own outputs; the chosen one runs last, so the outputs are its.

Switches: KF_TUNE=0 turns tuning off (the rule decides, as before); `with rule_only():` does so for one thread.
Choices are kept in a JSON file per table (by its sha256) in KF_TUNE_CACHE (a folder; empty: in memory only), by
default the per-user cache folder's kernel-factory/tuned: a later process reuses them and times nothing. Needs torch
only when it times.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

ROUNDS = (3, 9)             # rounds of timing per tuned shape, fewest for the slowest kernels
BUDGET_S = 0.25             # the rounds' GPU time a tuning aims at, past the first (loading) launch
ON = os.environ.get("KF_TUNE", "1") != "0"   # read once: the per-call path checks a flag, not the environment
_thread = threading.local()


def enabled() -> bool:
    """Whether this call may be tuned: KF_TUNE was not "0" at import and no rule_only() is in force on this thread."""
    return ON and not getattr(_thread, "rule_only", False)


@contextlib.contextmanager
def rule_only() -> Iterator[None]:
    """Within it, this thread's calls take the rule's pick (a benchmark of the rule, a deterministic run)."""
    before = getattr(_thread, "rule_only", False)
    _thread.rule_only = True
    try:
        yield
    finally:
        _thread.rule_only = before


def rounds_for(first_us: Sequence[float], scrub_us: float) -> int:
    """Rounds such that they take about BUDGET_S of GPU time, given each candidate's first launch and one L2 scrub
    (µs)."""
    per_round = sum(first_us) + scrub_us * len(first_us)
    if per_round <= 0:
        return ROUNDS[1]
    return max(ROUNDS[0], min(ROUNDS[1], int(BUDGET_S * 1e6 / per_round)))


def fastest(samples: Mapping[str, Sequence[float]]) -> str | None:
    """The candidate with the least median time (ties: the first given); None when none has a sample."""
    timed = [(statistics.median(v), i, name) for i, (name, v) in enumerate(samples.items()) if v]
    return min(timed)[2] if timed else None


class Choices:
    """Tuned picks of one table, by "device name|dtype|M|N", in a JSON file (None: in memory only). Read once;
    each new pick is merged into what the file holds then and written whole by a rename, so that processes tuning
    at once lose none of each other's picks but the same key's, which they agree on anyway."""

    def __init__(self, path: Path | None):
        self.path = path
        self._picks: dict[str, str] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def key(device: str, dtype: str, m: int, n: int) -> str:
        return f"{device}|{dtype}|{m}|{n}"

    def _read(self) -> dict[str, str]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            found = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}    # a damaged cache costs a tuning, never a call
        return {k: v for k, v in found.get("picks", {}).items() if isinstance(v, str)} if isinstance(found, dict) \
            else {}

    def get(self, key: str) -> str | None:
        with self._lock:
            if self._picks is None:
                self._picks = self._read()
            return self._picks.get(key)

    def put(self, key: str, genome: str) -> None:
        with self._lock:
            if self._picks is None:
                self._picks = self._read()
            self._picks[key] = genome
            if self.path is None:
                return
            merged = {**self._read(), key: genome}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_text(json.dumps({"picks": dict(sorted(merged.items()))}, indent=0) + "\n")
                os.replace(tmp, self.path)
            except OSError:
                pass     # a read-only cache folder: the pick still holds in this process


def cache_path(problem: str, table_sha: str, base: Path) -> Path | None:
    """Where one table's picks are kept: KF_TUNE_CACHE if set (a folder; empty: nowhere), else base; in it
    <problem>-<the table's sha256, 16 digits>.json."""
    given = os.environ.get("KF_TUNE_CACHE")
    if given is not None and not given:
        return None
    return (Path(given) if given else base) / f"{problem}-{table_sha[:16]}.json"


def time_candidates(launches: Mapping[str, Callable[[], None]], device: int) -> dict[str, list[float]]:
    """Each candidate's launch times (µs) on the current stream of `device`, as the module docstring says. A
    candidate whose first launch raises is left out (its error is not this call's: another candidate serves)."""
    import torch
    stream = torch.cuda.current_stream(device)
    try:
        size = 2 * int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (50 << 20))
        scrub = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
    except RuntimeError:   # no room for the scrub buffer: time with a warm L2 rather than not at all
        scrub = None

    def timed(run: Callable[[], None]) -> tuple[Any, Any]:
        if scrub is not None:
            scrub.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        run()
        end.record(stream)
        return start, end

    names, first = [], []
    for name, run in launches.items():
        try:
            run()
            first.append(timed(run))
            names.append(name)
        except Exception:   # e.g. a cluster the GPU cannot schedule here
            continue
    stream.synchronize()
    first_us = [s.elapsed_time(e) * 1e3 for s, e in first]
    scrub_us = 0.0
    if scrub is not None:   # what a round's scrubs add to its GPU time
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        scrub.zero_()
        end.record(stream)
        stream.synchronize()
        scrub_us = start.elapsed_time(end) * 1e3
    rounds = rounds_for(first_us, scrub_us)
    events: dict[str, list[tuple[Any, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            events[name].append(timed(launches[name]))
    stream.synchronize()
    return {n: [s.elapsed_time(e) * 1e3 for s, e in evs] for n, evs in events.items()}


def capturing() -> bool:
    """Whether the current stream is being captured into a CUDA graph (a launch there cannot be timed)."""
    import torch
    return bool(torch.cuda.is_current_stream_capturing())
