"""`kernel-factory record --cpu-failures`: add to a recording the genomes that its space's rule rejects and that
NVRTC/ptxas reject too, with their real status and compiler log. A compile error or a resource overflow (too much
shared memory, too many registers) is a fact of the CPU toolchain, so no GPU is needed; a replay then shows real
failures. Failures that need a GPU (wrong results, crashes, timeouts) come only from `kernel-factory record`."""
from __future__ import annotations

import itertools
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from ..evaluate import recording, render
from ..evaluate.compile import CompileJob, Compiler
from ..protocols import Problem
from ..types import Candidate, Case, EvalResult, GeneSpace, Genome, Status

HOW = ("every genome of the recorded space that the problem's rule rejects was compiled with NVRTC (sm_90a) on "
       "the CPU; those the compiler rejected are kept with status compile_error and the compiler's log")


def rejected(space: GeneSpace) -> Iterator[tuple[Genome, str]]:
    """Every assignment of the space that its rule rejects, with the rule's reason, in a fixed order."""
    names = space.names
    for values in itertools.product(*(g.choices for g in space.genes)):
        genes = dict(zip(names, values))
        why = space.rule(genes)
        if why is not None:
            yield Genome.of(genes), why


def add_cpu_failures(problem: Problem, path: str | Path, out: str | Path, cache_dir: str | Path) -> tuple[Path, int, int]:
    """Compile the rule-rejected genomes of the recording's space; write the recording with the failures added
    to `out`. Returns (out, genomes compiled, failures added)."""
    rec = recording.read(path)
    if rec.header.get("problem") != problem.name:
        raise ValueError(f"{path} is a recording of {rec.header.get('problem')!r}, not {problem.name!r}")
    space = problem.space.restricted(recording.covered_choices(rec.header, problem.space))
    dtypes = sorted({Case.parse(k).dtype for k in rec.header["cases"]})
    todo = [(g, why) for g, why in rejected(space) if g.id not in rec.entries]
    compiler = Compiler(Path(cache_dir))
    try:
        jobs = {(g.id, dt): CompileJob(compiler.key(render.body(problem, g, dt)),
                                       render.render(problem, Candidate(g, operator="record"), dt), f"{g.id}-{dt}.cu")
                for g, _ in todo for dt in dtypes}
        outputs = {o.key: o for o in compiler.compile_many(jobs.values())}
    finally:
        compiler.close()
    entries, outside = dict(rec.entries), dict(rec.outside_rule)
    for genome, why in todo:
        mine = {dt: outputs[jobs[genome.id, dt].key] for dt in dtypes}
        failed = [dt for dt, o in mine.items() if o.error is not None]
        if not failed:
            continue   # it compiles: only a GPU could say more, so it is left out
        entries[genome.id] = (genome, EvalResult(genome.id, Status.COMPILE_ERROR,
                                                 build={dt: o.info for dt, o in mine.items()},
                                                 message=f"{failed[0]}: {mine[failed[0]].error}"[:4000]))
        outside[genome.id] = why
    added = len(outside) - len(rec.outside_rule)
    note = {"how": HOW, "compiled": len(todo), "failures": len(outside), "toolchain": f"NVRTC {compiler.toolchain}",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    written = recording.write(recording.Recording(rec.header, entries, rec.path, outside), out, {"cpu_failures": note})
    print(f"record --cpu-failures: compiled {len(todo)} rule-rejected genomes on the CPU; {added} failed to compile "
          f"and were added -> {written}", file=sys.stderr)
    return written, len(todo), added
