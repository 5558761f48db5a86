"""The backward's sub-warp rows against the default genome on tiny rows (M = 32768, N = 64, 100, 128, 256), timed with
the project's Timer (CUDA events, L2 flushed before every call, the genomes interleaved sample by sample): a table
for the lead to see the effect, with no assertion on times. Each shape's fastest sub-warp genome passes the
correctness gate first. Run on a GPU host: python3 tests/gpu/subwarp_bwd_times.py (the table also goes to
$OUT/subwarp_bwd_times.txt when OUT is set)."""
from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from kernel_factory.evo.evaluate import launcher, worker   # noqa: E402
from kernel_factory.evo.types import Case                  # noqa: E402
from kernel_factory.problems import rmsnorm_bwd as mod     # noqa: E402
from test_rmsnorm_bwd_gpu import build_all                 # noqa: E402

SHAPES = [Case((32768, n), dt) for dt in ("float32", "bfloat16") for n in (64, 100, 128, 256)]
REPS = 40
# Sub-warp candidates: each TPR in CTAs of 128 threads (16 and 8 in 256 too), one or two register vectors, both
# vector widths (24 genomes, so that compiling them stays well inside trust.sh's 45 s).
CANDIDATES = {f"tpr{threads // rows}_t{threads}_kv{kv}_v{vec}": dict(
    threads=threads, rows_per_cta=rows, ctas_per_sm=4 if threads == 128 else 2, reg_vecs=kv,
    prefetch=kv == 1, vec_bytes=vec)
    for threads, rows in ((128, 8), (128, 16), (128, 32), (128, 64), (256, 16), (256, 32))
    for kv in (1, 2) for vec in (8, 16)}


def genomes() -> dict[str, dict]:
    """The default and every feasible candidate, by name."""
    space = mod.problem.space
    named = {"default": space.defaults()}
    for name, kw in CANDIDATES.items():
        if space.why_infeasible(g := {**space.defaults(), **kw}) is None:
            named[name] = g
    return named


def time_shape(bench, built, case: Case) -> dict[str, float]:
    """Median microseconds of every genome on one case, interleaved (one input set, outputs the problem's own)."""
    p = mod.problem
    inputs, outputs = p.make_inputs(case, 0, "cuda"), p.make_outputs(case, "cuda")
    names = list(built)
    fns = [bench.prepare(launcher.Module(built[n][1][case.dtype], "rmsnorm_bwd"), built[n][0], case, inputs, outputs)
           for n in names]
    return {n: t.median_us for n, t in zip(names, bench.timer.time_interleaved(fns, REPS))}


def table(bench, built) -> list[str]:
    rows = [f"{'case':22s} {'default us':>11s} {'best sub-warp':>28s} {'us':>8s} {'speedup':>8s}  gate"]
    rng = random.Random(5)
    for case in SHAPES:
        times = time_shape(bench, built, case)
        best = min((n for n in times if n != "default"), key=times.__getitem__)
        try:
            bench.gate_case(launcher.Module(built[best][1][case.dtype], "rmsnorm_bwd"), built[best][0], case, rng)
            verdict = "ok"
        except worker.Rejected as exc:
            verdict = f"FAILED {str(exc)[:80]}"
        rows.append(f"{case.key:22s} {times['default']:11.2f} {best:>28s} {times[best]:8.2f} "
                    f"{times['default'] / times[best]:7.2f}x  {verdict}")
    return rows


def main() -> None:
    built = build_all(genomes(), Path(tempfile.mkdtemp(prefix="subwarp-bwd-")))
    bench = worker.Bench({"problem": "rmsnorm_bwd", "baseline": "torch_eager", "bench_cases": [], "check_cases": []})
    text = "\n".join([f"rmsnorm_bwd: default genome vs the fastest of {len(built) - 1} sub-warp genomes "
                      f"(median of {REPS} interleaved samples each)", *table(bench, built)])
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "subwarp_bwd_times.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
