"""Console output: what is being evaluated where, a progress bar with rate and ETA while a run goes, and one
summary line per generation, all through `logging` (the CLI sends it to stderr); the run's result, its best
candidate, is the one line printed to stdout, so that `kernel-factory run ... > best.txt` keeps just that."""
from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Mapping, Sequence, TextIO

from ..accounting import headline
from ..protocols import GenerationStats, RunInfo, RunSummary
from ..types import Candidate, EvalResult

BAR = 24
log = logging.getLogger("kernel_factory.run")


def progress(done: int, total: int, elapsed_s: float, what: str = "evaluated") -> str:
    """`[#####.....] 12/48 evaluated, 3.1/s, ETA 12 s`: the rate so far and the time left at that rate."""
    total = max(total, done)
    filled = int(BAR * done / total) if total else BAR
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    eta = f"ETA {(total - done) / rate:.0f} s" if rate > 0 and done < total else "ETA -"
    return f"[{'#' * filled}{'.' * (BAR - filled)}] {done}/{total} {what}, {rate:.1f}/s, {eta}"


class ConsoleObserver:
    def __init__(self, problem: Any = None, config: Any = None, stream: TextIO | None = None,
                 result_stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.progress_stream = stream or sys.stderr   # a terminal gets one bar redrawn in place
        self.results = result_stream   # None: sys.stdout at the time of writing (pytest's capture replaces it)
        self.total_evals: int | None = None
        self.done = 0
        self.clock, self.started = clock, clock()
        self.tty = self.progress_stream.isatty()
        self.replay = ""   # the replay label (protocols.replay_note) the closing lines carry, "" when live

    def _print(self, text: str) -> None:
        log.info(text)

    def on_start(self, run: RunInfo) -> None:
        search = run.config["search"]
        self.total_evals = search["max_evaluations"] or search["population"] * (search["generations"] + 1)
        self._print(f"kernel-factory run {run.run_id}: problem {run.problem}, {len(run.cases)} benchmark cases, "
                    f"seed {run.seed}")
        self.replay = run.evaluator.replay_note()
        why = run.evaluator.fingerprint.get("why_replay")
        self._print(f"evaluator: {run.evaluator.kind} - {run.evaluator.label}" + (f" (no live GPU: {why})" if why else ""))
        if run.warm_start_from:
            runs = sorted(set(run.warm_start_from.values()))
            self._print(f"warm start: {len(run.warm_start_from)} genomes seeded from earlier run(s) {', '.join(runs)}; "
                        "this run is not independent of them (search.warm_start.enabled=false for a fresh repeat)")
        if run.evaluator.kind == "replay":
            self._print("note: no kernel runs in this session; every time shown was measured earlier on the GPU "
                        "named above and is replayed from the recording")

    def on_results(self, generation: int, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        self.done += sum(r.evaluator != "rule" for _, r in results)   # the rule's refusals are no evaluations
        line = progress(self.done, self.total_evals or self.done, self.clock() - self.started)
        if self.tty:
            print("\r" + line, end="", file=self.progress_stream, flush=True)
        else:
            self._print(line)

    def on_generation(self, stats: GenerationStats) -> None:
        if self.tty:
            print("\r", end="", file=self.progress_stream)
        counts = " ".join(f"{k}={v}" for k, v in sorted(stats.counts.items()))
        self._print(f"gen {stats.generation:3d} | evals {stats.evaluations:5d} | best {stats.best_fitness:.4f}x "
                    f"({stats.best_id}) | median {stats.median_fitness:.4f}x | {counts} | {stats.wall_s:6.1f} s")

    def on_end(self, summary: RunSummary) -> None:
        if summary.stop_reason == "error":   # the error's own line follows; nothing here may contradict it
            self._print(f"stopped by an error after {summary.evaluations} candidates evaluated")
            return
        self._print(f"done: {summary.generations} generations, {summary.evaluations} candidates evaluated, "
                    f"stopped by {summary.stop_reason}, {summary.wall_s:.1f} s wall")
        if summary.gpu_s > 0 and summary.timed_per_gpu_minute > 0:
            recorded = "recorded " if self.replay else ""   # a replay's GPU time was spent when it was recorded
            self._print(f"throughput: {summary.timed_per_gpu_minute:.0f} candidates gated and timed per "
                        f"{recorded}GPU-minute ({summary.gpu_s:.1f} {recorded}GPU-s; reused answers not counted)")
        if headline(summary.accounting):
            self._print(headline(summary.accounting))
        if baseline_line(summary.accounting):
            self._print(baseline_line(summary.accounting))
        for f in summary.finalists:
            self._print(finalist_line(f))
        if summary.best is None:
            self._print("no candidate passed correctness")
            return
        cand, res = summary.best
        ab = next((f for f in summary.finalists if f["candidate_id"] == cand.id and "speedup" in f), None)
        if ab is None:
            figure = f"fitness {res.fitness:.4f}x vs baseline (geomean over {len(res.times_us)} cases)"
        else:   # the A/B re-time is the figure a run reports; the search's own is beside it
            figure = (f"fitness {ab['speedup']:.4f}x vs baseline (A/B re-time, geomean over {len(ab['times_us'])} "
                      f"cases; the search measured {res.fitness:.4f}x"
                      + ("" if ab.get("agrees", True) else ", off by more than the noise") + ")")
        print(f"best {cand.id}: {figure} genes {cand.genome.gene_dict}"
              + (f" [{self.replay}]" if self.replay else ""), file=self.results or sys.stdout, flush=True)


def finalist_line(f: Mapping[str, Any]) -> str:
    """A finalist's A/B re-time, with the search's figure beside it and a warning when they disagree."""
    if "speedup" not in f:
        return f"finalist {f['candidate_id']}: re-timing failed ({f['status']}): {f['message'][:200]}"
    line = (f"finalist {f['candidate_id']}: {f['speedup']:.4f}x vs baseline, re-timed interleaved A/B, "
            f"{f['reps']} samples per case")
    if "search_fitness" in f:
        line += (f"; the search measured {f['search_fitness']:.4f}x (A/B / search {f['ab_over_search']:.3f}, "
                 f"noise +-{f['noise']:.1%})")
        if not f["agrees"]:
            line += ("; WARNING: they differ by more than the noise: this run's search fitness is not to be "
                     "trusted, the A/B figure is the one reported")
    return line


def baseline_line(books: Mapping[str, Any]) -> str:
    """How far the baseline moved between its measurements during the run, and the rows where its time may hold
    host launch overhead ("" when there is nothing to say)."""
    base = books.get("baseline") or {}
    rel = base.get("relative_to_first") or []
    parts = []
    if len(rel) >= 2:
        parts.append(f"measured {len(rel)} times ({base['gpu_s']:.1f} GPU-s after setup); its geomean ranged "
                     f"{min(rel):.3f} to {max(rel):.3f} of the first measurement, last {rel[-1]:.3f}")
    if base.get("errors"):
        parts.append(f"{len(base['errors'])} re-time(s) failed: {base['errors'][0][:200]}")
    if base.get("host_bound"):
        parts.append(f"on {len(base['host_bound'])} row(s) its host path outlasted the L2 flush, so its time there "
                     f"may hold launch overhead (graph-time them: evaluator.gpu.graph_below_us)")
    return "baseline: " + "; ".join(parts) if parts else ""
