"""A grid of a problem's genomes timed on seeded shapes of its workload, written as panels that `kernel-factory
widen` reads (issues 28 and 29), on a GPU host:
`python3 tests/gpu/grid_study.py --problem rmsnorm_bwd --grid small-m [--per-dtype 8] [--budget SECONDS]`.

The shapes are drawn from the problem's workload within the grid's region (its M and N ranges), seeded, and none is
a committed campaign's training or held-out shape, so that the held-out benches stay held out. Every genome is
checked on each shape (fresh random inputs, outputs poisoned, the problem's reference) and the correct ones are timed
once as the benches time (CUDA graph replays, the L2 flushed before each sample). After every shape the panels are
written to $OUT/grid-<problem>-<grid>/panel-<dtype>.jsonl (a workload campaign's format: one line per genome, its
times by case), and `kernel-factory widen FOLDER --problem P --where <the grid's region>` adds the genomes fastest
on some shape to the op's table as tuning candidates for that region. No assertion on times: a study, not a test.

Grids:
- rmsnorm_fwd small (rows of at most 8192 elements): sub-warp to four-warp rows, 128- and 256-thread CTAs, 8- and
  16-byte vectors, x kept in registers or read twice, the weight fetched ahead or not (tail=peel: any N). No panel of
  the forward's campaigns holds a sub-warp genome; tests/gpu/latency_probe.py runs this grid beside the peers.
- rmsnorm_bwd small-m (M of at most 1024): the one-launch and grouped small-M plans, sub-warp to four-warp rows,
  clusters that spread a row over 4 or 16 SMs, dw in registers or shared memory, the narrow path for widths that
  are not a multiple of the vector. The backward table the campaign exported held no small-M plan and no sub-warp
  genome; since 2026-12-07 the op's holds this grid's winners as candidates (kernels/ops/README.md).
- rmsnorm_bwd wide (rows of at least 16384 elements, where the backward the campaign exported ran at 25 to 36% of
  the copy bandwidth and QuACK about twice as fast, docs/results/workload/h100-shipped-bwd-2026-12-07): 512- and 1024-thread
  CTAs, one or two per SM, clusters of 1 to 16 CTAs per row with either cluster sum, 1 to 4 register vectors, dw in
  registers or shared memory, the next row's vectors loaded ahead or not, the peeled tail or not."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from kernel_factory.evo.evaluate import gate, launcher, measure, render
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
from kernel_factory.evo.tools import bench
from kernel_factory.evo.types import Candidate, Case, Genome
from kernel_factory.evo.workload import draw, narrow

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGNS = sorted((ROOT / "docs/results/workload").glob("*/workload.json"))
SEED = 43
RANKING = measure.TimingPolicy(warmup=1, min_reps=5, max_reps=10, target_ms=0.05, graph_below_us=250.0)


def _fwd_small() -> list[dict]:
    return [dict(threads=threads, rows_per_cta=threads // tpr, vec_bytes=vec, keep_x=keep, w_ahead=ahead, unroll=1,
                 tail="peel", load="nc")
            for threads in (128, 256) for tpr in (4, 8, 16, 32, 64, 128) for vec in (8, 16)
            for keep, ahead in ((False, "none"), (True, "none"), (True, "regs"))]


def _bwd_small_m() -> list[dict]:
    return [dict(small_m=plan, threads=threads, ctas_per_sm=per_sm, rows_per_cta=threads // tpr, cluster=cluster,
                 reg_vecs=regs, dw_acc=acc, narrow=True, prefetch=cluster == 1)
            for plan in ("direct", "grouped") for threads, per_sm in ((128, 4), (256, 2), (512, 1))
            for tpr in (8, 32, threads) for cluster in ((1, 4, 16) if tpr == threads else (1,))
            for regs in (1, 2, 4) for acc in ("regs", "smem")]


def _bwd_wide() -> list[dict]:
    return [dict(threads=threads, ctas_per_sm=per_sm, cluster=cluster, reg_vecs=regs, dw_acc=acc, prefetch=ahead,
                 cluster_sum=csum, narrow=True, tail=tail)
            for threads, per_sm in ((512, 1), (512, 2), (1024, 1)) for cluster in (1, 2, 4, 8, 16)
            for regs in (1, 2, 4) for acc in ("regs", "smem") for ahead in (True, False)
            for csum in (("cta", "warps") if cluster > 1 else ("cta",)) for tail in ("none", "peel")]


# (problem, grid) -> (the genes over the defaults, the region of M and N its shapes are drawn from, widen's --where)
GRIDS: dict[tuple[str, str], tuple[Callable[[], list[dict]], dict[str, tuple[int, int]], str]] = {
    ("rmsnorm_fwd", "small"): (_fwd_small, {"m": (1, 1024), "n": (64, 8192)}, "log2_n<=13"),
    ("rmsnorm_bwd", "small-m"): (_bwd_small_m, {"m": (1, 1024)}, "log2_m<=10"),
    ("rmsnorm_bwd", "wide"): (_bwd_wide, {"n": (16384, 262144)}, "log2_n>=14"),
}


def problem_of(name: str) -> Any:
    return importlib.import_module(f"kernel_factory.problems.{name}").problem


def grid(problem: Any, name: str) -> dict[str, dict]:
    """The grid's feasible genomes by id, their genes complete."""
    out = {}
    for changes in GRIDS[problem.name, name][0]():
        full = {**problem.space.defaults(), **changes}
        if problem.space.why_infeasible(full) is None:
            out[Genome.of(full).id] = full
    return out


