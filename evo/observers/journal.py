"""The run journal: an append-only, fsync'd JSON-lines file per run (runs/<run id>/journal.jsonl). It holds
the run's start, every candidate with its result, each generation's stats and the end, so that nothing measured
is lost when a run is killed, and so that a later resume can read it."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..protocols import GenerationStats, RunInfo, RunSummary
from ..types import Candidate, EvalResult


class JournalObserver:
    def __init__(self, problem: Any = None, config: Any = None):
        self.path: Path | None = None
        self.logged: set[str] = set()        # on resume: candidates the journal already holds
        self.last_generation = -1            # on resume: the last generation it closed

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
        if run.resumed:
            old = read(self.path)
            self.logged = {r["candidate"]["id"] for r in old if r["event"] == "result"}
            self.last_generation = max((r["generation"] for r in old if r["event"] == "generation"), default=-1)
            self._rewrite(old)
            self._write({"event": "resume", "known_results": len(self.logged)})
            return
        self._write({"event": "start", "run_id": run.run_id, "problem": run.problem, "seed": run.seed,
                     "cases_key": run.cases_key, "warm_start": list(run.warm_start),
                     "warm_start_from": dict(run.warm_start_from),
                     "prior_records": run.prior_records,
                     "config": run.config, "evaluator": {"kind": run.evaluator.kind, "label": run.evaluator.label,
                                                         "fingerprint": dict(run.evaluator.fingerprint)},
                     "cases": [c.key for c in run.cases]})

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        """Drop a torn last line (a kill mid-write) before appending again."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, self.path)

    def on_results(self, generation: int, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        for cand, res in results:
            if cand.id in self.logged:
                continue
            self._write({"event": "result", "generation": generation, "candidate": cand.to_json(),
                         "result": res.to_json()})

    def on_generation(self, stats: GenerationStats) -> None:
        if stats.generation <= self.last_generation:
            return
        self._write({"event": "generation", **stats.__dict__, "counts": dict(stats.counts),
                     "operator_probs": dict(stats.operator_probs), "population": list(stats.population)})

    def on_end(self, summary: RunSummary) -> None:
        best = summary.best[0].id if summary.best else None
        self._write({"event": "end", "generations": summary.generations, "evaluations": summary.evaluations,
                     "stop_reason": summary.stop_reason, "wall_s": summary.wall_s, "gpu_s": summary.gpu_s,
                     "best": best, "hall_of_fame": [c.id for c, _ in summary.hall_of_fame],
                     "logbook": [dict(row) for row in summary.logbook],
                     "timed_per_gpu_minute": summary.timed_per_gpu_minute, "finalists": list(summary.finalists)})
        if summary.lessons:
            (self.path.parent / "lessons.md").write_text(summary.lessons)


def read(path: str | Path) -> list[dict[str, Any]]:
    """The journal's records; a torn last line (a kill mid-write) is ignored. A gzipped journal (journal.jsonl.gz,
    as the evidence folders keep them) reads the same."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out
