"""The replay evaluator: answers from measurements recorded on a real GPU (see recording.py), with no GPU.
For CI, for users without a GPU, and for measuring search efficiency. Everything it returns is labelled as
recorded data: the evaluator kind is "replay" and its label names the GPU and the recording date."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Mapping, Sequence

from . import binary, render, static_check
from . import recording as recording_mod
from .compile import CompileJob, Compiler, CompileOutput, ToolchainError
from ..protocols import EvaluatorInfo, Problem
from ..types import Candidate, Case, EvalResult, GeneSpace, GeneValue, Genome, Status, geomean_speedup


class ReplayError(ValueError):
    """The recording cannot answer this run (missing cases, another baseline, no recording at all)."""


def bundled_recordings(problem: Problem) -> list[Path]:
    """Recordings shipped next to the problem's module, in recorded/<problem name>-*.jsonl.gz."""
    module = sys.modules[type(problem).__module__]
    folder = Path(module.__file__).resolve().parent / "recorded"
    return sorted(folder.glob(f"{problem.name}-*.jsonl.gz"))


def choose_recording(problem: Problem, cases: Sequence[Case], path: str | None) -> recording_mod.Recording:
    candidates = [Path(path)] if path else bundled_recordings(problem)
    if not candidates:
        raise ReplayError(f"no recording for problem {problem.name!r}: record one on a GPU with "
                          f"`kernel-factory record CONFIG`, or set evaluator.replay.recording")
    wanted = {c.key for c in cases}
    for p in candidates:
        if not p.is_file():
            raise ReplayError(f"recording {str(p)!r} does not exist")
        rec = recording_mod.read(p)
        if rec.header.get("problem") == problem.name and wanted <= set(rec.header["cases"]):
            return rec
    raise ReplayError(f"no recording of {problem.name!r} covers the cases {sorted(wanted)}; "
                      f"looked at {[str(p) for p in candidates]}")


def admitting(space: GeneSpace, recorded: frozenset[str]) -> GeneSpace:
    """The space with its rule widened to the genomes of `recorded` (ids), which the recording answers."""
    rule = space.rule

    def widened(genes: Mapping[str, GeneValue]) -> str | None:
        why = rule(genes)
        return None if why is not None and Genome.of(genes).id in recorded else why
    return dataclasses.replace(space, rule=widened)


