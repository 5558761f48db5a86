"""The replay evaluator: answers from measurements recorded on a real GPU (see recording.py), with no GPU.
For CI, for users without a GPU, and for measuring search efficiency. Everything it returns is labelled as
recorded data: the evaluator kind is "replay" and its label names the GPU and the recording date."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.protocols import EvaluatorInfo, Problem
from kernel_factory.evo.types import Candidate, Case, EvalResult, Status, geomean_speedup


class ReplayError(ValueError):
    """The recording cannot answer this run (missing cases, another baseline, no recording at all)."""


def bundled_recordings(problem: Problem) -> list[Path]:
    """Recordings shipped next to the problem's module, in recorded/<problem name>-*.jsonl.gz."""
    module = sys.modules[type(problem).__module__]
    folder = Path(module.__file__).resolve().parent / "recorded"
    return sorted(folder.glob(f"{problem.name}-*.jsonl.gz"))


def choose_recording(problem: Problem, cases: Sequence[Case], path: str | None) -> recording.Recording:
    candidates = [Path(path)] if path else bundled_recordings(problem)
    if not candidates:
        raise ReplayError(f"no recording for problem {problem.name!r}: record one on a GPU with "
                          f"`kernel-factory record CONFIG`, or set evaluator.replay.recording")
    wanted = {c.key for c in cases}
    for p in candidates:
        if not p.is_file():
            raise ReplayError(f"recording {str(p)!r} does not exist")
        rec = recording.read(p)
        if rec.header.get("problem") == problem.name and wanted <= set(rec.header["cases"]):
            return rec
    raise ReplayError(f"no recording of {problem.name!r} covers the cases {sorted(wanted)}; "
                      f"looked at {[str(p) for p in candidates]}")


class ReplayEvaluator:
    """Options (config `evaluator.replay`): recording (a path; default: the problem's bundled recording)."""

    def __init__(self, problem: Problem, cases: Sequence[Case], baseline: str, seed: int, out_dir: str, *,
                 recording: str | None = None):
        self.problem, self.cases = problem, tuple(cases)
        self.rec = choose_recording(problem, cases, recording)
        if self.rec.header["baseline"] != baseline:
            raise ReplayError(f"the recording {self.rec.path.name} measured baseline {self.rec.header['baseline']!r}, "
                              f"not {baseline!r}; set evaluator.baseline: {self.rec.header['baseline']}")
        self.baseline_us = {c.key: float(self.rec.header["baseline_us"][c.key]) for c in self.cases}
        fp = {**self.rec.header.get("fingerprint", {}), "recording": self.rec.path.name,
              "recorded_sampling": str(self.rec.header.get("sampling", "")), "baseline": baseline,
              "copy_gbps": f"{float(self.rec.header.get('copy_gbps', 0)):.0f}"}
        self.info = EvaluatorInfo("replay", self.rec.label, fp)
        self.restarts = 0

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        return [self._answer(c) for c in candidates]

    def _answer(self, cand: Candidate) -> EvalResult:
        hit = self.rec.entries.get(cand.id)
        if hit is None:
            return EvalResult(cand.id, Status.NOT_RECORDED, evaluator="replay",
                              message="this genome is not in the recording (a patched or out-of-space genome)")
        _, rec = hit
        if rec.status is not Status.OK:
            return EvalResult(cand.id, rec.status, build=rec.build, message=rec.message, evaluator="replay",
                              gpu_s=rec.gpu_s, baseline_us=self.baseline_us)
        times = {c.key: rec.times_us[c.key] for c in self.cases}
        gbps = {k: self.problem.bytes_moved(Case.parse(k)) / (t * 1e-6) / 1e9 for k, t in times.items()}
        return EvalResult(cand.id, Status.OK, geomean_speedup(times, self.baseline_us), times,
                          {k: rec.iqr_us.get(k, 0.0) for k in times}, self.baseline_us, gbps, rec.build,
                          "", "replay", rec.gpu_s)

    def close(self) -> None:
        pass