def shapes(problem: Any, name: str, per_dtype: int, seed: int = SEED) -> list[Case]:
    """per_dtype seeded shapes per dtype within the grid's region, none a committed campaign's."""
    seen = {Case.parse(k) for path in CAMPAIGNS for part in ("train", "heldout")
            for k in json.loads(path.read_text()).get(part, [])}
    region = {k: v for k, v in GRIDS[problem.name, name][1].items()}
    rng = random.Random(seed)
    return [c for d in problem.dtypes for c in draw(narrow(problem.workload, **region), d, per_dtype, rng,
                                                     exclude=seen)]


def compile_pairs(problem: Any, builds: dict[tuple[str, str], dict]) -> dict[tuple[str, str], launcher.Module]:
    """(genome id, dtype) -> loaded module for each (genome id, dtype): genes, compiled together on the host's CPUs."""
    compiler = Compiler(tempfile.mkdtemp(prefix="kf-grid-"), workers=os.cpu_count() or 8)
    jobs, keys = [], []
    for (gid, dtype), genes in builds.items():
        genome = Genome.of(genes)
        key = compiler.key(render.body(problem, genome, dtype))
        jobs.append(CompileJob(key, render.render(problem, Candidate(genome), dtype), f"{gid}-{dtype}.cu"))
        keys.append(((gid, dtype), key))
    outs = {o.key: o for o in compiler.compile_many(jobs)}
    compiler.close()
    failed = {k: outs[key].error[:300] for k, key in keys if outs[key].cubin is None}
    if failed:
        raise SystemExit(f"grid genomes that do not compile: {failed}")
    return {k: launcher.Module(outs[key].cubin, problem.kernel_name) for k, key in keys}


def compile_grid(problem: Any, genomes: dict[str, dict]) -> dict[tuple[str, str], launcher.Module]:
    """Every genome in every dtype of the problem (compile_pairs)."""
    return compile_pairs(problem, {(gid, d): genes for d in problem.dtypes for gid, genes in genomes.items()})


def runner(problem: Any, module: launcher.Module, genes: dict, case: Case, inputs: dict,
           stream: Any) -> Callable[[], Any]:
    """A launch of one genome on the case's inputs, returning its outputs (poisoned before the first launch)."""
    outputs = problem.make_outputs(case, "cuda")
    gate.poison(outputs)
    run = launcher.launcher(stream, module, problem.launch(genes, case, inputs, outputs))
    return lambda: (run(), outputs)[1]


