"""What sub-warp rows buy on narrow rows (run on a GPU host: `python3 tests/gpu/subwarp_times.py`): the forward
template's default genome (warp per row; also with tail=peel, which keeps N = 100 off the scalar path) against the
fastest sub-warp genome of a small grid, per shape, bf16, M = 32768. Each genome passes the correctness gate on its
shape before it is timed, with the evaluator's Timer (CUDA events, L2 flushed before each call, CUDA graphs below
250 us). Prints a table, and writes it to $OUT/subwarp_times.txt when OUT is set. No assertion on the times."""
from __future__ import annotations

import itertools
import os
import sys
import tempfile
from pathlib import Path

import torch

from kernel_factory.evo.evaluate import launcher, measure
from kernel_factory.evo.types import Case
from kernel_factory.problems.rmsnorm_fwd import SUBWARP_TPR, problem

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_rmsnorm_fwd_tail_gpu import check, load_modules, runner  # noqa: E402

DTYPE = "bfloat16"
SHAPES = ((32768, 64), (32768, 100), (32768, 128), (32768, 256))
WARP = {"default": {}, "default, tail=peel": {"tail": "peel"}}
# The sub-warp grid: every TPR, 128 or 256 threads, both tails, 16- or 8-byte vectors.
SUBWARP = {f"tpr{t} threads={n} {tail} vec{v}": dict(threads=n, rows_per_cta=n // t, tail=tail, vec_bytes=v)
           for t, n, tail, v in itertools.product(SUBWARP_TPR, (128, 256), ("scalar", "peel"), (16, 8))}


def time_us(timer: measure.Timer, module, genes: dict, case: Case) -> float | None:
    """Median microseconds of one launch on fresh inputs; None when the genome fails the gate on this case."""
    if check(runner(module, genes, case), case, 0):
        return None
    inputs, outputs = problem.make_inputs(case, 1, "cuda"), problem.make_outputs(case, "cuda")
    launch = launcher.launcher(launcher.torch_stream(), module, problem.launch(genes, case, inputs, outputs))
    return timer.time(launch).median_us


def rows_for(timer: measure.Timer, modules: dict, genes: dict, case: Case) -> list[str]:
    """The table's lines for one shape: the warp-per-row genomes, the best sub-warp genome, the gain."""
    times = {name: time_us(timer, modules[name, DTYPE], genes[name], case) for name in genes}
    best = min((n for n in SUBWARP if times[n] is not None), key=lambda n: times[n], default=None)
    failed = [n for n, t in times.items() if t is None]
    warp = min((t for n, t in times.items() if n in WARP and t is not None), default=float("nan"))
    lines = [f"{case.key:>22}  {name:<34} {times[name]:8.2f}" for name in WARP if times[name] is not None]
    if best is not None:
        lines.append(f"{case.key:>22}  {'best sub-warp: ' + best:<34} {times[best]:8.2f}  "
                     f"({warp / times[best]:.2f}x the faster of the two default genomes above)")
    if failed:
        lines.append(f"{case.key:>22}  FAILED THE GATE: {', '.join(failed)}")
    return lines


def main() -> None:
    genes = {name: {**problem.space.defaults(), **extra} for name, extra in {**WARP, **SUBWARP}.items()}
    bad = {n: why for n, g in genes.items() if (why := problem.space.why_infeasible(g))}
    assert not bad, bad
    modules = load_modules(Path(tempfile.mkdtemp()), genes, (DTYPE,))
    timer = measure.Timer(measure.TimingPolicy(warmup=3, graph_below_us=250.0))
    lines = [f"RMSNorm forward, {DTYPE}, {torch.cuda.get_device_name()}: median us per launch",
             f"{'shape':>22}  {'genome':<34} {'us':>8}"]
    for m, n in SHAPES:
        lines += rows_for(timer, modules, genes, Case((m, n), DTYPE))
    table = "\n".join(lines)
    print(table)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "subwarp_times.txt").write_text(table + "\n")


if __name__ == "__main__":
    main()
