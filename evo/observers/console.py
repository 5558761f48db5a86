"""Console output: what is being evaluated where, a progress bar while a generation runs, and one summary line
per generation. Writes to stderr so that stdout stays clean for machine-readable output."""
from __future__ import annotations

import sys
from typing import Any, Sequence, TextIO

from ..protocols import GenerationStats, RunInfo, RunSummary
from ..types import Candidate, EvalResult

BAR = 24


class ConsoleObserver:
    def __init__(self, problem: Any = None, config: Any = None, stream: TextIO | None = None):
        self.out = stream or sys.stderr
        self.total_evals: int | None = None
        self.done = 0
        self.tty = self.out.isatty()

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def on_start(self, run: RunInfo) -> None:
        search = run.config["search"]
        self.total_evals = search["max_evaluations"] or search["population"] * (search["generations"] + 1)
        self._print(f"kernel-factory run {run.run_id}: problem {run.problem}, {len(run.cases)} benchmark cases, "
                    f"seed {run.seed}")
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
        self.done += len(results)
        total = max(self.total_evals or self.done, self.done)
        filled = int(BAR * self.done / total)
        line = f"[{'#' * filled}{'.' * (BAR - filled)}] {self.done}/{total} evaluated"
        if self.tty:
            print("\r" + line, end="", file=self.out, flush=True)
        else:
            self._print(line)

    def on_generation(self, stats: GenerationStats) -> None:
        if self.tty:
            print("\r", end="", file=self.out)
        counts = " ".join(f"{k}={v}" for k, v in sorted(stats.counts.items()))
        self._print(f"gen {stats.generation:3d} | evals {stats.evaluations:5d} | best {stats.best_fitness:.4f}x "
                    f"({stats.best_id}) | median {stats.median_fitness:.4f}x | {counts} | {stats.wall_s:6.1f} s")

    def on_end(self, summary: RunSummary) -> None:
        self._print(f"done: {summary.generations} generations, {summary.evaluations} candidates evaluated, "
                    f"stopped by {summary.stop_reason}, {summary.wall_s:.1f} s wall")
        if summary.gpu_s > 0 and summary.timed_per_gpu_minute > 0:
            self._print(f"throughput: {summary.timed_per_gpu_minute:.0f} candidates gated and timed per GPU-minute "
                        f"({summary.gpu_s:.1f} GPU-s; reused answers not counted)")
        for f in summary.finalists:
            if "speedup" in f:
                self._print(f"finalist {f['candidate_id']}: {f['speedup']:.4f}x vs baseline, re-timed interleaved "
                            f"A/B, {f['reps']} samples per case")
            else:
                self._print(f"finalist {f['candidate_id']}: re-timing failed ({f['status']}): {f['message'][:200]}")
        if summary.best is None:
            self._print("no candidate passed correctness")
            return
        cand, res = summary.best
        self._print(f"best {cand.id}: fitness {res.fitness:.4f}x vs baseline (geomean over "
                    f"{len(res.times_us)} cases) genes {cand.genome.gene_dict}")