def grid_times(problem: Any, genomes: dict[str, dict], modules: dict, case: Case, inputs: dict,
               stream: Any) -> tuple[dict[str, float], dict[str, str]]:
    """Every genome on the case: checked, then timed once. (median µs, why it failed) by genome id."""
    ranker = measure.Timer(RANKING)
    times, failed = {}, {}
    for gid, genes in genomes.items():
        fn = runner(problem, modules[gid, case.dtype], genes, case, inputs, stream)
        why = bench.check(problem, case, inputs, fn)
        if why:
            failed[gid] = why
        else:
            times[gid] = ranker.time(fn, graphs=True).median_us
    return times, failed


def write_panels(problem: Any, genomes: dict[str, dict], rows: list[dict], folder: Path) -> None:
    """The times (each row: its case, `grid_us`, µs by genome id, and `failed`, why by genome id) as
    panel-<dtype>.jsonl files. A genome that computed a wrong result on any shape of the dtype has no times there at
    all (status incorrect), so that widen never makes it a candidate: first-call tuning times, it does not check."""
    folder.mkdir(parents=True, exist_ok=True)
    for dtype in problem.dtypes:
        mine = [r for r in rows if r["case"].startswith(dtype + ":") and r.get("grid_us")]
        if not mine:
            continue
        wrong = {g for r in mine for g, why in r.get("failed", {}).items() if not why.startswith("failed")}
        lines = [json.dumps({"genome": Genome.of(genes).to_json(),
                             "result": {"status": "incorrect", "times_us": {}} if gid in wrong else
                             {"status": "ok", "times_us": {r["case"]: r["grid_us"][gid] for r in mine
                                                           if gid in r["grid_us"]}}})
                 for gid, genes in genomes.items()]
        (folder / f"panel-{dtype}.jsonl").write_text("\n".join(lines) + "\n")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--problem", default="rmsnorm_bwd")
    args.add_argument("--grid", default="small-m", help=", ".join(f"{p} {g}" for p, g in GRIDS))
    args.add_argument("--per-dtype", type=int, default=8)
    args.add_argument("--budget", type=float, default=float("inf"), metavar="SECONDS")
    opts = args.parse_args()
    if (opts.problem, opts.grid) not in GRIDS:
        raise SystemExit(f"no grid {opts.grid!r} for {opts.problem!r}: the grids are "
                         + ", ".join(f"--problem {p} --grid {g}" for p, g in GRIDS))
    import torch
    start = time.monotonic()
    problem = problem_of(opts.problem)
    genomes = grid(problem, opts.grid)
    cases = shapes(problem, opts.grid, opts.per_dtype)
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp()) / f"grid-{opts.problem}-{opts.grid}"
    print(f"{len(genomes)} genomes x {len(problem.dtypes)} dtypes on {len(cases)} shapes; panels to {out}; "
          f"then: kernel-factory widen {out} --problem {opts.problem} --where '{GRIDS[opts.problem, opts.grid][2]}'",
          flush=True)
    modules = compile_grid(problem, genomes)
    _, stream, _, _ = bench.session(250.0)
    rows: list[dict] = []
    order = [c for group in zip(*[[c for c in cases if c.dtype == d] for d in problem.dtypes]) for c in group]
    for case in order:
        if time.monotonic() - start > opts.budget:
            print(f"cut at {opts.budget:.0f} s: {len(rows)} of {len(order)} shapes", flush=True)
            break
        inputs = problem.make_inputs(case, seed=2026, device="cuda")
        times, failed = grid_times(problem, genomes, modules, case, inputs, stream)
        rows.append({"case": case.key, "grid_us": times, "failed": failed})
        best = min(times, key=times.get) if times else None
        print(f"{case.key:>22}: {len(times)} timed, {len(failed)} failed; fastest {best} "
              f"{times.get(best, float('nan')):.2f} us" + (f"; a failure: {next(iter(failed.values()))[:120]}"
                                                            if failed else ""), flush=True)
        write_panels(problem, genomes, rows, out)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
