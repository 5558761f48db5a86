"""A recording of made-up times over a problem's whole gene space, in the real format (tests only): what
`kernel-factory export` reads to build a plugin's table and kernels, where no GPU measured it. The op's correctness
never depends on the times."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterable, Sequence

from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.types import BuildInfo, Case, EvalResult, Genome, Status


def synthetic_recording(path: Path, problem: Any, dtypes: Sequence[str] = ("bfloat16", "float16", "float32"),
                        genomes: Iterable[dict] | None = None, seed: int = 3) -> Path:
    cases = [Case(s, dt) for dt in dtypes for s in problem.shape_sets["benchmark"]]
    rng = random.Random(seed)
    header = {"problem": problem.name, "problem_version": problem.version,
              "space": {g.name: list(g.choices) for g in problem.space.genes}, "cases": [c.key for c in cases],
              "baseline": problem.baselines[0], "baseline_us": {c.key: 100.0 for c in cases}, "copy_gbps": 4000.0,
              "sampling": "exhaustive (synthetic, tests only)", "fingerprint": {"gpu": "SYNTHETIC", "date": "2026-01-01"}}
    def result(genome: Genome) -> EvalResult:
        times = {c.key: rng.uniform(50, 150) for c in cases}
        return EvalResult(genome.id, Status.OK, times_us=times, build={"bfloat16": BuildInfo(registers=24)}, gpu_s=0.01)

    writer = recording.Writer(path, header)
    writer.add_all((genome, result(genome)) for genes in (problem.space.enumerate() if genomes is None else genomes)
                   for genome in [Genome.of(genes)])
    return writer.finish()
