"""A run's books on where the time went: GPU-seconds per GPU (worker), host compile seconds, the ready queue's
depth over time, LLM tokens, the GPU's idle time waiting for compiles, racing's cuts, and the throughput in
candidates gated and timed per GPU-minute, both per busy GPU-minute (the worker's own time) and per held GPU-minute
(GPUs x wall clock: what idling costs shows here).
The summary, the journal's end record and MLflow carry it."""
from __future__ import annotations

import json
import statistics
from typing import Any, Mapping, Sequence

from .types import Candidate, EvalResult, Status

LLM_USAGE_NOTE = "llm/usage.json"   # the note an LLM operator leaves on its candidate (observers/mlflow.py reads it)
DEPTH_SAMPLES = 200                 # queue-depth samples kept in the summary (evenly thinned)


def llm_tokens(candidates: Sequence[Candidate]) -> dict[str, int]:
    out = {"prompt": 0, "completion": 0, "calls": 0}
    for c in candidates:
        text = c.notes.get(LLM_USAGE_NOTE)
        if text:
            usage = json.loads(text)
            out["prompt"] += int(usage.get("prompt_tokens", 0))
            out["completion"] += int(usage.get("completion_tokens", 0))
            out["calls"] += 1
    return out


def compile_seconds(results: Sequence[EvalResult]) -> float:
    """Host seconds that fresh compiles took (cache hits cost none)."""
    return sum(info.compile_s or 0.0 for r in results for info in r.build.values() if not info.cached)


def of(evaluator: Any, pairs: Sequence[tuple[Candidate, EvalResult]], wall_s: float) -> dict[str, Any]:
    """The books for one run from its evaluator's own (a pool's busy time and queue depths) and its results."""
    books: Mapping[str, Any] = evaluator.accounting() if hasattr(evaluator, "accounting") else {}
    results = [r for _, r in pairs]
    simulated = bool(books.get("simulated"))
    counted = [r for r in results if r.gpu_s > 0 and (r.evaluator == "gpu" or simulated)]
    timed = sum(1 for r in counted if r.times_us)
    cut = sum(1 for r in counted if r.status is Status.CUT)   # racing: gated, timed on the cheap cases, outrun
    workers = {name: w["busy_s"] for name, w in books.get("workers", {}).items()}
    if not workers:   # the inline worker: its time is what its results say
        workers = {"gpu0": sum(r.gpu_s for r in results if r.evaluator == "gpu")}
    busy = sum(workers.values())
    idle = float(books.get("compile_wait_s", 0.0))   # the GPU worker free, waiting for the next compile
    depths = [d for _, d in books.get("queue_depth", [])]
    step = max(1, len(books.get("queue_depth", [])) // DEPTH_SAMPLES)
    return {
        "backend": books.get("backend", "inline"), "simulated": simulated, "workers": len(workers),
        "gpu_s_per_worker": {k: round(v, 3) for k, v in sorted(workers.items())},
        "respawns": sum(w.get("respawns", 0) for w in books.get("workers", {}).values()),
        "compile_s_host": round(compile_seconds(results), 3),
        "queue_depth": {"limit": books.get("queue_limit", 0), "max": max(depths, default=0),
                        "mean": round(statistics.fmean(depths), 3) if depths else 0.0,
                        "samples": [(round(t, 3), d) for t, d in books.get("queue_depth", [])[::step]]},
        "llm_tokens": llm_tokens([c for c, _ in pairs]),
        "timed": timed, "wall_s": round(wall_s, 3),
        "timed_per_gpu_minute": timed / (busy / 60) if busy > 0 else 0.0,
        "timed_per_held_gpu_minute": timed / (len(workers) * wall_s / 60) if wall_s > 0 and timed else 0.0,
        "cut": cut, "evaluated_per_gpu_minute": (timed + cut) / (busy / 60) if busy > 0 else 0.0,
        "gpu_idle_compile_s": round(idle, 3),
        "gpu_idle_compile_fraction": round(idle / (idle + busy), 4) if idle + busy > 0 else 0.0,
        **({"baseline": dict(books["baseline"])} if books.get("baseline") else {}),
    }


def headline(books: Mapping[str, Any]) -> str:
    """One line for the console."""
    if not books.get("timed"):
        return ""
    what = "simulated workers (recorded latencies)" if books.get("simulated") else "GPU worker(s)"
    raced = (f", {books['cut']} cut by racing ({books['evaluated_per_gpu_minute']:.0f} gated candidates per busy "
             f"GPU-minute)") if books.get("cut") else ""
    # Only a live GPU worker waits for compiles (a replay's answers need none).
    idle = "" if books.get("simulated") else (f", GPU idle waiting for compiles {books['gpu_idle_compile_s']:.1f} s "
                                              f"({100 * books['gpu_idle_compile_fraction']:.0f}%)")
    return (f"throughput: {books['timed_per_held_gpu_minute']:.0f} timed candidates per held GPU-minute on "
            f"{books['workers']} {what} ({books['timed_per_gpu_minute']:.0f} per busy GPU-minute), "
            f"host compile {books['compile_s_host']:.1f} s, ready queue mean {books['queue_depth']['mean']:.1f} "
            f"of {books['queue_depth']['limit']}, LLM tokens {books['llm_tokens']['prompt']}+"
            f"{books['llm_tokens']['completion']}{raced}{idle}")
