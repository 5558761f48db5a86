"""The run journal: an append-only, fsync'd JSON-lines file per run (runs/<run id>/journal.jsonl). It holds
the run's start, every candidate with its result, each generation's stats and the end, so that nothing measured
is lost when a run is killed, and so that a later resume can read it."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from kernel_factory.evo.protocols import GenerationStats, RunInfo, RunSummary
from kernel_factory.evo.types import Candidate, EvalResult


class JournalObserver:
    def __init__(self, problem: Any = None, config: Any = None):
        self.path: Path | None = None

    def _write(self, record: Mapping[str, Any]) -> None:
        assert self.path is not None, "on_start must come first"
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def on_start(self, run: RunInfo) -> None:
        folder = Path(run.out_dir) / run.run_id
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "journal.jsonl"
        self._write({"event": "start", "run_id": run.run_id, "problem": run.problem, "seed": run.seed,
                     "config": run.config, "evaluator": {"kind": run.evaluator.kind, "label": run.evaluator.label,
                                                         "fingerprint": dict(run.evaluator.fingerprint)},
                     "cases": [c.key for c in run.cases]})

    def on_results(self, generation: int, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        for cand, res in results:
            self._write({"event": "result", "generation": generation, "candidate": cand.to_json(),
                         "result": res.to_json()})

    def on_generation(self, stats: GenerationStats) -> None:
        self._write({"event": "generation", **stats.__dict__, "counts": dict(stats.counts)})

    def on_end(self, summary: RunSummary) -> None:
        best = summary.best[0].id if summary.best else None
        self._write({"event": "end", "generations": summary.generations, "evaluations": summary.evaluations,
                     "stop_reason": summary.stop_reason, "wall_s": summary.wall_s, "gpu_s": summary.gpu_s,
                     "best": best, "hall_of_fame": [c.id for c, _ in summary.hall_of_fame],
                     "logbook": [dict(row) for row in summary.logbook]})


def read(path: str | Path) -> list[dict[str, Any]]:
    """The journal's records; a torn last line (a kill mid-write) is ignored."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out
