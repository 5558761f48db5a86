"""Temporary: checks every softmax genome on a real GPU (direct launches + the GpuEvaluator). Deleted after use."""
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch


def direct(problem, out):
    from cuda.core import Device, LaunchConfig, ObjectCode, Stream, launch
    from kernel_factory.evo.evaluate import render
    from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
    from kernel_factory.evo.types import Candidate, Case, Genome
    comp = Compiler(tempfile.mkdtemp(), 16)
    jobs, meta = [], {}
    for genes in problem.space.enumerate():
        g = Genome.of(genes)
        for dt in problem.dtypes:
            k = comp.key(render.body(problem, g, dt))
            meta[k] = (genes, dt)
            jobs.append(CompileJob(k, render.render(problem, Candidate(g), dt), f"{g.id}-{dt}.cu"))
    t = time.time()
    built = {o.key: o for o in comp.compile_many(jobs)}
    comp.close()
    print("compiled", len(built), "in", round(time.time() - t, 1), "s; errors:", sum(o.error is not None for o in built.values()))
    torch.cuda.init()
    st = torch.cuda.Stream()
    torch.cuda.set_stream(st)
    Device(0).set_current()
    stream = Stream.from_handle(st.cuda_stream)
    shapes = problem.shape_sets["correctness"] + problem.shape_sets["heldout"] + problem.shape_sets["benchmark"] + ((3, 40), (9, 24), (33, 8))
    worst = {}
    fails = []
    for k, o in built.items():
        genes, dt = meta[k]
        kern = ObjectCode.from_cubin(o.cubin).get_kernel("softmax_fwd")
        atol, rtol = problem.tolerance(dt)
        for shape in shapes:
            for seed in (1, 2):
                case = Case(shape, dt)
                inp = problem.make_inputs(case, seed, "cuda")
                outp = problem.make_outputs(case, "cuda")
                outp["y"].fill_(float("nan"))
                # misaligned variant for seed 2: shift x and y by one element inside bigger buffers
                if seed == 2:
                    m, n = shape
                    xb = torch.empty(m * n + 1, dtype=inp["x"].dtype, device="cuda")
                    xb[1:].copy_(inp["x"].reshape(-1))
                    inp = {"x": xb[1:].view(m, n)}
                    yb = torch.full((m * n + 1,), float("nan"), dtype=inp["x"].dtype, device="cuda")
                    outp = {"y": yb[1:].view(m, n)}
                plan = problem.launch(genes, case, inp, outp)
                args = tuple(a.data_ptr() if hasattr(a, "data_ptr") else a for a in plan.args)
                launch(stream, LaunchConfig(grid=plan.grid, block=plan.block, shmem_size=0), kern, *args)
                torch.cuda.synchronize()
                ref = problem.reference(inp)["y"]
                y = outp["y"].float()
                if not torch.isfinite(y).all():
                    fails.append((genes, dt, shape, seed, "nonfinite"))
                    continue
                ratio = float(((y - ref).abs() / (atol + rtol * ref.abs())).max())
                key = (dt, genes["exp"])
                worst[key] = max(worst.get(key, 0.0), ratio)
                if ratio > 1:
                    fails.append((genes, dt, shape, seed, ratio))
    print("worst err/tolerance by (dtype, exp):", {f"{a}/{b}": round(v, 3) for (a, b), v in worst.items()})
    print("fails:", len(fails))
    for f in fails[:20]:
        print("  FAIL", f)
    # size_t offsets: M*N > 2^31 for the default genome, bf16, rows sampled.
    g = problem.space.defaults()
    k = [k for k, (gg, dt) in meta.items() if gg == g and dt == "bfloat16"][0]
    kern = ObjectCode.from_cubin(built[k].cubin).get_kernel("softmax_fwd")
    case = Case((70000, 32768), "bfloat16")
    x = torch.randn(70000, 32768, device="cuda", dtype=torch.bfloat16) * 3
    y = torch.full_like(x, float("nan"))
    plan = problem.launch(g, case, {"x": x}, {"y": y})
    args = tuple(a.data_ptr() if hasattr(a, "data_ptr") else a for a in plan.args)
    launch(stream, LaunchConfig(grid=plan.grid, block=plan.block, shmem_size=0), kern, *args)
    torch.cuda.synchronize()
    rows = torch.tensor([0, 1, 65535, 65536, 69998, 69999], device="cuda")
    ref = torch.softmax(x.index_select(0, rows).float(), -1)
    err = float(((y.index_select(0, rows).float() - ref).abs() / (1e-5 + 8e-3 * ref.abs())).max())
    print("big case (70000x32768 bf16) worst err/tolerance:", round(err, 3), "finite:", bool(torch.isfinite(y.index_select(0, rows)).all()))
    del x, y
    torch.cuda.empty_cache()


def evaluator(problem):
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    from kernel_factory.evo.types import Candidate, Case, Genome
    for dt in ("bfloat16", "float32"):
        cases = [Case(s, dt) for s in problem.shape_sets["benchmark"]]
        ev = GpuEvaluator(problem, cases, "torch_eager", 0, tempfile.mkdtemp())
        print(dt, "baseline_us", {k: round(v, 1) for k, v in ev.baseline_us.items()}, "copy_gbps", round(ev.copy_gbps))
        cands = [Candidate(Genome.of(g)) for g in problem.space.enumerate()]
        t = time.time()
        res = ev.evaluate(cands)
        ev.close()
        print(dt, "evaluated", len(res), "in", round(time.time() - t, 1), "s")
        for c, r in sorted(zip(cands, res), key=lambda cr: -cr[1].fitness):
            print(" ", r.status.value, round(r.fitness, 3), c.genome.gene_dict, {k: round(v, 1) for k, v in r.times_us.items()}, r.message[:200])


if __name__ == "__main__":
    from kernel_factory.evo import registry
    problem = registry.load("problem", "softmax_fwd")
    print(torch.__version__, torch.cuda.get_device_name())
    if "direct" in sys.argv:
        direct(problem, None)
    if "eval" in sys.argv:
        evaluator(problem)
