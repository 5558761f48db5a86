"""The fault suite: one batch of deliberately bad kernels mixed with good ones, through the real GPU evaluator.
Every fault must get its status, the good kernels must be timed in the same batch, and worker restarts are
counted. `kernel-factory faults` prints the table (and writes it as JSON); tests/gpu/test_faults.py asserts it."""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import registry
from ..types import Candidate, Case, EvalResult, Genome

PROBLEM = "rmsnorm_faults"
# Short benchmark rows keep the suite fast; correctness and held-out shapes are the problem's full sets.
CASES = ((32768, 1024), (32768, 4096), (8192, 32768))
GOOD_THREADS = (128, 512, 1024)


@dataclass(frozen=True)
class Row:
    fault: str
    threads: int
    expected: str
    got: str
    message: str
    gpu_s: float

    @property
    def right(self) -> bool:
        return self.expected == self.got


def batch() -> list[Candidate]:
    """Bad kernels with good ones between them, in a fixed order."""
    from ...problems.rmsnorm_faults import EXPECTED
    faults = [f for f in EXPECTED if f != "none"]
    genomes = []
    for i, fault in enumerate(faults):
        if i % 4 == 0:
            genomes.append({"fault": "none", "threads": GOOD_THREADS[(i // 4) % len(GOOD_THREADS)]})
        genomes.append({"fault": fault, "threads": 256})
    return [Candidate(Genome.of(g)) for g in genomes]


def run(out_dir: str | None = None) -> tuple[list[Row], int, dict[str, str]]:
    """Evaluate the batch once; returns the rows, the number of worker restarts and the fingerprint."""
    from ..evaluate.gpu import GpuEvaluator
    from ...problems.rmsnorm_faults import EXPECTED
    problem = registry.load("problem", PROBLEM)
    cases = [Case(s, "bfloat16") for s in CASES]
    with tempfile.TemporaryDirectory(prefix="kf-faults-") as tmp:
        ev = GpuEvaluator(problem, cases, "torch_eager", 0, out_dir or tmp)
        try:
            cands = batch()
            results: Sequence[EvalResult] = ev.evaluate(cands)
            restarts, fp = ev.restarts, dict(ev.info.fingerprint)
        finally:
            ev.close()
    rows = [Row(c.genome.gene_dict["fault"], c.genome.gene_dict["threads"], EXPECTED[c.genome.gene_dict["fault"]],
                r.status.value, r.message.replace("\n", " ")[:160], r.gpu_s) for c, r in zip(cands, results)]
    good = [r for c, r in zip(cands, results) if c.genome.gene_dict["fault"] == "none"]
    fp["good_kernel_times_us"] = json.dumps([r.times_us for r in good])
    return rows, restarts, fp


def table(rows: Sequence[Row], restarts: int) -> str:
    lines = ["| # | fault | threads | expected | got | right | GPU s | evidence |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        lines.append(f"| {i} | {r.fault} | {r.threads} | {r.expected} | {r.got} | {'yes' if r.right else 'NO'} | "
                     f"{r.gpu_s:.2f} | {r.message.replace('|', '/')} |")
    right = sum(r.right for r in rows)
    lines.append(f"\n{right}/{len(rows)} right; worker restarts: {restarts}")
    return "\n".join(lines)


def main(out: str | None) -> int:
    from ..evaluate.gpu import WorkerError, gpu_unavailable_reason
    reason = gpu_unavailable_reason()
    if reason:
        raise WorkerError(f"the fault suite runs kernels on a GPU, and there is none here: {reason}. The last "
                          f"H200 table is in docs/results.md")
    start = time.perf_counter()
    rows, restarts, fp = run()
    text = table(rows, restarts)
    print(text)
    print(f"wall {time.perf_counter() - start:.1f} s on {fp.get('gpu', '?')}")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"fingerprint": fp, "restarts": restarts,
                                         "rows": [r.__dict__ | {"right": r.right} for r in rows]}, indent=1))
    return 0 if all(r.right for r in rows) else 1
