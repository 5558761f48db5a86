"""The run journal's writer: an append-only, fsync'd JSON-lines file per run (runs/<run id>/journal.jsonl). It holds
the run's start, every candidate with its result, each generation's stats and the end, so that nothing measured
is lost when a run is killed, and so that a later resume can read it. The records and their reader are
evo/journal.py."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import journal
from ..protocols import GenerationStats, RunInfo, RunSummary
from ..types import Candidate, EvalResult


class JournalObserver:
    def __init__(self, problem: Any = None, config: Any = None):
        self.path: Path | None = None
        self.logged: set[str] = set()        # on resume: candidates the journal already holds
        self.last_generation = -1            # on resume: the last generation it closed

    def _write(self, record: Mapping[str, Any]) -> None:
        assert self.path is not None, "on_start must come first"
        try:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            if exc.filename is not None:
                raise
            # A failed write or flush (a full disk) names no file; the error line must say which one it was.
            raise OSError(exc.errno, exc.strerror or str(exc), str(self.path)) from exc

    def on_start(self, run: RunInfo) -> None:
        folder = Path(run.out_dir) / run.run_id
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / journal.NAME
        if run.resumed:
            raw = journal.records(self.path)
            old = journal.of_records(self.path, raw)
            self.logged = set(old.known()) | {r.candidate.id for r in old.refusals}   # refusals: once each
            self.last_generation = max((g.generation for g in old.generations), default=-1)
            self._rewrite(raw)
            self._write(journal.Resume(len(old.results)).to_json())
            return
        self._write(journal.Start.of(run).to_json())

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        """Drop a torn last line (a kill mid-write) before appending again."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, self.path)

    def on_results(self, generation: int, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        for cand, res in results:
            if cand.id in self.logged:
                continue
            self._write(journal.entry(generation, cand, res).to_json())

    def on_generation(self, stats: GenerationStats) -> None:
        if stats.generation <= self.last_generation:
            return
        self._write(journal.generation_json(stats))

    def on_end(self, summary: RunSummary) -> None:
        self._write(journal.End.json_of(summary))
        if summary.lessons:
            (self.path.parent / "lessons.md").write_text(summary.lessons)

