"""The live GPU evaluator: render, compile ahead on the CPU cores, then check and time in a GPU worker process
that is restarted after a fault and killed past a watchdog deadline. Fitness is correctness-gated timing."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..config import ConfigError
from . import binary, render, sass, static_check
from .compile import CompileJob, Compiler, CompileOutput
from .worker_process import WorkerError, WorkerHandle, gpu_unavailable_reason
from ..protocols import EvaluatorInfo, ExpectedSass, Problem
from ..types import BuildInfo, Candidate, Case, EvalResult, Genome, Status, geomean_speedup

ROOFLINE_GBPS = 3000.0     # a deliberately low bandwidth, so that the deadline never cuts a merely slow kernel
DEADLINE_FACTOR = 10.0     # x the roofline time of everything one evaluation launches


class GpuEvaluator:
    """Evaluates on the local GPU. Options (config `evaluator.gpu`): compile_workers, check_seeds, timeout_floor_s,
    min_reps, max_reps, target_ms, graph_below_us, finalist_reps, baseline_every_s, paired.

    The baseline is timed by the worker exactly as a candidate is, at setup (after a discarded first pass) and again
    every baseline_every_s seconds between candidates; each fitness is taken against the latest measurement, and
    every measurement is kept in the run's books (accounting()["baseline"]). With paired (the default), each
    candidate's cases are timed interleaved with the baseline, sample by sample, as the finalists' A/B is, and its
    fitness is taken against that paired baseline: drift between two measurements cannot enter a fitness, at twice
    the timing cost. paired: false takes each fitness against the latest re-timing instead (docs/evaluator.md says
    where that parted from the A/B).

    A patched genome passes static_check first (invalid_patch / rejected are never compiled), and its SASS is
    scanned for clock and SM-id reads before it may run. A candidate whose binaries and genes equal those of one
    this evaluator already ran gets that result (gpu_s 0): duplicates never reach the GPU. Where the problem
    declares expected_sass(), every binary is disassembled on the compile pool and a binary that contradicts its
    genome is flagged. The worker proves itself on the problem's default genome at every (re)start."""

    def __init__(self, problem: Problem, cases: Sequence[Case], baseline: str, seed: int, out_dir: str, *,
                 compile_workers: int | None = None, check_seeds: int = 2, timeout_floor_s: float = 10.0,
                 min_reps: int = 5, max_reps: int = 50, target_ms: float = 1.5, graph_below_us: float = 250.0,
                 finalist_reps: int = 100, baseline_every_s: float = 20.0, paired: bool = True):
        if not baseline_every_s >= 0:
            raise ConfigError(f"config key 'evaluator.gpu.baseline_every_s' must be >= 0 seconds (0: the baseline is "
                              f"timed at setup only), got {baseline_every_s}")
        if check_seeds < 2:
            raise ConfigError(f"config key 'evaluator.gpu.check_seeds' must be >= 2 (the second seed checks a repeated "
                              f"call on the same buffers), got {check_seeds}")
        reason = gpu_unavailable_reason()
        if reason:
            raise WorkerError(f"evaluator 'gpu' needs an NVIDIA GPU: {reason}. Use evaluator.kind: replay (or auto)")
        self.problem, self.cases, self.baseline, self.seed = problem, tuple(cases), baseline, seed
        self.dtypes = sorted({c.dtype for c in cases})
        check_shapes = problem.shape_sets["correctness"] + problem.shape_sets["heldout"]
        self.compiler = Compiler(Path(out_dir) / "cache", compile_workers)
        self.timeout_floor_s = timeout_floor_s
        self.max_reps, self.finalist_reps = max_reps, finalist_reps
        self.want_sass = isinstance(problem, ExpectedSass)
        known_good = self.known_good()
        self.baseline_us: dict[str, float] = {}   # measured at setup (deadlines before then: rooflines alone)
        self.worker = self.start_workers({
            "op": "setup", "problem": problem.name, "baseline": baseline, "check_seeds": check_seeds,
            "bench_cases": [c.key for c in self.cases],
            "check_cases": [Case(s, dt).key for dt in self.dtypes for s in check_shapes],
            "timing": {"min_reps": min_reps, "max_reps": max_reps, "target_ms": target_ms,
                       "graph_below_us": graph_below_us},
            "known_good": known_good, "baseline_every_s": baseline_every_s, "paired": bool(paired),
        })
        ready = self.worker.ready
        self.baseline_us = dict(ready["baseline_us"])
        self.baselines = BaselineLog(ready["baseline_us"], ready.get("baseline_host_bound", ()))
        self.copy_gbps: float = ready["copy_gbps"]
        fp = {**ready["fingerprint"], "copy_gbps": f"{self.copy_gbps:.0f}", "baseline": baseline}
        self.info = EvaluatorInfo("gpu", f"live measurement on {fp['gpu']}", fp)
        self._evaluated = 0
        self.seen = binary.SeenBinaries()
        self.cubins: dict[str, dict[str, bytes]] = {}
        self.compile_wait_s = 0.0             # the worker free, waiting for a compile (accounting)
        self._leg = threading.local()         # racing's first leg, per calling thread (steady search): its cases

    def start_workers(self, setup: dict[str, Any]) -> "WorkerHandle":
        """The worker the candidates go to: one process on this machine's default GPU (gpu_pool.py overrides)."""
        return WorkerHandle(setup)

    def known_good(self) -> dict[str, Any]:
        """The problem's default genome, compiled: the kernel every worker start must pass the gate with."""
        cand = Candidate(Genome.of(self.problem.space.defaults()))
        cubins = self.compiled(cand)
        if cubins is None:
            raise WorkerError(f"the problem {self.problem.name!r}'s default genome does not compile")
        return {"id": "known-good", "genes": cand.genome.gene_dict, "cubins": cubins}

    def compiled(self, cand: Candidate) -> dict[str, bytes] | None:
        """Binaries of an unpatched-or-patched candidate this evaluator did not run (a resumed run's finalists)."""
        jobs = self._jobs(cand)
        outs = {o.key: o for o in self.compiler.compile_many(_unique(jobs))}
        if any(outs[j.key].error is not None for j in jobs):
            return None
        return {dt: outs[j.key].cubin for dt, j in zip(self.dtypes, jobs)}

    def deadline_s(self, reps: int | None = None) -> float:
        """How long one request may take before its worker counts as hung: per case the longer of the memory
        roofline and the baseline's measured time (a latency-bound kernel, as KDA's recurrent one, is far from
        any roofline: its candidates timed out at a roofline deadline, 2026-12-04), for every repetition."""
        per_case_s = sum(max(self.problem.bytes_moved(c) / (ROOFLINE_GBPS * 1e9),
                             self.baseline_us.get(c.key, 0.0) * 1e-6) for c in self.cases)
        return self.timeout_floor_s + DEADLINE_FACTOR * per_case_s * ((reps or self.max_reps) + 8)

    def _jobs(self, cand: Candidate) -> list[CompileJob]:
        jobs = []
        for dt in self.dtypes:
            key = self.compiler.key(render.body(self.problem, cand.genome, dt))
            jobs.append(CompileJob(key, render.render(self.problem, cand, dt), f"{cand.id}-{dt}.cu", self.want_sass))
        return jobs

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        """Compiles everything on the pool; each candidate goes to the GPU as soon as its binaries exist."""
        results = static_check.refusals(self.problem.template(), candidates, "gpu")
        owner: dict[str, list[tuple[Candidate, str]]] = {}
        jobs = []
        for cand in (c for c in candidates if c.id not in results):
            for dt, job in zip(self.dtypes, self._jobs(cand)):
                owner.setdefault(job.key, []).append((cand, dt))
                jobs.append(job)
        built: dict[str, dict[str, CompileOutput]] = {c.id: {} for c in candidates}
        for out in self._waited(self.compiler.compile_many(_unique(jobs))):
            for cand, dt in owner[out.key]:
                built[cand.id][dt] = out
                if len(built[cand.id]) == len(self.dtypes) and cand.id not in results:
                    results[cand.id] = self._run(cand, built[cand.id])
        return [results[c.id] for c in candidates]

    def _waited(self, outputs: Iterator[CompileOutput]) -> Iterator[CompileOutput]:
        """The compile outputs, counting the time the worker sat free waiting for the next one (the pool compiles
        the whole batch ahead of the worker; this is what it could not hide)."""
        while True:
            begin = time.monotonic()
            out = next(outputs, None)
            self.compile_wait_s += time.monotonic() - begin
            if out is None:
                return
            yield out

    def time_first(self, candidates: Sequence[Candidate], cases: Sequence[str]) -> list[EvalResult]:
        """Racing's first leg: the whole gate, then timing on `cases` only (the worker's "cases")."""
        self._leg.request = {"cases": list(cases)}
        try:
            return self.evaluate(candidates)
        finally:
            self._leg.request = {}

    @property
    def _legs(self) -> dict[str, Any]:
        """What this thread's eval requests add: racing's first leg's cases, or nothing."""
        return getattr(self._leg, "request", {})

    def time_rest(self, candidates: Sequence[Candidate], first: Sequence[EvalResult]) -> list[EvalResult]:
        """Racing's second leg: every benchmark case not timed in the first, no second gate (the same binaries)."""
        out = []
        for cand, f in zip(candidates, first):
            rest = [c.key for c in self.cases if c.key not in f.times_us]
            if not rest:   # a binary timed in full before (reused): nothing more to spend
                out.append(dataclasses.replace(f, gpu_s=0.0))
                continue
            cubins = self.cubins.get(cand.id) or self.compiled(cand)   # a reused binary kept none of its own
            if cubins is None:
                out.append(EvalResult(cand.id, Status.COMPILE_ERROR, build=f.build, evaluator="gpu",
                                      message="the binaries timed in the first leg no longer compile"))
                continue
            self._evaluated += 1
            reply = self.worker.ask({"op": "eval", "id": cand.id, "genes": cand.genome.gene_dict,
                                     "cubins": cubins, "cases": rest, "gate": False,
                                     "seed": hash_seed(self.seed, cand.id, self._evaluated)}, self.deadline_s())
            if reply.get("status") == Status.OK.value:   # the whole result: both legs' cases
                reply = {**reply, "times_us": {**f.times_us, **reply["times_us"]},
                         "iqr_us": {**f.iqr_us, **reply.get("iqr_us", {})}}
                if "paired_baseline_us" in reply:   # the first leg's pairs too
                    reply["paired_baseline_us"] = {**{k: f.baseline_us[k] for k in f.times_us},
                                                   **reply["paired_baseline_us"]}
            out.append(self.result(cand.id, reply, f.build, f.flags))
        return out

    def before_gpu(self, cand: Candidate, outputs: Mapping[str, Any]) -> tuple[EvalResult | None, dict, dict, str]:
        """What is known before the GPU: (a final result, or None when the binary must be run; the build info; the
        cubins; the binary's launch identity). A final result is a compile error or a binary already timed."""
        build = {dt: out.info for dt, out in outputs.items()}
        failed = [dt for dt, out in outputs.items() if out.error is not None]
        if failed:
            return (EvalResult(cand.id, Status.COMPILE_ERROR, build=build, evaluator="gpu",
                               message=f"{failed[0]}: {outputs[failed[0]].error}"[:4000]), build, {}, "")
        cubins = {dt: out.cubin for dt, out in outputs.items()}
        key = binary.launch_identity(cand.genome.gene_dict, cubins)
        reused = self.seen.reuse(cand.id, key, build)
        return reused, build, cubins, key

    def _run(self, cand: Candidate, outputs: Mapping[str, CompileOutput]) -> EvalResult:
        known, build, cubins, key = self.before_gpu(cand, outputs)
        if known is not None:
            return known
        refused = timer_reads(cubins) if cand.genome.patch else None
        if refused:
            result = EvalResult(cand.id, Status.REJECTED, build=build, evaluator="gpu", message=refused)
        else:
            self._evaluated += 1
            reply = self.worker.ask({"op": "eval", "id": cand.id, "genes": cand.genome.gene_dict,
                                     "cubins": cubins, "seed": hash_seed(self.seed, cand.id, self._evaluated),
                                     **self._legs}, self.deadline_s())
            result = self.result(cand.id, reply, build, self.sass_flags(cand, outputs))
            if result.status is Status.OK:
                self.cubins[cand.id] = cubins
        self.seen.remember(key, result)
        return result

    def sass_flags(self, cand: Candidate, outputs: Mapping[str, CompileOutput]) -> tuple[str, ...]:
        """Where the binary contradicts the genome: an instruction the genes select that is missing (or one they
        rule out that is present). expected_sass(genes, dtype) gives (opcode regex matched at the start, must be present, why)."""
        if not self.want_sass or cand.genome.patch:
            return ()
        flags = []
        for dt, out in outputs.items():
            if out.opcodes is None:
                flags.append(f"{dt}: SASS not checked (cuobjdump unavailable or failed)")
                continue
            for pattern, present, why in self.problem.expected_sass(cand.genome.gene_dict, dt):
                found = sum(n for op, n in out.opcodes.items() if re.match(pattern, op))
                if bool(found) != present:
                    flags.append(f"{dt}: binary {'lacks' if present else 'has'} {pattern} ({why})")
        return tuple(flags)

    def result(self, cid: str, reply: Mapping[str, Any], build: Mapping[str, BuildInfo],
               flags: tuple[str, ...] = ()) -> EvalResult:
        status = Status(reply["status"])
        times = reply.get("times_us", {}) if status is Status.OK else {}
        gbps = {k: self.problem.bytes_moved(Case.parse(k)) / (t * 1e-6) / 1e9 for k, t in times.items()}
        # Against the baseline timed beside it (paired), else the latest one measured by the worker that timed it
        # (one per GPU under workers.backend local/ray), re-timed between candidates.
        self.baselines.note(reply)
        base = {**(reply.get("baseline_us") or self.baseline_us), **reply.get("paired_baseline_us", {})}
        fitness = geomean_speedup(times, {k: base[k] for k in times}) if times else 0.0
        message = reply.get("message", "")
        if reply.get("paired_retimed"):
            tries = "; ".join(f"{k} {' / '.join(f'{us:.1f}' for us in v)} us"
                              for k, v in reply["paired_retimed"].items())
            message = (message + " " if message else "") + f"paired baseline timed again (a glitch): {tries}"
        if reply.get("graph_cases"):
            message = (message + " " if message else "") + f"timed as CUDA graphs: {', '.join(reply['graph_cases'])}"
        return EvalResult(cid, status, fitness, times, reply.get("iqr_us", {}) if times else {},
                          dict(base), gbps, dict(build), message, "gpu",
                          float(reply.get("gpu_s", 0.0)), flags)

    def retime(self, candidates: Sequence[Candidate]) -> list[dict[str, Any]]:
        """Finalists: each timed again against the baseline, interleaved sample by sample, finalist_reps times
        per case. Returns one record per candidate (status, per-case medians and IQRs of both, speedup)."""
        out = []
        for cand in candidates:
            cubins = self.cubins.get(cand.id) or self.compiled(cand)
            if cubins is None:
                continue
            reply = self.worker.ask({"op": "retime", "id": cand.id, "genes": cand.genome.gene_dict,
                                     "cubins": cubins, "reps": self.finalist_reps},
                                    self.deadline_s(2 * self.finalist_reps))
            rec = {"candidate_id": cand.id, "status": reply["status"], "message": reply.get("message", ""),
                   "reps": self.finalist_reps, "gpu_s": reply.get("gpu_s", 0.0)}
            if reply["status"] == Status.OK.value:
                rec.update({k: reply[k] for k in ("times_us", "iqr_us", "baseline_us", "baseline_iqr_us")})
                rec["speedup"] = geomean_speedup(reply["times_us"], reply["baseline_us"])
            out.append(rec)
        return out

    def measure_again(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        """evaluate() without the binary reuse: every candidate is gated and timed on the GPU again, even one this
        evaluator already ran (how a test checks that two measurements of one kernel agree)."""
        self.seen.forget()
        return self.evaluate(candidates)

    @property
    def restarts(self) -> int:
        return self.worker.restarts

    def accounting(self) -> dict[str, Any]:
        return {"baseline": self.baselines.books(), "compile_wait_s": self.compile_wait_s}

    def close(self) -> None:
        self.worker.close()
        self.compiler.close()


class BaselineLog:
    """Every measurement of the baseline during a run: the setup's, then each re-time between candidates, with its
    GPU cost, so that the summary can say how far the baseline moved (drift that a single measurement would have
    folded into every candidate's fitness)."""

    def __init__(self, first: Mapping[str, float], host_bound: Sequence[str] = ()):
        self.first = dict(first)
        self.host_bound = set(host_bound)   # rows where the baseline's host path outlasted the L2 flush
        self.geomeans = [geomean_speedup(self.first, self.first)]   # each measurement's geomean relative to the first
        self.gpu_s = 0.0
        self.errors: list[str] = []
        self.paired_retimed: list[dict[str, list[float]]] = []   # per candidate: case -> every try's baseline us

    def note(self, reply: Mapping[str, Any]) -> None:
        if reply.get("baseline_retimed_us"):
            fresh = reply["baseline_retimed_us"]
            keys = [k for k in fresh if k in self.first]
            # geomean of fresh / first: geomean_speedup(times, base) is base / times per case
            self.geomeans.append(geomean_speedup({k: self.first[k] for k in keys}, {k: fresh[k] for k in keys}))
            self.gpu_s += float(reply.get("baseline_gpu_s", 0.0))
            self.host_bound.update(reply.get("baseline_host_bound", ()))
        if reply.get("baseline_error"):
            self.errors.append(str(reply["baseline_error"]))
        if reply.get("paired_retimed"):
            self.paired_retimed.append(dict(reply["paired_retimed"]))

    def books(self) -> dict[str, Any]:
        return {"measurements": len(self.geomeans), "gpu_s": round(self.gpu_s, 3),
                "relative_to_first": [round(g, 4) for g in self.geomeans], "errors": self.errors[:5],
                "host_bound": sorted(self.host_bound),
                **({"paired_retimed": {"candidates": len(self.paired_retimed), "first": self.paired_retimed[:5]}}
                   if self.paired_retimed else {})}


def timer_reads(cubins: Mapping[str, bytes]) -> str | None:
    """The backstop behind the static check: why a binary may not run (it reads clocks or SM ids), else None.
    Fails closed: a patched binary that cannot be disassembled does not run."""
    for dt, cubin in cubins.items():
        try:
            found = binary.timer_reads(sass.disassemble(cubin))
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            return f"{dt}: cannot disassemble the binary to check it ({exc}); not run"
        if found:
            return f"{dt}: the binary reads {', '.join(found)} (clocks, timers and SM ids are not allowed); not run"
    return None


def hash_seed(*parts: Any) -> int:
    """A stable 31-bit seed from the run seed, candidate id and a counter (fresh inputs for every check)."""
    import hashlib
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little") & 0x7FFFFFFF


def _unique(jobs: list[CompileJob]) -> list[CompileJob]:
    seen: dict[str, CompileJob] = {}
    for job in jobs:
        seen.setdefault(job.key, job)
    return list(seen.values())