class ReplayEvaluator:
    """Options (config `evaluator.replay`): recording (a path; default: the problem's bundled recording),
    compile_patches (default true) and recorded_failures (default true).

    A recording may hold failures: what failed on the GPU when it was made, and genomes outside the problem's rule
    that NVRTC/ptxas reject on the CPU (`record --cpu-failures`). Those are answered with their recorded status
    and log, and with recorded_failures the search may propose the outside-rule ones, so that a replayed run shows
    real compile failures, learns lessons from them and colours them in its lineage. (A live run's rule keeps
    them from the compiler; they say so in their message.)

    Unpatched genomes are answered from the recording at once. A patched genome is screened first (invalid_patch,
    rejected). With compile_patches it is then compiled with NVRTC on the CPU (cache in out_dir/cache) next to the
    unpatched genome of the same genes: if every dtype's kernel is binary-identical (binary.identity), the
    recording's result for those genes answers, saying so in its message; a compiler rejection is compile_error
    with the real log; any other binary is not_recorded. Without compile_patches, patched genomes are not_recorded.
    """

    def __init__(self, problem: Problem, cases: Sequence[Case], baseline: str, seed: int, out_dir: str, *,
                 recording: str | None = None, compile_patches: bool = True, recorded_failures: bool = True,
                 gate_share: float = 0.25):
        if not 0.0 <= gate_share < 1.0:
            raise ReplayError(f"evaluator.replay.gate_share must be in [0, 1), got {gate_share}")
        self.problem, self.cases, self.gate_share = problem, tuple(cases), gate_share
        found = choose_recording(problem, cases, recording)
        self.rec = recording_mod.expand(found, problem.space)
        # The search is limited to what the recording measured (genes added since are held at their defaults).
        self.space = problem.space.restricted(recording_mod.covered_choices(found.header, problem.space))
        if recorded_failures and self.rec.outside_rule:
            self.space = admitting(self.space, frozenset(self.rec.outside_rule))
        if self.rec.header["baseline"] != baseline:
            raise ReplayError(f"the recording {self.rec.path.name} measured baseline {self.rec.header['baseline']!r}, "
                              f"not {baseline!r}; set evaluator.baseline: {self.rec.header['baseline']}")
        self.baseline_us = {c.key: float(self.rec.header["baseline_us"][c.key]) for c in self.cases}
        fp = {**self.rec.header.get("fingerprint", {}), "recording": self.rec.path.name,
              "recorded_sampling": str(self.rec.header.get("sampling", "")), "baseline": baseline,
              "copy_gbps": f"{float(self.rec.header.get('copy_gbps', 0)):.0f}"}
        self.info = EvaluatorInfo("replay", self.rec.label, fp)
        self.restarts = 0
        self.dtypes = sorted({c.dtype for c in self.cases})
        self.compile_patches = compile_patches
        self.cache_dir = Path(out_dir) / "cache"
        self._compiler: Compiler | None = None   # started at the first patched genome; unpatched runs never pay

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        results = static_check.refusals(self.problem.template(), candidates, "replay")
        results.update(self._patched([c for c in candidates if c.genome.patch and c.id not in results]))
        return [results[c.id] if c.id in results else self._answer(c.id, c.id) for c in candidates]

    def _patched(self, cands: list[Candidate]) -> dict[str, EvalResult]:
        """Compile patched genomes and their unpatched twins in one batch, then compare the binaries."""
        if not cands:
            return {}
        if not self.compile_patches:
            return {c.id: self._unanswered(c.id, "a patched genome; compile_patches is off") for c in cands}
        try:
            self._compiler = self._compiler or Compiler(self.cache_dir)
        except ToolchainError as exc:
            return {c.id: self._unanswered(c.id, f"a patched genome, and it cannot be compiled here: {exc}")
                    for c in cands}
        jobs = {}
        for cand in cands:
            plain = Candidate(Genome.of(cand.genome.gene_dict))
            for c in (cand, plain) if plain.id in self.rec.entries else (cand,):
                jobs.update({job.key: job for job in self._jobs(c)})
        outputs = {out.key: out for out in self._compiler.compile_many(jobs.values())}
        return {c.id: self._compare(c, outputs) for c in cands}

    def _jobs(self, cand: Candidate) -> list[CompileJob]:
        return [CompileJob(self._key(cand.genome, dt), render.render(self.problem, cand, dt), f"{cand.id}-{dt}.cu")
                for dt in self.dtypes]

    def _key(self, genome: Genome, dtype: str) -> str:
        assert self._compiler is not None
        return self._compiler.key(render.body(self.problem, genome, dtype))

    def _compare(self, cand: Candidate, outputs: Mapping[str, CompileOutput]) -> EvalResult:
        mine = {dt: outputs[self._key(cand.genome, dt)] for dt in self.dtypes}
        build = {dt: out.info for dt, out in mine.items()}
        failed = [dt for dt, out in mine.items() if out.error is not None]
        if failed:
            return EvalResult(cand.id, Status.COMPILE_ERROR, build=build, evaluator="replay",
                              message=f"{failed[0]}: {mine[failed[0]].error}"[:4000])
        plain = Genome.of(cand.genome.gene_dict)
        twins = {dt: outputs.get(self._key(plain, dt)) for dt in self.dtypes}
        if all(t is not None and t.cubin is not None and binary.identity(t.cubin) == binary.identity(mine[dt].cubin)
               for dt, t in twins.items()):
            recorded = self._answer(plain.id, cand.id)
            note = f"replayed: binary-identical to recorded genome {plain.id}"
            return dataclasses.replace(recorded, message="; ".join(filter(None, (note, recorded.message))))
        return dataclasses.replace(self._unanswered(cand.id, "no recorded measurement for this binary"), build=build)

    def _unanswered(self, cid: str, why: str) -> EvalResult:
        return EvalResult(cid, Status.NOT_RECORDED, evaluator="replay", message=why)

    def _answer(self, genome_id: str, cid: str) -> EvalResult:
        """The recording's result for genome_id, reported as candidate cid's."""
        hit = self.rec.entries.get(genome_id)
        if hit is None:
            return self._unanswered(cid, "this genome is not in the recording (an out-of-space genome)")
        _, rec = hit
        # The recording's compile facts, marked as a compile this run did not do (accounting counts none of it).
        rec = dataclasses.replace(rec, build={dt: dataclasses.replace(b, cached=True) for dt, b in rec.build.items()})
        if rec.status is not Status.OK:
            outside = self.rec.outside_rule.get(genome_id)
            note = f"outside the problem's rule ({outside}); compiled on the CPU for the recording: " if outside else ""
            return EvalResult(cid, rec.status, build=rec.build, message=note + rec.message, evaluator="replay",
                              gpu_s=rec.gpu_s, baseline_us=self.baseline_us)
        times = {c.key: rec.times_us[c.key] for c in self.cases}
        gbps = {k: self.problem.bytes_moved(Case.parse(k)) / (t * 1e-6) / 1e9 for k, t in times.items()}
        return EvalResult(cid, Status.OK, geomean_speedup(times, self.baseline_us), times,
                          {k: rec.iqr_us.get(k, 0.0) for k in times}, self.baseline_us, gbps, rec.build,
                          "", "replay", rec.gpu_s)

    def time_first(self, candidates: Sequence[Candidate], cases: Sequence[str]) -> list[EvalResult]:
        """Racing's first leg from the recording: the gate's share of the recorded GPU time plus the timing share
        of `cases` (each case's share of the timing is its share of the recorded time); the rest goes to time_rest."""
        return [first_leg(r, cases, self.gate_share) for r in self.evaluate(candidates)]

    def time_rest(self, candidates: Sequence[Candidate], first: Sequence[EvalResult]) -> list[EvalResult]:
        return [dataclasses.replace(r, gpu_s=max(0.0, r.gpu_s - f.gpu_s))
                for r, f in zip(self.evaluate(candidates), first)]

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()
            self._compiler = None


def first_leg(full: EvalResult, cases: Sequence[str], gate_share: float) -> EvalResult:
    """What timing only `cases` (after the whole gate) would have cost and shown, from a full recorded result. A
    failure was found by the gate or on the way: it is charged in full."""
    if full.status is not Status.OK or not full.times_us:
        return full
    total = sum(full.times_us.values())
    share = sum(full.times_us[k] for k in cases) / total if total > 0 else 1.0
    times = {k: full.times_us[k] for k in cases}
    return dataclasses.replace(
        full, fitness=geomean_speedup(times, {k: full.baseline_us[k] for k in cases}), times_us=times,
        iqr_us={k: full.iqr_us.get(k, 0.0) for k in cases}, gbps={k: full.gbps[k] for k in cases if k in full.gbps},
        gpu_s=full.gpu_s * (gate_share + (1.0 - gate_share) * share))
